//! The machine's memory read bandwidth with the compute pool's threads: the limit batch-1
//! decode runs against (it streams every weight once per token).

use std::time::Instant;

use super::isa::{self, Isa};
use super::pool::{ComputePool, share};

/// Bytes read per pass: far larger than any cache of the machines we run on.
const BYTES: usize = 256 << 20;

/// Read bandwidth in GB/s: the best of five passes over a 256 MiB buffer, each thread of
/// `pool` reading its own contiguous share with the widest loads the CPU has, the way the
/// decode kernels stream weights.
#[allow(clippy::cast_precision_loss)]
pub fn read_bandwidth_gbs(pool: &ComputePool) -> f64 {
    let buf: Vec<u64> = (0..BYTES / 8).map(|i| i as u64).collect();
    let parts = pool.threads();
    let isa = isa::detect();
    let mut best = 0f64;
    for _ in 0..5 {
        let t = Instant::now();
        pool.run(parts, &|p| {
            let (a, b) = share(buf.len(), p, parts);
            std::hint::black_box(read(isa, &buf[a..b]));
        });
        best = best.max(BYTES as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    best
}

/// Reads every byte of `x` (a value depending on all of them, so nothing is skipped).
fn read(isa: Isa, x: &[u64]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: `isa.avx2()` holds only after detecting AVX2.
        return unsafe { read_avx2(x) };
    }
    let _ = isa;
    let mut acc = [0u64; 8];
    for c in x.chunks_exact(8) {
        for i in 0..8 {
            acc[i] ^= c[i];
        }
    }
    acc.iter().fold(0, |a, b| a ^ b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn read_avx2(x: &[u64]) -> u64 {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_setzero_si256(); 4];
    for c in x.chunks_exact(16) {
        for (i, a) in acc.iter_mut().enumerate() {
            // SAFETY: four u64s at 4·i of a 16-value chunk.
            *a = _mm256_xor_si256(*a, unsafe {
                _mm256_loadu_si256(c.as_ptr().add(4 * i).cast())
            });
        }
    }
    let v = _mm256_xor_si256(
        _mm256_xor_si256(acc[0], acc[1]),
        _mm256_xor_si256(acc[2], acc[3]),
    );
    let mut out = [0u64; 4];
    // SAFETY: four u64s.
    unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), v) };
    out.iter().fold(0, |a, b| a ^ b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_reads_the_same_value() {
        let x: Vec<u64> = (0..4096u64)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        let want = x.iter().fold(0, |a, b| a ^ b);
        for isa in Isa::available() {
            assert_eq!(read(isa, &x), want, "{isa:?}");
        }
    }
}
