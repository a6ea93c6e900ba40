//! One x86 tile for every packed format ([`PackedFormat`]): codes unpacked in registers from
//! their nibble vectors and bit planes (or IQ4 table indices), integer dot products with the
//! 8-bit activations, and the format's scales:
//! - one-scale formats (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q8_0): `dw·dx·Σ u·q` per block, plus
//!   `m·sq` (the minimum) or `−offset·dw·sq` (codes stored with an offset), as the basic tiles;
//! - K-quants: per record the integer dot is multiplied by the rows' integer sub-block scales
//!   in the integer domain (`vpmulld`; one scale per 32 columns, or one per 16-column half),
//!   scaled by the activation block's `dx` and summed over the super-block in f32, which is
//!   multiplied by the rows' `d` once per super-block; minimums likewise (`mn·sq`, or for Q2_K's
//!   16-column halves the integer `mn·Σq`), times `dmin` once per super-block.
//!
//! Codes stored with an offset (Q4_0, Q5_0, Q3_K, Q6_K; on VNNI also Q8_0 and IQ4 values
//! moved to unsigned by +128) go in as stored: each integer dot product starts from the
//! activations' negated code sums ([`QRow::sums`]) scaled by the offset, so `Σ(u − o)·q` comes
//! out exact in the integer domain, per 16-column half where the format scales halves. Signed
//! values on AVX2 (Q8_0, IQ4) use the sign trick: `|w|` as the unsigned operand and `q·sign(w)`
//! as the signed one. No sum can saturate a 16-bit lane where two products are added in one:
//! codes are below 64 there, or the two halves go through `vpmaddwd` apart.
//!
//! The tile is written once and instantiated per dot-product instruction set: AVX2
//! (`vpmaddubsw` + `vpmaddwd`), AVX-VNNI and AVX-512 VNNI (`vpdpbusd`, exact in 32 bits). The
//! integer sums are the same on all three, so so are the results.
//!
//! Batch invariance: each token has its own accumulators and sees the same operations in the
//! same order whatever the tokens beside it.

use std::arch::x86_64::*;

use super::super::packed::{GROUP, PackedFormat as P};
use super::super::quant::{BLOCK_CODES, QRow, SUMS};
use super::MAX_TOKENS;
use crate::model::weights::IQ4_VALUES;

/// Block record `rec`'s code vectors `(p, 0)` and `(p, 1)` (lane `r`: row `r`'s codes
/// `4p..4p+4`, and `16 + 4p..`), as stored (offset codes unsigned) or, for formats of signed
/// values, as values.
///
/// # Safety
/// `rec` must point at a whole record of format `F`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn codes<const F: u8>(rec: *const u8) -> ([__m256i; 4], [__m256i; 4]) {
    let f = P::from_id(F);
    // SAFETY (whole body): every offset is inside the record (the layout of `P`).
    unsafe {
        if matches!(f, P::Q8_0) {
            let c = rec.add(f.codes_offset());
            let lo = std::array::from_fn(|p| _mm256_loadu_si256(c.add(32 * p).cast()));
            let hi = std::array::from_fn(|p| _mm256_loadu_si256(c.add(128 + 32 * p).cast()));
            return (lo, hi);
        }
        let mut lo = [_mm256_setzero_si256(); 4];
        let mut hi = [_mm256_setzero_si256(); 4];
        if f.nibble() {
            let nibble = _mm256_set1_epi8(0x0F);
            let c = rec.add(f.codes_offset());
            for p in 0..4 {
                let raw = _mm256_loadu_si256(c.add(32 * p).cast());
                lo[p] = _mm256_and_si256(raw, nibble);
                hi[p] = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), nibble);
            }
        }
        let shift = if f.nibble() { 4 } else { 0 };
        for plane in 0..f.planes() {
            #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)] // < 8
            let to = (shift + plane) as i32;
            let bit = _mm256_set1_epi8(1 << to);
            let bits = _mm256_loadu_si256(rec.add(f.planes_offset() + 32 * plane).cast());
            // Vector (p, v)'s bit is bit 2p + v of each byte: moved to the code's bit by a
            // 16-bit shift (no bit crosses into the wanted position of the other byte) and
            // masked.
            let take = |from: i32| {
                let moved = if from >= to {
                    _mm256_srl_epi16(bits, _mm_cvtsi32_si128(from - to))
                } else {
                    _mm256_sll_epi16(bits, _mm_cvtsi32_si128(to - from))
                };
                _mm256_and_si256(moved, bit)
            };
            for (p, at) in [0, 2, 4, 6].into_iter().enumerate() {
                lo[p] = _mm256_or_si256(lo[p], take(at));
                hi[p] = _mm256_or_si256(hi[p], take(at + 1));
            }
        }
        if f.lut() {
            let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(IQ4_VALUES.as_ptr().cast()));
            for p in 0..4 {
                lo[p] = _mm256_shuffle_epi8(table, lo[p]);
                hi[p] = _mm256_shuffle_epi8(table, hi[p]);
            }
        }
        (lo, hi)
    }
}

/// Whether a format's codes are signed values (bytes, or IQ4 table entries) rather than
/// unsigned codes (with an offset or a minimum).
const fn signed_values(f: P) -> bool {
    matches!(f, P::Q8_0 | P::IQ4NL | P::IQ4XS)
}

/// Whether both halves' products may share one 16-bit sum (unsigned codes below 64).
const fn fused_halves(f: P) -> bool {
    !signed_values(f)
}

/// The negated code sum at `s` times `1 << shift`, in every lane (one lane per row): the
/// term that removes a code offset of `1 << shift`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn seed(s: *const i32, shift: i32) -> __m256i {
    // SAFETY: the caller passes a block's sums.
    let v = unsafe { _mm256_set1_epi32(*s) };
    _mm256_sll_epi32(v, _mm_cvtsi32_si128(shift))
}

/// The tile, instantiated once per dot-product instruction set: `$feat` are the target
/// features, `$dot(acc, u, s)` adds to `acc`'s eight i32 lanes the sums of four adjacent
/// products of unsigned bytes `u` and signed bytes `s`, and `$dot2(acc, u1, s1, u2, s2)` the
/// same for two pairs at once (where the format allows 16-bit partial sums); `$exact32`: the
/// dot sums in 32 bits; `$super_width`: tokens per pass for the super-block formats.
macro_rules! tile_set {
    ($name:ident, $feat:literal, $dot:ident, $dot2:ident, $exact32:literal, $super_width:literal) => {
        pub mod $name {
            use super::*;

            /// Whether `$dot` sums in 32 bits without saturating (VNNI): then signed values
            /// go in unsigned, offset by 128 and removed through the activation sums, instead
            /// of the sign trick's two extra instructions per token and vector.
            const EXACT32: bool = $exact32;

            /// Whether this instruction set multiplies signed values by the sign trick.
            const fn sign_trick(f: P) -> bool {
                signed_values(f) && !EXACT32
            }

            /// Whether signed values are moved to unsigned bytes (+128) here.
            const fn flipped(f: P) -> bool {
                signed_values(f) && EXACT32
            }

            /// The offset of the codes as the tile multiplies them.
            const fn offset_here(f: P) -> i32 {
                if flipped(f) { 128 } else { f.offset() }
            }

            /// The shift that turns a negated code sum into the seed removing the offset
            /// ([`seed`]); `None` without an offset. Offsets are powers of two.
            const fn seed_shift(f: P) -> Option<i32> {
                match offset_here(f) {
                    0 => None,
                    o => Some(o.trailing_zeros().cast_signed()),
                }
            }

            /// Tokens one tile takes at once: eight for the one-scale formats; for the
            /// super-blocks' three accumulators per token, `$super_width` (measured: with 32
            /// registers four tokens keep them all in registers and run faster than eight;
            /// with 16 the spills cost less than unpacking each record twice as often).
            const fn width(f: P) -> usize {
                if f.is_super() {
                    $super_width
                } else {
                    MAX_TOKENS
                }
            }

            /// See [`super::super::group_dot`].
            ///
            /// # Safety
            /// As there; the CPU must have the features of this instruction set.
            #[target_feature(enable = $feat)]
            pub unsafe fn group_dot(
                fmt: P,
                g: &[u8],
                groups: usize,
                nb: usize,
                xs: &[QRow<'_>],
                out: *mut f32,
                stride: usize,
            ) {
                macro_rules! go {
                    ($f:expr) => {{
                        const F: u8 = $f as u8;
                        let w = width(P::from_id(F));
                        for (c, xs) in xs.chunks(w).enumerate() {
                            let out = out.wrapping_add(c * w * stride);
                            // SAFETY (all arms): as the caller guarantees.
                            unsafe {
                                match xs.len() {
                                    1 => tiles::<F, 1>(g.as_ptr(), groups, nb, xs, out, stride),
                                    2 => tiles::<F, 2>(g.as_ptr(), groups, nb, xs, out, stride),
                                    3 => tiles::<F, 3>(g.as_ptr(), groups, nb, xs, out, stride),
                                    4 => tiles::<F, 4>(g.as_ptr(), groups, nb, xs, out, stride),
                                    5 => tiles::<F, 5>(g.as_ptr(), groups, nb, xs, out, stride),
                                    6 => tiles::<F, 6>(g.as_ptr(), groups, nb, xs, out, stride),
                                    7 => tiles::<F, 7>(g.as_ptr(), groups, nb, xs, out, stride),
                                    8 => tiles::<F, 8>(g.as_ptr(), groups, nb, xs, out, stride),
                                    _ => {}
                                }
                            }
                        }
                    }};
                }
                debug_assert!(xs.len() <= MAX_TOKENS);
                match fmt {
                    P::Q4_0 => go!(P::Q4_0),
                    P::Q4_1 => go!(P::Q4_1),
                    P::Q8_0 => go!(P::Q8_0),
                    P::Q5_0 => go!(P::Q5_0),
                    P::Q5_1 => go!(P::Q5_1),
                    P::IQ4NL => go!(P::IQ4NL),
                    P::Q2K => go!(P::Q2K),
                    P::Q3K => go!(P::Q3K),
                    P::Q4K => go!(P::Q4K),
                    P::Q5K => go!(P::Q5K),
                    P::Q6K => go!(P::Q6K),
                    P::IQ4XS => go!(P::IQ4XS),
                }
            }

            #[target_feature(enable = $feat)]
            unsafe fn tiles<const F: u8, const NT: usize>(
                g: *const u8,
                groups: usize,
                nb: usize,
                xs: &[QRow<'_>],
                out: *mut f32,
                stride: usize,
            ) {
                let len = P::from_id(F).group_bytes(nb * 32);
                for i in 0..groups {
                    // SAFETY: as the caller guarantees.
                    unsafe { tile::<F, NT>(g.add(i * len), nb, xs, out.add(GROUP * i), stride) };
                }
            }

            /// The integer dot products of one record's codes with one token's block (codes
            /// at `qa`, negated sums at `sums`), one lane per row, the code offset removed:
            /// both halves together, or (`split`) the halves apart. Each four-code group of the
            /// token is broadcast and multiplied with the matching code vector, in two chains
            /// (one per half).
            #[target_feature(enable = $feat)]
            #[inline]
            unsafe fn record_dots<const F: u8>(
                lo: &[__m256i; 4],
                hi: &[__m256i; 4],
                alo: &[__m256i; 4],
                ahi: &[__m256i; 4],
                qa: *const i8,
                sums: *const i32,
                split: bool,
            ) -> (__m256i, __m256i) {
                let f = P::from_id(F);
                let z = _mm256_setzero_si256();
                // SAFETY: the token's block exists (caller); codes 4p.. of the low half are
                // at byte 4p, of the high half at 32 + 4p (the duplicated layout).
                let (bl, bh): ([__m256i; 4], [__m256i; 4]) = unsafe {
                    (
                        std::array::from_fn(|p| {
                            _mm256_set1_epi32(qa.add(4 * p).cast::<i32>().read_unaligned())
                        }),
                        std::array::from_fn(|p| {
                            _mm256_set1_epi32(qa.add(32 + 4 * p).cast::<i32>().read_unaligned())
                        }),
                    )
                };
                // SAFETY: as above, for the block's sums.
                let (slo, shi) = match seed_shift(f) {
                    None => (z, z),
                    Some(sh) if split => unsafe { (seed(sums, sh), seed(sums.add(1), sh)) },
                    // The +128 seed is kept ready (no shift).
                    Some(7) => unsafe { (_mm256_set1_epi32(*sums.add(3)), z) },
                    Some(sh) => unsafe { (seed(sums.add(2), sh), z) },
                };
                let (mut l, mut h) = (slo, shi);
                if sign_trick(f) {
                    for p in 0..4 {
                        l = $dot(l, alo[p], _mm256_sign_epi8(bl[p], lo[p]));
                        h = $dot(h, ahi[p], _mm256_sign_epi8(bh[p], hi[p]));
                    }
                } else if fused_halves(f) {
                    for p in [0, 2] {
                        l = $dot2(l, lo[p], bl[p], lo[p + 1], bl[p + 1]);
                        h = $dot2(h, hi[p], bh[p], hi[p + 1], bh[p + 1]);
                    }
                } else {
                    for p in 0..4 {
                        l = $dot(l, lo[p], bl[p]);
                        h = $dot(h, hi[p], bh[p]);
                    }
                }
                if split {
                    (l, h)
                } else {
                    (_mm256_add_epi32(l, h), z)
                }
            }

            /// [`codes`], with signed values moved to unsigned bytes where [`flipped`].
            ///
            /// # Safety
            /// As [`codes`].
            #[target_feature(enable = $feat)]
            #[inline]
            unsafe fn unsigned_codes<const F: u8>(rec: *const u8) -> ([__m256i; 4], [__m256i; 4]) {
                // SAFETY: as the caller guarantees.
                let (mut lo, mut hi) = unsafe { codes::<F>(rec) };
                if flipped(P::from_id(F)) {
                    let flip = _mm256_set1_epi8(i8::MIN);
                    for p in 0..4 {
                        lo[p] = _mm256_xor_si256(lo[p], flip);
                        hi[p] = _mm256_xor_si256(hi[p], flip);
                    }
                }
                (lo, hi)
            }

            #[target_feature(enable = $feat)]
            #[inline]
            unsafe fn tile<const F: u8, const NT: usize>(
                g: *const u8,
                nb: usize,
                xs: &[QRow<'_>],
                out: *mut f32,
                stride: usize,
            ) {
                let f = P::from_id(F);
                let rec_len = f.record_bytes();
                let mut acc = [_mm256_setzero_ps(); NT];
                let q: [*const i8; NT] = std::array::from_fn(|t| xs[t].q.as_ptr());
                let meta: [*const f32; NT] = std::array::from_fn(|t| xs[t].meta.as_ptr());
                let sums: [*const i32; NT] = std::array::from_fn(|t| xs[t].sums.as_ptr());
                let abs = |v: &[__m256i; 4]| -> [__m256i; 4] {
                    std::array::from_fn(|p| _mm256_sign_epi8(v[p], v[p]))
                };
                if !f.is_super() {
                    for b in 0..nb {
                        // SAFETY (whole body): record b and each token's block b exist.
                        unsafe {
                            let rec = g.add(b * rec_len);
                            let dw = _mm256_cvtph_ps(_mm_loadu_si128(rec.cast()));
                            let mn = if f.has_min() {
                                _mm256_cvtph_ps(_mm_loadu_si128(rec.add(16).cast()))
                            } else {
                                _mm256_setzero_ps()
                            };
                            let (lo, hi) = unsigned_codes::<F>(rec);
                            let (alo, ahi) = if sign_trick(f) {
                                (abs(&lo), abs(&hi))
                            } else {
                                (lo, hi)
                            };
                            for t in 0..NT {
                                let qa = q[t].add(b * BLOCK_CODES);
                                let sa = sums[t].add(SUMS * b);
                                let (i, _) = record_dots::<F>(&lo, &hi, &alo, &ahi, qa, sa, false);
                                let m = meta[t].add(2 * b);
                                let sc = _mm256_mul_ps(dw, _mm256_broadcast_ss(&*m));
                                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), sc, acc[t]);
                                if f.has_min() {
                                    acc[t] = _mm256_fmadd_ps(
                                        mn,
                                        _mm256_broadcast_ss(&*m.add(1)),
                                        acc[t],
                                    );
                                }
                            }
                        }
                    }
                } else {
                    let hdr = f.super_header_bytes();
                    let per_super = hdr + 8 * rec_len;
                    for s in 0..nb / 8 {
                        // SAFETY (whole body): super-block s's header and records and each
                        // token's blocks exist (caller).
                        unsafe {
                            let h = g.add(s * per_super);
                            let mut sacc = [_mm256_setzero_ps(); NT];
                            let mut macc = [_mm256_setzero_ps(); NT];
                            for j in 0..8 {
                                let b = 8 * s + j;
                                let rec = h.add(hdr + j * rec_len);
                                let b0 = _mm256_cvtepi8_epi32(_mm_loadl_epi64(rec.cast()));
                                let b1 = _mm256_cvtepi8_epi32(_mm_loadl_epi64(rec.add(8).cast()));
                                // Q2_K: scale and minimum nibbles of one byte per half.
                                let (sc0, sc1, mn0, mn1) = if matches!(f, P::Q2K) {
                                    let u0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(rec.cast()));
                                    let u1 =
                                        _mm256_cvtepu8_epi32(_mm_loadl_epi64(rec.add(8).cast()));
                                    let m4 = _mm256_set1_epi32(0xF);
                                    (
                                        _mm256_and_si256(u0, m4),
                                        _mm256_and_si256(u1, m4),
                                        _mm256_srli_epi32::<4>(u0),
                                        _mm256_srli_epi32::<4>(u1),
                                    )
                                } else {
                                    (b0, b1, b1, b1)
                                };
                                let mnf = _mm256_cvtepi32_ps(mn0);
                                let (lo, hi) = unsigned_codes::<F>(rec);
                                let (alo, ahi) = if sign_trick(f) {
                                    (abs(&lo), abs(&hi))
                                } else {
                                    (lo, hi)
                                };
                                for t in 0..NT {
                                    let qa = q[t].add(b * BLOCK_CODES);
                                    let sa = sums[t].add(SUMS * b);
                                    let m = meta[t].add(2 * b);
                                    let dx = _mm256_broadcast_ss(&*m);
                                    let scaled = if f.sub16() {
                                        let (il, ih) =
                                            record_dots::<F>(&lo, &hi, &alo, &ahi, qa, sa, true);
                                        _mm256_add_epi32(
                                            _mm256_mullo_epi32(il, sc0),
                                            _mm256_mullo_epi32(ih, sc1),
                                        )
                                    } else {
                                        let (i, _) =
                                            record_dots::<F>(&lo, &hi, &alo, &ahi, qa, sa, false);
                                        _mm256_mullo_epi32(i, sc0)
                                    };
                                    sacc[t] =
                                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(scaled), dx, sacc[t]);
                                    if matches!(f, P::Q2K) {
                                        // Minimum times the halves' code sums, negated.
                                        let neg = _mm256_add_epi32(
                                            _mm256_mullo_epi32(mn0, _mm256_set1_epi32(*sa)),
                                            _mm256_mullo_epi32(mn1, _mm256_set1_epi32(*sa.add(1))),
                                        );
                                        macc[t] =
                                            _mm256_fnmadd_ps(_mm256_cvtepi32_ps(neg), dx, macc[t]);
                                    } else if f.has_min() {
                                        let sq = _mm256_broadcast_ss(&*m.add(1));
                                        macc[t] = _mm256_fmadd_ps(mnf, sq, macc[t]);
                                    }
                                }
                            }
                            let d = _mm256_cvtph_ps(_mm_loadu_si128(h.cast()));
                            for t in 0..NT {
                                acc[t] = _mm256_fmadd_ps(sacc[t], d, acc[t]);
                            }
                            if f.has_min() {
                                let dmin = _mm256_cvtph_ps(_mm_loadu_si128(h.add(16).cast()));
                                for t in 0..NT {
                                    acc[t] = _mm256_fnmadd_ps(macc[t], dmin, acc[t]);
                                }
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
    };
}

/// `acc + Σ₄ u·s` through `vpmaddubsw` (pairs, 16-bit) and `vpmaddwd` (pairs again, 32-bit).
#[target_feature(enable = "avx2")]
#[inline]
fn dot_avx2(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
    _mm256_add_epi32(acc, p)
}

/// Two pairs whose 16-bit pair sums may be added before widening (codes below 64).
#[target_feature(enable = "avx2")]
#[inline]
fn dot2_avx2(acc: __m256i, u1: __m256i, s1: __m256i, u2: __m256i, s2: __m256i) -> __m256i {
    let p = _mm256_add_epi16(_mm256_maddubs_epi16(u1, s1), _mm256_maddubs_epi16(u2, s2));
    _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)))
}

/// `acc + Σ₄ u·s` in one `vpdpbusd` (AVX-VNNI).
#[target_feature(enable = "avx2,avxvnni")]
#[inline]
fn dot_avxvnni(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    _mm256_dpbusd_avx_epi32(acc, u, s)
}

/// Two pairs through two `vpdpbusd` (AVX-VNNI).
#[target_feature(enable = "avx2,avxvnni")]
#[inline]
fn dot2_avxvnni(acc: __m256i, u1: __m256i, s1: __m256i, u2: __m256i, s2: __m256i) -> __m256i {
    _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(acc, u1, s1), u2, s2)
}

/// `acc + Σ₄ u·s` in one `vpdpbusd` (AVX-512 VNNI on 256-bit vectors).
#[target_feature(enable = "avx2,avx512vnni,avx512vl")]
#[inline]
fn dot_avx512vnni(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(acc, u, s)
}

/// Two pairs through two `vpdpbusd` (AVX-512 VNNI).
#[target_feature(enable = "avx2,avx512vnni,avx512vl")]
#[inline]
fn dot2_avx512vnni(acc: __m256i, u1: __m256i, s1: __m256i, u2: __m256i, s2: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(acc, u1, s1), u2, s2)
}

tile_set!(avx2, "avx2,fma,f16c", dot_avx2, dot2_avx2, false, 8);
tile_set!(
    avxvnni,
    "avx2,fma,f16c,avxvnni",
    dot_avxvnni,
    dot2_avxvnni,
    true,
    8
);
tile_set!(
    avx512vnni,
    "avx2,fma,f16c,avx512vnni,avx512vl",
    dot_avx512vnni,
    dot2_avx512vnni,
    true,
    4
);
