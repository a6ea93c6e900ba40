//! `GET /metrics`: the Prometheus text format (0.0.4), or OpenMetrics 1.0 when the scraper
//! asks for it ([`slotlight_otel::exposition::negotiate`]), encoded by `prometheus-client`.
//! One scrape reads every source once: the per-turn series and the spanmetrics under their
//! locks, the live gauges from the slot snapshot, the sidecar's own counters as loaded.
//! `# HELP` is the contract's doc of each name.

use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use slotlight_otel::metric::{self, label};

use super::histogram::TraceHistogram;
use super::requests::{RequestMetrics, SeriesMetrics, genai_labels};
use super::sessions::SessionMetrics;
use super::span_totals::SpanTotals;
use super::{EvictReason, REQUEST_REJECT_LABELS};
use crate::base::error::SpanReject;
use crate::records::slots::SlotsSnapshot;

/// A sample's labels, in the order they are written.
type Labels = Vec<(&'static str, String)>;

/// The sidecar's own counters, as loaded at scrape time.
#[derive(Debug, Clone, Copy, Default)]
pub struct OwnCounts {
    /// Spans received (all producers).
    pub spans_received: u64,
    /// Engine spans rejected, by [`SpanReject`] (in [`SpanReject::ALL`] order).
    pub spans_rejected: [u64; 4],
    /// Spans of other producers, accepted and not viewed.
    pub spans_ignored: u64,
    /// Spans refused because the ingest queue was full.
    pub spans_dropped: u64,
    /// Spans that came after what they describe was over.
    pub spans_late: u64,
    /// Export requests refused, by [`REQUEST_REJECT_LABELS`].
    pub requests_rejected: [u64; 5],
    /// Requests evicted from the assembly, by [`EvictReason`].
    pub traces_evicted: [u64; 2],
    /// Requests being assembled.
    pub traces_in_flight: u64,
    /// OTLP metric data points received.
    pub metric_points: u64,
    /// OTLP log records received.
    pub log_records: u64,
    /// Export requests forwarded upstream.
    pub forwarded: u64,
    /// Export requests not forwarded.
    pub forward_dropped: u64,
    /// Turn records the store's writer was too far behind to take.
    pub turns_not_stored: u64,
    /// Turn records written without their request span.
    pub turns_incomplete: u64,
}

/// The gauges read from the latest slot snapshot.
#[derive(Debug, Clone, Default)]
pub struct LiveGauges {
    /// Requests running, by instance.
    running: Vec<(Labels, u64)>,
    /// The sampling ratio each instance last stated.
    sampling_ratio: Vec<(Labels, f64)>,
    /// Each occupied slot's decode rate.
    slot_rate: Vec<(Labels, f64)>,
}

impl LiveGauges {
    /// The gauges of `slots`.
    pub fn of(slots: &SlotsSnapshot) -> Self {
        let mut g = LiveGauges::default();
        for i in &slots.instances {
            let instance = || vec![(label::INSTANCE, i.instance.to_string())];
            g.running.push((instance(), i.running));
            if let Some(r) = i.sampling_ratio {
                g.sampling_ratio.push((instance(), r));
            }
            for r in &i.rows {
                let Some(rate) = r.occupant.as_ref().and_then(|o| o.tok_s()) else {
                    continue;
                };
                let slot = r
                    .key
                    .index
                    .map_or_else(|| r.key.path.as_str().to_string(), |i| i.to_string());
                g.slot_rate.push((
                    vec![
                        (label::INSTANCE, i.instance.to_string()),
                        (label::SLOT_GROUP, r.key.group.to_string()),
                        (label::SLOT, slot),
                    ],
                    rate,
                ));
            }
        }
        g
    }
}

/// Everything one scrape reports.
#[derive(Debug)]
pub struct Scrape {
    /// The per-turn series (read under their lock while encoding).
    pub requests: Arc<Mutex<RequestMetrics>>,
    /// The live gauges.
    pub live: LiveGauges,
    /// The spanmetrics series (read under their lock while encoding).
    pub spans: Arc<Mutex<SpanTotals>>,
    /// The session histograms.
    pub sessions: Arc<SessionMetrics>,
    /// The sidecar's own counters.
    pub own: OwnCounts,
}

/// Renders `scrape` in OpenMetrics (with exemplars and `# EOF`) or the Prometheus text format.
pub fn render(scrape: Scrape, openmetrics: bool) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(scrape));
    let mut out = String::with_capacity(16 << 10);
    let written = if openmetrics {
        prometheus_client::encoding::text::encode(&mut out, &registry)
    } else {
        prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)
    };
    // Writing to a String cannot fail; an encoder error would be a bug in a label set.
    if let Err(e) = written {
        tracing::error!(error = %e, "Metrics.EncodeFailed");
    }
    out
}

/// The contract's doc of `name`, as written since the first release (not trimmed).
fn help(name: &str) -> &'static str {
    metric::ALL
        .iter()
        .find(|e| e.name == name)
        .map_or("", |e| e.doc)
}

/// The family's descriptor; a counter is described without its `_total`, which the encoder
/// adds to each sample.
fn family<'s>(
    enc: &'s mut DescriptorEncoder<'_>,
    name: &'static str,
    t: MetricType,
) -> Result<MetricEncoder<'s>, std::fmt::Error> {
    let base = match t {
        MetricType::Counter => name.strip_suffix("_total").unwrap_or(name),
        _ => name,
    };
    enc.encode_descriptor(base, help(name), None, t)
}

fn counter(m: &mut MetricEncoder<'_>, labels: &Labels, v: u64) -> std::fmt::Result {
    m.encode_family(labels)?
        .encode_counter::<NoLabelSet, u64, u64>(&v, None)
}

fn gauge<V: prometheus_client::encoding::EncodeGaugeValue>(
    m: &mut MetricEncoder<'_>,
    labels: &Labels,
    v: V,
) -> std::fmt::Result {
    m.encode_family(labels)?.encode_gauge(&v)
}

fn histogram(m: &mut MetricEncoder<'_>, labels: &Labels, h: &TraceHistogram) -> std::fmt::Result {
    h.encode(m.encode_family(labels)?)
}

fn encode_requests(r: &RequestMetrics, enc: &mut DescriptorEncoder<'_>) -> std::fmt::Result {
    type H = fn(&SeriesMetrics) -> &TraceHistogram;
    let ok_only: [(&'static str, H); 2] = [
        (metric::TIME_TO_FIRST_TOKEN, |m| &m.ttft),
        (metric::TIME_PER_OUTPUT_TOKEN, |m| &m.tpot),
    ];
    for (name, get) in ok_only {
        let mut f = family(enc, name, MetricType::Histogram)?;
        for (k, m) in &r.series {
            histogram(&mut f, &genai_labels(k), get(m))?;
        }
    }
    {
        let mut f = family(enc, metric::REQUEST_DURATION, MetricType::Histogram)?;
        for (k, m) in &r.series {
            for (error_type, h) in &m.duration {
                let mut l = genai_labels(k);
                if let Some(e) = error_type {
                    l.push((label::ERROR_TYPE, e.clone()));
                }
                histogram(&mut f, &l, h)?;
            }
        }
    }
    let phases: [(&'static str, H); 3] = [
        (metric::QUEUE_TIME, |m| &m.queue),
        (metric::PREFILL_TIME, |m| &m.prefill),
        (metric::DECODE_TIME, |m| &m.decode),
    ];
    for (name, get) in phases {
        let mut f = family(enc, name, MetricType::Histogram)?;
        for (k, m) in &r.series {
            histogram(&mut f, &genai_labels(k), get(m))?;
        }
    }
    type C = fn(&SeriesMetrics) -> u64;
    let counters: [(&'static str, C); 6] = [
        (metric::PROMPT_TOKENS, |m| m.prompt_tokens),
        (metric::CACHED_TOKENS, |m| m.cached_tokens),
        (metric::GENERATED_TOKENS, |m| m.generated_tokens),
        (metric::DRAFTED_TOKENS, |m| m.drafted_tokens),
        (metric::ACCEPTED_TOKENS, |m| m.accepted_tokens),
        (metric::MOVES, |m| m.moves),
    ];
    for (name, get) in counters {
        let mut f = family(enc, name, MetricType::Counter)?;
        for (k, m) in &r.series {
            counter(&mut f, &genai_labels(k), get(m))?;
        }
    }
    {
        let mut f = family(enc, metric::REQUESTS, MetricType::Counter)?;
        for (k, m) in &r.series {
            for ((status, finish, error), n) in &m.requests {
                let mut l = genai_labels(k);
                l.push((label::STATUS, status.as_str().to_string()));
                if let Some(v) = finish {
                    l.push((label::FINISH_REASON, v.clone()));
                }
                if let Some(e) = error {
                    l.push((label::ERROR_TYPE, e.clone()));
                }
                counter(&mut f, &l, *n)?;
            }
        }
    }
    let mut f = family(enc, metric::TURNS_BY_RESUME, MetricType::Counter)?;
    for (k, m) in &r.series {
        for (resume, n) in &m.resume {
            let mut l = genai_labels(k);
            l.push((label::RESUME, resume.clone()));
            counter(&mut f, &l, *n)?;
        }
    }
    Ok(())
}

fn encode_sessions(s: &SessionMetrics, enc: &mut DescriptorEncoder<'_>) -> std::fmt::Result {
    let none = Labels::new();
    for (name, h) in [
        (metric::SESSION_TURNS, &s.turns),
        (metric::SESSION_DURATION, &s.duration),
        (metric::SESSION_CACHE_HIT_RATIO, &s.cache_hit_ratio),
        (metric::SESSION_CLIENT_SHARE, &s.client_share),
    ] {
        let mut f = family(enc, name, MetricType::Histogram)?;
        histogram(&mut f, &none, h)?;
    }
    Ok(())
}

fn encode_live(g: &LiveGauges, enc: &mut DescriptorEncoder<'_>) -> std::fmt::Result {
    let mut f = family(enc, metric::RUNNING_REQUESTS, MetricType::Gauge)?;
    for (l, v) in &g.running {
        gauge(&mut f, l, *v)?;
    }
    let mut f = family(enc, metric::SIDECAR_TRACE_SAMPLING_RATIO, MetricType::Gauge)?;
    for (l, v) in &g.sampling_ratio {
        gauge(&mut f, l, *v)?;
    }
    let mut f = family(enc, metric::SLOT_TOKENS_PER_SECOND, MetricType::Gauge)?;
    for (l, v) in &g.slot_rate {
        gauge(&mut f, l, *v)?;
    }
    Ok(())
}

fn encode_spans(s: &SpanTotals, enc: &mut DescriptorEncoder<'_>) -> std::fmt::Result {
    let series = s.series();
    let labels = |k: &super::span_totals::SeriesKey| -> Labels {
        let kind = SpanKind::try_from(k.2).unwrap_or(SpanKind::Unspecified);
        let status = StatusCode::try_from(k.3).unwrap_or(StatusCode::Unset);
        vec![
            (label::SERVICE_NAME, k.0.to_string()),
            (label::SPAN_NAME, k.1.to_string()),
            (label::SPAN_KIND, kind.as_str_name().to_string()),
            (label::STATUS_CODE, status.as_str_name().to_string()),
        ]
    };
    let mut f = family(enc, metric::SPAN_CALLS, MetricType::Counter)?;
    for (k, t) in &series {
        counter(&mut f, &labels(k), t.calls)?;
    }
    let mut f = family(enc, metric::SPAN_DURATION, MetricType::Histogram)?;
    for (k, t) in &series {
        histogram(&mut f, &labels(k), &t.duration)?;
    }
    Ok(())
}

fn encode_own(o: &OwnCounts, enc: &mut DescriptorEncoder<'_>) -> std::fmt::Result {
    let none = Labels::new();
    let reason = |r: &str| vec![(label::REASON, r.to_string())];
    counter(
        &mut family(enc, metric::SIDECAR_SPANS_RECEIVED, MetricType::Counter)?,
        &none,
        o.spans_received,
    )?;
    let mut f = family(enc, metric::SIDECAR_SPANS_REJECTED, MetricType::Counter)?;
    for r in SpanReject::ALL {
        counter(&mut f, &reason(r.label()), o.spans_rejected[r as usize])?;
    }
    for (name, v) in [
        (metric::SIDECAR_SPANS_IGNORED, o.spans_ignored),
        (metric::SIDECAR_SPANS_DROPPED, o.spans_dropped),
        (metric::SIDECAR_SPANS_LATE, o.spans_late),
    ] {
        counter(&mut family(enc, name, MetricType::Counter)?, &none, v)?;
    }
    let mut f = family(enc, metric::SIDECAR_REQUESTS_REJECTED, MetricType::Counter)?;
    for (l, v) in REQUEST_REJECT_LABELS.iter().zip(o.requests_rejected) {
        counter(&mut f, &reason(l), v)?;
    }
    let mut f = family(enc, metric::SIDECAR_TRACES_EVICTED, MetricType::Counter)?;
    for r in EvictReason::ALL {
        counter(&mut f, &reason(r.label()), o.traces_evicted[r as usize])?;
    }
    gauge(
        &mut family(enc, metric::SIDECAR_TRACES_IN_FLIGHT, MetricType::Gauge)?,
        &none,
        o.traces_in_flight,
    )?;
    for (name, v) in [
        (metric::SIDECAR_METRIC_POINTS_RECEIVED, o.metric_points),
        (metric::SIDECAR_LOG_RECORDS_RECEIVED, o.log_records),
        (metric::SIDECAR_FORWARDED, o.forwarded),
        (metric::SIDECAR_FORWARD_DROPPED, o.forward_dropped),
        (metric::SIDECAR_TURNS_NOT_STORED, o.turns_not_stored),
        (metric::SIDECAR_TURNS_INCOMPLETE, o.turns_incomplete),
    ] {
        counter(&mut family(enc, name, MetricType::Counter)?, &none, v)?;
    }
    Ok(())
}

impl Collector for Scrape {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> std::fmt::Result {
        {
            let r = self.requests.lock().unwrap_or_else(|p| p.into_inner());
            encode_requests(&r, &mut enc)?;
        }
        encode_sessions(&self.sessions, &mut enc)?;
        encode_live(&self.live, &mut enc)?;
        {
            let s = self.spans.lock().unwrap_or_else(|p| p.into_inner());
            encode_spans(&s, &mut enc)?;
        }
        encode_own(&self.own, &mut enc)
    }
}
