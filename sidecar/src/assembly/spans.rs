//! Wire spans to typed engine spans: the receivers' validation step.
//!
//! [`convert`] reads an OTLP export request once, keeps the engine's spans as [`EngineSpan`]s
//! (typed, with every attribute the assembly needs already parsed), counts spans from other
//! producers as ignored, and rejects engine spans that lack a required attribute (the
//! OTLP partial-success answer reports them). Nothing here touches shared state.

use std::sync::Arc;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use serde::Serialize;
use slotlight_otel::{attr, span as names};

/// A trace id (16 bytes).
pub type TraceId = [u8; 16];

/// Lowercase hex of a trace or span id.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    s
}

/// A decode path: the batch-1 solo path or a batch slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Path {
    /// The solo path (`slotlight.leg.path = solo`).
    Solo,
    /// A batch slot (`slotlight.leg.path = slot`).
    Slot,
}

impl Path {
    /// Parses a `slotlight.leg.path` value.
    pub fn parse(s: &str) -> Option<Path> {
        match s {
            attr::value::PATH_SOLO => Some(Path::Solo),
            attr::value::PATH_SLOT => Some(Path::Slot),
            _ => None,
        }
    }

    /// The wire value.
    pub fn as_str(self) -> &'static str {
        match self {
            Path::Solo => attr::value::PATH_SOLO,
            Path::Slot => attr::value::PATH_SLOT,
        }
    }
}

/// Where a request runs: a row of the slot view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SlotKey {
    /// The device group (`slotlight.slot.group`, 0 on one device).
    pub group: i64,
    /// Solo path or slot.
    pub path: Path,
    /// The slot index within its group; `None` on the solo path.
    pub index: Option<i64>,
}

/// One validated span of the engine.
#[derive(Debug, Clone)]
pub struct EngineSpan {
    /// `service.instance.id` of the engine process that sent it.
    pub instance: Arc<str>,
    /// `service.version` of that process.
    pub service_version: Option<Arc<str>>,
    /// The trace id.
    pub trace_id: TraceId,
    /// Span start, Unix ns.
    pub start_ns: i64,
    /// Span end, Unix ns.
    pub end_ns: i64,
    /// The span's status is an error.
    pub error: bool,
    /// `slotlight.request.id`.
    pub request_id: Box<str>,
    /// `slotlight.session.id`.
    pub session_id: Option<Box<str>>,
    /// What kind of span, with its attributes.
    pub body: Body,
}

/// The kinds of engine span.
#[derive(Debug, Clone)]
pub enum Body {
    /// The request (root) span, named `{operation} {model}`.
    Request(Box<RequestSpan>),
    /// `slotlight.queue`: arrival (start) to admission (end).
    Queue(QueueSpan),
    /// `slotlight.prefill`.
    Prefill(PrefillSpan),
    /// `slotlight.leg`, exported when the leg ends.
    Leg(Box<LegSpan>),
    /// `slotlight.decode`: one progress window.
    Decode(DecodeSpan),
}

/// `slotlight.queue`.
#[derive(Debug, Clone)]
pub struct QueueSpan {
    /// Where the request was admitted.
    pub key: SlotKey,
}

/// `slotlight.prefill`.
#[derive(Debug, Clone, Default)]
pub struct PrefillSpan {
    /// `slotlight.prefill.prompt_tokens`.
    pub prompt_tokens: Option<i64>,
    /// `slotlight.prefill.cached_tokens`.
    pub cached_tokens: Option<i64>,
    /// `slotlight.prefill.computed_tokens`.
    pub computed_tokens: Option<i64>,
    /// `slotlight.prefill.device_ms`.
    pub device_ms: Option<f64>,
}

/// `slotlight.leg`.
#[derive(Debug, Clone)]
pub struct LegSpan {
    /// The leg's path and slot.
    pub key: SlotKey,
    /// `slotlight.leg.index`.
    pub leg_index: i64,
    /// `slotlight.leg.start_time_unix_nano` (the span start when absent).
    pub leg_start_ns: i64,
    /// `slotlight.leg.tokens_carried`.
    pub tokens_carried: Option<i64>,
    /// `slotlight.leg.tokens_generated`.
    pub tokens_generated: Option<i64>,
    /// `slotlight.leg.batch_size.max`.
    pub batch_size_max: Option<i64>,
    /// `slotlight.leg.batch_size.mean`.
    pub batch_size_mean: Option<f64>,
    /// `slotlight.leg.device_ms`.
    pub device_ms: Option<f64>,
    /// `slotlight.leg.end_reason`.
    pub end_reason: Option<String>,
}

/// `slotlight.decode`: a progress window of one decoding request.
#[derive(Debug, Clone)]
pub struct DecodeSpan {
    /// The leg's path and slot.
    pub key: SlotKey,
    /// `slotlight.leg.index` (0 when absent).
    pub leg_index: i64,
    /// `slotlight.leg.start_time_unix_nano` (the request start when absent).
    pub leg_start_ns: i64,
    /// `slotlight.leg.tokens_carried` (0 when absent).
    pub tokens_carried: i64,
    /// `slotlight.decode.window_tokens`.
    pub window_tokens: Option<i64>,
    /// `slotlight.decode.tokens_generated`: the request's total so far, over all legs.
    pub tokens_generated: i64,
    /// `slotlight.decode.last_token_time_unix_nano`.
    pub last_token_ns: i64,
    /// `slotlight.request.start_time_unix_nano`.
    pub request_start_ns: i64,
    /// `slotlight.request.first_token_time_unix_nano`.
    pub first_token_ns: Option<i64>,
}

/// The request (root) span's attributes.
#[derive(Debug, Clone, Default)]
pub struct RequestSpan {
    /// The span name (`chat {model}`).
    pub name: String,
    /// `gen_ai.operation.name`.
    pub operation: Option<String>,
    /// `gen_ai.request.model`.
    pub request_model: Option<String>,
    /// `gen_ai.response.model`.
    pub response_model: Option<String>,
    /// `gen_ai.response.finish_reasons`.
    pub finish_reasons: Vec<String>,
    /// `gen_ai.usage.input_tokens`.
    pub input_tokens: Option<i64>,
    /// `gen_ai.usage.output_tokens`.
    pub output_tokens: Option<i64>,
    /// `gen_ai.usage.cache_read.input_tokens`.
    pub cached_tokens: Option<i64>,
    /// `slotlight.usage.prefilled_tokens`.
    pub prefilled_tokens: Option<i64>,
    /// `slotlight.usage.queue_ms`.
    pub queue_ms: Option<f64>,
    /// `slotlight.usage.prefill_ms`.
    pub prefill_ms: Option<f64>,
    /// `slotlight.usage.ttft_ms`.
    pub ttft_ms: Option<f64>,
    /// `slotlight.usage.decode_ms`.
    pub decode_ms: Option<f64>,
    /// `slotlight.usage.generation_ms`.
    pub generation_ms: Option<f64>,
    /// `slotlight.usage.decode_tps`.
    pub decode_tps: Option<f64>,
    /// `slotlight.usage.e2e_ms`.
    pub e2e_ms: Option<f64>,
    /// `slotlight.request.start_time_unix_nano`.
    pub request_start_ns: Option<i64>,
    /// `slotlight.request.first_token_time_unix_nano`.
    pub first_token_ns: Option<i64>,
    /// `slotlight.request.legs`.
    pub legs: Option<i64>,
    /// `slotlight.request.moved`.
    pub moved: Option<bool>,
    /// `slotlight.slot.group`.
    pub slot_group: Option<i64>,
    /// `error.type`.
    pub error_type: Option<String>,
}

/// Why one engine span was rejected (label of `slotlight_sidecar_spans_rejected_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanReject {
    /// A required attribute is absent.
    MissingAttribute = 0,
    /// A required attribute has the wrong type or an unknown value.
    InvalidAttribute = 1,
    /// The trace id is not 16 bytes, or all zero.
    InvalidId = 2,
    /// The engine's resource has no `service.instance.id`.
    MissingInstance = 3,
}

impl SpanReject {
    /// Every reason, in label order.
    pub const ALL: [SpanReject; 4] = [
        SpanReject::MissingAttribute,
        SpanReject::InvalidAttribute,
        SpanReject::InvalidId,
        SpanReject::MissingInstance,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            SpanReject::MissingAttribute => "missing_attribute",
            SpanReject::InvalidAttribute => "invalid_attribute",
            SpanReject::InvalidId => "invalid_id",
            SpanReject::MissingInstance => "missing_instance",
        }
    }
}

/// The result of [`convert`].
#[derive(Debug, Default)]
pub struct Converted {
    /// The engine's usable spans.
    pub spans: Vec<EngineSpan>,
    /// Every span in the request, all producers.
    pub received: u64,
    /// Spans from other producers, or engine spans the sidecar has no use for.
    pub ignored: u64,
    /// Rejected engine spans, by [`SpanReject`] (indexed by its discriminant).
    pub rejected: [u64; 4],
    /// What was wrong with the first rejected span (the partial-success message).
    pub first_rejection: Option<String>,
}

impl Converted {
    /// All rejected spans.
    pub fn rejected_total(&self) -> u64 {
        self.rejected.iter().sum()
    }

    fn reject(&mut self, why: SpanReject, msg: impl FnOnce() -> String) {
        self.rejected[why as usize] += 1;
        if self.first_rejection.is_none() {
            self.first_rejection = Some(msg());
        }
    }
}

/// Reads every span of `req`; see the module doc.
pub fn convert(req: &ExportTraceServiceRequest) -> Converted {
    let mut out = Converted::default();
    for rs in &req.resource_spans {
        let mut service_name = None;
        let mut instance = None;
        let mut version = None;
        if let Some(res) = &rs.resource {
            for kv in &res.attributes {
                let v = kv.value.as_ref().and_then(|v| v.value.as_ref());
                match kv.key.as_str() {
                    attr::SERVICE_NAME => service_name = v.and_then(as_str),
                    attr::SERVICE_INSTANCE_ID => instance = v.and_then(as_str),
                    attr::SERVICE_VERSION => version = v.and_then(as_str),
                    _ => {}
                }
            }
        }
        let n: u64 = rs.scope_spans.iter().map(|s| s.spans.len() as u64).sum();
        out.received += n;
        if service_name != Some(attr::value::SERVICE_NAME_ENGINE) {
            out.ignored += n;
            continue;
        }
        let instance: Option<Arc<str>> = instance.filter(|s| !s.is_empty()).map(Arc::from);
        let version: Option<Arc<str>> = version.map(Arc::from);
        for ss in &rs.scope_spans {
            for span in &ss.spans {
                if !is_engine_span_name(&span.name) {
                    out.ignored += 1;
                    continue;
                }
                let Some(instance) = instance.clone() else {
                    out.reject(SpanReject::MissingInstance, || {
                        format!(
                            "span {:?}: the resource lacks {}",
                            span.name,
                            attr::SERVICE_INSTANCE_ID
                        )
                    });
                    continue;
                };
                match convert_span(span, instance, version.clone()) {
                    Ok(s) => out.spans.push(s),
                    Err((why, msg)) => out.reject(why, || msg),
                }
            }
        }
    }
    out
}

fn is_engine_span_name(name: &str) -> bool {
    matches!(
        name,
        names::QUEUE | names::PREFILL | names::LEG | names::DECODE
    ) || names::is_request_span_name(name)
}

type Rejection = (SpanReject, String);

fn convert_span(
    span: &opentelemetry_proto::tonic::trace::v1::Span,
    instance: Arc<str>,
    service_version: Option<Arc<str>>,
) -> Result<EngineSpan, Rejection> {
    let trace_id: TraceId = span
        .trace_id
        .as_slice()
        .try_into()
        .ok()
        .filter(|t: &TraceId| t.iter().any(|b| *b != 0))
        .ok_or_else(|| {
            (
                SpanReject::InvalidId,
                format!(
                    "span {:?}: trace id must be 16 bytes, not all zero (got {} bytes)",
                    span.name,
                    span.trace_id.len()
                ),
            )
        })?;
    let f = Fields::scan(&span.attributes);
    let req = Req {
        span_name: &span.name,
    };
    let request_id: Box<str> = req.string(attr::REQUEST_ID, f.request_id)?.into();
    let session_id = f.session_id.and_then(as_str).map(Box::from);
    let start_ns = clamp_ns(span.start_time_unix_nano);
    let end_ns = clamp_ns(span.end_time_unix_nano);
    let error = span
        .status
        .as_ref()
        .is_some_and(|s| s.code == StatusCode::Error as i32);
    let body = match span.name.as_str() {
        names::QUEUE => Body::Queue(QueueSpan {
            key: req.slot_key(&f)?,
        }),
        names::PREFILL => Body::Prefill(PrefillSpan {
            prompt_tokens: f.prefill_prompt.and_then(as_i64),
            cached_tokens: f.prefill_cached.and_then(as_i64),
            computed_tokens: f.prefill_computed.and_then(as_i64),
            device_ms: f.prefill_device_ms.and_then(as_f64),
        }),
        names::LEG => Body::Leg(Box::new(LegSpan {
            key: req.slot_key(&f)?,
            leg_index: req.int(attr::LEG_INDEX, f.leg_index)?,
            leg_start_ns: f.leg_start.and_then(as_i64).unwrap_or(start_ns),
            tokens_carried: f.tokens_carried.and_then(as_i64),
            tokens_generated: f.leg_tokens_generated.and_then(as_i64),
            batch_size_max: f.batch_max.and_then(as_i64),
            batch_size_mean: f.batch_mean.and_then(as_f64),
            device_ms: f.leg_device_ms.and_then(as_f64),
            end_reason: f.leg_end_reason.and_then(as_str).map(String::from),
        })),
        names::DECODE => {
            let request_start_ns = req.int(attr::REQUEST_START_TIME, f.request_start)?;
            Body::Decode(DecodeSpan {
                key: req.slot_key(&f)?,
                leg_index: f.leg_index.and_then(as_i64).unwrap_or(0),
                leg_start_ns: f.leg_start.and_then(as_i64).unwrap_or(request_start_ns),
                tokens_carried: f.tokens_carried.and_then(as_i64).unwrap_or(0),
                window_tokens: f.window_tokens.and_then(as_i64),
                tokens_generated: req.int(attr::DECODE_TOKENS_GENERATED, f.decode_generated)?,
                last_token_ns: req.int(attr::DECODE_LAST_TOKEN_TIME, f.last_token_time)?,
                request_start_ns,
                first_token_ns: f.first_token.and_then(as_i64),
            })
        }
        _ => Body::Request(Box::new(RequestSpan {
            name: span.name.clone(),
            operation: f.op_name.and_then(as_str).map(String::from),
            request_model: f.request_model.and_then(as_str).map(String::from),
            response_model: f.response_model.and_then(as_str).map(String::from),
            finish_reasons: f.finish_reasons.map(as_str_array).unwrap_or_default(),
            input_tokens: f.input_tokens.and_then(as_i64),
            output_tokens: f.output_tokens.and_then(as_i64),
            cached_tokens: f.cache_read.and_then(as_i64),
            prefilled_tokens: f.prefilled_tokens.and_then(as_i64),
            queue_ms: f.queue_ms.and_then(as_f64),
            prefill_ms: f.prefill_ms.and_then(as_f64),
            ttft_ms: f.ttft_ms.and_then(as_f64),
            decode_ms: f.decode_ms.and_then(as_f64),
            generation_ms: f.generation_ms.and_then(as_f64),
            decode_tps: f.decode_tps.and_then(as_f64),
            e2e_ms: f.e2e_ms.and_then(as_f64),
            request_start_ns: f.request_start.and_then(as_i64),
            first_token_ns: f.first_token.and_then(as_i64),
            legs: f.legs.and_then(as_i64),
            moved: f.moved.and_then(as_bool),
            slot_group: f.slot_group.and_then(as_i64),
            error_type: f.error_type.and_then(as_str).map(String::from),
        })),
    };
    Ok(EngineSpan {
        instance,
        service_version,
        trace_id,
        start_ns,
        end_ns,
        error,
        request_id,
        session_id,
        body,
    })
}

fn clamp_ns(t: u64) -> i64 {
    i64::try_from(t).unwrap_or(i64::MAX)
}

/// Required-attribute readers that build the rejection message.
struct Req<'a> {
    span_name: &'a str,
}

impl Req<'_> {
    fn missing(&self, key: &str) -> Rejection {
        (
            SpanReject::MissingAttribute,
            format!("span {:?} lacks required attribute {key}", self.span_name),
        )
    }

    fn invalid(&self, key: &str, want: &str) -> Rejection {
        (
            SpanReject::InvalidAttribute,
            format!("span {:?}: attribute {key} must be {want}", self.span_name),
        )
    }

    fn string<'v>(&self, key: &str, v: Option<&'v Value>) -> Result<&'v str, Rejection> {
        let v = v.ok_or_else(|| self.missing(key))?;
        as_str(v)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| self.invalid(key, "a non-empty string"))
    }

    fn int(&self, key: &str, v: Option<&Value>) -> Result<i64, Rejection> {
        let v = v.ok_or_else(|| self.missing(key))?;
        as_i64(v).ok_or_else(|| self.invalid(key, "an int"))
    }

    fn slot_key(&self, f: &Fields<'_>) -> Result<SlotKey, Rejection> {
        let path = self.string(attr::LEG_PATH, f.leg_path)?;
        let path =
            Path::parse(path).ok_or_else(|| self.invalid(attr::LEG_PATH, "`solo` or `slot`"))?;
        let group = f.slot_group.and_then(as_i64).unwrap_or(0);
        let index = match path {
            Path::Solo => None,
            Path::Slot => Some(self.int(attr::SLOT_INDEX, f.slot_index)?),
        };
        Ok(SlotKey { group, path, index })
    }
}

/// The attributes of one span the sidecar reads, found in one pass.
#[derive(Default)]
struct Fields<'a> {
    request_id: Option<&'a Value>,
    session_id: Option<&'a Value>,
    leg_path: Option<&'a Value>,
    slot_index: Option<&'a Value>,
    slot_group: Option<&'a Value>,
    leg_index: Option<&'a Value>,
    leg_start: Option<&'a Value>,
    tokens_carried: Option<&'a Value>,
    leg_tokens_generated: Option<&'a Value>,
    batch_max: Option<&'a Value>,
    batch_mean: Option<&'a Value>,
    leg_device_ms: Option<&'a Value>,
    leg_end_reason: Option<&'a Value>,
    request_start: Option<&'a Value>,
    first_token: Option<&'a Value>,
    window_tokens: Option<&'a Value>,
    decode_generated: Option<&'a Value>,
    last_token_time: Option<&'a Value>,
    prefill_prompt: Option<&'a Value>,
    prefill_cached: Option<&'a Value>,
    prefill_computed: Option<&'a Value>,
    prefill_device_ms: Option<&'a Value>,
    op_name: Option<&'a Value>,
    request_model: Option<&'a Value>,
    response_model: Option<&'a Value>,
    finish_reasons: Option<&'a Value>,
    input_tokens: Option<&'a Value>,
    output_tokens: Option<&'a Value>,
    cache_read: Option<&'a Value>,
    prefilled_tokens: Option<&'a Value>,
    queue_ms: Option<&'a Value>,
    prefill_ms: Option<&'a Value>,
    ttft_ms: Option<&'a Value>,
    decode_ms: Option<&'a Value>,
    generation_ms: Option<&'a Value>,
    decode_tps: Option<&'a Value>,
    e2e_ms: Option<&'a Value>,
    legs: Option<&'a Value>,
    moved: Option<&'a Value>,
    error_type: Option<&'a Value>,
}

impl<'a> Fields<'a> {
    fn scan(attrs: &'a [KeyValue]) -> Self {
        let mut f = Fields::default();
        for kv in attrs {
            let Some(v) = kv.value.as_ref().and_then(|v| v.value.as_ref()) else {
                continue;
            };
            let slot = match kv.key.as_str() {
                attr::REQUEST_ID => &mut f.request_id,
                attr::SESSION_ID => &mut f.session_id,
                attr::LEG_PATH => &mut f.leg_path,
                attr::SLOT_INDEX => &mut f.slot_index,
                attr::SLOT_GROUP => &mut f.slot_group,
                attr::LEG_INDEX => &mut f.leg_index,
                attr::LEG_START_TIME => &mut f.leg_start,
                attr::LEG_TOKENS_CARRIED => &mut f.tokens_carried,
                attr::LEG_TOKENS_GENERATED => &mut f.leg_tokens_generated,
                attr::LEG_BATCH_SIZE_MAX => &mut f.batch_max,
                attr::LEG_BATCH_SIZE_MEAN => &mut f.batch_mean,
                attr::LEG_DEVICE_MS => &mut f.leg_device_ms,
                attr::LEG_END_REASON => &mut f.leg_end_reason,
                attr::REQUEST_START_TIME => &mut f.request_start,
                attr::REQUEST_FIRST_TOKEN_TIME => &mut f.first_token,
                attr::DECODE_WINDOW_TOKENS => &mut f.window_tokens,
                attr::DECODE_TOKENS_GENERATED => &mut f.decode_generated,
                attr::DECODE_LAST_TOKEN_TIME => &mut f.last_token_time,
                attr::PREFILL_PROMPT_TOKENS => &mut f.prefill_prompt,
                attr::PREFILL_CACHED_TOKENS => &mut f.prefill_cached,
                attr::PREFILL_COMPUTED_TOKENS => &mut f.prefill_computed,
                attr::PREFILL_DEVICE_MS => &mut f.prefill_device_ms,
                attr::GEN_AI_OPERATION_NAME => &mut f.op_name,
                attr::GEN_AI_REQUEST_MODEL => &mut f.request_model,
                attr::GEN_AI_RESPONSE_MODEL => &mut f.response_model,
                attr::GEN_AI_RESPONSE_FINISH_REASONS => &mut f.finish_reasons,
                attr::GEN_AI_USAGE_INPUT_TOKENS => &mut f.input_tokens,
                attr::GEN_AI_USAGE_OUTPUT_TOKENS => &mut f.output_tokens,
                attr::GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS => &mut f.cache_read,
                attr::USAGE_PREFILLED_TOKENS => &mut f.prefilled_tokens,
                attr::USAGE_QUEUE_MS => &mut f.queue_ms,
                attr::USAGE_PREFILL_MS => &mut f.prefill_ms,
                attr::USAGE_TTFT_MS => &mut f.ttft_ms,
                attr::USAGE_DECODE_MS => &mut f.decode_ms,
                attr::USAGE_GENERATION_MS => &mut f.generation_ms,
                attr::USAGE_DECODE_TPS => &mut f.decode_tps,
                attr::USAGE_E2E_MS => &mut f.e2e_ms,
                attr::REQUEST_LEGS => &mut f.legs,
                attr::REQUEST_MOVED => &mut f.moved,
                attr::ERROR_TYPE => &mut f.error_type,
                _ => continue,
            };
            *slot = Some(v);
        }
        f
    }
}

/// A string value.
pub fn as_str(v: &Value) -> Option<&str> {
    match v {
        Value::StringValue(s) => Some(s),
        _ => None,
    }
}

/// An int value; a double holding a whole number also counts.
pub fn as_i64(v: &Value) -> Option<i64> {
    match v {
        Value::IntValue(i) => Some(*i),
        #[allow(clippy::cast_possible_truncation)] // checked: whole and in range
        Value::DoubleValue(d)
            if d.is_finite() && d.fract() == 0.0 && d.abs() < 9.007_199_254_740_992e15 =>
        {
            Some(*d as i64)
        }
        _ => None,
    }
}

/// A double value; an int also counts.
pub fn as_f64(v: &Value) -> Option<f64> {
    match v {
        Value::DoubleValue(d) => Some(*d),
        #[allow(clippy::cast_precision_loss)] // token counts and ms are far below 2^53
        Value::IntValue(i) => Some(*i as f64),
        _ => None,
    }
}

/// A bool value.
pub fn as_bool(v: &Value) -> Option<bool> {
    match v {
        Value::BoolValue(b) => Some(*b),
        _ => None,
    }
}

/// A string array (a lone string counts as one element).
pub fn as_str_array(v: &Value) -> Vec<String> {
    match v {
        Value::ArrayValue(a) => a
            .values
            .iter()
            .filter_map(|v| v.value.as_ref().and_then(as_str))
            .map(String::from)
            .collect(),
        Value::StringValue(s) => vec![s.clone()],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::AnyValue;
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};

    fn kv(k: &str, v: Value) -> KeyValue {
        KeyValue {
            key: k.into(),
            value: Some(AnyValue { value: Some(v) }),
            ..Default::default()
        }
    }

    fn s(v: &str) -> Value {
        Value::StringValue(v.into())
    }

    fn request(
        service: &str,
        instance: Option<&str>,
        spans: Vec<Span>,
    ) -> ExportTraceServiceRequest {
        let mut attrs = vec![kv(attr::SERVICE_NAME, s(service))];
        if let Some(i) = instance {
            attrs.push(kv(attr::SERVICE_INSTANCE_ID, s(i)));
        }
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: attrs,
                    ..Default::default()
                }),
                scope_spans: vec![ScopeSpans {
                    spans,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    fn span(name: &str, attrs: Vec<KeyValue>) -> Span {
        Span {
            trace_id: vec![1; 16],
            span_id: vec![2; 8],
            name: name.into(),
            start_time_unix_nano: 1_000,
            end_time_unix_nano: 2_000,
            attributes: attrs,
            ..Default::default()
        }
    }

    #[test]
    fn decode_window_converts() {
        let req = request(
            attr::value::SERVICE_NAME_ENGINE,
            Some("i1"),
            vec![span(
                names::DECODE,
                vec![
                    kv(attr::REQUEST_ID, s("r1")),
                    kv(attr::LEG_PATH, s(attr::value::PATH_SLOT)),
                    kv(attr::SLOT_INDEX, Value::IntValue(3)),
                    kv(attr::SLOT_GROUP, Value::IntValue(1)),
                    kv(attr::DECODE_TOKENS_GENERATED, Value::IntValue(10)),
                    kv(attr::DECODE_LAST_TOKEN_TIME, Value::IntValue(5)),
                    kv(attr::REQUEST_START_TIME, Value::IntValue(1)),
                ],
            )],
        );
        let c = convert(&req);
        assert_eq!((c.received, c.ignored, c.rejected_total()), (1, 0, 0));
        let Body::Decode(d) = &c.spans[0].body else {
            panic!("not a decode span")
        };
        assert_eq!(
            d.key,
            SlotKey {
                group: 1,
                path: Path::Slot,
                index: Some(3)
            }
        );
        assert_eq!(d.tokens_generated, 10);
        assert_eq!(d.leg_start_ns, 1, "falls back to the request start");
    }

    #[test]
    fn missing_attributes_are_rejected_with_a_message() {
        let req = request(
            attr::value::SERVICE_NAME_ENGINE,
            Some("i1"),
            vec![
                span(names::DECODE, vec![kv(attr::REQUEST_ID, s("r1"))]),
                span(names::QUEUE, vec![]),
                span(
                    names::QUEUE,
                    vec![
                        kv(attr::REQUEST_ID, s("r1")),
                        kv(attr::LEG_PATH, s("sideways")),
                    ],
                ),
                span(
                    names::QUEUE,
                    vec![
                        kv(attr::REQUEST_ID, s("r1")),
                        kv(attr::LEG_PATH, s(attr::value::PATH_SOLO)),
                    ],
                ),
            ],
        );
        let c = convert(&req);
        assert_eq!(c.spans.len(), 1);
        assert_eq!(c.rejected[SpanReject::MissingAttribute as usize], 2);
        assert_eq!(c.rejected[SpanReject::InvalidAttribute as usize], 1);
        let msg = c.first_rejection.expect("message");
        assert!(
            msg.contains(names::DECODE) && msg.contains(attr::REQUEST_START_TIME),
            "{msg}"
        );
    }

    #[test]
    fn other_producers_and_unknown_names_are_ignored() {
        let mut req = request("checkout", Some("x"), vec![span(names::QUEUE, vec![])]);
        let engine = request(
            attr::value::SERVICE_NAME_ENGINE,
            Some("i"),
            vec![span("some.other.span", vec![])],
        );
        req.resource_spans.extend(engine.resource_spans);
        let c = convert(&req);
        assert_eq!((c.received, c.ignored, c.rejected_total()), (2, 2, 0));
    }

    #[test]
    fn engine_without_instance_is_rejected() {
        let req = request(
            attr::value::SERVICE_NAME_ENGINE,
            None,
            vec![span("chat m", vec![kv(attr::REQUEST_ID, s("r"))])],
        );
        let c = convert(&req);
        assert_eq!(c.rejected[SpanReject::MissingInstance as usize], 1);
    }

    #[test]
    fn bad_trace_id_is_rejected() {
        let mut sp = span("chat m", vec![kv(attr::REQUEST_ID, s("r"))]);
        sp.trace_id = vec![0; 16];
        let c = convert(&request(
            attr::value::SERVICE_NAME_ENGINE,
            Some("i"),
            vec![sp],
        ));
        assert_eq!(c.rejected[SpanReject::InvalidId as usize], 1);
    }

    #[test]
    fn request_span_reads_usage() {
        let req = request(
            attr::value::SERVICE_NAME_ENGINE,
            Some("i"),
            vec![span(
                "chat m",
                vec![
                    kv(attr::REQUEST_ID, s("r")),
                    kv(attr::USAGE_TTFT_MS, Value::DoubleValue(12.5)),
                    kv(
                        attr::GEN_AI_RESPONSE_FINISH_REASONS,
                        Value::ArrayValue(opentelemetry_proto::tonic::common::v1::ArrayValue {
                            values: vec![AnyValue {
                                value: Some(s("stop")),
                            }],
                        }),
                    ),
                    kv(attr::GEN_AI_USAGE_OUTPUT_TOKENS, Value::IntValue(7)),
                ],
            )],
        );
        let c = convert(&req);
        let Body::Request(r) = &c.spans[0].body else {
            panic!("not a request span")
        };
        assert_eq!(r.ttft_ms, Some(12.5));
        assert_eq!(r.finish_reasons, vec!["stop".to_string()]);
        assert_eq!(r.output_tokens, Some(7));
    }

    #[test]
    fn hex_is_lowercase() {
        assert_eq!(hex(&[0x0a, 0xff]), "0aff");
    }
}
