//! Run-time CPU feature detection for the kernels.

use std::sync::OnceLock;

/// The instruction set the quantized kernels use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// AVX-512 (F, BW, VL): one 32-weight block per 16-bit multiply-add.
    Avx512,
    /// AVX2 with FMA and F16C.
    Avx2,
    /// Portable Rust, no SIMD assumptions.
    Scalar,
}

impl Isa {
    /// Display name.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx512 => "avx512",
            Isa::Avx2 => "avx2-fma",
            Isa::Scalar => "scalar",
        }
    }

    /// Every ISA this CPU can run, best first (used by tests to compare kernels).
    pub fn available() -> Vec<Isa> {
        let best = detect_uncached();
        [Isa::Avx512, Isa::Avx2, Isa::Scalar]
            .into_iter()
            .filter(|i| i.rank() <= best.rank())
            .collect()
    }

    fn rank(self) -> u8 {
        match self {
            Isa::Avx512 => 2,
            Isa::Avx2 => 1,
            Isa::Scalar => 0,
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn detect_uncached() -> Isa {
    if let Ok(forced) = std::env::var("SLOTLIGHT_ISA") {
        match forced.as_str() {
            "scalar" => return Isa::Scalar,
            "avx2" if std::arch::is_x86_feature_detected!("avx2") => return Isa::Avx2,
            _ => {}
        }
    }
    let avx2 = std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c");
    let avx512 = avx2
        && std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl");
    if avx512 {
        Isa::Avx512
    } else if avx2 {
        Isa::Avx2
    } else {
        Isa::Scalar
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect_uncached() -> Isa {
    Isa::Scalar
}

/// The best ISA of this CPU (detected once; `SLOTLIGHT_ISA=scalar|avx2` forces a lower one).
pub fn detect() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(detect_uncached)
}
