//! The portable kernels: the reference every SIMD kernel is tested against.

use super::*;
use crate::backend::cpu::packed::{row_codes, row_scales};
use crate::backend::cpu::quant::QK;

/// The eight rows' dot products with one token, block by block.
pub fn dot8(fmt: PackedFormat, g: &[u8], nb: usize, x: &QRow<'_>) -> [f32; GROUP] {
    match fmt {
        PackedFormat::Q4_0 | PackedFormat::Q4_1 | PackedFormat::Q8_0 => dot8_basic(fmt, g, nb, x),
        _ => dot8_any(fmt, g, nb, x),
    }
}

/// Any format, from the packed layout read back ([`row_codes`], [`row_scales`]): per block and
/// 16-column half, the integer dot of the codes times the half's effective scale, minus its
/// minimum times the half's activation sum.
fn dot8_any(fmt: PackedFormat, g: &[u8], nb: usize, x: &QRow<'_>) -> [f32; GROUP] {
    let mut acc = [0f32; GROUP];
    for b in 0..nb {
        let q = &x.q[b * BLOCK_CODES..(b + 1) * BLOCK_CODES];
        let dx = x.meta[2 * b];
        // The duplicated layout: codes 0..16 at 0, codes 16..32 at 32.
        let a: [i32; QK] = std::array::from_fn(|j| i32::from(q[j + j / 16 * 16]));
        let hs = [a[..16].iter().sum::<i32>(), a[16..].iter().sum::<i32>()];
        for (i, out) in acc.iter_mut().enumerate() {
            let c = row_codes(fmt, g, b, i);
            let (sc, mn) = row_scales(fmt, g, b, i);
            for h in 0..2 {
                let isum: i32 = (16 * h..16 * h + 16).map(|j| c[j] * a[j]).sum();
                #[allow(clippy::cast_precision_loss)] // |isum| < 2^24: exact
                let v = sc[h] * isum as f32 - mn[h] * hs[h] as f32;
                *out += dx * v;
            }
        }
    }
    acc
}

/// Q4_0, Q4_1 and Q8_0 in the arithmetic of their AVX2 tiles.
fn dot8_basic(fmt: PackedFormat, g: &[u8], nb: usize, x: &QRow<'_>) -> [f32; GROUP] {
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
                    _ => 0.0,
                };
        }
    }
    acc
}
