//! Integer kernels: one packed group of eight weight rows ([`super::packed`]) against up to
//! [`MAX_TOKENS`] rows of 8-bit activations ([`super::quant`]).
//!
//! For block `b`, row `r` and token `t` the kernels add `dw·dx·Σ u·q` (the integer dot of
//! the codes, exact) and the format's correction: `m·sq` for Q4_1 (its minimum times the
//! block's activation sum `sq = dx·Σq`), `-8·dw·sq` for Q4_0 (its codes carry an offset of 8),
//! none for Q8_0.
//!
//! On AVX2 one `vpmaddubsw` multiplies 32 unsigned codes with 32 signed ones and adds pairs;
//! each 32-byte vector holds two rows (see the packed layout), and three horizontal adds turn
//! the eight rows' partial sums into one vector of eight dot products, so the scales, the
//! correction and the accumulation are one vector operation each for the whole group.
//!
//! Batch invariance: each token has its own accumulator and sees the same operations in the
//! same order whatever the number of tokens beside it, so a token's result does not depend on
//! its batch; rows are never split, so neither does it depend on the thread count.

use half::f16;

use super::isa::Isa;
use super::packed::{GROUP, PackedFormat};
use super::quant::{BLOCK_CODES, QRow};

/// Tokens one kernel pass handles at once (each weight block is unpacked once per pass).
pub const MAX_TOKENS: usize = 4;

/// For each of `groups` consecutive groups `i` (records of `nb` blocks each, from `g`) and
/// each token `t` of `xs` (at most [`MAX_TOKENS`]), writes the group's eight dot products with
/// row `t` to `out[t * stride + 8 * i ..][..8]`.
///
/// # Safety
/// `out` must be valid for those writes; `g` must hold `groups × nb` records of `fmt` and each
/// row of `xs` `nb` blocks.
#[allow(clippy::too_many_arguments)]
pub unsafe fn group_dot(
    isa: Isa,
    fmt: PackedFormat,
    g: &[u8],
    groups: usize,
    nb: usize,
    xs: &[QRow<'_>],
    out: *mut f32,
    stride: usize,
) {
    let len = nb * fmt.record_bytes();
    assert!(xs.len() <= MAX_TOKENS && g.len() >= groups * len);
    debug_assert!(xs.iter().all(|x| x.q.len() >= nb * BLOCK_CODES));
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` is only returned after detecting AVX2, FMA and F16C; sizes as
        // the caller guarantees.
        Isa::Avx2 => unsafe { avx2::group_dot(fmt, g, groups, nb, xs, out, stride) },
        _ => {
            for i in 0..groups {
                for (t, x) in xs.iter().enumerate() {
                    let r = scalar::dot8(fmt, &g[i * len..(i + 1) * len], nb, x);
                    for (j, v) in r.iter().enumerate() {
                        // SAFETY: as the caller guarantees.
                        unsafe { *out.add(t * stride + 8 * i + j) = *v };
                    }
                }
            }
        }
    }
}

mod scalar {
    use super::*;

    /// The eight rows' dot products with one token, block by block.
    pub fn dot8(fmt: PackedFormat, g: &[u8], nb: usize, x: &QRow<'_>) -> [f32; GROUP] {
        let rec = fmt.record_bytes();
        let mut acc = [0f32; GROUP];
        for b in 0..nb {
            let r = &g[b * rec..(b + 1) * rec];
            let q = &x.q[b * BLOCK_CODES..(b + 1) * BLOCK_CODES];
            let (dx, sq) = (x.meta[2 * b], x.meta[2 * b + 1]);
            let codes = &r[fmt.codes_offset()..];
            for (i, a) in acc.iter_mut().enumerate() {
                let dw = f16::from_le_bytes([r[2 * i], r[2 * i + 1]]).to_f32();
                let at = (i % 4) * 32 + (i / 4) * 16;
                let mut isum = 0i32;
                for j in 0..16 {
                    let (w_lo, w_hi) = match fmt {
                        PackedFormat::Q8_0 => (
                            i32::from(codes[at + j].cast_signed()),
                            i32::from(codes[128 + at + j].cast_signed()),
                        ),
                        _ => (
                            i32::from(codes[at + j] & 0xF),
                            i32::from(codes[at + j] >> 4),
                        ),
                    };
                    isum += w_lo * i32::from(q[j]) + w_hi * i32::from(q[32 + j]);
                }
                #[allow(clippy::cast_precision_loss)]
                let dot = dw * dx * isum as f32;
                *a += dot
                    + match fmt {
                        PackedFormat::Q4_1 => {
                            f16::from_le_bytes([r[16 + 2 * i], r[17 + 2 * i]]).to_f32() * sq
                        }
                        PackedFormat::Q4_0 => -8.0 * dw * sq,
                        PackedFormat::Q8_0 => 0.0,
                    };
            }
        }
        acc
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use std::arch::x86_64::*;

    const Q4_0: u8 = 0;
    const Q4_1: u8 = 1;
    const Q8_0: u8 = 2;

    /// See [`super::group_dot`].
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn group_dot(
        fmt: PackedFormat,
        g: &[u8],
        groups: usize,
        nb: usize,
        xs: &[QRow<'_>],
        out: *mut f32,
        stride: usize,
    ) {
        macro_rules! go {
            ($f:expr) => {
                // SAFETY (all arms): as the caller guarantees.
                unsafe {
                    match xs.len() {
                        1 => tiles::<$f, 1>(g.as_ptr(), groups, nb, xs, out, stride),
                        2 => tiles::<$f, 2>(g.as_ptr(), groups, nb, xs, out, stride),
                        3 => tiles::<$f, 3>(g.as_ptr(), groups, nb, xs, out, stride),
                        4 => tiles::<$f, 4>(g.as_ptr(), groups, nb, xs, out, stride),
                        _ => {}
                    }
                }
            };
        }
        match fmt {
            PackedFormat::Q4_0 => go!(Q4_0),
            PackedFormat::Q4_1 => go!(Q4_1),
            PackedFormat::Q8_0 => go!(Q8_0),
        }
    }

    const fn record<const F: u8>() -> usize {
        match F {
            Q4_0 => PackedFormat::Q4_0.record_bytes(),
            Q4_1 => PackedFormat::Q4_1.record_bytes(),
            _ => PackedFormat::Q8_0.record_bytes(),
        }
    }

    /// Eight rows' i32 partial sums, one vector per row pair `[p | p+4]` (four lanes each),
    /// reduced to `[r0 r1 r2 r3 | r4 r5 r6 r7]`.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn reduce(i: [__m256i; 4]) -> __m256i {
        let a = _mm256_hadd_epi32(i[0], i[1]);
        let b = _mm256_hadd_epi32(i[2], i[3]);
        _mm256_hadd_epi32(a, b)
    }

    /// [`tile`] over consecutive groups.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tiles<const F: u8, const NT: usize>(
        g: *const u8,
        groups: usize,
        nb: usize,
        xs: &[QRow<'_>],
        out: *mut f32,
        stride: usize,
    ) {
        let len = nb * record::<F>();
        for i in 0..groups {
            // SAFETY: as the caller guarantees.
            unsafe { tile::<F, NT>(g.add(i * len), nb, xs, out.add(8 * i), stride) };
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn tile<const F: u8, const NT: usize>(
        g: *const u8,
        nb: usize,
        xs: &[QRow<'_>],
        out: *mut f32,
        stride: usize,
    ) {
        let rec = record::<F>();
        let nibble = _mm256_set1_epi8(0x0F);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); NT];
        let q: [*const i8; NT] = std::array::from_fn(|t| xs[t].q.as_ptr());
        let meta: [*const f32; NT] = std::array::from_fn(|t| xs[t].meta.as_ptr());
        for b in 0..nb {
            // SAFETY (whole body): record b and each token's block b exist (caller).
            unsafe {
                let r = g.add(b * rec);
                let dw = _mm256_cvtph_ps(_mm_loadu_si128(r.cast()));
                let corr = match F {
                    Q4_1 => _mm256_cvtph_ps(_mm_loadu_si128(r.add(16).cast())),
                    Q4_0 => _mm256_mul_ps(dw, _mm256_set1_ps(-8.0)),
                    _ => _mm256_setzero_ps(),
                };
                let c = r.add(if F == Q4_1 { 32 } else { 16 });
                if F == Q8_0 {
                    let lo: [__m256i; 4] =
                        std::array::from_fn(|p| _mm256_loadu_si256(c.add(32 * p).cast()));
                    let hi: [__m256i; 4] =
                        std::array::from_fn(|p| _mm256_loadu_si256(c.add(128 + 32 * p).cast()));
                    let alo: [__m256i; 4] = std::array::from_fn(|p| _mm256_sign_epi8(lo[p], lo[p]));
                    let ahi: [__m256i; 4] = std::array::from_fn(|p| _mm256_sign_epi8(hi[p], hi[p]));
                    for t in 0..NT {
                        let qa = q[t].add(b * BLOCK_CODES);
                        let (qlo, qhi) = (
                            _mm256_loadu_si256(qa.cast()),
                            _mm256_loadu_si256(qa.add(32).cast()),
                        );
                        // |w|·sign(q, w) = w·q, with the unsigned operand first.
                        let i: [__m256i; 4] = std::array::from_fn(|p| {
                            _mm256_add_epi32(
                                _mm256_madd_epi16(
                                    _mm256_maddubs_epi16(alo[p], _mm256_sign_epi8(qlo, lo[p])),
                                    ones,
                                ),
                                _mm256_madd_epi16(
                                    _mm256_maddubs_epi16(ahi[p], _mm256_sign_epi8(qhi, hi[p])),
                                    ones,
                                ),
                            )
                        });
                        let m = meta[t].add(2 * b);
                        let sc = _mm256_mul_ps(dw, _mm256_broadcast_ss(&*m));
                        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce(i)), sc, acc[t]);
                    }
                } else {
                    let raw: [__m256i; 4] =
                        std::array::from_fn(|p| _mm256_loadu_si256(c.add(32 * p).cast()));
                    let lo: [__m256i; 4] =
                        std::array::from_fn(|p| _mm256_and_si256(raw[p], nibble));
                    let hi: [__m256i; 4] = std::array::from_fn(|p| {
                        _mm256_and_si256(_mm256_srli_epi16::<4>(raw[p]), nibble)
                    });
                    for t in 0..NT {
                        let qa = q[t].add(b * BLOCK_CODES);
                        let (qlo, qhi) = (
                            _mm256_loadu_si256(qa.cast()),
                            _mm256_loadu_si256(qa.add(32).cast()),
                        );
                        // Codes 0..15 times -127..127, pairs added: at most 7,620 per lane.
                        let i: [__m256i; 4] = std::array::from_fn(|p| {
                            _mm256_madd_epi16(
                                _mm256_add_epi16(
                                    _mm256_maddubs_epi16(lo[p], qlo),
                                    _mm256_maddubs_epi16(hi[p], qhi),
                                ),
                                ones,
                            )
                        });
                        let m = meta[t].add(2 * b);
                        let sc = _mm256_mul_ps(dw, _mm256_broadcast_ss(&*m));
                        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce(i)), sc, acc[t]);
                        acc[t] = _mm256_fmadd_ps(corr, _mm256_broadcast_ss(&*m.add(1)), acc[t]);
                    }
                }
            }
        }
        for (t, a) in acc.iter().enumerate() {
            // SAFETY: the caller guarantees eight writable floats per token.
            unsafe { _mm256_storeu_ps(out.add(t * stride), *a) };
        }
    }
}

#[cfg(test)]
// Test data: small counts and indices, exact in every cast.
#[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
mod tests {
    use super::*;
    use crate::backend::cpu::packed::PackedMatrix;
    use crate::backend::cpu::pool::ComputePool;
    use crate::backend::cpu::quant::{QActs, QK};
    use crate::model::gguf::GgufFile;
    use crate::model::testing::{FixtureRng, GgufBuilder};
    use crate::model::weights::DType;

    /// Every kernel on every ISA this machine has, against f64 dot products of the packed
    /// weights' own values with the dequantized activations; and each token alone gives the
    /// bit-identical result it gives beside others.
    #[test]
    fn kernels_match_the_dequantized_reference_and_are_batch_invariant() {
        for (isa, runs) in Isa::all() {
            if !runs {
                eprintln!("NOT RUN: {isa:?} kernels (this CPU lacks the instructions)");
            }
        }
        for dtype in [DType::Q4_0, DType::Q4_1, DType::Q8_0] {
            for k in [32, 96, 576, 1536] {
                let mut rng = FixtureRng::new(k as u64 + 7);
                let mut b = GgufBuilder::new();
                b.tensor_quantized("w", &[8, k], dtype, &rng.vec(8 * k, 1.0));
                let (_dir, path) = b.write_temp();
                let gg = GgufFile::open(&path).expect("gguf");
                let m = PackedMatrix::pack(&[&gg.tensor("w").expect("w")]).expect("pack");
                let x = rng.vec(MAX_TOKENS * k, 2.0);
                let pool = ComputePool::new(1);
                for isa in Isa::available() {
                    let mut qa = QActs::default();
                    qa.quantize(&pool, isa, &x, MAX_TOKENS, k);
                    let rows: Vec<QRow<'_>> = (0..MAX_TOKENS).map(|t| qa.row(t)).collect();
                    let mut all = vec![0f32; MAX_TOKENS * 8];
                    // SAFETY: `all` holds MAX_TOKENS × 8 floats.
                    unsafe {
                        group_dot(
                            isa,
                            m.format(),
                            m.group(0),
                            1,
                            k / QK,
                            &rows,
                            all.as_mut_ptr(),
                            8,
                        )
                    };
                    for t in 0..MAX_TOKENS {
                        // The activations as the kernel sees them (codes × scale).
                        let row = qa.row(t);
                        let xq: Vec<f64> = (0..k)
                            .map(|j| {
                                let b = j / QK;
                                let c = row.q[b * BLOCK_CODES + (j % QK / 16) * 32 + j % 16];
                                f64::from(row.meta[2 * b]) * f64::from(c)
                            })
                            .collect();
                        for r in 0..8 {
                            let w = m.row_f32(r);
                            let mut exact = 0f64;
                            for (j, wj) in w.iter().enumerate() {
                                exact += f64::from(*wj) * xq[j];
                            }
                            let got = f64::from(all[t * 8 + r]);
                            let tol = 1e-5 * (k as f64).sqrt() * exact.abs().max(1.0);
                            assert!(
                                (got - exact).abs() < tol,
                                "{isa:?} {dtype:?} k={k} t={t} r={r}: {got} vs {exact}"
                            );
                        }
                        for n in 1..=MAX_TOKENS - t {
                            let mut part = vec![0f32; n * 8];
                            // SAFETY: `part` holds n × 8 floats.
                            unsafe {
                                group_dot(
                                    isa,
                                    m.format(),
                                    m.group(0),
                                    1,
                                    k / QK,
                                    &rows[t..t + n],
                                    part.as_mut_ptr(),
                                    8,
                                )
                            };
                            assert_eq!(
                                part[..8].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                                all[t * 8..t * 8 + 8]
                                    .iter()
                                    .map(|v| v.to_bits())
                                    .collect::<Vec<_>>(),
                                "{isa:?} {dtype:?} k={k}: token {t} with {n} tokens differs"
                            );
                        }
                    }
                }
            }
        }
    }

    /// The SIMD kernels compute what the scalar reference computes from the same codes.
    #[test]
    fn simd_kernels_agree_with_the_scalar_reference() {
        let k = 576;
        for dtype in [DType::Q4_0, DType::Q4_1, DType::Q8_0] {
            let mut rng = FixtureRng::new(31);
            let mut b = GgufBuilder::new();
            b.tensor_quantized("w", &[8, k], dtype, &rng.vec(8 * k, 1.0));
            let (_dir, path) = b.write_temp();
            let gg = GgufFile::open(&path).expect("gguf");
            let m = PackedMatrix::pack(&[&gg.tensor("w").expect("w")]).expect("pack");
            let x = rng.vec(k, 1.0);
            let pool = ComputePool::new(1);
            let mut qa = QActs::default();
            qa.quantize(&pool, Isa::Scalar, &x, 1, k);
            let mut want = [0f32; 8];
            // SAFETY: 8 floats.
            unsafe {
                group_dot(
                    Isa::Scalar,
                    m.format(),
                    m.group(0),
                    1,
                    k / QK,
                    &[qa.row(0)],
                    want.as_mut_ptr(),
                    8,
                )
            };
            for isa in Isa::available() {
                let mut got = [0f32; 8];
                // SAFETY: 8 floats.
                unsafe {
                    group_dot(
                        isa,
                        m.format(),
                        m.group(0),
                        1,
                        k / QK,
                        &[qa.row(0)],
                        got.as_mut_ptr(),
                        8,
                    )
                };
                for r in 0..8 {
                    assert!(
                        (got[r] - want[r]).abs() <= 1e-4 * want[r].abs().max(1.0),
                        "{isa:?} {dtype:?} row {r}: {} vs {}",
                        got[r],
                        want[r]
                    );
                }
            }
        }
    }
}
