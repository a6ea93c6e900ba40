//! The one request path of `POST /v1/chat/completions` and `POST /v1/completions`: read the
//! body, take it apart ([`super::types`]), validate it and compile its grammar
//! ([`super::validate`]), launch it ([`crate::server::pipeline`]), then answer whole or as a
//! stream of typed chunks ([`super::response`]). The endpoints differ only in how the body is
//! read and how a choice is written out.

use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::request::{Endpoint, RequestMeta, ValidRequest};
use super::response::{
    AssistantMessage, ChatChoice, ChatChunk, ChatCompletion, ChatLogprobs, ChunkChoice, ChunkUsage,
    CompletionLogprobs, Delta, TextChoice, TextCompletion, ToolCall, ToolCallDelta,
};
use super::types::{ChatRequest, CompletionRequest};
use super::{created, new_id, read_json, session, sse};
use crate::sampling::TokenLogprobs;
use crate::scheduler::PromptProgress;
use crate::server::error::ApiError;
use crate::server::outcome::{ApiFinishReason, RequestOutcome};
use crate::server::pipeline::{CancelOnDrop, ChoiceEnd, Out, launch};
use crate::server::record::{self, Refused};
use crate::server::trace::ServerAddress;
use crate::server::{Arrival, LocalAddr, SharedState, server_address};
use crate::tokenizer::TokenBytes;

/// Answers `POST /v1/chat/completions`: a chat reply, whole or streamed.
pub async fn chat(State(st): State<SharedState>, request: Request) -> Response {
    answer(st, Endpoint::Chat, request).await
}

/// Answers `POST /v1/completions`: a text completion, whole or streamed.
pub async fn completions(State(st): State<SharedState>, request: Request) -> Response {
    answer(st, Endpoint::Completions, request).await
}

/// Answers one request of the route `endpoint`: its output, or its refusal, which is recorded
/// here, where it is answered (a span of status `refused`, a log line, a count).
async fn answer(st: SharedState, endpoint: Endpoint, request: Request) -> Response {
    let received = request
        .extensions()
        .get::<Arrival>()
        .map_or_else(Instant::now, |a| a.0);
    let local = request.extensions().get::<LocalAddr>().map(|l| l.0);
    let (parts, body) = request.into_parts();
    let headers = parts.headers;
    let server = server_address(&headers, local);
    match generate(&st, endpoint, received, &headers, &server, body).await {
        Ok(r) => r,
        Err(refused) => record::refusal(&st, endpoint, received, &headers, &server, refused),
    }
}

async fn generate(
    st: &SharedState,
    endpoint: Endpoint,
    received: Instant,
    headers: &HeaderMap,
    server: &ServerAddress,
    body: Body,
) -> Result<Response, Refused> {
    if st.engine.is_shutting_down() {
        return Err(ApiError::shutting_down().into());
    }
    let v: Value = read_json(body, st.cfg.max_body_bytes, st.cfg.read_timeout).await?;
    let req = match endpoint {
        Endpoint::Chat => ValidRequest::chat(st, ChatRequest::from_json(v)?).await?,
        Endpoint::Completions => {
            ValidRequest::completion(st, CompletionRequest::from_json(v)?).await?
        }
    };
    let meta = Arc::new(RequestMeta {
        id: new_id(req.endpoint.id_prefix()),
        session: session(headers, req.opts.session_hint.as_deref()),
        received,
        request: req,
    });
    let parent = crate::server::parent_context(headers);
    let (out, cancel) = launch(st, Arc::clone(&meta), &parent, server)?;
    let shape = Shape {
        meta,
        created: created(),
        bytes: st.prompts.tokenizer().token_bytes(),
    };
    if shape.req().opts.stream {
        Ok(shape.stream(out, cancel))
    } else {
        // An error after the request reached the engine is its outcome, recorded as such.
        Ok(shape
            .collect(out, cancel)
            .await
            .unwrap_or_else(IntoResponse::into_response))
    }
}

/// How a request's output is written: the request it answers (shared, read where needed),
/// the response's creation time and the tokens' bytes (for log-probabilities).
struct Shape {
    meta: Arc<RequestMeta>,
    created: u64,
    bytes: Arc<TokenBytes>,
}

impl Shape {
    fn req(&self) -> &ValidRequest {
        &self.meta.request
    }

    fn endpoint(&self) -> Endpoint {
        self.req().endpoint
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
}

/// One choice collected whole.
#[derive(Default)]
struct Collected {
    text: String,
    reasoning: String,
    logprobs: Vec<TokenLogprobs>,
    end: Option<ChoiceEnd>,
}

impl Shape {
    async fn collect(
        self,
        mut out: mpsc::UnboundedReceiver<Out>,
        cancel: Arc<std::sync::atomic::AtomicBool>,
    ) -> Result<Response, ApiError> {
        let mut guard = CancelOnDrop::new(cancel);
        let mut choices: Vec<Collected> = (0..self.n()).map(|_| Collected::default()).collect();
        while let Some(o) = out.recv().await {
            match o {
                Out::Delta {
                    choice,
                    text,
                    reasoning,
                    logprobs,
                    ..
                } => {
                    if let Some(c) = choices.get_mut(choice) {
                        c.text.push_str(&text);
                        c.reasoning.push_str(&reasoning);
                        c.logprobs.extend(logprobs);
                    }
                }
                // A whole response carries no progress (the pipeline sends none for it).
                Out::PromptProgress(_) => {}
                Out::ChoiceDone(e) => {
                    if let Some(c) = choices.get_mut(e.choice) {
                        c.text.push_str(&e.text);
                        c.reasoning.push_str(&e.reasoning);
                        c.logprobs.extend(e.logprobs.iter().cloned());
                        c.end = Some(*e);
                    }
                }
                Out::Done(f) => {
                    guard.disarm();
                    if let Some(e) = f.api_error() {
                        return Err(e);
                    }
                    return Ok(self.whole(choices, *f));
                }
            }
        }
        Err(ApiError::internal("the request ended without a result"))
    }

    fn whole(&self, choices: Vec<Collected>, f: RequestOutcome) -> Response {
        let reason = |c: &Collected| {
            c.end
                .as_ref()
                .map_or(ApiFinishReason::Error, |e| e.finish_reason)
        };
        match self.endpoint() {
            Endpoint::Chat => {
                let choices = choices
                    .iter()
                    .enumerate()
                    .map(|(index, c)| {
                        let calls: Vec<ToolCall> = c
                            .end
                            .iter()
                            .flat_map(|e| e.tool_calls.iter().cloned())
                            .collect();
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
                            logprobs: self
                                .logprobs()
                                .then(|| ChatLogprobs::new(&c.logprobs, &self.bytes)),
                            finish_reason: reason(c),
                        }
                    })
                    .collect();
                Json(ChatCompletion {
                    id: self.meta.id.clone(),
                    object: "chat.completion",
                    created: self.created,
                    model: self.req().model.clone(),
                    system_fingerprint: None,
                    choices,
                    usage: f.usage,
                    timings: f.timings,
                })
                .into_response()
            }
            Endpoint::Completions => {
                let echo = self.echo().unwrap_or_default();
                let start = echo.chars().count();
                let choices = choices
                    .iter()
                    .enumerate()
                    .map(|(index, c)| TextChoice {
                        index,
                        text: format!("{echo}{}", c.text),
                        logprobs: self
                            .logprobs()
                            .then(|| CompletionLogprobs::new(&c.logprobs, &self.bytes, start)),
                        finish_reason: Some(reason(c)),
                    })
                    .collect();
                Json(TextCompletion {
                    id: self.meta.id.clone(),
                    object: "text_completion",
                    created: self.created,
                    model: self.req().model.clone(),
                    system_fingerprint: None,
                    choices,
                    usage: Some(ChunkUsage::Full(Box::new(f.usage))),
                    timings: Some(f.timings),
                    prompt_progress: None,
                })
                .into_response()
            }
        }
    }

    fn stream(
        self,
        out: mpsc::UnboundedReceiver<Out>,
        cancel: Arc<std::sync::atomic::AtomicBool>,
    ) -> Response {
        let mut st = Streaming {
            guard: Some(CancelOnDrop::new(cancel)),
            remaining: self.n(),
            offsets: vec![0; self.n()],
            held: None,
            shape: self,
        };
        let opening = st.opening();
        let body = UnboundedReceiverStream::new(out)
            .flat_map(move |o| futures_util::stream::iter(st.on(o)));
        sse(futures_util::stream::iter(opening).chain(body)).into_response()
    }
}

/// A chunk of either endpoint.
enum Chunk {
    Chat(ChatChunk),
    Text(TextCompletion),
}

impl Chunk {
    /// The chunk as an SSE data line. A chunk that does not serialize is reported (a log
    /// line, and an error body in its place), never sent as an empty event.
    fn json(&self) -> String {
        let r = match self {
            Chunk::Chat(c) => serde_json::to_string(c),
            Chunk::Text(c) => serde_json::to_string(c),
        };
        r.unwrap_or_else(|e| {
            tracing::error!(error = %e, "Response.ChunkUnserializable");
            ApiError::internal(format!("a response chunk did not serialize: {e}"))
                .body()
                .to_string()
        })
    }

    fn finish_extras(&mut self, f: &RequestOutcome, continuous: bool) {
        let usage = continuous.then(|| ChunkUsage::Full(Box::new(f.usage.clone())));
        match self {
            Chunk::Chat(c) => {
                c.timings = Some(f.timings.clone());
                c.usage = usage;
            }
            Chunk::Text(c) => {
                c.timings = Some(f.timings.clone());
                c.usage = usage;
            }
        }
    }
}

/// A stream in progress.
struct Streaming {
    shape: Shape,
    guard: Option<CancelOnDrop>,
    remaining: usize,
    /// Characters sent per choice (legacy `text_offset`).
    offsets: Vec<usize>,
    /// The last choice's finishing chunk, held until the usage is known.
    held: Option<Chunk>,
}

impl Streaming {
    fn chat_chunk(&self, choices: Vec<ChunkChoice>) -> ChatChunk {
        ChatChunk {
            id: self.shape.meta.id.clone(),
            object: "chat.completion.chunk",
            created: self.shape.created,
            model: self.shape.req().model.clone(),
            system_fingerprint: None,
            choices,
            usage: None,
            timings: None,
            prompt_progress: None,
        }
    }

    fn text_chunk(&self, choices: Vec<TextChoice>) -> TextCompletion {
        TextCompletion {
            id: self.shape.meta.id.clone(),
            object: "text_completion",
            created: self.shape.created,
            model: self.shape.req().model.clone(),
            system_fingerprint: None,
            choices,
            usage: None,
            timings: None,
            prompt_progress: None,
        }
    }

    /// A `prompt_progress` chunk: no choices (like the usage chunk, which OpenAI's own
    /// clients read), and the prefill's counts beside them.
    fn progress(&self, p: PromptProgress) -> Chunk {
        match self.shape.endpoint() {
            Endpoint::Chat => {
                let mut c = self.chat_chunk(Vec::new());
                c.prompt_progress = Some(p);
                Chunk::Chat(c)
            }
            Endpoint::Completions => {
                let mut c = self.text_chunk(Vec::new());
                c.prompt_progress = Some(p);
                Chunk::Text(c)
            }
        }
    }

    /// Chat: each choice's role chunk. Completions with `echo`: each choice's prompt.
    fn opening(&mut self) -> Vec<String> {
        let n = self.shape.n();
        match self.shape.endpoint() {
            Endpoint::Chat => (0..n)
                .map(|index| {
                    Chunk::Chat(self.chat_chunk(vec![ChunkChoice {
                        index,
                        delta: Delta {
                            role: Some("assistant"),
                            content: Some(String::new()),
                            reasoning_content: None,
                            tool_calls: Vec::new(),
                        },
                        logprobs: None,
                        finish_reason: None,
                    }]))
                    .json()
                })
                .collect(),
            Endpoint::Completions => match self.shape.echo().map(str::to_string) {
                Some(echo) => (0..n)
                    .map(|index| {
                        self.offsets[index] = echo.chars().count();
                        Chunk::Text(self.text_chunk(vec![TextChoice {
                            index,
                            text: echo.clone(),
                            logprobs: None,
                            finish_reason: None,
                        }]))
                        .json()
                    })
                    .collect(),
                None => Vec::new(),
            },
        }
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
        match self.shape.endpoint() {
            Endpoint::Chat => Chunk::Chat(self.chat_chunk(vec![ChunkChoice {
                index,
                delta: Delta {
                    role: None,
                    content: (!text.is_empty() || (finish.is_none() && reasoning.is_empty()))
                        .then_some(text),
                    reasoning_content: (!reasoning.is_empty()).then_some(reasoning),
                    tool_calls: Vec::new(),
                },
                logprobs: (self.shape.logprobs() && !logprobs.is_empty())
                    .then(|| ChatLogprobs::new(logprobs, &self.shape.bytes)),
                finish_reason: finish,
            }])),
            Endpoint::Completions => {
                let offset = self.offsets.get(index).copied().unwrap_or(0);
                if let Some(o) = self.offsets.get_mut(index) {
                    *o += text.chars().count();
                }
                Chunk::Text(self.text_chunk(vec![
                    TextChoice {
                        index,
                        text,
                        logprobs:
                            (self.shape.logprobs() && !logprobs.is_empty()).then(|| {
                                CompletionLogprobs::new(logprobs, &self.shape.bytes, offset)
                            }),
                        finish_reason: finish,
                    },
                ]))
            }
        }
    }

    fn on(&mut self, o: Out) -> Vec<String> {
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
                    let usage = ChunkUsage::Partial {
                        prompt_tokens: self.shape.req().prompt.len(),
                        completion_tokens: generated,
                        total_tokens: self.shape.req().prompt.len() + generated,
                    };
                    match &mut c {
                        Chunk::Chat(c) => c.usage = Some(usage),
                        Chunk::Text(c) => c.usage = Some(usage),
                    }
                }
                vec![c.json()]
            }
            Out::PromptProgress(p) => vec![self.progress(p).json()],
            Out::ChoiceDone(e) => {
                let mut v = Vec::new();
                let mut logprobs = e.logprobs.clone();
                if !e.text.is_empty() || !e.reasoning.is_empty() {
                    v.push(
                        self.content(
                            e.choice,
                            e.text.clone(),
                            e.reasoning.clone(),
                            &logprobs,
                            None,
                        )
                        .json(),
                    );
                    logprobs.clear();
                }
                if !e.tool_calls.is_empty() && self.shape.endpoint() == Endpoint::Chat {
                    let calls = e
                        .tool_calls
                        .iter()
                        .enumerate()
                        .map(|(index, c)| ToolCallDelta {
                            index,
                            call: c.clone(),
                        })
                        .collect();
                    v.push(
                        Chunk::Chat(self.chat_chunk(vec![ChunkChoice {
                            index: e.choice,
                            delta: Delta {
                                role: None,
                                content: None,
                                reasoning_content: None,
                                tool_calls: calls,
                            },
                            logprobs: None,
                            finish_reason: None,
                        }]))
                        .json(),
                    );
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
                    v.push(finish.json());
                }
                v
            }
            Out::Done(f) => {
                if let Some(g) = self.guard.as_mut() {
                    g.disarm();
                }
                if let Some(e) = f.api_error() {
                    return vec![e.body().to_string()];
                }
                let mut v = Vec::new();
                if let Some(mut last) = self.held.take() {
                    last.finish_extras(&f, self.shape.continuous());
                    v.push(last.json());
                }
                if self.shape.req().opts.include_usage {
                    let usage = Some(ChunkUsage::Full(Box::new(f.usage.clone())));
                    let chunk = match self.shape.endpoint() {
                        Endpoint::Chat => {
                            let mut c = self.chat_chunk(Vec::new());
                            c.usage = usage;
                            c.timings = Some(f.timings.clone());
                            Chunk::Chat(c)
                        }
                        Endpoint::Completions => {
                            let mut c = self.text_chunk(Vec::new());
                            c.usage = usage;
                            c.timings = Some(f.timings.clone());
                            Chunk::Text(c)
                        }
                    };
                    v.push(chunk.json());
                }
                v
            }
        }
    }
}
