//! One request's spans, built from the events on its own channel.
//!
//! Every timestamp comes from the request's own clocks (the instants the step loop recorded),
//! converted to wall-clock time once, here. The root span is `{operation} {model}`; its
//! children are `slotlight.queue`, one `slotlight.prefill` per prefill, one `slotlight.leg`
//! per leg (each linked to the previous), and `slotlight.decode` windows under each leg.

use std::borrow::Cow;
use std::time::{Duration, Instant};

use opentelemetry::global::BoxedTracer;
use opentelemetry::trace::{Link, SpanContext, SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry::{Array, Context, KeyValue, StringValue, Value};
use slotlight_otel::{attr, span};

use crate::scheduler::{Completion, Event, FinishReason, Placement};
use crate::server::usage::Usage;
use crate::timing::{LegRecord, PathKind, PrefillRecord, TimeAnchor};

/// What the request span says about a request's tools.
#[derive(Debug, Clone)]
pub struct ToolsInfo {
    /// The tools' names.
    pub names: Vec<String>,
    /// `tool_choice`.
    pub choice: &'static str,
    /// The tool-call format.
    pub format: &'static str,
}

/// What the root span needs to know at the start.
#[derive(Debug, Clone)]
pub struct RequestInfo {
    /// Request id (also the response id).
    pub id: String,
    /// `chat` or `text_completion`.
    pub operation: &'static str,
    /// Model asked for.
    pub request_model: String,
    /// Model served.
    pub response_model: String,
    /// Session.
    pub session: Option<String>,
    /// Completion limit.
    pub max_tokens: usize,
    /// Temperature.
    pub temperature: f32,
    /// Top-p.
    pub top_p: f32,
    /// Top-k.
    pub top_k: usize,
    /// Seed.
    pub seed: Option<u64>,
    /// Streaming.
    pub stream: bool,
    /// Arrival.
    pub received: Instant,
    /// Prompt text, only with `--trace-content`.
    pub prompt_text: Option<String>,
    /// Choices (`n`).
    pub n: usize,
    /// The kind of output constraint, when there is one.
    pub constraint: Option<&'static str>,
    /// Whether the output is constrained to JSON.
    pub json_output: bool,
    /// The request's tools, when it has some.
    pub tools: Option<ToolsInfo>,
}

struct Window {
    start: Instant,
    last: Instant,
    tokens: usize,
    device: Duration,
}

struct OpenLeg {
    cx: Context,
    record: LegRecord,
}

/// One choice's spans in progress.
#[derive(Default)]
struct ChoiceTrace {
    leg: Option<OpenLeg>,
    prev_leg: Option<SpanContext>,
    window: Option<Window>,
    window_floor: Option<Instant>,
    generated: usize,
    placement: Option<Placement>,
    completion_text: String,
}

/// The spans of one request in progress.
pub struct RequestTrace {
    tracer: std::sync::Arc<BoxedTracer>,
    anchor: TimeAnchor,
    info: RequestInfo,
    root: Context,
    choices: Vec<ChoiceTrace>,
    first_token: Option<Instant>,
    trace_content: bool,
}

fn kv_i(k: &'static str, v: usize) -> KeyValue {
    KeyValue::new(k, i64::try_from(v).unwrap_or(i64::MAX))
}

fn kv_u(k: &'static str, v: u64) -> KeyValue {
    KeyValue::new(k, i64::try_from(v).unwrap_or(i64::MAX))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

impl RequestTrace {
    /// Starts the request span at the request's arrival, as a child of `parent` (the caller's
    /// `traceparent`, or an empty context).
    pub fn start(
        tracer: std::sync::Arc<BoxedTracer>,
        anchor: TimeAnchor,
        info: RequestInfo,
        parent: &Context,
        trace_content: bool,
    ) -> Self {
        let mut attrs = vec![
            KeyValue::new(attr::GEN_AI_OPERATION_NAME, info.operation),
            KeyValue::new(attr::GEN_AI_PROVIDER_NAME, attr::value::PROVIDER),
            KeyValue::new(attr::GEN_AI_REQUEST_MODEL, info.request_model.clone()),
            kv_i(attr::GEN_AI_REQUEST_MAX_TOKENS, info.max_tokens),
            KeyValue::new(
                attr::GEN_AI_REQUEST_TEMPERATURE,
                f64::from(info.temperature),
            ),
            KeyValue::new(attr::GEN_AI_REQUEST_TOP_P, f64::from(info.top_p)),
            #[allow(clippy::cast_precision_loss)]
            KeyValue::new(attr::GEN_AI_REQUEST_TOP_K, info.top_k as f64),
            KeyValue::new(attr::GEN_AI_REQUEST_STREAM, info.stream),
            KeyValue::new(attr::GEN_AI_RESPONSE_ID, info.id.clone()),
            KeyValue::new(attr::REQUEST_ID, info.id.clone()),
            kv_u(attr::REQUEST_START_TIME, anchor.unix_nanos(info.received)),
        ];
        if let Some(seed) = info.seed {
            attrs.push(kv_u(attr::GEN_AI_REQUEST_SEED, seed));
        }
        if let Some(s) = &info.session {
            attrs.push(KeyValue::new(attr::SESSION_ID, s.clone()));
        }
        if let (true, Some(p)) = (trace_content, &info.prompt_text) {
            attrs.push(KeyValue::new(attr::CONTENT_PROMPT, p.clone()));
        }
        if info.n != 1 {
            attrs.push(kv_i(attr::GEN_AI_REQUEST_CHOICE_COUNT, info.n));
        }
        if info.json_output {
            attrs.push(KeyValue::new(
                attr::GEN_AI_OUTPUT_TYPE,
                attr::value::OUTPUT_TYPE_JSON,
            ));
        }
        if let Some(k) = info.constraint {
            attrs.push(KeyValue::new(attr::CONSTRAINT_KIND, k));
        }
        if let Some(t) = &info.tools {
            attrs.push(KeyValue::new(
                attr::TOOLS_NAMES,
                Value::Array(Array::String(
                    t.names.iter().cloned().map(StringValue::from).collect(),
                )),
            ));
            attrs.push(KeyValue::new(attr::TOOLS_CHOICE, t.choice));
            attrs.push(KeyValue::new(attr::TOOLS_FORMAT, t.format));
        }
        let name = span::request_span_name(info.operation, &info.response_model);
        let root_span = tracer
            .span_builder(Cow::Owned(name))
            .with_kind(SpanKind::Server)
            .with_start_time(anchor.system_time(info.received))
            .with_attributes(attrs)
            .start_with_context(tracer.as_ref(), parent);
        let root = parent.with_span(root_span);
        let n = info.n.max(1);
        Self {
            tracer,
            anchor,
            info,
            root,
            choices: (0..n).map(|_| ChoiceTrace::default()).collect(),
            first_token: None,
            trace_content,
        }
    }

    /// The request span's trace id (hex), for logs.
    pub fn trace_id(&self) -> String {
        self.root.span().span_context().trace_id().to_string()
    }

    fn ids(&self, choice: usize) -> Vec<KeyValue> {
        let mut v = vec![
            KeyValue::new(attr::REQUEST_ID, self.info.id.clone()),
            kv_i(attr::CHOICE_INDEX, choice),
        ];
        if let Some(s) = &self.info.session {
            v.push(KeyValue::new(attr::SESSION_ID, s.clone()));
        }
        v
    }

    fn clocks(&self) -> Vec<KeyValue> {
        let mut v = vec![kv_u(
            attr::REQUEST_START_TIME,
            self.anchor.unix_nanos(self.info.received),
        )];
        if let Some(f) = self.first_token {
            v.push(kv_u(
                attr::REQUEST_FIRST_TOKEN_TIME,
                self.anchor.unix_nanos(f),
            ));
        }
        v
    }

    fn placement_attrs(path: PathKind, group: usize, slot: Option<usize>) -> Vec<KeyValue> {
        let mut v = vec![
            KeyValue::new(attr::LEG_PATH, path.as_str()),
            kv_i(attr::SLOT_GROUP, group),
        ];
        if let Some(s) = slot {
            v.push(kv_i(attr::SLOT_INDEX, s));
        }
        v
    }

    fn child(
        &self,
        name: &'static str,
        parent: &Context,
        start: Instant,
        end: Instant,
        attrs: Vec<KeyValue>,
        links: Vec<Link>,
    ) {
        let mut s = self
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Internal)
            .with_start_time(self.anchor.system_time(start))
            .with_attributes(attrs)
            .with_links(links)
            .start_with_context(self.tracer.as_ref(), parent);
        opentelemetry::trace::Span::end_with_timestamp(
            &mut s,
            self.anchor.system_time(end.max(start)),
        );
    }

    /// Records one event of choice `choice`.
    pub fn on_event(&mut self, choice: usize, ev: &Event) {
        if choice >= self.choices.len() {
            self.choices.resize_with(choice + 1, ChoiceTrace::default);
        }
        match ev {
            Event::Admitted { at, placement } => {
                self.choices[choice].placement = Some(*placement);
                let mut attrs = self.ids(choice);
                attrs.extend(Self::placement_attrs(
                    placement.path,
                    placement.group,
                    placement.slot,
                ));
                self.child(
                    span::QUEUE,
                    &self.root.clone(),
                    self.info.received,
                    *at,
                    attrs,
                    Vec::new(),
                );
            }
            Event::Prefilled(rec) => self.prefill(choice, rec),
            Event::LegStarted(leg) => self.leg_started(choice, leg),
            Event::LegEnded(leg) => self.leg_ended(choice, leg),
            Event::Token {
                at,
                step_device,
                generated,
                text,
                placement,
                ..
            } => {
                self.first_token = Some(self.first_token.map_or(*at, |f| f.min(*at)));
                let trace_content = self.trace_content;
                let c = &mut self.choices[choice];
                c.placement = Some(*placement);
                c.generated = *generated;
                if trace_content {
                    c.completion_text.push_str(text);
                }
                let floor = c
                    .window_floor
                    .or_else(|| c.leg.as_ref().map(|l| l.record.start))
                    .unwrap_or(*at);
                let w = c.window.get_or_insert(Window {
                    start: floor.min(*at),
                    last: *at,
                    tokens: 0,
                    device: Duration::ZERO,
                });
                w.tokens += 1;
                w.device += *step_device;
                w.last = *at;
            }
            Event::Done(c) => {
                if self.trace_content
                    && let Some(ct) = self.choices.get_mut(choice)
                {
                    ct.completion_text.push_str(&c.tail_text);
                }
                self.close_choice(choice);
            }
        }
    }

    fn prefill(&mut self, choice: usize, rec: &PrefillRecord) {
        let mut attrs = self.ids(choice);
        attrs.extend([
            kv_i(attr::PREFILL_PROMPT_TOKENS, rec.prompt_tokens),
            kv_i(attr::PREFILL_CACHED_TOKENS, rec.cached_tokens),
            kv_i(attr::PREFILL_COMPUTED_TOKENS, rec.computed_tokens),
            kv_i(attr::PREFILL_CHUNKS, rec.chunks),
            KeyValue::new(attr::PREFILL_DEVICE_MS, ms(rec.device)),
            KeyValue::new(attr::PREFILL_REASON, rec.reason.as_str()),
        ]);
        self.child(
            span::PREFILL,
            &self.root.clone(),
            rec.start,
            rec.end,
            attrs,
            Vec::new(),
        );
    }

    fn leg_started(&mut self, choice: usize, leg: &LegRecord) {
        self.flush_choice(choice);
        let mut attrs = self.ids(choice);
        attrs.extend(Self::placement_attrs(leg.path, leg.group, leg.slot));
        attrs.extend([
            kv_i(attr::LEG_INDEX, leg.index),
            kv_u(attr::LEG_START_TIME, self.anchor.unix_nanos(leg.start)),
            kv_i(attr::LEG_TOKENS_CARRIED, leg.tokens_carried),
        ]);
        let links = self.choices[choice]
            .prev_leg
            .clone()
            .map(|sc| vec![Link::with_context(sc)])
            .unwrap_or_default();
        let s = self
            .tracer
            .span_builder(span::LEG)
            .with_kind(SpanKind::Internal)
            .with_start_time(self.anchor.system_time(leg.start))
            .with_attributes(attrs)
            .with_links(links)
            .start_with_context(self.tracer.as_ref(), &self.root);
        let cx = self.root.with_span(s);
        let c = &mut self.choices[choice];
        c.window_floor = Some(leg.start);
        c.leg = Some(OpenLeg {
            cx,
            record: leg.clone(),
        });
    }

    fn leg_ended(&mut self, choice: usize, leg: &LegRecord) {
        self.flush_choice(choice);
        let Some(open) = self.choices[choice].leg.take() else {
            return;
        };
        let sp = open.cx.span();
        let mut attrs = vec![
            kv_i(attr::LEG_TOKENS_GENERATED, leg.tokens_generated),
            kv_i(attr::LEG_BATCH_SIZE_MAX, leg.batch_max),
            KeyValue::new(attr::LEG_BATCH_SIZE_MEAN, leg.batch_mean()),
            KeyValue::new(attr::LEG_DEVICE_MS, ms(leg.device)),
        ];
        if let Some(r) = leg.end_reason {
            attrs.push(KeyValue::new(attr::LEG_END_REASON, r.as_str()));
        }
        attrs.extend(self.clocks());
        sp.set_attributes(attrs);
        self.choices[choice].prev_leg = Some(sp.span_context().clone());
        sp.end_with_timestamp(self.anchor.system_time(leg.end.unwrap_or(leg.start)));
    }

    /// Closes every choice's current decode window, if it holds tokens, as a
    /// `slotlight.decode` span.
    pub fn flush_window(&mut self) {
        for i in 0..self.choices.len() {
            self.flush_choice(i);
        }
    }

    fn flush_choice(&mut self, choice: usize) {
        let Some(w) = self.choices[choice].window.take() else {
            return;
        };
        self.choices[choice].window_floor = Some(w.last);
        let Some(open) = &self.choices[choice].leg else {
            return;
        };
        let mut attrs = self.ids(choice);
        let l = &open.record;
        attrs.extend(Self::placement_attrs(l.path, l.group, l.slot));
        attrs.extend([
            kv_i(attr::LEG_INDEX, l.index),
            kv_u(attr::LEG_START_TIME, self.anchor.unix_nanos(l.start)),
            kv_i(attr::LEG_TOKENS_CARRIED, l.tokens_carried),
            kv_i(attr::DECODE_WINDOW_TOKENS, w.tokens),
            kv_i(
                attr::DECODE_TOKENS_GENERATED,
                self.choices[choice].generated,
            ),
            kv_u(attr::DECODE_LAST_TOKEN_TIME, self.anchor.unix_nanos(w.last)),
            KeyValue::new(attr::DECODE_DEVICE_MS, ms(w.device)),
        ]);
        attrs.extend(self.clocks());
        let parent = open.cx.clone();
        self.child(span::DECODE, &parent, w.start, w.last, attrs, Vec::new());
    }

    /// A choice finished: its last window and its open leg end.
    fn close_choice(&mut self, choice: usize) {
        self.flush_choice(choice);
        if let Some(open) = self.choices[choice].leg.take() {
            open.cx.span().end();
        }
    }

    /// Ends the request span with the request's outcome: every choice's completion, the usage
    /// answered to the client, the API finish reasons and the tool calls found.
    pub fn finish(
        &mut self,
        done: &[&Completion],
        usage: &Usage,
        reasons: &[&'static str],
        tool_calls: usize,
    ) {
        for i in 0..self.choices.len() {
            self.close_choice(i);
        }
        let u = &usage.timings;
        let sp = self.root.span();
        let legs: usize = done.iter().map(|c| c.timings.legs.len()).sum();
        let moved = done.iter().any(|c| c.timings.legs.len() > 1);
        let first_token = done.iter().filter_map(|c| c.timings.first_token).min();
        let finished = done.iter().filter_map(|c| c.timings.finished).max();
        let prefilled: usize = done.iter().map(|c| c.timings.prefilled_tokens).sum();
        let group = done.first().map_or(0, |c| c.group);
        let mut attrs = vec![
            KeyValue::new(
                attr::GEN_AI_RESPONSE_MODEL,
                self.info.response_model.clone(),
            ),
            KeyValue::new(
                attr::GEN_AI_RESPONSE_FINISH_REASONS,
                Value::Array(Array::String(
                    reasons.iter().map(|r| StringValue::from(*r)).collect(),
                )),
            ),
            kv_i(attr::GEN_AI_USAGE_INPUT_TOKENS, usage.prompt_tokens),
            kv_i(attr::GEN_AI_USAGE_OUTPUT_TOKENS, usage.completion_tokens),
            kv_i(
                attr::GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
                usage.prompt_tokens_details.cached_tokens,
            ),
            KeyValue::new(attr::GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN, u.ttft_ms / 1000.0),
            KeyValue::new(attr::GEN_AI_LATENCY_E2E, u.e2e_ms / 1000.0),
            KeyValue::new(attr::GEN_AI_LATENCY_TIME_IN_QUEUE, u.queue_ms / 1000.0),
            KeyValue::new(
                attr::GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL,
                u.prefill_ms / 1000.0,
            ),
            KeyValue::new(
                attr::GEN_AI_LATENCY_TIME_IN_MODEL_DECODE,
                u.decode_ms / 1000.0,
            ),
            KeyValue::new(attr::USAGE_QUEUE_MS, u.queue_ms),
            KeyValue::new(attr::USAGE_PREFILL_MS, u.prefill_ms),
            KeyValue::new(attr::USAGE_TTFT_MS, u.ttft_ms),
            KeyValue::new(attr::USAGE_DECODE_MS, u.decode_ms),
            KeyValue::new(attr::USAGE_GENERATION_MS, u.generation_ms),
            KeyValue::new(attr::USAGE_E2E_MS, u.e2e_ms),
            kv_i(attr::USAGE_PREFILLED_TOKENS, prefilled),
            kv_i(attr::REQUEST_LEGS, legs),
            KeyValue::new(attr::REQUEST_MOVED, moved),
            kv_i(attr::SLOT_GROUP, group),
        ];
        if let Some(tps) = u.decode_tps {
            attrs.push(KeyValue::new(attr::USAGE_DECODE_TPS, tps));
        }
        if let Some(f) = first_token {
            attrs.push(kv_u(
                attr::REQUEST_FIRST_TOKEN_TIME,
                self.anchor.unix_nanos(f),
            ));
        }
        if self.info.constraint.is_some() {
            let mask: Duration = done.iter().filter_map(|c| c.mask).map(|m| m.time).sum();
            let masks: u64 = done.iter().filter_map(|c| c.mask).map(|m| m.masks).sum();
            attrs.push(KeyValue::new(attr::CONSTRAINT_MASK_MS, ms(mask)));
            attrs.push(kv_u(attr::CONSTRAINT_MASKS, masks));
        }
        if self.info.tools.is_some() {
            attrs.push(kv_i(attr::TOOLS_CALLS, tool_calls));
        }
        if self.trace_content {
            let texts: Vec<String> = self
                .choices
                .iter_mut()
                .map(|c| std::mem::take(&mut c.completion_text))
                .collect();
            let text = match texts.as_slice() {
                [one] => one.clone(),
                many => serde_json::to_string(many).unwrap_or_default(),
            };
            attrs.push(KeyValue::new(attr::CONTENT_COMPLETION, text));
        }
        let failure = done
            .iter()
            .find_map(|c| match &c.finish_reason {
                FinishReason::Error(e) => Some(Some(e.clone())),
                _ => None,
            })
            .or_else(|| {
                done.iter()
                    .any(|c| c.finish_reason == FinishReason::Cancelled)
                    .then_some(None)
            });
        match failure {
            None => {}
            Some(None) => {
                attrs.push(KeyValue::new(
                    attr::ERROR_TYPE,
                    attr::value::ERROR_CANCELLED,
                ));
                sp.set_status(Status::error("cancelled by the client"));
            }
            Some(Some(e)) => {
                let label = if e.contains("shutting down") {
                    "shutdown"
                } else {
                    "internal"
                };
                attrs.push(KeyValue::new(attr::ERROR_TYPE, label));
                sp.set_status(Status::error(e));
            }
        }
        sp.set_attributes(attrs);
        sp.end_with_timestamp(
            self.anchor
                .system_time(finished.unwrap_or_else(Instant::now)),
        );
    }

    /// Ends the request span for a request refused before reaching the engine.
    pub fn refuse(self, error_type: &'static str, message: &str) {
        let sp = self.root.span();
        sp.set_attribute(KeyValue::new(attr::ERROR_TYPE, error_type));
        sp.set_status(Status::error(message.to_string()));
        sp.end();
    }
}
