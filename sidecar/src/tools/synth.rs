//! Synthetic engine-shaped spans (OTLP protobuf types), for the benchmark and the tests.
//!
//! Builds exactly what the contract says the engine sends: a request span, a queue span, a
//! prefill span, decode windows (children of a leg), and leg spans, with every attribute key
//! taken from [`slotlight_otel::attr`].

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::{AnyValue, ArrayValue, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::span::{Link, SpanKind};
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use slotlight_otel::{attr, span as names};

/// A string attribute.
pub fn kv_str(k: &str, v: impl Into<String>) -> KeyValue {
    kv(k, Value::StringValue(v.into()))
}

/// An int attribute.
pub fn kv_int(k: &str, v: i64) -> KeyValue {
    kv(k, Value::IntValue(v))
}

/// A double attribute.
pub fn kv_f64(k: &str, v: f64) -> KeyValue {
    kv(k, Value::DoubleValue(v))
}

/// A bool attribute.
pub fn kv_bool(k: &str, v: bool) -> KeyValue {
    kv(k, Value::BoolValue(v))
}

/// A string-array attribute.
pub fn kv_strs(k: &str, v: &[&str]) -> KeyValue {
    kv(
        k,
        Value::ArrayValue(ArrayValue {
            values: v
                .iter()
                .map(|s| AnyValue {
                    value: Some(Value::StringValue((*s).to_string())),
                })
                .collect(),
        }),
    )
}

fn kv(k: &str, v: Value) -> KeyValue {
    KeyValue {
        key: k.to_string(),
        value: Some(AnyValue { value: Some(v) }),
        ..Default::default()
    }
}

/// One export request holding `spans` from the engine instance `instance`.
pub fn export(instance: &str, spans: Vec<Span>) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![resource_spans(
            attr::value::SERVICE_NAME_ENGINE,
            Some(instance),
            spans,
        )],
    }
}

/// A resource's spans, with `service.name`, and `service.instance.id` when given.
pub fn resource_spans(service: &str, instance: Option<&str>, spans: Vec<Span>) -> ResourceSpans {
    let mut attributes = vec![
        kv_str(attr::SERVICE_NAME, service),
        kv_str(attr::SERVICE_VERSION, env!("CARGO_PKG_VERSION")),
    ];
    if let Some(i) = instance {
        attributes.push(kv_str(attr::SERVICE_INSTANCE_ID, i));
    }
    ResourceSpans {
        resource: Some(Resource {
            attributes,
            ..Default::default()
        }),
        scope_spans: vec![ScopeSpans {
            spans,
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// Ids shared by the spans of one request.
#[derive(Debug, Clone)]
pub struct Request {
    /// The engine's request id (also the response id) (`slotlight.request.id`).
    pub request_id: String,
    /// `gen_ai.conversation.id` (the session).
    pub session_id: Option<String>,
    /// The trace id every span of the synthetic request shares.
    pub trace_id: [u8; 16],
    /// The request span's id.
    pub root_span_id: [u8; 8],
    /// When the request arrived, Unix ns (`slotlight.request.start_time_unix_nano`).
    pub start_ns: i64,
    /// `slotlight.request.first_token_time_unix_nano`, once known.
    pub first_token_ns: Option<i64>,
    /// The slot group.
    pub group: i64,
    /// `slotlight.engine.data_parallel_rank` on the request span, when set.
    pub data_parallel_rank: Option<i64>,
    next_span: u64,
}

/// Where a leg runs: `None` is the solo path, `Some(i)` slot `i`.
pub type Place = Option<i64>;

impl Request {
    /// A request; `seed` makes its ids (distinct seeds, distinct ids).
    pub fn new(request_id: impl Into<String>, seed: u64, start_ns: i64) -> Self {
        let mut trace_id = [0u8; 16];
        trace_id[..8].copy_from_slice(&seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_be_bytes());
        trace_id[8..].copy_from_slice(&(seed | 1).to_be_bytes());
        Request {
            request_id: request_id.into(),
            session_id: None,
            trace_id,
            root_span_id: (seed.wrapping_add(1) | 1).to_be_bytes(),
            start_ns,
            first_token_ns: None,
            group: 0,
            data_parallel_rank: None,
            next_span: 2,
        }
    }

    /// Sets the session.
    pub fn with_session(mut self, s: impl Into<String>) -> Self {
        self.session_id = Some(s.into());
        self
    }

    fn span_id(&mut self) -> [u8; 8] {
        self.next_span += 1;
        let mut id = self.root_span_id;
        for (b, n) in id.iter_mut().zip(self.next_span.to_be_bytes()) {
            *b ^= n;
        }
        id
    }

    fn base(&mut self, name: &str, start: i64, end: i64, parent: Option<[u8; 8]>) -> Span {
        let mut attributes = vec![kv_str(attr::REQUEST_ID, self.request_id.clone())];
        if let Some(s) = &self.session_id {
            attributes.push(kv_str(attr::GEN_AI_CONVERSATION_ID, s.clone()));
        }
        Span {
            trace_id: self.trace_id.to_vec(),
            span_id: self.span_id().to_vec(),
            parent_span_id: parent.unwrap_or(self.root_span_id).to_vec(),
            name: name.to_string(),
            kind: SpanKind::Internal as i32,
            start_time_unix_nano: u64::try_from(start).unwrap_or(0),
            end_time_unix_nano: u64::try_from(end).unwrap_or(0),
            attributes,
            ..Default::default()
        }
    }

    fn place_attrs(&self, s: &mut Span, place: Place) {
        match place {
            None => s
                .attributes
                .push(kv_str(attr::LEG_PATH, attr::value::PATH_SOLO)),
            Some(i) => {
                s.attributes
                    .push(kv_str(attr::LEG_PATH, attr::value::PATH_SLOT));
                s.attributes.push(kv_int(attr::SLOT_INDEX, i));
            }
        }
        s.attributes.push(kv_int(attr::SLOT_GROUP, self.group));
    }

    fn request_times(&self, s: &mut Span) {
        s.attributes
            .push(kv_int(attr::REQUEST_START_TIME, self.start_ns));
        if let Some(f) = self.first_token_ns {
            s.attributes.push(kv_int(attr::REQUEST_FIRST_TOKEN_TIME, f));
        }
    }

    /// `slotlight.queue`: from the request's start to admission at `admitted_ns`.
    pub fn queue(&mut self, place: Place, admitted_ns: i64) -> Span {
        let mut s = self.base(names::QUEUE, self.start_ns, admitted_ns, None);
        self.place_attrs(&mut s, place);
        s
    }

    /// The prompt's forward pass (`slotlight.prefill`).
    pub fn prefill(&mut self, start: i64, end: i64, prompt: i64, cached: i64) -> Span {
        let mut s = self.base(names::PREFILL, start, end, None);
        s.attributes.extend([
            kv_int(attr::PREFILL_PROMPT_TOKENS, prompt),
            kv_int(attr::PREFILL_CACHED_TOKENS, cached),
            kv_int(attr::PREFILL_COMPUTED_TOKENS, prompt - cached),
            kv_int(attr::PREFILL_CHUNKS, 1),
            kv_f64(attr::PREFILL_DEVICE_MS, 1.0),
        ]);
        s
    }

    /// A `slotlight.prefill.window` of a prefill that started at `prefill_start`: the chunks
    /// from `start` to `end` computed `window_tokens`, and `processed` of `prompt` positions
    /// (`cached` of them from the cache) are in the KV cache after them.
    #[allow(clippy::too_many_arguments)] // one argument per attribute a window states
    pub fn prefill_window(
        &mut self,
        place: Place,
        prefill_start: i64,
        start: i64,
        end: i64,
        prompt: i64,
        cached: i64,
        processed: i64,
        window_tokens: i64,
    ) -> Span {
        let mut s = self.base(names::PREFILL_WINDOW, start, end, None);
        self.place_attrs(&mut s, place);
        s.attributes.extend([
            kv_int(attr::PREFILL_PROMPT_TOKENS, prompt),
            kv_int(attr::PREFILL_CACHED_TOKENS, cached),
            kv_int(attr::PREFILL_PROCESSED_TOKENS, processed),
            kv_int(attr::PREFILL_WINDOW_TOKENS, window_tokens),
            kv_f64(attr::PREFILL_DEVICE_MS, 1.0),
            kv_int(attr::PREFILL_START_TIME, prefill_start),
            kv_int(attr::PREFILL_LAST_CHUNK_TIME, end),
        ]);
        self.request_times(&mut s);
        s
    }

    /// A `slotlight.decode` window of `leg`, from `start` to `last_token`, with
    /// `tokens_generated` the request's total so far.
    pub fn decode(
        &mut self,
        leg: &Leg,
        start: i64,
        last_token: i64,
        window_tokens: i64,
        tokens_generated: i64,
    ) -> Span {
        let mut s = self.base(names::DECODE, start, last_token, Some(leg.span_id));
        self.place_attrs(&mut s, leg.place);
        s.attributes.extend([
            kv_int(attr::LEG_INDEX, leg.index),
            kv_int(attr::LEG_START_TIME, leg.start_ns),
            kv_int(attr::LEG_TOKENS_CARRIED, leg.tokens_carried),
            kv_int(attr::DECODE_WINDOW_TOKENS, window_tokens),
            kv_int(attr::DECODE_TOKENS_GENERATED, tokens_generated),
            kv_int(attr::DECODE_LAST_TOKEN_TIME, last_token),
            kv_f64(attr::DECODE_DEVICE_MS, 1.0),
        ]);
        self.request_times(&mut s);
        s
    }

    /// A `slotlight.decode` window as [`Request::decode`] makes it, whose steps (`steps`,
    /// verification steps included) verified `drafts.drafted` draft tokens and took
    /// `drafts.accepted` of them (speculative decoding).
    #[allow(clippy::too_many_arguments)] // one argument per attribute a window states
    pub fn decode_drafted(
        &mut self,
        leg: &Leg,
        start: i64,
        last_token: i64,
        window_tokens: i64,
        tokens_generated: i64,
        steps: i64,
        drafts: Drafts,
    ) -> Span {
        let mut s = self.decode(leg, start, last_token, window_tokens, tokens_generated);
        s.attributes.extend([
            kv_int(attr::DECODE_WINDOW_STEPS, steps),
            kv_int(attr::DECODE_DRAFTED_TOKENS, drafts.drafted),
            kv_int(attr::DECODE_ACCEPTED_TOKENS, drafts.accepted),
        ]);
        s
    }

    /// Starts a leg (its span is built by [`Request::leg_span`] when it ends).
    pub fn leg(&mut self, index: i64, place: Place, start_ns: i64, tokens_carried: i64) -> Leg {
        Leg {
            index,
            place,
            start_ns,
            tokens_carried,
            span_id: self.span_id(),
            previous: None,
        }
    }

    /// The `slotlight.leg` span of a leg that ended at `end_ns` after generating `generated`.
    pub fn leg_span(&mut self, leg: &Leg, end_ns: i64, generated: i64, end_reason: &str) -> Span {
        let mut s = self.base(names::LEG, leg.start_ns, end_ns, None);
        s.span_id = leg.span_id.to_vec();
        self.place_attrs(&mut s, leg.place);
        s.attributes.extend([
            kv_int(attr::LEG_INDEX, leg.index),
            kv_int(attr::LEG_START_TIME, leg.start_ns),
            kv_int(attr::LEG_TOKENS_CARRIED, leg.tokens_carried),
            kv_int(attr::LEG_TOKENS_GENERATED, generated),
            kv_int(
                attr::LEG_BATCH_SIZE_MAX,
                if leg.place.is_some() { 2 } else { 1 },
            ),
            kv_f64(
                attr::LEG_BATCH_SIZE_MEAN,
                if leg.place.is_some() { 1.5 } else { 1.0 },
            ),
            kv_f64(attr::LEG_DEVICE_MS, 1.0),
            kv_str(attr::LEG_END_REASON, end_reason),
        ]);
        self.request_times(&mut s);
        if let Some(prev) = leg.previous {
            s.links.push(Link {
                trace_id: self.trace_id.to_vec(),
                span_id: prev.to_vec(),
                ..Default::default()
            });
        }
        s
    }

    /// [`Request::leg_span`] of a leg whose steps verified `drafts.drafted` draft tokens and
    /// took `drafts.accepted` of them.
    pub fn leg_span_drafted(
        &mut self,
        leg: &Leg,
        end_ns: i64,
        generated: i64,
        end_reason: &str,
        drafts: Drafts,
    ) -> Span {
        let mut s = self.leg_span(leg, end_ns, generated, end_reason);
        s.attributes.extend([
            kv_int(attr::LEG_DRAFTED_TOKENS, drafts.drafted),
            kv_int(attr::LEG_ACCEPTED_TOKENS, drafts.accepted),
        ]);
        s
    }

    /// The request span, named `chat {model}`, ending at `end_ns`, with `usage`.
    pub fn root(&mut self, model: &str, end_ns: i64, usage: &Usage) -> Span {
        let name = names::request_span_name(names::OPERATION_CHAT, model);
        let mut s = self.base(&name, self.start_ns, end_ns, None);
        s.span_id = self.root_span_id.to_vec();
        s.parent_span_id = Vec::new();
        s.kind = SpanKind::Server as i32;
        if let Some(r) = self.data_parallel_rank {
            s.attributes
                .push(kv_int(attr::ENGINE_DATA_PARALLEL_RANK, r));
        }
        s.attributes.extend([
            kv_str(attr::GEN_AI_OPERATION_NAME, names::OPERATION_CHAT),
            kv_str(attr::GEN_AI_PROVIDER_NAME, attr::value::PROVIDER),
            kv_str(attr::GEN_AI_REQUEST_MODEL, model),
            kv_str(attr::GEN_AI_RESPONSE_MODEL, model),
            kv_strs(
                attr::GEN_AI_RESPONSE_FINISH_REASONS,
                &[usage.finish_reason.as_str()],
            ),
            kv_int(attr::GEN_AI_USAGE_INPUT_TOKENS, usage.prompt_tokens),
            kv_int(attr::GEN_AI_USAGE_OUTPUT_TOKENS, usage.completion_tokens),
            kv_int(
                attr::GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
                usage.cached_tokens,
            ),
            kv_int(attr::USAGE_PREFILLED_TOKENS, usage.prefilled_tokens),
            kv_f64(attr::USAGE_QUEUE_MS, usage.queue_ms),
            kv_f64(attr::USAGE_PREFILL_MS, usage.prefill_ms),
            kv_f64(attr::USAGE_TTFT_MS, usage.ttft_ms),
            kv_f64(attr::USAGE_DECODE_MS, usage.decode_ms),
            kv_f64(attr::USAGE_GENERATION_MS, usage.generation_ms),
            kv_f64(attr::USAGE_E2E_MS, usage.e2e_ms),
            kv_int(attr::REQUEST_LEGS, usage.legs),
            kv_bool(attr::REQUEST_MOVED, usage.moved),
            kv_int(attr::SLOT_GROUP, self.group),
            kv_f64(attr::GEN_AI_LATENCY_E2E, usage.e2e_ms / 1e3),
            kv_f64(
                attr::GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN,
                usage.ttft_ms / 1e3,
            ),
        ]);
        if let Some(tps) = usage.decode_tps {
            s.attributes.push(kv_f64(attr::USAGE_DECODE_TPS, tps));
        }
        if let Some(st) = &usage.status {
            s.attributes.push(kv_str(attr::REQUEST_STATUS, st.clone()));
        }
        if let Some(r) = &usage.resume {
            s.attributes.push(kv_str(attr::RESUME, r.clone()));
        }
        if let Some(sp) = &usage.speculation {
            s.attributes.push(kv_str(attr::SPECULATION, sp.clone()));
        }
        for (k, v) in [
            (attr::RESUME_REUSABLE_TOKENS, usage.reusable_tokens),
            (attr::RESUME_DIVERGED_AT, usage.diverged_at),
            (attr::RESUME_EVICTED_TOKENS, usage.evicted_tokens),
            (attr::USAGE_DRAFTS, usage.drafts),
            (attr::USAGE_DRAFTED_TOKENS, usage.drafted_tokens),
            (attr::USAGE_ACCEPTED_TOKENS, usage.accepted_tokens),
        ] {
            if let Some(v) = v {
                s.attributes.push(kv_int(k, v));
            }
        }
        if let Some(e) = &usage.error_type {
            s.attributes.push(kv_str(attr::ERROR_TYPE, e.clone()));
            s.status = Some(Status {
                code: StatusCode::Error as i32,
                message: e.clone(),
            });
        }
        self.request_times(&mut s);
        s
    }
}

/// A leg in progress.
#[derive(Debug, Clone)]
pub struct Leg {
    /// Which leg of its choice this is, from 0 (`slotlight.leg.index`).
    pub index: i64,
    /// Solo or slot.
    pub place: Place,
    /// When the leg started, Unix ns (`slotlight.leg.start_time_unix_nano`).
    pub start_ns: i64,
    /// Tokens generated in earlier legs, carried into this one (`slotlight.leg.tokens_carried`).
    pub tokens_carried: i64,
    /// The leg span's id (decode windows are its children).
    pub span_id: [u8; 8],
    /// The previous leg's span id (linked).
    pub previous: Option<[u8; 8]>,
}

/// Draft tokens verified and taken (speculative decoding), in a window or a leg.
#[derive(Debug, Clone, Copy, Default)]
pub struct Drafts {
    /// Draft tokens verified.
    pub drafted: i64,
    /// Of those, draft tokens taken.
    pub accepted: i64,
}

/// The request span's usage attributes.
#[derive(Debug, Clone)]
pub struct Usage {
    /// First finish reason.
    pub finish_reason: String,
    /// Tokens of the prompt.
    pub prompt_tokens: i64,
    /// Cached prompt tokens.
    pub cached_tokens: i64,
    /// Prompt tokens actually computed (the prompt less its cached prefix).
    pub prefilled_tokens: i64,
    /// Tokens generated.
    pub completion_tokens: i64,
    /// Arrival to admission, wall clock, ms.
    pub queue_ms: f64,
    /// Prefill device time, ms.
    pub prefill_ms: f64,
    /// Arrival to first token, wall clock, ms.
    pub ttft_ms: f64,
    /// Decode device time, ms.
    pub decode_ms: f64,
    /// First to last token, wall clock, ms.
    pub generation_ms: f64,
    /// tokens/s; `None` when there was no decode step.
    pub decode_tps: Option<f64>,
    /// Arrival to finish, wall clock, ms.
    pub e2e_ms: f64,
    /// Number of legs.
    pub legs: i64,
    /// Moved between paths.
    pub moved: bool,
    /// `error.type` (sets an error status).
    pub error_type: Option<String>,
    /// `slotlight.request.status`, when set.
    pub status: Option<String>,
    /// `slotlight.resume`, when set.
    pub resume: Option<String>,
    /// `slotlight.resume.reusable_tokens`, when set.
    pub reusable_tokens: Option<i64>,
    /// `slotlight.resume.diverged_at`, when set.
    pub diverged_at: Option<i64>,
    /// `slotlight.resume.evicted_tokens`, when set.
    pub evicted_tokens: Option<i64>,
    /// `slotlight.speculation`, when set.
    pub speculation: Option<String>,
    /// `slotlight.usage.drafts`, when set.
    pub drafts: Option<i64>,
    /// `slotlight.usage.drafted_tokens`, when set.
    pub drafted_tokens: Option<i64>,
    /// `slotlight.usage.accepted_tokens`, when set.
    pub accepted_tokens: Option<i64>,
}

impl Default for Usage {
    fn default() -> Self {
        Usage {
            finish_reason: "stop".into(),
            prompt_tokens: 12,
            cached_tokens: 0,
            prefilled_tokens: 12,
            completion_tokens: 16,
            queue_ms: 0.25,
            prefill_ms: 8.5,
            ttft_ms: 9.125,
            decode_ms: 300.0,
            generation_ms: 310.5,
            decode_tps: Some(50.0),
            e2e_ms: 320.75,
            legs: 1,
            moved: false,
            error_type: None,
            status: None,
            resume: None,
            reusable_tokens: None,
            diverged_at: None,
            evicted_tokens: None,
            speculation: None,
            drafts: None,
            drafted_tokens: None,
            accepted_tokens: None,
        }
    }
}

/// A whole request of `windows` decode windows of `per_window` tokens each on `place`,
/// starting at `start_ns`: queue, prefill, windows, leg, request span (in export order).
pub fn whole_request(
    request_id: &str,
    seed: u64,
    start_ns: i64,
    place: Place,
    windows: usize,
    per_window: i64,
) -> Vec<Span> {
    const MS: i64 = 1_000_000;
    let mut r = Request::new(request_id, seed, start_ns);
    let admitted = start_ns + MS;
    let first = admitted + 10 * MS;
    r.first_token_ns = Some(first);
    let mut spans = Vec::with_capacity(windows + 4);
    spans.push(r.queue(place, admitted));
    spans.push(r.prefill(admitted, first, 12, 0));
    let leg = r.leg(0, place, admitted, 0);
    let mut generated = 1;
    let mut t = first;
    let window_ns = 200 * MS;
    for _ in 0..windows {
        let end = t + window_ns;
        generated += per_window;
        spans.push(r.decode(&leg, t, end, per_window, generated));
        t = end;
    }
    spans.push(r.leg_span(&leg, t, generated, "finished"));
    let usage = Usage {
        completion_tokens: generated,
        ..Usage::default()
    };
    spans.push(r.root("bench-model", t + MS, &usage));
    spans
}
