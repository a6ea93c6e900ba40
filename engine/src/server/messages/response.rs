//! Typed Messages responses: the message, its content blocks, its `usage` in Anthropic's
//! meaning with slotlight's extras beside it, the cache diagnostics, and `count_tokens`'
//! answer. [`Answer`] decides what a finished choice says (its blocks, its stop reason, its
//! usage) once, for the whole response and for the stream alike.

use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

use super::signature::Signer;
use crate::diagnostics::{Diagnosis, MissReason};
use crate::server::request::RequestMeta;
use crate::server::request::outcome::{ApiFinishReason, RequestOutcome};
use crate::server::request::pipeline::ChoiceEnd;
use crate::server::request::tools::ToolCall;
use crate::server::request::usage::{Usage, UsageExtras};
use crate::stop::StopMatcher;
use crate::timing::UsageTimings;
use crate::tokenizer::Tokenizer;

/// `stop_reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model ended its turn (an end-of-sequence token, or a complete constrained output).
    EndTurn,
    /// `max_tokens` (as clamped to `--max-tokens-limit`) was reached.
    MaxTokens,
    /// The reply filled the model's context window: the prompt and the reply are all the
    /// context holds.
    ModelContextWindowExceeded,
    /// One of `stop_sequences` was generated (`stop_sequence` says which).
    StopSequence,
    /// The reply is tool calls.
    ToolUse,
}

/// One content block of a reply.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    /// The reply's reasoning (thinking templates), empty with `display: "omitted"`, and its
    /// signature.
    Thinking {
        /// The reasoning text.
        thinking: String,
        /// A keyed hash of it (and the text itself when omitted): see [`super::signature`].
        signature: String,
    },
    /// Text of the reply.
    Text {
        /// The text.
        text: String,
    },
    /// A tool call.
    ToolUse {
        /// `toolu_…`, for the `tool_result` that answers it.
        id: String,
        /// The tool's name.
        name: String,
        /// Its input, an object.
        input: Value,
    },
}

impl ContentBlock {
    /// A tool call as a `tool_use` block (its arguments are a JSON object, enforced or
    /// parsed; text that is not one is given as an empty input).
    pub fn tool_use(c: &ToolCall) -> Self {
        let input = serde_json::from_str::<Value>(&c.function.arguments)
            .ok()
            .filter(Value::is_object)
            .unwrap_or_else(|| Value::Object(serde_json::Map::new()));
        ContentBlock::ToolUse {
            id: c.id.clone(),
            name: c.function.name.clone(),
            input,
        }
    }
}

/// `usage.cache_creation`: tokens written to a cache entry of each lifetime (always 0: see
/// [`MessageUsage::cache_creation_input_tokens`]).
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct CacheCreation {
    /// Tokens written to a one-hour entry.
    pub ephemeral_1h_input_tokens: usize,
    /// Tokens written to a five-minute entry.
    pub ephemeral_5m_input_tokens: usize,
}

/// `usage.output_tokens_details`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OutputDetails {
    /// Generated tokens inside the reasoning block, its tags included.
    pub thinking_tokens: usize,
}

/// `usage` in Anthropic's meaning, with slotlight's timing and resume extras beside it (as in
/// chat completions' usage).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MessageUsage {
    /// Prompt tokens computed for this request: the prompt less `cache_read_input_tokens`.
    pub input_tokens: usize,
    /// Prompt tokens read from the KV cache: the warm-resumed or prefix-cached ones.
    pub cache_read_input_tokens: usize,
    /// Always 0: slotlight has no separate cache write. Every prompt token it computes is
    /// counted in `input_tokens` and is kept in the prefix cache for later requests (as long
    /// as there is room) whether or not the request had `cache_control`.
    pub cache_creation_input_tokens: usize,
    /// The same, by lifetime.
    pub cache_creation: CacheCreation,
    /// Generated tokens (a request with `max_tokens: 0` reports 0: the one token sampled by
    /// its prefill is discarded).
    pub output_tokens: usize,
    /// Thinking tokens, for models with a thinking template.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_tokens_details: Option<OutputDetails>,
    /// Always `standard` (there is one tier).
    pub service_tier: &'static str,
    /// slotlight's extras, as in chat usage: the request's own timings, its resume facts
    /// (`resume`: `first`, `full`, `diverged`, `evicted`, `expired`, `window`, `other_group`; `none` or
    /// `prefix` without a session), its legs and its draft counts.
    #[serde(flatten)]
    pub extras: UsageExtras,
}

impl MessageUsage {
    /// The usage of a finished request (`prewarm`: `max_tokens: 0`, its token discarded).
    pub fn of(u: &Usage, prewarm: bool) -> Self {
        let cached = u.prompt_tokens_details.cached_tokens.min(u.prompt_tokens);
        Self {
            input_tokens: u.prompt_tokens - cached,
            cache_read_input_tokens: cached,
            cache_creation_input_tokens: 0,
            cache_creation: CacheCreation::default(),
            output_tokens: if prewarm { 0 } else { u.completion_tokens },
            output_tokens_details: u
                .completion_tokens_details
                .as_ref()
                .and_then(|d| d.reasoning_tokens)
                .map(|r| OutputDetails {
                    thinking_tokens: if prewarm { 0 } else { r },
                }),
            service_tier: "standard",
            extras: u.extras.clone(),
        }
    }

    /// The usage `message_start` carries, once the prompt's reuse is known: of its
    /// `prompt_tokens`, `cached` read from the cache, the rest input, as the final usage
    /// counts them (the last event, `message_delta`, carries the final counts of the rest).
    pub fn opening(prompt_tokens: usize, cached: usize) -> Self {
        let cached = cached.min(prompt_tokens);
        Self {
            input_tokens: prompt_tokens - cached,
            cache_read_input_tokens: cached,
            cache_creation_input_tokens: 0,
            cache_creation: CacheCreation::default(),
            output_tokens: 0,
            output_tokens_details: None,
            service_tier: "standard",
            extras: UsageExtras {
                timings: UsageTimings {
                    queue_ms: None,
                    prefill_ms: None,
                    ttft_ms: None,
                    decode_ms: None,
                    generation_ms: None,
                    decode_tps: None,
                    e2e_ms: None,
                },
                resume: None,
                reusable_tokens: None,
                diverged_at: None,
                evicted_tokens: None,
                legs: Vec::new(),
                drafted_tokens: 0,
                accepted_tokens: 0,
            },
        }
    }
}

/// `diagnostics.cache_miss_reason`, in Anthropic's words.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum CacheMissReason {
    /// The model differs from the previous request's.
    ModelChanged {
        /// Tokens that could have been read from the cache and were not.
        cache_missed_input_tokens: usize,
    },
    /// `system` differs.
    SystemChanged {
        /// Tokens that could have been read from the cache and were not.
        cache_missed_input_tokens: usize,
    },
    /// `tools` differ.
    ToolsChanged {
        /// Tokens that could have been read from the cache and were not.
        cache_missed_input_tokens: usize,
    },
    /// An earlier message differs (or the reply as sent back renders to other tokens than
    /// the ones generated).
    MessagesChanged {
        /// Tokens that could have been read from the cache and were not.
        cache_missed_input_tokens: usize,
    },
    /// No such previous message is kept.
    PreviousMessageNotFound,
    /// Model, system, tools and messages match, and another option that shapes the prompt
    /// (the output format, `tool_choice`, `thinking`) differs.
    Unavailable,
}

/// `diagnostics` of a response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Diagnostics {
    /// Why the prompt cache missed against the previous message.
    pub cache_miss_reason: CacheMissReason,
}

impl Diagnostics {
    /// What a comparison with the previous message says: `None` for a hit (Anthropic's
    /// `diagnostics: null`), the reason otherwise; a previous message not kept is
    /// `previous_message_not_found`.
    pub fn of(d: Option<Diagnosis>) -> Option<Self> {
        let Some(d) = d else {
            return Some(Self {
                cache_miss_reason: CacheMissReason::PreviousMessageNotFound,
            });
        };
        let missed = d.missed_tokens;
        let reason = match d.reason? {
            MissReason::Model => CacheMissReason::ModelChanged {
                cache_missed_input_tokens: missed,
            },
            MissReason::System => CacheMissReason::SystemChanged {
                cache_missed_input_tokens: missed,
            },
            MissReason::Tools => CacheMissReason::ToolsChanged {
                cache_missed_input_tokens: missed,
            },
            MissReason::Input => CacheMissReason::MessagesChanged {
                cache_missed_input_tokens: missed,
            },
            MissReason::Format | MissReason::Options => CacheMissReason::Unavailable,
        };
        Some(Self {
            cache_miss_reason: reason,
        })
    }
}

/// `POST /v1/messages` response.
#[derive(Debug, Clone, Serialize)]
pub struct Message {
    /// `msg_…`, also the request id in logs, spans and turn records.
    pub id: String,
    /// Always `message`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Always `assistant`.
    pub role: &'static str,
    /// The model that served the request, by the name it asked for.
    pub model: String,
    /// The reply: thinking, then text, then tool calls.
    pub content: Vec<ContentBlock>,
    /// Why it stopped (`null` in `message_start`).
    pub stop_reason: Option<StopReason>,
    /// The stop sequence that ended it, when one did.
    pub stop_sequence: Option<String>,
    /// Token counts and slotlight's extras.
    pub usage: MessageUsage,
    /// The cache diagnostics, when asked for and the cache missed; `null` otherwise.
    pub diagnostics: Option<Diagnostics>,
}

/// `POST /v1/messages/count_tokens` response.
#[derive(Debug, Clone, Serialize)]
pub struct TokenCount {
    /// The prompt's tokens: what `usage.input_tokens` plus `usage.cache_read_input_tokens`
    /// of the same request would be.
    pub input_tokens: usize,
}

/// How a finished choice is answered: the request it answers, what the reply shows, and the
/// facts the stop reason is read from. Shared by the whole response and the stream.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The request.
    pub meta: Arc<RequestMeta>,
    /// Signs the reply's thinking.
    pub signer: Signer,
    /// `thinking.display: "omitted"`: thinking blocks are sent empty, their text in the
    /// signature.
    pub omitted: bool,
    /// `max_tokens: 0`: the prompt is prefilled and nothing is answered.
    pub prewarm: bool,
    /// The tokenizer, to tell which stop sequence ended a reply.
    pub tokenizer: Arc<Tokenizer>,
    /// The cache diagnostics of the request.
    pub diagnostics: Option<Diagnostics>,
    /// The context length served: a reply cut where the prompt and the reply fill it stopped
    /// for the context, not for `max_tokens`.
    pub context: usize,
}

impl Answer {
    /// The head of the message: everything but its content, stop and usage.
    pub fn message(&self, content: Vec<ContentBlock>, usage: MessageUsage) -> Message {
        Message {
            id: self.meta.id.clone(),
            kind: "message",
            role: "assistant",
            model: self.meta.request.model.clone(),
            content,
            stop_reason: None,
            stop_sequence: None,
            usage,
            diagnostics: self.diagnostics.clone(),
        }
    }

    /// A thinking block of `text`.
    pub fn thinking(&self, text: &str) -> ContentBlock {
        ContentBlock::Thinking {
            thinking: if self.omitted {
                String::new()
            } else {
                text.to_string()
            },
            signature: self.signer.sign(text, self.omitted),
        }
    }

    /// The stop sequence that ended a reply of `tokens`: none unless the reply stopped and
    /// its last token is not an end-of-sequence token; then the one the request's stop
    /// strings find first in the reply's text, as the engine found it.
    pub fn stop_sequence(&self, tokens: &[u32]) -> Option<String> {
        let stops = self.meta.request.opts.stop.stops();
        if stops.is_empty()
            || tokens
                .last()
                .is_none_or(|&t| self.tokenizer.is_stop_token(t))
        {
            return None;
        }
        let text = self.tokenizer.decode_with(tokens, false).ok()?;
        let mut m = StopMatcher::new(stops).ok()?;
        let matched = m.push(&text).matched?;
        stops.get(matched).cloned()
    }

    /// The stop reason and stop sequence of a choice that ended as `end` (the stream's error
    /// event speaks for a failed or cancelled one).
    pub fn stop(&self, end: &ChoiceEnd) -> (StopReason, Option<String>) {
        match end.finish_reason {
            ApiFinishReason::ToolCalls => (StopReason::ToolUse, None),
            ApiFinishReason::Length
                if self.meta.request.prompt.len() + end.tokens.len() >= self.context =>
            {
                (StopReason::ModelContextWindowExceeded, None)
            }
            ApiFinishReason::Length => (StopReason::MaxTokens, None),
            _ if self.prewarm => (StopReason::MaxTokens, None),
            ApiFinishReason::Stop | ApiFinishReason::Cancelled | ApiFinishReason::Error => {
                match self.stop_sequence(&end.tokens) {
                    Some(s) => (StopReason::StopSequence, Some(s)),
                    None => (StopReason::EndTurn, None),
                }
            }
        }
    }

    /// The usage of the finished request.
    pub fn usage(&self, f: &RequestOutcome) -> MessageUsage {
        MessageUsage::of(&f.usage, self.prewarm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_and_reasons_serialize_as_anthropic_writes_them() {
        let b = ContentBlock::ToolUse {
            id: "toolu_1".into(),
            name: "f".into(),
            input: serde_json::json!({"x": 1}),
        };
        assert_eq!(
            serde_json::to_value(&b).expect("json"),
            serde_json::json!({"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"x": 1}})
        );
        assert_eq!(
            serde_json::to_value(StopReason::StopSequence).expect("json"),
            serde_json::json!("stop_sequence")
        );
        assert_eq!(
            serde_json::to_value(StopReason::ModelContextWindowExceeded).expect("json"),
            serde_json::json!("model_context_window_exceeded")
        );
        let d = Diagnostics::of(Some(Diagnosis {
            reason: Some(MissReason::Tools),
            missed_tokens: 7,
            common_tokens: 3,
        }));
        assert_eq!(
            serde_json::to_value(d).expect("json"),
            serde_json::json!({"cache_miss_reason": {"type": "tools_changed", "cache_missed_input_tokens": 7}})
        );
        assert_eq!(
            serde_json::to_value(Diagnostics::of(None)).expect("json"),
            serde_json::json!({"cache_miss_reason": {"type": "previous_message_not_found"}})
        );
        let hit = Diagnostics::of(Some(Diagnosis {
            reason: None,
            missed_tokens: 0,
            common_tokens: 9,
        }));
        assert_eq!(hit, None, "a hit is `diagnostics: null`");
        let other = Diagnostics::of(Some(Diagnosis {
            reason: Some(MissReason::Format),
            missed_tokens: 2,
            common_tokens: 1,
        }));
        assert_eq!(
            serde_json::to_value(other).expect("json"),
            serde_json::json!({"cache_miss_reason": {"type": "unavailable"}})
        );
    }
}
