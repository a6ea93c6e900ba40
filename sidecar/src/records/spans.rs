//! The engine's spans as the sidecar keeps them: validated and typed, with every attribute
//! the assembly needs already parsed. The receivers' decoder ([`crate::receiver::decode`])
//! makes them; the assembly and the turn records read them. Over the usage record
//! ([`super::usage`], the request span's usage and timing) and the shared vocabulary
//! ([`crate::base::vocab`]), which it hands on.

use std::sync::Arc;

use super::usage::UsageTiming;
pub use crate::base::vocab::{Path, SlotKey, TraceId, hex};

/// One validated span of the engine.
#[derive(Debug, Clone)]
pub struct EngineSpan {
    /// `service.instance.id` of the engine process that sent it.
    pub instance: Arc<str>,
    /// `service.version` of that process.
    pub service_version: Option<Arc<str>>,
    /// The trace id.
    pub trace_id: TraceId,
    /// Span start, Unix ns.
    pub start_ns: i64,
    /// Span end, Unix ns.
    pub end_ns: i64,
    /// The span's status is an error.
    pub error: bool,
    /// The engine's request id, which keys the request's spans (`slotlight.request.id`).
    pub request_id: Box<str>,
    /// `gen_ai.conversation.id` (the session).
    pub session_id: Option<Box<str>>,
    /// What kind of span, with its attributes.
    pub body: Body,
}

/// The kinds of engine span.
#[derive(Debug, Clone)]
pub enum Body {
    /// The request (root) span, named `{operation} {model}`.
    Request(Box<RequestSpan>),
    /// `slotlight.queue`: arrival (start) to admission (end).
    Queue(QueueSpan),
    /// `slotlight.prefill`: the prompt's forward pass (its token counts and device time).
    Prefill(PrefillSpan),
    /// `slotlight.leg`, exported when the leg ends.
    Leg(Box<LegSpan>),
    /// `slotlight.decode`: one progress window.
    Decode(DecodeSpan),
    /// `slotlight.prefill.window`: one progress window of a prefill still running.
    PrefillWindow(PrefillWindowSpan),
}

/// `slotlight.queue`: the wait from arrival to admission, and where the request went.
#[derive(Debug, Clone)]
pub struct QueueSpan {
    /// Where the request was admitted.
    pub key: SlotKey,
}

/// `slotlight.prefill`: how much of the prompt was computed and how long the device took.
#[derive(Debug, Clone, Default)]
pub struct PrefillSpan {
    /// Tokens in the prompt (`slotlight.prefill.prompt_tokens`).
    pub prompt_tokens: Option<i64>,
    /// Prompt tokens whose KV came from the cache (`slotlight.prefill.cached_tokens`).
    pub cached_tokens: Option<i64>,
    /// Prompt tokens run through the model (`slotlight.prefill.computed_tokens`).
    pub computed_tokens: Option<i64>,
    /// Time the device spent on the prefill, ms (`slotlight.prefill.device_ms`).
    pub device_ms: Option<f64>,
}

/// `slotlight.leg`: one stretch of a request on one path and slot, exported when it ends.
#[derive(Debug, Clone)]
pub struct LegSpan {
    /// The leg's path and slot.
    pub key: SlotKey,
    /// `slotlight.leg.index` (counted per choice).
    pub leg_index: i64,
    /// `slotlight.choice.index` (0 when absent: a request of one choice).
    pub choice: i64,
    /// `slotlight.leg.start_time_unix_nano` (the span start when absent).
    pub leg_start_ns: i64,
    /// Tokens generated in earlier legs, carried into this one (`slotlight.leg.tokens_carried`).
    pub tokens_carried: Option<i64>,
    /// Tokens generated during this leg (`slotlight.leg.tokens_generated`).
    pub tokens_generated: Option<i64>,
    /// The largest batch a step of this leg ran in (`slotlight.leg.batch_size.max`).
    pub batch_size_max: Option<i64>,
    /// The mean batch of the leg's steps (`slotlight.leg.batch_size.mean`).
    pub batch_size_mean: Option<f64>,
    /// Time in forward steps during the leg, ms (`slotlight.leg.device_ms`).
    pub device_ms: Option<f64>,
    /// Draft tokens verified during the leg (`slotlight.leg.drafted_tokens`).
    pub drafted_tokens: Option<i64>,
    /// Of those, draft tokens taken (`slotlight.leg.accepted_tokens`).
    pub accepted_tokens: Option<i64>,
    /// Why the leg ended: the request finished, moved, or was preempted (`slotlight.leg.end_reason`).
    pub end_reason: Option<String>,
}

/// `slotlight.decode`: a progress window of one decoding request.
#[derive(Debug, Clone)]
pub struct DecodeSpan {
    /// The leg's path and slot.
    pub key: SlotKey,
    /// `slotlight.leg.index` (0 when absent).
    pub leg_index: i64,
    /// `slotlight.leg.start_time_unix_nano` (the request start when absent).
    pub leg_start_ns: i64,
    /// `slotlight.leg.tokens_carried` (0 when absent).
    pub tokens_carried: i64,
    /// Tokens generated within this window, for the window's own rate (`slotlight.decode.window_tokens`).
    pub window_tokens: Option<i64>,
    /// Decode steps in this window, a verification step of a draft counting once
    /// (`slotlight.decode.window_steps`).
    pub window_steps: Option<i64>,
    /// Draft tokens verified in this window's steps (`slotlight.decode.drafted_tokens`).
    pub drafted_tokens: Option<i64>,
    /// Of those, draft tokens taken (`slotlight.decode.accepted_tokens`).
    pub accepted_tokens: Option<i64>,
    /// `slotlight.decode.tokens_generated`: the request's total so far, over all legs.
    pub tokens_generated: i64,
    /// When the window's last token was sampled, Unix ns (`slotlight.decode.last_token_time_unix_nano`).
    pub last_token_ns: i64,
    /// When the request arrived, Unix ns: the row's elapsed time counts from it
    /// (`slotlight.request.start_time_unix_nano`).
    pub request_start_ns: i64,
    /// When the request's first token was sampled, Unix ns: the row's rate counts from it
    /// (`slotlight.request.first_token_time_unix_nano`).
    pub first_token_ns: Option<i64>,
}

/// `slotlight.prefill.window`: where a running prefill stands after its latest chunks.
#[derive(Debug, Clone)]
pub struct PrefillWindowSpan {
    /// Where the request is placed, when the window says (`slotlight.leg.path`, slot index);
    /// `None` keeps the row the request already holds.
    pub key: Option<SlotKey>,
    /// `slotlight.leg.index` (0 when absent).
    pub leg_index: i64,
    /// `slotlight.leg.tokens_carried` (0 when absent): tokens generated before a re-prefill.
    pub tokens_carried: i64,
    /// Positions of the prompt (`slotlight.prefill.prompt_tokens`).
    pub total: i64,
    /// Positions whose KV came from the cache (`slotlight.prefill.cached_tokens`).
    pub cached: i64,
    /// Positions in the KV cache after the window's last chunk, the cached ones included
    /// (`slotlight.prefill.processed_tokens`).
    pub processed: i64,
    /// Positions computed in this window (`slotlight.prefill.window_tokens`).
    pub window_tokens: Option<i64>,
    /// When the prefill's first chunk started, Unix ns (`slotlight.prefill.start_time_unix_nano`).
    pub prefill_start_ns: i64,
    /// When the window's last chunk ended, Unix ns (`slotlight.prefill.last_chunk_time_unix_nano`).
    pub last_chunk_ns: i64,
    /// When the request arrived, Unix ns (`slotlight.request.start_time_unix_nano`).
    pub request_start_ns: i64,
}

/// The request (root) span's attributes.
#[derive(Debug, Clone, Default)]
pub struct RequestSpan {
    /// The span name (`chat {model}`).
    pub name: String,
    /// What was asked: `chat` or `text_completion` (`gen_ai.operation.name`).
    pub operation: Option<String>,
    /// Who served it, a metric label (`gen_ai.provider.name`).
    pub provider: Option<String>,
    /// How the request ended: `ok`, `cancelled`, `refused`, `error` (`slotlight.request.status`).
    pub status: Option<String>,
    /// The model the client asked for (`gen_ai.request.model`).
    pub request_model: Option<String>,
    /// The model that answered (`gen_ai.response.model`).
    pub response_model: Option<String>,
    /// Why each choice stopped, in choice order (`gen_ai.response.finish_reasons`).
    pub finish_reasons: Vec<String>,
    /// Its usage and timing: token counts, times, warm resume and drafts (`gen_ai.usage.*`,
    /// `slotlight.usage.*`, `slotlight.resume*`, `slotlight.speculation`).
    pub usage: UsageTiming,
    /// When the request arrived, Unix ns (`slotlight.request.start_time_unix_nano`).
    pub request_start_ns: Option<i64>,
    /// When the first token was sampled, Unix ns (`slotlight.request.first_token_time_unix_nano`).
    pub first_token_ns: Option<i64>,
    /// How many leg spans to wait for before the turn record is complete (`slotlight.request.legs`).
    pub legs: Option<i64>,
    /// Whether the request ran on more than one path or slot (`slotlight.request.moved`).
    pub moved: Option<bool>,
    /// The device group that served it (`slotlight.slot.group`).
    pub slot_group: Option<i64>,
    /// The API the request came through (`slotlight.api`).
    pub api: Option<String>,
    /// How the session key was found (`slotlight.session.source`).
    pub session_source: Option<String>,
    /// The turn's index in its session (`slotlight.session.turn`).
    pub session_turn: Option<i64>,
    /// The request id of the keyless turn this found session's turn 1 extends
    /// (`slotlight.session.extends`).
    pub session_extends: Option<String>,
    /// The session branch the turn extends or starts (`slotlight.session.branch`).
    pub session_branch: Option<i64>,
    /// Whether the turn is a side call (`slotlight.session.side_call`).
    pub session_side_call: Option<bool>,
    /// How long after the turn the engine keeps its session's KV, ms
    /// (`slotlight.session.kv_ttl_ms`).
    pub session_kv_ttl_ms: Option<f64>,
    /// What went wrong, a stable label such as `overloaded` or `cancelled` (`error.type`).
    pub error_type: Option<String>,
    /// `slotlight.trace.sampling_ratio`: the share of traces the engine keeps.
    pub sampling_ratio: Option<f64>,
    /// `slotlight.engine.data_parallel_rank`: the engine's data-parallel rank.
    pub data_parallel_rank: Option<i64>,
}
