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
use super::trace::{Refusal, RequestInfo, RequestTrace};
use crate::scheduler::{Completion, EngineError, Event, FinishReason, GenerateRequest};
use crate::timing::RequestTimings;

/// What the HTTP side receives.
#[derive(Debug)]
pub enum Out {
    /// New text (possibly empty) and the count of tokens generated so far.
    Delta {
        /// The text this token completes (may be empty while a character or a stop string is held back).
        text: String,
        /// Tokens so far.
        generated: usize,
    },
    /// The request finished: what is left to send, its usage, or its error.
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
    /// Set when the request failed: the answer to give.
    pub error: Option<ApiError>,
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

/// Builds the usage block and llama.cpp's `timings` from a request's own timings.
pub fn usage_of(c: &Completion) -> (Usage, LlamaCppTimings) {
    let t = &c.timings;
    let u = t.usage();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
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
                ms: l.end.map(|e| ms(e.saturating_duration_since(l.start))),
                device_ms: ms(l.device),
            })
            .collect(),
    };
    (usage, llama_cpp_timings(t))
}

/// llama.cpp's `timings`, with llama.cpp's own definitions (its server's
/// `server_slot::get_timings`): wall-clock times, and rates as counts per second of those
/// times. A rate whose time is zero or unknown is `null` (llama.cpp would divide by zero).
#[allow(clippy::cast_precision_loss)] // token counts are far below 2^53
pub fn llama_cpp_timings(t: &RequestTimings) -> LlamaCppTimings {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let per_second =
        |n: usize, ms: Option<f64>| ms.filter(|m| *m > 0.0).map(|m| n as f64 / (m / 1e3));
    let per_token = |n: usize, ms: Option<f64>| ms.filter(|_| n > 0).map(|m| m / n as f64);
    // prompt_n: `n_prompt_tokens_processed`, the prompt tokens evaluated (not taken from the
    // cache); here every prefill's computed tokens, a re-prefill after a preemption included.
    let prompt_n = t.prefilled_tokens;
    // prompt_ms: `t_prompt_processing`, the wall time from the start of prompt processing to
    // the first token; here the wall time of every prefill (first chunk's start to its end).
    let prompt_ms = t.prefill_wall().map(ms);
    // predicted_n: `n_decoded`, every generated token (the first one included).
    let predicted_n = t.generated_tokens;
    // predicted_ms: `t_token_generation`, the wall time from the first token to the last.
    let predicted_ms = match (t.first_token, t.last_token) {
        (Some(f), Some(l)) => Some(ms(l.saturating_duration_since(f))),
        _ => None,
    };
    LlamaCppTimings {
        // cache_n: `n_prompt_tokens_cache`, prompt tokens reused from the cache.
        cache_n: t.cached_tokens,
        prompt_n,
        prompt_ms,
        // prompt_per_token_ms: `prompt_ms / prompt_n`.
        prompt_per_token_ms: per_token(prompt_n, prompt_ms),
        // prompt_per_second: `prompt_n` per second of `prompt_ms`.
        prompt_per_second: per_second(prompt_n, prompt_ms),
        predicted_n,
        predicted_ms,
        // predicted_per_token_ms: `predicted_ms / predicted_n`.
        predicted_per_token_ms: per_token(predicted_n, predicted_ms),
        // predicted_per_second: `predicted_n` per second of `predicted_ms`.
        predicted_per_second: per_second(predicted_n, predicted_ms),
    }
}

/// Submits a request and starts its task. Returns its output channel and cancel flag.
pub fn launch(
    st: &AppState,
    info: RequestInfo,
    prompt: Vec<u32>,
    opts: &ValidOptions,
    parent: &Context,
) -> Result<(mpsc::UnboundedReceiver<Out>, Arc<AtomicBool>), ApiError> {
    let scope = super::http_scope();
    let server = scope.as_ref().map(|s| s.server.clone()).unwrap_or_default();
    // From here on the request has its own span and log line, whatever happens.
    if let Some(s) = &scope {
        s.mark_recorded();
    }
    let trace = RequestTrace::start(
        Arc::clone(&st.telemetry.tracer),
        st.anchor,
        info.clone(),
        parent,
        st.cfg.trace_content,
        &server,
    );
    let cancel = Arc::new(AtomicBool::new(false));
    let prompt_tokens = prompt.len();
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
            let refusal = Refusal {
                id: info.id.clone(),
                operation: info.operation,
                response_model: info.response_model.clone(),
                session: info.session.clone(),
                received: info.received,
                refused: Instant::now(),
                error_type: api.label(),
                message: api.message.clone(),
            };
            trace.refuse(api.label(), &api.message, refusal.refused);
            log_refused(&refusal, api.status.as_u16());
            return Err(api);
        }
    };
    let (tx, out) = mpsc::unbounded_channel();
    let progress = st.cfg.progress_interval;
    let flag = Arc::clone(&cancel);
    tokio::spawn(run(trace, rx, tx, flag, progress, info, prompt_tokens));
    Ok((out, cancel))
}

async fn run(
    mut trace: RequestTrace,
    mut rx: mpsc::UnboundedReceiver<Event>,
    tx: mpsc::UnboundedSender<Out>,
    cancel: Arc<AtomicBool>,
    progress: Duration,
    info: RequestInfo,
    prompt_tokens: usize,
) {
    let mut tick = tokio::time::interval(if progress.is_zero() {
        Duration::from_secs(3600)
    } else {
        progress
    });
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    tick.tick().await;
    // What this task has seen of the request, for the case where the engine loses it.
    let mut seen = RequestTimings::new(info.received, prompt_tokens);
    let mut group = 0;
    loop {
        tokio::select! {
            ev = rx.recv() => {
                let ev = match ev {
                    Some(ev) => ev,
                    None => {
                        // The step loop went away without finishing the request: it still
                        // gets its span, its log line and an error answer, with what is known.
                        seen.mark_finished(Instant::now());
                        Event::Done(Box::new(Completion {
                            finish_reason: FinishReason::Error(EngineError::Lost),
                            tokens: Vec::new(),
                            tail_text: String::new(),
                            timings: std::mem::replace(
                                &mut seen,
                                RequestTimings::new(info.received, prompt_tokens),
                            ),
                            group,
                        }))
                    }
                };
                trace.on_event(&ev);
                match ev {
                    Event::Admitted { at, placement } => {
                        seen.mark_admitted(at);
                        group = placement.group;
                    }
                    Event::Token { text, generated, at, .. } => {
                        if seen.admitted.is_some() {
                            seen.mark_token(at);
                        }
                        let gone = tx.send(Out::Delta { text, generated }).is_err();
                        cancel.fetch_or(gone, Ordering::Relaxed);
                    }
                    Event::Done(c) => {
                        log_finished(&info, &trace.trace_id(), &c);
                        let (usage, timings) = usage_of(&c);
                        let error = match &c.finish_reason {
                            FinishReason::Error(e) => Some(ApiError::from(e)),
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

/// One structured log line per finished request. A value the request never had is left out
/// of the line, never written as zero.
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
    tracing::info!(
        target: "slotlight::request",
        request_id = %info.id,
        session_id = info.session.as_deref(),
        trace_id = %trace_id,
        operation = info.operation,
        status = c.finish_reason.status(),
        finish_reason = c.finish_reason.as_str(),
        error_type = c.finish_reason.error_type(),
        prompt_tokens = t.prompt_tokens,
        cached_tokens = t.cached_tokens,
        prefilled_tokens = t.prefilled_tokens,
        completion_tokens = t.generated_tokens,
        queue_ms = u.queue_ms,
        prefill_ms = u.prefill_ms,
        ttft_ms = u.ttft_ms,
        decode_ms = u.decode_ms,
        generation_ms = u.generation_ms,
        decode_tps = u.decode_tps,
        e2e_ms = u.e2e_ms,
        group = c.group,
        legs = %legs,
        "Request.Finished"
    );
}

/// One structured log line per refused request (status `refused`): what is known of it, the
/// HTTP status and the `error.type`.
pub fn log_refused(r: &Refusal, http_status: u16) {
    tracing::info!(
        target: "slotlight::request",
        request_id = %r.id,
        session_id = r.session.as_deref(),
        operation = r.operation,
        status = slotlight_otel::attr::value::STATUS_REFUSED,
        error_type = r.error_type,
        http_status,
        e2e_ms = r.refused.saturating_duration_since(r.received).as_secs_f64() * 1000.0,
        message = %r.message,
        "Request.Refused"
    );
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use opentelemetry::KeyValue;
    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::trace::{
        SdkTracerProvider, SimpleSpanProcessor, SpanData, SpanExporter,
    };
    use slotlight_otel::attr;

    use super::*;
    use crate::scheduler::Placement;
    use crate::server::error::ErrorKind;
    use crate::server::trace::{RequestedParams, ServerAddress};
    use crate::telemetry::Telemetry;
    use crate::timing::{PathKind, TimeAnchor};

    #[derive(Debug, Clone, Default)]
    struct Memory(Arc<Mutex<Vec<SpanData>>>);

    impl SpanExporter for Memory {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            self.0.lock().expect("lock").extend(batch);
            Ok(())
        }
    }

    fn info(received: Instant) -> RequestInfo {
        RequestInfo {
            id: "chatcmpl-lost".into(),
            operation: slotlight_otel::span::OPERATION_CHAT,
            request_model: "m".into(),
            response_model: "m".into(),
            session: Some("s-lost".into()),
            max_tokens: 8,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            seed: None,
            stream: false,
            requested: RequestedParams::default(),
            received,
            prompt_text: None,
        }
    }

    /// The step loop goes away after admitting the request (it panicked or was dropped): the
    /// request still ends with an error answer, a request span of status `error` with what was
    /// known, and nothing it never had written as zero.
    #[tokio::test]
    async fn a_request_the_engine_loses_is_answered_and_recorded() {
        let mem = Memory::default();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(SimpleSpanProcessor::new(mem.clone()))
            .build();
        let telemetry = Telemetry::with_provider(provider, "t".into());
        let received = Instant::now();
        let trace = RequestTrace::start(
            Arc::clone(&telemetry.tracer),
            TimeAnchor::now(),
            info(received),
            &Context::new(),
            false,
            &ServerAddress::default(),
        );
        let (events, rx) = mpsc::unbounded_channel();
        let (tx, mut out) = mpsc::unbounded_channel();
        let placement = Placement {
            path: PathKind::Solo,
            group: 0,
            slot: None,
        };
        events
            .send(Event::Admitted {
                at: received + Duration::from_millis(1),
                placement,
            })
            .expect("send");
        drop(events);
        let cancel = Arc::new(AtomicBool::new(false));
        run(trace, rx, tx, cancel, Duration::ZERO, info(received), 5).await;
        let Some(Out::Done(f)) = out.recv().await else {
            panic!("an answer");
        };
        let e = f.error.expect("an error answer");
        assert_eq!(e.error, ErrorKind::Internal);
        assert_eq!(f.finish_reason, "error");
        let u = &f.usage;
        assert_eq!(u.prompt_tokens, 5);
        assert_eq!(u.timings.queue_ms, Some(1.0));
        assert_eq!((u.timings.ttft_ms, u.timings.decode_ms), (None, None));
        let spans = mem.0.lock().expect("lock").clone();
        let root = spans
            .iter()
            .find(|s| slotlight_otel::span::is_request_span_name(&s.name))
            .expect("the request span");
        let get = |k: &str| {
            root.attributes
                .iter()
                .find(|kv: &&KeyValue| kv.key.as_str() == k)
                .map(|kv| kv.value.as_str().into_owned())
        };
        assert_eq!(get(attr::REQUEST_STATUS).as_deref(), Some("error"));
        assert_eq!(get(attr::ERROR_TYPE).as_deref(), Some("internal"));
        assert_eq!(get(attr::USAGE_TTFT_MS), None);
        assert!(get(attr::USAGE_QUEUE_MS).is_some());
    }
}
