//! The portable kernels: the reference every SIMD kernel is tested against.

use super::*;
use crate::backend::cpu::packed::{row_codes, row_scales};
use crate::backend::cpu::quant::QK;

/// The eight rows' dot products with one token, for any format, from the packed layout read
/// back ([`row_codes`], [`row_scales`]): per block and 16-column half, the integer dot of the
/// codes times the half's effective scale, minus its minimum times the half's activation sum.
pub fn dot8(fmt: PackedFormat, g: &[u8], nb: usize, x: &QRow<'_>) -> [f32; GROUP] {
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
