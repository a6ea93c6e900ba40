//! Every metric the sidecar serves on `/metrics`, kept here and encoded by `prometheus-client`
//! ([`exposition`]) in the Prometheus text format 0.0.4 or OpenMetrics 1.0 (with trace-id
//! exemplars), as the scraper asks.
//!
//! Three sources: the sidecar's own counters (atomics, bumped by receivers and the assembly),
//! the spanmetrics-compatible `traces_span_metrics_*` over every span received ([`span_totals`],
//! merged once per export request), and per-request histograms and counters observed from each
//! turn record ([`requests`]). Live gauges (running requests, each slot's rate) are read from
//! the latest slot snapshot at scrape time. Every name comes from [`slotlight_otel::metric`];
//! `# HELP` is the contract's doc.
//!
//! Label sets are bounded: models and span-metric series are capped (overflow goes to an
//! `_overflow` series) and no request or trace id is ever a label (trace ids appear only as
//! OpenMetrics exemplars).

pub mod exposition;
pub mod histogram;
pub mod requests;
pub mod sessions;
pub mod span_totals;
pub mod spanmetrics;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::base::error::IngestError;
use crate::records::slots::SlotsSnapshot;
use crate::records::turn::TurnRecord;
use exposition::{LiveGauges, OwnCounts, Scrape};
use requests::RequestMetrics;
use sessions::SessionMetrics;
use span_totals::SpanTotals;
use spanmetrics::SpanBatch;

pub use slotlight_otel::exposition::negotiate;

/// Label value for series beyond a cardinality cap.
pub const OVERFLOW: &str = "_overflow";

/// Why a request was evicted from the assembly.
#[derive(Debug, Clone, Copy)]
pub enum EvictReason {
    /// The in-flight map was full.
    Capacity = 0,
    /// No span for `--trace-ttl-s`.
    Ttl = 1,
}

impl EvictReason {
    /// Both reasons, in the order they are exported.
    pub const ALL: [EvictReason; 2] = [EvictReason::Capacity, EvictReason::Ttl];

    /// The `reason` label of `slotlight_sidecar_traces_evicted_total`.
    pub fn label(self) -> &'static str {
        match self {
            EvictReason::Capacity => "capacity",
            EvictReason::Ttl => "ttl",
        }
    }
}

/// The `reason` labels of `slotlight_sidecar_requests_rejected_total`, in export order: the
/// [`IngestError`] labels that refuse a whole export request.
pub const REQUEST_REJECT_LABELS: [&str; 5] = [
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
    log_records: AtomicU64,
    forwarded: AtomicU64,
    forward_dropped: AtomicU64,
    turns_not_stored: AtomicU64,
    turns_incomplete: AtomicU64,
    spans: Arc<Mutex<SpanTotals>>,
    requests: Arc<Mutex<RequestMetrics>>,
    sessions: Arc<SessionMetrics>,
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
            log_records: AtomicU64::new(0),
            forwarded: AtomicU64::new(0),
            forward_dropped: AtomicU64::new(0),
            turns_not_stored: AtomicU64::new(0),
            turns_incomplete: AtomicU64::new(0),
            spans: Arc::new(Mutex::new(SpanTotals::new(max_span_series))),
            requests: Arc::new(Mutex::new(RequestMetrics::default())),
            sessions: Arc::new(SessionMetrics::default()),
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

    /// Counts log records received (OTLP logs are accepted and forwarded, not viewed).
    pub fn count_log_records(&self, n: u64) {
        self.log_records.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts a forwarded export request.
    pub fn count_forwarded(&self) {
        self.forwarded.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts an export request that was not forwarded.
    pub fn count_forward_dropped(&self) {
        self.forward_dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a turn record the turn store's writer was too far behind to take.
    pub fn count_turn_not_stored(&self) {
        self.turns_not_stored.fetch_add(1, Ordering::Relaxed);
    }

    /// Spans received so far (all producers).
    pub fn spans_received(&self) -> u64 {
        self.spans_received.load(Ordering::Relaxed)
    }

    /// Merges one export request's spanmetrics (every span, all producers).
    pub fn merge_spans(&self, batch: SpanBatch<'_>) {
        if batch.is_empty() {
            return;
        }
        let mut g = self.spans.lock().unwrap_or_else(|p| p.into_inner());
        g.merge(batch);
    }

    /// Adds a finished request to the request metrics; an incomplete record (no request
    /// span) is only counted: none of its numbers is known.
    pub fn observe_turn(&self, t: &TurnRecord) {
        if !t.complete {
            self.turns_incomplete.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut g = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        g.observe(t);
    }

    /// Observes a session that stopped being live, at `now_ns`.
    pub fn observe_session(&self, s: &crate::records::session::SessionRecord, now_ns: i64) {
        self.sessions.observe(s, now_ns);
    }

    /// Renders everything. `openmetrics` selects OpenMetrics 1.0 (with trace-id exemplars)
    /// over the Prometheus text format 0.0.4.
    pub fn render(&self, slots: &SlotsSnapshot, openmetrics: bool) -> String {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let own = OwnCounts {
            spans_received: load(&self.spans_received),
            spans_rejected: self.spans_rejected.each_ref().map(load),
            spans_ignored: load(&self.spans_ignored),
            spans_dropped: load(&self.spans_dropped),
            spans_late: load(&self.spans_late),
            requests_rejected: self.requests_rejected.each_ref().map(load),
            traces_evicted: self.traces_evicted.each_ref().map(load),
            traces_in_flight: load(&self.traces_in_flight),
            metric_points: load(&self.metric_points),
            log_records: load(&self.log_records),
            forwarded: load(&self.forwarded),
            forward_dropped: load(&self.forward_dropped),
            turns_not_stored: load(&self.turns_not_stored),
            turns_incomplete: load(&self.turns_incomplete),
        };
        exposition::render(
            Scrape {
                requests: self.requests.clone(),
                live: LiveGauges::of(slots),
                spans: self.spans.clone(),
                sessions: self.sessions.clone(),
                own,
            },
            openmetrics,
        )
    }
}

#[cfg(test)]
mod tests;
