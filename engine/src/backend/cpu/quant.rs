//! Activations quantized to 8 bits in blocks of 32, once per matmul input: the form the
//! integer kernels of [`super::gemm`] consume.
//!
//! Each block keeps a scale `d = max|x| / 127` and 32 signed codes in `-127..=127`, stored
//! twice over in the order the kernels read them (`[q0..16, q0..16, q16..32, q16..32]`, 64
//! bytes), so that one 32-byte load feeds two packed weight rows at once. Beside the codes each
//! block keeps `sq = d · Σq`, the block's sum as the codes see it, for the terms of Q4_0 (whose
//! codes carry +8) and Q4_1 (the minimum). Measured: the minimum times the exact float sum
//! instead is further from a float32 reference (the weights' effective codes `w − m` are all
//! positive, so their errors stop cancelling).
//!
//! Each block also keeps its integer code sums, negated ([`SUMS`] per block: `−Σq` over codes
//! 0..16, over 16..32, over all 32, and `−128·Σq`): the kernels seed their integer dot
//! products with them to remove a weight format's code offset exactly (`Σ(u − o)·q =
//! Σu·q − o·Σq`), so offset codes need no sign trick and no float correction; the last one is
//! the seed of signed values moved to unsigned bytes (+128), ready to broadcast.
//!
//! Accuracy: 8-bit activations are llama.cpp's choice; on the default model the logits sit
//! within about 0.5 of a float32 reference (see `tests/reference_smollm2.rs`).

use super::isa::Isa;
use super::pool::{ComputePool, share};

/// Values per quantization block (shared by Q8_0, Q4_0 and Q4_1 weights).
pub const QK: usize = 32;

/// Bytes of codes per block in the duplicated layout.
pub const BLOCK_CODES: usize = 2 * QK;

/// Integer sums kept per block (see the module comment).
pub const SUMS: usize = 4;

/// Largest code magnitude (so that `-q` never overflows and sign tricks stay exact).
const QMAX: f32 = 127.0;

/// Rows per parallel quantization task.
const ROWS_PER_TASK: usize = 8;

/// `rows` rows of `k` activations quantized per block of 32.
#[derive(Debug, Default, Clone)]
pub struct QActs {
    /// Row length (a multiple of 32).
    pub k: usize,
    /// Number of rows.
    pub rows: usize,
    /// Codes, `rows · k/32 · 64` bytes in the duplicated layout.
    pub q: Vec<i8>,
    /// Per block `[d, sq]`, `rows · k/32 · 2`.
    pub meta: Vec<f32>,
    /// Per block `[−Σq₀..₁₆, −Σq₁₆..₃₂, −Σq, −128·Σq]`, `rows · k/32 · SUMS`.
    pub sums: Vec<i32>,
}

/// One quantized row.
#[derive(Debug, Clone, Copy)]
pub struct QRow<'a> {
    /// Codes in the duplicated layout (64 bytes per block).
    pub q: &'a [i8],
    /// `[d, sq]` per block.
    pub meta: &'a [f32],
    /// `[−Σq₀..₁₆, −Σq₁₆..₃₂, −Σq, −128·Σq]` per block ([`SUMS`] each).
    pub sums: &'a [i32],
}

#[derive(Clone, Copy)]
struct Ptrs(*mut i8, *mut f32, *mut i32);

impl Ptrs {
    /// The pointers (a method, so closures capture the whole `Send` wrapper).
    fn get(self) -> (*mut i8, *mut f32, *mut i32) {
        (self.0, self.1, self.2)
    }
}
// SAFETY: each task writes the blocks of its own rows only.
unsafe impl Send for Ptrs {}
unsafe impl Sync for Ptrs {}

impl QActs {
    /// Quantizes `x` (`rows · k` values, row-major) into `self`, reusing its buffers; rows are
    /// spread over `pool` when there are many. Each row's codes depend only on that row.
    pub fn quantize(&mut self, pool: &ComputePool, isa: Isa, x: &[f32], rows: usize, k: usize) {
        assert_eq!(
            x.len(),
            rows * k,
            "quantize: {} values for {rows}×{k}",
            x.len()
        );
        assert_eq!(
            k % QK,
            0,
            "quantize: row length {k} is not a multiple of {QK}"
        );
        let nb = k / QK;
        self.k = k;
        self.rows = rows;
        self.q.resize(rows * nb * BLOCK_CODES, 0);
        self.meta.resize(rows * nb * 2, 0.0);
        self.sums.resize(rows * nb * SUMS, 0);
        let p = Ptrs(
            self.q.as_mut_ptr(),
            self.meta.as_mut_ptr(),
            self.sums.as_mut_ptr(),
        );
        let tasks = rows.div_ceil(ROWS_PER_TASK);
        let run = |task: usize| {
            let (qp, mp, sp) = p.get();
            let (r0, r1) = share(rows, task, tasks);
            for r in r0..r1 {
                let xr = &x[r * k..(r + 1) * k];
                // SAFETY: row r's blocks are written by this task only; the buffers were sized
                // above for `rows` rows.
                let (q, meta, sums) = unsafe {
                    (
                        std::slice::from_raw_parts_mut(
                            qp.add(r * nb * BLOCK_CODES),
                            nb * BLOCK_CODES,
                        ),
                        std::slice::from_raw_parts_mut(mp.add(r * nb * 2), nb * 2),
                        std::slice::from_raw_parts_mut(sp.add(r * nb * SUMS), nb * SUMS),
                    )
                };
                quantize_row(isa, xr, q, meta);
                code_sums(q, sums);
            }
        };
        if rows * k >= 8192 {
            pool.run(tasks, &run);
        } else {
            for t in 0..tasks {
                run(t);
            }
        }
    }

    /// Row `r`.
    pub fn row(&self, r: usize) -> QRow<'_> {
        let nb = self.k / QK;
        QRow {
            q: &self.q[r * nb * BLOCK_CODES..(r + 1) * nb * BLOCK_CODES],
            meta: &self.meta[r * nb * 2..(r + 1) * nb * 2],
            sums: &self.sums[r * nb * SUMS..(r + 1) * nb * SUMS],
        }
    }
}

/// Each block's negated code sums (see [`QActs::sums`]) from its codes.
fn code_sums(q: &[i8], sums: &mut [i32]) {
    for (qb, s) in q.chunks_exact(BLOCK_CODES).zip(sums.chunks_exact_mut(SUMS)) {
        let half = |at: usize| -> i32 { qb[at..at + 16].iter().map(|&c| i32::from(c)).sum() };
        let (lo, hi) = (half(0), half(32));
        s.copy_from_slice(&[-lo, -hi, -(lo + hi), -128 * (lo + hi)]);
    }
}

/// Quantizes one row.
fn quantize_row(isa: Isa, x: &[f32], q: &mut [i8], meta: &mut [f32]) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa.avx2()` holds only after detecting AVX2, FMA and F16C.
        _ if isa.avx2() => unsafe { avx2::quantize_row(x, q, meta) },
        _ => quantize_row_scalar(x, q, meta),
    }
}

/// The portable quantizer (the reference the SIMD one is tested against).
fn quantize_row_scalar(x: &[f32], q: &mut [i8], meta: &mut [f32]) {
    for ((xb, qb), m) in x
        .chunks_exact(QK)
        .zip(q.chunks_exact_mut(BLOCK_CODES))
        .zip(meta.chunks_exact_mut(2))
    {
        let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / QMAX;
        let inv = if d > 0.0 { QMAX / amax } else { 0.0 };
        let mut isum = 0i32;
        for (j, v) in xb.iter().enumerate() {
            // |v · inv| ≤ 127 by construction of `inv`.
            #[allow(clippy::cast_possible_truncation)]
            let c = (v * inv).round_ties_even().clamp(-QMAX, QMAX) as i8;
            let (half, at) = (j / 16, j % 16);
            qb[half * 32 + at] = c;
            qb[half * 32 + 16 + at] = c;
            isum += i32::from(c);
        }
        #[allow(clippy::cast_precision_loss)]
        let sq = d * isum as f32;
        m.copy_from_slice(&[d, sq]);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{BLOCK_CODES, QK, QMAX};
    use std::arch::x86_64::*;

    /// Like [`super::quantize_row_scalar`], eight lanes at a time. The block sums are added
    /// in a fixed order, so a row's result depends only on the row.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn quantize_row(x: &[f32], q: &mut [i8], meta: &mut [f32]) {
        let nb = x.len() / QK;
        let sign = _mm256_set1_ps(-0.0);
        for b in 0..nb {
            // SAFETY: block b of x (32 floats), q (64 bytes) and meta (2 floats) exist.
            unsafe {
                let p = x.as_ptr().add(b * QK);
                let v = [
                    _mm256_loadu_ps(p),
                    _mm256_loadu_ps(p.add(8)),
                    _mm256_loadu_ps(p.add(16)),
                    _mm256_loadu_ps(p.add(24)),
                ];
                let a = _mm256_max_ps(
                    _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                    _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])),
                );
                let amax = hmax(a);
                let d = amax / QMAX;
                let inv = _mm256_set1_ps(if d > 0.0 { QMAX / amax } else { 0.0 });
                let i: [__m256i; 4] = std::array::from_fn(|j| {
                    _mm256_cvtps_epi32(_mm256_round_ps::<
                        { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
                    >(_mm256_mul_ps(v[j], inv)))
                });
                // i32 → i16 → i8 (packs interleave 128-bit lanes; the permute restores order).
                let w01 = _mm256_packs_epi32(i[0], i[1]);
                let w23 = _mm256_packs_epi32(i[2], i[3]);
                let bytes = _mm256_permutevar8x32_epi32(
                    _mm256_packs_epi16(w01, w23),
                    _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7),
                );
                let lo = _mm256_castsi256_si128(bytes);
                let hi = _mm256_extracti128_si256::<1>(bytes);
                let dst = q.as_mut_ptr().add(b * BLOCK_CODES);
                _mm256_storeu_si256(dst.cast(), _mm256_set_m128i(lo, lo));
                _mm256_storeu_si256(dst.add(32).cast(), _mm256_set_m128i(hi, hi));
                // Σq: bytes widened and summed through a multiply-add with ones.
                let ones = _mm256_set1_epi8(1);
                let s16 = _mm256_maddubs_epi16(ones, bytes);
                let s32 = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
                let isum = hsum_i32(s32);
                #[allow(clippy::cast_precision_loss)]
                let sq = d * isum as f32;
                *meta.get_unchecked_mut(2 * b) = d;
                *meta.get_unchecked_mut(2 * b + 1) = sq;
            }
        }
    }

    #[target_feature(enable = "avx2")]
    fn hmax(v: __m256) -> f32 {
        let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let m = _mm_max_ss(m, _mm_movehdup_ps(m));
        _mm_cvtss_f32(m)
    }

    #[target_feature(enable = "avx2")]
    fn hsum_i32(v: __m256i) -> i32 {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        _mm_cvtsi128_si32(s)
    }
}

#[cfg(test)]
// Test data: small counts and indices, exact in every cast.
#[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
mod tests {
    use super::*;
    use crate::model::testing::FixtureRng;

    fn codes(row: &QRow<'_>, b: usize) -> Vec<i8> {
        let q = &row.q[b * BLOCK_CODES..(b + 1) * BLOCK_CODES];
        // The duplicated layout: each half twice.
        assert_eq!(q[..16], q[16..32]);
        assert_eq!(q[32..48], q[48..64]);
        q[..16].iter().chain(&q[32..48]).copied().collect()
    }

    #[test]
    fn codes_round_trip_within_half_a_step_on_every_isa() {
        let mut rng = FixtureRng::new(5);
        let (rows, k) = (3, 96);
        let mut x = rng.vec(rows * k, 3.0);
        x[40..72].fill(0.0); // an all-zero block
        let pool = ComputePool::new(1);
        for isa in Isa::available() {
            let mut qa = QActs::default();
            qa.quantize(&pool, isa, &x, rows, k);
            for r in 0..rows {
                let row = qa.row(r);
                for b in 0..k / QK {
                    let c = codes(&row, b);
                    let m = &row.meta[b * 2..b * 2 + 2];
                    let xb = &x[r * k + b * QK..r * k + (b + 1) * QK];
                    let mut isum = 0;
                    for (j, v) in xb.iter().enumerate() {
                        let back = m[0] * f32::from(c[j]);
                        assert!(
                            (back - v).abs() <= m[0] * 0.5 + 1e-6,
                            "{isa:?} r{r} b{b} j{j}: {back} vs {v}"
                        );
                        isum += i32::from(c[j]);
                    }
                    assert!((m[1] - m[0] * isum as f32).abs() <= 1e-6 * m[1].abs().max(1.0));
                    let lo: i32 = c[..16].iter().map(|&v| i32::from(v)).sum();
                    let s = &row.sums[b * SUMS..(b + 1) * SUMS];
                    assert_eq!(
                        s,
                        [-lo, lo - isum, -isum, -128 * isum],
                        "{isa:?} r{r} b{b} sums"
                    );
                }
            }
        }
    }

    #[test]
    fn simd_and_scalar_codes_agree() {
        let mut rng = FixtureRng::new(9);
        let (rows, k) = (4, 576);
        let x = rng.vec(rows * k, 1.0);
        let pool = ComputePool::new(2);
        let mut want = QActs::default();
        want.quantize(&pool, Isa::Scalar, &x, rows, k);
        for isa in Isa::available() {
            let mut got = QActs::default();
            got.quantize(&pool, isa, &x, rows, k);
            assert_eq!(got.q, want.q, "{isa:?}");
        }
    }
}
