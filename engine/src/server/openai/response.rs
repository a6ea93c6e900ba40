//! Whole chat completions and completions, written from a finished request's choices and
//! outcome; the stream's chunks share their [`Head`] with them.

use std::sync::Arc;

use axum::Json;
use axum::response::{IntoResponse, Response};

use super::translate::Kind;
use super::types::{
    AssistantMessage, ChatChoice, ChatCompletion, ChatLogprobs, ChunkUsage, CompletionLogprobs,
    Head, TextChoice, TextCompletion,
};
use crate::sampling::TokenLogprobs;
use crate::server::request::launch::Collected;
use crate::server::request::outcome::RequestOutcome;
use crate::server::request::{RequestMeta, ValidRequest};
use crate::tokenizer::TokenBytes;

/// How a request's output is written: the request it answers (shared, read where needed),
/// which of the two APIs it came through, the response's creation time and the tokens' bytes
/// (for log-probabilities).
pub struct Shape {
    /// The request it answers, shared with its task and spans.
    pub meta: Arc<RequestMeta>,
    /// Which of the door's two APIs.
    pub kind: Kind,
    /// The response's creation time (Unix seconds).
    pub created: u64,
    /// The tokens' bytes (for log-probabilities).
    pub bytes: Arc<TokenBytes>,
}

impl Shape {
    /// The request it answers.
    pub fn req(&self) -> &ValidRequest {
        &self.meta.request
    }

    /// Its number of choices (`n`).
    pub fn n(&self) -> usize {
        self.req().opts.n
    }

    /// Whether it asked for log-probabilities.
    pub fn logprobs(&self) -> bool {
        self.req().logprobs.is_some()
    }

    /// The prompt text that comes back before each completion (`echo`).
    pub fn echo(&self) -> Option<&str> {
        let r = self.req();
        r.echo.then_some(r.prompt_text.as_str())
    }

    /// Whether each chunk carries the usage so far (`stream_options.continuous_usage_stats`).
    pub fn continuous(&self) -> bool {
        self.req().opts.continuous_usage
    }

    /// The head of the whole response or of each chunk (`chunk`): the same id, creation time
    /// and model in both.
    pub fn head(&self, chunk: bool) -> Head {
        let object = match (self.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completions, _) => "text_completion",
        };
        Head {
            id: self.meta.id.clone(),
            object,
            created: self.created,
            model: self.req().model.clone(),
            system_fingerprint: None,
        }
    }

    /// A chat choice's log-probabilities, when asked for and there are any.
    pub fn chat_logprobs(&self, tokens: &[TokenLogprobs]) -> Option<ChatLogprobs> {
        self.logprobs()
            .then(|| ChatLogprobs::new(tokens, &self.bytes))
    }

    /// A completion choice's log-probabilities from character `offset`, when asked for.
    pub fn text_logprobs(
        &self,
        tokens: &[TokenLogprobs],
        offset: usize,
    ) -> Option<CompletionLogprobs> {
        self.logprobs()
            .then(|| CompletionLogprobs::new(tokens, &self.bytes, offset))
    }

    /// The whole response: every choice collected, the usage and timings from the outcome.
    pub fn whole(&self, choices: Vec<Collected>, f: RequestOutcome) -> Response {
        match self.kind {
            Kind::Chat => {
                let choices = choices
                    .iter()
                    .enumerate()
                    .map(|(index, c)| {
                        let calls = c.tool_calls().to_vec();
                        ChatChoice {
                            index,
                            message: AssistantMessage {
                                role: "assistant",
                                content: (calls.is_empty() || !c.text.is_empty())
                                    .then(|| c.text.clone()),
                                reasoning_content: (!c.reasoning.is_empty())
                                    .then(|| c.reasoning.clone()),
                                tool_calls: calls,
                            },
                            logprobs: self.chat_logprobs(&c.logprobs),
                            finish_reason: c.finish_reason(),
                        }
                    })
                    .collect();
                Json(ChatCompletion {
                    head: self.head(false),
                    choices,
                    usage: f.usage,
                    timings: f.timings,
                })
                .into_response()
            }
            Kind::Completions => {
                let echo = self.echo().unwrap_or_default();
                let start = echo.chars().count();
                let choices = choices
                    .iter()
                    .enumerate()
                    .map(|(index, c)| TextChoice {
                        index,
                        text: format!("{echo}{}", c.text),
                        logprobs: self.text_logprobs(&c.logprobs, start),
                        finish_reason: Some(c.finish_reason()),
                    })
                    .collect();
                Json(TextCompletion {
                    head: self.head(false),
                    choices,
                    usage: Some(ChunkUsage::Full(Box::new(f.usage))),
                    timings: Some(f.timings),
                    prompt_progress: None,
                })
                .into_response()
            }
        }
    }
}
