//! The assembly's view of live sessions: each session's turns until it stops being live, when
//! its record is made once and handed back (for the session histograms). Also where a found
//! session picks up its turn 0: the keyless turn its turn 1 extends
//! (`slotlight.session.extends`), remembered among the latest keyless turns.
//!
//! A live session's record is kept up to date turn by turn ([`SessionRecord::extend`]), so a
//! turn costs the same whatever the session's length; only a turn that arrives out of order
//! (or brings its session's turn 0) makes the record again from all the turns.
//!
//! Bounded: at most `cap` live sessions (beyond, the one idle longest ends early) and `cap`
//! keyless turns. Live sessions the store holds are loaded at start, so a session that spans a
//! sidecar restart is observed once, whole.

use std::collections::{HashMap, VecDeque};

use crate::records::session::{SessionRecord, TurnFacts, summarize};
use crate::records::turn::TurnRecord;

#[derive(Debug, Default)]
struct Live {
    turns: Vec<TurnFacts>,
    /// The record of `turns`, as of the latest turn.
    record: Option<SessionRecord>,
    /// The latest arrival among `turns` (Unix ns).
    last_start: i64,
}

impl Live {
    /// Until when the session is live, as of its latest turn (Unix ns).
    fn until(&self) -> i64 {
        self.record.as_ref().map_or(i64::MIN, |r| r.live_until)
    }

    /// Adds `new` turns of session `id`: the record is extended when they all arrived after
    /// every turn it holds (and not `remake`), else made again from all of them.
    fn add(&mut self, id: &str, new: Vec<TurnFacts>, remake: bool, idle_ns: i64, now_ns: i64) {
        let in_order = !remake && new.iter().all(|t| t.start_time_unix_nano > self.last_start);
        self.last_start = new
            .iter()
            .map(|t| t.start_time_unix_nano)
            .fold(self.last_start, i64::max);
        self.turns.extend(new.iter().cloned());
        match self.record.as_mut() {
            Some(r) if in_order => r.extend(new, idle_ns, now_ns),
            _ => self.record = summarize(id, self.turns.clone(), idle_ns, now_ns),
        }
    }
}

/// Live sessions and recent keyless turns (see the module's documentation).
#[derive(Debug)]
pub struct SessionTracker {
    idle_ns: i64,
    cap: usize,
    live: HashMap<String, Live>,
    keyless: VecDeque<TurnFacts>,
}

impl SessionTracker {
    /// A tracker whose sessions without KV keeping stay live `idle_ns` after their last turn.
    pub fn new(idle_ns: i64, cap: usize) -> Self {
        Self {
            idle_ns,
            cap: cap.max(1),
            live: HashMap::new(),
            keyless: VecDeque::new(),
        }
    }

    /// Sessions being tracked.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// Whether no session is tracked.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// Takes up sessions that were live when the sidecar stopped (from the store).
    pub fn load(&mut self, sessions: Vec<(String, Vec<TurnFacts>)>, now_ns: i64) {
        for (id, turns) in sessions {
            let mut live = Live {
                last_start: i64::MIN,
                ..Live::default()
            };
            live.add(&id, turns, true, self.idle_ns, now_ns);
            self.live.insert(id, live);
        }
    }

    /// Adds a finished turn; returns the sessions that ended to make room (at most one).
    pub fn record(&mut self, t: &TurnRecord, now_ns: i64) -> Vec<SessionRecord> {
        let facts = TurnFacts::from(t);
        let Some(id) = t.session_id.as_deref() else {
            if self.keyless.len() >= self.cap {
                self.keyless.pop_front();
            }
            self.keyless.push_back(facts);
            return Vec::new();
        };
        let mut ended = Vec::new();
        if !self.live.contains_key(id) && self.live.len() >= self.cap {
            let idlest = self
                .live
                .iter()
                .min_by_key(|(_, l)| l.until())
                .map(|(k, _)| k.clone());
            if let Some(k) = idlest
                && let Some(l) = self.live.remove(&k)
                && let Some(r) = l.record
            {
                ended.push(r.at(self.idle_ns, now_ns));
            }
        }
        let turn0 = t.session_extends.as_deref().and_then(|extends| {
            let at = self
                .keyless
                .iter()
                .position(|k| k.request_id == extends && *k.instance == *t.instance)?;
            self.keyless.remove(at)
        });
        let live = self.live.entry(id.to_string()).or_insert_with(|| Live {
            last_start: i64::MIN,
            ..Live::default()
        });
        // A turn 0 filed now arrived before the session's other turns: the record is made again.
        let remake = turn0.is_some();
        live.add(
            id,
            turn0.into_iter().chain([facts]).collect(),
            remake,
            self.idle_ns,
            now_ns,
        );
        ended
    }

    /// The sessions no longer live at `now_ns`, each once, with their records.
    pub fn ended(&mut self, now_ns: i64) -> Vec<SessionRecord> {
        let gone: Vec<String> = self
            .live
            .iter()
            .filter(|(_, l)| l.until() <= now_ns)
            .map(|(k, _)| k.clone())
            .collect();
        gone.into_iter()
            .filter_map(|k| {
                let l = self.live.remove(&k)?;
                l.record.map(|r| r.at(self.idle_ns, now_ns))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::spans::{Body, EngineSpan, RequestSpan};
    use crate::records::usage::UsageTiming;
    use std::sync::Arc;

    const S: i64 = 1_000_000_000;

    fn turn(id: &str, session: Option<&str>, start_s: i64, req: RequestSpan) -> TurnRecord {
        let root = EngineSpan {
            instance: Arc::from("i"),
            service_version: None,
            trace_id: [1; 16],
            start_ns: start_s * S,
            end_ns: (start_s + 1) * S,
            error: false,
            request_id: id.into(),
            session_id: session.map(Box::from),
            body: Body::Request(Box::new(req.clone())),
        };
        TurnRecord::build(&root, &req, vec![])
    }

    #[test]
    fn a_session_ends_once_its_live_time_has_passed() {
        let mut t = SessionTracker::new(10 * S, 8);
        let req = prompt_tokens_for_test();
        assert!(
            t.record(&turn("a", Some("s"), 0, req.clone()), 0)
                .is_empty()
        );
        assert!(t.record(&turn("b", Some("s"), 5, req), 0).is_empty());
        assert!(t.ended(15 * S).is_empty(), "live until 6 s + 10 s");
        let ended = t.ended(16 * S);
        assert_eq!(ended.len(), 1);
        assert_eq!((ended[0].turns, ended[0].client_s), (2, 4.0));
        assert!(t.is_empty());
        assert!(t.ended(100 * S).is_empty(), "observed once");
    }

    fn prompt_tokens_for_test() -> RequestSpan {
        RequestSpan {
            usage: UsageTiming {
                prompt_tokens: Some(10),
                cached_tokens: Some(5),
                ..UsageTiming::default()
            },
            ..RequestSpan::default()
        }
    }

    #[test]
    fn a_found_session_takes_the_keyless_turn_it_extends() {
        let mut t = SessionTracker::new(10 * S, 8);
        t.record(&turn("r0", None, 0, RequestSpan::default()), 0);
        let found = RequestSpan {
            session_source: Some("found".into()),
            session_turn: Some(1),
            session_extends: Some("r0".into()),
            ..RequestSpan::default()
        };
        t.record(&turn("r1", Some("found-1"), 3, found), 0);
        let ended = t.ended(100 * S);
        assert_eq!(ended.len(), 1);
        assert_eq!(ended[0].turns, 2);
        assert_eq!(ended[0].first_turn_at, 0);
        assert_eq!(ended[0].client_s, 2.0);
    }

    #[test]
    fn beyond_the_cap_the_idlest_session_ends_early_and_loaded_ones_are_tracked() {
        let mut t = SessionTracker::new(10 * S, 2);
        t.record(&turn("a", Some("s1"), 0, RequestSpan::default()), 0);
        t.record(&turn("b", Some("s2"), 5, RequestSpan::default()), 0);
        let early = t.record(&turn("c", Some("s3"), 6, RequestSpan::default()), 0);
        assert_eq!(early.len(), 1);
        assert_eq!(early[0].session_id, "s1");
        assert_eq!(t.len(), 2);
        let mut u = SessionTracker::new(10 * S, 8);
        let loaded = TurnFacts {
            instance: "i".into(),
            request_id: "x".into(),
            start_time_unix_nano: 0,
            end_time_unix_nano: S,
            ..TurnFacts::default()
        };
        u.load(vec![("old".into(), vec![loaded])], 0);
        assert_eq!(u.ended(11 * S).len(), 1);
    }
}
