//! The front door of `POST /v1/chat/completions` and `POST /v1/completions`: read the body,
//! take it apart ([`super::types`]), validate it ([`crate::server::request`]), launch it on the
//! one request path ([`crate::server::request::launch`]), then answer whole or as a stream of typed
//! chunks ([`super::response`]). The two APIs differ only in how the body is read and how a
//! choice is written out.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::sse::Event as SseEvent;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::types::{
    AssistantMessage, ChatChoice, ChatChunk, ChatCompletion, ChatLogprobs, ChunkChoice, ChunkUsage,
    CompletionLogprobs, Delta, Head, TextChoice, TextCompletion, ToolCallDelta,
};
use crate::sampling::TokenLogprobs;
use crate::scheduler::PromptProgress;
use crate::server::body::read_json;
use crate::server::error::ApiError;
use crate::server::ids::{created, new_id};
use crate::server::request::arrival::Arrived;
use crate::server::request::input::{ChatRequest, CompletionRequest};
use crate::server::request::launch::{self, Collected, Encoder, launch_request};
use crate::server::request::outcome::{ApiFinishReason, RequestOutcome};
use crate::server::request::pipeline::{ChoiceEnd, Out};
use crate::server::request::record::{self, Refused};
use crate::server::request::{Api, RequestMeta, ValidRequest};
use crate::server::state::SharedState;
use crate::tokenizer::TokenBytes;

/// Answers `POST /v1/chat/completions`: a chat reply, whole or streamed.
pub async fn chat(State(st): State<SharedState>, request: Request) -> Response {
    answer(st, Kind::Chat, request).await
}

/// Answers `POST /v1/completions`: a text completion, whole or streamed.
pub async fn completions(State(st): State<SharedState>, request: Request) -> Response {
    answer(st, Kind::Completions, request).await
}

/// The two generation APIs of this door.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Completions,
}

impl Kind {
    fn api(self) -> Api {
        match self {
            Kind::Chat => Api::Chat,
            Kind::Completions => Api::Completions,
        }
    }
}

/// Answers one request of `kind`: its output, or its refusal, which is recorded here, where
/// it is answered (a span of status `refused`, a log line, a count).
async fn answer(st: SharedState, kind: Kind, request: Request) -> Response {
    let (arrived, body) = Arrived::of(request);
    match generate(&st, kind, &arrived, body).await {
        Ok(r) => r,
        Err(refused) => record::refusal(&st, kind.api(), &arrived, refused).into_response(),
    }
}

async fn generate(
    st: &SharedState,
    kind: Kind,
    arrived: &Arrived,
    body: Body,
) -> Result<Response, Refused> {
    if st.engine.is_shutting_down() {
        return Err(ApiError::shutting_down().into());
    }
    let v: Value = read_json(body, st.cfg.max_body_bytes, st.cfg.read_timeout).await?;
    let req = match kind {
        Kind::Chat => ValidRequest::chat(st, Api::Chat, ChatRequest::from_json(v)?).await?,
        Kind::Completions => ValidRequest::completion(st, CompletionRequest::from_json(v)?).await?,
    };
    let key = req.chat_session(&arrived.headers);
    let stream = req.opts.stream;
    let launched = launch_request(st, req, new_id(kind.api().id_prefix()), key, arrived)?;
    let shape = Shape {
        meta: Arc::clone(&launched.meta),
        kind,
        created: created(),
        bytes: st.prompts.tokenizer().token_bytes(),
    };
    if stream {
        return Ok(launch::stream(launched, shape.streaming()));
    }
    // An error after the request reached the engine is its outcome, recorded as such.
    Ok(match launch::collect(launched).await {
        Ok((choices, outcome)) => shape.whole(choices, outcome),
        Err(e) => e.into_response(),
    })
}

/// How a request's output is written: the request it answers (shared, read where needed),
/// which of the two APIs it came through, the response's creation time and the tokens' bytes
/// (for log-probabilities).
struct Shape {
    meta: Arc<RequestMeta>,
    kind: Kind,
    created: u64,
    bytes: Arc<TokenBytes>,
}

impl Shape {
    fn req(&self) -> &ValidRequest {
        &self.meta.request
    }

    fn n(&self) -> usize {
        self.req().opts.n
    }

    fn logprobs(&self) -> bool {
        self.req().logprobs.is_some()
    }

    /// The prompt text that comes back before each completion (`echo`).
    fn echo(&self) -> Option<&str> {
        let r = self.req();
        r.echo.then_some(r.prompt_text.as_str())
    }

    fn continuous(&self) -> bool {
        self.req().opts.continuous_usage
    }

    /// The head of the whole response or of each chunk (`chunk`): the same id, creation time
    /// and model in both.
    fn head(&self, chunk: bool) -> Head {
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
    fn chat_logprobs(&self, tokens: &[TokenLogprobs]) -> Option<ChatLogprobs> {
        self.logprobs()
            .then(|| ChatLogprobs::new(tokens, &self.bytes))
    }

    /// A completion choice's log-probabilities from character `offset`, when asked for.
    fn text_logprobs(&self, tokens: &[TokenLogprobs], offset: usize) -> Option<CompletionLogprobs> {
        self.logprobs()
            .then(|| CompletionLogprobs::new(tokens, &self.bytes, offset))
    }

    /// The whole response: every choice collected, the usage and timings from the outcome.
    fn whole(&self, choices: Vec<Collected>, f: RequestOutcome) -> Response {
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

    /// The stream encoder of this response.
    fn streaming(self) -> Streaming {
        let n = self.n();
        Streaming {
            remaining: n,
            offsets: vec![0; n],
            held: None,
            shape: self,
        }
    }
}

/// A chunk of either API.
enum Chunk {
    Chat(ChatChunk),
    Text(TextCompletion),
}

impl Chunk {
    /// The chunk as an SSE event. A chunk that does not serialize is reported (a log line,
    /// and an error body in its place), never sent as an empty event.
    fn event(&self) -> SseEvent {
        let r = match self {
            Chunk::Chat(c) => serde_json::to_string(c),
            Chunk::Text(c) => serde_json::to_string(c),
        };
        let data = r.unwrap_or_else(|e| {
            tracing::error!(error = %e, "Response.ChunkUnserializable");
            ApiError::internal(format!("a response chunk did not serialize: {e}"))
                .body()
                .to_string()
        });
        SseEvent::default().data(data)
    }

    fn set_usage(&mut self, usage: Option<ChunkUsage>) {
        match self {
            Chunk::Chat(c) => c.usage = usage,
            Chunk::Text(c) => c.usage = usage,
        }
    }

    fn set_timings(&mut self, f: &RequestOutcome) {
        match self {
            Chunk::Chat(c) => c.timings = Some(f.timings.clone()),
            Chunk::Text(c) => c.timings = Some(f.timings.clone()),
        }
    }
}

/// The stream encoder of chat completions and completions: chunks of `data:` JSON, then
/// `[DONE]`.
struct Streaming {
    shape: Shape,
    remaining: usize,
    /// Characters sent per choice (legacy `text_offset`).
    offsets: Vec<usize>,
    /// The last choice's finishing chunk, held until the usage is known.
    held: Option<Chunk>,
}

impl Streaming {
    /// A chunk with these choices (chat) and nothing else.
    fn chat_chunk(&self, choices: Vec<ChunkChoice>) -> ChatChunk {
        ChatChunk {
            head: self.shape.head(true),
            choices,
            usage: None,
            timings: None,
            prompt_progress: None,
        }
    }

    /// A chunk with these choices (completions) and nothing else.
    fn text_chunk(&self, choices: Vec<TextChoice>) -> TextCompletion {
        TextCompletion {
            head: self.shape.head(true),
            choices,
            usage: None,
            timings: None,
            prompt_progress: None,
        }
    }

    /// A chunk of no choices (progress, usage), in the API's shape.
    fn bare_chunk(&self) -> Chunk {
        match self.shape.kind {
            Kind::Chat => Chunk::Chat(self.chat_chunk(Vec::new())),
            Kind::Completions => Chunk::Text(self.text_chunk(Vec::new())),
        }
    }

    /// A `prompt_progress` chunk: no choices (like the usage chunk, which OpenAI's own
    /// clients read), and the prefill's counts beside them.
    fn progress(&self, p: PromptProgress) -> Chunk {
        let mut c = self.bare_chunk();
        match &mut c {
            Chunk::Chat(c) => c.prompt_progress = Some(p),
            Chunk::Text(c) => c.prompt_progress = Some(p),
        }
        c
    }

    /// A chunk of content and reasoning (and their tokens' log-probabilities) for one choice.
    /// A chunk of reasoning alone carries no `content`.
    fn content(
        &mut self,
        index: usize,
        text: String,
        reasoning: String,
        logprobs: &[TokenLogprobs],
        finish: Option<ApiFinishReason>,
    ) -> Chunk {
        match self.shape.kind {
            Kind::Chat => Chunk::Chat(self.chat_chunk(vec![ChunkChoice {
                index,
                delta: Delta {
                    role: None,
                    content: (!text.is_empty() || (finish.is_none() && reasoning.is_empty()))
                        .then_some(text),
                    reasoning_content: (!reasoning.is_empty()).then_some(reasoning),
                    tool_calls: Vec::new(),
                },
                logprobs: (!logprobs.is_empty())
                    .then(|| self.shape.chat_logprobs(logprobs))
                    .flatten(),
                finish_reason: finish,
            }])),
            Kind::Completions => {
                let offset = self.offsets.get(index).copied().unwrap_or(0);
                if let Some(o) = self.offsets.get_mut(index) {
                    *o += text.chars().count();
                }
                let logprobs = (!logprobs.is_empty())
                    .then(|| self.shape.text_logprobs(logprobs, offset))
                    .flatten();
                Chunk::Text(self.text_chunk(vec![TextChoice {
                    index,
                    text,
                    logprobs,
                    finish_reason: finish,
                }]))
            }
        }
    }

    /// A chat chunk with one choice's tool calls, each whole.
    fn tool_calls(&self, e: &ChoiceEnd) -> Chunk {
        let calls = e
            .tool_calls
            .iter()
            .enumerate()
            .map(|(index, c)| ToolCallDelta {
                index,
                call: c.clone(),
            })
            .collect();
        Chunk::Chat(self.chat_chunk(vec![ChunkChoice {
            index: e.choice,
            delta: Delta {
                tool_calls: calls,
                ..Delta::default()
            },
            logprobs: None,
            finish_reason: None,
        }]))
    }

    /// The end of one choice: its last content, its tool calls (chat) and its finishing
    /// chunk, the last choice's held until the usage is known.
    fn choice_done(&mut self, e: &ChoiceEnd) -> Vec<SseEvent> {
        let mut v = Vec::new();
        let mut logprobs = e.logprobs.clone();
        if !e.text.is_empty() || !e.reasoning.is_empty() {
            let c = self.content(
                e.choice,
                e.text.clone(),
                e.reasoning.clone(),
                &logprobs,
                None,
            );
            v.push(c.event());
            logprobs.clear();
        }
        if !e.tool_calls.is_empty() && self.shape.kind == Kind::Chat {
            v.push(self.tool_calls(e).event());
        }
        let finish = self.content(
            e.choice,
            String::new(),
            String::new(),
            &logprobs,
            Some(e.finish_reason),
        );
        self.remaining = self.remaining.saturating_sub(1);
        if self.remaining == 0 {
            self.held = Some(finish);
        } else {
            v.push(finish.event());
        }
        v
    }

    /// The request's end: the held finishing chunk with the timings (and the usage with
    /// `continuous_usage_stats`), then the usage chunk with `include_usage`.
    fn done(&mut self, f: &RequestOutcome) -> Vec<SseEvent> {
        if let Some(e) = f.api_error() {
            return vec![SseEvent::default().data(e.body().to_string())];
        }
        let mut v = Vec::new();
        if let Some(mut last) = self.held.take() {
            last.set_timings(f);
            if self.shape.continuous() {
                last.set_usage(Some(ChunkUsage::Full(Box::new(f.usage.clone()))));
            }
            v.push(last.event());
        }
        if self.shape.req().opts.include_usage {
            let mut c = self.bare_chunk();
            c.set_usage(Some(ChunkUsage::Full(Box::new(f.usage.clone()))));
            c.set_timings(f);
            v.push(c.event());
        }
        v
    }
}

impl Encoder for Streaming {
    /// Chat: each choice's role chunk. Completions with `echo`: each choice's prompt.
    fn opening(&mut self) -> Vec<SseEvent> {
        let n = self.shape.n();
        match self.shape.kind {
            Kind::Chat => (0..n)
                .map(|index| {
                    Chunk::Chat(self.chat_chunk(vec![ChunkChoice {
                        index,
                        delta: Delta {
                            role: Some("assistant"),
                            content: Some(String::new()),
                            ..Delta::default()
                        },
                        logprobs: None,
                        finish_reason: None,
                    }]))
                    .event()
                })
                .collect(),
            Kind::Completions => match self.shape.echo().map(str::to_string) {
                Some(echo) => (0..n)
                    .map(|index| {
                        self.offsets[index] = echo.chars().count();
                        Chunk::Text(self.text_chunk(vec![TextChoice {
                            index,
                            text: echo.clone(),
                            logprobs: None,
                            finish_reason: None,
                        }]))
                        .event()
                    })
                    .collect(),
                None => Vec::new(),
            },
        }
    }

    fn on(&mut self, o: Out) -> Vec<SseEvent> {
        match o {
            Out::Delta {
                choice,
                text,
                reasoning,
                generated,
                logprobs,
            } => {
                if text.is_empty() && reasoning.is_empty() && !self.shape.continuous() {
                    return Vec::new();
                }
                let mut c = self.content(choice, text, reasoning, &logprobs, None);
                if self.shape.continuous() {
                    let prompt_tokens = self.shape.req().prompt.len();
                    c.set_usage(Some(ChunkUsage::Partial {
                        prompt_tokens,
                        completion_tokens: generated,
                        total_tokens: prompt_tokens + generated,
                    }));
                }
                vec![c.event()]
            }
            Out::PromptProgress(p) => vec![self.progress(p).event()],
            Out::ChoiceDone(e) => self.choice_done(&e),
            Out::Done(f) => self.done(&f),
        }
    }

    fn closing(&mut self) -> Vec<SseEvent> {
        vec![SseEvent::default().data("[DONE]")]
    }
}
