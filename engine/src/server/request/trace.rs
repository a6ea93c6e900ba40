//! One request's spans, built from the events on its own channel.
//!
//! Every timestamp comes from the request's own clocks (the instants the step loop recorded),
//! converted to wall-clock time once, here. The root span is `{operation} {model}`; its
//! children are `slotlight.queue`, one `slotlight.prefill` per prefill (with
//! `slotlight.prefill.window` progress windows under it), one `slotlight.leg` per leg (each
//! linked to the previous), and `slotlight.decode` windows under each leg.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use opentelemetry::global::BoxedTracer;
use opentelemetry::trace::{Link, SpanContext, SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry::{Array, Context, KeyValue, StringValue, Value};
use slotlight_otel::{attr, span};

use crate::constraint::ConstraintKind;
use crate::scheduler::{Event, Placement};
use crate::server::request::content::{self, OutputMessage};
use crate::server::request::outcome::RequestOutcome;
use crate::server::request::{Api, RequestMeta};
use crate::telemetry::Telemetry;
use crate::timing::{LegRecord, PathKind, PrefillChunkRecord, PrefillRecord, TimeAnchor};

/// The server the client addressed: `server.address` and `server.port`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerAddress {
    /// Host name or address.
    pub address: Option<String>,
    /// The port (`server.port`).
    pub port: Option<u16>,
}

impl ServerAddress {
    fn attrs(&self) -> Vec<KeyValue> {
        let mut v = Vec::new();
        if let Some(a) = &self.address {
            v.push(KeyValue::new(attr::SERVER_ADDRESS, a.clone()));
        }
        if let Some(p) = self.port {
            v.push(KeyValue::new(attr::SERVER_PORT, i64::from(p)));
        }
        v
    }
}

struct Window {
    start: Instant,
    last: Instant,
    tokens: usize,
    /// Decode steps (a verification step is one, whatever it yields).
    steps: usize,
    device: Duration,
    /// Draft tokens verified, and taken.
    drafted: usize,
    accepted: usize,
}

/// The chunks of a prefill since its last progress window.
struct PrefillWindow {
    /// Start of the window's first chunk's step.
    start: Instant,
    /// Where the prefill stood after the window's last chunk.
    last: PrefillChunkRecord,
    /// Positions the window's chunks computed.
    tokens: usize,
    /// Time of the window's forward steps.
    device: Duration,
}

/// A prefill span in progress: started at its first chunk, ended by the prefill's record.
struct OpenPrefill {
    cx: Context,
    /// Where it stood after its latest chunk.
    latest: PrefillChunkRecord,
    window: Option<PrefillWindow>,
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
    prefill: Option<OpenPrefill>,
    generated: usize,
    placement: Option<Placement>,
    /// The choice's reply, with `--trace-content` only.
    output: Option<OutputMessage>,
}

/// The spans of one request in progress.
pub struct RequestTrace {
    tracer: Arc<BoxedTracer>,
    anchor: TimeAnchor,
    meta: Arc<RequestMeta>,
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
    /// `traceparent`, or an empty context), with `telemetry`'s tracer; the span states the
    /// sampler's ratio.
    pub fn start(
        telemetry: &Telemetry,
        anchor: TimeAnchor,
        meta: Arc<RequestMeta>,
        parent: &Context,
        trace_content: bool,
        server: &ServerAddress,
    ) -> Self {
        let req = &meta.request;
        let opts = &req.opts;
        let sampling = &opts.sampling;
        let mut attrs = vec![
            KeyValue::new(attr::GEN_AI_OPERATION_NAME, meta.operation()),
            KeyValue::new(attr::API, req.api.label()),
            KeyValue::new(attr::GEN_AI_PROVIDER_NAME, attr::value::PROVIDER),
            KeyValue::new(attr::GEN_AI_REQUEST_MODEL, req.request_model.clone()),
            kv_i(attr::GEN_AI_REQUEST_MAX_TOKENS, opts.max_tokens),
            KeyValue::new(
                attr::GEN_AI_REQUEST_TEMPERATURE,
                f64::from(sampling.temperature),
            ),
            KeyValue::new(attr::GEN_AI_REQUEST_TOP_P, f64::from(sampling.top_p)),
            #[allow(clippy::cast_precision_loss)]
            KeyValue::new(attr::GEN_AI_REQUEST_TOP_K, sampling.top_k as f64),
            KeyValue::new(attr::GEN_AI_REQUEST_STREAM, opts.stream),
            KeyValue::new(attr::GEN_AI_RESPONSE_ID, meta.id.clone()),
            KeyValue::new(attr::REQUEST_ID, meta.id.clone()),
            kv_u(attr::REQUEST_START_TIME, anchor.unix_nanos(meta.received)),
            KeyValue::new(attr::TRACE_SAMPLING_RATIO, telemetry.sampling_ratio()),
        ];
        attrs.extend(telemetry.replica_attrs());
        if let Some(seed) = sampling.seed {
            attrs.push(kv_u(attr::GEN_AI_REQUEST_SEED, seed));
        }
        if let Some(v) = opts.frequency_penalty_given {
            attrs.push(KeyValue::new(
                attr::GEN_AI_REQUEST_FREQUENCY_PENALTY,
                f64::from(v),
            ));
        }
        if let Some(v) = opts.presence_penalty_given {
            attrs.push(KeyValue::new(
                attr::GEN_AI_REQUEST_PRESENCE_PENALTY,
                f64::from(v),
            ));
        }
        let stops = opts.stop.stops();
        if !stops.is_empty() {
            attrs.push(KeyValue::new(
                attr::GEN_AI_REQUEST_STOP_SEQUENCES,
                Value::Array(Array::String(
                    stops.iter().map(|s| StringValue::from(s.clone())).collect(),
                )),
            ));
        }
        if let Some(n) = opts.n_given {
            attrs.push(KeyValue::new(attr::GEN_AI_REQUEST_CHOICE_COUNT, n));
        }
        if let Some(id) = &opts.previous_response_id {
            attrs.push(KeyValue::new(
                attr::GEN_AI_REQUEST_PREVIOUS_RESPONSE_ID,
                id.clone(),
            ));
        }
        if let Some(s) = &meta.session {
            attrs.push(KeyValue::new(attr::GEN_AI_CONVERSATION_ID, s.id.clone()));
            attrs.push(KeyValue::new(attr::SESSION_ID, s.id.clone()));
            attrs.push(KeyValue::new(attr::SESSION_SOURCE, s.source.as_str()));
            if let Some(t) = s.turn {
                attrs.push(kv_u(attr::SESSION_TURN, t));
            }
            if let Some(e) = &s.extends {
                attrs.push(KeyValue::new(attr::SESSION_EXTENDS, e.clone()));
            }
            if let Some(b) = s.branch {
                attrs.push(KeyValue::new(attr::SESSION_BRANCH, i64::from(b)));
                attrs.push(KeyValue::new(attr::SESSION_SIDE_CALL, s.side_call));
            }
        }
        attrs.extend(server.attrs());
        if trace_content && let Some(c) = &req.content {
            attrs.push(KeyValue::new(
                attr::GEN_AI_INPUT_MESSAGES,
                c.messages.clone(),
            ));
            if let Some(s) = &c.system_instructions {
                attrs.push(KeyValue::new(attr::GEN_AI_SYSTEM_INSTRUCTIONS, s.clone()));
            }
            if let Some(t) = &c.tool_definitions {
                attrs.push(KeyValue::new(attr::GEN_AI_TOOL_DEFINITIONS, t.clone()));
            }
        }
        let kind = req.constraint_kind();
        if kind.is_some_and(ConstraintKind::is_json) {
            attrs.push(KeyValue::new(
                attr::GEN_AI_OUTPUT_TYPE,
                attr::value::OUTPUT_TYPE_JSON,
            ));
        }
        if let Some(k) = kind {
            attrs.push(KeyValue::new(attr::CONSTRAINT_KIND, k.as_str()));
        }
        if let Some(t) = &req.tools {
            attrs.push(KeyValue::new(
                attr::TOOLS_NAMES,
                Value::Array(Array::String(
                    t.names().into_iter().map(StringValue::from).collect(),
                )),
            ));
            attrs.push(KeyValue::new(attr::TOOLS_CHOICE, t.choice.as_str()));
            attrs.push(KeyValue::new(attr::TOOLS_FORMAT, t.format.as_str()));
        }
        if !req.tools_skipped.is_empty() {
            attrs.push(KeyValue::new(
                attr::TOOLS_SKIPPED,
                Value::Array(Array::String(
                    req.tools_skipped
                        .iter()
                        .map(|t| StringValue::from(t.clone()))
                        .collect(),
                )),
            ));
        }
        if let Some(asked) = req.max_tokens_asked {
            attrs.push(kv_i(attr::REQUEST_MAX_TOKENS_ASKED, asked));
        }
        let name = span::request_span_name(meta.operation(), &req.model);
        let tracer = Arc::clone(&telemetry.tracer);
        let root_span = tracer
            .span_builder(Cow::Owned(name))
            .with_kind(SpanKind::Server)
            .with_start_time(anchor.system_time(meta.received))
            .with_attributes(attrs)
            .start_with_context(tracer.as_ref(), parent);
        let root = parent.with_span(root_span);
        let n = opts.n.max(1);
        Self {
            tracer,
            anchor,
            meta,
            root,
            choices: (0..n).map(|_| ChoiceTrace::default()).collect(),
            first_token: None,
            trace_content,
        }
    }

    /// The request the spans are about.
    pub fn meta(&self) -> &Arc<RequestMeta> {
        &self.meta
    }

    /// The request span's context (for the request task's `tracing` span).
    pub fn context(&self) -> &Context {
        &self.root
    }

    /// Whether the spans record content (`--trace-content`).
    pub fn records_content(&self) -> bool {
        self.trace_content
    }

    /// Records choice `choice`'s reply for `gen_ai.output.messages` (kept only with
    /// `--trace-content`).
    pub fn record_output(&mut self, choice: usize, reply: OutputMessage) {
        if !self.trace_content {
            return;
        }
        if choice >= self.choices.len() {
            self.choices.resize_with(choice + 1, ChoiceTrace::default);
        }
        self.choices[choice].output = Some(reply);
    }

    /// The request span's trace id (hex), for logs.
    pub fn trace_id(&self) -> String {
        self.root.span().span_context().trace_id().to_string()
    }

    fn ids(&self, choice: usize) -> Vec<KeyValue> {
        let mut v = vec![
            KeyValue::new(attr::REQUEST_ID, self.meta.id.clone()),
            kv_i(attr::CHOICE_INDEX, choice),
        ];
        if let Some(s) = self.meta.session_id() {
            v.push(KeyValue::new(attr::GEN_AI_CONVERSATION_ID, s.to_string()));
        }
        v
    }

    fn clocks(&self) -> Vec<KeyValue> {
        let mut v = vec![kv_u(
            attr::REQUEST_START_TIME,
            self.anchor.unix_nanos(self.meta.received),
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
                    self.meta.received,
                    *at,
                    attrs,
                    Vec::new(),
                );
            }
            Event::PrefillChunk(rec) => self.prefill_chunk(choice, rec),
            Event::Prefilled(rec) => self.prefill(choice, rec),
            Event::LegStarted(leg) => self.leg_started(choice, leg),
            Event::LegEnded(leg) => self.leg_ended(choice, leg),
            Event::Token {
                at,
                step_device,
                generated,
                placement,
                from_prefill,
                same_step,
                draft,
                ..
            } => {
                self.first_token = Some(self.first_token.map_or(*at, |f| f.min(*at)));
                let c = &mut self.choices[choice];
                c.placement = Some(*placement);
                c.generated = *generated;
                if *from_prefill {
                    // A prefill's token belongs to no decode window: the next window starts
                    // where decoding starts, and neither its time nor its device time
                    // includes the prefill step.
                    self.flush_choice(choice);
                    self.choices[choice].window_floor = Some(*at);
                    return;
                }
                let c = &mut self.choices[choice];
                let floor = c
                    .window_floor
                    .or_else(|| c.leg.as_ref().map(|l| l.record.start))
                    .unwrap_or(*at);
                let w = c.window.get_or_insert(Window {
                    start: floor.min(*at),
                    last: *at,
                    tokens: 0,
                    steps: 0,
                    device: Duration::ZERO,
                    drafted: 0,
                    accepted: 0,
                });
                w.tokens += 1;
                // A step's device time once, with its first token.
                if !*same_step {
                    w.steps += 1;
                    w.device += *step_device;
                }
                if let Some(d) = draft {
                    w.drafted += d.drafted;
                    w.accepted += d.accepted;
                }
                w.last = *at;
            }
            Event::Done(_) => self.close_choice(choice),
        }
    }

    /// A prefill chunk ran: the prefill's span starts with its first chunk, and the chunk joins
    /// the prefill's current progress window.
    fn prefill_chunk(&mut self, choice: usize, rec: &PrefillChunkRecord) {
        if self.choices[choice].prefill.is_none() {
            let s = self
                .tracer
                .span_builder(span::PREFILL)
                .with_kind(SpanKind::Internal)
                .with_start_time(self.anchor.system_time(rec.prefill_start))
                .with_attributes(self.ids(choice))
                .start_with_context(self.tracer.as_ref(), &self.root);
            self.choices[choice].prefill = Some(OpenPrefill {
                cx: self.root.with_span(s),
                latest: rec.clone(),
                window: None,
            });
        }
        let Some(open) = self.choices[choice].prefill.as_mut() else {
            return;
        };
        open.latest = rec.clone();
        let w = open.window.get_or_insert(PrefillWindow {
            start: rec.start,
            last: rec.clone(),
            tokens: 0,
            device: Duration::ZERO,
        });
        w.tokens += rec.chunk_tokens;
        w.device += rec.device;
        w.last = rec.clone();
    }

    /// Closes choice `choice`'s current prefill window, if it holds chunks, as a
    /// `slotlight.prefill.window` span under the prefill's span.
    fn flush_prefill(&mut self, choice: usize) {
        let c = &mut self.choices[choice];
        let Some(open) = c.prefill.as_mut() else {
            return;
        };
        let Some(w) = open.window.take() else {
            return;
        };
        let parent = open.cx.clone();
        let mut attrs = self.ids(choice);
        let c = &self.choices[choice];
        if let Some(l) = c.leg.as_ref().map(|l| &l.record) {
            attrs.extend(Self::placement_attrs(l.path, l.group, l.slot));
            attrs.extend([
                kv_i(attr::LEG_INDEX, l.index),
                kv_u(attr::LEG_START_TIME, self.anchor.unix_nanos(l.start)),
                kv_i(attr::LEG_TOKENS_CARRIED, l.tokens_carried),
            ]);
        } else if let Some(p) = c.placement {
            attrs.extend(Self::placement_attrs(p.path, p.group, p.slot));
        }
        let last = &w.last;
        attrs.extend([
            kv_i(attr::PREFILL_PROMPT_TOKENS, last.total),
            kv_i(attr::PREFILL_CACHED_TOKENS, last.cached),
            kv_i(attr::PREFILL_PROCESSED_TOKENS, last.processed),
            kv_i(attr::PREFILL_WINDOW_TOKENS, w.tokens),
            kv_i(attr::PREFILL_CHUNKS, last.chunk),
            KeyValue::new(attr::PREFILL_DEVICE_MS, ms(w.device)),
            kv_u(
                attr::PREFILL_START_TIME,
                self.anchor.unix_nanos(last.prefill_start),
            ),
            kv_u(
                attr::PREFILL_LAST_CHUNK_TIME,
                self.anchor.unix_nanos(last.end),
            ),
        ]);
        attrs.extend(self.clocks());
        self.child(
            span::PREFILL_WINDOW,
            &parent,
            w.start,
            last.end,
            attrs,
            Vec::new(),
        );
    }

    /// Ends choice `choice`'s open prefill span, if any, without a record (its request ended
    /// first), at its latest chunk's end.
    fn drop_prefill(&mut self, choice: usize) {
        self.flush_prefill(choice);
        if let Some(open) = self.choices[choice].prefill.take() {
            open.cx
                .span()
                .end_with_timestamp(self.anchor.system_time(open.latest.end));
        }
    }

    fn prefill(&mut self, choice: usize, rec: &PrefillRecord) {
        self.flush_prefill(choice);
        let mut attrs = Vec::new();
        attrs.extend([
            kv_i(attr::PREFILL_PROMPT_TOKENS, rec.prompt_tokens),
            kv_i(attr::PREFILL_CACHED_TOKENS, rec.cached_tokens),
            kv_i(attr::PREFILL_COMPUTED_TOKENS, rec.computed_tokens),
            kv_i(attr::PREFILL_CHUNKS, rec.chunks),
            KeyValue::new(attr::PREFILL_DEVICE_MS, ms(rec.device)),
            KeyValue::new(attr::PREFILL_REASON, rec.reason.as_str()),
            KeyValue::new(attr::PREFILL_END_REASON, rec.end_reason.as_str()),
        ]);
        if let Some(open) = self.choices[choice].prefill.take() {
            let sp = open.cx.span();
            sp.set_attributes(attrs);
            sp.end_with_timestamp(self.anchor.system_time(rec.end.max(rec.start)));
            return;
        }
        let mut all = self.ids(choice);
        all.extend(attrs);
        self.child(
            span::PREFILL,
            &self.root.clone(),
            rec.start,
            rec.end,
            all,
            Vec::new(),
        );
    }

    fn leg_started(&mut self, choice: usize, leg: &LegRecord) {
        self.flush_choice(choice);
        self.flush_prefill(choice);
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
        self.flush_prefill(choice);
        let Some(open) = self.choices[choice].leg.take() else {
            return;
        };
        let sp = open.cx.span();
        let mut attrs = vec![
            kv_i(attr::LEG_TOKENS_GENERATED, leg.tokens_generated),
            kv_i(attr::LEG_BATCH_SIZE_MAX, leg.batch_max),
            KeyValue::new(attr::LEG_BATCH_SIZE_MEAN, leg.batch_mean()),
            KeyValue::new(attr::LEG_DEVICE_MS, ms(leg.device)),
            kv_i(attr::LEG_DRAFTED_TOKENS, leg.drafted_tokens),
            kv_i(attr::LEG_ACCEPTED_TOKENS, leg.accepted_tokens),
        ];
        if let Some(r) = leg.end_reason {
            attrs.push(KeyValue::new(attr::LEG_END_REASON, r.as_str()));
        }
        attrs.extend(self.clocks());
        sp.set_attributes(attrs);
        self.choices[choice].prev_leg = Some(sp.span_context().clone());
        sp.end_with_timestamp(self.anchor.system_time(leg.end.unwrap_or(leg.start)));
    }

    /// Closes every choice's current progress window, if it holds anything: a decode window as
    /// a `slotlight.decode` span, a prefill's as a `slotlight.prefill.window` span.
    pub fn flush_window(&mut self) {
        for i in 0..self.choices.len() {
            self.flush_prefill(i);
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
            kv_i(attr::DECODE_WINDOW_STEPS, w.steps),
            kv_i(attr::DECODE_DRAFTED_TOKENS, w.drafted),
            kv_i(attr::DECODE_ACCEPTED_TOKENS, w.accepted),
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
        self.drop_prefill(choice);
        self.flush_choice(choice);
        if let Some(open) = self.choices[choice].leg.take() {
            open.cx.span().end();
        }
    }

    /// Ends the request span with the request's outcome, as decided once for the response,
    /// the log line and the metrics alike.
    pub fn finish(&mut self, o: &RequestOutcome) {
        for i in 0..self.choices.len() {
            self.close_choice(i);
        }
        let usage = &o.usage;
        let u = &usage.extras.timings;
        let sp = self.root.span();
        let at = &o.instants;
        let mut attrs = vec![
            KeyValue::new(attr::GEN_AI_RESPONSE_MODEL, self.meta.request.model.clone()),
            KeyValue::new(
                attr::GEN_AI_RESPONSE_FINISH_REASONS,
                Value::Array(Array::String(
                    o.api_finish_reasons
                        .iter()
                        .map(|r| StringValue::from(r.as_str()))
                        .collect(),
                )),
            ),
            kv_i(attr::GEN_AI_USAGE_INPUT_TOKENS, usage.prompt_tokens),
            kv_i(attr::GEN_AI_USAGE_OUTPUT_TOKENS, usage.completion_tokens),
            kv_i(
                attr::GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
                usage.prompt_tokens_details.cached_tokens,
            ),
            KeyValue::new(attr::REQUEST_STATUS, o.status.as_str()),
            kv_i(attr::USAGE_PREFILLED_TOKENS, o.prefilled_tokens),
            KeyValue::new(attr::SPECULATION, o.speculation.as_str()),
            kv_u(attr::USAGE_DRAFTS, o.drafts.drafts),
            kv_i(attr::USAGE_DRAFTED_TOKENS, o.drafts.drafted_tokens),
            kv_i(attr::USAGE_ACCEPTED_TOKENS, o.drafts.accepted_tokens),
            kv_i(attr::REQUEST_LEGS, o.legs.len()),
            KeyValue::new(attr::REQUEST_MOVED, o.moved()),
            kv_i(attr::SLOT_GROUP, o.group),
        ];
        // vLLM's latencies, with vLLM's meanings: wall-clock intervals between the request's
        // own instants (the first admission, the first token of any choice, the last token and
        // the last finish), in seconds.
        let secs = |from: Option<Instant>, to: Option<Instant>| {
            Some(to?.saturating_duration_since(from?).as_secs_f64())
        };
        let arrival = Some(at.received);
        // Only what the request had: an unknown value is left off, never written as zero.
        let known = [
            (
                attr::GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN,
                secs(arrival, at.first_token),
            ),
            (attr::GEN_AI_LATENCY_E2E, secs(arrival, at.finished)),
            (
                attr::GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK,
                secs(arrival, at.first_token).filter(|_| self.meta.request.opts.stream),
            ),
            (
                attr::GEN_AI_LATENCY_TIME_IN_QUEUE,
                secs(arrival, at.admitted),
            ),
            (
                attr::GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL,
                secs(at.admitted, at.first_token),
            ),
            (
                attr::GEN_AI_LATENCY_TIME_IN_MODEL_DECODE,
                secs(at.first_token, at.last_token),
            ),
            (
                attr::GEN_AI_LATENCY_TIME_IN_MODEL_INFERENCE,
                secs(at.admitted, at.finished),
            ),
            (attr::USAGE_QUEUE_MS, u.queue_ms),
            (attr::USAGE_PREFILL_MS, u.prefill_ms),
            (attr::USAGE_TTFT_MS, u.ttft_ms),
            (attr::USAGE_DECODE_MS, u.decode_ms),
            (attr::USAGE_GENERATION_MS, u.generation_ms),
            (attr::USAGE_DECODE_TPS, u.decode_tps),
            (attr::USAGE_E2E_MS, u.e2e_ms),
        ];
        attrs.extend(
            known
                .into_iter()
                .filter_map(|(k, v)| v.map(|v| KeyValue::new(k, v))),
        );
        if let Some(r) = usage.extras.resume {
            attrs.push(KeyValue::new(attr::RESUME, r));
        }
        if let Some(ttl) = o.session_kv_ttl {
            attrs.push(KeyValue::new(attr::SESSION_KV_TTL_MS, ms(ttl)));
        }
        let resume_counts = [
            (attr::RESUME_REUSABLE_TOKENS, usage.extras.reusable_tokens),
            (attr::RESUME_DIVERGED_AT, usage.extras.diverged_at),
            (attr::RESUME_EVICTED_TOKENS, usage.extras.evicted_tokens),
        ];
        attrs.extend(
            resume_counts
                .into_iter()
                .filter_map(|(k, v)| v.map(|v| kv_i(k, v))),
        );
        if let Some(f) = at.first_token {
            attrs.push(kv_u(
                attr::REQUEST_FIRST_TOKEN_TIME,
                self.anchor.unix_nanos(f),
            ));
        }
        if self.meta.request.constraint.is_some() {
            let (mask, masks) = o.masks.unwrap_or_default();
            attrs.push(KeyValue::new(attr::CONSTRAINT_MASK_MS, ms(mask)));
            attrs.push(kv_u(attr::CONSTRAINT_MASKS, masks));
        }
        if self.meta.request.tools.is_some() {
            attrs.push(kv_i(attr::TOOLS_CALLS, o.tool_calls));
        }
        if let Some(n) = o.reasoning_tokens() {
            attrs.push(kv_i(attr::GEN_AI_USAGE_REASONING_OUTPUT_TOKENS, n));
        }
        if self.trace_content {
            let replies: Vec<OutputMessage> = self
                .choices
                .iter_mut()
                .map(|c| c.output.take().unwrap_or_default())
                .collect();
            attrs.push(KeyValue::new(
                attr::GEN_AI_OUTPUT_MESSAGES,
                content::output_messages(&replies, &o.api_finish_reasons),
            ));
        }
        // The conventions' status: an error (with `error.type`) on failure, otherwise unset.
        if let Some(f) = &o.failure {
            attrs.push(KeyValue::new(attr::ERROR_TYPE, f.error_type()));
            sp.set_status(Status::error(f.message()));
        }
        sp.set_attributes(attrs);
        sp.end_with_timestamp(
            self.anchor
                .system_time(at.finished.unwrap_or_else(Instant::now)),
        );
    }

    /// Ends the request span of a request refused before reaching the step loop, at
    /// `refused` (now, normally).
    pub fn refuse(self, error_type: &'static str, message: &str, refused: Instant) {
        let sp = self.root.span();
        sp.set_attributes([
            KeyValue::new(attr::ERROR_TYPE, error_type),
            KeyValue::new(attr::REQUEST_STATUS, attr::value::STATUS_REFUSED),
        ]);
        sp.set_status(Status::error(message.to_string()));
        sp.end_with_timestamp(self.anchor.system_time(refused.max(self.meta.received)));
    }
}

/// A request answered with an error before its parameters were known (the body did not parse
/// or validate, the model does not exist, the server is draining).
#[derive(Debug, Clone)]
pub struct Refusal {
    /// The id given to the request (no response carries it; the span and log line do).
    pub id: String,
    /// The API of the route that refused it (names the operation).
    pub api: Api,
    /// The served model (names the span).
    pub response_model: String,
    /// Session, from `x-session-id`.
    pub session: Option<String>,
    /// Arrival at the HTTP layer: the request span's start.
    pub received: Instant,
    /// When the error was answered.
    pub refused: Instant,
    /// The `error.type` label.
    pub error_type: &'static str,
    /// The error message.
    pub message: String,
}

/// Records a refused request's span with `telemetry`'s tracer: a request span with what is
/// known of it, status `refused`, `error.type` and an error status, and the sampler's ratio;
/// no child spans and no usage attributes (the request never had any).
pub fn record_refusal(
    telemetry: &Telemetry,
    anchor: TimeAnchor,
    r: &Refusal,
    parent: &Context,
    server: &ServerAddress,
) -> opentelemetry::trace::SpanContext {
    let mut attrs = vec![
        KeyValue::new(attr::GEN_AI_OPERATION_NAME, r.api.operation()),
        KeyValue::new(attr::API, r.api.label()),
        KeyValue::new(attr::GEN_AI_PROVIDER_NAME, attr::value::PROVIDER),
        KeyValue::new(attr::REQUEST_ID, r.id.clone()),
        kv_u(attr::REQUEST_START_TIME, anchor.unix_nanos(r.received)),
        KeyValue::new(attr::REQUEST_STATUS, attr::value::STATUS_REFUSED),
        KeyValue::new(attr::ERROR_TYPE, r.error_type),
        KeyValue::new(attr::TRACE_SAMPLING_RATIO, telemetry.sampling_ratio()),
    ];
    attrs.extend(telemetry.replica_attrs());
    if let Some(s) = &r.session {
        attrs.push(KeyValue::new(attr::GEN_AI_CONVERSATION_ID, s.clone()));
    }
    attrs.extend(server.attrs());
    let name = span::request_span_name(r.api.operation(), &r.response_model);
    let tracer: &BoxedTracer = &telemetry.tracer;
    let mut sp = tracer
        .span_builder(Cow::Owned(name))
        .with_kind(SpanKind::Server)
        .with_start_time(anchor.system_time(r.received))
        .with_attributes(attrs)
        .start_with_context(tracer, parent);
    use opentelemetry::trace::Span as _;
    sp.set_status(Status::error(r.message.clone()));
    sp.end_with_timestamp(anchor.system_time(r.refused.max(r.received)));
    sp.span_context().clone()
}
