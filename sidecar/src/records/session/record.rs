//! A session's record, made from its turn records.
//!
//! Where a session's time went, in seconds: `model_s` is the sum of its turns' end-to-end
//! times, split exactly into `queue_s` (arrival to admission), `prefill_s` (admission to first
//! token) and `decode_s` (first token to the end), wall clock as vLLM's
//! `gen_ai.latency.time_in_*` are; `client_s` is the sum of the gaps between one turn's end
//! and the next turn's arrival (turns ordered by arrival; a turn that arrives while an earlier
//! one still runs adds no gap): the agent's own time, its tools and its user.
//!
//! A session is live until its last turn's end plus the time the engine keeps its KV
//! (`slotlight.session.kv_ttl_ms`), or plus the sidecar's `--session-idle-s` when the engine
//! keeps none.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::records::turn::TurnRecord;

/// What a session's record needs of one turn record (read from the record itself, or from its
/// stored JSON).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct TurnFacts {
    /// `service.instance.id` of the engine that served it.
    pub instance: String,
    /// The request id.
    pub request_id: String,
    /// How the session key was found.
    #[serde(default)]
    pub session_source: Option<String>,
    /// How long the engine keeps the session's KV after this turn, ms.
    #[serde(default)]
    pub session_kv_ttl_ms: Option<f64>,
    /// The API the turn came through.
    #[serde(default)]
    pub api: Option<String>,
    /// Arrival, Unix ns.
    pub start_time_unix_nano: i64,
    /// End, Unix ns.
    pub end_time_unix_nano: i64,
    /// Prompt tokens.
    #[serde(default)]
    pub prompt_tokens: Option<i64>,
    /// Prompt tokens from the KV cache.
    #[serde(default)]
    pub cached_tokens: Option<i64>,
    /// Generated tokens.
    #[serde(default)]
    pub completion_tokens: Option<i64>,
    /// Generated tokens inside the reasoning block.
    #[serde(default)]
    pub reasoning_tokens: Option<i64>,
    /// Draft tokens verified (speculative decoding); absent from records written before the
    /// sidecar kept them.
    #[serde(default)]
    pub drafted_tokens: Option<i64>,
    /// Of those, draft tokens taken.
    #[serde(default)]
    pub accepted_tokens: Option<i64>,
    /// Arrival to admission, ms.
    #[serde(default)]
    pub queue_ms: Option<f64>,
    /// Arrival to first token, ms.
    #[serde(default)]
    pub ttft_ms: Option<f64>,
    /// Arrival to end, ms.
    #[serde(default)]
    pub e2e_ms: Option<f64>,
    /// The resume outcome.
    #[serde(default)]
    pub resume: Option<String>,
    /// Whether the turn is a side call (absent from records stored before the sidecar kept
    /// it).
    #[serde(default)]
    pub session_side_call: Option<bool>,
}

impl From<&TurnRecord> for TurnFacts {
    fn from(t: &TurnRecord) -> Self {
        Self {
            instance: t.instance.to_string(),
            request_id: t.request_id.to_string(),
            session_source: t.session_source.clone(),
            session_kv_ttl_ms: t.session_kv_ttl_ms,
            api: t.api.clone(),
            start_time_unix_nano: t.start_time_unix_nano,
            end_time_unix_nano: t.end_time_unix_nano,
            prompt_tokens: t.usage.prompt_tokens,
            cached_tokens: t.usage.cached_tokens,
            completion_tokens: t.usage.completion_tokens,
            reasoning_tokens: t.usage.reasoning_tokens,
            drafted_tokens: t.usage.drafted_tokens,
            accepted_tokens: t.usage.accepted_tokens,
            queue_ms: t.usage.queue_ms,
            ttft_ms: t.usage.ttft_ms,
            e2e_ms: t.usage.e2e_ms,
            resume: t.usage.resume.clone(),
            session_side_call: t.session_side_call,
        }
    }
}

impl TurnFacts {
    /// The turn's end-to-end time, seconds (its span's duration when the engine said none).
    fn model_s(&self) -> f64 {
        self.e2e_ms.map_or_else(
            || secs(self.end_time_unix_nano - self.start_time_unix_nano),
            |ms| ms / 1e3,
        )
    }

    /// `model_s` split into queue, prefill and decode (wall clock), adding up exactly.
    fn split(&self) -> (f64, f64, f64) {
        let e2e = self.model_s().max(0.0);
        let queue = self.queue_ms.map_or(0.0, |ms| ms / 1e3).clamp(0.0, e2e);
        let first = self.ttft_ms.map_or(e2e, |ms| ms / 1e3).clamp(queue, e2e);
        (queue, first - queue, e2e - first)
    }
}

#[allow(clippy::cast_precision_loss)] // nanosecond intervals: exact enough as f64 seconds
fn secs(ns: i64) -> f64 {
    ns.max(0) as f64 / 1e9
}

/// One session, from its turns (`GET /v1/sessions`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionRecord {
    /// The session id (`gen_ai.conversation.id`).
    pub session_id: String,
    /// How its key was found (its first turn's `slotlight.session.source`).
    pub source: Option<String>,
    /// Turns (turn records) in the session.
    pub turns: u64,
    /// The first turn's arrival, Unix ns.
    pub first_turn_at: i64,
    /// The last turn's end, Unix ns.
    pub last_turn_at: i64,
    /// `last_turn_at - first_turn_at`, seconds.
    pub duration_s: f64,
    /// Whether the session is live: its last turn ended less than the engine's KV keeping
    /// (else `--session-idle-s`) ago. Decided when the answer is written.
    pub live: bool,
    /// Until when the session is live, Unix ns.
    pub live_until: i64,
    /// How long after its last turn the engine keeps the session's KV, ms (that turn's
    /// `slotlight.session.kv_ttl_ms`); null or 0 when it keeps none.
    pub kv_ttl_ms: Option<f64>,
    /// Prompt tokens over its turns.
    pub prompt_tokens: i64,
    /// Prompt tokens served from the KV cache over its turns.
    pub cached_tokens: i64,
    /// `cached_tokens / prompt_tokens`; null without prompt tokens.
    pub cache_hit_ratio: Option<f64>,
    /// Generated tokens over its turns.
    pub completion_tokens: i64,
    /// Generated reasoning tokens over its turns.
    pub reasoning_tokens: i64,
    /// Draft tokens verified over its turns (speculative decoding). Absent from (so 0 in)
    /// records stored before the sidecar kept it.
    #[serde(default)]
    pub drafted_tokens: i64,
    /// Of those, draft tokens taken.
    #[serde(default)]
    pub accepted_tokens: i64,
    /// `accepted_tokens / drafted_tokens`; null when nothing was drafted.
    #[serde(default)]
    pub draft_acceptance: Option<f64>,
    /// The turns' end-to-end time, seconds (`queue_s + prefill_s + decode_s`).
    pub model_s: f64,
    /// Of `model_s`: waiting for admission.
    pub queue_s: f64,
    /// Of `model_s`: admission to first token.
    pub prefill_s: f64,
    /// Of `model_s`: first token to end.
    pub decode_s: f64,
    /// The gaps between one turn's end and the next turn's arrival: the agent's own time.
    pub client_s: f64,
    /// Turns by resume outcome (`slotlight.resume`).
    pub resume: BTreeMap<String, u64>,
    /// Of `turns`, side calls: turns under the session's key whose prompt does not extend its
    /// main conversation (`slotlight.session.side_call`). Absent from (so 0 in) records
    /// stored before the sidecar kept it.
    #[serde(default)]
    pub side_calls: u64,
    /// The APIs its turns came through (`slotlight.api`), sorted.
    pub apis: Vec<String>,
    /// The engine instances that served it, sorted.
    pub instances: Vec<String>,
}

impl SessionRecord {
    /// The client's share of the session's time: `client_s / (model_s + client_s)`; null
    /// for a session with no time at all.
    pub fn client_share(&self) -> Option<f64> {
        let all = self.model_s + self.client_s;
        (all > 0.0).then(|| self.client_s / all)
    }

    /// How long the session stays live after its last turn: the engine's KV keeping, else
    /// `idle_ns`.
    pub fn keep_ns(&self, idle_ns: i64) -> i64 {
        self.kv_ttl_ms.filter(|ms| *ms > 0.0).map_or(idle_ns, |ms| {
            #[allow(clippy::cast_possible_truncation)] // a TTL in ms: far below i64 ns
            let ns = (ms * 1e6) as i64;
            ns
        })
    }

    /// Sets `live_until` for sessions without KV keeping staying live `idle_ns`, and `live`
    /// as of `now_ns`.
    pub fn at(mut self, idle_ns: i64, now_ns: i64) -> Self {
        self.decide_live(idle_ns, now_ns);
        self
    }

    /// Sets `live_until` and `live` in place, as [`SessionRecord::at`].
    fn decide_live(&mut self, idle_ns: i64, now_ns: i64) {
        self.live_until = self.last_turn_at.saturating_add(self.keep_ns(idle_ns));
        self.live = now_ns < self.live_until;
    }
}

/// `turns` in session order: by arrival, then request id.
fn ordered(turns: &mut [TurnFacts]) {
    turns.sort_by(|a, b| {
        (a.start_time_unix_nano, &a.request_id).cmp(&(b.start_time_unix_nano, &b.request_id))
    });
}

/// The gap before each turn of `turns` (in session order), seconds: `None` for the first.
fn gaps(turns: &[TurnFacts]) -> Vec<Option<f64>> {
    let mut ended: Option<i64> = None;
    turns
        .iter()
        .map(|t| {
            let gap = ended.map(|e| secs(t.start_time_unix_nano - e));
            ended = Some(ended.map_or(t.end_time_unix_nano, |e| e.max(t.end_time_unix_nano)));
            gap
        })
        .collect()
}

/// Session `id`'s record from its turns (any order); `idle_ns` is how long a session without
/// KV keeping stays live after its last turn; `now_ns` decides `live`. `None` without turns.
pub fn summarize(
    id: &str,
    mut turns: Vec<TurnFacts>,
    idle_ns: i64,
    now_ns: i64,
) -> Option<SessionRecord> {
    ordered(&mut turns);
    let first = turns.first()?;
    let last = turns.iter().max_by_key(|t| t.end_time_unix_nano)?;
    let sum = |f: fn(&TurnFacts) -> Option<i64>| {
        turns.iter().filter_map(f).fold(0i64, i64::saturating_add)
    };
    let prompt_tokens = sum(|t| t.prompt_tokens);
    let cached_tokens = sum(|t| t.cached_tokens);
    let drafted_tokens = sum(|t| t.drafted_tokens);
    let accepted_tokens = sum(|t| t.accepted_tokens);
    let (mut queue_s, mut prefill_s, mut decode_s) = (0.0, 0.0, 0.0);
    for t in &turns {
        let (q, p, d) = t.split();
        queue_s += q;
        prefill_s += p;
        decode_s += d;
    }
    let mut resume = BTreeMap::new();
    for r in turns.iter().filter_map(|t| t.resume.clone()) {
        *resume.entry(r).or_insert(0) += 1;
    }
    let mut apis: Vec<String> = turns.iter().filter_map(|t| t.api.clone()).collect();
    apis.sort();
    apis.dedup();
    let mut instances: Vec<String> = turns.iter().map(|t| t.instance.clone()).collect();
    instances.sort();
    instances.dedup();
    let first_turn_at = first.start_time_unix_nano;
    let last_turn_at = last.end_time_unix_nano;
    #[allow(clippy::cast_precision_loss)] // token counts are far below 2^53
    let cache_hit_ratio = (prompt_tokens > 0).then(|| cached_tokens as f64 / prompt_tokens as f64);
    let record = SessionRecord {
        session_id: id.to_string(),
        source: turns.iter().find_map(|t| t.session_source.clone()),
        turns: turns.len() as u64,
        first_turn_at,
        last_turn_at,
        duration_s: secs(last_turn_at - first_turn_at),
        live: false,
        live_until: last_turn_at,
        kv_ttl_ms: last.session_kv_ttl_ms,
        prompt_tokens,
        cached_tokens,
        cache_hit_ratio,
        completion_tokens: sum(|t| t.completion_tokens),
        reasoning_tokens: sum(|t| t.reasoning_tokens),
        drafted_tokens,
        accepted_tokens,
        draft_acceptance: crate::base::vocab::acceptance(drafted_tokens, accepted_tokens),
        model_s: queue_s + prefill_s + decode_s,
        queue_s,
        prefill_s,
        decode_s,
        client_s: gaps(&turns).into_iter().flatten().sum(),
        resume,
        side_calls: turns
            .iter()
            .filter(|t| t.session_side_call == Some(true))
            .count() as u64,
        apis,
        instances,
    };
    Some(record.at(idle_ns, now_ns))
}

impl SessionRecord {
    /// Adds `turns` (any order among themselves) that all arrived after every turn the record
    /// holds: the record becomes exactly what [`summarize`] makes of all the turns (the same
    /// sums in the same order), without reading the earlier ones again. `live` is decided as
    /// of `now_ns` (`idle_ns` as in [`summarize`]).
    pub fn extend(&mut self, mut turns: Vec<TurnFacts>, idle_ns: i64, now_ns: i64) {
        ordered(&mut turns);
        let mut ended = self.last_turn_at;
        for t in &turns {
            // As `gaps`: the time since every earlier turn ended.
            self.client_s += secs(t.start_time_unix_nano - ended);
            ended = ended.max(t.end_time_unix_nano);
            // As `summarize`'s last turn: the latest to end, the later in order on a tie.
            if t.end_time_unix_nano >= self.last_turn_at {
                self.last_turn_at = t.end_time_unix_nano;
                self.kv_ttl_ms = t.session_kv_ttl_ms;
            }
            let add = |sum: &mut i64, v: Option<i64>| *sum = sum.saturating_add(v.unwrap_or(0));
            add(&mut self.prompt_tokens, t.prompt_tokens);
            add(&mut self.cached_tokens, t.cached_tokens);
            add(&mut self.completion_tokens, t.completion_tokens);
            add(&mut self.reasoning_tokens, t.reasoning_tokens);
            add(&mut self.drafted_tokens, t.drafted_tokens);
            add(&mut self.accepted_tokens, t.accepted_tokens);
            let (q, p, d) = t.split();
            self.queue_s += q;
            self.prefill_s += p;
            self.decode_s += d;
            if let Some(r) = &t.resume {
                *self.resume.entry(r.clone()).or_insert(0) += 1;
            }
            self.side_calls += u64::from(t.session_side_call == Some(true));
            if self.source.is_none() {
                self.source.clone_from(&t.session_source);
            }
            if let Some(api) = &t.api
                && let Err(at) = self.apis.binary_search(api)
            {
                self.apis.insert(at, api.clone());
            }
            if let Err(at) = self.instances.binary_search(&t.instance) {
                self.instances.insert(at, t.instance.clone());
            }
            self.turns += 1;
        }
        #[allow(clippy::cast_precision_loss)] // token counts are far below 2^53
        let ratio =
            (self.prompt_tokens > 0).then(|| self.cached_tokens as f64 / self.prompt_tokens as f64);
        self.cache_hit_ratio = ratio;
        self.draft_acceptance =
            crate::base::vocab::acceptance(self.drafted_tokens, self.accepted_tokens);
        self.model_s = self.queue_s + self.prefill_s + self.decode_s;
        self.duration_s = secs(self.last_turn_at - self.first_turn_at);
        self.decide_live(idle_ns, now_ns);
    }
}

/// A session's turn records (JSON, as `/v1/turns` gives them, any order) in session order,
/// each with `gap_before_s`: the time between the previous turns' end and its arrival
/// (null for the first). A record that does not read as a turn is left out.
pub fn detail(records: Vec<serde_json::Value>) -> Vec<serde_json::Value> {
    let mut read: Vec<(TurnFacts, serde_json::Value)> = records
        .into_iter()
        .filter_map(|v| Some((serde_json::from_value::<TurnFacts>(v.clone()).ok()?, v)))
        .collect();
    read.sort_by(|(a, _), (b, _)| {
        (a.start_time_unix_nano, &a.request_id).cmp(&(b.start_time_unix_nano, &b.request_id))
    });
    let facts: Vec<TurnFacts> = read.iter().map(|(f, _)| f.clone()).collect();
    read.into_iter()
        .zip(gaps(&facts))
        .map(|((_, mut v), gap)| {
            if let Some(o) = v.as_object_mut() {
                o.insert("gap_before_s".into(), serde_json::json!(gap));
            }
            v
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000_000;

    fn turn(id: &str, start_s: i64, end_s: i64) -> TurnFacts {
        TurnFacts {
            instance: "i".into(),
            request_id: id.into(),
            start_time_unix_nano: start_s * S,
            end_time_unix_nano: end_s * S,
            #[allow(clippy::cast_precision_loss)]
            e2e_ms: Some(((end_s - start_s) * 1000) as f64),
            queue_ms: Some(500.0),
            ttft_ms: Some(1500.0),
            prompt_tokens: Some(100),
            cached_tokens: Some(80),
            completion_tokens: Some(10),
            resume: Some("full".into()),
            api: Some("chat.completions".into()),
            ..TurnFacts::default()
        }
    }

    #[test]
    fn time_splits_into_model_and_client() {
        // Three turns of 4 s each, with 10 s and 20 s between them.
        let turns = vec![turn("c", 38, 42), turn("a", 0, 4), turn("b", 14, 18)];
        let r = summarize("s", turns, 60 * S, 0).expect("record");
        assert_eq!(r.turns, 3);
        assert_eq!((r.first_turn_at, r.last_turn_at), (0, 42 * S));
        assert_eq!(r.duration_s, 42.0);
        assert_eq!(r.model_s, 12.0);
        assert_eq!((r.queue_s, r.prefill_s, r.decode_s), (1.5, 3.0, 7.5));
        assert_eq!(r.client_s, 30.0);
        assert_eq!(r.client_share(), Some(30.0 / 42.0));
        assert_eq!((r.prompt_tokens, r.cached_tokens), (300, 240));
        assert_eq!(r.cache_hit_ratio, Some(0.8));
        assert_eq!(r.resume.get("full"), Some(&3));
        assert_eq!(r.side_calls, 0);
        assert_eq!(r.apis, vec!["chat.completions".to_string()]);
        // Live for `idle` after the last turn, without the engine's keeping.
        assert_eq!(r.live_until, 102 * S);
        assert!(r.clone().at(60 * S, 101 * S).live);
        assert!(!r.clone().at(60 * S, 102 * S).live);
        assert_eq!(r.at(5 * S, 0).live_until, 47 * S);
    }

    #[test]
    fn side_calls_are_counted_apart() {
        let mut side = turn("b", 5, 6);
        side.session_side_call = Some(true);
        let mut main = turn("c", 8, 9);
        main.session_side_call = Some(false);
        let r = summarize("s", vec![turn("a", 0, 4), side, main], 60 * S, 0).expect("record");
        assert_eq!((r.turns, r.side_calls), (3, 1));
        // A record stored before side calls were counted reads as none.
        let json = serde_json::to_value(&r).expect("json");
        let mut old = json.clone();
        old.as_object_mut().expect("object").remove("side_calls");
        let back: SessionRecord = serde_json::from_value(old).expect("old record");
        assert_eq!(back.side_calls, 0);
        assert_eq!(json["side_calls"], 1);
    }

    #[test]
    fn overlapping_turns_add_no_gap_and_the_engines_keeping_decides_live() {
        let mut b = turn("b", 2, 6);
        b.session_kv_ttl_ms = Some(5000.0);
        let r =
            summarize("s", vec![turn("a", 0, 4), b, turn("c", 5, 9)], 60 * S, 0).expect("record");
        // b arrived while a ran; c arrived while b ran: no client time.
        assert_eq!(r.client_s, 0.0);
        // The last to end (c) has no keeping stated: the idle window.
        assert_eq!(r.live_until, 69 * S);
        let r = summarize(
            "s",
            vec![turn("a", 0, 4), turn("b", 2, 6)]
                .into_iter()
                .map(|mut t| {
                    t.session_kv_ttl_ms = Some(5000.0);
                    t
                })
                .collect(),
            60 * S,
            0,
        )
        .expect("record");
        assert_eq!(r.live_until, 11 * S);
        assert!(summarize("s", Vec::new(), 0, 0).is_none());
    }

    #[test]
    fn draft_counts_sum_over_the_turns_and_give_the_acceptance() {
        let drafted = |id: &str, start_s: i64, d: Option<(i64, i64)>| TurnFacts {
            drafted_tokens: d.map(|d| d.0),
            accepted_tokens: d.map(|d| d.1),
            ..turn(id, start_s, start_s + 1)
        };
        let turns = vec![
            drafted("a", 0, Some((40, 30))),
            drafted("b", 2, None),
            drafted("c", 4, Some((60, 20))),
        ];
        let r = summarize("s", turns, 60 * S, 0).expect("record");
        assert_eq!((r.drafted_tokens, r.accepted_tokens), (100, 50));
        assert_eq!(r.draft_acceptance, Some(0.5));
        let json = serde_json::to_value(&r).expect("json");
        assert_eq!(json["draft_acceptance"], 0.5);
        // Nothing drafted: no acceptance at all, not 0.
        let r = summarize("s", vec![drafted("a", 0, Some((0, 0)))], 60 * S, 0).expect("record");
        assert_eq!((r.drafted_tokens, r.draft_acceptance), (0, None));
        let r = summarize("s", vec![drafted("a", 0, None)], 60 * S, 0).expect("record");
        assert_eq!(r.draft_acceptance, None);
    }

    #[test]
    fn a_turn_without_timings_counts_its_span_as_queue_free_model_time() {
        let t = TurnFacts {
            request_id: "r".into(),
            start_time_unix_nano: 0,
            end_time_unix_nano: 2 * S,
            ..TurnFacts::default()
        };
        let r = summarize("s", vec![t], 0, 0).expect("record");
        assert_eq!(
            (r.model_s, r.queue_s, r.prefill_s, r.decode_s),
            (2.0, 0.0, 2.0, 0.0)
        );
        assert_eq!(r.cache_hit_ratio, None);
    }

    #[test]
    fn the_detail_orders_turns_and_says_each_gap() {
        let json = |t: &TurnFacts| {
            serde_json::json!({
                "instance": t.instance, "request_id": t.request_id,
                "start_time_unix_nano": t.start_time_unix_nano,
                "end_time_unix_nano": t.end_time_unix_nano, "status": "ok",
            })
        };
        let d = detail(vec![
            json(&turn("b", 14, 18)),
            json(&turn("a", 0, 4)),
            serde_json::json!({"not": "a turn"}),
        ]);
        assert_eq!(d.len(), 2);
        assert_eq!(d[0]["request_id"], "a");
        assert_eq!(d[0]["gap_before_s"], serde_json::Value::Null);
        assert_eq!(d[1]["gap_before_s"], 10.0);
        assert_eq!(d[1]["status"], "ok");
    }

    #[test]
    fn extending_a_record_equals_summarizing_all_its_turns() {
        // Turns with overlaps, gaps, ties of ends, missing fields, several APIs and instances.
        let mut all = Vec::new();
        for i in 0..12i64 {
            let start = i * 3 + i % 2;
            let mut t = turn(&format!("r{i:02}"), start, start + 2 + i % 4);
            t.instance = ["b", "a", "c"][(i % 3) as usize].into();
            t.api = (i % 4 != 1).then(|| ["messages", "responses"][(i % 2) as usize].into());
            t.resume = (i % 5 != 0).then(|| ["full", "diverged"][(i % 2) as usize].into());
            t.session_source = (i >= 2).then(|| "header".into());
            t.session_side_call = Some(i % 3 == 2);
            t.session_kv_ttl_ms = Some(1000.0 * i as f64);
            t.drafted_tokens = (i % 2 == 0).then_some(10 + i);
            t.accepted_tokens = (i % 2 == 0).then_some(i);
            t.queue_ms = Some(100.0 + 7.0 * i as f64);
            all.push(t);
        }
        let whole = summarize("s", all.clone(), 60 * S, 30 * S).expect("record");
        for split in 1..all.len() {
            let mut r = summarize("s", all[..split].to_vec(), 60 * S, 30 * S).expect("prefix");
            // The rest in two pieces, each in any order.
            let (a, b) = all[split..].split_at((all.len() - split) / 2);
            r.extend(a.iter().rev().cloned().collect(), 60 * S, 30 * S);
            r.extend(b.to_vec(), 60 * S, 30 * S);
            assert_eq!(r, whole, "split at {split}");
        }
    }
}
