//! `traces_span_metrics_*`: calls and duration by service, span name, kind and status over
//! every span received (all producers), added once per export request from its
//! [`SpanBatch`]. The label sets are capped; spans beyond the cap go to an `_overflow` series.

use std::collections::HashMap;

use slotlight_otel::metric::buckets;

use super::OVERFLOW;
use super::histogram::{self, TraceHistogram};
use super::spanmetrics::SpanBatch;

/// Labels of one stored series: service, span name, kind, status code.
pub type SeriesKey = (Box<str>, Box<str>, i32, i32);

/// One series' totals.
#[derive(Debug)]
pub struct SpanSeriesTotals {
    /// Spans counted (`traces_span_metrics_calls_total`).
    pub calls: u64,
    /// Their durations in ms (`traces_span_metrics_duration_milliseconds`).
    pub duration: TraceHistogram,
}

/// Every spanmetrics series so far.
#[derive(Debug)]
pub struct SpanTotals {
    series: HashMap<SeriesKey, SpanSeriesTotals>,
    max_series: usize,
}

impl SpanTotals {
    /// No series yet; at most `max_series` label sets (at least one).
    pub fn new(max_series: usize) -> Self {
        SpanTotals {
            series: HashMap::new(),
            max_series: max_series.max(1),
        }
    }

    /// Adds one export request's spans.
    pub fn merge(&mut self, batch: SpanBatch<'_>) {
        let bounds = buckets::SPAN_DURATION_MS;
        for ((service, name, kind, status), s) in batch.series {
            let key: SeriesKey = (service.into(), name.into(), kind, status);
            let key = if self.series.len() >= self.max_series && !self.series.contains_key(&key) {
                (OVERFLOW.into(), OVERFLOW.into(), kind, status)
            } else {
                key
            };
            let totals = self.series.entry(key).or_insert_with(|| SpanSeriesTotals {
                calls: 0,
                duration: histogram::new(bounds),
            });
            // Each bucket keeps the latest span's trace as its exemplar: only the last span of
            // each bucket in this request needs to carry one.
            let bucket = |ms: f64| bounds.iter().position(|b| ms <= *b).unwrap_or(bounds.len());
            let mut last_in_bucket = vec![None; bounds.len() + 1];
            for (i, o) in s.spans.iter().enumerate() {
                if o.trace_id.is_some() {
                    last_in_bucket[bucket(o.ms)] = Some(i);
                }
            }
            for (i, o) in s.spans.iter().enumerate() {
                let exemplar = o
                    .trace_id
                    .as_ref()
                    .filter(|_| last_in_bucket[bucket(o.ms)] == Some(i));
                histogram::observe(&totals.duration, o.ms, exemplar, o.end_ns);
            }
            totals.calls += s.spans.len() as u64;
        }
    }

    /// Every series, sorted by its labels.
    pub fn series(&self) -> Vec<(&SeriesKey, &SpanSeriesTotals)> {
        let mut all: Vec<_> = self.series.iter().collect();
        all.sort_by(|a, b| a.0.cmp(b.0));
        all
    }
}
