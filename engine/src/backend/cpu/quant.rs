//! Activations quantized to 8-bit blocks of 32, the form the integer dot kernels consume.

/// Values per quantization block (shared by Q8_0, Q4_0 and Q4_1).
pub const QK: usize = 32;

/// `rows` rows of `k` activations, each block of 32 stored as a scale `d`, the 32 signed
/// 8-bit codes, and `xs = d * Σ codes` (used by the offset and minimum terms of Q4_0/Q4_1).
#[derive(Debug, Default, Clone)]
pub struct QActs {
    /// Row length (a multiple of 32).
    pub k: usize,
    /// Number of rows.
    pub rows: usize,
    /// Block scales, `rows * k / 32`.
    pub d: Vec<f32>,
    /// Block sums times scale, `rows * k / 32`.
    pub xs: Vec<f32>,
    /// Codes, `rows * k`.
    pub q: Vec<i8>,
    /// Per pair of blocks, 16 lanes: `d` of the first block in lanes 0–7 and of the second in
    /// lanes 8–15 (the layout of a 512-bit integer dot over two blocks). `rows * k / 64 * 16`.
    pub dv: Vec<f32>,
    /// As `dv`, holding `xs / 8` (so that summing a block's 8 lanes gives `xs`).
    pub sv: Vec<f32>,
}

/// One quantized row.
#[derive(Debug, Clone, Copy)]
pub struct QRow<'a> {
    /// Block scales.
    pub d: &'a [f32],
    /// Block sums times scale.
    pub xs: &'a [f32],
    /// Codes.
    pub q: &'a [i8],
    /// Pairs of block scales, spread over 16 lanes (see [`QActs::dv`]).
    pub dv: &'a [f32],
    /// Pairs of block sums / 8, spread over 16 lanes (see [`QActs::sv`]).
    pub sv: &'a [f32],
}

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
            let scale = amax / 127.0;
            let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
            let mut sum = 0i32;
            for (q, v) in qb.iter_mut().zip(xb) {
                // |v * inv| <= 127 by construction of `inv`.
                #[allow(clippy::cast_possible_truncation)]
                let c = (v * inv).round() as i32;
                *q = c.clamp(-127, 127) as i8;
                sum += c;
            }
            *d = scale;
            #[allow(clippy::cast_precision_loss)]
            {
                *xs = scale * sum as f32;
            }
        }
        let nb_row = k / QK;
        let pairs = nb_row / 2;
        self.dv.resize(rows * pairs * 16, 0.0);
        self.sv.resize(rows * pairs * 16, 0.0);
        for r in 0..rows {
            for p in 0..pairs {
                for half in 0..2 {
                    let b = r * nb_row + 2 * p + half;
                    let o = (r * pairs + p) * 16 + half * 8;
                    self.dv[o..o + 8].fill(self.d[b]);
                    self.sv[o..o + 8].fill(self.xs[b] / 8.0);
                }
            }
        }
    }

    /// Row `r`.
    pub fn row(&self, r: usize) -> QRow<'_> {
        let nb = self.k / QK;
        let pv = nb / 2 * 16;
        QRow {
            d: &self.d[r * nb..(r + 1) * nb],
            xs: &self.xs[r * nb..(r + 1) * nb],
            q: &self.q[r * self.k..(r + 1) * self.k],
            dv: &self.dv[r * pv..(r + 1) * pv],
            sv: &self.sv[r * pv..(r + 1) * pv],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantization_error_is_small() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 17) as f32 - 8.0) * 0.13)
            .collect();
        let mut q = QActs::default();
        q.quantize(&x, 2, 32);
        for r in 0..2 {
            let row = q.row(r);
            for j in 0..32 {
                let back = row.d[0] * f32::from(row.q[j]);
                assert!((back - x[r * 32 + j]).abs() <= row.d[0] * 0.5 + 1e-6);
            }
            let sum: i32 = row.q.iter().map(|&c| i32::from(c)).sum();
            assert!((row.xs[0] - row.d[0] * sum as f32).abs() < 1e-5);
        }
    }
}
