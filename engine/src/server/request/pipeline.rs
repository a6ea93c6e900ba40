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
use tracing::Instrument as _;

use crate::metrics::RequestMetrics;
use crate::replies::{ReplyKey, ReplyMemory};
use crate::sampling::TokenLogprobs;
use crate::scheduler::{Completion, EngineError, Event, FinishReason, PromptProgress};
use crate::server::error::ApiError;
use crate::server::request::content::OutputMessage;
use crate::server::request::outcome::{ApiFinishReason, RequestOutcome};
use crate::server::request::reasoning::{ReasoningSplitter, ReasoningStart};
use crate::server::request::record::{self, Refused};
use crate::server::request::session::{SessionKey, TurnSession};
use crate::server::request::tools::Shaper;
use crate::server::request::tools::ToolCall;
use crate::server::request::trace::{RequestTrace, ServerAddress};
use crate::server::request::{RequestMeta, ValidRequest};
use crate::server::state::AppState;
use crate::timing::RequestTimings;

/// JSON has no infinities: an impossible token's log-probability is reported as this (vLLM
/// does the same).
pub const MIN_LOGPROB: f32 = -9999.0;

/// A log-probability as every door writes it: finite, at least [`MIN_LOGPROB`].
pub fn finite_logprob(lp: f32) -> f32 {
    if lp.is_finite() {
        lp.max(MIN_LOGPROB)
    } else {
        MIN_LOGPROB
    }
}

/// What the HTTP side receives.
#[derive(Debug)]
pub enum Out {
    /// Content for one choice (possibly empty), with the log-probabilities of the tokens
    /// generated since its last delta.
    Delta {
        /// The index of the choice the event belongs to.
        choice: usize,
        /// Content to show now.
        text: String,
        /// Reasoning to show now (`delta.reasoning_content`; empty without).
        reasoning: String,
        /// Tokens generated so far, over all choices.
        generated: usize,
        /// Log-probabilities of the tokens this delta covers (when asked for).
        logprobs: Vec<TokenLogprobs>,
    },
    /// A chunk of the request's prefill ran (with `return_progress` on a stream only): where
    /// the prompt's prefill stands.
    PromptProgress(PromptProgress),
    /// The prompt's reuse is known (its prefill began; sent once, for every request): of its
    /// positions, `cached` came from the KV cache. Anthropic's `message_start` waits for it.
    PromptReused {
        /// Prompt positions reused from the KV cache.
        cached: usize,
    },
    /// One choice finished.
    ChoiceDone(Box<ChoiceEnd>),
    /// The request finished (after every choice), with its outcome.
    Done(Box<RequestOutcome>),
}

/// The end of one choice.
#[derive(Debug, Clone)]
pub struct ChoiceEnd {
    /// The index of the choice the event belongs to.
    pub choice: usize,
    /// OpenAI finish reason (`tool_calls` when the reply is calls).
    pub finish_reason: ApiFinishReason,
    /// Content not yet sent.
    pub text: String,
    /// Reasoning not yet sent.
    pub reasoning: String,
    /// The tool calls found in the reply, with the ids the response and the span give them.
    pub tool_calls: Vec<ToolCall>,
    /// Log-probabilities of tokens not yet sent.
    pub logprobs: Vec<TokenLogprobs>,
    /// Every token id the choice generated, its end-of-sequence token included: the reply as
    /// the KV cache holds it (a stored response continues from these, never from a
    /// re-rendering of its text).
    pub tokens: Vec<u32>,
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

/// A valid request on its way to the engine: its id, its session key (if the client gave
/// one) and its arrival.
pub struct Pending {
    /// Request id (also the response id).
    pub id: String,
    /// The client's session key; without one the engine looks for the session the prompt
    /// continues.
    pub key: Option<SessionKey>,
    /// Arrival at the HTTP layer.
    pub received: Instant,
    /// The request itself.
    pub request: ValidRequest,
}

/// A request the engine took: what it is, its output channel and its cancel flag.
pub type Running = (
    Arc<RequestMeta>,
    mpsc::UnboundedReceiver<Out>,
    Arc<AtomicBool>,
);

/// Submits a request and starts its task. Returns the request as the engine placed it (its
/// session found, its turn counted), its output channel and cancel flag, or the scheduler's
/// refusal, with the request span already started (the handler records it).
pub fn launch(
    st: &AppState,
    pending: Pending,
    parent: &Context,
    server: &ServerAddress,
) -> Result<Running, Refused> {
    let Pending {
        id,
        key,
        received,
        request,
    } = pending;
    let cancel = Arc::new(AtomicBool::new(false));
    let submitted = st.engine.submit_turn(request.to_engine(
        &id,
        key.as_ref().map(|k| k.id.clone()),
        received,
        Arc::clone(&cancel),
    ));
    let turn = submitted.as_ref().ok().and_then(|s| s.session.clone());
    let meta = Arc::new(RequestMeta {
        id,
        session: TurnSession::of(key, turn),
        received,
        request,
    });
    // From here on the request has its own span and log line, whatever happens.
    let trace = RequestTrace::start(
        &st.telemetry,
        st.anchor,
        Arc::clone(&meta),
        parent,
        st.cfg.trace_content,
        server,
    );
    let rxs = match submitted {
        Ok(s) => s.events,
        Err(e) => {
            return Err(Refused {
                error: ApiError::from(e),
                started: Some(Box::new(trace)),
            });
        }
    };
    let (tx, out) = mpsc::unbounded_channel();
    let progress = st.cfg.progress_interval;
    let flag = Arc::clone(&cancel);
    let metrics = Arc::clone(&st.metrics);
    // The task's log lines carry the request's trace and span ids, and its warnings become
    // events on the request span.
    let span = crate::telemetry::request_span(trace.context(), &meta.id);
    let replies = Arc::clone(st.prompts.replies());
    tokio::spawn(
        run(
            trace,
            rxs,
            tx,
            flag,
            progress,
            Arc::clone(&meta),
            Afterwards { metrics, replies },
        )
        .instrument(span),
    );
    Ok((meta, out, cancel))
}

/// Where a request's task leaves what outlives it: its metrics and its replies' ids.
struct Afterwards {
    metrics: Arc<RequestMetrics>,
    replies: Arc<ReplyMemory>,
}

/// One choice in progress, as the request task sees it.
struct ChoiceState {
    /// Splits reasoning off the text first (thinking templates only).
    reasoning: Option<ReasoningSplitter>,
    /// Then shapes the content (tool calls).
    shaper: Shaper,
    logprobs: Vec<TokenLogprobs>,
    /// Tokens generated so far, as the engine counts them (its latest token event's).
    generated: usize,
    done: Option<Completion>,
    /// The reply as shown, for the request span (with `--trace-content` only).
    output: Option<OutputMessage>,
    /// The reply's content as sent so far (remembered with its ids once it ends).
    shown: String,
}

/// The completion of choice `choice` of `meta` when its channel closed without one. The
/// engine answers even for a sequence it loses (with its own clocks); this covers a channel
/// closed without even that: an error, with no clocks but the arrival.
fn unanswered(choice: usize, meta: &RequestMeta) -> Completion {
    let mut timings = RequestTimings::new(meta.received, meta.request.prompt.len());
    timings.mark_finished(Instant::now());
    Completion {
        finish_reason: FinishReason::Error(EngineError::Lost),
        tokens: Vec::new(),
        tail_text: String::new(),
        timings,
        group: 0,
        choice,
        mask: None,
        speculation: crate::speculation::SpeculationMode::Off,
    }
}

async fn run(
    mut trace: RequestTrace,
    rxs: Vec<mpsc::UnboundedReceiver<Event>>,
    tx: mpsc::UnboundedSender<Out>,
    cancel: Arc<AtomicBool>,
    progress: Duration,
    meta: Arc<RequestMeta>,
    after: Afterwards,
) {
    let Afterwards { metrics, replies } = after;
    let tools = meta.request.tools.as_ref();
    let reasoning: Option<ReasoningStart> = meta.request.reasoning;
    let n = rxs.len();
    let mut choices: Vec<ChoiceState> = (0..n)
        .map(|_| ChoiceState {
            reasoning: reasoning.map(ReasoningSplitter::new),
            shaper: Shaper::new(tools),
            logprobs: Vec::new(),
            generated: 0,
            done: None,
            output: trace.records_content().then(OutputMessage::default),
            shown: String::new(),
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
    // Reasoning tokens over the choices (`None` without reasoning parsing).
    let mut reasoning_tokens = reasoning.map(|_| 0usize);
    let mut reasons = vec![ApiFinishReason::Error; n];
    // The prompt's prefill is choice 0's: the other choices fork from it.
    let progress_of = meta.request.opts.return_progress.then_some(0);
    let mut reuse_told = false;
    while finished < n {
        tokio::select! {
            item = events.next() => {
                let Some((i, ev)) = item else { break };
                let ev = match ev {
                    Some(ev) => ev,
                    // The step loop went away without finishing this choice: it still gets
                    // its span, its log line and an error answer, with what is known.
                    None if choices[i].done.is_none() => Event::Done(Box::new(unanswered(i, &meta))),
                    None => continue,
                };
                trace.on_event(i, &ev);
                match ev {
                    Event::Token { text, logprobs, generated, .. } => {
                        let c = &mut choices[i];
                        c.generated = generated;
                        if let Some(lp) = logprobs {
                            c.logprobs.push(*lp);
                        }
                        let (thought, content) = match c.reasoning.as_mut() {
                            Some(r) => {
                                let s = r.push_token(&text);
                                (s.reasoning, s.content)
                            }
                            None => (String::new(), text),
                        };
                        let shown = c.shaper.push(&content);
                        c.shown.push_str(&shown);
                        if let Some(o) = c.output.as_mut() {
                            o.push(&thought, &shown);
                        }
                        let lps = if shown.is_empty() && thought.is_empty() {
                            Vec::new()
                        } else {
                            std::mem::take(&mut c.logprobs)
                        };
                        let generated = choices.iter().map(|c| c.generated).sum();
                        let gone = tx
                            .send(Out::Delta {
                                choice: i,
                                text: shown,
                                reasoning: thought,
                                generated,
                                logprobs: lps,
                            })
                            .is_err();
                        cancel.fetch_or(gone, Ordering::Relaxed);
                    }
                    Event::PrefillChunk(rec) if i == 0 => {
                        if !reuse_told {
                            reuse_told = true;
                            let gone = tx.send(Out::PromptReused { cached: rec.cached }).is_err();
                            cancel.fetch_or(gone, Ordering::Relaxed);
                        }
                        if progress_of == Some(i) {
                            let gone = tx.send(Out::PromptProgress(PromptProgress::from(&rec))).is_err();
                            cancel.fetch_or(gone, Ordering::Relaxed);
                        }
                    }
                    Event::Done(c) => {
                        let state = &mut choices[i];
                        let shaper = std::mem::replace(&mut state.shaper, Shaper::new(None));
                        // Reasoning comes off first; tool calls are parsed in the content.
                        let (thought, tail) = match state.reasoning.take() {
                            Some(r) => {
                                let (s, n) = r.finish(&c.tail_text);
                                if let Some(total) = reasoning_tokens.as_mut() {
                                    *total += n;
                                }
                                (s.reasoning, s.content)
                            }
                            None => (String::new(), c.tail_text.clone()),
                        };
                        let (text, calls) = shaper.finish(&tail);
                        let reason = ApiFinishReason::of(&c.finish_reason, !calls.is_empty());
                        reasons[i] = reason;
                        tool_calls += calls.len();
                        let calls: Vec<ToolCall> = calls
                            .iter()
                            .map(|c| ToolCall::new(c, meta.request.api.tool_call_prefix()))
                            .collect();
                        if let Some(mut o) = state.output.take() {
                            o.push(&thought, &text);
                            o.finish(&calls, reason);
                            trace.record_output(i, o);
                        }
                        if !matches!(reason, ApiFinishReason::Error | ApiFinishReason::Cancelled) {
                            let whole = std::mem::take(&mut state.shown) + &text;
                            let sent_calls = calls
                                .iter()
                                .map(|c| {
                                    (
                                        c.function.name.clone(),
                                        serde_json::Value::String(c.function.arguments.clone()),
                                    )
                                })
                                .collect();
                            let ids = calls.iter().map(|c| c.id.clone()).collect();
                            replies.remember(
                                ReplyKey::new(&whole, sent_calls).with_call_ids(ids),
                                &c.tokens,
                            );
                        }
                        let _ = tx.send(Out::ChoiceDone(Box::new(ChoiceEnd {
                            choice: i,
                            finish_reason: reason,
                            text,
                            reasoning: thought,
                            tool_calls: calls,
                            logprobs: std::mem::take(&mut state.logprobs),
                            tokens: c.tokens.clone(),
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
        .map(|(i, c)| c.done.unwrap_or_else(|| unanswered(i, &meta)))
        .collect();
    let mut outcome = RequestOutcome::of(meta.received, &done, reasons, tool_calls);
    outcome.set_reasoning_tokens(reasoning_tokens);
    {
        // Under the request span's context, so that its OTLP log record carries its ids.
        let _cx = trace.context().clone().attach();
        record::finished(&metrics, &meta, &trace.trace_id(), &outcome);
    }
    trace.finish(&outcome);
    outcome.span = Some(trace.context().clone());
    let _ = tx.send(Out::Done(Box::new(outcome)));
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use opentelemetry::trace::TraceContextExt as _;
    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::trace::{
        SdkTracerProvider, SimpleSpanProcessor, SpanData, SpanExporter,
    };
    use slotlight_otel::attr;

    use super::*;
    use crate::scheduler::Placement;
    use crate::server::error::ErrorKind;
    use crate::server::request::reasoning::ReasoningStart;
    use crate::server::request::tools::{ParsedCall, ToolSetup};
    use crate::server::request::{Api, ValidOptions, ValidRequest};
    use crate::telemetry::Telemetry;
    use crate::timing::{PathKind, TimeAnchor};

    #[derive(Debug, Clone, Default)]
    struct Memory(Arc<Mutex<Vec<SpanData>>>);

    /// The request span the in-memory exporter `mem` holds.
    fn request_span(mem: &Memory) -> SpanData {
        let spans = mem.0.lock().expect("lock");
        spans
            .iter()
            .find(|s| slotlight_otel::span::is_request_span_name(&s.name))
            .cloned()
            .expect("the request span")
    }

    /// Attribute `k` of `span`, as a string.
    fn attr_of(span: &SpanData, k: &str) -> Option<String> {
        span.attributes
            .iter()
            .find(|kv| kv.key.as_str() == k)
            .map(|kv| kv.value.as_str().into_owned())
    }

    impl SpanExporter for Memory {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            self.0.lock().expect("lock").extend(batch);
            Ok(())
        }
    }

    /// A chat request of `n` choices that arrived at `received`, with `tools` and reasoning
    /// parsing from `reasoning`.
    fn meta(
        received: Instant,
        n: usize,
        tools: Option<ToolSetup>,
        reasoning: Option<ReasoningStart>,
    ) -> Arc<RequestMeta> {
        Arc::new(RequestMeta {
            id: "chatcmpl-lost".into(),
            session: Some(crate::server::request::session::TurnSession {
                id: "s-lost".into(),
                source: crate::server::request::session::KeySource::Header,
                turn: Some(0),
                extends: None,
                branch: Some(0),
                side_call: false,
            }),
            received,
            request: ValidRequest {
                api: Api::Chat,
                request_model: "m".into(),
                model: "m".into(),
                prompt: vec![1; 5],
                prompt_text: String::new(),
                opts: ValidOptions {
                    max_tokens: 8,
                    sampling: crate::sampling::SamplingParams::default(),
                    stop: crate::stop::StopMatcher::default(),
                    n,
                    stream: false,
                    include_usage: false,
                    continuous_usage: false,
                    user: None,
                    session_hint: None,
                    prompt_cache_key: None,
                    previous_response_id: None,
                    ignore_eos: false,
                    return_progress: false,
                    grammar: None,
                    frequency_penalty_given: None,
                    presence_penalty_given: None,
                    n_given: None,
                    prediction: None,
                },
                logprobs: None,
                echo: false,
                tools,
                constraint: None,
                reasoning,
                content: None,
                tools_skipped: Vec::new(),
                max_tokens_asked: None,
                prediction: None,
                session_ttl: None,
            },
        })
    }

    /// Log output kept in memory.
    #[derive(Clone, Default)]
    struct LogBuf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for LogBuf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("lock").extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The step loop goes away after admitting the request (it panicked or was dropped): the
    /// sequence it let go of answers as lost, with the engine's own clocks (see
    /// `scheduler::sequence`), and the request still ends with an error answer, a request span
    /// of status `error` with those clocks, and nothing it never had written as zero. Its
    /// `Request.Failed` warning carries the request span's trace and span ids and is an event
    /// on the request span.
    #[tokio::test]
    async fn a_request_the_engine_loses_is_answered_and_recorded() {
        use tracing_subscriber::prelude::*;
        let logs = LogBuf::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_subscriber::EnvFilter::new("info"))
            .with(crate::telemetry::RequestEvents)
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(false)
                    .with_writer(move || writer.clone()),
            );
        let _default = tracing::subscriber::set_default(subscriber);
        let mem = Memory::default();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(SimpleSpanProcessor::new(mem.clone()))
            .build();
        let telemetry = Telemetry::with_provider(provider, "t".into());
        let received = Instant::now();
        let one = meta(received, 1, None, None);
        let trace = RequestTrace::start(
            &telemetry,
            TimeAnchor::now(),
            Arc::clone(&one),
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
        let admitted = received + Duration::from_millis(1);
        events
            .send(Event::Admitted {
                at: admitted,
                placement,
            })
            .expect("send");
        // What a dropped sequence sends: its own clocks, admitted and never a token.
        let mut timings = RequestTimings::new(received, 5);
        timings.mark_admitted(admitted);
        timings.mark_finished(received + Duration::from_millis(2));
        events
            .send(Event::Done(Box::new(Completion {
                finish_reason: FinishReason::Error(EngineError::Lost),
                tokens: Vec::new(),
                tail_text: String::new(),
                timings,
                group: 0,
                choice: 0,
                mask: None,
                speculation: crate::speculation::SpeculationMode::Off,
            })))
            .expect("send");
        drop(events);
        let cancel = Arc::new(AtomicBool::new(false));
        let metrics = Arc::new(RequestMetrics::default());
        let span = crate::telemetry::request_span(trace.context(), "chatcmpl-lost");
        let root_ids = trace.context().span().span_context().clone();
        run(
            trace,
            vec![rx],
            tx,
            cancel,
            Duration::ZERO,
            one,
            Afterwards {
                metrics: Arc::clone(&metrics),
                replies: Arc::default(),
            },
        )
        .instrument(span)
        .await;
        let mut reason = None;
        let f = loop {
            match out.recv().await {
                Some(Out::ChoiceDone(c)) => reason = Some(c.finish_reason),
                Some(Out::Done(f)) => break f,
                Some(Out::Delta { .. } | Out::PromptProgress(_) | Out::PromptReused { .. }) => {}
                None => panic!("an answer"),
            }
        };
        let e = f.api_error().expect("an error answer");
        assert_eq!(e.error, ErrorKind::Internal);
        assert_eq!(reason.map(ApiFinishReason::as_str), Some("error"));
        let u = &f.usage;
        assert_eq!(u.prompt_tokens, 5);
        assert_eq!(u.extras.timings.queue_ms, Some(1.0));
        assert_eq!(
            (u.extras.timings.ttft_ms, u.extras.timings.decode_ms),
            (None, None)
        );
        let root = request_span(&mem);
        let get = |k: &str| attr_of(&root, k);
        assert_eq!(get(attr::REQUEST_STATUS).as_deref(), Some("error"));
        assert_eq!(get(attr::ERROR_TYPE).as_deref(), Some("internal"));
        assert_eq!(get(attr::USAGE_TTFT_MS), None);
        assert!(get(attr::USAGE_QUEUE_MS).is_some());
        // Its duration is observed with its error type; it had no first token.
        let m = metrics.snapshot();
        let series = &m.series[0];
        assert_eq!(series.ttft.count, 0);
        assert_eq!(series.queue.count, 1);
        let durations: Vec<_> = series.duration.iter().map(|(e, h)| (*e, h.count)).collect();
        assert_eq!(durations, vec![(Some("internal"), 1)]);
        // The warning: an event on the request span, and a log line with its ids.
        let event = root
            .events
            .iter()
            .find(|e| e.name == "Request.Failed")
            .expect("the warning is an event on the request span");
        let event_attr = |k: &str| {
            event
                .attributes
                .iter()
                .find(|kv| kv.key.as_str() == k)
                .map(|kv| kv.value.as_str().into_owned())
        };
        assert_eq!(event_attr(attr::EVENT_LEVEL).as_deref(), Some("WARN"));
        assert_eq!(event_attr("error_type").as_deref(), Some("internal"));
        assert_eq!(
            root.events.len(),
            1,
            "info lines (Request.Finished) are not events"
        );
        let text = String::from_utf8(logs.0.lock().expect("lock").clone()).expect("utf-8");
        let line = text
            .lines()
            .find(|l| l.contains("Request.Failed"))
            .unwrap_or_else(|| panic!("no Request.Failed line in {text}"));
        assert!(
            line.contains(&format!("trace_id={}", root_ids.trace_id())),
            "{line}"
        );
        assert!(
            line.contains(&format!("span_id={}", root_ids.span_id())),
            "{line}"
        );
        assert!(
            text.lines()
                .any(|l| l.contains("Request.Finished") && l.contains("span_id=")),
            "every line of the request's task carries its ids: {text}"
        );
        a_channel_closed_without_an_answer_is_an_error().await;
    }

    /// A choice whose channel closes without even the engine's lost answer still gets an
    /// error answer and an `error` request span, with no clocks but its arrival: nothing it
    /// never had is written, not even as zero. (Run by the test above, under its log
    /// subscriber: the two write the same warning.)
    async fn a_channel_closed_without_an_answer_is_an_error() {
        let mem = Memory::default();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(SimpleSpanProcessor::new(mem.clone()))
            .build();
        let telemetry = Telemetry::with_provider(provider, "t".into());
        let one = meta(Instant::now(), 1, None, None);
        let trace = RequestTrace::start(
            &telemetry,
            TimeAnchor::now(),
            Arc::clone(&one),
            &Context::new(),
            false,
            &ServerAddress::default(),
        );
        let (events, rx) = mpsc::unbounded_channel::<Event>();
        drop(events);
        let (tx, mut out) = mpsc::unbounded_channel();
        run(
            trace,
            vec![rx],
            tx,
            Arc::new(AtomicBool::new(false)),
            Duration::ZERO,
            one,
            Afterwards {
                metrics: Arc::new(RequestMetrics::default()),
                replies: Arc::default(),
            },
        )
        .await;
        let outcome = loop {
            match out.recv().await {
                Some(Out::Done(o)) => break o,
                Some(_) => {}
                None => panic!("an outcome"),
            }
        };
        let e = outcome.api_error().expect("an error answer");
        assert_eq!(e.error, ErrorKind::Internal);
        assert_eq!(outcome.usage.extras.timings.queue_ms, None);
        let root = request_span(&mem);
        assert_eq!(
            attr_of(&root, attr::REQUEST_STATUS).as_deref(),
            Some("error")
        );
        assert_eq!(attr_of(&root, attr::USAGE_QUEUE_MS), None);
    }

    /// Regression test for issue 22: with `n` = 2, one choice stops and the client leaves
    /// before the other ends. The log line used to say `ok` with no `error_type` while the
    /// request span and the duration histogram said `cancelled`; now the outcome is decided
    /// once and every record says `cancelled`, `error_type` `cancelled`.
    #[tokio::test]
    async fn one_stopped_and_one_cancelled_choice_are_recorded_alike() {
        use tracing_subscriber::prelude::*;
        let logs = LogBuf::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_subscriber::EnvFilter::new("info"))
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(false)
                    .with_writer(move || writer.clone()),
            );
        let _default = tracing::subscriber::set_default(subscriber);
        let mem = Memory::default();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(SimpleSpanProcessor::new(mem.clone()))
            .build();
        let telemetry = Telemetry::with_provider(provider, "t".into());
        let received = Instant::now();
        let two = meta(received, 2, None, None);
        let trace = RequestTrace::start(
            &telemetry,
            TimeAnchor::now(),
            Arc::clone(&two),
            &Context::new(),
            false,
            &ServerAddress::default(),
        );
        let placement = Placement {
            path: PathKind::Solo,
            group: 0,
            slot: None,
        };
        let at = |ms| received + Duration::from_millis(ms);
        let mut rxs = Vec::new();
        for (choice, reason) in [FinishReason::Stop, FinishReason::Cancelled]
            .into_iter()
            .enumerate()
        {
            let (events, rx) = mpsc::unbounded_channel();
            let mut t = RequestTimings::new(received, 5);
            t.mark_admitted(at(1));
            t.start_leg(PathKind::Solo, 0, None, at(1));
            t.add_step(Duration::from_millis(1), 1, true);
            t.mark_token(at(2), false);
            t.mark_finished(at(3 + choice as u64));
            let send = |ev| events.send(ev).expect("send");
            send(Event::Admitted {
                at: at(1),
                placement,
            });
            send(Event::Token {
                id: 7,
                text: "x".into(),
                at: at(2),
                generated: 1,
                step_device: Duration::from_millis(1),
                from_prefill: true,
                same_step: false,
                draft: None,
                placement,
                logprobs: None,
            });
            send(Event::Done(Box::new(Completion {
                finish_reason: reason,
                tokens: vec![7],
                tail_text: String::new(),
                timings: t,
                group: 0,
                choice,
                mask: None,
                speculation: crate::speculation::SpeculationMode::Off,
            })));
            rxs.push(rx);
        }
        let (tx, mut out) = mpsc::unbounded_channel();
        let metrics = Arc::new(RequestMetrics::default());
        run(
            trace,
            rxs,
            tx,
            Arc::new(AtomicBool::new(false)),
            Duration::ZERO,
            two,
            Afterwards {
                metrics: Arc::clone(&metrics),
                replies: Arc::default(),
            },
        )
        .await;
        let outcome = loop {
            match out.recv().await {
                Some(Out::Done(o)) => break o,
                Some(_) => {}
                None => panic!("an outcome"),
            }
        };
        // The response: its client is gone, so it gets no error; the outcome says cancelled.
        assert_eq!(outcome.status.as_str(), attr::value::STATUS_CANCELLED);
        assert!(outcome.api_error().is_none());
        assert_eq!(
            outcome.api_finish_reasons,
            vec![ApiFinishReason::Stop, ApiFinishReason::Cancelled]
        );
        // The request span.
        let root = request_span(&mem);
        let get = |k: &str| attr_of(&root, k);
        assert_eq!(get(attr::REQUEST_STATUS).as_deref(), Some("cancelled"));
        assert_eq!(get(attr::ERROR_TYPE).as_deref(), Some("cancelled"));
        // The log line.
        let text = String::from_utf8(logs.0.lock().expect("lock").clone()).expect("utf-8");
        let line = text
            .lines()
            .find(|l| l.contains("Request.Finished"))
            .unwrap_or_else(|| panic!("no Request.Finished line in {text}"));
        assert!(line.contains("status=\"cancelled\""), "{line}");
        assert!(line.contains("error_type=\"cancelled\""), "{line}");
        assert!(line.contains("finish_reason=\"stop,cancelled\""), "{line}");
        assert!(
            !text.contains("Request.Failed"),
            "a cancellation is no engine failure: {text}"
        );
        // The engine's metrics: one duration, with the same error type, and no ttft (only
        // successful requests have one).
        let m = metrics.snapshot();
        let series = &m.series[0];
        let durations: Vec<_> = series.duration.iter().map(|(e, h)| (*e, h.count)).collect();
        assert_eq!(durations, vec![(Some("cancelled"), 1)]);
        assert_eq!(series.ttft.count, 0);
    }
    /// What the request task sent for one choice whose tokens have the texts `texts`.
    struct Driven {
        reasoning: String,
        content: String,
        deltas: Vec<(String, String)>,
        calls: Vec<ParsedCall>,
        finish_reason: ApiFinishReason,
        outcome: RequestOutcome,
        span: SpanData,
    }

    async fn drive(
        texts: &[&str],
        reasoning: Option<ReasoningStart>,
        tools: Option<ToolSetup>,
    ) -> Driven {
        let mem = Memory::default();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(SimpleSpanProcessor::new(mem.clone()))
            .build();
        let telemetry = Telemetry::with_provider(provider, "t".into());
        let received = Instant::now();
        let one = meta(received, 1, tools, reasoning);
        let trace = RequestTrace::start(
            &telemetry,
            TimeAnchor::now(),
            Arc::clone(&one),
            &Context::new(),
            false,
            &ServerAddress::default(),
        );
        let placement = Placement {
            path: PathKind::Solo,
            group: 0,
            slot: None,
        };
        let at = |ms| received + Duration::from_millis(ms);
        let (events, rx) = mpsc::unbounded_channel();
        let send = |ev| events.send(ev).expect("send");
        send(Event::Admitted {
            at: at(1),
            placement,
        });
        let mut t = RequestTimings::new(received, 5);
        t.mark_admitted(at(1));
        t.start_leg(PathKind::Solo, 0, None, at(1));
        for (k, text) in texts.iter().enumerate() {
            let k64 = u64::try_from(k).expect("small");
            t.add_step(Duration::from_millis(1), 1, k == 0);
            t.mark_token(at(2 + k64), k > 0);
            send(Event::Token {
                id: 7,
                text: (*text).to_string(),
                at: at(2 + k64),
                generated: k + 1,
                step_device: Duration::from_millis(1),
                from_prefill: k == 0,
                same_step: false,
                draft: None,
                placement,
                logprobs: None,
            });
        }
        t.mark_finished(at(100));
        send(Event::Done(Box::new(Completion {
            finish_reason: FinishReason::Stop,
            tokens: vec![7; texts.len()],
            tail_text: String::new(),
            timings: t,
            group: 0,
            choice: 0,
            mask: None,
            speculation: crate::speculation::SpeculationMode::Off,
        })));
        drop(events);
        let (tx, mut out) = mpsc::unbounded_channel();
        run(
            trace,
            vec![rx],
            tx,
            Arc::new(AtomicBool::new(false)),
            Duration::ZERO,
            one,
            Afterwards {
                metrics: Arc::new(RequestMetrics::default()),
                replies: Arc::default(),
            },
        )
        .await;
        let (mut reasoning, mut content, mut deltas) = (String::new(), String::new(), Vec::new());
        let mut end = None;
        let outcome = loop {
            match out.recv().await {
                Some(Out::Delta {
                    text, reasoning: r, ..
                }) => {
                    reasoning.push_str(&r);
                    content.push_str(&text);
                    deltas.push((r, text));
                }
                Some(Out::ChoiceDone(e)) => {
                    reasoning.push_str(&e.reasoning);
                    content.push_str(&e.text);
                    deltas.push((e.reasoning.clone(), e.text.clone()));
                    end = Some(e);
                }
                Some(Out::Done(o)) => break *o,
                Some(Out::PromptProgress(_) | Out::PromptReused { .. }) => {}
                None => panic!("an outcome"),
            }
        };
        let end = end.expect("the choice ended");
        Driven {
            reasoning,
            content,
            deltas,
            calls: end
                .tool_calls
                .iter()
                .map(|c| ParsedCall {
                    name: c.function.name.clone(),
                    arguments: c.function.arguments.clone(),
                })
                .collect(),
            finish_reason: end.finish_reason,
            outcome,
            span: request_span(&mem),
        }
    }

    /// A thinking template's reply through the request task: the reasoning comes apart from
    /// the content, tags split across tokens never show in a delta, and the reasoning tokens
    /// (tags included) reach `usage` and the request span.
    #[tokio::test]
    async fn reasoning_is_split_off_the_reply_and_counted() {
        let texts = [
            "<th",
            "ink>\n",
            "Two",
            " and two.",
            "\n</",
            "think",
            ">\n\n",
            "Four",
            ".",
        ];
        let d = drive(&texts, Some(ReasoningStart::MayOpen), None).await;
        assert_eq!(d.reasoning, "Two and two.");
        assert_eq!(d.content, "Four.");
        for (r, c) in &d.deltas {
            assert!(
                !r.contains(['<', '>']) && !c.contains(['<', '>']),
                "{r:?} {c:?}"
            );
        }
        // `<th` to `>\n\n`: seven tokens hold the block and its tags.
        assert_eq!(d.outcome.reasoning_tokens(), Some(7));
        let usage = serde_json::to_value(&d.outcome.usage).expect("json");
        assert_eq!(
            usage["completion_tokens_details"],
            serde_json::json!({"reasoning_tokens": 7})
        );
        assert_eq!(
            attr_of(&d.span, attr::GEN_AI_USAGE_REASONING_OUTPUT_TOKENS).as_deref(),
            Some("7")
        );
        // The same tokens without reasoning parsing (a template without `<think>`): the text
        // as it came, and no reasoning count anywhere.
        let plain = drive(&texts, None, None).await;
        assert_eq!(plain.reasoning, "");
        assert_eq!(plain.content, texts.concat());
        assert_eq!(plain.outcome.reasoning_tokens(), None);
        let usage = serde_json::to_value(&plain.outcome.usage).expect("json");
        assert!(usage.get("completion_tokens_details").is_none(), "{usage}");
        assert_eq!(
            attr_of(&plain.span, attr::GEN_AI_USAGE_REASONING_OUTPUT_TOKENS),
            None
        );
    }

    /// Tool calls are parsed in the content only: a `<tool_call>` inside the reasoning is
    /// reasoning text, the one after `</think>` is a call.
    #[tokio::test]
    async fn tool_calls_are_parsed_after_the_reasoning() {
        use crate::server::request::tools::{Tool, ToolChoice, ToolFormat};
        let tools = ToolSetup {
            format: ToolFormat::Hermes,
            choice: ToolChoice::Auto,
            tools: vec![Tool {
                name: "f".into(),
                description: None,
                parameters: serde_json::json!({"type": "object", "properties": {}}),
            }],
            parallel: true,
        };
        let texts = [
            "call <tool_call>",
            " maybe",
            "</think>",
            "\n\n",
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
        ];
        let d = drive(&texts, Some(ReasoningStart::Open), Some(tools)).await;
        assert_eq!(d.reasoning, "call <tool_call> maybe");
        assert_eq!(d.content, "");
        assert_eq!(
            d.calls,
            vec![ParsedCall {
                name: "f".into(),
                arguments: "{}".into()
            }]
        );
        assert_eq!(d.finish_reason.as_str(), "tool_calls");
        assert_eq!(d.outcome.reasoning_tokens(), Some(3));
    }
}
