//! What every front door (chat completions, completions, Responses, Messages) shares: a
//! request's arrival, its launch onto the one request path once the door has validated it,
//! and its answer, collected whole into choices here or streamed through the door's own
//! [`Encoder`]. A door writes only its wire types, its translation into the valid request and
//! its encoders; scheduling, clocks, spans, log lines, records and metrics happen once, below.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use tokio::sync::mpsc;

use crate::sampling::TokenLogprobs;
use crate::server::error::ApiError;
use crate::server::request::arrival::Arrived;
use crate::server::request::outcome::{ApiFinishReason, RequestOutcome};
use crate::server::request::pipeline::{CancelOnDrop, ChoiceEnd, Out, Pending, launch};
use crate::server::request::record::Refused;
use crate::server::request::session::SessionKey;
use crate::server::request::{RequestMeta, ValidRequest};
use crate::server::state::AppState;

/// A request on its way: what it is, its output as the pipeline sends it, and the flag that
/// cancels it.
pub struct Launched {
    /// The request, shared with its task, spans and log line.
    pub meta: Arc<RequestMeta>,
    /// Its output.
    pub out: mpsc::UnboundedReceiver<Out>,
    /// Set when the client goes away.
    pub cancel: Arc<AtomicBool>,
}

/// Launches a valid request under `id` and its session key `key` (from the door's resolver in
/// [`crate::server::request::session`]; without one the engine looks for the session the prompt continues):
/// from here on it has its own span and log line, whatever happens. A refusal by the
/// scheduler comes back with its span started.
pub fn launch_request(
    st: &AppState,
    request: ValidRequest,
    id: String,
    key: Option<SessionKey>,
    arrived: &Arrived,
) -> Result<Launched, Refused> {
    let parent = crate::server::request::arrival::parent_context(&arrived.headers);
    let pending = Pending {
        id,
        key,
        received: arrived.received,
        request,
    };
    let (meta, out, cancel) = launch(st, pending, &parent, &arrived.server)?;
    Ok(Launched { meta, out, cancel })
}

/// One choice collected whole: its text, reasoning and log-probabilities, and how it ended.
#[derive(Debug, Default)]
pub struct Collected {
    /// The reply's content.
    pub text: String,
    /// The reply's reasoning (thinking templates).
    pub reasoning: String,
    /// Log-probabilities of every generated token (when asked for).
    pub logprobs: Vec<TokenLogprobs>,
    /// How the choice ended (its finish reason and tool calls); `None` if it never did.
    pub end: Option<ChoiceEnd>,
}

impl Collected {
    /// The choice's finish reason; `error` for a choice that never ended.
    pub fn finish_reason(&self) -> ApiFinishReason {
        self.end
            .as_ref()
            .map_or(ApiFinishReason::Error, |e| e.finish_reason)
    }

    /// The tool calls the reply makes.
    pub fn tool_calls(&self) -> &[crate::server::request::tools::ToolCall] {
        self.end.as_ref().map_or(&[], |e| e.tool_calls.as_slice())
    }
}

/// Waits for a request's whole output: each choice collected, then its outcome. A request the
/// engine failed comes back as its error (already recorded as the request's outcome).
pub async fn collect(launched: Launched) -> Result<(Vec<Collected>, RequestOutcome), ApiError> {
    let Launched {
        meta,
        mut out,
        cancel,
    } = launched;
    let mut guard = CancelOnDrop::new(cancel);
    let mut choices: Vec<Collected> = (0..meta.request.opts.n)
        .map(|_| Collected::default())
        .collect();
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
            Out::PromptProgress(_) | Out::PromptReused { .. } => {}
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
                return Ok((choices, *f));
            }
        }
    }
    Err(ApiError::internal("the request ended without a result"))
}

/// A door's stream encoder: turns the pipeline's output into the API's server-sent events.
pub trait Encoder: Send + 'static {
    /// Events before any output (a role chunk, `response.created`, `message_start`).
    fn opening(&mut self) -> Vec<SseEvent>;
    /// Events for one piece of output; the request's [`Out::Done`] is the last.
    fn on(&mut self, out: Out) -> Vec<SseEvent>;
    /// Events after the last output (`[DONE]` for OpenAI's chat streams).
    fn closing(&mut self) -> Vec<SseEvent> {
        Vec::new()
    }

    /// Work the door must finish before the request's last events are sent (the Responses
    /// API stores a response before its `response.completed`): when this gives a future for
    /// the request's end, its events are sent in place of [`Encoder::on`]'s.
    fn finish(&mut self, _outcome: &RequestOutcome) -> Option<Finishing> {
        None
    }
}

/// The events of a request's end, once the door's work is done.
pub type Finishing = std::pin::Pin<Box<dyn std::future::Future<Output = Vec<SseEvent>> + Send>>;

/// Streams a launched request through `encoder` as server-sent events. The request is
/// cancelled if the client goes away before its last output.
pub fn stream(launched: Launched, mut encoder: impl Encoder) -> Response {
    let Launched { out, cancel, .. } = launched;
    let opening = encoder.opening();
    let state = Streaming {
        encoder,
        out,
        guard: CancelOnDrop::new(cancel),
    };
    let rest = futures_util::stream::unfold(Some(state), |state| async move {
        let mut s = state?;
        match s.out.recv().await {
            Some(o) => {
                let finishing = match &o {
                    Out::Done(f) => {
                        s.guard.disarm();
                        s.encoder.finish(f)
                    }
                    _ => None,
                };
                let events = match finishing {
                    Some(f) => f.await,
                    None => s.encoder.on(o),
                };
                Some((events, Some(s)))
            }
            None => Some((s.encoder.closing(), None)),
        }
    });
    let events = futures_util::stream::once(async { opening })
        .chain(rest)
        .flat_map(futures_util::stream::iter)
        .map(Ok::<_, Infallible>);
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// A stream in progress: the door's encoder over the request's output, and the guard that
/// cancels the request if the stream is dropped before its end.
struct Streaming<E> {
    encoder: E,
    out: mpsc::UnboundedReceiver<Out>,
    guard: CancelOnDrop,
}
