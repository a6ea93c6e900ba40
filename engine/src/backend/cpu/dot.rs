//! Integer dot products of one quantized weight row (Q4_0, Q4_1 or Q8_0 blocks, read in place
//! from the model file) with up to four 16-bit quantized activation rows.
//!
//! Every kernel computes each output with the same sequence of operations whatever the number
//! of activation rows it is given, so a token's result does not depend on which other tokens
//! share its batch (batch invariance).
//!
//! For block `b` with weight scale `dw`, activation scale `dx`, weight codes `u` and activation
//! codes `q`, the dot is `Σ_b dw·dx·Σ u·q + Σ_b cw·xs`, where `xs` is the block's float sum and
//! `cw` the weight format's correction: the minimum `m` for Q4_1, `-8·dw` for Q4_0 (its codes
//! carry an offset of 8), and 0 for Q8_0.

use half::f16;

use super::isa::Isa;
use super::quant::{QK, QRow};
use crate::model::weights::DType;

/// Tokens one kernel pass handles at once (more are taken in groups of this many).
pub const MAX_TOKENS: usize = 4;

/// The quantized formats with integer kernels.
pub fn has_int_kernel(dtype: DType) -> bool {
    matches!(dtype, DType::Q4_0 | DType::Q4_1 | DType::Q8_0)
}

/// Floats of scratch space a call needs for a row of `k` values.
pub fn scratch_len(k: usize) -> usize {
    (2 + MAX_TOKENS) * k.div_ceil(QK)
}

/// `out[t] = w · x[t]` for each of `xs` (any number; tokens are taken [`MAX_TOKENS`] at a
/// time so each weight block is unpacked once per group); `scratch` holds at least
/// [`scratch_len`] floats. Callers guarantee `w` holds the row's blocks and each `x` matches.
pub fn dot_row(
    isa: Isa,
    dtype: DType,
    w: &[u8],
    xs: &[QRow<'_>],
    out: &mut [f32],
    scratch: &mut [f32],
) {
    assert_eq!(xs.len(), out.len());
    let nb = xs.first().map_or(0, |x| x.d.len());
    assert!(
        scratch.len() >= scratch_len(nb * QK),
        "dot_row scratch too small"
    );
    let w = &w[..nb * dtype.block_bytes()];
    if isa == Isa::Avx512 {
        #[cfg(target_arch = "x86_64")]
        if xs.len() == 1 {
            // SAFETY: `Isa::Avx512` is only ever returned after detecting these CPU features;
            // `w` holds nb blocks and each activation row nb blocks (checked by the caller).
            unsafe { avx512::dot(dtype, w, xs, out, nb) };
        } else {
            // Several tokens: decode the row's headers once, then per group of tokens the
            // per-block scales, and unpack each weight block once for the whole group. Every
            // token's result is bit-identical to the one-token path above.
            let (hdr, sc) = scratch.split_at_mut(2 * nb);
            let (dw, cw) = hdr.split_at_mut(nb);
            // SAFETY: as above.
            unsafe { avx512::headers(dtype, w, dw, cw) };
            for (x, o) in xs.chunks(MAX_TOKENS).zip(out.chunks_mut(MAX_TOKENS)) {
                for (t, row) in x.iter().enumerate() {
                    // Even and odd blocks' corrections summed apart, as the one-token path does.
                    let (mut even, mut odd) = (0f32, 0f32);
                    for (b, s) in sc[t * nb..(t + 1) * nb].iter_mut().enumerate() {
                        *s = dw[b] * row.d[b];
                        if b % 2 == 0 {
                            even += cw[b] * row.xs[b];
                        } else {
                            odd += cw[b] * row.xs[b];
                        }
                    }
                    o[t] = even + odd;
                }
                // SAFETY: as above; `sc` holds x.len() × nb scales.
                unsafe { avx512::dot_scaled(dtype, w, x, o, &sc[..x.len() * nb], nb) };
            }
        }
        return;
    }
    let (dw, cw) = scratch[..2 * nb].split_at_mut(nb);
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` is only ever returned after detecting AVX2, FMA and F16C.
        Isa::Avx2 => unsafe {
            avx2::headers(dtype, w, dw, cw);
            avx2::dot(dtype, w, xs, out, dw);
        },
        _ => {
            headers(dtype, w, dw, cw);
            scalar::dot(dtype, w, xs, out, dw);
        }
    }
    for (o, x) in out.iter_mut().zip(xs) {
        *o += super::matmul::dot_f32(cw, &x.xs[..nb]);
    }
}

/// Each block's weight scale and correction (see the module docs).
fn headers(dtype: DType, w: &[u8], dw: &mut [f32], cw: &mut [f32]) {
    let bb = dtype.block_bytes();
    for ((blk, d), c) in w.chunks_exact(bb).zip(dw.iter_mut()).zip(cw.iter_mut()) {
        *d = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
        *c = match dtype {
            DType::Q4_1 => f16::from_le_bytes([blk[2], blk[3]]).to_f32(),
            DType::Q4_0 => -8.0 * *d,
            _ => 0.0,
        };
    }
}

/// Byte offset of the codes within a block.
fn code_offset(dtype: DType) -> usize {
    if dtype == DType::Q4_1 { 4 } else { 2 }
}

mod scalar {
    use super::*;

    pub fn dot(dtype: DType, w: &[u8], xs: &[QRow<'_>], out: &mut [f32], dw: &[f32]) {
        let bb = dtype.block_bytes();
        let off = code_offset(dtype);
        for (x, o) in xs.iter().zip(out.iter_mut()) {
            let mut acc = 0f32;
            for (b, blk) in w.chunks_exact(bb).take(dw.len()).enumerate() {
                let q = &x.q[b * QK..(b + 1) * QK];
                let c = &blk[off..];
                let s: i64 = if dtype == DType::Q8_0 {
                    (0..QK)
                        .map(|j| i64::from(c[j].cast_signed()) * i64::from(q[j]))
                        .sum()
                } else {
                    (0..16)
                        .map(|j| {
                            i64::from(c[j] & 0xF) * i64::from(q[j])
                                + i64::from(c[j] >> 4) * i64::from(q[j + 16])
                        })
                        .sum()
                };
                #[allow(clippy::cast_precision_loss)]
                {
                    acc += dw[b] * x.d[b] * s as f32;
                }
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

    const Q4_0: u8 = 0;
    const Q4_1: u8 = 1;
    const Q8_0: u8 = 2;

    /// One token, one pass over the row: each block's header is decoded where it is read, so
    /// the row is streamed once. Blocks go in pairs; the corrections of even and odd blocks are
    /// summed apart and added at the end (the several-token path sums them the same way).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub unsafe fn dot(dtype: DType, w: &[u8], xs: &[QRow<'_>], out: &mut [f32], nb: usize) {
        // SAFETY (all cases): the caller checked sizes.
        unsafe {
            out[0] = match dtype {
                DType::Q4_0 => run1::<Q4_0>(w, &xs[0], nb),
                DType::Q4_1 => run1::<Q4_1>(w, &xs[0], nb),
                _ => run1::<Q8_0>(w, &xs[0], nb),
            };
        }
    }

    /// Each block's scale and correction, with the same conversion as [`header`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub unsafe fn headers(dtype: DType, w: &[u8], dw: &mut [f32], cw: &mut [f32]) {
        let bb = dtype.block_bytes();
        for (b, (d, c)) in dw.iter_mut().zip(cw.iter_mut()).enumerate() {
            // SAFETY: block b exists (the caller sized `dw` to the row's blocks).
            let h = unsafe {
                let p = w.as_ptr().add(b * bb);
                match dtype {
                    DType::Q4_1 => header::<Q4_1>(p),
                    DType::Q4_0 => header::<Q4_0>(p),
                    _ => header::<Q8_0>(p),
                }
            };
            *d = _mm_cvtss_f32(h);
            *c = _mm_cvtss_f32(_mm_movehdup_ps(h));
        }
    }

    /// Like [`dot`] for 1–4 tokens whose per-block scales `dw·dx` are in `sc` and whose
    /// corrections are already in `out`: adds the integer dot products.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub unsafe fn dot_scaled(
        dtype: DType,
        w: &[u8],
        xs: &[QRow<'_>],
        out: &mut [f32],
        sc: &[f32],
        nb: usize,
    ) {
        // SAFETY (all cases): the caller checked sizes.
        unsafe {
            match (dtype, xs.len()) {
                (DType::Q4_0, 1) => scaled::<1, Q4_0>(w, xs, out, sc, nb),
                (DType::Q4_0, 2) => scaled::<2, Q4_0>(w, xs, out, sc, nb),
                (DType::Q4_0, 3) => scaled::<3, Q4_0>(w, xs, out, sc, nb),
                (DType::Q4_0, _) => scaled::<4, Q4_0>(w, xs, out, sc, nb),
                (DType::Q4_1, 1) => scaled::<1, Q4_1>(w, xs, out, sc, nb),
                (DType::Q4_1, 2) => scaled::<2, Q4_1>(w, xs, out, sc, nb),
                (DType::Q4_1, 3) => scaled::<3, Q4_1>(w, xs, out, sc, nb),
                (DType::Q4_1, _) => scaled::<4, Q4_1>(w, xs, out, sc, nb),
                (_, 1) => scaled::<1, Q8_0>(w, xs, out, sc, nb),
                (_, 2) => scaled::<2, Q8_0>(w, xs, out, sc, nb),
                (_, 3) => scaled::<3, Q8_0>(w, xs, out, sc, nb),
                (_, _) => scaled::<4, Q8_0>(w, xs, out, sc, nb),
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn scaled<const NT: usize, const K: u8>(
        w: &[u8],
        xs: &[QRow<'_>],
        out: &mut [f32],
        sc: &[f32],
        nb: usize,
    ) {
        let bb = block_bytes::<K>();
        let mut acc = [_mm512_setzero_ps(); NT];
        let q: [*const i16; NT] = std::array::from_fn(|t| xs[t].q.as_ptr());
        for b in 0..nb {
            // SAFETY: block b exists; each activation row holds nb*32 codes; `sc` NT*nb scales.
            unsafe {
                let p = w.as_ptr().add(b * bb);
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH).cast());
                let w16 = widen::<K>(p);
                for t in 0..NT {
                    let x = _mm512_loadu_si512(q[t].add(b * QK).cast());
                    let s = _mm512_cvtepi32_ps(_mm512_madd_epi16(w16, x));
                    acc[t] =
                        _mm512_fmadd_ps(s, _mm512_set1_ps(*sc.get_unchecked(t * nb + b)), acc[t]);
                }
            }
        }
        for t in 0..NT {
            out[t] += _mm512_reduce_add_ps(acc[t]);
        }
    }

    fn block_bytes<const K: u8>() -> usize {
        if K == Q4_1 {
            20
        } else if K == Q4_0 {
            18
        } else {
            34
        }
    }

    /// Block `p`'s header as `[dw, cw, 0, 0]` (scale and correction, see the module docs).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    #[inline]
    unsafe fn header<const K: u8>(p: *const u8) -> __m128 {
        // SAFETY: `p` points at a whole block.
        unsafe {
            match K {
                Q4_1 => _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(p.cast::<i32>()))),
                Q4_0 => {
                    let d = i32::from(std::ptr::read_unaligned(p.cast::<u16>()));
                    let h = _mm_moveldup_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(d)));
                    _mm_mul_ps(h, _mm_setr_ps(1.0, -8.0, 0.0, 0.0))
                }
                _ => {
                    let d = i32::from(std::ptr::read_unaligned(p.cast::<u16>()));
                    _mm_cvtph_ps(_mm_cvtsi32_si128(d))
                }
            }
        }
    }

    /// The 32 codes of block `p` as 16-bit integers.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    #[inline]
    unsafe fn widen<const K: u8>(p: *const u8) -> __m512i {
        // SAFETY: `p` points at a whole block.
        unsafe {
            if K == Q8_0 {
                _mm512_cvtepi8_epi16(_mm256_loadu_si256(p.add(2).cast()))
            } else {
                // Byte j holds code j (low nibble) and code j+16 (high nibble).
                let off = if K == Q4_1 { 4 } else { 2 };
                let v = _mm256_cvtepu8_epi16(_mm_loadu_si128(p.add(off).cast()));
                let lo = _mm256_and_si256(v, _mm256_set1_epi16(0x0F));
                let hi = _mm256_srli_epi16(v, 4);
                _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
            }
        }
    }

    /// Two blocks' headers as `[dw0, cw0, dw1, cw1]`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    #[inline]
    unsafe fn header2<const K: u8>(p0: *const u8, p1: *const u8) -> __m128 {
        // SAFETY: both point at whole blocks.
        unsafe {
            if K == Q4_1 {
                let a = std::ptr::read_unaligned(p0.cast::<i32>());
                let b = std::ptr::read_unaligned(p1.cast::<i32>());
                return _mm_cvtph_ps(_mm_set_epi32(0, 0, b, a));
            }
            let a = i32::from(std::ptr::read_unaligned(p0.cast::<u16>()));
            let b = i32::from(std::ptr::read_unaligned(p1.cast::<u16>()));
            let h = _mm_cvtph_ps(_mm_cvtsi32_si128(a | (b << 16)));
            if K == Q4_0 {
                _mm_mul_ps(_mm_unpacklo_ps(h, h), _mm_setr_ps(1.0, -8.0, 1.0, -8.0))
            } else {
                _mm_unpacklo_ps(h, _mm_setzero_ps())
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn run1<const K: u8>(w: &[u8], x: &QRow<'_>, nb: usize) -> f32 {
        let bb = block_bytes::<K>();
        let mut acc = _mm512_setzero_ps();
        let mut corr = _mm_setzero_ps();
        let q = x.q.as_ptr();
        let pairs = x.pairs.as_ptr();
        let two = _mm512_set1_epi32(2);
        let mut b = 0;
        // SAFETY (whole loop): blocks b and b+1 exist; the activation row holds nb*32 codes and
        // nb pairs.
        unsafe {
            while b + 2 <= nb {
                let p0 = w.as_ptr().add(b * bb);
                let p1 = p0.add(bb);
                _mm_prefetch::<_MM_HINT_T0>(p0.wrapping_add(PREFETCH).cast());
                // [dw0·dx0, cw0·xs0, dw1·dx1, cw1·xs1]
                let sc = _mm_mul_ps(header2::<K>(p0, p1), _mm_loadu_ps(pairs.add(2 * b)));
                corr = _mm_add_ps(corr, sc);
                let s0 = _mm512_cvtepi32_ps(_mm512_madd_epi16(
                    widen::<K>(p0),
                    _mm512_loadu_si512(q.add(b * QK).cast()),
                ));
                acc = _mm512_fmadd_ps(s0, _mm512_broadcastss_ps(sc), acc);
                let s1 = _mm512_cvtepi32_ps(_mm512_madd_epi16(
                    widen::<K>(p1),
                    _mm512_loadu_si512(q.add((b + 1) * QK).cast()),
                ));
                acc = _mm512_fmadd_ps(
                    s1,
                    _mm512_permutexvar_ps(two, _mm512_castps128_ps512(sc)),
                    acc,
                );
                b += 2;
            }
            if b < nb {
                let p = w.as_ptr().add(b * bb);
                let sc = _mm_mul_ps(
                    header::<K>(p),
                    _mm_castpd_ps(_mm_load_sd(pairs.add(2 * b).cast())),
                );
                corr = _mm_add_ps(corr, sc);
                let s = _mm512_cvtepi32_ps(_mm512_madd_epi16(
                    widen::<K>(p),
                    _mm512_loadu_si512(q.add(b * QK).cast()),
                ));
                acc = _mm512_fmadd_ps(s, _mm512_broadcastss_ps(sc), acc);
            }
        }
        let even = _mm_cvtss_f32(_mm_movehdup_ps(corr));
        let odd = _mm_cvtss_f32(_mm_shuffle_ps(corr, corr, 0b11_11_11_11));
        _mm512_reduce_add_ps(acc) + (even + odd)
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use std::arch::x86_64::*;

    /// Decodes each block's scale and correction with the F16C conversion.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn headers(dtype: DType, w: &[u8], dw: &mut [f32], cw: &mut [f32]) {
        let bb = dtype.block_bytes();
        for (b, (d, c)) in dw.iter_mut().zip(cw.iter_mut()).enumerate() {
            // SAFETY: block b exists (the caller sized `dw` to the row's blocks).
            let bits = unsafe { std::ptr::read_unaligned(w.as_ptr().add(b * bb).cast::<u32>()) };
            let h = _mm_cvtph_ps(_mm_cvtsi32_si128(bits.cast_signed()));
            *d = _mm_cvtss_f32(h);
            *c = match dtype {
                DType::Q4_1 => _mm_cvtss_f32(_mm_movehdup_ps(h)),
                DType::Q4_0 => -8.0 * *d,
                _ => 0.0,
            };
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot(dtype: DType, w: &[u8], xs: &[QRow<'_>], out: &mut [f32], dw: &[f32]) {
        let bb = dtype.block_bytes();
        for (x, o) in xs.iter().zip(out.iter_mut()) {
            let mut acc = _mm256_setzero_ps();
            for (b, &d) in dw.iter().enumerate() {
                // SAFETY: block b exists; the activation row holds nb*32 codes.
                unsafe {
                    let p = w.as_ptr().add(b * bb);
                    let (w0, w1) = if dtype == DType::Q8_0 {
                        let v = _mm256_loadu_si256(p.add(2).cast());
                        (
                            _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v)),
                            _mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1)),
                        )
                    } else {
                        let v = _mm_loadu_si128(p.add(code_offset(dtype)).cast());
                        let mask = _mm_set1_epi8(0x0F);
                        (
                            _mm256_cvtepu8_epi16(_mm_and_si128(v, mask)),
                            _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(v, 4), mask)),
                        )
                    };
                    let q = x.q.as_ptr().add(b * QK);
                    let s = _mm256_add_epi32(
                        _mm256_madd_epi16(w0, _mm256_loadu_si256(q.cast())),
                        _mm256_madd_epi16(w1, _mm256_loadu_si256(q.add(16).cast())),
                    );
                    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(d * x.d[b]), acc);
                }
            }
            let s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_movehdup_ps(s));
            *o = _mm_cvtss_f32(s);
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
        let exact: Vec<f64> = (0..4)
            .map(|t| {
                wd.iter()
                    .zip(&x[t * k..(t + 1) * k])
                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                    .sum()
            })
            .collect();
        let mut scratch = vec![0.0; scratch_len(k)];
        for isa in Isa::available() {
            let mut all = [0f32; 4];
            dot_row(isa, dtype, &w, &rows, &mut all, &mut scratch);
            for t in 0..4 {
                let tol = 2e-4 * (k as f64).sqrt() + 1e-4;
                let err = (f64::from(all[t]) - exact[t]).abs();
                assert!(
                    err < tol,
                    "{isa:?} {dtype:?} k={k} t={t}: {} vs {} (err {err})",
                    all[t],
                    exact[t]
                );
                // Batch invariance: the same token alone gives bit-identical output.
                let mut one = [0f32; 1];
                dot_row(isa, dtype, &w, &rows[t..t + 1], &mut one, &mut scratch);
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
