//! How a finished request ended, decided once from its choices' completions.
//!
//! [`RequestOutcome::of`] is the only place that merges the choices: their usage and llama.cpp
//! timings, the request's status and `error.type`, the finish reasons, the merged instants
//! (first admission, first token, last token, last finish) and the legs. The response, the
//! request span, the log line and the latency metrics only read it, so they cannot disagree.
//!
//! The rule that decides the request's status (documented in `docs/api.md`): the first
//! choice that failed decides it (`error`, with its engine error's `error.type`); else the
//! first choice the client cancelled (`cancelled`, `error.type` `cancelled`); else the request
//! is `ok`. So a request of two choices that ends `[stop, cancelled]` is `cancelled`.

use std::time::{Duration, Instant};

use slotlight_otel::attr::value;

use crate::scheduler::{Completion, EngineError, FinishReason};
use crate::server::error::ApiError;
use crate::server::request::usage::{
    CompletionDetails, LegUsage, LlamaCppTimings, PromptDetails, Usage, UsageExtras,
};
use crate::speculation::SpeculationMode;
use crate::timing::{DraftCounts, LegRecord, UsageTimings};

/// How a request ended (`slotlight.request.status`, the log line's `status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestStatus {
    /// Every choice ran to its end (`stop`, `length` or tool calls).
    Ok,
    /// No choice failed, and the client went away before one ended.
    Cancelled,
    /// A choice failed in the engine.
    Error,
}

impl RequestStatus {
    /// The attribute and log value.
    pub fn as_str(self) -> &'static str {
        match self {
            RequestStatus::Ok => value::STATUS_OK,
            RequestStatus::Cancelled => value::STATUS_CANCELLED,
            RequestStatus::Error => value::STATUS_ERROR,
        }
    }
}

/// A choice's finish reason as the API answers it: the engine's, except `tool_calls` for a
/// reply of tool calls that stopped. It becomes a string only where JSON or a span attribute
/// is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiFinishReason {
    /// An end-of-sequence token or a stop string (`stop`).
    Stop,
    /// `max_tokens` or the context was reached (`length`).
    Length,
    /// The reply is tool calls (`tool_calls`).
    ToolCalls,
    /// The client went away (`cancelled`).
    Cancelled,
    /// The engine failed (`error`).
    Error,
}

impl ApiFinishReason {
    /// The API's reason for a choice the engine ended with `engine`, whose reply held tool
    /// calls when `tool_calls`.
    pub fn of(engine: &FinishReason, tool_calls: bool) -> Self {
        match engine {
            FinishReason::Stop if tool_calls => ApiFinishReason::ToolCalls,
            FinishReason::Stop => ApiFinishReason::Stop,
            FinishReason::Length => ApiFinishReason::Length,
            FinishReason::Cancelled => ApiFinishReason::Cancelled,
            FinishReason::Error(_) => ApiFinishReason::Error,
        }
    }

    /// The wire value (`finish_reason`, `gen_ai.response.finish_reasons`).
    pub fn as_str(self) -> &'static str {
        match self {
            ApiFinishReason::Stop => value::FINISH_STOP,
            ApiFinishReason::Length => value::FINISH_LENGTH,
            ApiFinishReason::ToolCalls => value::FINISH_TOOL_CALLS,
            ApiFinishReason::Cancelled => value::FINISH_CANCELLED,
            ApiFinishReason::Error => value::FINISH_ERROR,
        }
    }
}

impl serde::Serialize for ApiFinishReason {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// Why a request did not succeed: the deciding choice's end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The client went away before a choice ended.
    Cancelled,
    /// The engine failed a choice.
    Engine(EngineError),
}

impl Failure {
    /// The `error.type` label (metrics, span and log line alike).
    pub fn error_type(&self) -> &'static str {
        match self {
            Failure::Cancelled => value::ERROR_CANCELLED,
            Failure::Engine(e) => e.label(),
        }
    }

    /// The span's error status message.
    pub fn message(&self) -> String {
        match self {
            Failure::Cancelled => "cancelled by the client".to_string(),
            Failure::Engine(e) => e.to_string(),
        }
    }
}

/// The request's own instants, merged over its choices: the first admission, the first token
/// of any choice, the last token of any choice and the last finish. A value no choice had is
/// `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Instants {
    /// Arrival at the HTTP layer.
    pub received: Instant,
    /// The first admission of any choice (the end of queueing).
    pub admitted: Option<Instant>,
    /// The first token of any choice.
    pub first_token: Option<Instant>,
    /// The last token of any choice.
    pub last_token: Option<Instant>,
    /// The last choice's finish.
    pub finished: Option<Instant>,
}

impl Instants {
    fn of(received: Instant, done: &[Completion]) -> Self {
        let min = |f: fn(&Completion) -> Option<Instant>| done.iter().filter_map(f).min();
        let max = |f: fn(&Completion) -> Option<Instant>| done.iter().filter_map(f).max();
        Self {
            received,
            admitted: min(|c| c.timings.admitted),
            first_token: min(|c| c.timings.first_token),
            last_token: max(|c| c.timings.last_token),
            finished: max(|c| c.timings.finished),
        }
    }

    /// First token to last token, over all choices.
    pub fn generation(&self) -> Option<Duration> {
        Some(
            self.last_token?
                .saturating_duration_since(self.first_token?),
        )
    }
}

/// One leg of one choice.
#[derive(Debug, Clone)]
pub struct ChoiceLeg {
    /// The choice it belongs to.
    pub choice: usize,
    /// What the leg did.
    pub record: LegRecord,
}

/// A finished request, decided once: everything its response, span, log line and metrics say
/// about how it ended.
#[derive(Debug, Clone)]
pub struct RequestOutcome {
    /// `usage`, with the request's own timings.
    pub usage: Usage,
    /// llama.cpp's `timings`.
    pub timings: LlamaCppTimings,
    /// How the request ended (see the module's rule).
    pub status: RequestStatus,
    /// The deciding choice's failure; `None` when the request is `ok`.
    pub failure: Option<Failure>,
    /// Each choice's finish reason as the engine gave it, in choice order.
    pub finish_reasons: Vec<FinishReason>,
    /// Each choice's finish reason as the API answers it (`tool_calls` for a reply of calls).
    pub api_finish_reasons: Vec<ApiFinishReason>,
    /// The merged instants.
    pub instants: Instants,
    /// Every choice's legs, choice by choice.
    pub legs: Vec<ChoiceLeg>,
    /// Tokens computed by every prefill of every choice.
    pub prefilled_tokens: usize,
    /// The slot group of the first choice.
    pub group: usize,
    /// Time spent computing grammar masks, and how many, over the choices that had a
    /// constraint (`None` without one).
    pub masks: Option<(Duration, u64)>,
    /// Tool calls found over all choices.
    pub tool_calls: usize,
    /// How the request was drafted for (speculative decoding; every choice alike).
    pub speculation: SpeculationMode,
    /// Its drafts, over all choices.
    pub drafts: DraftCounts,
    /// How long after the request the engine keeps its session's KV (`None` without a
    /// session; zero when it keeps none).
    pub session_kv_ttl: Option<Duration>,
    /// The request span's context, once it has ended: the parent of work a door does after
    /// the request (the Responses store's save).
    pub span: Option<opentelemetry::Context>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

impl RequestOutcome {
    /// Decides the outcome of a request that arrived at `received` from every choice's
    /// completion (in choice order), the API finish reason given to each and the tool calls
    /// found.
    pub fn of(
        received: Instant,
        done: &[Completion],
        api_finish_reasons: Vec<ApiFinishReason>,
        tool_calls: usize,
    ) -> Self {
        let instants = Instants::of(received, done);
        let failure = done
            .iter()
            .find_map(|c| match &c.finish_reason {
                FinishReason::Error(e) => Some(Failure::Engine(e.clone())),
                _ => None,
            })
            .or_else(|| {
                done.iter()
                    .any(|c| c.finish_reason == FinishReason::Cancelled)
                    .then_some(Failure::Cancelled)
            });
        let status = match failure {
            None => RequestStatus::Ok,
            Some(Failure::Cancelled) => RequestStatus::Cancelled,
            Some(Failure::Engine(_)) => RequestStatus::Error,
        };
        let legs: Vec<ChoiceLeg> = done
            .iter()
            .flat_map(|c| {
                c.timings.legs.iter().map(|l| ChoiceLeg {
                    choice: c.choice,
                    record: l.clone(),
                })
            })
            .collect();
        let masks = done.iter().filter_map(|c| c.mask).fold(None, |acc, m| {
            let (t, n) = acc.unwrap_or((Duration::ZERO, 0));
            Some((t + m.time, n + m.masks))
        });
        let speculation = done
            .iter()
            .map(|c| c.speculation)
            .find(|m| *m != SpeculationMode::Off)
            .unwrap_or(SpeculationMode::Off);
        let mut drafts = DraftCounts::default();
        for c in done {
            drafts.add(&c.timings.drafts);
        }
        let mut usage = usage(&instants, done, &legs);
        usage.extras.drafted_tokens = drafts.drafted_tokens;
        usage.extras.accepted_tokens = drafts.accepted_tokens;
        usage.completion_tokens_details = CompletionDetails::of(None, speculation, &drafts);
        let mut timings = llama_cpp_timings(&instants, done);
        if speculation != SpeculationMode::Off {
            timings.draft_n = Some(drafts.drafted_tokens);
            timings.draft_n_accepted = Some(drafts.accepted_tokens);
        }
        Self {
            usage,
            timings,
            status,
            failure,
            finish_reasons: done.iter().map(|c| c.finish_reason.clone()).collect(),
            api_finish_reasons,
            instants,
            prefilled_tokens: done.iter().map(|c| c.timings.prefilled_tokens).sum(),
            group: done.first().map_or(0, |c| c.group),
            legs,
            masks,
            tool_calls,
            speculation,
            drafts,
            session_kv_ttl: done.first().and_then(|c| c.timings.session_kv_ttl),
            span: None,
        }
    }

    /// The `error.type` of a request that did not succeed.
    pub fn error_type(&self) -> Option<&'static str> {
        self.failure.as_ref().map(Failure::error_type)
    }

    /// The engine error the client is answered with, when a choice failed (a cancelled
    /// request's client is gone: it gets no error).
    pub fn api_error(&self) -> Option<ApiError> {
        match &self.failure {
            Some(Failure::Engine(e)) => Some(ApiError::from(e)),
            _ => None,
        }
    }

    /// Records the reasoning tokens counted over the choices (`None`: the replies were not
    /// parsed for reasoning), in `usage.completion_tokens_details`.
    pub fn set_reasoning_tokens(&mut self, tokens: Option<usize>) {
        self.usage.completion_tokens_details =
            CompletionDetails::of(tokens, self.speculation, &self.drafts);
    }

    /// Reasoning tokens over the choices, when the replies were parsed for reasoning.
    pub fn reasoning_tokens(&self) -> Option<usize> {
        self.usage
            .completion_tokens_details
            .as_ref()
            .and_then(|d| d.reasoning_tokens)
    }

    /// Whether a choice ran more than one leg (it moved).
    pub fn moved(&self) -> bool {
        self.legs.iter().any(|l| l.record.index > 0)
    }
}

/// The timings of a request of one or more choices: arrival to the first admission
/// (`queue_ms`), to the first token of any choice (`ttft_ms`) and to the last finish
/// (`e2e_ms`); first to last token over all choices (`generation_ms`); prefill and decode
/// device time summed over the choices, and `decode_tps` = the tokens of decode steps per
/// second of that decode time (numerator and denominator cover the same steps). A value no
/// choice had is `None`. With one choice these are its own timings.
#[allow(clippy::cast_precision_loss)] // step counts are far below 2^53
fn merged_timings(at: &Instants, done: &[Completion]) -> UsageTimings {
    let since = |t: Option<Instant>| t.map(|t| ms(t.saturating_duration_since(at.received)));
    let prefill_steps: u64 = done.iter().map(|c| c.timings.prefill_steps).sum();
    let prefill: Duration = done.iter().map(|c| c.timings.prefill_device).sum();
    let decode_steps: u64 = done.iter().map(|c| c.timings.decode_steps).sum();
    let decode_tokens: u64 = done.iter().map(|c| c.timings.decode_tokens).sum();
    let decode: Duration = done.iter().map(|c| c.timings.decode_device).sum();
    let decode_ms = (decode_steps > 0).then(|| ms(decode));
    UsageTimings {
        queue_ms: since(at.admitted),
        prefill_ms: (prefill_steps > 0).then(|| ms(prefill)),
        ttft_ms: since(at.first_token),
        decode_ms,
        generation_ms: at.generation().map(ms),
        decode_tps: decode_ms
            .filter(|d| *d > 0.0)
            .map(|d| decode_tokens as f64 / (d / 1000.0)),
        e2e_ms: since(at.finished),
    }
}

/// llama.cpp's `timings` over every choice, with llama.cpp's own definitions (its server's
/// `server_slot::get_timings`): wall-clock times, and rates as counts per second of those
/// times. A rate whose time is zero or unknown is `null` (llama.cpp would divide by zero).
#[allow(clippy::cast_precision_loss)] // token counts are far below 2^53
fn llama_cpp_timings(at: &Instants, done: &[Completion]) -> LlamaCppTimings {
    let per_second =
        |n: usize, ms: Option<f64>| ms.filter(|m| *m > 0.0).map(|m| n as f64 / (m / 1e3));
    let per_token = |n: usize, ms: Option<f64>| ms.filter(|_| n > 0).map(|m| m / n as f64);
    // prompt_n: `n_prompt_tokens_processed`, the prompt tokens evaluated (not taken from the
    // cache); here every prefill's computed tokens, a re-prefill after a preemption included.
    let prompt_n = done.iter().map(|c| c.timings.prefilled_tokens).sum();
    // prompt_ms: `t_prompt_processing`, the wall time from the start of prompt processing to
    // the first token; here the wall time of every prefill (first chunk's start to its end).
    let walls: Vec<Duration> = done
        .iter()
        .filter_map(|c| c.timings.prefill_wall())
        .collect();
    let prompt_ms = (!walls.is_empty()).then(|| ms(walls.iter().sum()));
    // predicted_n: `n_decoded`, every generated token (the first one included).
    let predicted_n = done.iter().map(|c| c.timings.generated_tokens).sum();
    // predicted_ms: `t_token_generation`, the wall time from the first token to the last.
    let predicted_ms = at.generation().map(ms);
    LlamaCppTimings {
        // cache_n: `n_prompt_tokens_cache`, prompt tokens reused from the cache.
        cache_n: done.first().map_or(0, |c| c.timings.cached_tokens),
        prompt_n,
        prompt_ms,
        // prompt_per_token_ms: `prompt_ms / prompt_n`.
        prompt_per_token_ms: per_token(prompt_n, prompt_ms),
        // prompt_per_second: `prompt_n` per second of `prompt_ms`.
        prompt_per_second: per_second(prompt_n, prompt_ms),
        predicted_n,
        predicted_ms,
        // predicted_per_token_ms: `predicted_ms / predicted_n`.
        predicted_per_token_ms: per_token(predicted_n, predicted_ms),
        // predicted_per_second: `predicted_n` per second of `predicted_ms`.
        predicted_per_second: per_second(predicted_n, predicted_ms),
        // draft_n, draft_n_accepted: set by the caller when the request was drafted for.
        draft_n: None,
        draft_n_accepted: None,
    }
}

/// The usage block from every choice's own clocks.
fn usage(at: &Instants, done: &[Completion], legs: &[ChoiceLeg]) -> Usage {
    let prompt_tokens = done.first().map_or(0, |c| c.timings.prompt_tokens);
    let cached_tokens = done.first().map_or(0, |c| c.timings.cached_tokens);
    let completion_tokens: usize = done.iter().map(|c| c.timings.generated_tokens).sum();
    // The prompt's fate is choice 0's (the others fork from its prefill).
    let resume = done.first().and_then(|c| c.timings.resume);
    let extras = UsageExtras {
        resume: resume.map(|r| r.outcome.as_str()),
        reusable_tokens: resume.and_then(|r| r.reusable_tokens),
        diverged_at: resume.and_then(|r| r.diverged_at),
        evicted_tokens: resume.and_then(|r| r.evicted_tokens),
        drafted_tokens: 0,
        accepted_tokens: 0,
        timings: merged_timings(at, done),
        legs: legs
            .iter()
            .map(|l| LegUsage {
                choice: l.choice,
                path: l.record.path.as_str(),
                group: l.record.group,
                slot: l.record.slot,
                tokens_carried: l.record.tokens_carried,
                tokens: l.record.tokens_generated,
                ms: l
                    .record
                    .end
                    .map(|e| ms(e.saturating_duration_since(l.record.start))),
                device_ms: ms(l.record.device),
                drafted_tokens: l.record.drafted_tokens,
                accepted_tokens: l.record.accepted_tokens,
            })
            .collect(),
    };
    Usage {
        prompt_tokens,
        completion_tokens,
        total_tokens: prompt_tokens + completion_tokens,
        prompt_tokens_details: PromptDetails { cached_tokens },
        completion_tokens_details: None,
        extras,
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::timing::{PathKind, RequestTimings};

    fn choice(t0: Instant, index: usize, admit_ms: u64, tokens: u64) -> Completion {
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut t = RequestTimings::new(t0, 10);
        t.mark_admitted(at(admit_ms));
        t.start_leg(PathKind::Slot, 0, Some(index), at(admit_ms));
        t.add_step(Duration::from_millis(10), 2, true);
        for i in 0..tokens {
            t.mark_token(at(admit_ms + 20 + 10 * i), i > 0);
            if i > 0 {
                t.add_step(Duration::from_millis(10), 2, false);
            }
        }
        t.mark_finished(at(admit_ms + 20 + 10 * tokens));
        Completion {
            finish_reason: FinishReason::Length,
            tokens: Vec::new(),
            tail_text: String::new(),
            timings: t,
            group: 0,
            choice: index,
            mask: None,
            speculation: crate::speculation::SpeculationMode::Off,
        }
    }

    fn of(t0: Instant, done: &[Completion]) -> RequestOutcome {
        let reasons = done
            .iter()
            .map(|c| ApiFinishReason::of(&c.finish_reason, false))
            .collect();
        RequestOutcome::of(t0, done, reasons, 0)
    }

    #[test]
    fn one_choice_is_its_own_usage_and_several_add_up() {
        let t0 = Instant::now();
        let a = choice(t0, 0, 5, 4);
        let u = of(t0, std::slice::from_ref(&a)).usage;
        assert_eq!(u.extras.timings, a.timings.usage());
        assert_eq!((u.prompt_tokens, u.completion_tokens), (10, 4));
        assert!(u.extras.legs.iter().all(|l| l.choice == 0));

        let b = choice(t0, 1, 30, 6);
        let o = of(t0, &[a, b]);
        let (u, tm) = (o.usage, o.timings);
        assert_eq!(u.prompt_tokens, 10, "the prompt counts once");
        assert_eq!(u.completion_tokens, 10);
        assert_eq!(u.total_tokens, 20);
        assert_eq!(u.extras.timings.queue_ms, Some(5.0), "the first admission");
        assert_eq!(
            u.extras.timings.ttft_ms,
            Some(25.0),
            "the first token of any choice"
        );
        assert_eq!(u.extras.timings.e2e_ms, Some(110.0), "the last finish");
        assert_eq!(u.extras.timings.generation_ms, Some(75.0));
        assert_eq!(u.extras.timings.prefill_ms, Some(20.0));
        assert_eq!(u.extras.timings.decode_ms, Some(80.0));
        let tps = u.extras.timings.decode_tps.expect("tps");
        assert!((tps - 8.0 / 0.08).abs() < 1e-9);
        assert_eq!(tm.predicted_n, 10);
        let choices: Vec<usize> = u.extras.legs.iter().map(|l| l.choice).collect();
        assert_eq!(choices, vec![0, 1]);
    }

    /// The rule: the first failed choice decides, else any cancelled one, else `ok`.
    #[test]
    fn the_worst_choice_decides_the_status() {
        let t0 = Instant::now();
        let with = |reasons: &[FinishReason]| {
            let done: Vec<Completion> = reasons
                .iter()
                .enumerate()
                .map(|(i, r)| Completion {
                    finish_reason: r.clone(),
                    ..choice(t0, i, 1, 2)
                })
                .collect();
            let o = of(t0, &done);
            (o.status, o.error_type())
        };
        assert_eq!(
            with(&[FinishReason::Stop, FinishReason::Length]),
            (RequestStatus::Ok, None)
        );
        assert_eq!(
            with(&[FinishReason::Stop, FinishReason::Cancelled]),
            (RequestStatus::Cancelled, Some(value::ERROR_CANCELLED))
        );
        assert_eq!(
            with(&[
                FinishReason::Cancelled,
                FinishReason::Error(EngineError::ShuttingDown)
            ]),
            (RequestStatus::Error, Some(value::ERROR_SHUTDOWN))
        );
    }
}
