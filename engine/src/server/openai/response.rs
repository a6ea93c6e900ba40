//! Typed OpenAI responses: chat completions and text completions, whole and as stream chunks,
//! with their `logprobs` in each endpoint's shape.

use serde::Serialize;
use serde_json::Map;

use super::tools::ParsedCall;
use crate::sampling::TokenLogprobs;
use crate::server::outcome::ApiFinishReason;
use crate::server::usage::{LlamaCppTimings, Usage};
use crate::tokenizer::TokenBytes;

/// JSON has no infinities: an impossible token's log-probability is reported as this (vLLM
/// does the same).
pub const MIN_LOGPROB: f32 = -9999.0;

fn finite(lp: f32) -> f32 {
    if lp.is_finite() {
        lp.max(MIN_LOGPROB)
    } else {
        MIN_LOGPROB
    }
}

/// `POST /v1/chat/completions` response.
#[derive(Debug, Clone, Serialize)]
pub struct ChatCompletion {
    /// Response id.
    pub id: String,
    /// `chat.completion`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The model served.
    pub model: String,
    /// Always null.
    pub system_fingerprint: Option<String>,
    /// One per choice.
    pub choices: Vec<ChatChoice>,
    /// Usage with the request's own timings.
    pub usage: Usage,
    /// llama.cpp-style timings.
    pub timings: LlamaCppTimings,
}

/// One choice of a chat completion.
#[derive(Debug, Clone, Serialize)]
pub struct ChatChoice {
    /// Choice index.
    pub index: usize,
    /// The reply.
    pub message: AssistantMessage,
    /// Log-probabilities, when asked for.
    pub logprobs: Option<ChatLogprobs>,
    /// `stop`, `length`, `tool_calls`, …
    pub finish_reason: ApiFinishReason,
}

/// The assistant's reply.
#[derive(Debug, Clone, Serialize)]
pub struct AssistantMessage {
    /// `assistant`.
    pub role: &'static str,
    /// The text (null when the reply is only tool calls).
    pub content: Option<String>,
    /// The reply's reasoning (thinking templates; absent when there is none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Tool calls.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

/// One tool call in a reply.
#[derive(Debug, Clone, Serialize)]
pub struct ToolCall {
    /// Call id (`call_…`), for the tool message that answers it.
    pub id: String,
    /// `function`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The call.
    pub function: FunctionCall,
}

/// The function part of a tool call.
#[derive(Debug, Clone, Serialize)]
pub struct FunctionCall {
    /// Function name.
    pub name: String,
    /// Arguments as a JSON text.
    pub arguments: String,
}

impl ToolCall {
    /// A call with a fresh id.
    pub fn new(c: &ParsedCall) -> Self {
        Self {
            id: super::new_id("call").replacen('-', "_", 1),
            kind: "function",
            function: FunctionCall {
                name: c.name.clone(),
                arguments: c.arguments.clone(),
            },
        }
    }
}

/// Chat `logprobs`: one entry per generated token.
#[derive(Debug, Clone, Serialize, Default)]
pub struct ChatLogprobs {
    /// The tokens.
    pub content: Vec<ChatTokenLogprob>,
    /// Always null.
    pub refusal: Option<Vec<ChatTokenLogprob>>,
}

/// One token's log-probability with its alternatives.
#[derive(Debug, Clone, Serialize)]
pub struct ChatTokenLogprob {
    /// The token's text (U+FFFD for part of a character; see `bytes`).
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// Its exact bytes.
    pub bytes: Vec<u8>,
    /// The most likely tokens at this position.
    pub top_logprobs: Vec<TopLogprob>,
}

/// An alternative token.
#[derive(Debug, Clone, Serialize)]
pub struct TopLogprob {
    /// The alternative token's text.
    pub token: String,
    /// Its log-probability (natural log).
    pub logprob: f32,
    /// Its UTF-8 bytes (a token may hold part of a character).
    pub bytes: Vec<u8>,
}

impl ChatLogprobs {
    /// From the engine's per-token log-probabilities.
    pub fn new(tokens: &[TokenLogprobs], bytes: &TokenBytes) -> Self {
        Self {
            content: tokens
                .iter()
                .map(|t| ChatTokenLogprob {
                    token: bytes.text(t.id),
                    logprob: finite(t.logprob),
                    bytes: bytes.bytes(t.id).to_vec(),
                    top_logprobs: t
                        .top
                        .iter()
                        .map(|&(id, lp)| TopLogprob {
                            token: bytes.text(id),
                            logprob: finite(lp),
                            bytes: bytes.bytes(id).to_vec(),
                        })
                        .collect(),
                })
                .collect(),
            refusal: None,
        }
    }
}

/// The legacy completions `logprobs` object.
#[derive(Debug, Clone, Serialize, Default)]
pub struct CompletionLogprobs {
    /// Token texts.
    pub tokens: Vec<String>,
    /// Their log-probabilities.
    pub token_logprobs: Vec<f32>,
    /// Per position, the most likely tokens (text → log-probability), most likely first.
    pub top_logprobs: Vec<Map<String, serde_json::Value>>,
    /// Per token, the character offset in the choice's text where it starts (special tokens,
    /// absent from the text, take no room).
    pub text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    /// From the engine's per-token log-probabilities; offsets start at `offset` characters.
    pub fn new(tokens: &[TokenLogprobs], bytes: &TokenBytes, mut offset: usize) -> Self {
        let mut out = Self::default();
        for t in tokens {
            let text = bytes.text(t.id);
            out.text_offset.push(offset);
            // A special token's text is not part of the choice's text.
            if !bytes.is_special(t.id) {
                offset += text.chars().count();
            }
            out.tokens.push(text);
            out.token_logprobs.push(finite(t.logprob));
            out.top_logprobs.push(
                t.top
                    .iter()
                    .map(|&(id, lp)| (bytes.text(id), serde_json::json!(finite(lp))))
                    .collect(),
            );
        }
        out
    }
}

/// A streamed chat chunk.
#[derive(Debug, Clone, Serialize)]
pub struct ChatChunk {
    /// Response id (the same in every chunk).
    pub id: String,
    /// `chat.completion.chunk`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The model served.
    pub model: String,
    /// Always null.
    pub system_fingerprint: Option<String>,
    /// The choices this chunk speaks for (empty in the final usage chunk).
    pub choices: Vec<ChunkChoice>,
    /// Usage (final chunk with `include_usage`; every chunk with `continuous_usage_stats`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<ChunkUsage>,
    /// llama.cpp timings (on the last choice's finishing chunk and the usage chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timings: Option<LlamaCppTimings>,
}

/// Usage in a chunk: the full block at the end, running counts before.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum ChunkUsage {
    /// The final usage.
    Full(Box<Usage>),
    /// Counts so far.
    Partial {
        /// Prompt tokens.
        prompt_tokens: usize,
        /// Completion tokens so far.
        completion_tokens: usize,
        /// Their sum.
        total_tokens: usize,
    },
}

/// One choice in a chat chunk.
#[derive(Debug, Clone, Serialize)]
pub struct ChunkChoice {
    /// Choice index.
    pub index: usize,
    /// What this chunk adds.
    pub delta: Delta,
    /// Log-probabilities of the tokens this chunk covers.
    pub logprobs: Option<ChatLogprobs>,
    /// Set on the choice's last chunk.
    pub finish_reason: Option<ApiFinishReason>,
}

/// A chat delta.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Delta {
    /// `assistant`, on each choice's first chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// New content.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// New reasoning (thinking templates, while the reply is inside its reasoning block).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Tool calls, each whole in one chunk.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallDelta>,
}

/// A tool call in a delta.
#[derive(Debug, Clone, Serialize)]
pub struct ToolCallDelta {
    /// Position of the call in the choice's list.
    pub index: usize,
    /// The call.
    #[serde(flatten)]
    pub call: ToolCall,
}

/// `POST /v1/completions` response (and each of its stream chunks, `object` alike).
#[derive(Debug, Clone, Serialize)]
pub struct TextCompletion {
    /// Response id.
    pub id: String,
    /// `text_completion`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The model served.
    pub model: String,
    /// Always null.
    pub system_fingerprint: Option<String>,
    /// One per choice.
    pub choices: Vec<TextChoice>,
    /// Usage (whole response; final stream chunk with `include_usage`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<ChunkUsage>,
    /// llama.cpp timings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timings: Option<LlamaCppTimings>,
}

/// One choice of a text completion.
#[derive(Debug, Clone, Serialize)]
pub struct TextChoice {
    /// Choice index.
    pub index: usize,
    /// The text (this chunk's, when streaming).
    pub text: String,
    /// Legacy log-probabilities, when asked for.
    pub logprobs: Option<CompletionLogprobs>,
    /// Set on the choice's last chunk.
    pub finish_reason: Option<ApiFinishReason>,
}
