//! A finished request's `usage` and llama.cpp `timings`, from its own clocks (one set per
//! choice). The per-request pipeline builds these; the wire layer only serializes them.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::scheduler::Completion;
use crate::timing::{RequestTimings, UsageTimings};

/// `usage`, with the request's own timings.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Usage {
    /// Prompt tokens (counted once, whatever `n`).
    pub prompt_tokens: usize,
    /// Completion tokens, over all choices.
    pub completion_tokens: usize,
    /// Their sum.
    pub total_tokens: usize,
    /// Details of the prompt.
    pub prompt_tokens_details: PromptDetails,
    /// The request's own timings.
    #[serde(flatten)]
    pub timings: UsageTimings,
    /// Whether the turn reused its conversation's KV and, if not, why (`first`, `full`,
    /// `diverged`, `evicted`, `other_group`; without a session `none` or `prefix`); `null`
    /// for a request never admitted.
    pub resume: Option<&'static str>,
    /// Tokens the prompt had in common with the session's remembered last turn: what could
    /// have been reused (`null` without a remembered turn).
    pub reusable_tokens: Option<usize>,
    /// Where the prompt departs from the session's last turn (`diverged`, and `evicted` when
    /// the history changed too).
    pub diverged_at: Option<usize>,
    /// Reusable tokens whose KV blocks had been reclaimed (`evicted`).
    pub evicted_tokens: Option<usize>,
    /// The request's legs (slotlight extension): where each choice ran and what each stretch
    /// did.
    pub legs: Vec<LegUsage>,
}

/// One leg in `usage.legs`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LegUsage {
    /// The choice the leg belongs to (0 unless `n` > 1).
    pub choice: usize,
    /// `solo` or `slot`.
    pub path: &'static str,
    /// Device group.
    pub group: usize,
    /// Slot index (slot path only).
    pub slot: Option<usize>,
    /// Reply tokens carried into the leg.
    pub tokens_carried: usize,
    /// Tokens generated in the leg.
    pub tokens: usize,
    /// Wall time of the leg (`null` if it never ended).
    pub ms: Option<f64>,
    /// Time in the forward steps of the leg.
    pub device_ms: f64,
}

/// `usage.prompt_tokens_details`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PromptDetails {
    /// Prompt tokens served from the KV cache (for the first choice; the others fork from it).
    pub cached_tokens: usize,
}

/// llama.cpp's `timings` object, with llama.cpp's definitions (see [`llama_cpp_timings`]); a
/// value that is unknown or would divide by zero is `null`.
#[derive(Debug, Clone, Serialize)]
pub struct LlamaCppTimings {
    /// Prompt tokens reused from the cache.
    pub cache_n: usize,
    /// Prompt tokens evaluated (not from the cache).
    pub prompt_n: usize,
    /// Wall time of prompt processing, ms.
    pub prompt_ms: Option<f64>,
    /// `prompt_ms / prompt_n`.
    pub prompt_per_token_ms: Option<f64>,
    /// `prompt_n` per second of `prompt_ms`.
    pub prompt_per_second: Option<f64>,
    /// Generated tokens, the first included.
    pub predicted_n: usize,
    /// Wall time from the first token to the last, ms.
    pub predicted_ms: Option<f64>,
    /// `predicted_ms / predicted_n`.
    pub predicted_per_token_ms: Option<f64>,
    /// `predicted_n` per second of `predicted_ms`.
    pub predicted_per_second: Option<f64>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The timings of a request of several choices: arrival to the first admission (`queue_ms`),
/// to the first token of any choice (`ttft_ms`) and to the last finish (`e2e_ms`); first to
/// last token over all choices (`generation_ms`); prefill and decode device time summed over
/// the choices, and `decode_tps` = decode steps per second of that decode time (each decode
/// step yields one token of its choice, so numerator and denominator cover the same steps).
/// A value no choice had is `None`. With one choice these are its own timings unchanged.
#[allow(clippy::cast_precision_loss)] // step counts are far below 2^53
pub fn merged_timings(choices: &[&Completion]) -> UsageTimings {
    if let [one] = choices {
        return one.timings.usage();
    }
    let Some(first) = choices.first() else {
        return RequestTimings::new(Instant::now(), 0).usage();
    };
    let received = first.timings.received;
    let since = |t: Option<Instant>| t.map(|t| ms(t.saturating_duration_since(received)));
    let min_of =
        |f: &dyn Fn(&Completion) -> Option<Instant>| choices.iter().filter_map(|c| f(c)).min();
    let max_of =
        |f: &dyn Fn(&Completion) -> Option<Instant>| choices.iter().filter_map(|c| f(c)).max();
    let admitted = min_of(&|c| c.timings.admitted);
    let first_token = min_of(&|c| c.timings.first_token);
    let last_token = max_of(&|c| c.timings.last_token);
    let finished = max_of(&|c| c.timings.finished);
    let prefill_steps: u64 = choices.iter().map(|c| c.timings.prefill_steps).sum();
    let prefill: Duration = choices.iter().map(|c| c.timings.prefill_device).sum();
    let decode_steps: u64 = choices.iter().map(|c| c.timings.decode_steps).sum();
    let decode: Duration = choices.iter().map(|c| c.timings.decode_device).sum();
    let decode_ms = (decode_steps > 0).then(|| ms(decode));
    UsageTimings {
        queue_ms: since(admitted),
        prefill_ms: (prefill_steps > 0).then(|| ms(prefill)),
        ttft_ms: since(first_token),
        decode_ms,
        generation_ms: match (first_token, last_token) {
            (Some(f), Some(l)) => Some(ms(l.saturating_duration_since(f))),
            _ => None,
        },
        decode_tps: decode_ms
            .filter(|d| *d > 0.0)
            .map(|d| decode_steps as f64 / (d / 1000.0)),
        e2e_ms: since(finished),
    }
}

/// llama.cpp's `timings` over every choice, with llama.cpp's own definitions (its server's
/// `server_slot::get_timings`): wall-clock times, and rates as counts per second of those
/// times. A rate whose time is zero or unknown is `null` (llama.cpp would divide by zero).
#[allow(clippy::cast_precision_loss)] // token counts are far below 2^53
pub fn llama_cpp_timings(choices: &[&Completion]) -> LlamaCppTimings {
    let per_second =
        |n: usize, ms: Option<f64>| ms.filter(|m| *m > 0.0).map(|m| n as f64 / (m / 1e3));
    let per_token = |n: usize, ms: Option<f64>| ms.filter(|_| n > 0).map(|m| m / n as f64);
    // prompt_n: `n_prompt_tokens_processed`, the prompt tokens evaluated (not taken from the
    // cache); here every prefill's computed tokens, a re-prefill after a preemption included.
    let prompt_n = choices.iter().map(|c| c.timings.prefilled_tokens).sum();
    // prompt_ms: `t_prompt_processing`, the wall time from the start of prompt processing to
    // the first token; here the wall time of every prefill (first chunk's start to its end).
    let walls: Vec<Duration> = choices
        .iter()
        .filter_map(|c| c.timings.prefill_wall())
        .collect();
    let prompt_ms = (!walls.is_empty()).then(|| ms(walls.iter().sum()));
    // predicted_n: `n_decoded`, every generated token (the first one included).
    let predicted_n = choices.iter().map(|c| c.timings.generated_tokens).sum();
    // predicted_ms: `t_token_generation`, the wall time from the first token to the last.
    let first = choices.iter().filter_map(|c| c.timings.first_token).min();
    let last = choices.iter().filter_map(|c| c.timings.last_token).max();
    let predicted_ms = match (first, last) {
        (Some(f), Some(l)) => Some(ms(l.saturating_duration_since(f))),
        _ => None,
    };
    LlamaCppTimings {
        // cache_n: `n_prompt_tokens_cache`, prompt tokens reused from the cache.
        cache_n: choices.first().map_or(0, |c| c.timings.cached_tokens),
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
    }
}

/// Builds the usage block and llama.cpp timings from every choice's own clocks.
pub fn usage_of(choices: &[&Completion]) -> (Usage, LlamaCppTimings) {
    let prompt_tokens = choices.first().map_or(0, |c| c.timings.prompt_tokens);
    let cached_tokens = choices.first().map_or(0, |c| c.timings.cached_tokens);
    let completion_tokens: usize = choices.iter().map(|c| c.timings.generated_tokens).sum();
    // The prompt's fate is choice 0's (the others fork from its prefill).
    let resume = choices.first().and_then(|c| c.timings.resume);
    let usage = Usage {
        resume: resume.map(|r| r.outcome.as_str()),
        reusable_tokens: resume.and_then(|r| r.reusable_tokens),
        diverged_at: resume.and_then(|r| r.diverged_at),
        evicted_tokens: resume.and_then(|r| r.evicted_tokens),
        prompt_tokens,
        completion_tokens,
        total_tokens: prompt_tokens + completion_tokens,
        prompt_tokens_details: PromptDetails { cached_tokens },
        timings: merged_timings(choices),
        legs: choices
            .iter()
            .flat_map(|c| {
                c.timings.legs.iter().map(|l| LegUsage {
                    choice: c.choice,
                    path: l.path.as_str(),
                    group: l.group,
                    slot: l.slot,
                    tokens_carried: l.tokens_carried,
                    tokens: l.tokens_generated,
                    ms: l.end.map(|e| ms(e.saturating_duration_since(l.start))),
                    device_ms: ms(l.device),
                })
            })
            .collect(),
    };
    (usage, llama_cpp_timings(choices))
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::scheduler::FinishReason;
    use crate::timing::{PathKind, RequestTimings};

    fn choice(t0: Instant, index: usize, admit_ms: u64, tokens: u64) -> Completion {
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut t = RequestTimings::new(t0, 10);
        t.mark_admitted(at(admit_ms));
        t.start_leg(PathKind::Slot, 0, Some(index), at(admit_ms));
        t.add_step(Duration::from_millis(10), 2, true);
        for i in 0..tokens {
            t.mark_token(at(admit_ms + 20 + 10 * i));
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
        }
    }

    #[test]
    fn one_choice_is_its_own_usage_and_several_add_up() {
        let t0 = Instant::now();
        let a = choice(t0, 0, 5, 4);
        let (u, _) = usage_of(&[&a]);
        assert_eq!(u.timings, a.timings.usage());
        assert_eq!((u.prompt_tokens, u.completion_tokens), (10, 4));
        assert!(u.legs.iter().all(|l| l.choice == 0));

        let b = choice(t0, 1, 30, 6);
        let (u, tm) = usage_of(&[&a, &b]);
        assert_eq!(u.prompt_tokens, 10, "the prompt counts once");
        assert_eq!(u.completion_tokens, 10);
        assert_eq!(u.total_tokens, 20);
        assert_eq!(u.timings.queue_ms, Some(5.0), "the first admission");
        assert_eq!(
            u.timings.ttft_ms,
            Some(25.0),
            "the first token of any choice"
        );
        assert_eq!(u.timings.e2e_ms, Some(110.0), "the last finish");
        assert_eq!(u.timings.generation_ms, Some(75.0));
        assert_eq!(u.timings.prefill_ms, Some(20.0));
        assert_eq!(u.timings.decode_ms, Some(80.0));
        let tps = u.timings.decode_tps.expect("tps");
        assert!((tps - 8.0 / 0.08).abs() < 1e-9);
        assert_eq!(tm.predicted_n, 10);
        let choices: Vec<usize> = u.legs.iter().map(|l| l.choice).collect();
        assert_eq!(choices, vec![0, 1]);
    }
}
