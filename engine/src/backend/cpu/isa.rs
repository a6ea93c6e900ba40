//! Run-time CPU feature detection for the kernels.

use std::sync::OnceLock;

/// The instruction set the kernels use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// AVX2 with FMA and F16C: 8-bit integer dot products through `vpmaddubsw` + `vpmaddwd`
    /// (32 multiply-adds in two instructions), f32 attention with F16C conversions.
    Avx2,
    /// [`Isa::Avx2`] with AVX-VNNI: the integer dot products in one `vpdpbusd` (VEX encoding).
    AvxVnni,
    /// [`Isa::Avx2`] with AVX-512 VNNI and VL: the same `vpdpbusd` on 256-bit vectors in the
    /// EVEX encoding, whose 32 registers hold a tile's codes and accumulators and whose
    /// embedded broadcasts feed the activations straight from memory: preferred over AVX-VNNI
    /// where both exist (measured on Zen 5: the prefill kernels 25–35% faster). Attention's
    /// block update runs on 512-bit vectors here (AVX-512 F), bit for bit as on AVX2.
    Avx512Vnni,
    /// Portable Rust, no SIMD assumptions: the correctness reference.
    Scalar,
}

/// Every ISA the kernels have, best first.
const ALL: [Isa; 4] = [Isa::Avx512Vnni, Isa::AvxVnni, Isa::Avx2, Isa::Scalar];

impl Isa {
    /// Display name (as `bench --json` reports it).
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx2 => "avx2",
            Isa::AvxVnni => "avx2+avxvnni",
            Isa::Avx512Vnni => "avx2+avx512vnni",
            Isa::Scalar => "scalar",
        }
    }

    /// Whether the AVX2 (with FMA and F16C) kernels may run: every x86 ISA here.
    pub fn avx2(self) -> bool {
        !matches!(self, Isa::Scalar)
    }

    /// Every ISA this CPU can run, best first (used by tests to compare kernels).
    pub fn available() -> Vec<Isa> {
        ALL.into_iter().filter(|i| runs(*i)).collect()
    }

    /// Every ISA the kernels have, with whether this CPU runs it (tests report the ones it
    /// cannot run as not run).
    pub fn all() -> [(Isa, bool); 4] {
        ALL.map(|i| (i, runs(i)))
    }
}

/// Whether this CPU has what `isa` needs.
#[cfg(target_arch = "x86_64")]
fn runs(isa: Isa) -> bool {
    use std::arch::is_x86_feature_detected as has;
    let avx2 = has!("avx2") && has!("fma") && has!("f16c");
    match isa {
        Isa::Scalar => true,
        Isa::Avx2 => avx2,
        Isa::AvxVnni => avx2 && has!("avxvnni"),
        Isa::Avx512Vnni => avx2 && has!("avx512f") && has!("avx512vnni") && has!("avx512vl"),
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn runs(isa: Isa) -> bool {
    isa == Isa::Scalar
}

/// The best ISA of this CPU, or the one `SLOTLIGHT_ISA` names (`scalar`, `avx2`,
/// `avx2+avxvnni`, `avx2+avx512vnni`) when this CPU runs it.
fn detect_uncached() -> Isa {
    let forced = std::env::var("SLOTLIGHT_ISA").ok();
    let wanted = ALL
        .into_iter()
        .find(|i| forced.as_deref() == Some(i.name()));
    match wanted {
        Some(i) if runs(i) => i,
        _ => ALL.into_iter().find(|i| runs(*i)).unwrap_or(Isa::Scalar),
    }
}

/// The best ISA of this CPU (detected once; `SLOTLIGHT_ISA=scalar` forces the portable path,
/// `SLOTLIGHT_ISA=avx2` the kernels without VNNI).
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
