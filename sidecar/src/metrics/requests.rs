//! The per-turn metrics (GenAI latency histograms, token counters, outcomes, resume
//! outcomes), observed from each finished request's [`TurnRecord`] and kept per GenAI label
//! set. Label sets are capped: models beyond [`MAX_SERIES`] go to an `_overflow` series, and
//! outcomes beyond [`MAX_OUTCOMES`] per series to an `_overflow` error type or resume value.

use std::collections::BTreeMap;

use slotlight_otel::metric::{buckets, label};

use super::OVERFLOW;
use super::histogram::{self, TraceHistogram};
use crate::assembly::turns::{TurnRecord, TurnStatus};

/// Most distinct GenAI label sets (operation, provider, request and response model).
pub const MAX_SERIES: usize = 64;
/// Most distinct (status, finish reason, error type) per GenAI label set.
pub const MAX_OUTCOMES: usize = 32;

/// The GenAI labels of the per-turn metrics: operation, provider, request model, response
/// model. An unknown value is left off the series.
pub type GenAiKey = [String; 4];

/// How a turn ended, for `slotlight_requests_total`: status, finish reason, error type.
pub type Outcome = (TurnStatus, Option<String>, Option<String>);

/// Per-turn metrics of one GenAI label set, observed from turn records.
#[derive(Debug)]
pub struct SeriesMetrics {
    /// Time to first token, successful turns only.
    pub ttft: TraceHistogram,
    /// Time per output token after the first, successful turns only.
    pub tpot: TraceHistogram,
    /// Request duration by `error_type` (`None` on success).
    pub duration: BTreeMap<Option<String>, TraceHistogram>,
    /// Time in the engine's queue, for turns that were queued.
    pub queue: TraceHistogram,
    /// Prefill time, for turns that were prefilled.
    pub prefill: TraceHistogram,
    /// Decode time, for turns that decoded.
    pub decode: TraceHistogram,
    /// Prompt tokens of every turn.
    pub prompt_tokens: u64,
    /// Prompt tokens read from the KV cache.
    pub cached_tokens: u64,
    /// Tokens generated.
    pub generated_tokens: u64,
    /// Moves between slots or paths, one per change between consecutive legs.
    pub moves: u64,
    /// Turns by outcome.
    pub requests: BTreeMap<Outcome, u64>,
    /// Turns by `slotlight.resume` (only turns that carry it: admitted ones).
    pub resume: BTreeMap<String, u64>,
}

impl Default for SeriesMetrics {
    fn default() -> Self {
        SeriesMetrics {
            ttft: histogram::new(buckets::TIME_TO_FIRST_TOKEN),
            tpot: histogram::new(buckets::TIME_PER_OUTPUT_TOKEN),
            duration: BTreeMap::new(),
            queue: histogram::new(buckets::REQUEST_DURATION),
            prefill: histogram::new(buckets::REQUEST_DURATION),
            decode: histogram::new(buckets::REQUEST_DURATION),
            prompt_tokens: 0,
            cached_tokens: 0,
            generated_tokens: 0,
            moves: 0,
            requests: BTreeMap::new(),
            resume: BTreeMap::new(),
        }
    }
}

/// Every GenAI label set's per-turn metrics.
#[derive(Debug, Default)]
pub struct RequestMetrics {
    /// The series, sorted by label set.
    pub series: BTreeMap<GenAiKey, SeriesMetrics>,
}

fn nonneg(v: Option<i64>) -> u64 {
    v.and_then(|v| u64::try_from(v).ok()).unwrap_or(0)
}

/// A label value from a turn, capped in length (a client chooses the request model).
fn label_value(v: Option<&str>) -> String {
    let v = v.unwrap_or("");
    match v.char_indices().nth(128) {
        Some((i, _)) => v[..i].to_string(),
        None => v.to_string(),
    }
}

/// The GenAI labels of a series, without the unknown ones.
pub fn genai_labels(k: &GenAiKey) -> Vec<(&'static str, String)> {
    [
        label::GEN_AI_OPERATION_NAME,
        label::GEN_AI_PROVIDER_NAME,
        label::GEN_AI_REQUEST_MODEL,
        label::GEN_AI_RESPONSE_MODEL,
    ]
    .into_iter()
    .zip(k.iter().cloned())
    .filter(|(_, v)| !v.is_empty())
    .collect()
}

impl RequestMetrics {
    /// Adds one finished request.
    pub fn observe(&mut self, t: &TurnRecord) {
        let key: GenAiKey = [
            label_value(t.operation.as_deref()),
            label_value(t.provider.as_deref()),
            label_value(t.request_model.as_deref()),
            label_value(t.response_model.as_deref()),
        ];
        let key = if self.series.len() >= MAX_SERIES && !self.series.contains_key(&key) {
            [OVERFLOW, OVERFLOW, OVERFLOW, OVERFLOW].map(String::from)
        } else {
            key
        };
        let m = self.series.entry(key).or_default();
        let ex = Some(&t.trace_id_bytes);
        let ts = u64::try_from(t.end_time_unix_nano).unwrap_or(0);
        let s = |ms: Option<f64>| ms.map(|v| v / 1e3);
        let ok = t.status == TurnStatus::Ok;
        // The GenAI conventions record these two for successful responses only.
        if ok {
            if let Some(v) = s(t.ttft_ms) {
                histogram::observe(&m.ttft, v, ex, ts);
            }
            if let (Some(g), Some(n)) = (s(t.generation_ms), t.completion_tokens)
                && n > 1
            {
                #[allow(clippy::cast_precision_loss)] // token counts are far below 2^53
                histogram::observe(&m.tpot, g / (n - 1) as f64, ex, ts);
            }
        }
        // Every turn has a duration: its own `e2e_ms`, else (a refusal) its span's.
        #[allow(clippy::cast_precision_loss)] // span durations in ns fit f64 closely enough
        let span_s = (t.end_time_unix_nano - t.start_time_unix_nano).max(0) as f64 / 1e9;
        let duration = s(t.e2e_ms).unwrap_or(span_s);
        let error_type =
            (!ok).then(|| label_value(t.error_type.as_deref().or(Some(t.status.as_str()))));
        if m.duration.len() < MAX_OUTCOMES || m.duration.contains_key(&error_type) {
            let h = m
                .duration
                .entry(error_type.clone())
                .or_insert_with(|| histogram::new(buckets::REQUEST_DURATION));
            histogram::observe(h, duration, ex, ts);
        }
        // Only what the request had: an unknown time is never observed.
        if let Some(v) = s(t.queue_ms) {
            histogram::observe(&m.queue, v, ex, ts);
        }
        if let Some(v) = s(t.prefill_ms) {
            histogram::observe(&m.prefill, v, ex, ts);
        }
        if let Some(v) = s(t.decode_ms) {
            histogram::observe(&m.decode, v, ex, ts);
        }
        m.prompt_tokens += nonneg(t.prompt_tokens);
        m.cached_tokens += nonneg(t.cached_tokens);
        m.generated_tokens += nonneg(t.completion_tokens);
        // Each change of path or slot between consecutive legs is one move; a request that
        // says it moved but whose legs did not all arrive counts once.
        let transitions = t
            .legs
            .windows(2)
            .filter(|w| (w[0].path, w[0].slot, w[0].group) != (w[1].path, w[1].slot, w[1].group))
            .count() as u64;
        m.moves += if transitions > 0 {
            transitions
        } else {
            u64::from(t.moved)
        };
        let outcome: Outcome = if ok {
            let finish = label_value(t.finish_reason.as_deref());
            (t.status, Some(finish).filter(|f| !f.is_empty()), None)
        } else {
            (t.status, None, error_type)
        };
        let outcome = if m.requests.len() >= MAX_OUTCOMES && !m.requests.contains_key(&outcome) {
            (t.status, None, Some(OVERFLOW.to_string()))
        } else {
            outcome
        };
        *m.requests.entry(outcome).or_default() += 1;
        // A turn never admitted has no resume outcome and is not counted. The engine sends
        // the contract's values; anything else is kept, within the same cap as outcomes.
        let resume = label_value(t.resume.as_deref());
        if !resume.is_empty() {
            let resume = if m.resume.len() >= MAX_OUTCOMES && !m.resume.contains_key(&resume) {
                OVERFLOW.to_string()
            } else {
                resume
            };
            *m.resume.entry(resume).or_default() += 1;
        }
    }
}
