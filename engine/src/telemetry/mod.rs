//! All telemetry wiring: logs (text or JSON), the OTLP span and metric exporters, and the
//! bridge from `tracing` (operational spans, and warnings logged while serving a request as
//! events on its request span).
//!
//! Set-up is one plain function per OTLP [`Signal`] ([`otlp_spans`], [`otlp_metrics`],
//! [`otlp_logs`]), each over the same resolution of its protocol and endpoint (flags, else the
//! signal's variables, else the general ones: `signal_target`; the collector's default port and
//! the signal's HTTP path: `signal_endpoint`) and the same exporter shape, chosen by
//! [`from_config`]; [`Telemetry::disabled`], and [`Telemetry::with_provider`] for tests. A
//! failure is a typed [`TelemetryError`].
//!
//! The exporter is configured by the standard variables (`OTEL_EXPORTER_OTLP_ENDPOINT`,
//! `OTEL_EXPORTER_OTLP_PROTOCOL`, `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`,
//! `OTEL_TRACES_SAMPLER`, `OTEL_SDK_DISABLED`, `OTEL_BSP_SCHEDULE_DELAY`, and for metrics
//! `OTEL_METRICS_EXPORTER`, `OTEL_METRIC_EXPORT_INTERVAL`, and for the per-turn log records
//! `OTEL_LOGS_EXPORTER`) and by flags, which win. Spans are exported every 200 ms by default so that live views stay live. Export runs on
//! the [`queue`]'s own thread, bounded by span count and bytes: a dead collector never slows
//! serving; failed exports are retried with backoff until the collector is back, their failure
//! logged once, and only spans beyond the bounds are dropped, counted exactly.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::global::BoxedTracer;
use opentelemetry::metrics::{Meter, MeterProvider as _};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::logs::SdkLoggerProvider;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider, SpanExporter};
use serde::Serialize;
use slotlight_otel::attr;

use crate::metrics::TelemetrySnapshot;

pub mod queue;

pub use queue::{ExportQueue, QueueLimits};

/// How long shutdown keeps trying to deliver the spans still queued.
pub const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

pub use slotlight_otel::span::OPS_TARGET;

/// The `tracing` target of the per-request lines (`Request.Finished`, `Request.Refused`, …).
pub const REQUEST_TARGET: &str = "slotlight::request";

/// Installs the log subscriber (`RUST_LOG` filters; default `info`). With `ops`, the tracer of
/// the engine's provider, operational spans ([`OPS_TARGET`]) are exported as OpenTelemetry
/// spans through it (with the warnings and errors logged inside them as events). Warnings and
/// errors logged inside a request's task become events on its request span ([`request_span`]).
///
/// With `records`, the logger provider of `OTEL_LOGS_EXPORTER=otlp` ([`Telemetry::logger_provider`]),
/// every per-request line (target [`REQUEST_TARGET`]: `Request.Finished`, `Request.Refused`,
/// `Request.Failed`) also leaves as an OTLP log record: the event name, its severity, its
/// fields as attributes, and the trace and span ids of the request span it was logged under.
pub fn init_logs(format: LogFormat, ops: Option<SdkTracer>, records: Option<&SdkLoggerProvider>) {
    use tracing_subscriber::prelude::*;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,opentelemetry_sdk=warn"));
    let ops = ops.map(|tracer| {
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_location(false)
            .with_threads(false)
            .with_tracked_inactivity(false)
            .with_target(false)
            .with_filter(tracing_subscriber::filter::filter_fn(|m| {
                m.target() == OPS_TARGET || (m.is_event() && *m.level() <= tracing::Level::WARN)
            }))
    });
    let records = records.map(|p| {
        opentelemetry_appender_tracing::layer::OpenTelemetryTracingBridge::new(p).with_filter(
            tracing_subscriber::filter::filter_fn(|m| m.is_event() && m.target() == REQUEST_TARGET),
        )
    });
    let registry = tracing_subscriber::registry()
        .with(filter)
        .with(RequestEvents)
        .with(ops)
        .with(records);
    use std::io::IsTerminal;
    let _ = match format {
        LogFormat::Text => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(std::io::stderr().is_terminal())
                    .with_writer(std::io::stderr),
            )
            .try_init(),
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_writer(std::io::stderr),
            )
            .try_init(),
    };
}

/// The OpenTelemetry context of a request span, kept in the extensions of the `tracing` span
/// its task runs in.
struct RequestContext(opentelemetry::Context);

/// A `tracing` span for one request's task, carrying its request id and its request span's
/// trace and span ids (so every log line logged inside carries them), and `cx`, the request
/// span's context: warnings and errors logged inside become events on the request span. It is
/// a `tracing` span only; it adds no span to the request's trace. Enabled whenever warnings
/// are.
pub fn request_span(cx: &opentelemetry::Context, request_id: &str) -> tracing::Span {
    use opentelemetry::trace::TraceContextExt as _;
    let sc = cx.span().span_context().clone();
    let span = tracing::warn_span!(
        target: "slotlight::request",
        "request",
        request_id = %request_id,
        trace_id = %sc.trace_id(),
        span_id = %sc.span_id(),
    );
    span.with_subscriber(|(id, dispatch)| {
        if let Some(registry) = dispatch.downcast_ref::<tracing_subscriber::Registry>() {
            use tracing_subscriber::registry::LookupSpan as _;
            if let Some(s) = registry.span(id) {
                s.extensions_mut().insert(RequestContext(cx.clone()));
            }
        }
    });
    span
}

/// Copies each warning or error logged inside a request's `tracing` span ([`request_span`])
/// onto the request span as an event: named by its message, with its level, its target and
/// its fields.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestEvents;

/// An event's fields as OpenTelemetry attributes, and its message.
#[derive(Default)]
struct EventFields {
    message: Option<String>,
    attrs: Vec<KeyValue>,
}

impl tracing::field::Visit for EventFields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let v = format!("{value:?}");
        if field.name() == "message" {
            self.message = Some(v);
        } else {
            self.attrs.push(KeyValue::new(field.name(), v));
        }
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            self.message = Some(value.to_string());
        } else {
            self.attrs
                .push(KeyValue::new(field.name(), value.to_string()));
        }
    }

    fn record_i64(&mut self, field: &tracing::field::Field, value: i64) {
        self.attrs.push(KeyValue::new(field.name(), value));
    }

    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        self.attrs.push(KeyValue::new(
            field.name(),
            i64::try_from(value).unwrap_or(i64::MAX),
        ));
    }

    fn record_f64(&mut self, field: &tracing::field::Field, value: f64) {
        self.attrs.push(KeyValue::new(field.name(), value));
    }

    fn record_bool(&mut self, field: &tracing::field::Field, value: bool) {
        self.attrs.push(KeyValue::new(field.name(), value));
    }
}

impl<S> tracing_subscriber::Layer<S> for RequestEvents
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_event(&self, event: &tracing::Event<'_>, ctx: tracing_subscriber::layer::Context<'_, S>) {
        let meta = event.metadata();
        if *meta.level() > tracing::Level::WARN {
            return;
        }
        let Some(scope) = ctx.event_scope(event) else {
            return;
        };
        for span in scope {
            let ext = span.extensions();
            let Some(RequestContext(cx)) = ext.get::<RequestContext>() else {
                continue;
            };
            let mut f = EventFields::default();
            event.record(&mut f);
            f.attrs
                .push(KeyValue::new(attr::EVENT_LEVEL, meta.level().as_str()));
            f.attrs
                .push(KeyValue::new(attr::EVENT_TARGET, meta.target()));
            use opentelemetry::trace::TraceContextExt as _;
            cx.span().add_event(
                f.message.unwrap_or_else(|| meta.name().to_string()),
                f.attrs,
            );
            return;
        }
    }
}

/// Exporter configuration from flags (each overrides its variable).
#[derive(Debug, Clone, Default)]
pub struct TelemetryConfig {
    /// `--no-telemetry` (or `OTEL_SDK_DISABLED=true`).
    pub disabled: bool,
    /// `--otlp-endpoint`.
    pub endpoint: Option<String>,
    /// `--otlp-protocol` (`grpc` or `http/protobuf`).
    pub protocol: Option<String>,
    /// The span export queue's bounds (`--otlp-queue-spans`, `--otlp-queue-bytes`); `None`:
    /// the defaults and the `OTEL_BSP_*` variables.
    pub queue: Option<QueueLimits>,
}

/// Counts of what the span export queue did ([`queue`]); at every moment
/// `ended = exported + dropped + held`.
#[derive(Debug, Default)]
pub struct ExportStats {
    /// Spans ended and handed to the queue (sampled ones only).
    pub ended: AtomicU64,
    /// Spans the collector took.
    pub exported: AtomicU64,
    /// Spans lost: beyond the queue's bounds, refused for good, or left at shutdown's deadline.
    pub dropped: AtomicU64,
    /// Export attempts that failed (each batch may be tried many times).
    pub failures: AtomicU64,
    /// Spans queued or being sent now.
    pub held: AtomicU64,
    logged: AtomicBool,
}

/// A snapshot of [`ExportStats`].
#[derive(Debug, Clone, Serialize)]
pub struct ExportCounts {
    /// Whether spans are exported at all.
    pub enabled: bool,
    /// The OTLP endpoint spans are exported to, if any.
    pub endpoint: Option<String>,
    /// Spans ended and handed to the export queue.
    pub ended: u64,
    /// Spans exported.
    pub exported: u64,
    /// Spans lost (beyond the queue's bounds, refused for good, or left at shutdown).
    pub dropped: u64,
    /// Failed export attempts.
    pub failures: u64,
    /// Spans queued or being sent.
    pub queued: u64,
    /// The queue's bound in spans (0 when not exporting).
    pub queue_max_spans: usize,
    /// The queue's bound in estimated bytes (0 when not exporting).
    pub queue_max_bytes: usize,
}

/// The engine's tracer and its provider.
pub struct Telemetry {
    /// Tracer for request spans (a no-op tracer when disabled).
    pub tracer: Arc<BoxedTracer>,
    provider: Option<SdkTracerProvider>,
    stats: Arc<ExportStats>,
    endpoint: Option<String>,
    /// The export queue's bounds, when exporting.
    limits: Option<QueueLimits>,
    /// The share of request traces the sampler keeps (0 when disabled).
    sampling_ratio: f64,
    /// The OTLP metrics pipeline, with `OTEL_METRICS_EXPORTER=otlp`.
    meter_provider: Option<SdkMeterProvider>,
    /// The OTLP logs pipeline of the per-turn records, with `OTEL_LOGS_EXPORTER=otlp`.
    logger_provider: Option<SdkLoggerProvider>,
    /// This process's `service.instance.id`.
    pub instance_id: String,
    /// The engine's data-parallel rank (`--data-parallel-rank`).
    data_parallel_rank: u32,
}

/// The trace sampler from `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG`, read with the
/// SDK's own rules (a missing or unparsable ratio is 1, an unknown sampler is
/// `parentbased_always_on`), and the share of request traces it keeps: the ratio it applies to
/// a request that arrives without a sampled parent (a parent-based sampler follows the
/// caller's decision otherwise).
pub fn sampler_from_env() -> (Sampler, f64) {
    let name = std::env::var("OTEL_TRACES_SAMPLER").unwrap_or_default();
    let arg = std::env::var("OTEL_TRACES_SAMPLER_ARG")
        .ok()
        .and_then(|a| a.trim().parse::<f64>().ok())
        .filter(|r| r.is_finite())
        .map_or(1.0, |r| r.clamp(0.0, 1.0));
    let parent = |s: Sampler| Sampler::ParentBased(Box::new(s));
    match name.trim() {
        "always_on" => (Sampler::AlwaysOn, 1.0),
        "always_off" => (Sampler::AlwaysOff, 0.0),
        "traceidratio" => (Sampler::TraceIdRatioBased(arg), arg),
        "parentbased_always_off" => (parent(Sampler::AlwaysOff), 0.0),
        "parentbased_traceidratio" => (parent(Sampler::TraceIdRatioBased(arg)), arg),
        _ => (parent(Sampler::AlwaysOn), 1.0),
    }
}

fn env_true(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

/// A fresh instance id: host, pid and a random suffix.
fn new_instance_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    use std::hash::{BuildHasher, Hasher};
    let rs = std::collections::hash_map::RandomState::new();
    h.write_u64(rs.hash_one(std::time::SystemTime::now()));
    let host = if host.is_empty() {
        "engine".to_string()
    } else {
        host
    };
    let suffix = u32::try_from(h.finish() >> 32).unwrap_or_default();
    format!("{host}-{}-{suffix:08x}", std::process::id())
}

impl Telemetry {
    /// A tracer that records nothing.
    pub fn disabled() -> Self {
        Self {
            tracer: Arc::new(BoxedTracer::new(Box::new(
                opentelemetry::trace::noop::NoopTracer::new(),
            ))),
            provider: None,
            stats: Arc::default(),
            endpoint: None,
            limits: None,
            sampling_ratio: 0.0,
            meter_provider: None,
            logger_provider: None,
            instance_id: new_instance_id(),
            data_parallel_rank: 0,
        }
    }

    /// Uses a caller-built provider (tests pass one with an in-memory exporter), which keeps
    /// every trace unless [`Telemetry::with_sampling_ratio`] says otherwise.
    pub fn with_provider(provider: SdkTracerProvider, instance_id: String) -> Self {
        let tracer = provider.tracer("slotlight-engine");
        Self {
            tracer: Arc::new(BoxedTracer::new(Box::new(tracer))),
            provider: Some(provider),
            stats: Arc::default(),
            endpoint: None,
            limits: None,
            sampling_ratio: 1.0,
            meter_provider: None,
            logger_provider: None,
            instance_id,
            data_parallel_rank: 0,
        }
    }

    /// Exports the per-turn log records through `provider` (tests pass one with an in-memory
    /// exporter).
    pub fn with_logger_provider(mut self, provider: SdkLoggerProvider) -> Self {
        self.logger_provider = Some(provider);
        self
    }

    /// The logs pipeline of the per-turn records, when `OTEL_LOGS_EXPORTER=otlp` asked for
    /// one (for [`init_logs`]).
    pub fn logger_provider(&self) -> Option<&SdkLoggerProvider> {
        self.logger_provider.as_ref()
    }

    /// States `rank` as the engine's data-parallel rank on every request span.
    pub fn with_data_parallel_rank(mut self, rank: u32) -> Self {
        self.data_parallel_rank = rank;
        self
    }

    /// The replica that serves a request, for its request span: this process's instance id
    /// and data-parallel rank.
    pub fn replica_attrs(&self) -> [opentelemetry::KeyValue; 2] {
        [
            opentelemetry::KeyValue::new(attr::ENGINE_INSTANCE, self.instance_id.clone()),
            opentelemetry::KeyValue::new(
                attr::ENGINE_DATA_PARALLEL_RANK,
                i64::from(self.data_parallel_rank),
            ),
        ]
    }

    /// Exports metrics through `provider` too (tests pass one with an in-memory exporter).
    pub fn with_meter_provider(mut self, provider: SdkMeterProvider) -> Self {
        self.meter_provider = Some(provider);
        self
    }

    /// The tracer for the engine's operational spans (start-up, shutdown): the request spans'
    /// provider's, when spans are exported.
    pub fn ops_tracer(&self) -> Option<SdkTracer> {
        self.provider.as_ref().map(|p| p.tracer("slotlight-engine"))
    }

    /// The meter the engine's instruments go on, when OTLP metrics are on.
    pub fn meter(&self) -> Option<Meter> {
        self.meter_provider
            .as_ref()
            .map(|p| p.meter("slotlight-engine"))
    }

    /// A reader of the exporter's counts and the sampling ratio, for the metrics (it holds
    /// the counters, not the telemetry).
    pub fn snapshot_source(&self) -> Arc<dyn Fn() -> TelemetrySnapshot + Send + Sync> {
        let stats = Arc::clone(&self.stats);
        let sampling_ratio = self.sampling_ratio;
        Arc::new(move || TelemetrySnapshot {
            spans_exported: stats.exported.load(Ordering::Relaxed),
            spans_dropped: stats.dropped.load(Ordering::Relaxed),
            export_failures: stats.failures.load(Ordering::Relaxed),
            spans_queued: stats.held.load(Ordering::Relaxed),
            sampling_ratio,
        })
    }

    /// States the share of traces the provider's sampler keeps.
    pub fn with_sampling_ratio(mut self, ratio: f64) -> Self {
        self.sampling_ratio = ratio;
        self
    }

    /// The share of request traces the sampler keeps, from 0 to 1 (0 when disabled).
    pub fn sampling_ratio(&self) -> f64 {
        self.sampling_ratio
    }

    /// What the exporter did so far.
    pub fn counts(&self) -> ExportCounts {
        ExportCounts {
            enabled: self.provider.is_some(),
            endpoint: self.endpoint.clone(),
            ended: self.stats.ended.load(Ordering::Relaxed),
            exported: self.stats.exported.load(Ordering::Relaxed),
            dropped: self.stats.dropped.load(Ordering::Relaxed),
            failures: self.stats.failures.load(Ordering::Relaxed),
            queued: self.stats.held.load(Ordering::Relaxed),
            queue_max_spans: self.limits.map_or(0, |l| l.max_spans),
            queue_max_bytes: self.limits.map_or(0, |l| l.max_bytes),
        }
    }

    /// Flushes pending spans and metrics and shuts the exporters down (off the async
    /// runtime's threads), waiting at most [`SHUTDOWN_WAIT`] for a collector that is down.
    pub async fn shutdown(&self) {
        let (traces, metrics) = (self.provider.clone(), self.meter_provider.clone());
        let logs = self.logger_provider.clone();
        let _ = tokio::task::spawn_blocking(move || {
            if let Some(m) = metrics {
                let _ = m.force_flush();
                let _ = m.shutdown();
            }
            if let Some(l) = logs {
                let _ = l.shutdown_with_timeout(SHUTDOWN_WAIT);
            }
            if let Some(p) = traces {
                // The export queue sends what it holds until the deadline, then counts the
                // rest as dropped.
                let _ = p.shutdown_with_timeout(SHUTDOWN_WAIT);
            }
        })
        .await;
    }

    /// Flushes pending spans and metrics now.
    pub async fn flush(&self) {
        let (traces, metrics) = (self.provider.clone(), self.meter_provider.clone());
        let logs = self.logger_provider.clone();
        let _ = tokio::task::spawn_blocking(move || {
            if let Some(m) = metrics {
                let _ = m.force_flush();
            }
            if let Some(l) = logs {
                let _ = l.force_flush();
            }
            if let Some(p) = traces {
                let _ = p.force_flush();
            }
        })
        .await;
    }
}

/// Why telemetry could not be set up; the engine refuses to start rather than run without
/// the telemetry it was asked for.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// `--otlp-protocol` or `OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL` names a protocol the engine
    /// does not speak.
    #[error("unsupported OTLP protocol {0:?} (use grpc or http/protobuf)")]
    UnsupportedProtocol(String),
    /// The OTLP exporter could not be built (a malformed endpoint, or gRPC outside a tokio
    /// runtime).
    #[error("OTLP {transport} exporter for {endpoint}: {source}")]
    Exporter {
        /// `gRPC` or `HTTP`.
        transport: &'static str,
        /// The endpoint it was built for.
        endpoint: String,
        /// What the OTLP crate said.
        #[source]
        source: opentelemetry_otlp::ExporterBuildError,
    },
    /// The span export queue's thread could not be started.
    #[error("span export thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// An OTLP transport the engine speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// OTLP/gRPC (`grpc`, the default).
    Grpc,
    /// OTLP/HTTP with protobuf bodies (`http/protobuf`).
    HttpProtobuf,
}

impl OtlpProtocol {
    /// Parses `grpc` or `http/protobuf` (`http` accepted).
    pub fn parse(s: &str) -> Result<Self, TelemetryError> {
        match s.trim() {
            "grpc" => Ok(Self::Grpc),
            "http/protobuf" | "http" => Ok(Self::HttpProtobuf),
            other => Err(TelemetryError::UnsupportedProtocol(other.to_string())),
        }
    }
}

/// An OTLP signal the engine exports. Each is resolved and built the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// Spans (always, unless telemetry is off).
    Traces,
    /// Metrics (`OTEL_METRICS_EXPORTER=otlp`).
    Metrics,
    /// The per-turn log records (`OTEL_LOGS_EXPORTER=otlp`).
    Logs,
}

impl Signal {
    /// Its part of the standard variables' names (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`).
    fn env_key(self) -> &'static str {
        match self {
            Signal::Traces => "TRACES",
            Signal::Metrics => "METRICS",
            Signal::Logs => "LOGS",
        }
    }

    /// Its OTLP/HTTP path segment (`/v1/traces`).
    fn http_path(self) -> &'static str {
        match self {
            Signal::Traces => "traces",
            Signal::Metrics => "metrics",
            Signal::Logs => "logs",
        }
    }
}

/// The first of these variables that is set.
fn env_first(names: &[&str]) -> Option<String> {
    names.iter().find_map(|n| std::env::var(n).ok())
}

/// Telemetry as flags and the standard variables ask: no spans with `--no-telemetry` or
/// `OTEL_SDK_DISABLED=true`, else spans over OTLP with the protocol and endpoint given (flags
/// win over `OTEL_EXPORTER_OTLP_TRACES_*`, which win over `OTEL_EXPORTER_OTLP_*`); metrics
/// over OTLP as well with `OTEL_METRICS_EXPORTER=otlp` (see [`otlp_metrics`]). Must run
/// inside a tokio runtime (the gRPC client needs one).
pub fn from_config(cfg: &TelemetryConfig) -> Result<Telemetry, TelemetryError> {
    if cfg.disabled || env_true("OTEL_SDK_DISABLED") {
        return with_env_metrics(Telemetry::disabled(), cfg);
    }
    let (protocol, endpoint) = signal_target(cfg, Signal::Traces)?;
    let limits = cfg.queue.unwrap_or_else(QueueLimits::from_env);
    let telemetry = otlp_spans(protocol, endpoint.as_deref(), limits)?;
    with_env_metrics(telemetry, cfg)
}

/// Where `signal` goes: the flags' protocol and endpoint, else
/// `OTEL_EXPORTER_OTLP_{SIGNAL}_*`, else `OTEL_EXPORTER_OTLP_*` (gRPC by default). The endpoint
/// is completed by [`signal_endpoint`].
fn signal_target(
    cfg: &TelemetryConfig,
    signal: Signal,
) -> Result<(OtlpProtocol, Option<String>), TelemetryError> {
    let var = |what: &str| format!("OTEL_EXPORTER_OTLP_{}_{what}", signal.env_key());
    let protocol = cfg
        .protocol
        .clone()
        .or_else(|| env_first(&[var("PROTOCOL").as_str(), "OTEL_EXPORTER_OTLP_PROTOCOL"]))
        .map_or(Ok(OtlpProtocol::Grpc), |p| OtlpProtocol::parse(&p))?;
    let endpoint = cfg
        .endpoint
        .clone()
        .or_else(|| env_first(&[var("ENDPOINT").as_str(), "OTEL_EXPORTER_OTLP_ENDPOINT"]));
    Ok((protocol, endpoint))
}

/// Whether `OTEL_{signal}_EXPORTER` (a comma-separated list) names `otlp`.
fn exporter_wanted(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| v.split(',').any(|e| e.trim() == "otlp"))
        && !env_true("OTEL_SDK_DISABLED")
}

/// The endpoint `signal` is exported to over `protocol`: `endpoint`, else the collector's
/// default port (4317 for gRPC, 4318 for HTTP); over HTTP with the signal's path
/// (`/v1/traces`, `/v1/metrics`, `/v1/logs`) appended unless present.
fn signal_endpoint(signal: Signal, protocol: OtlpProtocol, endpoint: Option<&str>) -> String {
    match protocol {
        OtlpProtocol::Grpc => endpoint.unwrap_or("http://127.0.0.1:4317").to_string(),
        OtlpProtocol::HttpProtobuf => http_url(
            endpoint.unwrap_or("http://127.0.0.1:4318"),
            signal.http_path(),
        ),
    }
}

/// `$signal`'s OTLP exporter (`$builder`: its `Exporter::builder()`) over `$protocol` to
/// [`signal_endpoint`], with an export timeout and, when given, a retry policy: the exporter
/// and the endpoint it sends to. A build failure names the transport and endpoint. A macro
/// because each signal's builder is its own type.
macro_rules! otlp_exporter {
    ($builder:expr, $signal:expr, $protocol:expr, $endpoint:expr, $timeout:expr $(, $retry:expr)?) => {{
        let endpoint = signal_endpoint($signal, $protocol, $endpoint);
        let (built, transport) = match $protocol {
            OtlpProtocol::Grpc => {
                let e = $builder
                    .with_tonic()
                    .with_endpoint(endpoint.clone())
                    .with_timeout($timeout)
                    $(.with_retry_policy($retry))?
                    .build();
                (e, "gRPC")
            }
            OtlpProtocol::HttpProtobuf => {
                let e = $builder
                    .with_http()
                    .with_protocol(Protocol::HttpBinary)
                    .with_endpoint(endpoint.clone())
                    .with_timeout($timeout)
                    $(.with_retry_policy($retry))?
                    .build();
                (e, "HTTP")
            }
        };
        match built {
            Ok(exporter) => Ok((exporter, endpoint)),
            Err(source) => Err(TelemetryError::Exporter {
                transport,
                endpoint,
                source,
            }),
        }
    }};
}

/// Adds the OTLP logs pipeline of the per-turn records when `OTEL_LOGS_EXPORTER` names `otlp`
/// (unset or `none`: the records stay log lines). The protocol and endpoint are the flags',
/// else `OTEL_EXPORTER_OTLP_LOGS_*`, else `OTEL_EXPORTER_OTLP_*`.
fn with_env_logs(
    mut telemetry: Telemetry,
    cfg: &TelemetryConfig,
) -> Result<Telemetry, TelemetryError> {
    if !exporter_wanted("OTEL_LOGS_EXPORTER") {
        return Ok(telemetry);
    }
    let (protocol, endpoint) = signal_target(cfg, Signal::Logs)?;
    telemetry.logger_provider = Some(otlp_logs(
        protocol,
        endpoint.as_deref(),
        &telemetry.instance_id,
    )?);
    Ok(telemetry)
}

/// Log records over OTLP with `protocol` to `endpoint` (defaults as for spans), batched and
/// sent by the batch processor's own thread. Must run inside a tokio runtime for gRPC.
pub fn otlp_logs(
    protocol: OtlpProtocol,
    endpoint: Option<&str>,
    instance_id: &str,
) -> Result<SdkLoggerProvider, TelemetryError> {
    let (exporter, _) = otlp_exporter!(
        opentelemetry_otlp::LogExporter::builder(),
        Signal::Logs,
        protocol,
        endpoint,
        export_timeout()
    )?;
    Ok(SdkLoggerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource(instance_id))
        .build())
}

/// Adds OTLP metrics when `OTEL_METRICS_EXPORTER` names `otlp` (unset or `none`: no metrics
/// are pushed; `GET /metrics` serves them either way), then the logs ([`with_env_logs`]). The protocol and endpoint are the
/// flags', else `OTEL_EXPORTER_OTLP_METRICS_*`, else `OTEL_EXPORTER_OTLP_*`; the interval is
/// `OTEL_METRIC_EXPORT_INTERVAL` (ms, default 60 s).
fn with_env_metrics(
    mut telemetry: Telemetry,
    cfg: &TelemetryConfig,
) -> Result<Telemetry, TelemetryError> {
    if exporter_wanted("OTEL_METRICS_EXPORTER") {
        let (protocol, endpoint) = signal_target(cfg, Signal::Metrics)?;
        telemetry.meter_provider = Some(otlp_metrics(
            protocol,
            endpoint.as_deref(),
            &telemetry.instance_id,
        )?);
    }
    with_env_logs(telemetry, cfg)
}

/// Metrics over OTLP with `protocol` to `endpoint` (defaults as for spans), pushed every
/// `OTEL_METRIC_EXPORT_INTERVAL` by the periodic reader's own thread, cumulative. Must run
/// inside a tokio runtime for gRPC.
pub fn otlp_metrics(
    protocol: OtlpProtocol,
    endpoint: Option<&str>,
    instance_id: &str,
) -> Result<SdkMeterProvider, TelemetryError> {
    let (exporter, _) = otlp_exporter!(
        opentelemetry_otlp::MetricExporter::builder(),
        Signal::Metrics,
        protocol,
        endpoint,
        Duration::from_secs(2)
    )?;
    Ok(SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(exporter).build())
        .with_resource(resource(instance_id))
        .build())
}

/// Spans over OTLP with `protocol` to `endpoint` (`signal_endpoint`: default
/// `http://127.0.0.1:4317` for gRPC; over HTTP a base URL, default `http://127.0.0.1:4318`,
/// with `/v1/traces` appended unless present), through an export queue of `limits`, retried
/// within each attempt (`retry_policy`). Must run inside a tokio runtime for gRPC.
pub fn otlp_spans(
    protocol: OtlpProtocol,
    endpoint: Option<&str>,
    limits: QueueLimits,
) -> Result<Telemetry, TelemetryError> {
    let (exporter, endpoint) = otlp_exporter!(
        opentelemetry_otlp::SpanExporter::builder(),
        Signal::Traces,
        protocol,
        endpoint,
        export_timeout(),
        retry_policy()
    )?;
    exporting(exporter, endpoint, limits)
}

/// The full OTLP/HTTP URL of `signal` (`traces`, `metrics`, `logs`) from a base URL, or the URL itself
/// when it already ends in `/v1/{signal}`.
fn http_url(base: &str, signal: &str) -> String {
    let base = base.trim_end_matches('/');
    let path = format!("/v1/{signal}");
    if base.ends_with(&path) {
        base.to_string()
    } else {
        format!("{base}{path}")
    }
}

/// One export attempt's budget, its own retries included: `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`
/// or `OTEL_EXPORTER_OTLP_TIMEOUT` (ms), else 5 s. The queue tries again after it.
fn export_timeout() -> Duration {
    env_first(&[
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        "OTEL_EXPORTER_OTLP_TIMEOUT",
    ])
    .and_then(|v| v.trim().parse::<u64>().ok())
    .map_or(Duration::from_secs(5), Duration::from_millis)
}

/// The OTLP exporter's retries within one attempt: exponential from 100 ms to 2 s (longer
/// when the collector's `Retry-After` or `RetryInfo` asks), until the attempt's budget is spent.
fn retry_policy() -> opentelemetry_otlp::RetryPolicy {
    opentelemetry_otlp::RetryPolicy::recommended()
        .with_max_retries(16)
        .with_max_delay(Duration::from_secs(2))
}

/// The engine's resource: `service.name` (unless `OTEL_SERVICE_NAME` or
/// `OTEL_RESOURCE_ATTRIBUTES` set it), `service.instance.id` and `service.version`.
fn resource(instance_id: &str) -> Resource {
    let mut rb = Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() && resource_attr("service.name").is_none() {
        rb = rb.with_service_name(attr::value::SERVICE_NAME_ENGINE);
    }
    rb.with_attributes([
        KeyValue::new(attr::SERVICE_INSTANCE_ID, instance_id.to_string()),
        KeyValue::new(attr::SERVICE_VERSION, env!("CARGO_PKG_VERSION")),
    ])
    .build()
}

/// Telemetry exporting spans through `exporter`, behind the export queue (counted, bounded,
/// retried on its own thread), with the sampler of `OTEL_TRACES_SAMPLER`.
fn exporting<E: SpanExporter + 'static>(
    mut exporter: E,
    endpoint: String,
    limits: QueueLimits,
) -> Result<Telemetry, TelemetryError> {
    let stats: Arc<ExportStats> = Arc::default();
    let instance_id = resource_attr("service.instance.id").unwrap_or_else(new_instance_id);
    let res = resource(&instance_id);
    // The queue owns the exporter on its thread: it gets the resource now.
    exporter.set_resource(&res);
    let queue = ExportQueue::start(exporter, limits, Arc::clone(&stats), endpoint.clone())
        .map_err(TelemetryError::Thread)?;
    let (sampler, sampling_ratio) = sampler_from_env();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(queue)
        .with_sampler(sampler)
        .with_resource(res)
        .build();
    let tracer = provider.tracer("slotlight-engine");
    Ok(Telemetry {
        tracer: Arc::new(BoxedTracer::new(Box::new(tracer))),
        provider: Some(provider),
        stats,
        endpoint: Some(endpoint),
        limits: Some(limits),
        sampling_ratio,
        meter_provider: None,
        logger_provider: None,
        instance_id,
        data_parallel_rank: 0,
    })
}

/// A key from `OTEL_RESOURCE_ATTRIBUTES`.
fn resource_attr(key: &str) -> Option<String> {
    let all = std::env::var("OTEL_RESOURCE_ATTRIBUTES").ok()?;
    all.split(',')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| k.trim() == key)
        .map(|(_, v)| v.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocols_parse_and_others_are_a_typed_error() {
        assert_eq!(OtlpProtocol::parse("grpc").ok(), Some(OtlpProtocol::Grpc));
        assert_eq!(
            OtlpProtocol::parse("http/protobuf").ok(),
            Some(OtlpProtocol::HttpProtobuf)
        );
        assert!(matches!(
            OtlpProtocol::parse("http/json"),
            Err(TelemetryError::UnsupportedProtocol(p)) if p == "http/json"
        ));
    }

    #[test]
    fn http_urls_get_their_signal_path_once() {
        assert_eq!(
            http_url("http://h:4318", "traces"),
            "http://h:4318/v1/traces"
        );
        assert_eq!(
            http_url("http://h:4318/v1/traces/", "traces"),
            "http://h:4318/v1/traces"
        );
        assert_eq!(
            http_url("http://h:4318/", "metrics"),
            "http://h:4318/v1/metrics"
        );
    }

    #[test]
    fn every_signal_gets_the_default_port_of_its_protocol_and_its_own_http_path() {
        use OtlpProtocol::{Grpc, HttpProtobuf};
        for signal in [Signal::Traces, Signal::Metrics, Signal::Logs] {
            assert_eq!(signal_endpoint(signal, Grpc, None), "http://127.0.0.1:4317");
            assert_eq!(
                signal_endpoint(signal, Grpc, Some("http://c:4317")),
                "http://c:4317"
            );
        }
        assert_eq!(
            signal_endpoint(Signal::Traces, HttpProtobuf, None),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            signal_endpoint(Signal::Metrics, HttpProtobuf, Some("http://c:4318")),
            "http://c:4318/v1/metrics"
        );
        assert_eq!(
            signal_endpoint(Signal::Logs, HttpProtobuf, Some("http://c:4318/v1/logs")),
            "http://c:4318/v1/logs"
        );
    }

    #[test]
    fn a_malformed_grpc_endpoint_is_an_exporter_error() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let _g = rt.enter();
        let e = otlp_spans(
            OtlpProtocol::Grpc,
            Some("not a url"),
            QueueLimits::default(),
        )
        .err()
        .expect("an error");
        assert!(
            matches!(
                &e,
                TelemetryError::Exporter {
                    transport: "gRPC",
                    ..
                }
            ),
            "{e:?}"
        );
    }
}
