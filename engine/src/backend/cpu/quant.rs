//! Activations quantized to 16-bit blocks of 32, the form the integer dot kernels consume.
//!
//! Why 16 bits: with 8-bit activations (llama.cpp's choice) the default model's logits drift
//! 0.5–0.9 from a float32 reference, enough to flip the greedy token wherever the top two are
//! close. 16-bit codes with a scale per 32 values keep the drift below 0.02 (see
//! `tests/reference_smollm2.rs`) at a modest cost: one 16-bit multiply-add covers a whole
//! 32-weight block.

/// Values per quantization block (shared by Q8_0, Q4_0 and Q4_1 weights).
pub const QK: usize = 32;

/// `rows` rows of `k` activations: per block of 32 a scale `d` and 32 signed 16-bit codes, and
/// the block's exact float sum `xs` (for the offset and minimum terms of Q4_0/Q4_1).
#[derive(Debug, Default, Clone)]
pub struct QActs {
    /// Row length (a multiple of 32).
    pub k: usize,
    /// Number of rows.
    pub rows: usize,
    /// Block scales, `rows * k / 32`.
    pub d: Vec<f32>,
    /// Block sums, `rows * k / 32`.
    pub xs: Vec<f32>,
    /// Codes, `rows * k`.
    pub q: Vec<i16>,
    /// `(d, xs)` of each block, interleaved: `rows * k / 32 * 2` (one 64-bit load per block).
    pub pairs: Vec<f32>,
}

/// One quantized row.
#[derive(Debug, Clone, Copy)]
pub struct QRow<'a> {
    /// Block scales.
    pub d: &'a [f32],
    /// Block sums.
    pub xs: &'a [f32],
    /// Codes.
    pub q: &'a [i16],
    /// `(d, xs)` per block, interleaved.
    pub pairs: &'a [f32],
}

/// Largest code magnitude.
const QMAX: f32 = 32767.0;

impl QActs {
    /// Quantizes `x` (`rows * k` values, row-major) into `self`, reusing its buffers.
    pub fn quantize(&mut self, x: &[f32], rows: usize, k: usize) {
        debug_assert_eq!(x.len(), rows * k);
        debug_assert_eq!(k % QK, 0);
        let nb = rows * k / QK;
        self.k = k;
        self.rows = rows;
        self.d.resize(nb, 0.0);
        self.xs.resize(nb, 0.0);
        self.q.resize(rows * k, 0);
        for (((xb, qb), d), xs) in x
            .chunks_exact(QK)
            .zip(self.q.chunks_exact_mut(QK))
            .zip(self.d.iter_mut())
            .zip(self.xs.iter_mut())
        {
            let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
            let scale = amax / QMAX;
            let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
            let mut sum = 0f32;
            for (q, v) in qb.iter_mut().zip(xb) {
                // |v * inv| <= 32767 by construction of `inv`.
                #[allow(clippy::cast_possible_truncation)]
                {
                    *q = (v * inv).round().clamp(-QMAX, QMAX) as i16;
                }
                sum += v;
            }
            *d = scale;
            *xs = sum;
        }
        self.pairs.resize(2 * nb, 0.0);
        for ((p, d), xs) in self.pairs.chunks_exact_mut(2).zip(&self.d).zip(&self.xs) {
            p[0] = *d;
            p[1] = *xs;
        }
    }

    /// Row `r`.
    pub fn row(&self, r: usize) -> QRow<'_> {
        let nb = self.k / QK;
        QRow {
            d: &self.d[r * nb..(r + 1) * nb],
            xs: &self.xs[r * nb..(r + 1) * nb],
            q: &self.q[r * self.k..(r + 1) * self.k],
            pairs: &self.pairs[2 * r * nb..2 * (r + 1) * nb],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantization_error_is_tiny() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 17) as f32 - 8.0) * 0.13)
            .collect();
        let mut q = QActs::default();
        q.quantize(&x, 2, 32);
        for r in 0..2 {
            let row = q.row(r);
            let mut sum = 0.0;
            for j in 0..32 {
                let back = row.d[0] * f32::from(row.q[j]);
                assert!((back - x[r * 32 + j]).abs() <= row.d[0] * 0.5 + 1e-7);
                sum += x[r * 32 + j];
            }
            assert!((row.xs[0] - sum).abs() < 1e-5);
        }
    }
}
