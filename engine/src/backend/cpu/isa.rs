//! Run-time CPU feature detection for the kernels.

use std::sync::OnceLock;

/// The instruction set the kernels use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// AVX2 with FMA and F16C: 8-bit integer dot products through `vpmaddubsw` (32
    /// multiply-adds an instruction), f32 attention with F16C conversions. Machines with
    /// AVX-512 run this path too.
    Avx2,
    /// Portable Rust, no SIMD assumptions: the correctness reference.
    Scalar,
}

impl Isa {
    /// Display name (as `bench --json` reports it).
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx2 => "avx2",
            Isa::Scalar => "scalar",
        }
    }

    /// Every ISA this CPU can run, best first (used by tests to compare kernels).
    pub fn available() -> Vec<Isa> {
        let best = detect_uncached();
        [Isa::Avx2, Isa::Scalar]
            .into_iter()
            .filter(|i| i.rank() <= best.rank())
            .collect()
    }

    /// Every ISA the kernels have, with whether this CPU runs it (tests report the ones it
    /// cannot run as not run).
    pub fn all() -> [(Isa, bool); 2] {
        let best = detect_uncached();
        [Isa::Avx2, Isa::Scalar].map(|i| (i, i.rank() <= best.rank()))
    }

    fn rank(self) -> u8 {
        match self {
            Isa::Avx2 => 1,
            Isa::Scalar => 0,
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn detect_uncached() -> Isa {
    let avx2 = std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c");
    if std::env::var("SLOTLIGHT_ISA").as_deref() == Ok("scalar") || !avx2 {
        Isa::Scalar
    } else {
        Isa::Avx2
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect_uncached() -> Isa {
    Isa::Scalar
}

/// The best ISA of this CPU (detected once; `SLOTLIGHT_ISA=scalar` forces the portable path).
pub fn detect() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(detect_uncached)
}

/// The SIMD features of this CPU that matter to the kernels, for reports
/// (`avx2 fma f16c avx512f avx512bw avx512vl avx512vnni avxvnni`, those present).
pub fn cpu_features() -> Vec<&'static str> {
    #[allow(unused_mut)]
    let mut out = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! probe {
            ($($f:tt),*) => {$(
                if std::arch::is_x86_feature_detected!($f) {
                    out.push($f);
                }
            )*};
        }
        probe!(
            "avx2",
            "fma",
            "f16c",
            "avx512f",
            "avx512bw",
            "avx512vl",
            "avx512vnni",
            "avxvnni"
        );
    }
    out
}
