//! Typed OpenAI responses: chat completions and text completions, whole and as stream chunks,
//! with their `logprobs` in each one's shape. A whole response and its chunks share their
//! [`Head`]; the handler builds it once per request.

use serde::Serialize;
use serde_json::Map;

use crate::sampling::TokenLogprobs;
use crate::scheduler::PromptProgress;
use crate::server::request::outcome::ApiFinishReason;
use crate::server::request::pipeline::finite_logprob as finite;
use crate::server::request::tools::ToolCall;
use crate::server::request::usage::{LlamaCppTimings, Usage};
use crate::tokenizer::TokenBytes;

/// The fields every OpenAI response object and stream chunk starts with, the same in a whole
/// response and in each of its chunks.
#[derive(Debug, Clone, Serialize)]
pub struct Head {
    /// The response id (`chatcmpl-…`, `cmpl-…`), also the request id in logs, spans and turn
    /// records; the same in every chunk.
    pub id: String,
    /// The object type (`chat.completion`, `chat.completion.chunk`, `text_completion`).
    pub object: &'static str,
    /// When the response was made, in Unix seconds.
    pub created: u64,
    /// The model that served the request, by the name it is served under.
    pub model: String,
    /// Always null: kept for clients that read OpenAI's field.
    pub system_fingerprint: Option<String>,
}

/// `POST /v1/chat/completions` response.
#[derive(Debug, Clone, Serialize)]
pub struct ChatCompletion {
    /// Id, object (`chat.completion`), creation time and model.
    #[serde(flatten)]
    pub head: Head,
    /// The request's choices, one for each of its `n`.
    pub choices: Vec<ChatChoice>,
    /// Usage with the request's own timings.
    pub usage: Usage,
    /// The same timings in llama.cpp's shape, for clients written for its server.
    pub timings: LlamaCppTimings,
}

/// One choice of a chat completion.
#[derive(Debug, Clone, Serialize)]
pub struct ChatChoice {
    /// Which choice this is, from 0 to `n - 1`.
    pub index: usize,
    /// The assistant's reply of this choice.
    pub message: AssistantMessage,
    /// Log-probabilities, when asked for.
    pub logprobs: Option<ChatLogprobs>,
    /// `stop`, `length`, `tool_calls`, …
    pub finish_reason: ApiFinishReason,
}

/// The assistant's reply.
#[derive(Debug, Clone, Serialize)]
pub struct AssistantMessage {
    /// The role, always `assistant`.
    pub role: &'static str,
    /// The text (null when the reply is only tool calls).
    pub content: Option<String>,
    /// The reply's reasoning (thinking templates; absent when there is none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The tool calls the reply makes (absent when it makes none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

/// Chat `logprobs`: one entry per generated token.
#[derive(Debug, Clone, Serialize, Default)]
pub struct ChatLogprobs {
    /// One entry per generated token, in order.
    pub content: Vec<ChatTokenLogprob>,
    /// Always null: no refusal is ever generated apart from the content.
    pub refusal: Option<Vec<ChatTokenLogprob>>,
}

/// One token's log-probability with its alternatives.
#[derive(Debug, Clone, Serialize)]
pub struct ChatTokenLogprob {
    /// The token's text (U+FFFD for part of a character; see `bytes`).
    pub token: String,
    /// The token's log-probability under the model (clamped to a finite floor).
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
    /// The text of each generated token, in order.
    pub tokens: Vec<String>,
    /// The log-probability of each token in `tokens`.
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
    /// Id, object (`chat.completion.chunk`), creation time and model.
    #[serde(flatten)]
    pub head: Head,
    /// The choices this chunk speaks for (empty in the final usage chunk).
    pub choices: Vec<ChunkChoice>,
    /// Usage (final chunk with `include_usage`; every chunk with `continuous_usage_stats`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<ChunkUsage>,
    /// llama.cpp timings (on the last choice's finishing chunk and the usage chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timings: Option<LlamaCppTimings>,
    /// llama.cpp's `prompt_progress` (with `return_progress`: one chunk, with no choices, per
    /// prefill chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_progress: Option<PromptProgress>,
}

/// Usage in a chunk: the full block at the end, running counts before.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum ChunkUsage {
    /// The final usage.
    Full(Box<Usage>),
    /// Counts so far.
    Partial {
        /// Tokens of the prompt (known from the start).
        prompt_tokens: usize,
        /// Completion tokens so far.
        completion_tokens: usize,
        /// Prompt and completion tokens together.
        total_tokens: usize,
    },
}

/// One choice in a chat chunk.
#[derive(Debug, Clone, Serialize)]
pub struct ChunkChoice {
    /// Which choice this delta belongs to, from 0 to `n - 1`.
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
    /// Text of the reply added by this chunk.
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
    /// The whole call: its id, type, function name and arguments.
    #[serde(flatten)]
    pub call: ToolCall,
}

/// `POST /v1/completions` response (and each of its stream chunks, `object` alike).
#[derive(Debug, Clone, Serialize)]
pub struct TextCompletion {
    /// Id, object (`text_completion`, in every chunk too), creation time and model.
    #[serde(flatten)]
    pub head: Head,
    /// The request's choices, one for each of its `n`.
    pub choices: Vec<TextChoice>,
    /// Usage (whole response; final stream chunk with `include_usage`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<ChunkUsage>,
    /// The timings in llama.cpp's shape (whole response; with the usage of a stream).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timings: Option<LlamaCppTimings>,
    /// llama.cpp's `prompt_progress` (a stream with `return_progress`: one chunk, with no
    /// choices, per prefill chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_progress: Option<PromptProgress>,
}

/// One choice of a text completion.
#[derive(Debug, Clone, Serialize)]
pub struct TextChoice {
    /// Which choice this is, from 0 to `n - 1`.
    pub index: usize,
    /// The text (this chunk's, when streaming).
    pub text: String,
    /// Legacy log-probabilities, when asked for.
    pub logprobs: Option<CompletionLogprobs>,
    /// Set on the choice's last chunk.
    pub finish_reason: Option<ApiFinishReason>,
}
