//! OpenAI wire types, and their validation into engine requests.

use serde::{Deserialize, Serialize};

use super::super::error::ApiError;
use crate::chat_template::ChatMessage;
use crate::sampling::SamplingParams;
use crate::timing::UsageTimings;

/// Limits on what a request may ask for.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Most messages in a chat.
    pub max_messages: usize,
    /// Longest message content, in bytes.
    pub max_message_bytes: usize,
    /// Most stop strings.
    pub max_stop: usize,
    /// Largest `max_tokens`.
    pub max_tokens: usize,
    /// `max_tokens` when the request gives none.
    pub default_max_tokens: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_messages: 512,
            max_message_bytes: 256 * 1024,
            max_stop: crate::stop::MAX_STOP_STRINGS,
            max_tokens: 4096,
            default_max_tokens: 256,
        }
    }
}

/// Message content: a string or a list of parts (only text parts are supported).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Content parts.
    Parts(Vec<ContentPart>),
}

/// One content part.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    /// Part type (`text`).
    #[serde(rename = "type")]
    pub kind: String,
    /// Text of a text part.
    pub text: Option<String>,
}

/// One chat message.
#[derive(Debug, Clone, Deserialize)]
pub struct WireMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// Content (may be null for assistant tool calls).
    pub content: Option<Content>,
    /// Optional author name.
    pub name: Option<String>,
}

/// A string or a list of strings (`stop`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StringOrList {
    /// One string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

impl StringOrList {
    fn into_vec(self) -> Vec<String> {
        match self {
            StringOrList::One(s) => vec![s],
            StringOrList::Many(v) => v,
        }
    }
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a final chunk with `usage` (and empty `choices`) before `[DONE]`.
    #[serde(default)]
    pub include_usage: bool,
    /// Attach `usage` to every chunk (vLLM's extension).
    #[serde(default)]
    pub continuous_usage_stats: bool,
}

/// Sampling and output fields shared by chat and completions.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Common {
    /// Model name.
    pub model: Option<String>,
    /// Completion token limit (legacy name).
    pub max_tokens: Option<i64>,
    /// Completion token limit.
    pub max_completion_tokens: Option<i64>,
    /// Temperature.
    pub temperature: Option<f32>,
    /// Nucleus sampling.
    pub top_p: Option<f32>,
    /// Top-k (extension).
    pub top_k: Option<i64>,
    /// Min-p (extension).
    pub min_p: Option<f32>,
    /// Repetition penalty (extension).
    pub repetition_penalty: Option<f32>,
    /// Presence penalty.
    pub presence_penalty: Option<f32>,
    /// Frequency penalty.
    pub frequency_penalty: Option<f32>,
    /// Seed.
    pub seed: Option<i64>,
    /// Stop strings.
    pub stop: Option<StringOrList>,
    /// Number of choices (only 1).
    pub n: Option<i64>,
    /// Stream as server-sent events.
    #[serde(default)]
    pub stream: bool,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// End-user id (also the session id when no `x-session-id` header is sent).
    pub user: Option<String>,
    /// Keep generating past end-of-sequence tokens (extension).
    #[serde(default)]
    pub ignore_eos: bool,
}

/// `POST /v1/chat/completions` body.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    /// The conversation.
    pub messages: Vec<WireMessage>,
    /// Everything else.
    #[serde(flatten)]
    pub common: Common,
}

/// A prompt: text, a list of one text, or token ids.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// Text.
    Text(String),
    /// Texts (only one is supported).
    Texts(Vec<String>),
    /// Token ids.
    Tokens(Vec<u32>),
}

/// `POST /v1/completions` body.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    /// The prompt.
    pub prompt: Prompt,
    /// Everything else.
    #[serde(flatten)]
    pub common: Common,
}

/// Validated generation options.
#[derive(Debug, Clone)]
pub struct ValidOptions {
    /// Completion token limit.
    pub max_tokens: usize,
    /// Sampling.
    pub sampling: SamplingParams,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Stream.
    pub stream: bool,
    /// Final usage chunk.
    pub include_usage: bool,
    /// Usage on every chunk.
    pub continuous_usage: bool,
    /// End-user id.
    pub user: Option<String>,
    /// Ignore EOS.
    pub ignore_eos: bool,
}

impl Common {
    /// Checks every field against the limits.
    pub fn validate(&self, limits: &Limits) -> Result<ValidOptions, ApiError> {
        if let Some(n) = self.n
            && n != 1
        {
            return Err(ApiError::invalid_param(
                "n",
                format!("n must be 1 (got {n}): one choice per request is supported"),
            ));
        }
        let max_tokens = match self.max_completion_tokens.or(self.max_tokens) {
            None => limits.default_max_tokens,
            Some(v) if v < 1 => {
                return Err(ApiError::invalid_param(
                    "max_tokens",
                    format!("max_tokens must be at least 1 (got {v})"),
                ));
            }
            Some(v) => {
                let v = usize::try_from(v).unwrap_or(usize::MAX);
                if v > limits.max_tokens {
                    return Err(ApiError::invalid_param(
                        "max_tokens",
                        format!(
                            "max_tokens is {v}, above the limit of {}",
                            limits.max_tokens
                        ),
                    ));
                }
                v
            }
        };
        let top_k = match self.top_k {
            None => 0,
            Some(k) if k < 0 => 0, // -1 means off (vLLM)
            Some(k) => usize::try_from(k).unwrap_or(usize::MAX),
        };
        let sampling = SamplingParams {
            temperature: self.temperature.unwrap_or(1.0),
            top_k,
            top_p: self.top_p.unwrap_or(1.0),
            min_p: self.min_p.unwrap_or(0.0),
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            repetition_penalty: self.repetition_penalty.unwrap_or(1.0),
            seed: self.seed.map(i64::cast_unsigned),
        };
        sampling
            .validate()
            .map_err(|e| ApiError::invalid(e.to_string()))?;
        let stop = self
            .stop
            .clone()
            .map(StringOrList::into_vec)
            .unwrap_or_default();
        if stop.len() > limits.max_stop {
            return Err(ApiError::invalid_param(
                "stop",
                format!(
                    "{} stop strings given; at most {} are allowed",
                    stop.len(),
                    limits.max_stop
                ),
            ));
        }
        crate::stop::StopMatcher::new(&stop)
            .map_err(|e| ApiError::invalid_param("stop", e.to_string()))?;
        let so = self.stream_options.clone().unwrap_or_default();
        if self.stream_options.is_some() && !self.stream {
            return Err(ApiError::invalid_param(
                "stream_options",
                "stream_options is only allowed with stream: true",
            ));
        }
        if let Some(u) = &self.user
            && u.len() > 256
        {
            return Err(ApiError::invalid_param(
                "user",
                "user is longer than 256 bytes",
            ));
        }
        Ok(ValidOptions {
            max_tokens,
            sampling,
            stop,
            stream: self.stream,
            include_usage: so.include_usage,
            continuous_usage: so.continuous_usage_stats,
            user: self.user.clone(),
            ignore_eos: self.ignore_eos,
        })
    }
}

impl ChatRequest {
    /// The messages as the chat template takes them.
    pub fn messages(&self, limits: &Limits) -> Result<Vec<ChatMessage>, ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::invalid_param(
                "messages",
                "messages must not be empty",
            ));
        }
        if self.messages.len() > limits.max_messages {
            return Err(ApiError::invalid_param(
                "messages",
                format!(
                    "{} messages given; at most {} are allowed",
                    self.messages.len(),
                    limits.max_messages
                ),
            ));
        }
        self.messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                if !matches!(m.role.as_str(), "system" | "user" | "assistant" | "tool" | "developer") {
                    return Err(ApiError::invalid_param(
                        &format!("messages[{i}].role"),
                        format!("unknown role `{}` (system, user, assistant, tool or developer)", m.role),
                    ));
                }
                let content = match &m.content {
                    None => String::new(),
                    Some(Content::Text(s)) => s.clone(),
                    Some(Content::Parts(parts)) => {
                        let mut s = String::new();
                        for (j, p) in parts.iter().enumerate() {
                            match (p.kind.as_str(), &p.text) {
                                ("text", Some(t)) => s.push_str(t),
                                _ => {
                                    return Err(ApiError::invalid_param(
                                        &format!("messages[{i}].content[{j}]"),
                                        format!("content part of type `{}` is not supported (only text)", p.kind),
                                    ));
                                }
                            }
                        }
                        s
                    }
                };
                if content.len() > limits.max_message_bytes {
                    return Err(ApiError::invalid_param(
                        &format!("messages[{i}].content"),
                        format!("message content is {} bytes; the limit is {}", content.len(), limits.max_message_bytes),
                    ));
                }
                let role = if m.role == "developer" { "system".to_string() } else { m.role.clone() };
                let _ = &m.name;
                Ok(ChatMessage::new(role, content))
            })
            .collect()
    }
}

/// `usage`, with the request's own timings.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Completion tokens.
    pub completion_tokens: usize,
    /// Their sum.
    pub total_tokens: usize,
    /// Details of the prompt.
    pub prompt_tokens_details: PromptDetails,
    /// The request's own timings.
    #[serde(flatten)]
    pub timings: UsageTimings,
    /// The request's legs (slotlight extension): where it ran and what each stretch did.
    pub legs: Vec<LegUsage>,
}

/// One leg in `usage.legs`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LegUsage {
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
    /// Prompt tokens served from the KV cache.
    pub cached_tokens: usize,
}

/// llama.cpp's `timings` object, with llama.cpp's definitions (see
/// [`crate::server::pipeline::llama_cpp_timings`]); a value that is unknown or would divide by
/// zero is `null`.
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
