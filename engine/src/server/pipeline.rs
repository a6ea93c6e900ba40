//! From a validated request to its output: submit to the engine, then one task per request
//! that consumes the request's own event channel, records its spans and its log line, and
//! forwards text to the HTTP side. The task never waits on the client: output goes through an
//! unbounded channel, so a slow reader cannot stall the step loop or other requests.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use opentelemetry::Context;
use tokio::sync::mpsc;

use super::AppState;
use super::error::ApiError;
use super::openai::types::{LegUsage, LlamaCppTimings, PromptDetails, Usage, ValidOptions};
use super::trace::{RequestInfo, RequestTrace};
use crate::scheduler::{Completion, Event, FinishReason, GenerateRequest};

/// What the HTTP side receives.
#[derive(Debug)]
pub enum Out {
    /// New text (possibly empty) and the count of tokens generated so far.
    Delta {
        /// Text.
        text: String,
        /// Tokens so far.
        generated: usize,
    },
    /// The end.
    Done(Box<Final>),
}

/// A finished request as the API reports it.
#[derive(Debug, Clone)]
pub struct Final {
    /// OpenAI finish reason.
    pub finish_reason: &'static str,
    /// Text still to send.
    pub tail: String,
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

/// Builds the usage block from a request's own timings.
#[allow(clippy::cast_precision_loss)]
pub fn usage_of(c: &Completion) -> (Usage, LlamaCppTimings) {
    let t = &c.timings;
    let u = t.usage();
    let usage = Usage {
        prompt_tokens: t.prompt_tokens,
        completion_tokens: t.generated_tokens,
        total_tokens: t.prompt_tokens + t.generated_tokens,
        prompt_tokens_details: PromptDetails {
            cached_tokens: t.cached_tokens,
        },
        timings: u,
        legs: t
            .legs
            .iter()
            .map(|l| LegUsage {
                path: l.path.as_str(),
                group: l.group,
                slot: l.slot,
                tokens_carried: l.tokens_carried,
                tokens: l.tokens_generated,
                ms: l.end.map_or(0.0, |e| (e - l.start).as_secs_f64() * 1000.0),
                device_ms: l.device.as_secs_f64() * 1000.0,
            })
            .collect(),
    };
    let per_s = |n: usize, ms: f64| {
        if ms > 0.0 {
            n as f64 / (ms / 1000.0)
        } else {
            0.0
        }
    };
    let timings = LlamaCppTimings {
        prompt_n: t.prefilled_tokens,
        prompt_ms: u.prefill_ms,
        prompt_per_second: per_s(t.prefilled_tokens, u.prefill_ms),
        predicted_n: t.generated_tokens,
        predicted_ms: u.decode_ms,
        predicted_per_second: u.decode_tps.unwrap_or(0.0),
        cache_n: t.cached_tokens,
    };
    (usage, timings)
}

/// Submits a request and starts its task. Returns its output channel and cancel flag.
pub fn launch(
    st: &AppState,
    info: RequestInfo,
    prompt: Vec<u32>,
    opts: &ValidOptions,
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
    let req = GenerateRequest {
        id: info.id.clone(),
        prompt,
        max_tokens: opts.max_tokens,
        sampling: opts.sampling.clone(),
        stop: opts.stop.clone(),
        ignore_eos: opts.ignore_eos,
        session: info.session.clone(),
        received: info.received,
        cancel: Arc::clone(&cancel),
    };
    let rx = match st.engine.submit(req) {
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
    tokio::spawn(run(trace, rx, tx, flag, progress, info));
    Ok((out, cancel))
}

async fn run(
    mut trace: RequestTrace,
    mut rx: mpsc::UnboundedReceiver<Event>,
    tx: mpsc::UnboundedSender<Out>,
    cancel: Arc<AtomicBool>,
    progress: Duration,
    info: RequestInfo,
) {
    let mut tick = tokio::time::interval(if progress.is_zero() {
        Duration::from_secs(3600)
    } else {
        progress
    });
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    tick.tick().await;
    loop {
        tokio::select! {
            ev = rx.recv() => {
                let Some(ev) = ev else {
                    // The engine went away without finishing the request.
                    let _ = tx.send(Out::Done(Box::new(lost(&info))));
                    break;
                };
                trace.on_event(&ev);
                match ev {
                    Event::Token { text, generated, .. } => {
                        let gone = tx.send(Out::Delta { text, generated }).is_err();
                        cancel.fetch_or(gone, Ordering::Relaxed);
                    }
                    Event::Done(c) => {
                        log_finished(&info, &trace.trace_id(), &c);
                        let (usage, timings) = usage_of(&c);
                        let error = match &c.finish_reason {
                            FinishReason::Error(e) => Some(e.clone()),
                            _ => None,
                        };
                        let _ = tx.send(Out::Done(Box::new(Final {
                            finish_reason: c.finish_reason.as_str(),
                            tail: c.tail_text.clone(),
                            usage,
                            timings,
                            error,
                        })));
                        break;
                    }
                    _ => {}
                }
            }
            _ = tick.tick(), if !progress.is_zero() => trace.flush_window(),
        }
    }
}

fn lost(info: &RequestInfo) -> Final {
    let c = Completion {
        finish_reason: FinishReason::Error("the engine stopped".into()),
        tokens: Vec::new(),
        tail_text: String::new(),
        timings: crate::timing::RequestTimings::new(info.received, 0),
        group: 0,
    };
    let (usage, timings) = usage_of(&c);
    Final {
        finish_reason: "error",
        tail: String::new(),
        usage,
        timings,
        error: Some("the engine stopped".into()),
    }
}

/// One structured log line per finished request.
fn log_finished(info: &RequestInfo, trace_id: &str, c: &Completion) {
    let t = &c.timings;
    let u = t.usage();
    let legs: Vec<serde_json::Value> = t
        .legs
        .iter()
        .map(|l| {
            serde_json::json!({
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
        .collect();
    let legs = serde_json::Value::Array(legs).to_string();
    let since = |i: Instant| i.saturating_duration_since(info.received).as_secs_f64() * 1000.0;
    tracing::info!(
        target: "slotlight::request",
        request_id = %info.id,
        session_id = info.session.as_deref().unwrap_or(""),
        trace_id = %trace_id,
        operation = info.operation,
        finish_reason = c.finish_reason.as_str(),
        prompt_tokens = t.prompt_tokens,
        cached_tokens = t.cached_tokens,
        prefilled_tokens = t.prefilled_tokens,
        completion_tokens = t.generated_tokens,
        queue_ms = u.queue_ms,
        prefill_ms = u.prefill_ms,
        ttft_ms = u.ttft_ms,
        decode_ms = u.decode_ms,
        generation_ms = u.generation_ms,
        decode_tps = u.decode_tps.unwrap_or(0.0),
        e2e_ms = t.finished.map_or(0.0, since),
        group = c.group,
        legs = %legs,
        "Request.Finished"
    );
}
