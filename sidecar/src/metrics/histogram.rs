//! The histogram every sidecar distribution is kept in: prometheus-client's, with the latest
//! observation of each bucket as its OpenMetrics exemplar (`trace_id`).

use std::time::{Duration, UNIX_EPOCH};

use prometheus_client::metrics::exemplar::HistogramWithExemplars;

use crate::base::vocab::{TraceId, hex};

/// The exemplar's label set: the observation's trace id (hex).
pub type ExemplarLabels = Vec<(&'static str, String)>;

/// A histogram whose buckets each show the trace of their latest observation.
pub type TraceHistogram = HistogramWithExemplars<ExemplarLabels>;

/// The exemplar label naming an observation's trace.
const TRACE_ID: &str = "trace_id";

/// An empty histogram over the upper bounds `bounds` (ascending), plus `+Inf`.
pub fn new(bounds: &[f64]) -> TraceHistogram {
    HistogramWithExemplars::new(bounds.iter().copied())
}

/// Adds one observation at `ts_ns` (Unix ns); `trace_id` becomes its bucket's exemplar. A
/// non-finite value is not observed: it would make the sum meaningless.
pub fn observe(h: &TraceHistogram, v: f64, trace_id: Option<&TraceId>, ts_ns: u64) {
    if !v.is_finite() {
        return;
    }
    let ts = UNIX_EPOCH + Duration::from_nanos(ts_ns);
    h.observe(v, trace_id.map(|t| vec![(TRACE_ID, hex(t))]), Some(ts));
}
