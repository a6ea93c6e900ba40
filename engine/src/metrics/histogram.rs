//! A histogram with fixed bucket boundaries, observed and read without a lock.

use std::sync::atomic::{AtomicU64, Ordering};

/// Fixed-bucket histogram of atomics: any thread may observe, any thread may read.
///
/// A reader may see an observation's bucket before its sum (the two are separate atomics);
/// the count it reports is always the sum of the buckets it read, so `_count` equals the
/// `+Inf` bucket.
#[derive(Debug)]
pub struct AtomicHistogram {
    bounds: &'static [f64],
    /// One count per bound, then the `+Inf` bucket (not cumulative).
    counts: Box<[AtomicU64]>,
    /// The sum of every observation, as `f64` bits.
    sum: AtomicU64,
}

/// What an [`AtomicHistogram`] held when it was read.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    /// `(upper bound, observations in the bucket)`, not cumulative; the last bound is `+Inf`.
    pub buckets: Vec<(f64, u64)>,
    /// The sum of every observation.
    pub sum: f64,
    /// How many observations in all (the `_count` series).
    pub count: u64,
}

impl AtomicHistogram {
    /// An empty histogram over `bounds` (ascending upper bounds, `+Inf` implied).
    pub fn new(bounds: &'static [f64]) -> Self {
        debug_assert!(bounds.windows(2).all(|w| w[0] < w[1]), "ascending bounds");
        Self {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0f64.to_bits()),
        }
    }

    /// Counts one observation of `v` (in the first bucket whose bound is at least `v`).
    pub fn observe(&self, v: f64) {
        let i = self.bounds.partition_point(|b| *b < v);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        let _ = self
            .sum
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + v).to_bits())
            });
    }

    /// The buckets, sum and count now.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let buckets: Vec<(f64, u64)> = self
            .bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .zip(self.counts.iter().map(|c| c.load(Ordering::Relaxed)))
            .collect();
        HistogramSnapshot {
            count: buckets.iter().map(|(_, n)| n).sum(),
            buckets,
            sum: f64::from_bits(self.sum.load(Ordering::Relaxed)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_observation_lands_in_the_first_bucket_that_holds_it() {
        let h = AtomicHistogram::new(&[1.0, 2.0]);
        for v in [0.5, 1.0, 1.5, 2.0, 7.0] {
            h.observe(v);
        }
        let s = h.snapshot();
        assert_eq!(s.buckets, vec![(1.0, 2), (2.0, 2), (f64::INFINITY, 1)]);
        assert_eq!(s.count, 5);
        assert!((s.sum - 12.0).abs() < 1e-12);
    }
}
