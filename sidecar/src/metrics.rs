//! Prometheus / OpenMetrics exposition, written by hand.
//!
//! Three sources: the sidecar's own counters (atomics, bumped by receivers and the assembly),
//! the spanmetrics-compatible `traces_span_metrics_*` over every span received (merged once per
//! export request), and per-request histograms and counters observed from each turn record.
//! Live gauges (running requests, each slot's rate) are read from the latest slot snapshot at
//! scrape time. Every name comes from [`slotlight_otel::metric`]; `# HELP` is the contract's doc.
//!
//! Label sets are bounded: models and span-metric series are capped (overflow goes to an
//! `_overflow` series) and no request or trace id is ever a label (trace ids appear only as
//! OpenMetrics exemplars).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use slotlight_otel::metric::{self, buckets, label};

use crate::assembly::slots::SlotsSnapshot;
use crate::assembly::turns::{TurnRecord, TurnStatus};
use crate::error::IngestError;
use crate::histogram::{Exemplar, Histogram};
use crate::spans::{SpanBatch, SpanReject};
use crate::vocab::hex;

/// Label value for series beyond a cardinality cap.
pub const OVERFLOW: &str = "_overflow";
/// Most distinct GenAI label sets (operation, provider, request and response model).
const MAX_SERIES: usize = 64;
/// Most distinct (status, finish reason, error type) per GenAI label set.
const MAX_OUTCOMES: usize = 32;

/// Why a request was evicted from the assembly.
#[derive(Debug, Clone, Copy)]
pub enum EvictReason {
    /// The in-flight map was full.
    Capacity = 0,
    /// No span for `--trace-ttl-s`.
    Ttl = 1,
}

impl EvictReason {
    fn label(self) -> &'static str {
        match self {
            EvictReason::Capacity => "capacity",
            EvictReason::Ttl => "ttl",
        }
    }
}

const REQUEST_REJECT_LABELS: [&str; 5] = [
    "malformed",
    "too_large",
    "unsupported_media_type",
    "overloaded",
    "forbidden",
];

/// Every metric the sidecar serves.
#[derive(Debug)]
pub struct Metrics {
    spans_received: AtomicU64,
    spans_ignored: AtomicU64,
    spans_dropped: AtomicU64,
    spans_late: AtomicU64,
    spans_rejected: [AtomicU64; 4],
    requests_rejected: [AtomicU64; 5],
    traces_evicted: [AtomicU64; 2],
    traces_in_flight: AtomicU64,
    metric_points: AtomicU64,
    forwarded: AtomicU64,
    forward_dropped: AtomicU64,
    spans: Mutex<SpanMetrics>,
    requests: Mutex<RequestMetrics>,
}

impl Metrics {
    /// Empty metrics; `max_span_series` caps the `traces_span_metrics_*` label sets.
    pub fn new(max_span_series: usize) -> Self {
        Metrics {
            spans_received: AtomicU64::new(0),
            spans_ignored: AtomicU64::new(0),
            spans_dropped: AtomicU64::new(0),
            spans_late: AtomicU64::new(0),
            spans_rejected: Default::default(),
            requests_rejected: Default::default(),
            traces_evicted: Default::default(),
            traces_in_flight: AtomicU64::new(0),
            metric_points: AtomicU64::new(0),
            forwarded: AtomicU64::new(0),
            forward_dropped: AtomicU64::new(0),
            spans: Mutex::new(SpanMetrics::new(max_span_series)),
            requests: Mutex::new(RequestMetrics::default()),
        }
    }

    /// Counts an accepted export request: spans received, ignored, rejected.
    pub fn count_accepted(&self, received: u64, ignored: u64, rejected: &[u64; 4]) {
        self.spans_received.fetch_add(received, Ordering::Relaxed);
        self.spans_ignored.fetch_add(ignored, Ordering::Relaxed);
        for (c, n) in self.spans_rejected.iter().zip(rejected) {
            if *n > 0 {
                c.fetch_add(*n, Ordering::Relaxed);
            }
        }
    }

    /// Counts spans refused because the ingest queue was full.
    pub fn count_dropped(&self, spans: u64) {
        self.spans_dropped.fetch_add(spans, Ordering::Relaxed);
    }

    /// Counts spans that came after what they describe was over (applied to no view).
    pub fn count_late(&self, spans: u64) {
        if spans > 0 {
            self.spans_late.fetch_add(spans, Ordering::Relaxed);
        }
    }

    /// Counts a refused export request.
    pub fn count_request_rejected(&self, e: &IngestError) {
        let label = e.label();
        if let Some(i) = REQUEST_REJECT_LABELS.iter().position(|l| *l == label) {
            self.requests_rejected[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts evicted requests.
    pub fn count_evicted(&self, why: EvictReason, n: u64) {
        if n > 0 {
            self.traces_evicted[why as usize].fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Sets the traces-in-flight gauge.
    pub fn set_traces_in_flight(&self, n: usize) {
        self.traces_in_flight.store(n as u64, Ordering::Relaxed);
    }

    /// Counts metric data points received (OTLP metrics are accepted and forwarded, not viewed).
    pub fn count_metric_points(&self, n: u64) {
        self.metric_points.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts a forwarded export request.
    pub fn count_forwarded(&self) {
        self.forwarded.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts an export request that was not forwarded.
    pub fn count_forward_dropped(&self) {
        self.forward_dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// Spans received so far (all producers).
    pub fn spans_received(&self) -> u64 {
        self.spans_received.load(Ordering::Relaxed)
    }

    /// Merges one export request's spanmetrics (every span, all producers).
    pub fn merge_spans(&self, batch: SpanBatch<'_>) {
        if batch.series.is_empty() {
            return;
        }
        let mut g = self.spans.lock().unwrap_or_else(|p| p.into_inner());
        for ((service, name, kind, status), l) in batch.series {
            g.merge(service, name, kind, status, l.0);
        }
    }

    /// Adds a finished request to the request metrics.
    pub fn observe_turn(&self, t: &TurnRecord) {
        let mut g = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        g.observe(t);
    }

    /// Renders everything. `openmetrics` selects OpenMetrics 1.0 (with trace-id exemplars)
    /// over the Prometheus text format 0.0.4.
    pub fn render(&self, slots: &SlotsSnapshot, openmetrics: bool) -> String {
        let mut w = Writer::new(openmetrics);
        {
            let g = self.requests.lock().unwrap_or_else(|p| p.into_inner());
            g.render(&mut w);
        }
        render_live(&mut w, slots);
        {
            let g = self.spans.lock().unwrap_or_else(|p| p.into_inner());
            g.render(&mut w);
        }
        self.render_own(&mut w);
        w.finish()
    }

    fn render_own(&self, w: &mut Writer) {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        w.family(metric::SIDECAR_SPANS_RECEIVED, Type::Counter);
        w.sample(
            metric::SIDECAR_SPANS_RECEIVED,
            "",
            &[],
            &U(load(&self.spans_received)),
        );
        w.family(metric::SIDECAR_SPANS_REJECTED, Type::Counter);
        for r in SpanReject::ALL {
            w.sample(
                metric::SIDECAR_SPANS_REJECTED,
                "",
                &[(label::REASON, r.label())],
                &U(load(&self.spans_rejected[r as usize])),
            );
        }
        w.family(metric::SIDECAR_SPANS_IGNORED, Type::Counter);
        w.sample(
            metric::SIDECAR_SPANS_IGNORED,
            "",
            &[],
            &U(load(&self.spans_ignored)),
        );
        w.family(metric::SIDECAR_SPANS_DROPPED, Type::Counter);
        w.sample(
            metric::SIDECAR_SPANS_DROPPED,
            "",
            &[],
            &U(load(&self.spans_dropped)),
        );
        w.family(metric::SIDECAR_SPANS_LATE, Type::Counter);
        w.sample(
            metric::SIDECAR_SPANS_LATE,
            "",
            &[],
            &U(load(&self.spans_late)),
        );
        w.family(metric::SIDECAR_REQUESTS_REJECTED, Type::Counter);
        for (i, l) in REQUEST_REJECT_LABELS.iter().enumerate() {
            w.sample(
                metric::SIDECAR_REQUESTS_REJECTED,
                "",
                &[(label::REASON, l)],
                &U(load(&self.requests_rejected[i])),
            );
        }
        w.family(metric::SIDECAR_TRACES_EVICTED, Type::Counter);
        for r in [EvictReason::Capacity, EvictReason::Ttl] {
            w.sample(
                metric::SIDECAR_TRACES_EVICTED,
                "",
                &[(label::REASON, r.label())],
                &U(load(&self.traces_evicted[r as usize])),
            );
        }
        w.family(metric::SIDECAR_TRACES_IN_FLIGHT, Type::Gauge);
        w.sample(
            metric::SIDECAR_TRACES_IN_FLIGHT,
            "",
            &[],
            &U(load(&self.traces_in_flight)),
        );
        w.family(metric::SIDECAR_METRIC_POINTS_RECEIVED, Type::Counter);
        w.sample(
            metric::SIDECAR_METRIC_POINTS_RECEIVED,
            "",
            &[],
            &U(load(&self.metric_points)),
        );
        w.family(metric::SIDECAR_FORWARDED, Type::Counter);
        w.sample(
            metric::SIDECAR_FORWARDED,
            "",
            &[],
            &U(load(&self.forwarded)),
        );
        w.family(metric::SIDECAR_FORWARD_DROPPED, Type::Counter);
        w.sample(
            metric::SIDECAR_FORWARD_DROPPED,
            "",
            &[],
            &U(load(&self.forward_dropped)),
        );
    }
}

fn render_live(w: &mut Writer, slots: &SlotsSnapshot) {
    w.family(metric::RUNNING_REQUESTS, Type::Gauge);
    for i in &slots.instances {
        w.sample(
            metric::RUNNING_REQUESTS,
            "",
            &[(label::INSTANCE, &i.instance)],
            &U(i.running),
        );
    }
    w.family(metric::SIDECAR_TRACE_SAMPLING_RATIO, Type::Gauge);
    for i in &slots.instances {
        if let Some(r) = i.sampling_ratio {
            w.sample(
                metric::SIDECAR_TRACE_SAMPLING_RATIO,
                "",
                &[(label::INSTANCE, &i.instance)],
                &F(r),
            );
        }
    }
    w.family(metric::SLOT_TOKENS_PER_SECOND, Type::Gauge);
    for i in &slots.instances {
        for r in &i.rows {
            let Some(rate) = r.occupant.as_ref().and_then(|o| o.tok_s()) else {
                continue;
            };
            let group = r.key.group.to_string();
            let slot = r
                .key
                .index
                .map_or_else(|| r.key.path.as_str().to_string(), |i| i.to_string());
            w.sample(
                metric::SLOT_TOKENS_PER_SECOND,
                "",
                &[
                    (label::INSTANCE, &i.instance),
                    (label::SLOT_GROUP, &group),
                    (label::SLOT, &slot),
                ],
                &F(rate),
            );
        }
    }
}

/// Renders one histogram series (`_bucket` with exemplars, `_sum`, `_count`).
fn render_histogram(h: &Histogram, w: &mut Writer, name: &str, labels: &[(&str, &str)]) {
    for (bound, cum, ex) in h.buckets() {
        let le = bound.map_or_else(|| "+Inf".to_string(), |b| format!("{b:?}"));
        let mut with_le: Vec<(&str, &str)> = labels.to_vec();
        with_le.push(("le", &le));
        w.sample_ex(name, "_bucket", &with_le, &U(cum), ex);
    }
    w.sample(name, "_sum", labels, &F(h.sum()));
    w.sample(name, "_count", labels, &U(h.count()));
}

/// `traces_span_metrics_*`: calls and duration by service, span name, kind and status.
#[derive(Debug)]
struct SpanMetrics {
    series: HashMap<(Box<str>, Box<str>, i32, i32), Histogram>,
    max_series: usize,
}

impl SpanMetrics {
    fn new(max_series: usize) -> Self {
        SpanMetrics {
            series: HashMap::new(),
            max_series: max_series.max(1),
        }
    }

    fn merge(&mut self, service: &str, name: &str, kind: i32, status: i32, h: Histogram) {
        let key = if self.series.len() >= self.max_series
            && !self
                .series
                .contains_key(&(Box::from(service), Box::from(name), kind, status))
        {
            (Box::from(OVERFLOW), Box::from(OVERFLOW), kind, status)
        } else {
            (Box::from(service), Box::from(name), kind, status)
        };
        match self.series.get_mut(&key) {
            Some(g) => g.merge(&h),
            None => {
                self.series.insert(key, h);
            }
        }
    }

    fn render(&self, w: &mut Writer) {
        let mut keys: Vec<_> = self.series.keys().collect();
        keys.sort();
        let kind_name = |k: i32| {
            SpanKind::try_from(k)
                .unwrap_or(SpanKind::Unspecified)
                .as_str_name()
        };
        let status_name = |s: i32| {
            StatusCode::try_from(s)
                .unwrap_or(StatusCode::Unset)
                .as_str_name()
        };
        w.family(metric::SPAN_CALLS, Type::Counter);
        for k in &keys {
            let labels = [
                (label::SERVICE_NAME, &*k.0),
                (label::SPAN_NAME, &*k.1),
                (label::SPAN_KIND, kind_name(k.2)),
                (label::STATUS_CODE, status_name(k.3)),
            ];
            w.sample(metric::SPAN_CALLS, "", &labels, &U(self.series[*k].count()));
        }
        w.family(metric::SPAN_DURATION, Type::Histogram);
        for k in &keys {
            let labels = [
                (label::SERVICE_NAME, &*k.0),
                (label::SPAN_NAME, &*k.1),
                (label::SPAN_KIND, kind_name(k.2)),
                (label::STATUS_CODE, status_name(k.3)),
            ];
            render_histogram(&self.series[*k], w, metric::SPAN_DURATION, &labels);
        }
    }
}

/// The GenAI labels of the per-turn metrics: operation, provider, request model, response
/// model. An unknown value is left off the series.
type GenAiKey = [String; 4];

/// How a turn ended, for `slotlight_requests_total`: status, finish reason, error type.
type Outcome = (TurnStatus, Option<String>, Option<String>);

/// Per-turn metrics of one GenAI label set, observed from turn records.
#[derive(Debug)]
struct SeriesMetrics {
    ttft: Histogram,
    tpot: Histogram,
    /// Request duration by `error_type` (`None` on success).
    duration: BTreeMap<Option<String>, Histogram>,
    queue: Histogram,
    prefill: Histogram,
    decode: Histogram,
    prompt_tokens: u64,
    cached_tokens: u64,
    generated_tokens: u64,
    moves: u64,
    requests: BTreeMap<Outcome, u64>,
    /// Turns by `slotlight.resume` (only turns that carry it: admitted ones).
    resume: BTreeMap<String, u64>,
}

impl Default for SeriesMetrics {
    fn default() -> Self {
        SeriesMetrics {
            ttft: Histogram::new(buckets::TIME_TO_FIRST_TOKEN),
            tpot: Histogram::new(buckets::TIME_PER_OUTPUT_TOKEN),
            duration: BTreeMap::new(),
            queue: Histogram::new(buckets::REQUEST_DURATION),
            prefill: Histogram::new(buckets::REQUEST_DURATION),
            decode: Histogram::new(buckets::REQUEST_DURATION),
            prompt_tokens: 0,
            cached_tokens: 0,
            generated_tokens: 0,
            moves: 0,
            requests: BTreeMap::new(),
            resume: BTreeMap::new(),
        }
    }
}

#[derive(Debug, Default)]
struct RequestMetrics {
    series: BTreeMap<GenAiKey, SeriesMetrics>,
}

fn nonneg(v: Option<i64>) -> u64 {
    v.and_then(|v| u64::try_from(v).ok()).unwrap_or(0)
}

/// A label value from a turn, capped in length (a client chooses the request model).
fn label_value(v: Option<&str>) -> String {
    let v = v.unwrap_or("");
    match v.char_indices().nth(128) {
        Some((i, _)) => v[..i].to_string(),
        None => v.to_string(),
    }
}

/// The GenAI labels of a series, without the unknown ones.
fn genai_labels(k: &GenAiKey) -> Vec<(&'static str, String)> {
    [
        label::GEN_AI_OPERATION_NAME,
        label::GEN_AI_PROVIDER_NAME,
        label::GEN_AI_REQUEST_MODEL,
        label::GEN_AI_RESPONSE_MODEL,
    ]
    .into_iter()
    .zip(k.iter().cloned())
    .filter(|(_, v)| !v.is_empty())
    .collect()
}

fn as_refs<'a>(l: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    l.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

impl RequestMetrics {
    fn observe(&mut self, t: &TurnRecord) {
        let key: GenAiKey = [
            label_value(t.operation.as_deref()),
            label_value(t.provider.as_deref()),
            label_value(t.request_model.as_deref()),
            label_value(t.response_model.as_deref()),
        ];
        let key = if self.series.len() >= MAX_SERIES && !self.series.contains_key(&key) {
            [OVERFLOW, OVERFLOW, OVERFLOW, OVERFLOW].map(String::from)
        } else {
            key
        };
        let m = self.series.entry(key).or_default();
        let ex = Some(t.trace_id_bytes);
        let ts = u64::try_from(t.end_time_unix_nano).unwrap_or(0);
        let s = |ms: Option<f64>| ms.map(|v| v / 1e3);
        let ok = t.status == TurnStatus::Ok;
        // The GenAI conventions record these two for successful responses only.
        if ok {
            if let Some(v) = s(t.ttft_ms) {
                m.ttft.observe(v, ex, ts);
            }
            if let (Some(g), Some(n)) = (s(t.generation_ms), t.completion_tokens)
                && n > 1
            {
                #[allow(clippy::cast_precision_loss)] // token counts are far below 2^53
                m.tpot.observe(g / (n - 1) as f64, ex, ts);
            }
        }
        // Every turn has a duration: its own `e2e_ms`, else (a refusal) its span's.
        #[allow(clippy::cast_precision_loss)] // span durations in ns fit f64 closely enough
        let span_s = (t.end_time_unix_nano - t.start_time_unix_nano).max(0) as f64 / 1e9;
        let duration = s(t.e2e_ms).unwrap_or(span_s);
        let error_type =
            (!ok).then(|| label_value(t.error_type.as_deref().or(Some(t.status.as_str()))));
        if m.duration.len() < MAX_OUTCOMES || m.duration.contains_key(&error_type) {
            m.duration
                .entry(error_type.clone())
                .or_insert_with(|| Histogram::new(buckets::REQUEST_DURATION))
                .observe(duration, ex, ts);
        }
        // Only what the request had: an unknown time is never observed.
        if let Some(v) = s(t.queue_ms) {
            m.queue.observe(v, ex, ts);
        }
        if let Some(v) = s(t.prefill_ms) {
            m.prefill.observe(v, ex, ts);
        }
        if let Some(v) = s(t.decode_ms) {
            m.decode.observe(v, ex, ts);
        }
        m.prompt_tokens += nonneg(t.prompt_tokens);
        m.cached_tokens += nonneg(t.cached_tokens);
        m.generated_tokens += nonneg(t.completion_tokens);
        // Each change of path or slot between consecutive legs is one move; a request that
        // says it moved but whose legs did not all arrive counts once.
        let transitions = t
            .legs
            .windows(2)
            .filter(|w| (w[0].path, w[0].slot, w[0].group) != (w[1].path, w[1].slot, w[1].group))
            .count() as u64;
        m.moves += if transitions > 0 {
            transitions
        } else {
            u64::from(t.moved)
        };
        let outcome: Outcome = if ok {
            let finish = label_value(t.finish_reason.as_deref());
            (t.status, Some(finish).filter(|f| !f.is_empty()), None)
        } else {
            (t.status, None, error_type)
        };
        let outcome = if m.requests.len() >= MAX_OUTCOMES && !m.requests.contains_key(&outcome) {
            (t.status, None, Some(OVERFLOW.to_string()))
        } else {
            outcome
        };
        *m.requests.entry(outcome).or_default() += 1;
        // A turn never admitted has no resume outcome and is not counted. The engine sends
        // the contract's values; anything else is kept, within the same cap as outcomes.
        let resume = label_value(t.resume.as_deref());
        if !resume.is_empty() {
            let resume = if m.resume.len() >= MAX_OUTCOMES && !m.resume.contains_key(&resume) {
                OVERFLOW.to_string()
            } else {
                resume
            };
            *m.resume.entry(resume).or_default() += 1;
        }
    }

    fn render(&self, w: &mut Writer) {
        type H = fn(&SeriesMetrics) -> &Histogram;
        let hists: [(&str, H); 2] = [
            (metric::TIME_TO_FIRST_TOKEN, |m| &m.ttft),
            (metric::TIME_PER_OUTPUT_TOKEN, |m| &m.tpot),
        ];
        for (name, get) in hists {
            w.family(name, Type::Histogram);
            for (k, m) in &self.series {
                render_histogram(get(m), w, name, &as_refs(&genai_labels(k)));
            }
        }
        w.family(metric::REQUEST_DURATION, Type::Histogram);
        for (k, m) in &self.series {
            for (error_type, h) in &m.duration {
                let mut l = genai_labels(k);
                if let Some(e) = error_type {
                    l.push((label::ERROR_TYPE, e.clone()));
                }
                render_histogram(h, w, metric::REQUEST_DURATION, &as_refs(&l));
            }
        }
        let hists: [(&str, H); 3] = [
            (metric::QUEUE_TIME, |m| &m.queue),
            (metric::PREFILL_TIME, |m| &m.prefill),
            (metric::DECODE_TIME, |m| &m.decode),
        ];
        for (name, get) in hists {
            w.family(name, Type::Histogram);
            for (k, m) in &self.series {
                render_histogram(get(m), w, name, &as_refs(&genai_labels(k)));
            }
        }
        type C = fn(&SeriesMetrics) -> u64;
        let counters: [(&str, C); 4] = [
            (metric::PROMPT_TOKENS, |m| m.prompt_tokens),
            (metric::CACHED_TOKENS, |m| m.cached_tokens),
            (metric::GENERATED_TOKENS, |m| m.generated_tokens),
            (metric::MOVES, |m| m.moves),
        ];
        for (name, get) in counters {
            w.family(name, Type::Counter);
            for (k, m) in &self.series {
                w.sample(name, "", &as_refs(&genai_labels(k)), &U(get(m)));
            }
        }
        w.family(metric::REQUESTS, Type::Counter);
        for (k, m) in &self.series {
            for ((status, finish, error), n) in &m.requests {
                let mut l = genai_labels(k);
                l.push((label::STATUS, status.as_str().to_string()));
                if let Some(f) = finish {
                    l.push((label::FINISH_REASON, f.clone()));
                }
                if let Some(e) = error {
                    l.push((label::ERROR_TYPE, e.clone()));
                }
                w.sample(metric::REQUESTS, "", &as_refs(&l), &U(*n));
            }
        }
        w.family(metric::TURNS_BY_RESUME, Type::Counter);
        for (k, m) in &self.series {
            for (resume, n) in &m.resume {
                let mut l = genai_labels(k);
                l.push((label::RESUME, resume.clone()));
                w.sample(metric::TURNS_BY_RESUME, "", &as_refs(&l), &U(*n));
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Type {
    Counter,
    Gauge,
    Histogram,
}

/// An integer sample value.
struct U(u64);
/// A float sample value.
struct F(f64);

trait SampleValue {
    fn write(&self, out: &mut String);
}

impl SampleValue for U {
    fn write(&self, out: &mut String) {
        let _ = write!(out, "{}", self.0);
    }
}

impl SampleValue for F {
    fn write(&self, out: &mut String) {
        write_float(out, self.0);
    }
}

fn write_float(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    } else {
        let _ = write!(out, "{v:?}");
    }
}

/// Text exposition writer for both formats.
struct Writer {
    out: String,
    openmetrics: bool,
}

impl Writer {
    fn new(openmetrics: bool) -> Self {
        Writer {
            out: String::with_capacity(16 << 10),
            openmetrics,
        }
    }

    /// `# HELP` (the contract's doc) and `# TYPE`. OpenMetrics names a counter family
    /// without its `_total` suffix.
    fn family(&mut self, name: &str, t: Type) {
        let help = metric::ALL
            .iter()
            .find(|e| e.name == name)
            .map_or("", |e| e.doc);
        let family = if self.openmetrics && t == Type::Counter {
            name.strip_suffix("_total").unwrap_or(name)
        } else {
            name
        };
        let t = match t {
            Type::Counter => "counter",
            Type::Gauge => "gauge",
            Type::Histogram => "histogram",
        };
        let _ = writeln!(self.out, "# HELP {family} {}", escape_help(help));
        let _ = writeln!(self.out, "# TYPE {family} {t}");
    }

    fn sample(&mut self, name: &str, suffix: &str, labels: &[(&str, &str)], v: &dyn SampleValue) {
        self.sample_ex(name, suffix, labels, v, None);
    }

    fn sample_ex(
        &mut self,
        name: &str,
        suffix: &str,
        labels: &[(&str, &str)],
        v: &dyn SampleValue,
        ex: Option<&Exemplar>,
    ) {
        self.out.push_str(name);
        self.out.push_str(suffix);
        write_labels(&mut self.out, labels);
        self.out.push(' ');
        v.write(&mut self.out);
        if self.openmetrics
            && let Some(ex) = ex
        {
            let _ = write!(self.out, " # {{trace_id=\"{}\"}} ", hex(&ex.trace_id));
            write_float(&mut self.out, ex.value);
            #[allow(clippy::cast_precision_loss)] // seconds with ms precision
            let ts = ex.ts_ns as f64 / 1e9;
            let _ = write!(self.out, " {ts:.3}");
        }
        self.out.push('\n');
    }

    fn finish(mut self) -> String {
        if self.openmetrics {
            self.out.push_str("# EOF\n");
        }
        self.out
    }
}

fn write_labels(out: &mut String, labels: &[(&str, &str)]) {
    if labels.is_empty() {
        return;
    }
    out.push('{');
    for (i, (k, v)) in labels.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(k);
        out.push_str("=\"");
        for c in v.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
        out.push('"');
    }
    out.push('}');
}

fn escape_help(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n")
}

/// The content type for the format chosen by an `Accept` header.
pub fn negotiate(accept: Option<&str>) -> (bool, &'static str) {
    if accept.is_some_and(|a| a.contains("application/openmetrics-text")) {
        (
            true,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )
    } else {
        (false, "text/plain; version=0.0.4; charset=utf-8")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spans::{Body, EngineSpan, RequestSpan};
    use std::sync::Arc;

    /// The GenAI labels of [`turn`]'s series, as rendered before `le`.
    const GENAI: &str = "gen_ai_operation_name=\"chat\",gen_ai_provider_name=\"slotlight\",gen_ai_request_model=\"m\",gen_ai_response_model=\"m\"";

    fn turn() -> TurnRecord {
        turn_with(RequestSpan::default())
    }

    fn turn_with(over: RequestSpan) -> TurnRecord {
        let req = RequestSpan {
            operation: Some("chat".into()),
            provider: Some("slotlight".into()),
            request_model: Some("m".into()),
            response_model: Some("m".into()),
            ..over
        };
        let req = RequestSpan {
            name: "chat m".into(),
            ttft_ms: Some(30.0),
            e2e_ms: Some(1500.0),
            generation_ms: Some(1000.0),
            output_tokens: Some(11),
            input_tokens: Some(5),
            finish_reasons: vec!["stop".into()],
            ..req
        };
        let root = EngineSpan {
            instance: Arc::from("i"),
            service_version: None,
            trace_id: [0xab; 16],
            start_ns: 0,
            end_ns: 1_700_000_000_000_000_000,
            error: false,
            request_id: "r".into(),
            session_id: None,
            body: Body::Request(Box::new(req.clone())),
        };
        TurnRecord::build(&root, &req, vec![])
    }

    #[test]
    fn histogram_buckets_are_cumulative() {
        let m = Metrics::new(10);
        m.observe_turn(&turn());
        let text = m.render(&SlotsSnapshot::default(), false);
        let ttft = metric::TIME_TO_FIRST_TOKEN;
        assert!(
            text.contains(&format!("{ttft}_bucket{{{GENAI},le=\"0.02\"}} 0\n")),
            "{text}"
        );
        assert!(text.contains(&format!("{ttft}_bucket{{{GENAI},le=\"0.04\"}} 1\n")));
        assert!(text.contains(&format!("{ttft}_bucket{{{GENAI},le=\"+Inf\"}} 1\n")));
        assert!(text.contains(&format!(
            "{}_bucket{{{GENAI},le=\"0.1\"}} 1\n",
            metric::TIME_PER_OUTPUT_TOKEN
        )));
        assert!(text.contains(&format!(
            "{}{{{GENAI},status=\"ok\",finish_reason=\"stop\"}} 1\n",
            metric::REQUESTS
        )));
        assert!(!text.contains("# EOF"));
        assert!(
            !text.contains("trace_id"),
            "no exemplars in the Prometheus format"
        );
    }

    #[test]
    fn openmetrics_has_exemplars_and_eof() {
        let m = Metrics::new(10);
        m.observe_turn(&turn());
        let text = m.render(&SlotsSnapshot::default(), true);
        assert!(text.ends_with("# EOF\n"));
        let family = metric::PROMPT_TOKENS
            .strip_suffix("_total")
            .expect("counter");
        assert!(text.contains(&format!("# TYPE {family} counter\n")));
        let hex = "ab".repeat(16);
        assert!(
            text.contains(&format!(
                "le=\"0.04\"}} 1 # {{trace_id=\"{hex}\"}} 0.03 1700000000.000"
            )),
            "{text}"
        );
    }

    /// A count of the observations in `name`'s histogram series carrying `labels`.
    fn count_of(text: &str, name: &str, labels: &str) -> Option<u64> {
        let prefix = format!("{name}_count{{{labels}}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.parse().ok())
    }

    /// Regression: a request that never got admitted or never produced a token used to report
    /// 0.0 for what it never had, and those zeros pulled the TTFT and queue histograms down.
    #[test]
    fn unknown_times_and_failures_are_never_observed_as_values() {
        let m = Metrics::new(10);
        m.observe_turn(&turn());
        // Refused: no queue, no token, no prefill; a span 2 ms long.
        let mut refused = turn_with(RequestSpan {
            status: Some("refused".into()),
            error_type: Some("overloaded".into()),
            ..Default::default()
        });
        refused.ttft_ms = None;
        refused.e2e_ms = None;
        refused.generation_ms = None;
        refused.end_time_unix_nano = refused.start_time_unix_nano + 2_000_000;
        m.observe_turn(&refused);
        // Cancelled after its first token: a TTFT, but not a successful response.
        let cancelled = turn_with(RequestSpan {
            status: Some("cancelled".into()),
            error_type: Some("cancelled".into()),
            queue_ms: Some(3.0),
            ..Default::default()
        });
        m.observe_turn(&cancelled);
        let text = m.render(&SlotsSnapshot::default(), false);
        let ttft = metric::TIME_TO_FIRST_TOKEN;
        assert_eq!(count_of(&text, ttft, GENAI), Some(1), "{text}");
        assert_eq!(
            count_of(&text, metric::TIME_PER_OUTPUT_TOKEN, GENAI),
            Some(1)
        );
        assert_eq!(
            count_of(&text, metric::QUEUE_TIME, GENAI),
            Some(1),
            "only the cancelled request had a queue time: {text}"
        );
        let dur = metric::REQUEST_DURATION;
        assert_eq!(count_of(&text, dur, GENAI), Some(1));
        assert_eq!(
            count_of(&text, dur, &format!("{GENAI},error_type=\"overloaded\"")),
            Some(1),
            "{text}"
        );
        assert!(text.contains(&format!(
            "{dur}_sum{{{GENAI},error_type=\"overloaded\"}} 0.002\n"
        )));
        for (status, error) in [("refused", "overloaded"), ("cancelled", "cancelled")] {
            assert!(
                text.contains(&format!(
                    "{}{{{GENAI},status=\"{status}\",error_type=\"{error}\"}} 1\n",
                    metric::REQUESTS
                )),
                "{status}: {text}"
            );
        }
    }

    /// The `slotlight_turns_by_resume_total` sample of [`turn`]'s series for `resume`.
    fn resume_count(text: &str, resume: &str) -> Option<u64> {
        let prefix = format!(
            "{}{{{GENAI},{}=\"{resume}\"}} ",
            metric::TURNS_BY_RESUME,
            label::RESUME
        );
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.parse().ok())
    }

    #[test]
    fn turns_are_counted_by_resume_outcome_and_unadmitted_ones_not_at_all() {
        use slotlight_otel::attr::value;
        let m = Metrics::new(10);
        let with = |resume: &str| {
            turn_with(RequestSpan {
                resume: Some(resume.into()),
                ..Default::default()
            })
        };
        for r in [
            value::RESUME_FULL,
            value::RESUME_FULL,
            value::RESUME_DIVERGED,
            value::RESUME_FIRST,
        ] {
            m.observe_turn(&with(r));
        }
        // Refused before admission: no resume attribute.
        m.observe_turn(&turn_with(RequestSpan {
            status: Some("refused".into()),
            error_type: Some("overloaded".into()),
            ..Default::default()
        }));
        m.observe_turn(&turn());
        let text = m.render(&SlotsSnapshot::default(), false);
        assert!(
            text.contains(&format!("# TYPE {} counter\n", metric::TURNS_BY_RESUME)),
            "{text}"
        );
        assert_eq!(resume_count(&text, value::RESUME_FULL), Some(2), "{text}");
        assert_eq!(resume_count(&text, value::RESUME_DIVERGED), Some(1));
        assert_eq!(resume_count(&text, value::RESUME_FIRST), Some(1));
        assert_eq!(resume_count(&text, value::RESUME_EVICTED), None);
        let total: u64 = text
            .lines()
            .filter(|l| l.starts_with(metric::TURNS_BY_RESUME))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum();
        assert_eq!(total, 4, "the two turns without a resume are not counted");
    }

    #[test]
    fn resume_labels_are_capped() {
        let m = Metrics::new(10);
        for i in 0..MAX_OUTCOMES + 5 {
            m.observe_turn(&turn_with(RequestSpan {
                resume: Some(format!("made_up_{i}")),
                ..Default::default()
            }));
        }
        let text = m.render(&SlotsSnapshot::default(), false);
        let series = text
            .lines()
            .filter(|l| l.starts_with(metric::TURNS_BY_RESUME))
            .count();
        assert_eq!(series, MAX_OUTCOMES + 1, "{text}");
        assert_eq!(resume_count(&text, OVERFLOW), Some(5));
    }

    #[test]
    fn late_spans_are_exported() {
        let m = Metrics::new(10);
        m.count_late(3);
        let text = m.render(&SlotsSnapshot::default(), false);
        assert!(
            text.contains(&format!("{} 3\n", metric::SIDECAR_SPANS_LATE)),
            "{text}"
        );
    }

    #[test]
    fn span_series_are_capped() {
        use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
        use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
        let m = Metrics::new(2);
        let spans = (0..5)
            .map(|i| Span {
                name: format!("s{i}"),
                trace_id: vec![1; 16],
                start_time_unix_nano: 0,
                end_time_unix_nano: 3_000_000,
                ..Default::default()
            })
            .collect();
        let req = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                scope_spans: vec![ScopeSpans {
                    spans,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let buf = prost::Message::encode_to_vec(&req);
        let mut batch = SpanBatch::default();
        crate::spans::convert(&buf, &mut batch).expect("decodes");
        m.merge_spans(batch);
        let text = m.render(&SlotsSnapshot::default(), false);
        let calls: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with(metric::SPAN_CALLS))
            .collect();
        assert_eq!(calls.len(), 3, "{calls:?}");
        assert!(text.contains(&format!("{}=\"{OVERFLOW}\"", label::SPAN_NAME)));
        assert!(text.contains(&format!("{}=\"unknown_service\"", label::SERVICE_NAME)));
    }

    #[test]
    fn label_values_are_escaped() {
        let mut s = String::new();
        write_labels(&mut s, &[("a", "x\"y\\z\n")]);
        assert_eq!(s, "{a=\"x\\\"y\\\\z\\n\"}");
    }

    #[test]
    fn negotiation() {
        assert!(negotiate(Some("application/openmetrics-text;version=1.0.0")).0);
        assert!(!negotiate(Some("text/plain")).0);
        assert!(!negotiate(None).0);
    }
}
