//! A finished request's `usage` and llama.cpp `timings`, from its own clocks (one set per
//! choice). The per-request pipeline builds these; the wire layer only serializes them.

use serde::Serialize;

use crate::scheduler::Completion;
use crate::timing::UsageTimings;

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
    /// Wall time of the leg.
    pub ms: f64,
    /// Time in the forward steps of the leg.
    pub device_ms: f64,
}

/// `usage.prompt_tokens_details`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PromptDetails {
    /// Prompt tokens served from the KV cache (for the first choice; the others fork from it).
    pub cached_tokens: usize,
}

/// llama.cpp's `timings` object.
#[derive(Debug, Clone, Serialize)]
pub struct LlamaCppTimings {
    /// Prompt tokens computed.
    pub prompt_n: usize,
    /// Prefill time.
    pub prompt_ms: f64,
    /// Prefill rate.
    pub prompt_per_second: f64,
    /// Completion tokens.
    pub predicted_n: usize,
    /// Decode time.
    pub predicted_ms: f64,
    /// Decode rate.
    pub predicted_per_second: f64,
    /// Prompt tokens from the cache.
    pub cache_n: usize,
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The timings of a request of several choices: arrival to the first admission (`queue_ms`),
/// to the first token of any choice (`ttft_ms`) and to the last finish (`e2e_ms`); first to
/// last token over all choices (`generation_ms`); prefill and decode device time summed over
/// the choices, and `decode_tps` = (completion tokens − choices) per second of that decode
/// time (a choice's own rate, averaged). With one choice these are its own timings unchanged.
#[allow(clippy::cast_precision_loss)]
pub fn merged_timings(choices: &[&Completion]) -> UsageTimings {
    if let [one] = choices {
        return one.timings.usage();
    }
    let Some(first) = choices.first() else {
        return crate::timing::RequestTimings::new(std::time::Instant::now(), 0).usage();
    };
    let received = first.timings.received;
    let since = |t: Option<std::time::Instant>| {
        t.map_or(0.0, |t| ms(t.saturating_duration_since(received)))
    };
    let min_of = |f: &dyn Fn(&Completion) -> Option<std::time::Instant>| {
        choices.iter().filter_map(|c| f(c)).min()
    };
    let max_of = |f: &dyn Fn(&Completion) -> Option<std::time::Instant>| {
        choices.iter().filter_map(|c| f(c)).max()
    };
    let admitted = min_of(&|c| c.timings.admitted);
    let first_token = min_of(&|c| c.timings.first_token);
    let last_token = max_of(&|c| c.timings.last_token);
    let finished = max_of(&|c| c.timings.finished);
    let prefill: std::time::Duration = choices.iter().map(|c| c.timings.prefill_device).sum();
    let decode: std::time::Duration = choices.iter().map(|c| c.timings.decode_device).sum();
    let steps: u64 = choices.iter().map(|c| c.timings.decode_steps).sum();
    let decoding: usize = choices
        .iter()
        .map(|c| c.timings.generated_tokens.saturating_sub(1))
        .sum();
    let decode_ms = ms(decode);
    UsageTimings {
        queue_ms: since(admitted),
        prefill_ms: ms(prefill),
        ttft_ms: since(first_token),
        decode_ms,
        generation_ms: match (first_token, last_token) {
            (Some(f), Some(l)) => ms(l.saturating_duration_since(f)),
            _ => 0.0,
        },
        decode_tps: (steps > 0 && decode_ms > 0.0).then(|| decoding as f64 / (decode_ms / 1000.0)),
        e2e_ms: since(finished),
    }
}

/// Builds the usage block and llama.cpp timings from every choice's own clocks.
#[allow(clippy::cast_precision_loss)]
pub fn usage_of(choices: &[&Completion]) -> (Usage, LlamaCppTimings) {
    let u = merged_timings(choices);
    let prompt_tokens = choices.first().map_or(0, |c| c.timings.prompt_tokens);
    let cached_tokens = choices.first().map_or(0, |c| c.timings.cached_tokens);
    let completion_tokens: usize = choices.iter().map(|c| c.timings.generated_tokens).sum();
    let prefilled: usize = choices.iter().map(|c| c.timings.prefilled_tokens).sum();
    let usage = Usage {
        prompt_tokens,
        completion_tokens,
        total_tokens: prompt_tokens + completion_tokens,
        prompt_tokens_details: PromptDetails { cached_tokens },
        timings: u,
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
                    ms: l.end.map_or(0.0, |e| ms(e - l.start)),
                    device_ms: ms(l.device),
                })
            })
            .collect(),
    };
    let per_s = |n: usize, ms: f64| {
        if ms > 0.0 {
            n as f64 / (ms / 1000.0)
        } else {
            0.0
        }
    };
    let timings = LlamaCppTimings {
        prompt_n: prefilled,
        prompt_ms: u.prefill_ms,
        prompt_per_second: per_s(prefilled, u.prefill_ms),
        predicted_n: completion_tokens,
        predicted_ms: u.decode_ms,
        predicted_per_second: u.decode_tps.unwrap_or(0.0),
        cache_n: cached_tokens,
    };
    (usage, timings)
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
        assert_eq!(u.timings.queue_ms, 5.0, "the first admission");
        assert_eq!(u.timings.ttft_ms, 25.0, "the first token of any choice");
        assert_eq!(u.timings.e2e_ms, 110.0, "the last finish");
        assert_eq!(u.timings.generation_ms, 75.0);
        assert_eq!(u.timings.prefill_ms, 20.0);
        assert_eq!(u.timings.decode_ms, 80.0);
        let tps = u.timings.decode_tps.expect("tps");
        assert!((tps - 8.0 / 0.08).abs() < 1e-9);
        assert_eq!(tm.predicted_n, 10);
        let choices: Vec<usize> = u.legs.iter().map(|l| l.choice).collect();
        assert_eq!(choices, vec![0, 1]);
    }
}
