//! AVX2 building blocks shared by the kernels: a vector `exp` and horizontal reductions.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

/// `exp(x)`, 8 lanes, within 2 ulp (Cephes' `expf` polynomial after a reduction by ln 2).
/// Anything below −87 (masked scores are −∞) gives exactly 0; anything above 88 gives +∞.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub fn exp(x: __m256) -> __m256 {
    let zero_below = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(-87.0));
    let inf_above = _mm256_cmp_ps::<_CMP_GT_OQ>(x, _mm256_set1_ps(88.0));
    let x = _mm256_min_ps(
        _mm256_max_ps(x, _mm256_set1_ps(-87.0)),
        _mm256_set1_ps(88.0),
    );
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm256_set1_ps(1.987_569_1e-4);
    for c in [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        0.166_666_65,
        0.5,
    ] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let p = _mm256_fmadd_ps(
        _mm256_mul_ps(p, r),
        r,
        _mm256_add_ps(r, _mm256_set1_ps(1.0)),
    );
    // 2^n in two halves, so that n = 128 (x near 88.7) does not overflow the exponent field.
    let ni = _mm256_cvtps_epi32(n);
    let half = _mm256_srai_epi32::<1>(ni);
    let pow = |k: __m256i| {
        _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
            k,
            _mm256_set1_epi32(127),
        )))
    };
    let e = _mm256_mul_ps(_mm256_mul_ps(p, pow(half)), pow(_mm256_sub_epi32(ni, half)));
    let e = _mm256_blendv_ps(e, _mm256_set1_ps(f32::INFINITY), inf_above);
    _mm256_andnot_ps(zero_below, e)
}

/// The largest lane.
///
/// # Safety
/// The CPU must have AVX2.
#[target_feature(enable = "avx2")]
#[inline]
pub fn hmax(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
}

/// The sum of the lanes (in a fixed order).
///
/// # Safety
/// The CPU must have AVX2.
#[target_feature(enable = "avx2")]
#[inline]
pub fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vector_exp_is_within_a_few_ulp_and_saturates_outside_its_range() {
        if !is_x86_feature_detected!("avx2") || !is_x86_feature_detected!("fma") {
            eprintln!("NOT RUN: avx2 exp (this CPU lacks the instructions)");
            return;
        }
        let one = |x: f32| {
            let mut out = [0f32; 8];
            // SAFETY: AVX2 and FMA were detected.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr(), exp(_mm256_set1_ps(x))) };
            out[0]
        };
        let mut x = -87.0f32;
        while x <= 88.0 {
            let want = x.exp();
            let got = one(x);
            assert!(
                (got - want).abs() <= 4.0 * f32::EPSILON * want,
                "exp({x}) = {got} vs {want}"
            );
            x += 0.0137;
        }
        assert_eq!(one(f32::NEG_INFINITY), 0.0);
        assert_eq!(one(-100.0), 0.0);
        assert_eq!(one(100.0), f32::INFINITY);
    }
}
