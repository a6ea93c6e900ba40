//! One export request's share of the spanmetrics (`traces_span_metrics_*`): what the span
//! decoder collects per span and [`super::Metrics::merge_spans`] adds to the totals once per
//! request, so the decoder never takes a lock per span.
//!
//! A leaf: the receivers' decoder fills a [`SpanBatch`], the metrics read it, and it imports
//! neither.

use std::collections::HashMap;

use crate::base::vocab::TraceId;

/// Labels of one spanmetrics series: service, span name, kind, status code.
pub type SpanKey<'a> = (&'a str, &'a str, i32, i32);

/// One span's duration, as the totals will observe it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpanObservation {
    /// The span's duration in milliseconds.
    pub ms: f64,
    /// When the span ended (Unix ns): the exemplar's timestamp.
    pub end_ns: u64,
    /// The span's trace, for the exemplar; `None` when the span had no valid trace id.
    pub trace_id: Option<TraceId>,
}

/// One spanmetrics series being collected: its spans, in arrival order.
#[derive(Debug, Clone, Default)]
pub struct SpanSeries {
    /// The spans of this series in the export request.
    pub spans: Vec<SpanObservation>,
}

/// One export request's contribution to the spanmetrics series, keyed by borrowed labels.
/// A request has a handful of distinct label sets, so they are found by a short scan (the
/// previous span's first), with a hash index only for requests that carry many.
#[derive(Debug, Default)]
pub struct SpanBatch<'a> {
    /// The series, in first-seen order.
    pub series: Vec<(SpanKey<'a>, SpanSeries)>,
    index: HashMap<SpanKey<'a>, usize>,
    last: usize,
}

impl<'a> SpanBatch<'a> {
    const SCAN: usize = 16;

    /// Adds one span of series `key` that ran from `start_ns` to `end_ns`.
    pub fn observe(&mut self, key: SpanKey<'a>, start_ns: u64, end_ns: u64, trace_id: &[u8]) {
        #[allow(clippy::cast_precision_loss)] // span durations fit f64
        let ms = end_ns.saturating_sub(start_ns) as f64 / 1e6;
        let i = if self.series.get(self.last).is_some_and(|(k, _)| *k == key) {
            self.last
        } else if self.series.len() <= Self::SCAN {
            match self.series.iter().position(|(k, _)| *k == key) {
                Some(i) => i,
                None => self.push(key),
            }
        } else {
            match self.index.get(&key) {
                Some(&i) => i,
                None => self.push(key),
            }
        };
        self.last = i;
        self.series[i].1.spans.push(SpanObservation {
            ms,
            end_ns,
            trace_id: trace_id.try_into().ok(),
        });
    }

    /// True when no span was observed.
    pub fn is_empty(&self) -> bool {
        self.series.is_empty()
    }

    fn push(&mut self, key: SpanKey<'a>) -> usize {
        let i = self.series.len();
        self.series.push((key, SpanSeries::default()));
        if self.series.len() > Self::SCAN {
            if self.index.is_empty() {
                self.index = self
                    .series
                    .iter()
                    .enumerate()
                    .map(|(i, (k, _))| (*k, i))
                    .collect();
            } else {
                self.index.insert(key, i);
            }
        }
        i
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_of_one_series_gather_whatever_their_order() {
        let mut b = SpanBatch::default();
        // More label sets than the scan covers, so the hash index is used too.
        for round in 0..2u64 {
            for i in 0..i32::try_from(SpanBatch::SCAN + 4).expect("small") {
                b.observe(("svc", "s", i, 0), 0, (round + 1) * 1_000_000, &[7; 16]);
            }
        }
        assert_eq!(b.series.len(), SpanBatch::SCAN + 4);
        for (k, s) in &b.series {
            assert_eq!(s.spans.len(), 2, "{k:?}");
            assert_eq!(s.spans[1].ms, 2.0);
            assert_eq!(s.spans[0].trace_id, Some([7; 16]));
        }
        b.observe(("svc", "t", 0, 0), 5, 1, &[1, 2]);
        let (_, last) = b.series.last().expect("a series");
        assert_eq!(last.spans[0].ms, 0.0, "an end before the start is 0 ms");
        assert_eq!(
            last.spans[0].trace_id, None,
            "a short trace id has no exemplar"
        );
    }
}
