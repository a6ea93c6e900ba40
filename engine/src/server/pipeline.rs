//! From a validated request to its output: submit to the engine, then one task per request
//! that consumes the events of each of its choices, records its spans and its log line, shapes
//! each choice's text (content to stream now, tool calls to parse at the end), and forwards it
//! to the HTTP side. The task never waits on the client: output goes through an unbounded
//! channel, so a slow reader cannot stall the step loop or other requests.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use opentelemetry::Context;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::AppState;
use super::error::ApiError;
use super::openai::tools::{ParsedCall, Shaper, ToolSetup};
use super::openai::validate::ValidRequest;
use super::trace::{RequestInfo, RequestTrace};
use super::usage::{LlamaCppTimings, Usage, usage_of};
use crate::sampling::TokenLogprobs;
use crate::scheduler::{Completion, Event, FinishReason, GenerateRequest};

/// What the HTTP side receives.
#[derive(Debug)]
pub enum Out {
    /// Content for one choice (possibly empty), with the log-probabilities of the tokens
    /// generated since its last delta.
    Delta {
        /// The choice.
        choice: usize,
        /// Content to show now.
        text: String,
        /// Tokens generated so far, over all choices.
        generated: usize,
        /// Log-probabilities of the tokens this delta covers (when asked for).
        logprobs: Vec<TokenLogprobs>,
    },
    /// One choice finished.
    ChoiceDone(Box<ChoiceEnd>),
    /// The request finished (after every choice).
    Done(Box<Final>),
}

/// The end of one choice.
#[derive(Debug, Clone)]
pub struct ChoiceEnd {
    /// The choice.
    pub choice: usize,
    /// OpenAI finish reason (`tool_calls` when the reply is calls).
    pub finish_reason: &'static str,
    /// Content not yet sent.
    pub text: String,
    /// The tool calls found in the reply.
    pub tool_calls: Vec<ParsedCall>,
    /// Log-probabilities of tokens not yet sent.
    pub logprobs: Vec<TokenLogprobs>,
}

/// A finished request as the API reports it.
#[derive(Debug, Clone)]
pub struct Final {
    /// Usage, with the request's own timings.
    pub usage: Usage,
    /// llama.cpp-style timings.
    pub timings: LlamaCppTimings,
    /// Set when the request failed.
    pub error: Option<String>,
}

/// Sets the cancel flag when dropped, unless disarmed (a handler dropped mid-request means
/// the client went away).
pub struct CancelOnDrop {
    flag: Arc<AtomicBool>,
    armed: bool,
}

impl CancelOnDrop {
    /// Guards `flag`.
    pub fn new(flag: Arc<AtomicBool>) -> Self {
        Self { flag, armed: true }
    }
    /// The request completed: dropping no longer cancels.
    pub fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if self.armed {
            self.flag.store(true, Ordering::Relaxed);
        }
    }
}

/// Submits a request and starts its task. Returns its output channel and cancel flag.
pub fn launch(
    st: &AppState,
    info: RequestInfo,
    req: &ValidRequest,
    parent: &Context,
) -> Result<(mpsc::UnboundedReceiver<Out>, Arc<AtomicBool>), ApiError> {
    let trace = RequestTrace::start(
        Arc::clone(&st.telemetry.tracer),
        st.anchor,
        info.clone(),
        parent,
        st.cfg.trace_content,
    );
    let cancel = Arc::new(AtomicBool::new(false));
    let opts = &req.opts;
    let gen_req = GenerateRequest {
        id: info.id.clone(),
        prompt: req.prompt.clone(),
        max_tokens: opts.max_tokens,
        sampling: opts.sampling.clone(),
        stop: opts.stop.clone(),
        ignore_eos: opts.ignore_eos,
        session: info.session.clone(),
        received: info.received,
        cancel: Arc::clone(&cancel),
        n: opts.n,
        logprobs: req.logprobs,
        constraint: req.constraint.clone(),
    };
    let rxs = match st.engine.submit_choices(gen_req) {
        Ok(rx) => rx,
        Err(e) => {
            let api = ApiError::from(e);
            trace.refuse(api.label(), &api.message);
            return Err(api);
        }
    };
    let (tx, out) = mpsc::unbounded_channel();
    let progress = st.cfg.progress_interval;
    let flag = Arc::clone(&cancel);
    let tools = req.tools.clone();
    tokio::spawn(run(trace, rxs, tx, flag, progress, info, tools));
    Ok((out, cancel))
}

/// One choice in progress, as the request task sees it.
struct ChoiceState {
    shaper: Shaper,
    logprobs: Vec<TokenLogprobs>,
    generated: usize,
    done: Option<Completion>,
}

async fn run(
    mut trace: RequestTrace,
    rxs: Vec<mpsc::UnboundedReceiver<Event>>,
    tx: mpsc::UnboundedSender<Out>,
    cancel: Arc<AtomicBool>,
    progress: Duration,
    info: RequestInfo,
    tools: Option<ToolSetup>,
) {
    let n = rxs.len();
    let mut choices: Vec<ChoiceState> = (0..n)
        .map(|_| ChoiceState {
            shaper: Shaper::new(tools.as_ref()),
            logprobs: Vec::new(),
            generated: 0,
            done: None,
        })
        .collect();
    // Each choice's events, tagged with its index, and a `None` when its channel closes.
    let mut events =
        futures_util::stream::select_all(rxs.into_iter().enumerate().map(|(i, rx)| {
            UnboundedReceiverStream::new(rx)
                .map(move |ev| (i, Some(ev)))
                .chain(futures_util::stream::once(async move { (i, None) }))
                .boxed()
        }));
    let mut tick = tokio::time::interval(if progress.is_zero() {
        Duration::from_secs(3600)
    } else {
        progress
    });
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    tick.tick().await;
    let mut finished = 0;
    let mut tool_calls = 0;
    let mut reasons: Vec<&'static str> = vec![slotlight_otel::attr::value::FINISH_ERROR; n];
    while finished < n {
        tokio::select! {
            item = events.next() => {
                let Some((i, ev)) = item else { break };
                let ev = match ev {
                    Some(ev) => ev,
                    // The engine went away without finishing this choice.
                    None if choices[i].done.is_none() => Event::Done(Box::new(lost(&info, i))),
                    None => continue,
                };
                trace.on_event(i, &ev);
                match ev {
                    Event::Token { text, logprobs, .. } => {
                        let c = &mut choices[i];
                        c.generated += 1;
                        if let Some(lp) = logprobs {
                            c.logprobs.push(*lp);
                        }
                        let shown = c.shaper.push(&text);
                        let lps = if shown.is_empty() { Vec::new() } else { std::mem::take(&mut c.logprobs) };
                        let generated = choices.iter().map(|c| c.generated).sum();
                        let gone = tx
                            .send(Out::Delta { choice: i, text: shown, generated, logprobs: lps })
                            .is_err();
                        cancel.fetch_or(gone, Ordering::Relaxed);
                    }
                    Event::Done(c) => {
                        let state = &mut choices[i];
                        let shaper = std::mem::replace(&mut state.shaper, Shaper::new(None));
                        let (text, calls) = shaper.finish(&c.tail_text);
                        let reason = match (&c.finish_reason, calls.is_empty()) {
                            (FinishReason::Stop, false) => {
                                slotlight_otel::attr::value::FINISH_TOOL_CALLS
                            }
                            (r, _) => r.as_str(),
                        };
                        reasons[i] = reason;
                        tool_calls += calls.len();
                        let _ = tx.send(Out::ChoiceDone(Box::new(ChoiceEnd {
                            choice: i,
                            finish_reason: reason,
                            text,
                            tool_calls: calls,
                            logprobs: std::mem::take(&mut state.logprobs),
                        })));
                        state.done = Some(*c);
                        finished += 1;
                    }
                    _ => {}
                }
            }
            _ = tick.tick(), if !progress.is_zero() => trace.flush_window(),
        }
    }
    let done: Vec<Completion> = choices
        .into_iter()
        .enumerate()
        .map(|(i, c)| c.done.unwrap_or_else(|| lost(&info, i)))
        .collect();
    let refs: Vec<&Completion> = done.iter().collect();
    let (usage, timings) = usage_of(&refs);
    log_finished(&info, &trace.trace_id(), &refs, &usage);
    trace.finish(&refs, &usage, &reasons, tool_calls);
    let error = done.iter().find_map(|c| match &c.finish_reason {
        FinishReason::Error(e) => Some(e.clone()),
        _ => None,
    });
    let _ = tx.send(Out::Done(Box::new(Final {
        usage,
        timings,
        error,
    })));
}

fn lost(info: &RequestInfo, choice: usize) -> Completion {
    Completion {
        finish_reason: FinishReason::Error("the engine stopped".into()),
        tokens: Vec::new(),
        tail_text: String::new(),
        timings: crate::timing::RequestTimings::new(info.received, 0),
        group: 0,
        choice,
        mask: None,
    }
}

/// One structured log line per finished request.
fn log_finished(info: &RequestInfo, trace_id: &str, done: &[&Completion], usage: &Usage) {
    let legs: Vec<serde_json::Value> = done
        .iter()
        .flat_map(|c| {
            c.timings.legs.iter().map(|l| {
                serde_json::json!({
                    "choice": c.choice,
                    "path": l.path.as_str(),
                    "group": l.group,
                    "slot": l.slot,
                    "tokens_carried": l.tokens_carried,
                    "tokens": l.tokens_generated,
                    "ms": l.end.map(|e| (e - l.start).as_secs_f64() * 1000.0),
                    "device_ms": l.device.as_secs_f64() * 1000.0,
                    "end": l.end_reason.map(|r| r.as_str()),
                })
            })
        })
        .collect();
    let legs = serde_json::Value::Array(legs).to_string();
    let since = |i: Instant| i.saturating_duration_since(info.received).as_secs_f64() * 1000.0;
    let u = &usage.timings;
    let reasons: Vec<&str> = done.iter().map(|c| c.finish_reason.as_str()).collect();
    let first = done.first();
    tracing::info!(
        target: "slotlight::request",
        request_id = %info.id,
        session_id = info.session.as_deref().unwrap_or(""),
        trace_id = %trace_id,
        operation = info.operation,
        finish_reason = reasons.join(","),
        choices = done.len(),
        prompt_tokens = usage.prompt_tokens,
        cached_tokens = usage.prompt_tokens_details.cached_tokens,
        prefilled_tokens = done.iter().map(|c| c.timings.prefilled_tokens).sum::<usize>(),
        completion_tokens = usage.completion_tokens,
        queue_ms = u.queue_ms,
        prefill_ms = u.prefill_ms,
        ttft_ms = u.ttft_ms,
        decode_ms = u.decode_ms,
        generation_ms = u.generation_ms,
        decode_tps = u.decode_tps.unwrap_or(0.0),
        e2e_ms = done
            .iter()
            .filter_map(|c| c.timings.finished)
            .max()
            .map_or(0.0, since),
        group = first.map_or(0, |c| c.group),
        legs = %legs,
        "Request.Finished"
    );
}
