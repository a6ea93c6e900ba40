//! Integer dot products of one quantized weight row (Q4_0, Q4_1 or Q8_0 blocks, read in place
//! from the model file) with up to four quantized activation rows.
//!
//! Every kernel computes each output with the same sequence of operations whatever the number
//! of activation rows it is given, so a token's result does not depend on which other tokens
//! share its batch (batch invariance).
//!
//! For block `b` with weight scale `dw`, activation scale `dx` and codes `u` (weights) and `q`
//! (activations), the dot is `Σ_b dw·dx·Σ u·q + Σ_b cw·xs`, where `xs = dx·Σ q` and `cw` is the
//! weight format's correction: the minimum `m` for Q4_1, `-8·dw` for Q4_0 (its codes are
//! stored with an offset of 8), and for Q8_0 `-128·dw` on AVX-512 (codes made unsigned by
//! flipping the sign bit) or 0 elsewhere.

use super::isa::Isa;
use super::quant::{QK, QRow};
use crate::model::weights::DType;
use half::f16;

/// Most tokens one kernel call handles.
pub const MAX_TOKENS: usize = 4;
/// Floats of scratch space a call needs for a row of `k` values.
pub fn scratch_len(k: usize) -> usize {
    MAX_TOKENS * k.div_ceil(QK)
}

/// The quantized formats with integer kernels.
pub fn has_int_kernel(dtype: DType) -> bool {
    matches!(dtype, DType::Q4_0 | DType::Q4_1 | DType::Q8_0)
}

/// `out[t] = w · x[t]` for each of `xs` (at most [`MAX_TOKENS`]); `scratch` holds at least
/// [`scratch_len`] floats.
pub fn dot_row(
    isa: Isa,
    dtype: DType,
    w: &[u8],
    xs: &[QRow<'_>],
    out: &mut [f32],
    scratch: &mut [f32],
) {
    assert!(xs.len() <= MAX_TOKENS && xs.len() == out.len());
    let nb = xs.first().map_or(0, |x| x.d.len());
    assert!(
        scratch.len() >= MAX_TOKENS * nb,
        "dot_row scratch too small"
    );
    assert!(w.len() >= nb * dtype.block_bytes() && xs.iter().all(|x| x.q.len() >= nb * QK));
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx512Vnni` is only ever returned after detecting these CPU features.
        Isa::Avx512Vnni => unsafe { avx512::dot(dtype, w, xs, out, scratch) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, for AVX2, FMA and F16C.
        Isa::Avx2 => unsafe { avx2::dot(dtype, w, xs, out) },
        _ => scalar::dot(dtype, w, xs, out),
    }
}

fn f16_at(w: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([w[i], w[i + 1]]).to_f32()
}

mod scalar {
    use super::*;

    pub fn dot(dtype: DType, w: &[u8], xs: &[QRow<'_>], out: &mut [f32]) {
        let bb = dtype.block_bytes();
        for (x, o) in xs.iter().zip(out.iter_mut()) {
            let mut acc = 0f32;
            for (b, blk) in w.chunks_exact(bb).enumerate() {
                let q = &x.q[b * QK..(b + 1) * QK];
                let dw = f16_at(blk, 0);
                #[allow(clippy::cast_precision_loss)]
                let term = match dtype {
                    DType::Q8_0 => {
                        let s: i32 = (0..QK)
                            .map(|j| i32::from(blk[2 + j].cast_signed()) * i32::from(q[j]))
                            .sum();
                        dw * x.d[b] * s as f32
                    }
                    DType::Q4_0 => {
                        let s: i32 = (0..16)
                            .map(|j| {
                                (i32::from(blk[2 + j] & 0xF) - 8) * i32::from(q[j])
                                    + (i32::from(blk[2 + j] >> 4) - 8) * i32::from(q[j + 16])
                            })
                            .sum();
                        dw * x.d[b] * s as f32
                    }
                    DType::Q4_1 => {
                        let s: i32 = (0..16)
                            .map(|j| {
                                i32::from(blk[4 + j] & 0xF) * i32::from(q[j])
                                    + i32::from(blk[4 + j] >> 4) * i32::from(q[j + 16])
                            })
                            .sum();
                        dw * x.d[b] * s as f32 + f16_at(blk, 2) * x.xs[b]
                    }
                    _ => unreachable!("no integer kernel for {}", dtype.name()),
                };
                acc += term;
            }
            *o = acc;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::*;
    use std::arch::x86_64::*;

    /// How far ahead of the current block weights are prefetched, in bytes (rows are
    /// contiguous, so this runs into the next rows). Measured on the default model.
    const PREFETCH: usize = 1024;

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn h2f(p: *const u8) -> f32 {
        // SAFETY: the caller passes a pointer to two readable bytes.
        let bits = unsafe { std::ptr::read_unaligned(p.cast::<u16>()) };
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn rd32(p: *const u8) -> i32 {
        // SAFETY: the caller passes a pointer to four readable bytes.
        unsafe { std::ptr::read_unaligned(p.cast::<i32>()) }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub unsafe fn dot(dtype: DType, w: &[u8], xs: &[QRow<'_>], out: &mut [f32], _sc: &mut [f32]) {
        // SAFETY (all cases): callers pass whole blocks and matching activation rows.
        unsafe {
            match (dtype, xs.len()) {
                (DType::Q4_0, 1) => nib::<1, false>(w, xs, out),
                (DType::Q4_0, 2) => nib::<2, false>(w, xs, out),
                (DType::Q4_0, 3) => nib::<3, false>(w, xs, out),
                (DType::Q4_0, _) => nib::<4, false>(w, xs, out),
                (DType::Q4_1, 1) => nib::<1, true>(w, xs, out),
                (DType::Q4_1, 2) => nib::<2, true>(w, xs, out),
                (DType::Q4_1, 3) => nib::<3, true>(w, xs, out),
                (DType::Q4_1, _) => nib::<4, true>(w, xs, out),
                (DType::Q8_0, 1) => q8::<1>(w, xs, out),
                (DType::Q8_0, 2) => q8::<2>(w, xs, out),
                (DType::Q8_0, 3) => q8::<3>(w, xs, out),
                (DType::Q8_0, _) => q8::<4>(w, xs, out),
                _ => super::scalar::dot(dtype, w, xs, out),
            }
        }
    }

    /// Nibble formats (Q4_0, Q4_1): two blocks per 512-bit integer dot.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn nib<const NT: usize, const MIN: bool>(w: &[u8], xs: &[QRow<'_>], out: &mut [f32]) {
        let (bb, off) = if MIN { (20, 4) } else { (18, 2) };
        let nb = xs[0].d.len();
        let mask = _mm256_set1_epi8(0x0F);
        // Header lanes after conversion: Q4_1 [d0, m0, d1, m1]; Q4_0 [d0, d1].
        let (id, im) = if MIN {
            (
                _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0),
                _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1),
            )
        } else {
            let i = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
            (i, i)
        };
        let minus8 = _mm512_set1_ps(-8.0);
        let mut acc = [_mm512_setzero_ps(); NT];
        let wp = w.as_ptr();
        let mut b = 0;
        while b + 2 <= nb {
            // SAFETY: blocks b and b+1 exist; activation rows hold nb*32 codes and nb/2 pairs.
            unsafe {
                let p0 = wp.add(b * bb);
                let p1 = wp.add((b + 1) * bb);
                _mm_prefetch::<_MM_HINT_T0>(p0.wrapping_add(PREFETCH).cast());
                let (dwv, cwv) = if MIN {
                    let h = _mm_cvtph_ps(_mm_set_epi32(0, 0, rd32(p1), rd32(p0)));
                    let h = _mm512_castps128_ps512(h);
                    (_mm512_permutexvar_ps(id, h), _mm512_permutexvar_ps(im, h))
                } else {
                    let lo = i32::from(std::ptr::read_unaligned(p0.cast::<u16>()));
                    let hi = i32::from(std::ptr::read_unaligned(p1.cast::<u16>()));
                    let h = _mm_cvtph_ps(_mm_cvtsi32_si128(lo | (hi << 16)));
                    let dwv = _mm512_permutexvar_ps(id, _mm512_castps128_ps512(h));
                    (dwv, _mm512_mul_ps(dwv, minus8))
                };
                let w0 = _mm_loadu_si128(p0.add(off).cast());
                let w1 = _mm_loadu_si128(p1.add(off).cast());
                let v = _mm256_set_m128i(w1, w0);
                let lo = _mm256_and_si256(v, mask);
                let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
                let z = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
                let z = _mm512_shuffle_i64x2(z, z, 0b11_01_10_00);
                let pv = b / 2 * 16;
                for t in 0..NT {
                    let x = _mm512_loadu_si512(xs[t].q.as_ptr().add(b * QK).cast());
                    let d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), z, x);
                    let scale = _mm512_mul_ps(dwv, _mm512_loadu_ps(xs[t].dv.as_ptr().add(pv)));
                    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), scale, acc[t]);
                    acc[t] =
                        _mm512_fmadd_ps(cwv, _mm512_loadu_ps(xs[t].sv.as_ptr().add(pv)), acc[t]);
                }
            }
            b += 2;
        }
        let mut tail = [0f32; NT];
        if b < nb {
            // SAFETY: block b exists.
            unsafe {
                let p = wp.add(b * bb);
                let dw = h2f(p);
                let cw = if MIN { h2f(p.add(2)) } else { -8.0 * dw };
                let v = _mm_loadu_si128(p.add(off).cast());
                let lo = _mm_and_si128(v, _mm256_castsi256_si128(mask));
                let hi = _mm_and_si128(_mm_srli_epi16(v, 4), _mm256_castsi256_si128(mask));
                let z = _mm256_set_m128i(hi, lo);
                for t in 0..NT {
                    let x = _mm256_loadu_si256(xs[t].q.as_ptr().add(b * QK).cast());
                    let d = _mm256_dpbusd_epi32(_mm256_setzero_si256(), z, x);
                    #[allow(clippy::cast_precision_loss)]
                    let s = hsum_i32(d) as f32;
                    tail[t] = dw * xs[t].d[b] * s + cw * xs[t].xs[b];
                }
            }
        }
        for t in 0..NT {
            out[t] = _mm512_reduce_add_ps(acc[t]) + tail[t];
        }
    }

    /// Q8_0: two blocks per 512-bit integer dot, weights made unsigned by flipping the sign bit.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn q8<const NT: usize>(w: &[u8], xs: &[QRow<'_>], out: &mut [f32]) {
        let bb = 34;
        let nb = xs[0].d.len();
        let flip = _mm512_set1_epi8(-128);
        let id = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
        let minus128 = _mm512_set1_ps(-128.0);
        let mut acc = [_mm512_setzero_ps(); NT];
        let wp = w.as_ptr();
        let mut b = 0;
        while b + 2 <= nb {
            // SAFETY: blocks b and b+1 exist.
            unsafe {
                let p0 = wp.add(b * bb);
                let p1 = wp.add((b + 1) * bb);
                _mm_prefetch::<_MM_HINT_T0>(p0.wrapping_add(PREFETCH).cast());
                _mm_prefetch::<_MM_HINT_T0>(p0.wrapping_add(PREFETCH + 64).cast());
                let lo = i32::from(std::ptr::read_unaligned(p0.cast::<u16>()));
                let hi = i32::from(std::ptr::read_unaligned(p1.cast::<u16>()));
                let h = _mm_cvtph_ps(_mm_cvtsi32_si128(lo | (hi << 16)));
                let dwv = _mm512_permutexvar_ps(id, _mm512_castps128_ps512(h));
                let cwv = _mm512_mul_ps(dwv, minus128);
                let w0 = _mm256_loadu_si256(p0.add(2).cast());
                let w1 = _mm256_loadu_si256(p1.add(2).cast());
                let z =
                    _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(w0), w1, 1), flip);
                let pv = b / 2 * 16;
                for t in 0..NT {
                    let x = _mm512_loadu_si512(xs[t].q.as_ptr().add(b * QK).cast());
                    let d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), z, x);
                    let scale = _mm512_mul_ps(dwv, _mm512_loadu_ps(xs[t].dv.as_ptr().add(pv)));
                    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), scale, acc[t]);
                    acc[t] =
                        _mm512_fmadd_ps(cwv, _mm512_loadu_ps(xs[t].sv.as_ptr().add(pv)), acc[t]);
                }
            }
            b += 2;
        }
        let mut tail = [0f32; NT];
        if b < nb {
            // SAFETY: block b exists.
            unsafe {
                let p = wp.add(b * bb);
                let dw = h2f(p);
                let z = _mm256_xor_si256(
                    _mm256_loadu_si256(p.add(2).cast()),
                    _mm512_castsi512_si256(flip),
                );
                for t in 0..NT {
                    let x = _mm256_loadu_si256(xs[t].q.as_ptr().add(b * QK).cast());
                    let d = _mm256_dpbusd_epi32(_mm256_setzero_si256(), z, x);
                    #[allow(clippy::cast_precision_loss)]
                    let s = hsum_i32(d) as f32;
                    tail[t] = dw * xs[t].d[b] * s - 128.0 * dw * xs[t].xs[b];
                }
            }
        }
        for t in 0..NT {
            out[t] = _mm512_reduce_add_ps(acc[t]) + tail[t];
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    #[inline]
    fn hsum_i32(v: __m256i) -> i32 {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
        _mm_cvtsi128_si32(s)
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn h2f(p: *const u8) -> f32 {
        // SAFETY: the caller passes a pointer to two readable bytes.
        let bits = unsafe { std::ptr::read_unaligned(p.cast::<u16>()) };
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot(dtype: DType, w: &[u8], xs: &[QRow<'_>], out: &mut [f32]) {
        // SAFETY: callers pass whole blocks and matching activation rows.
        unsafe {
            match dtype {
                DType::Q4_0 => nib::<false>(w, xs, out),
                DType::Q4_1 => nib::<true>(w, xs, out),
                DType::Q8_0 => q8(w, xs, out),
                _ => super::scalar::dot(dtype, w, xs, out),
            }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn nib<const MIN: bool>(w: &[u8], xs: &[QRow<'_>], out: &mut [f32]) {
        let (bb, off) = if MIN { (20, 4) } else { (18, 2) };
        let mask = _mm_set1_epi8(0x0F);
        let ones = _mm256_set1_epi16(1);
        for (x, o) in xs.iter().zip(out.iter_mut()) {
            let mut acc = _mm256_setzero_ps();
            let mut corr = 0f32;
            for b in 0..x.d.len() {
                // SAFETY: block b exists; the activation row holds nb*32 codes.
                unsafe {
                    let p = w.as_ptr().add(b * bb);
                    let dw = h2f(p);
                    corr += if MIN { h2f(p.add(2)) } else { -8.0 * dw } * x.xs[b];
                    let v = _mm_loadu_si128(p.add(off).cast());
                    let z = _mm256_set_m128i(
                        _mm_and_si128(_mm_srli_epi16(v, 4), mask),
                        _mm_and_si128(v, mask),
                    );
                    let q = _mm256_loadu_si256(x.q.as_ptr().add(b * QK).cast());
                    let s = _mm256_madd_epi16(_mm256_maddubs_epi16(z, q), ones);
                    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(dw * x.d[b]), acc);
                }
            }
            *o = hsum(acc) + corr;
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q8(w: &[u8], xs: &[QRow<'_>], out: &mut [f32]) {
        let ones = _mm256_set1_epi16(1);
        for (x, o) in xs.iter().zip(out.iter_mut()) {
            let mut acc = _mm256_setzero_ps();
            for b in 0..x.d.len() {
                // SAFETY: block b exists; the activation row holds nb*32 codes.
                unsafe {
                    let p = w.as_ptr().add(b * 34);
                    let dw = h2f(p);
                    let wv = _mm256_loadu_si256(p.add(2).cast());
                    let q = _mm256_loadu_si256(x.q.as_ptr().add(b * QK).cast());
                    let s = _mm256_madd_epi16(
                        _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(q, wv)),
                        ones,
                    );
                    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(dw * x.d[b]), acc);
                }
            }
            *o = hsum(acc);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::quant::QActs;
    use crate::model::testing::{FixtureRng, quantize_q4_0, quantize_q4_1, quantize_q8_0};
    use crate::model::weights::dequantize;

    fn check(dtype: DType, k: usize) {
        let mut rng = FixtureRng::new(k as u64);
        let wf = rng.vec(k, 1.0);
        let w = match dtype {
            DType::Q4_0 => quantize_q4_0(&wf),
            DType::Q4_1 => quantize_q4_1(&wf),
            _ => quantize_q8_0(&wf),
        };
        let mut wd = vec![0.0; k];
        dequantize(dtype, &w, &mut wd);
        let x = rng.vec(4 * k, 2.0);
        let mut qa = QActs::default();
        qa.quantize(&x, 4, k);
        let rows: Vec<QRow<'_>> = (0..4).map(|r| qa.row(r)).collect();
        let exact: Vec<f32> = (0..4)
            .map(|t| {
                wd.iter()
                    .zip(&x[t * k..(t + 1) * k])
                    .map(|(a, b)| a * b)
                    .sum()
            })
            .collect();
        for isa in Isa::available() {
            let mut all = [0f32; 4];
            dot_row(
                isa,
                dtype,
                &w,
                &rows,
                &mut all,
                &mut vec![0.0; scratch_len(k)],
            );
            for t in 0..4 {
                let tol = 0.02 * (k as f32).sqrt();
                assert!(
                    (all[t] - exact[t]).abs() < tol,
                    "{isa:?} {dtype:?} k={k} t={t}: {} vs {}",
                    all[t],
                    exact[t]
                );
                // Batch invariance: the same token alone gives bit-identical output.
                let mut one = [0f32; 1];
                dot_row(
                    isa,
                    dtype,
                    &w,
                    &rows[t..t + 1],
                    &mut one,
                    &mut vec![0.0; scratch_len(k)],
                );
                assert_eq!(
                    one[0].to_bits(),
                    all[t].to_bits(),
                    "{isa:?} {dtype:?} batch variance"
                );
            }
        }
    }

    #[test]
    fn kernels_match_dequantized_reference() {
        for dtype in [DType::Q4_0, DType::Q4_1, DType::Q8_0] {
            for k in [32, 64, 96, 576, 1536] {
                check(dtype, k);
            }
        }
    }
}
