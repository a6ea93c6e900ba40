//! Element-wise and row-wise operations of the forward pass.

use super::isa::Isa;

/// RMSNorm of each `n`-wide row of `x` into `out`, scaled by `w`.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = w.len();
    for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let ss = super::matmul::dot_f32(xr, xr);
        #[allow(clippy::cast_precision_loss)]
        let scale = 1.0 / (ss / n as f32 + eps).sqrt();
        for ((o, v), g) in or.iter_mut().zip(xr).zip(w) {
            *o = v * scale * g;
        }
    }
}

/// RMSNorm of each `w.len()`-wide row of `x` in place (also per head: q/k norms).
pub fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let n = w.len();
    for xr in x.chunks_exact_mut(n) {
        let ss = super::matmul::dot_f32(xr, xr);
        #[allow(clippy::cast_precision_loss)]
        let scale = 1.0 / (ss / n as f32 + eps).sqrt();
        for (v, g) in xr.iter_mut().zip(w) {
            *v = *v * scale * g;
        }
    }
}

/// `x = cap · tanh(x / cap)` (Gemma 2's logit soft-capping).
pub fn softcap(x: &mut [f32], cap: f32) {
    for v in x.iter_mut() {
        *v = cap * (*v / cap).tanh();
    }
}

/// `gate = gelu(gate) * up` with the tanh approximation of GELU (ggml's `gelu`, PyTorch's
/// `gelu(approximate="tanh")`): `0.5·x·(1 + tanh(z))` with `z = √(2/π)·(x + 0.044715·x³)`,
/// computed as the equal `x·σ(2z) = x / (1 + e^(−2z))`, eight lanes at a time with the vector
/// `exp` where the ISA has it.
pub fn gelu_tanh_mul(isa: Isa, gate: &mut [f32], up: &[f32]) {
    let n = gate.len().min(up.len());
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: `isa.avx2()` implies AVX2 and FMA.
        done = unsafe { gelu_tanh_mul_avx2(&mut gate[..n], &up[..n]) };
    }
    let _ = isa;
    for (g, u) in gate[done..n].iter_mut().zip(&up[done..n]) {
        let x = *g;
        let z = GELU_C * x * (1.0 + GELU_K * x * x);
        *g = x / (1.0 + (-2.0 * z).exp()) * u;
    }
}

/// `√(2/π)` of [`gelu_tanh_mul`].
const GELU_C: f32 = 0.797_884_6;

/// The cubic term's factor of [`gelu_tanh_mul`].
const GELU_K: f32 = 0.044_715;

/// The whole groups of eight of [`gelu_tanh_mul`]; returns how many values it did.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn gelu_tanh_mul_avx2(gate: &mut [f32], up: &[f32]) -> usize {
    use std::arch::x86_64::*;
    let n = gate.len() / 8 * 8;
    for (g, u) in gate[..n].chunks_exact_mut(8).zip(up.chunks_exact(8)) {
        // SAFETY: eight floats each.
        unsafe {
            let x = _mm256_loadu_ps(g.as_ptr());
            let x2 = _mm256_mul_ps(x, x);
            let inner = _mm256_fmadd_ps(_mm256_set1_ps(GELU_K), x2, _mm256_set1_ps(1.0));
            let z = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(GELU_C), x), inner);
            let e = super::simd::exp(_mm256_mul_ps(_mm256_set1_ps(-2.0), z));
            let s = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e));
            _mm256_storeu_ps(
                g.as_mut_ptr(),
                _mm256_mul_ps(s, _mm256_loadu_ps(u.as_ptr())),
            );
        }
    }
    n
}

/// Adds `bias` to each row of `x`.
pub fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        for (v, b) in row.iter_mut().zip(bias) {
            *v += b;
        }
    }
}

/// `x *= k`.
pub fn scale(x: &mut [f32], k: f32) {
    for v in x.iter_mut() {
        *v *= k;
    }
}

/// `x += y`.
pub fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// `gate = silu(gate) * up`.
pub fn silu_mul(isa: Isa, gate: &mut [f32], up: &[f32]) {
    let n = gate.len().min(up.len());
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: `isa.avx2()` implies AVX2 and FMA.
        done = unsafe { silu_mul_avx2(&mut gate[..n], &up[..n]) };
    }
    let _ = isa;
    for (g, u) in gate[done..n].iter_mut().zip(&up[done..n]) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// The whole groups of eight of [`silu_mul`]; returns how many values it did.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn silu_mul_avx2(gate: &mut [f32], up: &[f32]) -> usize {
    use std::arch::x86_64::*;
    let n = gate.len() / 8 * 8;
    for (g, u) in gate[..n].chunks_exact_mut(8).zip(up.chunks_exact(8)) {
        // SAFETY: eight floats each.
        unsafe {
            let x = _mm256_loadu_ps(g.as_ptr());
            let e = super::simd::exp(_mm256_sub_ps(_mm256_setzero_ps(), x));
            let s = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e));
            _mm256_storeu_ps(
                g.as_mut_ptr(),
                _mm256_mul_ps(s, _mm256_loadu_ps(u.as_ptr())),
            );
        }
    }
    n
}

/// Cosines and sines for each (token, pair): `table[t * half + i] = (cos, sin)` of
/// `pos[t] * inv_freq[i]`.
pub fn rope_table(positions: &[usize], inv_freq: &[f32], out: &mut Vec<(f32, f32)>) {
    out.clear();
    for &p in positions {
        for &f in inv_freq {
            #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
            let theta = (p as f64 * f64::from(f)) as f32;
            let (s, c) = theta.sin_cos();
            out.push((c, s));
        }
    }
}

/// Rotates each head of each row of `x` (`rows × heads × head_dim`) in place.
pub fn rope(x: &mut [f32], heads: usize, head_dim: usize, table: &[(f32, f32)], neox: bool) {
    let half = head_dim / 2;
    for (t, row) in x.chunks_exact_mut(heads * head_dim).enumerate() {
        let cs = &table[t * half..(t + 1) * half];
        for head in row.chunks_exact_mut(head_dim) {
            for (i, &(c, s)) in cs.iter().enumerate() {
                let (a, b) = if neox {
                    (i, i + half)
                } else {
                    (2 * i, 2 * i + 1)
                };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * c - x1 * s;
                head[b] = x0 * s + x1 * c;
            }
        }
    }
}

/// In-place softmax.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_conventions_rotate_the_right_pairs() {
        let table = vec![(0.0f32, 1.0f32), (1.0, 0.0)]; // pair 0 by 90°, pair 1 unchanged
        let mut x = vec![1.0, 2.0, 3.0, 4.0];
        rope(&mut x, 1, 4, &table, false);
        assert_eq!(x, vec![-2.0, 1.0, 3.0, 4.0]);
        let mut y = vec![1.0, 2.0, 3.0, 4.0];
        rope(&mut y, 1, 4, &table, true);
        assert_eq!(y, vec![-3.0, 2.0, 1.0, 4.0]);
    }

    #[test]
    fn gelu_tanh_matches_known_values_on_every_isa() {
        // PyTorch: gelu(x, approximate="tanh") at 1.0, -1.0, 3.0, and far out on both sides
        // (where e^(−2z) saturates).
        let want = [0.841_192f32, -0.158_808, 2.0 * 2.996_363, 0.0, 50.0];
        for isa in Isa::available() {
            // Eleven values: one SIMD group and a scalar tail.
            let mut g = vec![
                1.0f32, -1.0, 3.0, -50.0, 50.0, 1.0, -1.0, 3.0, -50.0, 50.0, 1.0,
            ];
            let up = [1.0, 1.0, 2.0, 1.0, 1.0, 1.0, 1.0, 2.0, 1.0, 1.0, 1.0];
            gelu_tanh_mul(isa, &mut g, &up);
            for (i, got) in g.iter().enumerate() {
                let w = want[i % 5];
                assert!((got - w).abs() < 1e-5, "{isa:?} [{i}]: {got} vs {w}");
            }
        }
    }

    #[test]
    fn rms_norm_in_place_per_head() {
        let mut x = vec![2.0, 2.0, 3.0, -3.0];
        rms_norm_in_place(&mut x, &[1.0, 0.5], 0.0);
        assert_eq!(x, vec![1.0, 0.5, 1.0, -0.5]);
    }

    #[test]
    fn rms_norm_unit_rows() {
        let mut out = vec![0.0; 4];
        rms_norm(&[2.0, 2.0, 2.0, 2.0], &[1.0, 1.0, 1.0, 0.5], 0.0, &mut out);
        assert_eq!(out, vec![1.0, 1.0, 1.0, 0.5]);
    }
}
