//! The bounded ring of recent turn records: where they are kept with `--turns-db :memory:`.

use std::collections::VecDeque;
use std::sync::{Arc, RwLock};

use crate::records::session::{
    SessionCursor, SessionQuery, SessionRecord, TurnFacts, detail, summarize,
};
use crate::records::turn::{Cursor, TurnQuery, TurnRecord};

/// The bounded ring of recent turn records (`--turns-db :memory:`). Only the assembly task
/// writes it. Each record gets a completion number, so that pages can follow one another.
#[derive(Debug)]
pub struct TurnStore {
    ring: RwLock<Ring>,
    capacity: usize,
}

#[derive(Debug, Default)]
struct Ring {
    records: VecDeque<(i64, Arc<TurnRecord>)>,
    next_seq: i64,
}

impl TurnStore {
    /// A ring holding at most `capacity` records.
    pub fn new(capacity: usize) -> Self {
        TurnStore {
            ring: RwLock::new(Ring {
                records: VecDeque::with_capacity(capacity.min(1 << 16)),
                next_seq: 1,
            }),
            capacity: capacity.max(1),
        }
    }

    /// Adds a record, dropping the oldest when full.
    pub fn push(&self, t: Arc<TurnRecord>) {
        let mut ring = self.ring.write().unwrap_or_else(|p| p.into_inner());
        if ring.records.len() >= self.capacity {
            ring.records.pop_front();
        }
        let seq = ring.next_seq;
        ring.next_seq += 1;
        ring.records.push_back((seq, t));
    }

    /// Records matching `q`, at most `q.limit` of them, and only those the ring still holds
    /// (a session's oldest turns may have left it).
    ///
    /// Without a session: the newest `q.limit` records, newest first (completion order). With
    /// a session ([`TurnQuery::oldest_first`]): the session's latest `q.limit` turns by request
    /// start, oldest first; turns that started at the same instant keep completion order.
    pub fn query(&self, q: &TurnQuery) -> Vec<Arc<TurnRecord>> {
        self.page(q).0
    }

    /// [`Self::query`], with the cursor of the next page when there may be one.
    pub fn page(&self, q: &TurnQuery) -> (Vec<Arc<TurnRecord>>, Option<Cursor>) {
        let ring = self.ring.read().unwrap_or_else(|p| p.into_inner());
        let wanted = |(seq, t): &&(i64, Arc<TurnRecord>)| {
            q.matches(t) && q.after_cursor(*seq, t.start_time_unix_nano)
        };
        let mut hits: Vec<(i64, Arc<TurnRecord>)> = if q.oldest_first() {
            // Bounded by the ring's capacity; completion order can differ from start order
            // when turns of one session overlap, so select after sorting (newest first).
            let mut all: Vec<_> = ring.records.iter().filter(wanted).cloned().collect();
            drop(ring);
            all.sort_by_key(|(seq, t)| std::cmp::Reverse((t.start_time_unix_nano, *seq)));
            all.truncate(q.limit.saturating_add(1));
            all
        } else {
            ring.records
                .iter()
                .rev()
                .filter(wanted)
                .take(q.limit.saturating_add(1))
                .cloned()
                .collect()
        };
        let more = hits.len() > q.limit;
        hits.truncate(q.limit);
        let next = hits.last().filter(|_| more).map(|(seq, t)| Cursor {
            seq: *seq,
            start_ns: t.start_time_unix_nano,
        });
        if q.oldest_first() {
            hits.reverse();
        }
        (hits.into_iter().map(|(_, t)| t).collect(), next)
    }

    /// Files the keyless turn `request_id` of `instance` under `session_id`, as a found
    /// session's turn 0 (see [`crate::store::sessions`]).
    pub fn link(&self, instance: &str, request_id: &str, session_id: &str) {
        let mut ring = self.ring.write().unwrap_or_else(|p| p.into_inner());
        if let Some((_, t)) = ring.records.iter_mut().rev().find(|(_, t)| {
            &*t.instance == instance && &*t.request_id == request_id && t.session_id.is_none()
        }) {
            let mut linked = (**t).clone();
            linked.session_id = Some(std::sync::Arc::from(session_id));
            linked.session_source = Some(slotlight_otel::attr::value::SESSION_SOURCE_FOUND.into());
            linked.session_turn = Some(0);
            *t = Arc::new(linked);
        }
    }

    /// The ring's records grouped by session.
    fn by_session(&self) -> std::collections::HashMap<String, Vec<Arc<TurnRecord>>> {
        let ring = self.ring.read().unwrap_or_else(|p| p.into_inner());
        let mut by: std::collections::HashMap<String, Vec<Arc<TurnRecord>>> =
            std::collections::HashMap::new();
        for (_, t) in &ring.records {
            if let Some(s) = &t.session_id {
                by.entry(s.to_string()).or_default().push(t.clone());
            }
        }
        by
    }

    /// One page of `/v1/sessions` from the sessions whose turns the ring holds (a session's
    /// oldest turns may have left it).
    pub fn sessions(
        &self,
        q: &SessionQuery,
        idle_ns: i64,
        now_ns: i64,
    ) -> (Vec<SessionRecord>, Option<SessionCursor>) {
        let all = self
            .by_session()
            .into_iter()
            .filter_map(|(id, turns)| {
                let facts = turns.iter().map(|t| TurnFacts::from(&**t)).collect();
                summarize(&id, facts, idle_ns, now_ns)
            })
            .collect();
        crate::records::session::query::page(q, all)
    }

    /// Session `id` and its turns in order, each with `gap_before_s`; `None` when the ring
    /// holds none of its turns.
    pub fn session(
        &self,
        id: &str,
        idle_ns: i64,
        now_ns: i64,
    ) -> Option<(SessionRecord, Vec<serde_json::Value>)> {
        let turns = self.by_session().remove(id)?;
        let facts = turns.iter().map(|t| TurnFacts::from(&**t)).collect();
        let record = summarize(id, facts, idle_ns, now_ns)?;
        let json = turns
            .iter()
            .filter_map(|t| serde_json::to_value(&**t).ok())
            .collect();
        Some((record, detail(json)))
    }

    /// How many turn records are held in memory.
    pub fn len(&self) -> usize {
        self.ring
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .records
            .len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::spans::{Body, EngineSpan, RequestSpan};

    fn root(req: RequestSpan) -> EngineSpan {
        EngineSpan {
            instance: Arc::from("i"),
            service_version: None,
            trace_id: [7; 16],
            start_ns: 10,
            end_ns: 20,
            error: false,
            request_id: "r".into(),
            session_id: Some("s".into()),
            body: Body::Request(Box::new(req.clone())),
        }
    }

    /// A turn of session `session` that started at `start_ns`.
    fn turn_at(id: &str, session: &str, start_ns: i64) -> Arc<TurnRecord> {
        let req = RequestSpan::default();
        let mut t = TurnRecord::build(&root(req.clone()), &req, vec![]);
        t.request_id = Arc::from(id);
        t.session_id = Some(Arc::from(session));
        t.start_time_unix_nano = start_ns;
        Arc::new(t)
    }

    fn ids(list: &[Arc<TurnRecord>]) -> Vec<String> {
        list.iter().map(|t| t.request_id.to_string()).collect()
    }

    #[test]
    fn a_session_lists_oldest_first_by_request_start() {
        let store = TurnStore::new(10);
        // Completion order differs from start order: b2 started before b1 finished.
        store.push(turn_at("a1", "a", 100));
        store.push(turn_at("b2", "b", 300));
        store.push(turn_at("b1", "b", 200));
        store.push(turn_at("a2", "a", 400));
        store.push(turn_at("b3", "b", 500));
        let q = |session: &str, limit: usize| TurnQuery {
            session_id: Some(session.into()),
            limit,
            ..Default::default()
        };
        assert_eq!(ids(&store.query(&q("b", 100))), ["b1", "b2", "b3"]);
        assert_eq!(
            ids(&store.query(&q("b", 2))),
            ["b2", "b3"],
            "the latest two, oldest first"
        );
        assert!(store.query(&q("nobody", 100)).is_empty());
        // Without a session: completion order, newest first, as before.
        let all = TurnQuery {
            limit: 100,
            ..Default::default()
        };
        assert_eq!(ids(&store.query(&all)), ["b3", "a2", "b1", "b2", "a1"]);
    }

    #[test]
    fn a_session_listing_is_bounded_by_the_ring() {
        let store = TurnStore::new(3);
        for i in 0..5 {
            store.push(turn_at(&format!("s{i}"), "s", i * 10));
        }
        let q = TurnQuery {
            session_id: Some("s".into()),
            limit: 100,
            ..Default::default()
        };
        assert_eq!(ids(&store.query(&q)), ["s2", "s3", "s4"]);
    }

    #[test]
    fn ring_is_bounded_and_newest_first() {
        let store = TurnStore::new(3);
        let req = RequestSpan::default();
        for i in 0..5 {
            let mut t = TurnRecord::build(&root(req.clone()), &req, vec![]);
            t.request_id = Arc::from(format!("r{i}"));
            store.push(Arc::new(t));
        }
        assert_eq!(store.len(), 3);
        let q = TurnQuery {
            limit: 2,
            ..Default::default()
        };
        let got: Vec<_> = store
            .query(&q)
            .iter()
            .map(|t| t.request_id.to_string())
            .collect();
        assert_eq!(got, ["r4", "r3"]);
    }
}
