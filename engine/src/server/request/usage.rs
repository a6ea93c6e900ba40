//! A finished request's `usage` and llama.cpp `timings` as the API writes them. They are
//! computed once, in [`crate::server::request::outcome::RequestOutcome::of`]; the wire layer only serializes
//! them.

use serde::Serialize;

use crate::speculation::SpeculationMode;
use crate::timing::{DraftCounts, UsageTimings};

/// `usage`, with the request's own timings.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Usage {
    /// Prompt tokens (counted once, whatever `n`).
    pub prompt_tokens: usize,
    /// Completion tokens, over all choices.
    pub completion_tokens: usize,
    /// Prompt and completion tokens together.
    pub total_tokens: usize,
    /// Details of the prompt.
    pub prompt_tokens_details: PromptDetails,
    /// Details of the completion: present for chats with a thinking template (whose replies
    /// are parsed for reasoning) and for requests drafted for (speculative decoding), absent
    /// otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_tokens_details: Option<CompletionDetails>,
    /// slotlight's extras: the request's own timings, its resume facts, its legs and its
    /// draft counts.
    #[serde(flatten)]
    pub extras: UsageExtras,
}

/// slotlight's extras of a usage: the request's own timings, its resume facts and its legs,
/// which every API's usage carries beside its own counts (flattened into chat completions'
/// [`Usage`] and into the Responses and Messages usages).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct UsageExtras {
    /// The request's own timings.
    #[serde(flatten)]
    pub timings: UsageTimings,
    /// Whether the turn reused its conversation's KV and, if not, why (`first`, `full`,
    /// `diverged`, `evicted`, `expired`, `window`, `other_group`; without a session `none` or
    /// `prefix`); `null` for a request never admitted.
    pub resume: Option<&'static str>,
    /// Tokens the prompt had in common with the session's remembered last turn.
    pub reusable_tokens: Option<usize>,
    /// Where the prompt departs from the session's last turn.
    pub diverged_at: Option<usize>,
    /// Reusable tokens whose KV blocks had been reclaimed.
    pub evicted_tokens: Option<usize>,
    /// The request's legs.
    pub legs: Vec<LegUsage>,
    /// Draft tokens verified, over all choices (speculative decoding).
    pub drafted_tokens: usize,
    /// Of those, the ones taken as the model's own.
    pub accepted_tokens: usize,
}

impl Usage {
    /// Reasoning tokens (0 without a thinking template).
    pub fn reasoning_tokens(&self) -> usize {
        self.completion_tokens_details
            .as_ref()
            .and_then(|d| d.reasoning_tokens)
            .unwrap_or(0)
    }
}

/// One leg in `usage.legs`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LegUsage {
    /// The choice the leg belongs to (0 unless `n` > 1).
    pub choice: usize,
    /// `solo` or `slot`.
    pub path: &'static str,
    /// The device group (slot group) the leg ran on.
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
    /// Draft tokens verified in the leg.
    pub drafted_tokens: usize,
    /// Of those, the ones taken.
    pub accepted_tokens: usize,
}

/// `usage.prompt_tokens_details`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PromptDetails {
    /// Prompt tokens served from the KV cache (for the first choice; the others fork from it).
    pub cached_tokens: usize,
}

/// `usage.completion_tokens_details`, in OpenAI's shape.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CompletionDetails {
    /// Generated tokens inside the reasoning block, its `<think>` and `</think>` tags
    /// included, over all choices (only when the replies were parsed for reasoning).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_tokens: Option<usize>,
    /// Draft tokens taken as the model's own, from the client's `prediction` or from the
    /// request's own prompt and reply (only when the request was drafted for).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accepted_prediction_tokens: Option<usize>,
    /// Draft tokens verified and not taken (only when the request was drafted for). Like
    /// OpenAI's, they are not completion tokens: every completion token is the model's own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rejected_prediction_tokens: Option<usize>,
}

impl CompletionDetails {
    /// The details of a request whose replies had `reasoning` tokens (`None`: not parsed for
    /// reasoning), drafted for as `speculation` with `drafts`; `None` when there is nothing to
    /// say.
    pub fn of(
        reasoning: Option<usize>,
        speculation: SpeculationMode,
        drafts: &DraftCounts,
    ) -> Option<Self> {
        let drafted = speculation != SpeculationMode::Off;
        (reasoning.is_some() || drafted).then(|| Self {
            reasoning_tokens: reasoning,
            accepted_prediction_tokens: drafted.then_some(drafts.accepted_tokens),
            rejected_prediction_tokens: drafted.then_some(drafts.rejected_tokens()),
        })
    }
}

/// llama.cpp's `timings` object, with llama.cpp's definitions (see [`crate::server::request::outcome`]); a
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
    /// Draft tokens verified (llama.cpp's speculative decoding; only when the request was
    /// drafted for).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draft_n: Option<usize>,
    /// Of those, the ones taken.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draft_n_accepted: Option<usize>,
}
