//! Integer kernels: one packed group of eight weight rows ([`super::packed`]) against up to
//! [`MAX_TOKENS`] rows of 8-bit activations ([`super::quant`]).
//!
//! For block `b`, row `r` and token `t` the kernels add `dw·dx·Σ u·q` (the integer dot of
//! the codes, exact, a code offset removed in the integer domain) and, for formats with a
//! minimum, `m·sq` (the minimum times the block's activation sum `sq = dx·Σq`).
//!
//! Each 32-bit lane of a packed code vector holds four codes of one row, so one multiply-add
//! (`vpmaddubsw` + `vpmaddwd` on AVX2, `vpdpbusd` on VNNI) with four activation codes
//! broadcast gives all eight rows' partial sums at once, and the scales, the correction and the
//! accumulation are one vector operation each for the whole group. Every format (5-bit and
//! 6-bit codes in bit planes, the K-quants' super-blocks with their integer sub-block scales,
//! the IQ4 table) on every x86 instruction set runs in `wide`'s one tile; `scalar` is the
//! portable reference.
//!
//! Batch invariance: each token has its own accumulator and sees the same operations in the
//! same order whatever the number of tokens beside it, so a token's result does not depend on
//! its batch; rows are never split, so neither does it depend on the thread count.

use super::isa::Isa;
use super::packed::{GROUP, PackedFormat};
use super::quant::{BLOCK_CODES, QK, QRow};

/// Tokens one kernel call takes (each weight block is unpacked once per pass of a tile over
/// them; a tile may take fewer at once and pass again).
pub const MAX_TOKENS: usize = 8;

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
    let len = fmt.group_bytes(nb * QK);
    assert!(xs.len() <= MAX_TOKENS && g.len() >= groups * len);
    debug_assert!(xs.iter().all(|x| x.q.len() >= nb * BLOCK_CODES));
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` is only returned after detecting AVX2, FMA and F16C; sizes as
        // the caller guarantees.
        Isa::Avx2 => unsafe { wide::avx2::group_dot(fmt, g, groups, nb, xs, out, stride) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::AvxVnni` is only returned after detecting AVX-VNNI beside AVX2.
        Isa::AvxVnni => unsafe { wide::avxvnni::group_dot(fmt, g, groups, nb, xs, out, stride) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx512Vnni` is only returned after detecting AVX-512 VNNI and VL.
        Isa::Avx512Vnni => unsafe {
            wide::avx512vnni::group_dot(fmt, g, groups, nb, xs, out, stride);
        },
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

mod scalar;

#[cfg(target_arch = "x86_64")]
mod wide;

#[cfg(test)]
// Test data: small counts and indices, exact in every cast.
#[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
mod tests {
    use super::*;
    use crate::backend::cpu::packed::{PackedMatrix, random_blocks};
    use crate::backend::cpu::pool::ComputePool;
    use crate::backend::cpu::quant::{QActs, QK};
    use crate::model::gguf::GgufFile;
    use crate::model::testing::{FixtureRng, GgufBuilder};

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
        for fmt in PackedFormat::ALL {
            let dtype = fmt.dtype();
            let ks: &[usize] = if fmt.is_super() {
                &[256, 1536]
            } else {
                &[32, 96, 576, 1536]
            };
            for &k in ks {
                let mut rng = FixtureRng::new(k as u64 + 7);
                let mut b = GgufBuilder::new();
                let w = random_blocks(dtype, 8, k, k as u64 + 3, 0.05);
                b.tensor_raw("w", &[8, k], dtype.ggml_id(), &w);
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
        for fmt in PackedFormat::ALL {
            let dtype = fmt.dtype();
            let k = if fmt.is_super() { 512 } else { 576 };
            let mut rng = FixtureRng::new(31);
            let mut b = GgufBuilder::new();
            b.tensor_raw(
                "w",
                &[8, k],
                dtype.ggml_id(),
                &random_blocks(dtype, 8, k, 5, 0.05),
            );
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
