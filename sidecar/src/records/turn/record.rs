//! Turn records: one per finished request, built from its request span and its legs.
//!
//! Every number a record shares with the request span is the span's usage record
//! ([`UsageTiming`]), unchanged (so it equals the engine's HTTP `usage` block exactly); only
//! `prefill_tps` is derived (and `total_ms` repeats `e2e_ms`).

use std::sync::Arc;

use serde::Serialize;

use crate::base::vocab::{Path, TraceId, hex};
use crate::records::spans::{EngineSpan, LegSpan, RequestSpan};
use crate::records::usage::UsageTiming;

/// One leg of a finished request.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TurnLeg {
    /// `slotlight.choice.index`: which choice of the request (`n`) the leg belongs to.
    pub choice: i64,
    /// `slotlight.leg.index` (counted per choice).
    pub index: i64,
    /// `solo` or `slot`.
    pub path: Path,
    /// Slot index (null on the solo path).
    pub slot: Option<i64>,
    /// The device group (slot group) the leg ran on.
    pub group: i64,
    /// Tokens generated in this leg (`slotlight.leg.tokens_generated`).
    pub tokens: Option<i64>,
    /// Tokens carried into this leg.
    pub tokens_carried: Option<i64>,
    /// The leg span's duration, ms.
    pub ms: f64,
    /// Time in forward steps, ms.
    pub device_ms: Option<f64>,
    /// Draft tokens verified during the leg (`slotlight.leg.drafted_tokens`).
    pub drafted_tokens: Option<i64>,
    /// Of those, draft tokens taken (`slotlight.leg.accepted_tokens`).
    pub accepted_tokens: Option<i64>,
    /// Largest batch of the leg.
    pub batch_size_max: Option<i64>,
    /// Mean batch of the leg.
    pub batch_size_mean: Option<f64>,
    /// Why it ended.
    pub end_reason: Option<String>,
    /// When it started, Unix ns.
    pub start_time_unix_nano: i64,
}

impl TurnLeg {
    /// A leg record from a leg span.
    pub fn from_span(leg: &LegSpan, start_ns: i64, end_ns: i64) -> Self {
        #[allow(clippy::cast_precision_loss)] // span durations in ns fit f64 exactly enough
        let ms = (end_ns - start_ns) as f64 / 1e6;
        TurnLeg {
            choice: leg.choice,
            index: leg.leg_index,
            path: leg.key.path,
            slot: leg.key.index,
            group: leg.key.group,
            tokens: leg.tokens_generated,
            tokens_carried: leg.tokens_carried,
            ms,
            device_ms: leg.device_ms,
            drafted_tokens: leg.drafted_tokens,
            accepted_tokens: leg.accepted_tokens,
            batch_size_max: leg.batch_size_max,
            batch_size_mean: leg.batch_size_mean,
            end_reason: leg.end_reason.clone(),
            start_time_unix_nano: leg.leg_start_ns,
        }
    }
}

/// How a turn ended (`slotlight.request.status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TurnStatus {
    /// Ran to its end (`stop` or `length`).
    Ok,
    /// The client went away before the end.
    Cancelled,
    /// Answered with an error before it reached the engine's step loop.
    Refused,
    /// Accepted, then failed.
    Error,
    /// Not known: the request span never arrived (the record is `complete: false`).
    Unknown,
}

impl TurnStatus {
    /// Every status, in the order of the wire values' documentation.
    pub const ALL: [TurnStatus; 5] = [
        TurnStatus::Ok,
        TurnStatus::Cancelled,
        TurnStatus::Refused,
        TurnStatus::Error,
        TurnStatus::Unknown,
    ];

    /// The status with wire value `s`, if any.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// The wire value.
    pub fn as_str(self) -> &'static str {
        use slotlight_otel::attr::value;
        match self {
            TurnStatus::Ok => value::STATUS_OK,
            TurnStatus::Cancelled => value::STATUS_CANCELLED,
            TurnStatus::Refused => value::STATUS_REFUSED,
            TurnStatus::Error => value::STATUS_ERROR,
            TurnStatus::Unknown => "unknown",
        }
    }

    /// The request span's `slotlight.request.status`; an engine that does not send it gets
    /// one from the span's status and `error.type`.
    fn of(req: &RequestSpan, span_error: bool) -> Self {
        use slotlight_otel::attr::value;
        let parsed = req.status.as_deref().and_then(TurnStatus::parse);
        parsed.unwrap_or(match (span_error, req.error_type.as_deref()) {
            (false, None) => TurnStatus::Ok,
            (_, Some(value::ERROR_CANCELLED)) => TurnStatus::Cancelled,
            _ => TurnStatus::Error,
        })
    }
}

/// One finished request (`/v1/turns`, and one JSON line on stdout).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TurnRecord {
    /// `service.instance.id` of the engine.
    pub instance: Arc<str>,
    /// The engine's data-parallel rank (`slotlight.engine.data_parallel_rank`); with
    /// `instance`, the replica that served the request.
    pub data_parallel_rank: Option<i64>,
    /// `service.version` of the engine.
    pub service_version: Option<Arc<str>>,
    /// The engine's request id (also the response id) (`slotlight.request.id`).
    pub request_id: Arc<str>,
    /// The session the request belongs to (`gen_ai.conversation.id`): the client's key, or
    /// the engine's id for a session it found from the prompt.
    pub session_id: Option<Arc<str>>,
    /// How the session key was found (`slotlight.session.source`: `header`,
    /// `conversation`, `response_chain`, `prompt_cache_key`, `metadata`, `user`, `found`).
    pub session_source: Option<String>,
    /// The turn's index in its session, from 0 (`slotlight.session.turn`).
    pub session_turn: Option<i64>,
    /// For a found session's turn 1: the request id of the keyless turn it extends, which
    /// becomes the session's turn 0 (`slotlight.session.extends`).
    pub session_extends: Option<String>,
    /// The session branch the turn extends or starts, 0 for the session's first conversation
    /// (`slotlight.session.branch`).
    pub session_branch: Option<i64>,
    /// Whether the turn is a side call: its prompt does not extend the session's main
    /// conversation (`slotlight.session.side_call`).
    pub session_side_call: Option<bool>,
    /// How long after this turn the engine keeps its session's KV, ms
    /// (`slotlight.session.kv_ttl_ms`; 0 when it keeps none).
    pub session_kv_ttl_ms: Option<f64>,
    /// The API the request came through (`slotlight.api`: `chat.completions`,
    /// `completions`, `responses`, `messages`).
    pub api: Option<String>,
    /// Trace id (hex).
    pub trace_id: String,
    /// Trace id (raw), for exemplars.
    #[serde(skip)]
    pub trace_id_bytes: TraceId,
    /// `gen_ai.response.model`, else `gen_ai.request.model`, else the span name's model.
    pub model: Option<String>,
    /// The model the client asked for (`gen_ai.request.model`).
    pub request_model: Option<String>,
    /// The model that answered (`gen_ai.response.model`).
    pub response_model: Option<String>,
    /// What was asked: `chat` or `text_completion` (`gen_ai.operation.name`).
    pub operation: Option<String>,
    /// Who served it (`gen_ai.provider.name`).
    pub provider: Option<String>,
    /// The first of `gen_ai.response.finish_reasons`, else `error.type`.
    pub finish_reason: Option<String>,
    /// How the request ended: `ok`, `cancelled`, `refused` or `error`.
    pub status: TurnStatus,
    /// What went wrong, a stable label such as `overloaded` (null on success) (`error.type`).
    pub error_type: Option<String>,
    /// Request span start, Unix ns.
    pub start_time_unix_nano: i64,
    /// Request span end, Unix ns.
    pub end_time_unix_nano: i64,
    /// The request's usage and timing, as its request span states them (every field null
    /// when the request span never arrived). Flattened: in JSON its fields are the record's
    /// own, `prompt_tokens` to `decode_tps`.
    #[serde(flatten)]
    pub usage: UsageTiming,
    /// `prefilled_tokens / (prefill_ms / 1000)` when both are known and `prefill_ms > 0`.
    pub prefill_tps: Option<f64>,
    /// The request's legs, by choice, then index.
    pub legs: Vec<TurnLeg>,
    /// How many legs the engine says the request had (`slotlight.request.legs`).
    pub legs_expected: Option<i64>,
    /// False when the record was written before all expected legs arrived.
    pub legs_complete: bool,
    /// `slotlight.request.moved`, else whether the legs ran on more than one path or slot.
    pub moved: bool,
    /// The device group that served it (`slotlight.slot.group`).
    pub slot_group: Option<i64>,
    /// False when the request span never arrived: the record holds what did (its legs, the
    /// trace and session, the times its spans cover), `status` is `unknown` and every number
    /// the request span carries is null.
    pub complete: bool,
}

impl TurnRecord {
    /// Builds the record from the request span and the legs received.
    pub fn build(root: &EngineSpan, req: &RequestSpan, mut legs: Vec<TurnLeg>) -> Self {
        legs.sort_by_key(|l| (l.choice, l.index));
        legs.dedup_by_key(|l| (l.choice, l.index));
        let model = req
            .response_model
            .clone()
            .or_else(|| req.request_model.clone())
            .or_else(|| {
                req.name
                    .split_once(' ')
                    .map(|(_, m)| m.to_string())
                    .filter(|m| !m.is_empty())
            });
        let finish_reason = req
            .finish_reasons
            .first()
            .cloned()
            .or_else(|| req.error_type.clone());
        let prefill_tps = match (req.usage.prefilled_tokens, req.usage.prefill_ms) {
            #[allow(clippy::cast_precision_loss)] // token counts are far below 2^53
            (Some(t), Some(ms)) if ms > 0.0 => Some(t as f64 / (ms / 1e3)),
            _ => None,
        };
        let moved = req.moved.unwrap_or_else(|| {
            legs.windows(2).any(|w| {
                w[0].choice == w[1].choice
                    && (w[0].path, w[0].slot, w[0].group) != (w[1].path, w[1].slot, w[1].group)
            })
        });
        let legs_complete = req
            .legs
            .is_none_or(|n| i64::try_from(legs.len()).unwrap_or(i64::MAX) >= n);
        TurnRecord {
            instance: root.instance.clone(),
            data_parallel_rank: req.data_parallel_rank,
            service_version: root.service_version.clone(),
            request_id: Arc::from(&*root.request_id),
            session_id: root.session_id.as_deref().map(Arc::from),
            session_source: req.session_source.clone(),
            session_turn: req.session_turn,
            session_extends: req.session_extends.clone(),
            session_branch: req.session_branch,
            session_side_call: req.session_side_call,
            session_kv_ttl_ms: req.session_kv_ttl_ms,
            api: req.api.clone(),
            trace_id: hex(&root.trace_id),
            trace_id_bytes: root.trace_id,
            model,
            request_model: req.request_model.clone(),
            response_model: req.response_model.clone(),
            operation: req.operation.clone(),
            provider: req.provider.clone(),
            finish_reason,
            status: TurnStatus::of(req, root.error),
            error_type: req.error_type.clone(),
            start_time_unix_nano: root.start_ns,
            end_time_unix_nano: root.end_ns,
            usage: req.usage.clone(),
            prefill_tps,
            legs,
            legs_expected: req.legs,
            legs_complete,
            moved,
            slot_group: req.slot_group,
            complete: true,
        }
    }

    /// The record of a request whose request span never arrived, from what did: its legs,
    /// its trace and session, and the interval its spans covered. Nothing the request span
    /// would have said is guessed.
    pub fn partial(seen: PartialTurn, mut legs: Vec<TurnLeg>) -> Self {
        legs.sort_by_key(|l| (l.choice, l.index));
        legs.dedup_by_key(|l| (l.choice, l.index));
        let moved = legs.windows(2).any(|w| {
            w[0].choice == w[1].choice
                && (w[0].path, w[0].slot, w[0].group) != (w[1].path, w[1].slot, w[1].group)
        });
        let slot_group = legs.first().map(|l| l.group);
        TurnRecord {
            instance: seen.instance,
            data_parallel_rank: None,
            service_version: seen.service_version,
            request_id: seen.request_id,
            session_id: seen.session_id,
            session_source: None,
            session_turn: None,
            session_extends: None,
            session_branch: None,
            session_side_call: None,
            session_kv_ttl_ms: None,
            api: None,
            trace_id: hex(&seen.trace_id),
            trace_id_bytes: seen.trace_id,
            model: None,
            request_model: None,
            response_model: None,
            operation: None,
            provider: None,
            finish_reason: None,
            status: TurnStatus::Unknown,
            error_type: None,
            start_time_unix_nano: seen.start_ns,
            end_time_unix_nano: seen.end_ns,
            usage: UsageTiming::default(),
            prefill_tps: None,
            legs,
            legs_expected: None,
            legs_complete: false,
            moved,
            slot_group,
            complete: false,
        }
    }
}

/// What the spans of a request without its request span said about it.
#[derive(Debug, Clone)]
pub struct PartialTurn {
    /// `service.instance.id` of the engine.
    pub instance: Arc<str>,
    /// `service.version` of the engine.
    pub service_version: Option<Arc<str>>,
    /// The engine's request id.
    pub request_id: Arc<str>,
    /// The session its spans named.
    pub session_id: Option<Arc<str>>,
    /// The trace id the request's spans share.
    pub trace_id: TraceId,
    /// The earliest start of its spans, Unix ns (the queue span's: the arrival).
    pub start_ns: i64,
    /// The latest end of its spans, Unix ns.
    pub end_ns: i64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::spans::Body;

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

    fn leg(index: i64, path: Path, slot: Option<i64>) -> TurnLeg {
        TurnLeg {
            choice: 0,
            index,
            path,
            slot,
            group: 0,
            tokens: Some(5),
            tokens_carried: Some(0),
            ms: 1.0,
            device_ms: None,
            drafted_tokens: None,
            accepted_tokens: None,
            batch_size_max: None,
            batch_size_mean: None,
            end_reason: None,
            start_time_unix_nano: 0,
        }
    }

    #[test]
    fn copies_usage_and_derives_the_rest() {
        let req = RequestSpan {
            name: "chat small".into(),
            usage: UsageTiming {
                prefilled_tokens: Some(100),
                prefill_ms: Some(50.0),
                e2e_ms: Some(123.456),
                reasoning_tokens: Some(9),
                ..Default::default()
            },
            legs: Some(2),
            ..Default::default()
        };
        let t = TurnRecord::build(
            &root(req.clone()),
            &req,
            vec![leg(1, Path::Slot, Some(0)), leg(0, Path::Solo, None)],
        );
        assert_eq!(t.model.as_deref(), Some("small"));
        assert_eq!(t.prefill_tps, Some(2000.0));
        assert!(t.moved);
        assert!(t.legs_complete);
        assert_eq!(t.legs[0].index, 0);
        let json = serde_json::to_value(&t).expect("json");
        assert_eq!(json["e2e_ms"], serde_json::json!(123.456));
        assert_eq!(json["total_ms"], serde_json::json!(123.456));
        assert_eq!(json["reasoning_tokens"], 9);
        assert!(json.get("trace_id_bytes").is_none());
    }

    #[test]
    fn each_choice_keeps_its_own_legs() {
        let req = RequestSpan {
            name: "chat small".into(),
            legs: Some(3),
            ..Default::default()
        };
        let mut fork = leg(0, Path::Slot, Some(1));
        fork.choice = 1;
        let t = TurnRecord::build(
            &root(req.clone()),
            &req,
            vec![
                fork.clone(),
                leg(1, Path::Slot, Some(0)),
                leg(0, Path::Solo, None),
                fork,
            ],
        );
        // Leg 0 of choice 1 is not a duplicate of leg 0 of choice 0; the repeat of it is.
        let keys: Vec<(i64, i64)> = t.legs.iter().map(|l| (l.choice, l.index)).collect();
        assert_eq!(keys, vec![(0, 0), (0, 1), (1, 0)]);
        assert!(t.legs_complete);
        let json = serde_json::to_value(&t).expect("json");
        assert_eq!(json["legs"][2]["choice"], serde_json::json!(1));
    }

    #[test]
    fn record_carries_resume_from_the_root_span() {
        use slotlight_otel::attr::value;
        let req = RequestSpan {
            name: "chat small".into(),
            usage: UsageTiming {
                cached_tokens: Some(64),
                resume: Some(value::RESUME_DIVERGED.into()),
                reusable_tokens: Some(80),
                diverged_at: Some(81),
                evicted_tokens: Some(16),
                ..Default::default()
            },
            ..Default::default()
        };
        let t = TurnRecord::build(&root(req.clone()), &req, vec![]);
        let json = serde_json::to_value(&t).expect("json");
        assert_eq!(json["resume"], value::RESUME_DIVERGED);
        assert_eq!(json["cached_tokens"], 64);
        assert_eq!(json["reusable_tokens"], 80);
        assert_eq!(json["diverged_at"], 81);
        assert_eq!(json["evicted_tokens"], 16);
    }

    #[test]
    fn record_carries_the_session_and_the_api() {
        use slotlight_otel::attr::value;
        let req = RequestSpan {
            name: "chat small".into(),
            api: Some(value::API_MESSAGES.into()),
            session_source: Some(value::SESSION_SOURCE_FOUND.into()),
            session_turn: Some(1),
            session_extends: Some("msg_0".into()),
            session_kv_ttl_ms: Some(300_000.0),
            ..Default::default()
        };
        let json = serde_json::to_value(TurnRecord::build(&root(req.clone()), &req, vec![]))
            .expect("json");
        assert_eq!(json["session_id"], "s");
        assert_eq!(json["api"], value::API_MESSAGES);
        assert_eq!(json["session_source"], value::SESSION_SOURCE_FOUND);
        assert_eq!(json["session_turn"], 1);
        assert_eq!(json["session_extends"], "msg_0");
        assert_eq!(json["session_kv_ttl_ms"], 300_000.0);
    }

    #[test]
    fn record_carries_the_draft_counts_of_the_request_and_its_legs() {
        use slotlight_otel::attr::value;
        let req = RequestSpan {
            name: "chat small".into(),
            usage: UsageTiming {
                speculation: Some(value::SPECULATION_NGRAM.into()),
                drafts: Some(6),
                drafted_tokens: Some(24),
                accepted_tokens: Some(18),
                ..Default::default()
            },
            legs: Some(2),
            ..Default::default()
        };
        let mut slot = leg(1, Path::Slot, Some(0));
        slot.drafted_tokens = Some(16);
        slot.accepted_tokens = Some(12);
        let mut solo = leg(0, Path::Solo, None);
        solo.drafted_tokens = Some(8);
        solo.accepted_tokens = Some(6);
        let json = serde_json::to_value(TurnRecord::build(
            &root(req.clone()),
            &req,
            vec![slot, solo],
        ))
        .expect("json");
        assert_eq!(json["speculation"], value::SPECULATION_NGRAM);
        assert_eq!(json["drafts"], 6);
        assert_eq!(json["drafted_tokens"], 24);
        assert_eq!(json["accepted_tokens"], 18);
        assert_eq!(json["legs"][0]["drafted_tokens"], 8);
        assert_eq!(json["legs"][0]["accepted_tokens"], 6);
        assert_eq!(json["legs"][1]["drafted_tokens"], 16);
        assert_eq!(json["legs"][1]["accepted_tokens"], 12);
    }

    #[test]
    fn absent_draft_counts_are_null() {
        let req = RequestSpan {
            name: "chat small".into(),
            ..Default::default()
        };
        let t = TurnRecord::build(&root(req.clone()), &req, vec![leg(0, Path::Solo, None)]);
        let partial = TurnRecord::partial(
            PartialTurn {
                instance: "i".into(),
                service_version: None,
                request_id: "p".into(),
                session_id: None,
                trace_id: [1; 16],
                start_ns: 0,
                end_ns: 1,
            },
            vec![leg(0, Path::Solo, None)],
        );
        for t in [t, partial] {
            let json = serde_json::to_value(&t).expect("json");
            for k in ["speculation", "drafts", "drafted_tokens", "accepted_tokens"] {
                assert_eq!(json.get(k), Some(&serde_json::Value::Null), "{k}");
            }
            for k in ["drafted_tokens", "accepted_tokens"] {
                assert_eq!(
                    json["legs"][0].get(k),
                    Some(&serde_json::Value::Null),
                    "leg {k}"
                );
            }
        }
    }

    #[test]
    fn absent_resume_attributes_are_null() {
        let req = RequestSpan {
            name: "chat small".into(),
            status: Some("refused".into()),
            ..Default::default()
        };
        let json = serde_json::to_value(TurnRecord::build(&root(req.clone()), &req, vec![]))
            .expect("json");
        for k in [
            "resume",
            "reusable_tokens",
            "diverged_at",
            "evicted_tokens",
            "cached_tokens",
        ] {
            assert_eq!(json.get(k), Some(&serde_json::Value::Null), "{k}");
        }
    }
}
