//! The AVX2 tiles of the three formats the default model uses (Q4_0, Q4_1, Q8_0), tuned for
//! `vpmaddubsw`; every other format, and every format on VNNI, runs in [`super::wide`].

use super::wide::reduce;
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
        _ => unreachable!("{fmt:?} has no basic AVX2 tile"),
    }
}

const fn record<const F: u8>() -> usize {
    match F {
        Q4_0 => PackedFormat::Q4_0.record_bytes(),
        Q4_1 => PackedFormat::Q4_1.record_bytes(),
        _ => PackedFormat::Q8_0.record_bytes(),
    }
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
                let lo: [__m256i; 4] = std::array::from_fn(|p| _mm256_and_si256(raw[p], nibble));
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
