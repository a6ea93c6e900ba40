//! The span decoder: wire spans to typed engine spans ([`crate::records::spans`]), the receivers'
//! validation step.
//!
//! [`convert`] reads an encoded OTLP export request once, with the zero-copy reader in
//! [`super::otlp`], keeps the engine's spans as [`EngineSpan`]s
//! (typed, with every attribute the assembly needs already parsed), counts spans from other
//! producers as ignored, and rejects engine spans that lack a required attribute (the
//! OTLP partial-success answer reports them, by [`SpanReject`]). Every span, all producers,
//! also goes into the spanmetrics batch. Nothing here touches shared state.

use std::sync::Arc;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use prost::Message;
use slotlight_otel::{attr, span as names};

use super::otlp::{self, Value, WireError};
use crate::base::error::SpanReject;
use crate::metrics::spanmetrics::SpanBatch;
use crate::records::spans::{
    Body, DecodeSpan, EngineSpan, LegSpan, Path, PrefillSpan, PrefillWindowSpan, QueueSpan,
    RequestSpan, SlotKey, TraceId,
};
use crate::records::usage::{AttrValue, UsageTiming};

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

/// Reads every span of an encoded `ExportTraceServiceRequest` in one pass; see the module
/// doc. Every span (all producers) is also added to `stats` for the spanmetrics series.
pub fn convert<'a>(buf: &'a [u8], stats: &mut SpanBatch<'a>) -> Result<Converted, WireError> {
    let mut out = Converted::default();
    let mut top = otlp::Fields::new(buf);
    while let Some((n, w)) = top.next()? {
        if n == 1 {
            resource_spans(otlp::bytes(w)?, &mut out, stats)?;
        }
    }
    Ok(out)
}

/// [`convert`] for an owned request (encodes it first): the JSON path and tests.
pub fn convert_request(req: &ExportTraceServiceRequest) -> Result<Converted, WireError> {
    let buf = req.encode_to_vec();
    let mut stats = SpanBatch::default();
    convert(&buf, &mut stats)
}

struct ResourceCtx<'a> {
    service: &'a str,
    engine: bool,
    instance: Option<Arc<str>>,
    version: Option<Arc<str>>,
}

fn resource_spans<'a>(
    buf: &'a [u8],
    out: &mut Converted,
    stats: &mut SpanBatch<'a>,
) -> Result<(), WireError> {
    let mut service = None;
    let mut instance = None;
    let mut version = None;
    let mut scopes: Vec<&'a [u8]> = Vec::new();
    let mut f = otlp::Fields::new(buf);
    while let Some((n, w)) = f.next()? {
        match n {
            1 => {
                let mut r = otlp::Fields::new(otlp::bytes(w)?);
                while let Some((n, w)) = r.next()? {
                    if n != 1 {
                        continue;
                    }
                    let (k, v) = otlp::key_value(otlp::bytes(w)?)?;
                    let slot = if k == attr::SERVICE_NAME.as_bytes() {
                        &mut service
                    } else if k == attr::SERVICE_INSTANCE_ID.as_bytes() {
                        &mut instance
                    } else if k == attr::SERVICE_VERSION.as_bytes() {
                        &mut version
                    } else {
                        continue;
                    };
                    *slot = Value::decode(v)?.as_str();
                }
            }
            2 => scopes.push(otlp::bytes(w)?),
            _ => {}
        }
    }
    let engine = service == Some(attr::value::SERVICE_NAME_ENGINE);
    let ctx = ResourceCtx {
        service: service.unwrap_or(UNKNOWN_SERVICE),
        engine,
        instance: if engine {
            instance.filter(|s| !s.is_empty()).map(Arc::from)
        } else {
            None
        },
        version: if engine { version.map(Arc::from) } else { None },
    };
    for scope in scopes {
        let mut f = otlp::Fields::new(scope);
        while let Some((n, w)) = f.next()? {
            if n == 2 {
                span(otlp::bytes(w)?, &ctx, out, stats)?;
            }
        }
    }
    Ok(())
}

/// The `service_name` of spans whose resource has none (as the OpenTelemetry SDKs default).
pub const UNKNOWN_SERVICE: &str = "unknown_service";

/// The parts of a span every producer's spans are read for.
struct SpanHead<'a> {
    trace_id: &'a [u8],
    name: &'a str,
    start: u64,
    end: u64,
    status: i32,
}

fn span<'a>(
    buf: &'a [u8],
    ctx: &ResourceCtx<'a>,
    out: &mut Converted,
    stats: &mut SpanBatch<'a>,
) -> Result<(), WireError> {
    out.received += 1;
    let mut head = SpanHead {
        trace_id: &[],
        name: "",
        start: 0,
        end: 0,
        status: 0,
    };
    let mut kind = 0;
    let mut fields = Fields::default();
    let mut f = otlp::Fields::new(buf);
    while let Some((n, w)) = f.next()? {
        match n {
            1 => head.trace_id = otlp::bytes(w)?,
            5 => head.name = otlp::string(w)?,
            #[allow(clippy::cast_possible_truncation)] // an enum: protobuf truncates to 32 bits
            6 => kind = otlp::varint(w)? as i32,
            7 => head.start = otlp::fixed64(w)?,
            8 => head.end = otlp::fixed64(w)?,
            9 if ctx.engine => {
                let (k, v) = otlp::key_value(otlp::bytes(w)?)?;
                if let Some(id) = field_id(k) {
                    fields.0[id] = Some(Value::decode(v)?).filter(|v| *v != Value::Other);
                }
            }
            15 => {
                let mut st = otlp::Fields::new(otlp::bytes(w)?);
                while let Some((n, w)) = st.next()? {
                    if n == 3 {
                        #[allow(clippy::cast_possible_truncation)] // an enum, as above
                        {
                            head.status = otlp::varint(w)? as i32;
                        }
                    }
                }
            }
            _ => {}
        }
    }
    stats.observe(
        (ctx.service, head.name, kind, head.status),
        head.start,
        head.end,
        head.trace_id,
    );
    if !ctx.engine || !is_engine_span_name(head.name) {
        out.ignored += 1;
        return Ok(());
    }
    let Some(instance) = ctx.instance.clone() else {
        out.reject(SpanReject::MissingInstance, || {
            format!(
                "span {:?}: the resource lacks {}",
                head.name,
                attr::SERVICE_INSTANCE_ID
            )
        });
        return Ok(());
    };
    match convert_span(&head, &fields, instance, ctx.version.clone()) {
        Ok(s) => out.spans.push(s),
        Err((why, msg)) => out.reject(why, || msg),
    }
    Ok(())
}

fn is_engine_span_name(name: &str) -> bool {
    matches!(
        name,
        names::QUEUE | names::PREFILL | names::PREFILL_WINDOW | names::LEG | names::DECODE
    ) || names::is_request_span_name(name)
}

type Rejection = (SpanReject, String);

fn convert_span(
    head: &SpanHead<'_>,
    f: &Fields<'_>,
    instance: Arc<str>,
    service_version: Option<Arc<str>>,
) -> Result<EngineSpan, Rejection> {
    let trace_id: TraceId = head
        .trace_id
        .try_into()
        .ok()
        .filter(|t: &TraceId| t.iter().any(|b| *b != 0))
        .ok_or_else(|| {
            (
                SpanReject::InvalidId,
                format!(
                    "span {:?}: trace id must be 16 bytes, not all zero (got {} bytes)",
                    head.name,
                    head.trace_id.len()
                ),
            )
        })?;
    let req = Req {
        span_name: head.name,
    };
    let request_id: Box<str> = req.string(attr::REQUEST_ID, f.get(F::RequestId))?.into();
    let session_id = f.get(F::SessionId).and_then(Value::as_str).map(Box::from);
    let start_ns = clamp_ns(head.start);
    let end_ns = clamp_ns(head.end);
    let error = head.status == StatusCode::Error as i32;
    let int = |v: Option<Value<'_>>| v.and_then(Value::as_i64);
    let dbl = |v: Option<Value<'_>>| v.and_then(Value::as_f64);
    let text = |v: Option<Value<'_>>| v.and_then(Value::as_str).map(String::from);
    let body = match head.name {
        names::QUEUE => Body::Queue(QueueSpan {
            key: req.slot_key(f)?,
        }),
        names::PREFILL => Body::Prefill(PrefillSpan {
            prompt_tokens: int(f.get(F::PrefillPrompt)),
            cached_tokens: int(f.get(F::PrefillCached)),
            computed_tokens: int(f.get(F::PrefillComputed)),
            device_ms: dbl(f.get(F::PrefillDeviceMs)),
        }),
        names::LEG => Body::Leg(Box::new(LegSpan {
            key: req.slot_key(f)?,
            leg_index: req.int(attr::LEG_INDEX, f.get(F::LegIndex))?,
            choice: int(f.get(F::ChoiceIndex)).unwrap_or(0),
            leg_start_ns: int(f.get(F::LegStart)).unwrap_or(start_ns),
            tokens_carried: int(f.get(F::TokensCarried)),
            tokens_generated: int(f.get(F::LegTokensGenerated)),
            batch_size_max: int(f.get(F::BatchMax)),
            batch_size_mean: dbl(f.get(F::BatchMean)),
            device_ms: dbl(f.get(F::LegDeviceMs)),
            drafted_tokens: int(f.get(F::LegDrafted)),
            accepted_tokens: int(f.get(F::LegAccepted)),
            end_reason: text(f.get(F::LegEndReason)),
        })),
        names::PREFILL_WINDOW => Body::PrefillWindow(PrefillWindowSpan {
            key: f.get(F::LegPath).and(req.slot_key(f).ok()),
            leg_index: int(f.get(F::LegIndex)).unwrap_or(0),
            tokens_carried: int(f.get(F::TokensCarried)).unwrap_or(0),
            total: req.int(attr::PREFILL_PROMPT_TOKENS, f.get(F::PrefillPrompt))?,
            cached: int(f.get(F::PrefillCached)).unwrap_or(0),
            processed: req.int(attr::PREFILL_PROCESSED_TOKENS, f.get(F::PrefillProcessed))?,
            window_tokens: int(f.get(F::PrefillWindowTokens)),
            prefill_start_ns: int(f.get(F::PrefillStart)).unwrap_or(start_ns),
            last_chunk_ns: int(f.get(F::PrefillLastChunk)).unwrap_or(end_ns),
            request_start_ns: req.int(attr::REQUEST_START_TIME, f.get(F::RequestStart))?,
        }),
        names::DECODE => {
            let request_start_ns = req.int(attr::REQUEST_START_TIME, f.get(F::RequestStart))?;
            Body::Decode(DecodeSpan {
                key: req.slot_key(f)?,
                leg_index: int(f.get(F::LegIndex)).unwrap_or(0),
                leg_start_ns: int(f.get(F::LegStart)).unwrap_or(request_start_ns),
                tokens_carried: int(f.get(F::TokensCarried)).unwrap_or(0),
                window_tokens: int(f.get(F::WindowTokens)),
                window_steps: int(f.get(F::WindowSteps)),
                drafted_tokens: int(f.get(F::DecodeDrafted)),
                accepted_tokens: int(f.get(F::DecodeAccepted)),
                tokens_generated: req
                    .int(attr::DECODE_TOKENS_GENERATED, f.get(F::DecodeGenerated))?,
                last_token_ns: req.int(attr::DECODE_LAST_TOKEN_TIME, f.get(F::LastTokenTime))?,
                request_start_ns,
                first_token_ns: int(f.get(F::FirstToken)),
            })
        }
        _ => Body::Request(Box::new(RequestSpan {
            name: head.name.to_string(),
            operation: text(f.get(F::OpName)),
            provider: text(f.get(F::ProviderName)),
            status: text(f.get(F::Status)),
            request_model: text(f.get(F::RequestModel)),
            response_model: text(f.get(F::ResponseModel)),
            finish_reasons: f
                .get(F::FinishReasons)
                .map(Value::as_str_array)
                .unwrap_or_default(),
            usage: f.usage(),
            sampling_ratio: dbl(f.get(F::SamplingRatio)),
            data_parallel_rank: int(f.get(F::DataParallelRank)),
            request_start_ns: int(f.get(F::RequestStart)),
            first_token_ns: int(f.get(F::FirstToken)),
            legs: int(f.get(F::Legs)),
            moved: f.get(F::Moved).and_then(Value::as_bool),
            slot_group: int(f.get(F::SlotGroup)),
            api: text(f.get(F::Api)),
            session_source: text(f.get(F::SessionSource)),
            session_turn: int(f.get(F::SessionTurn)),
            session_extends: text(f.get(F::SessionExtends)),
            session_branch: int(f.get(F::SessionBranch)),
            session_side_call: f.get(F::SessionSideCall).and_then(Value::as_bool),
            session_kv_ttl_ms: dbl(f.get(F::SessionKvTtl)),
            error_type: text(f.get(F::ErrorType)),
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

    fn string<'v>(&self, key: &str, v: Option<Value<'v>>) -> Result<&'v str, Rejection> {
        let v = v.ok_or_else(|| self.missing(key))?;
        v.as_str()
            .filter(|s| !s.is_empty())
            .ok_or_else(|| self.invalid(key, "a non-empty string"))
    }

    fn int(&self, key: &str, v: Option<Value<'_>>) -> Result<i64, Rejection> {
        let v = v.ok_or_else(|| self.missing(key))?;
        v.as_i64().ok_or_else(|| self.invalid(key, "an int"))
    }

    fn slot_key(&self, f: &Fields<'_>) -> Result<SlotKey, Rejection> {
        let path = self.string(attr::LEG_PATH, f.get(F::LegPath))?;
        let path =
            Path::parse(path).ok_or_else(|| self.invalid(attr::LEG_PATH, "`solo` or `slot`"))?;
        let group = f.get(F::SlotGroup).and_then(Value::as_i64).unwrap_or(0);
        let index = match path {
            Path::Solo => None,
            Path::Slot => Some(self.int(attr::SLOT_INDEX, f.get(F::SlotIndex))?),
        };
        Ok(SlotKey { group, path, index })
    }
}

/// The attributes the sidecar reads besides the usage record's, by position in [`Fields`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum F {
    RequestId,
    SessionId,
    LegPath,
    SlotIndex,
    SlotGroup,
    LegIndex,
    LegStart,
    TokensCarried,
    LegTokensGenerated,
    BatchMax,
    BatchMean,
    LegDeviceMs,
    LegDrafted,
    LegAccepted,
    LegEndReason,
    RequestStart,
    FirstToken,
    WindowTokens,
    WindowSteps,
    DecodeDrafted,
    DecodeAccepted,
    DecodeGenerated,
    LastTokenTime,
    PrefillPrompt,
    PrefillCached,
    PrefillComputed,
    PrefillDeviceMs,
    PrefillProcessed,
    PrefillWindowTokens,
    PrefillStart,
    PrefillLastChunk,
    OpName,
    ProviderName,
    Status,
    RequestModel,
    ResponseModel,
    FinishReasons,
    Legs,
    Moved,
    ChoiceIndex,
    SamplingRatio,
    DataParallelRank,
    Api,
    SessionSource,
    SessionTurn,
    SessionExtends,
    SessionBranch,
    SessionSideCall,
    SessionKvTtl,
    /// Must stay last: [`N_FIELDS`] counts up to it.
    ErrorType,
}

/// Number of [`F`] variants.
const N_FIELDS: usize = F::ErrorType as usize + 1;

/// The attribute key of each [`F`] (the usage record names its own: [`UsageTiming::KEYS`]).
const KEYS: [(&str, F); N_FIELDS] = [
    (attr::REQUEST_ID, F::RequestId),
    (attr::GEN_AI_CONVERSATION_ID, F::SessionId),
    (attr::LEG_PATH, F::LegPath),
    (attr::SLOT_INDEX, F::SlotIndex),
    (attr::SLOT_GROUP, F::SlotGroup),
    (attr::LEG_INDEX, F::LegIndex),
    (attr::LEG_START_TIME, F::LegStart),
    (attr::LEG_TOKENS_CARRIED, F::TokensCarried),
    (attr::LEG_TOKENS_GENERATED, F::LegTokensGenerated),
    (attr::LEG_BATCH_SIZE_MAX, F::BatchMax),
    (attr::LEG_BATCH_SIZE_MEAN, F::BatchMean),
    (attr::LEG_DEVICE_MS, F::LegDeviceMs),
    (attr::LEG_DRAFTED_TOKENS, F::LegDrafted),
    (attr::LEG_ACCEPTED_TOKENS, F::LegAccepted),
    (attr::LEG_END_REASON, F::LegEndReason),
    (attr::CHOICE_INDEX, F::ChoiceIndex),
    (attr::REQUEST_START_TIME, F::RequestStart),
    (attr::REQUEST_FIRST_TOKEN_TIME, F::FirstToken),
    (attr::DECODE_WINDOW_TOKENS, F::WindowTokens),
    (attr::DECODE_WINDOW_STEPS, F::WindowSteps),
    (attr::DECODE_DRAFTED_TOKENS, F::DecodeDrafted),
    (attr::DECODE_ACCEPTED_TOKENS, F::DecodeAccepted),
    (attr::DECODE_TOKENS_GENERATED, F::DecodeGenerated),
    (attr::DECODE_LAST_TOKEN_TIME, F::LastTokenTime),
    (attr::PREFILL_PROMPT_TOKENS, F::PrefillPrompt),
    (attr::PREFILL_CACHED_TOKENS, F::PrefillCached),
    (attr::PREFILL_COMPUTED_TOKENS, F::PrefillComputed),
    (attr::PREFILL_DEVICE_MS, F::PrefillDeviceMs),
    (attr::PREFILL_PROCESSED_TOKENS, F::PrefillProcessed),
    (attr::PREFILL_WINDOW_TOKENS, F::PrefillWindowTokens),
    (attr::PREFILL_START_TIME, F::PrefillStart),
    (attr::PREFILL_LAST_CHUNK_TIME, F::PrefillLastChunk),
    (attr::GEN_AI_OPERATION_NAME, F::OpName),
    (attr::GEN_AI_PROVIDER_NAME, F::ProviderName),
    (attr::REQUEST_STATUS, F::Status),
    (attr::GEN_AI_REQUEST_MODEL, F::RequestModel),
    (attr::GEN_AI_RESPONSE_MODEL, F::ResponseModel),
    (attr::GEN_AI_RESPONSE_FINISH_REASONS, F::FinishReasons),
    (attr::REQUEST_LEGS, F::Legs),
    (attr::REQUEST_MOVED, F::Moved),
    (attr::TRACE_SAMPLING_RATIO, F::SamplingRatio),
    (attr::ENGINE_DATA_PARALLEL_RANK, F::DataParallelRank),
    (attr::API, F::Api),
    (attr::SESSION_SOURCE, F::SessionSource),
    (attr::SESSION_TURN, F::SessionTurn),
    (attr::SESSION_EXTENDS, F::SessionExtends),
    (attr::SESSION_BRANCH, F::SessionBranch),
    (attr::SESSION_SIDE_CALL, F::SessionSideCall),
    (attr::SESSION_KV_TTL_MS, F::SessionKvTtl),
    (attr::ERROR_TYPE, F::ErrorType),
];

/// Number of the usage record's attributes ([`UsageTiming::KEYS`]): in [`Fields`], after
/// the [`F`]s.
const N_USAGE: usize = UsageTiming::KEYS.len();

/// The longest key read plus one (keys are looked up by length first).
const MAX_KEY: usize = 64;

/// The keys read ([`KEYS`], then [`UsageTiming::KEYS`]) with their positions in [`Fields`],
/// bucketed by key length: an attribute key costs one or two comparisons instead of a walk
/// over every known key.
type Bucket = Vec<(&'static [u8], usize)>;

fn key_buckets() -> &'static [Bucket] {
    static BUCKETS: std::sync::OnceLock<Vec<Bucket>> = std::sync::OnceLock::new();
    BUCKETS.get_or_init(|| {
        let mut b = vec![Vec::new(); MAX_KEY];
        let fields = KEYS.iter().map(|&(k, f)| (k, f as usize));
        let usage = (UsageTiming::KEYS.iter().enumerate()).map(|(i, &k)| (k, N_FIELDS + i));
        for (k, at) in fields.chain(usage) {
            debug_assert!(k.len() < MAX_KEY, "{k} is longer than MAX_KEY");
            if let Some(bucket) = b.get_mut(k.len()) {
                bucket.push((k.as_bytes(), at));
            }
        }
        b
    })
}

/// Where the attribute `key` goes in [`Fields`], if the sidecar reads it.
fn field_id(key: &[u8]) -> Option<usize> {
    key_buckets()
        .get(key.len())?
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, at)| *at)
}

/// The attributes of one span the sidecar reads, found in one pass: the [`F`]s, then the
/// usage record's.
struct Fields<'a>([Option<Value<'a>>; N_FIELDS + N_USAGE]);

impl Default for Fields<'_> {
    fn default() -> Self {
        Fields([None; N_FIELDS + N_USAGE])
    }
}

impl<'a> Fields<'a> {
    fn get(&self, f: F) -> Option<Value<'a>> {
        self.0[f as usize]
    }

    /// The usage record, from its attributes.
    fn usage(&self) -> UsageTiming {
        UsageTiming::read(|i| self.0[N_FIELDS + i])
    }
}

impl AttrValue for Value<'_> {
    fn int(self) -> Option<i64> {
        self.as_i64()
    }

    fn double(self) -> Option<f64> {
        self.as_f64()
    }

    fn text(self) -> Option<String> {
        self.as_str().map(String::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::AnyValue;
    use opentelemetry_proto::tonic::common::v1::KeyValue;
    use opentelemetry_proto::tonic::common::v1::any_value::Value as PValue;
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};

    fn kv(k: &str, v: PValue) -> KeyValue {
        KeyValue {
            key: k.into(),
            value: Some(AnyValue { value: Some(v) }),
            ..Default::default()
        }
    }

    fn s(v: &str) -> PValue {
        PValue::StringValue(v.into())
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
                    kv(attr::SLOT_INDEX, PValue::IntValue(3)),
                    kv(attr::SLOT_GROUP, PValue::IntValue(1)),
                    kv(attr::DECODE_TOKENS_GENERATED, PValue::IntValue(10)),
                    kv(attr::DECODE_LAST_TOKEN_TIME, PValue::IntValue(5)),
                    kv(attr::REQUEST_START_TIME, PValue::IntValue(1)),
                ],
            )],
        );
        let c = convert_request(&req).expect("decodes");
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
        let c = convert_request(&req).expect("decodes");
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
        let c = convert_request(&req).expect("decodes");
        assert_eq!((c.received, c.ignored, c.rejected_total()), (2, 2, 0));
    }

    #[test]
    fn engine_without_instance_is_rejected() {
        let req = request(
            attr::value::SERVICE_NAME_ENGINE,
            None,
            vec![span("chat m", vec![kv(attr::REQUEST_ID, s("r"))])],
        );
        let c = convert_request(&req).expect("decodes");
        assert_eq!(c.rejected[SpanReject::MissingInstance as usize], 1);
    }

    #[test]
    fn bad_trace_id_is_rejected() {
        let mut sp = span("chat m", vec![kv(attr::REQUEST_ID, s("r"))]);
        sp.trace_id = vec![0; 16];
        let c = convert_request(&request(
            attr::value::SERVICE_NAME_ENGINE,
            Some("i"),
            vec![sp],
        ))
        .expect("decodes");
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
                    kv(attr::USAGE_TTFT_MS, PValue::DoubleValue(12.5)),
                    kv(
                        attr::GEN_AI_RESPONSE_FINISH_REASONS,
                        PValue::ArrayValue(opentelemetry_proto::tonic::common::v1::ArrayValue {
                            values: vec![AnyValue {
                                value: Some(s("stop")),
                            }],
                        }),
                    ),
                    kv(attr::GEN_AI_USAGE_OUTPUT_TOKENS, PValue::IntValue(7)),
                    kv(
                        attr::GEN_AI_USAGE_REASONING_OUTPUT_TOKENS,
                        PValue::IntValue(5),
                    ),
                ],
            )],
        );
        let c = convert_request(&req).expect("decodes");
        let Body::Request(r) = &c.spans[0].body else {
            panic!("not a request span")
        };
        assert_eq!(r.usage.ttft_ms, Some(12.5));
        assert_eq!(r.finish_reasons, vec!["stop".to_string()]);
        assert_eq!(r.usage.completion_tokens, Some(7));
        assert_eq!(r.usage.reasoning_tokens, Some(5));
    }

    #[test]
    fn request_span_reads_resume() {
        let req = request(
            attr::value::SERVICE_NAME_ENGINE,
            Some("i"),
            vec![
                span(
                    "chat m",
                    vec![
                        kv(attr::REQUEST_ID, s("r")),
                        kv(attr::RESUME, s(attr::value::RESUME_EVICTED)),
                        kv(attr::RESUME_REUSABLE_TOKENS, PValue::IntValue(96)),
                        kv(attr::RESUME_DIVERGED_AT, PValue::IntValue(80)),
                        kv(attr::RESUME_EVICTED_TOKENS, PValue::IntValue(32)),
                    ],
                ),
                span("chat m", vec![kv(attr::REQUEST_ID, s("never-admitted"))]),
            ],
        );
        let c = convert_request(&req).expect("decodes");
        let [Body::Request(r), Body::Request(none)] = [&c.spans[0].body, &c.spans[1].body] else {
            panic!("not request spans")
        };
        assert_eq!(r.usage.resume.as_deref(), Some(attr::value::RESUME_EVICTED));
        assert_eq!(r.usage.reusable_tokens, Some(96));
        assert_eq!(r.usage.diverged_at, Some(80));
        assert_eq!(r.usage.evicted_tokens, Some(32));
        assert_eq!(none.usage.resume, None);
        assert_eq!(none.usage.reusable_tokens, None);
        assert_eq!(none.usage.diverged_at, None);
        assert_eq!(none.usage.evicted_tokens, None);
    }

    /// Speculative decoding's counts, on the request span, a leg and a decode window; an
    /// engine that does not send them leaves every one `None` (never 0).
    #[test]
    fn draft_counts_are_read_from_request_leg_and_window() {
        let slot = || {
            vec![
                kv(attr::LEG_PATH, s(attr::value::PATH_SLOT)),
                kv(attr::SLOT_INDEX, PValue::IntValue(0)),
                kv(attr::LEG_INDEX, PValue::IntValue(1)),
            ]
        };
        let mut leg = slot();
        leg.extend([
            kv(attr::REQUEST_ID, s("r")),
            kv(attr::LEG_DRAFTED_TOKENS, PValue::IntValue(40)),
            kv(attr::LEG_ACCEPTED_TOKENS, PValue::IntValue(30)),
        ]);
        let mut window = slot();
        window.extend([
            kv(attr::REQUEST_ID, s("r")),
            kv(attr::REQUEST_START_TIME, PValue::IntValue(1)),
            kv(attr::DECODE_TOKENS_GENERATED, PValue::IntValue(50)),
            kv(attr::DECODE_LAST_TOKEN_TIME, PValue::IntValue(5)),
            kv(attr::DECODE_WINDOW_STEPS, PValue::IntValue(4)),
            kv(attr::DECODE_DRAFTED_TOKENS, PValue::IntValue(12)),
            kv(attr::DECODE_ACCEPTED_TOKENS, PValue::IntValue(9)),
        ]);
        let req = request(
            attr::value::SERVICE_NAME_ENGINE,
            Some("i"),
            vec![
                span(
                    "chat m",
                    vec![
                        kv(attr::REQUEST_ID, s("r")),
                        kv(attr::SPECULATION, s(attr::value::SPECULATION_PREDICTION)),
                        kv(attr::USAGE_DRAFTS, PValue::IntValue(8)),
                        kv(attr::USAGE_DRAFTED_TOKENS, PValue::IntValue(40)),
                        kv(attr::USAGE_ACCEPTED_TOKENS, PValue::IntValue(30)),
                    ],
                ),
                span(names::LEG, leg),
                span(names::DECODE, window),
                span("chat m", vec![kv(attr::REQUEST_ID, s("older-engine"))]),
            ],
        );
        let c = convert_request(&req).expect("decodes");
        assert_eq!(c.rejected_total(), 0, "{:?}", c.first_rejection);
        let [
            Body::Request(r),
            Body::Leg(l),
            Body::Decode(d),
            Body::Request(old),
        ] = [
            &c.spans[0].body,
            &c.spans[1].body,
            &c.spans[2].body,
            &c.spans[3].body,
        ]
        else {
            panic!("not a request, a leg, a window and a request")
        };
        assert_eq!(
            r.usage.speculation.as_deref(),
            Some(attr::value::SPECULATION_PREDICTION)
        );
        assert_eq!(
            (
                r.usage.drafts,
                r.usage.drafted_tokens,
                r.usage.accepted_tokens
            ),
            (Some(8), Some(40), Some(30))
        );
        assert_eq!((l.drafted_tokens, l.accepted_tokens), (Some(40), Some(30)));
        assert_eq!(
            (d.window_steps, d.drafted_tokens, d.accepted_tokens),
            (Some(4), Some(12), Some(9))
        );
        assert_eq!(old.usage.speculation, None);
        assert_eq!(
            (
                old.usage.drafts,
                old.usage.drafted_tokens,
                old.usage.accepted_tokens
            ),
            (None, None, None)
        );
    }

    #[test]
    fn each_key_has_one_place() {
        let mut keys: Vec<&str> = KEYS.iter().map(|(k, _)| *k).collect();
        keys.extend(UsageTiming::KEYS);
        let n = keys.len();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), n, "a key read twice");
        assert!(keys.iter().all(|k| k.len() < MAX_KEY));
    }
}
