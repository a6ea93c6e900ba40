//! A fixed-bucket histogram with one exemplar per bucket. A leaf of the crate: the span
//! decoder (per-request spanmetrics) and the metrics (per-turn histograms) both use it, and it
//! imports neither.

use crate::vocab::TraceId;

/// The latest observation in a bucket, shown as an OpenMetrics exemplar.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Exemplar {
    /// The trace of the observation.
    pub trace_id: TraceId,
    /// The observed value.
    pub value: f64,
    /// When it was observed (Unix ns).
    pub ts_ns: u64,
}

/// A fixed-bucket histogram with one exemplar per bucket.
#[derive(Debug, Clone)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    exemplars: Vec<Option<Exemplar>>,
    sum: f64,
    count: u64,
}

impl Histogram {
    /// An empty histogram over the upper bounds `bounds` (ascending), plus `+Inf`.
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len() + 1],
            exemplars: vec![None; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    /// Adds one observation (a non-finite value is ignored); `trace_id` becomes its bucket's
    /// exemplar.
    pub fn observe(&mut self, v: f64, trace_id: Option<TraceId>, ts_ns: u64) {
        if !v.is_finite() {
            return;
        }
        let i = self
            .bounds
            .iter()
            .position(|b| v <= *b)
            .unwrap_or(self.bounds.len());
        self.counts[i] += 1;
        self.sum += v;
        self.count += 1;
        if let Some(trace_id) = trace_id {
            self.exemplars[i] = Some(Exemplar {
                trace_id,
                value: v,
                ts_ns,
            });
        }
    }

    /// Adds another histogram over the same bounds.
    pub fn merge(&mut self, o: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            *a += b;
        }
        for (a, b) in self.exemplars.iter_mut().zip(&o.exemplars) {
            if b.is_some() {
                *a = *b;
            }
        }
        self.sum += o.sum;
        self.count += o.count;
    }

    /// The buckets in order: upper bound (`None` for `+Inf`), cumulative count, exemplar.
    pub fn buckets(&self) -> impl Iterator<Item = (Option<f64>, u64, Option<&Exemplar>)> {
        let mut cum = 0;
        self.counts.iter().enumerate().map(move |(i, c)| {
            cum += c;
            (self.bounds.get(i).copied(), cum, self.exemplars[i].as_ref())
        })
    }

    /// Sum of the observations.
    pub fn sum(&self) -> f64 {
        self.sum
    }

    /// Number of observations.
    pub fn count(&self) -> u64 {
        self.count
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_and_non_finite_values_are_ignored() {
        let mut h = Histogram::new(&[1.0, 2.0]);
        h.observe(0.5, None, 0);
        h.observe(1.5, Some([1; 16]), 7);
        h.observe(9.0, None, 0);
        h.observe(f64::NAN, None, 0);
        let b: Vec<_> = h
            .buckets()
            .map(|(le, n, ex)| (le, n, ex.is_some()))
            .collect();
        assert_eq!(
            b,
            [
                (Some(1.0), 1, false),
                (Some(2.0), 2, true),
                (None, 3, false)
            ]
        );
        assert_eq!((h.count(), h.sum()), (3, 11.0));
    }
}
