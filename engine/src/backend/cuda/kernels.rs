//! The device kernels, as CUDA C++ source generated for one model shape and compiled at run
//! time with NVRTC.
//!
//! The model's dimensions are baked in as `#define`s so loops have constant bounds and register
//! arrays constant sizes. The kernel bodies use a small portable subset (no headers, helpers for
//! f16 conversion and warp shuffles from a prelude) so the same text can also be compiled as
//! host C++ for the kernel emulator ([`Target::Host`]).
//!
//! Batch invariance: every output of the matvec kernels (one weight row × one token) is reduced
//! in an order fixed by the row length alone (each lane walks its units in order, then a fixed
//! xor tree), and the attention for one token depends only on that token's position; so a
//! token's numbers do not depend on which other tokens share its step.

use std::fmt::Write as _;

use super::layout::{self, MV_TOKENS, MV_WARPS, ROW_THREADS, WFormat};
use crate::model::config::{ModelConfig, RopeStyle};
use crate::model::weights::IQ4_VALUES;

/// What the source is compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// NVRTC (CUDA C++).
    Cuda,
    /// A host C++ compiler, with the emulator's runtime (tests).
    Host,
}

/// The model shape the kernels are generated for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelConfig {
    /// Hidden size.
    pub hidden: usize,
    /// Query width.
    pub q_dim: usize,
    /// Key/value width.
    pub kv_dim: usize,
    /// Head size.
    pub head_dim: usize,
    /// Query heads.
    pub heads: usize,
    /// KV heads.
    pub kv_heads: usize,
    /// Feed-forward size.
    pub ffn: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// KV positions per block.
    pub block_size: usize,
    /// RoPE pairing.
    pub neox: bool,
    /// Warps per attention block.
    pub att_warps: usize,
    /// Weight formats to instantiate the matvec kernels for.
    pub formats: Vec<WFormat>,
}

impl KernelConfig {
    /// The configuration for `cfg` with `block_size` positions per KV block, or why the kernels
    /// cannot run this shape.
    pub fn for_model(
        cfg: &ModelConfig,
        block_size: usize,
        formats: Vec<WFormat>,
    ) -> Result<Self, String> {
        let kc = Self {
            hidden: cfg.hidden,
            q_dim: cfg.q_dim(),
            kv_dim: cfg.kv_dim(),
            head_dim: cfg.head_dim,
            heads: cfg.heads,
            kv_heads: cfg.kv_heads,
            ffn: cfg.ffn,
            layers: cfg.layers,
            block_size,
            neox: cfg.rope_style == RopeStyle::Neox,
            att_warps: layout::attn_warps(cfg.heads / cfg.kv_heads.max(1), cfg.head_dim),
            formats,
        };
        kc.check()?;
        Ok(kc)
    }

    fn check(&self) -> Result<(), String> {
        for (what, n) in [
            ("hidden size", self.hidden),
            ("query width", self.q_dim),
            ("feed-forward size", self.ffn),
        ] {
            if n == 0 || !n.is_multiple_of(layout::QK) {
                return Err(format!("{what} {n} is not a multiple of {}", layout::QK));
            }
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(8) || self.head_dim > 256 {
            return Err(format!(
                "head size {} must be a multiple of 8 and at most 256",
                self.head_dim
            ));
        }
        if self.kv_heads == 0
            || !self.heads.is_multiple_of(self.kv_heads)
            || self.heads / self.kv_heads > 16
        {
            return Err(format!(
                "{} heads over {} KV heads (at most 16 per KV head)",
                self.heads, self.kv_heads
            ));
        }
        if self.block_size == 0 || self.block_size > 1024 {
            return Err(format!("KV block size {} is out of range", self.block_size));
        }
        Ok(())
    }

    /// Query heads per KV head.
    pub fn group(&self) -> usize {
        self.heads / self.kv_heads
    }

    /// Row pairs of the fused QKV matrix.
    pub fn qkv_pairs(&self) -> usize {
        (self.q_dim + 2 * self.kv_dim) / 2
    }

    /// Every kernel the generated source defines, by name.
    pub fn kernel_names(&self) -> Vec<String> {
        let mut v: Vec<String> = [
            "attn",
            "rmsnorm_h",
            "qkv_post",
            "to_half",
            "silu_mul_h",
            "qkv_heads",
            "postnorm_add",
        ]
        .iter()
        .map(|s| (*s).to_string())
        .collect();
        for f in &self.formats {
            for k in MV_KERNELS {
                v.push(format!("{k}_f{}", f.id()));
            }
        }
        v
    }
}

/// The per-format kernels.
pub const MV_KERNELS: [&str; 7] = [
    "mv_qkv",
    "mv_qkv_raw",
    "mv_silu",
    "mv_resid",
    "mv_logits",
    "embed",
    "dequant_h",
];

/// The name of per-format kernel `kind` for `fmt`.
pub fn fmt_kernel(kind: &str, fmt: WFormat) -> String {
    format!("{kind}_f{}", fmt.id())
}

const CUDA_PRELUDE: &str = r#"
#define KERNEL extern "C" __global__
#define DEV static __device__ __forceinline__
#define SHARED __shared__
typedef unsigned long long u64;
DEV float h2f(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
DEV unsigned short f2h(float f) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
DEV float warp_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 16); v += __shfl_xor_sync(0xffffffffu, v, 8);
  v += __shfl_xor_sync(0xffffffffu, v, 4); v += __shfl_xor_sync(0xffffffffu, v, 2);
  v += __shfl_xor_sync(0xffffffffu, v, 1); return v;
}
DEV float warp_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 16)); v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 8));
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4)); v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1)); return v;
}
DEV float shfl_from(float v, int lane) { return __shfl_sync(0xffffffffu, v, lane); }
/* A product that is never fused into a following add (weights decode exactly as on the host). */
DEV float mul_rn(float a, float b) { return __fmul_rn(a, b); }
#define SYNC() __syncthreads()
#define NEG_INF __int_as_float(0xff800000)
#define TX threadIdx.x
#define BX blockIdx.x
#define BY blockIdx.y
"#;

const HOST_PRELUDE: &str = r#"
#include <cmath>
#include <cstdint>
#include <cstring>
#include "emu_runtime.h"
#define KERNEL extern "C"
#define DEV static inline
#define SHARED static
typedef unsigned long long u64;
DEV float h2f(unsigned short h) { _Float16 x; std::memcpy(&x, &h, 2); return (float)x; }
DEV unsigned short f2h(float f) { _Float16 x = (_Float16)f; unsigned short h; std::memcpy(&h, &x, 2); return h; }
DEV float warp_sum(float v) {
  v += emu_shfl_xor(v, 16); v += emu_shfl_xor(v, 8); v += emu_shfl_xor(v, 4);
  v += emu_shfl_xor(v, 2); v += emu_shfl_xor(v, 1); return v;
}
DEV float warp_max(float v) {
  v = fmaxf(v, emu_shfl_xor(v, 16)); v = fmaxf(v, emu_shfl_xor(v, 8)); v = fmaxf(v, emu_shfl_xor(v, 4));
  v = fmaxf(v, emu_shfl_xor(v, 2)); v = fmaxf(v, emu_shfl_xor(v, 1)); return v;
}
DEV float shfl_from(float v, int lane) { return emu_shfl(v, lane); }
DEV float mul_rn(float a, float b) { return a * b; }
#define SYNC() emu_syncthreads()
#define NEG_INF (-INFINITY)
#define TX emu_thread_x()
#define BX emu_block_x()
#define BY emu_block_y()
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
struct float4 { float x, y, z, w; };
"#;

/// The kernels (shape constants come from the `#define`s written before this).
const BODY: &str = r#"
#define FMT_Q4_0 0
#define FMT_Q4_1 1
#define FMT_Q8_0 2
#define FMT_F16 3
#define FMT_F32 4
#define FMT_Q5_0 5
#define FMT_Q5_1 6
#define FMT_IQ4_NL 7
#define FMT_Q2_K 8
#define FMT_Q3_K 9
#define FMT_Q4_K 10
#define FMT_Q5_K 11
#define FMT_Q6_K 12
#define FMT_IQ4_XS 13
#define NPAIRS ((QD + 2 * KVD) / 2)
#define DPL ((HD + 31) / 32)

/* A KV pool holds `layers` layers (every layer, only the global ones, or only the local ones in
   the window pool); `layer` is the index within it. */
DEV u64 kv_off(int block, int layer, int layers, int kind, int head) {
  return ((((u64)block * layers + layer) * 2 + kind) * KVH + head) * (u64)(BS * HD);
}

/* The table of IQ4_NL and IQ4_XS: entry i is byte i of IQ4_LO (i < 8) or of IQ4_HI. */
DEV float iq4_value(int i) {
  const u64 t = i < 8 ? IQ4_LO : IQ4_HI;
  return (float)(signed char)(unsigned char)((t >> (8 * (i & 7))) & 0xffu);
}

/* load_unit for the formats after Q8_0 (layout::load_unit's generic arm, line by line): codes
   from the 4-bit nibbles (+ high bits) or the 2-bit planes (+ a third bit), then each half's
   scale and minimum from the block's or the super-block's header. */
template <int FMT>
DEV void load_unit_sub(const unsigned char* __restrict__ w, int nrows, int K, int r, int u,
                       float* wv, int& o0, int& o1) {
  const int nb = K / 32, b = u >> 2, sub = u & 3;
  const u64 blk = (u64)r * nb + b;
  const int CB = FMT_CB(FMT), BITS = FMT_BITS(FMT);
  const unsigned char* c = w + blk * CB;
  const unsigned char* hdr = w + (((u64)nrows * nb * CB + 15) & ~15ull);
  unsigned q[8];
  if (BITS >= 4) {
    const unsigned n = *(const unsigned*)(c + sub * 4);
    for (int i = 0; i < 4; ++i) { q[i] = (n >> (8 * i)) & 15u; q[4 + i] = (n >> (8 * i + 4)) & 15u; }
  } else {
    const unsigned l = *(const unsigned short*)(c + 2 * sub);
    for (int e = 0; e < 8; ++e) q[e] = (l >> (2 * e)) & 3u;
  }
  if (BITS == 5) {
    const unsigned h = *(const unsigned*)(c + 16);
    for (int i = 0; i < 4; ++i) {
      q[i] |= ((h >> (4 * sub + i)) & 1u) << 4;
      q[4 + i] |= ((h >> (16 + 4 * sub + i)) & 1u) << 4;
    }
  } else if (BITS == 6) {
    const unsigned h = *(const unsigned short*)(c + 16 + 2 * sub);
    for (int e = 0; e < 8; ++e) q[e] |= ((h >> (2 * e)) & 3u) << 4;
  } else if (BITS == 3) {
    const unsigned h = c[8 + sub];
    for (int e = 0; e < 8; ++e) q[e] |= ((h >> e) & 1u) << 2;
  }
  float s[2], m[2];
  if (FMT_SUPER(FMT)) {
    const unsigned char* sh = hdr + (blk >> 3) * FMT_HB(FMT);
    const int j = (int)(blk & 7);
    const float d = h2f(*(const unsigned short*)sh), dm = h2f(*(const unsigned short*)(sh + 2));
    for (int h = 0; h < 2; ++h) {
      if (FMT == FMT_Q4_K || FMT == FMT_Q5_K) {
        s[h] = mul_rn(d, (float)sh[4 + j]); m[h] = mul_rn(dm, (float)sh[12 + j]);
      } else if (FMT == FMT_Q2_K) {
        const unsigned x = sh[4 + 2 * j + h];
        s[h] = mul_rn(d, (float)(x & 15u)); m[h] = mul_rn(dm, (float)(x >> 4));
      } else if (FMT == FMT_IQ4_XS) {
        s[h] = mul_rn(d, (float)(signed char)sh[4 + j]); m[h] = 0.0f;
      } else {
        s[h] = mul_rn(d, (float)(signed char)sh[4 + 2 * j + h]); m[h] = 0.0f;
      }
    }
  } else {
    const unsigned short* hh = (const unsigned short*)(hdr + blk * FMT_HB(FMT));
    s[0] = s[1] = h2f(hh[0]);
    m[0] = m[1] = FMT == FMT_Q5_1 ? -h2f(hh[1]) : 0.0f;
  }
  for (int e = 0; e < 8; ++e) {
    const float code = FMT_TABLE(FMT) ? iq4_value((int)q[e]) : (float)((int)q[e] - FMT_OFF(FMT));
    wv[e] = mul_rn(s[e >> 2], code) - m[e >> 2];
  }
  o0 = b * 32 + sub * 4; o1 = o0 + 16;
}

/* The 8 weights of unit u (a quarter of a 32-weight block) of row r, in f32, and the columns
   of the first and last four: o0..o0+3 and o1..o1+3. */
template <int FMT>
DEV void load_unit(const unsigned char* __restrict__ w, int nrows, int K, int r, int u,
                   float* wv, int& o0, int& o1) {
  if (FMT == FMT_F32) {
    const float4* p = (const float4*)(w + ((u64)r * K + (u64)u * 8) * 4);
    float4 a = p[0], b = p[1];
    wv[0] = a.x; wv[1] = a.y; wv[2] = a.z; wv[3] = a.w;
    wv[4] = b.x; wv[5] = b.y; wv[6] = b.z; wv[7] = b.w;
    o0 = u * 8; o1 = u * 8 + 4;
  } else if (FMT == FMT_F16) {
    uint4 v = *(const uint4*)(w + ((u64)r * K + (u64)u * 8) * 2);
    unsigned q[4] = {v.x, v.y, v.z, v.w};
    for (int i = 0; i < 4; ++i) {
      wv[2 * i] = h2f((unsigned short)(q[i] & 0xffffu));
      wv[2 * i + 1] = h2f((unsigned short)(q[i] >> 16));
    }
    o0 = u * 8; o1 = u * 8 + 4;
  } else if (FMT >= FMT_Q5_0) {
    load_unit_sub<FMT>(w, nrows, K, r, u, wv, o0, o1);
  } else {
    const int nb = K / 32;
    const int b = u >> 2, sub = u & 3;
    const u64 blk = (u64)r * nb + b;
    if (FMT == FMT_Q8_0) {
      uint2 q = *(const uint2*)(w + blk * 32 + sub * 8);
      float d = h2f(*(const unsigned short*)(w + (u64)nrows * nb * 32 + blk * 2));
      unsigned qq[2] = {q.x, q.y};
      for (int i = 0; i < 8; ++i) {
        int c = (int)(signed char)((qq[i >> 2] >> (8 * (i & 3))) & 0xffu);
        wv[i] = d * (float)c;
      }
      o0 = b * 32 + sub * 8; o1 = o0 + 4;
    } else {
      unsigned q = *(const unsigned*)(w + blk * 16 + sub * 4);
      const unsigned char* hdr = w + (u64)nrows * nb * 16;
      if (FMT == FMT_Q4_1) {
        float d = h2f(*(const unsigned short*)(hdr + blk * 4));
        float m = h2f(*(const unsigned short*)(hdr + blk * 4 + 2));
        for (int i = 0; i < 4; ++i) {
          wv[i] = mul_rn(d, (float)((q >> (8 * i)) & 15u)) + m;
          wv[4 + i] = mul_rn(d, (float)((q >> (8 * i + 4)) & 15u)) + m;
        }
      } else {
        float d = h2f(*(const unsigned short*)(hdr + blk * 2));
        for (int i = 0; i < 4; ++i) {
          wv[i] = d * ((float)((q >> (8 * i)) & 15u) - 8.0f);
          wv[4 + i] = d * ((float)((q >> (8 * i + 4)) & 15u) - 8.0f);
        }
      }
      o0 = b * 32 + sub * 4; o1 = o0 + 16;
    }
  }
}

/* RMSNorm scales of the block's tokens (one warp per token), into rs[]. All threads call. */
DEV void norm_prologue(const float* __restrict__ x, int ldx, const int* __restrict__ xrow,
                       int t0, int nt, int K, float eps, float* rs) {
  const int lane = TX & 31, wid = TX >> 5;
  for (int t = wid; t < nt; t += MV_WARPS) {
    const float* xp = x + (u64)(xrow ? xrow[t0 + t] : t0 + t) * ldx;
    float ss = 0.0f;
    for (int j = lane; j < K; j += 32) ss += xp[j] * xp[j];
    ss = warp_sum(ss);
    if (lane == 0) rs[t] = 1.0f / sqrtf(ss / (float)K + eps);
  }
  SYNC();
}

/* acc[r][t] = row rows[r] . (normalized) x[token t0 + t], summed over the whole warp. The order
   of every sum is fixed by K alone: lanes walk units lane, lane+32, ... and then a xor tree. */
template <int FMT, int NR, bool NORM>
DEV void mv_accum(const unsigned char* __restrict__ w, int nrows, int K, const int* rows,
                  const float* __restrict__ x, int ldx, const int* __restrict__ xrow, int t0, int nt,
                  const float* __restrict__ gamma, const float* rs, float (&acc)[NR][MV_TOKENS]) {
  const int lane = TX & 31;
  const float* xp[MV_TOKENS];
  #pragma unroll
  for (int t = 0; t < MV_TOKENS; ++t) {
    int tt = t < nt ? t : 0;
    xp[t] = x + (u64)(xrow ? xrow[t0 + tt] : t0 + tt) * ldx;
    #pragma unroll
    for (int r = 0; r < NR; ++r) acc[r][t] = 0.0f;
  }
  const int units = K >> 3;
  for (int u = lane; u < units; u += 32) {
    float wv[NR][8];
    int o0 = 0, o1 = 0;
    #pragma unroll
    for (int r = 0; r < NR; ++r) load_unit<FMT>(w, nrows, K, rows[r], u, wv[r], o0, o1);
    float g[8];
    if (NORM) {
      float4 g0 = *(const float4*)(gamma + o0), g1 = *(const float4*)(gamma + o1);
      g[0] = g0.x; g[1] = g0.y; g[2] = g0.z; g[3] = g0.w;
      g[4] = g1.x; g[5] = g1.y; g[6] = g1.z; g[7] = g1.w;
    }
    #pragma unroll
    for (int t = 0; t < MV_TOKENS; ++t) {
      if (t < nt) {
        float4 a = *(const float4*)(xp[t] + o0), b = *(const float4*)(xp[t] + o1);
        float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        if (NORM) {
          const float s = rs[t];
          #pragma unroll
          for (int i = 0; i < 8; ++i) xv[i] = (xv[i] * s) * g[i];
        }
        #pragma unroll
        for (int r = 0; r < NR; ++r)
          #pragma unroll
          for (int i = 0; i < 8; ++i) acc[r][t] += wv[r][i] * xv[i];
      }
    }
  }
  /* Only live tokens are reduced (nt is the same for the whole warp): a batch-1 step pays
     for one token's shuffles, not eight. */
  #pragma unroll
  for (int t = 0; t < MV_TOKENS; ++t)
    if (t < nt) {
      #pragma unroll
      for (int r = 0; r < NR; ++r) acc[r][t] = warp_sum(acc[r][t]);
    }
}

/* Lane t picks token t's value (keeps the register array statically indexed). */
template <int NR>
DEV float pick(const float (&acc)[NR][MV_TOKENS], int r, int lane) {
  float v = 0.0f;
  #pragma unroll
  for (int t = 0; t < MV_TOKENS; ++t) if (t == lane) v = acc[r][t];
  return v;
}

/* The rows of QKV pair p (mirrors layout::pair_rows). sec: 0 q, 1 k, 2 v; fi: RoPE index. */
DEV void pair_rows(int p, int& r0, int& r1, int& sec, int& fi) {
  int pp, base;
  if (p < QD / 2) { sec = 0; pp = p; base = 0; }
  else if (p < (QD + KVD) / 2) { sec = 1; pp = p - QD / 2; base = QD; }
  else { sec = 2; pp = p - (QD + KVD) / 2; base = QD + KVD; }
  const int head = pp / (HD / 2), i = pp % (HD / 2);
  fi = i;
  if (sec < 2 && ROPE_NEOX) { r0 = base + head * HD + i; r1 = r0 + HD / 2; }
  else { r0 = base + head * HD + 2 * i; r1 = r0 + 1; }
}

/* Bias, RoPE, then the query to q_out or the key/value to the paged cache, for global row g.
   The cache is a pool of kv_layers layers; row g's block table is tabs + tabs[g] (the full
   pool's tables in meta, or the window pool's in their own buffer). */
DEV void qkv_store(int g, int p, float v0, float v1, const float* __restrict__ bias,
                   float* __restrict__ q_out, unsigned short* __restrict__ kv, int layer,
                   int kv_layers, const int* __restrict__ meta, int metaT,
                   const int* __restrict__ tabs, const float* __restrict__ inv_freq) {
  int r0, r1, sec, fi;
  pair_rows(p, r0, r1, sec, fi);
  if (bias) { v0 += bias[r0]; v1 += bias[r1]; }
  const int pos = meta[metaT + g];
  if (sec < 2) {
    const float theta = (float)((double)pos * (double)inv_freq[fi]);
    float s, c;
    sincosf(theta, &s, &c);
    const float a = v0 * c - v1 * s, b = v0 * s + v1 * c;
    v0 = a; v1 = b;
  }
  if (sec == 0) {
    q_out[(u64)g * QD + r0] = v0;
    q_out[(u64)g * QD + r1] = v1;
  } else {
    const int* table = tabs + tabs[g];
    const int block = table[pos / BS], slot = pos % BS;
    const int c0 = r0 - (sec == 1 ? QD : QD + KVD), c1 = r1 - (sec == 1 ? QD : QD + KVD);
    const int head = c0 / HD;
    unsigned short* dst = kv + kv_off(block, layer, kv_layers, sec - 1, head) + (u64)slot * HD;
    dst[c0 % HD] = f2h(v0);
    dst[c1 % HD] = f2h(v1);
  }
}

/* Fused RMSNorm -> [Wq; Wk; Wv] (+bias) -> RoPE -> q / KV cache, rows row0 .. row0+T, for the
   pairs p0 .. p1 of one section: w holds the fused matrix's rows rbase .. rbase + nrows (the
   whole matrix when Q, K and V share a format; else one launch per run of equal formats).
   With RAW (QK norm needs whole heads), the products go to raw[row, :] instead, for qkv_heads
   to finish (a template flag: the epilogue kernel keeps its registers). */
template <int FMT, bool RAW>
DEV void mv_qkv_body(const unsigned char* __restrict__ w, int nrows, int rbase, int p0, int p1,
                     const float* __restrict__ x, int T,
                     const float* __restrict__ gamma, float eps, const float* __restrict__ bias,
                     float* __restrict__ q_out, unsigned short* __restrict__ kv, int layer,
                     int kv_layers, const int* __restrict__ meta, int metaT,
                     const int* __restrict__ tabs, int row0,
                     const float* __restrict__ inv_freq, float* __restrict__ raw) {
  SHARED float rs[MV_TOKENS];
  const int t0 = BY * MV_TOKENS, nt = min(MV_TOKENS, T - t0);
  norm_prologue(x, HIDDEN, 0, t0, nt, HIDDEN, eps, rs);
  const int lane = TX & 31;
  const int p = p0 + BX * MV_WARPS + (TX >> 5);
  const int pc = p < p1 ? p : p1 - 1;
  int rows[2], sec, fi;
  pair_rows(pc, rows[0], rows[1], sec, fi);
  rows[0] -= rbase; rows[1] -= rbase;
  float acc[2][MV_TOKENS];
  mv_accum<FMT, 2, true>(w, nrows, HIDDEN, rows, x, HIDDEN, 0, t0, nt, gamma, rs, acc);
  if (p < p1 && lane < nt) {
    const float v0 = pick<2>(acc, 0, lane), v1 = pick<2>(acc, 1, lane);
    if (RAW) {
      int r0, r1, sr, fr;
      pair_rows(p, r0, r1, sr, fr);
      float* d = raw + (u64)(row0 + t0 + lane) * (QD + 2 * KVD);
      d[r0] = v0;
      d[r1] = v1;
    } else {
      qkv_store(row0 + t0 + lane, p, v0, v1, bias, q_out, kv, layer, kv_layers, meta, metaT, tabs,
                inv_freq);
    }
  }
}

/* The gate's activation: SiLU, or (gelu set) GELU with the tanh approximation (the CPU's
   ops::gelu_tanh_mul computes the same function as x / (1 + e^(-2z))). */
DEV float gate_act(float g, int gelu) {
  if (gelu) {
    const float t = tanhf(0.7978846f * g * (1.0f + 0.044715f * g * g));
    return 0.5f * g * (1.0f + t);
  }
  return g / (1.0f + expf(-g));
}

/* Fused RMSNorm -> [Wgate; Wup] -> act(gate) * up. */
template <int FMT>
DEV void mv_silu_body(const unsigned char* __restrict__ w, const float* __restrict__ x, int T,
                      const float* __restrict__ gamma, float eps, float* __restrict__ out,
                      int gelu) {
  SHARED float rs[MV_TOKENS];
  const int t0 = BY * MV_TOKENS, nt = min(MV_TOKENS, T - t0);
  norm_prologue(x, HIDDEN, 0, t0, nt, HIDDEN, eps, rs);
  const int lane = TX & 31;
  const int r = BX * MV_WARPS + (TX >> 5);
  const int rc = r < FFN ? r : FFN - 1;
  int rows[2] = {rc, FFN + rc};
  float acc[2][MV_TOKENS];
  mv_accum<FMT, 2, true>(w, 2 * FFN, HIDDEN, rows, x, HIDDEN, 0, t0, nt, gamma, rs, acc);
  if (r < FFN && lane < nt) {
    const float g = pick<2>(acc, 0, lane), u = pick<2>(acc, 1, lane);
    out[(u64)(t0 + lane) * FFN + r] = gate_act(g, gelu) * u;
  }
}

/* out[t, :] += W x[t, :] (the output and down projections into the residual stream), or with
   add 0, out[t, :] = W x[t, :] (a sub-layer output that is post-normed first). */
template <int FMT>
DEV void mv_resid_body(const unsigned char* __restrict__ w, int N, int K,
                       const float* __restrict__ x, int T, float* __restrict__ out, int add) {
  const int lane = TX & 31;
  const int t0 = BY * MV_TOKENS, nt = min(MV_TOKENS, T - t0);
  const int r = (BX * MV_WARPS + (TX >> 5)) * 2;
  int rows[2] = {min(r, N - 1), min(r + 1, N - 1)};
  float acc[2][MV_TOKENS];
  mv_accum<FMT, 2, false>(w, N, K, rows, x, K, 0, t0, nt, 0, 0, acc);
  if (lane < nt) {
    float* o = out + (u64)(t0 + lane) * N;
    if (r < N) o[r] = (add ? o[r] : 0.0f) + pick<2>(acc, 0, lane);
    if (r + 1 < N) o[r + 1] = (add ? o[r + 1] : 0.0f) + pick<2>(acc, 1, lane);
  }
}

/* cap * tanh(v / cap); cap 0: v. */
DEV float softcap(float v, float cap) { return cap > 0.0f ? cap * tanhf(v / cap) : v; }

/* Final RMSNorm of the rows listed in meta's logit section -> output projection (-> capped). */
template <int FMT>
DEV void mv_logits_body(const unsigned char* __restrict__ w, int N, const float* __restrict__ x,
                        const int* __restrict__ meta, int metaT, int R,
                        const float* __restrict__ gamma, float eps, float* __restrict__ out,
                        float cap) {
  SHARED float rs[MV_TOKENS];
  const int* xrow = meta + 3 * metaT;
  const int t0 = BY * MV_TOKENS, nt = min(MV_TOKENS, R - t0);
  norm_prologue(x, HIDDEN, xrow, t0, nt, HIDDEN, eps, rs);
  const int lane = TX & 31;
  const int r = (BX * MV_WARPS + (TX >> 5)) * 2;
  int rows[2] = {min(r, N - 1), min(r + 1, N - 1)};
  float acc[2][MV_TOKENS];
  mv_accum<FMT, 2, true>(w, N, HIDDEN, rows, x, HIDDEN, xrow, t0, nt, gamma, rs, acc);
  if (lane < nt) {
    float* o = out + (u64)(t0 + lane) * N;
    if (r < N) o[r] = softcap(pick<2>(acc, 0, lane), cap);
    if (r + 1 < N) o[r + 1] = softcap(pick<2>(acc, 1, lane), cap);
  }
}

/* x[t, :] = embedding row of token meta[t] * scale. One block per token. */
template <int FMT>
DEV void embed_body(const unsigned char* __restrict__ w, int nrows, const int* __restrict__ meta,
                    float* __restrict__ x, float scale) {
  const int t = BX, tok = meta[t];
  for (int u = TX; u < HIDDEN / 8; u += ROW_THREADS) {
    float wv[8];
    int o0, o1;
    load_unit<FMT>(w, nrows, HIDDEN, tok, u, wv, o0, o1);
    for (int i = 0; i < 4; ++i) {
      x[(u64)t * HIDDEN + o0 + i] = wv[i] * scale;
      x[(u64)t * HIDDEN + o1 + i] = wv[4 + i] * scale;
    }
  }
}

/* A packed matrix to f16, row-major (the GEMM path's weights; run once at load). */
template <int FMT>
DEV void dequant_h_body(const unsigned char* __restrict__ w, int nrows, int K,
                        unsigned short* __restrict__ out) {
  const int r = BX;
  for (int u = TX; u < K / 8; u += ROW_THREADS) {
    float wv[8];
    int o0, o1;
    load_unit<FMT>(w, nrows, K, r, u, wv, o0, o1);
    for (int i = 0; i < 4; ++i) {
      out[(u64)r * K + o0 + i] = f2h(wv[i]);
      out[(u64)r * K + o1 + i] = f2h(wv[4 + i]);
    }
  }
}

/* Causal attention of token BX over its sequence's paged cache, for the query heads of KV head
   BY. Warps take 32-position tiles round robin with an online softmax; partial results are
   merged in warp order, so the result depends only on the token's position. With window > 0
   only the last window positions are seen (pos - p < window), and no position before them is
   read (in the window pool their blocks are given back: their table entries are -1); with
   cap > 0 the scaled scores become cap * tanh(score / cap). The cache is a pool of kv_layers
   layers, and token t's block table is tabs + tabs[t]. */
KERNEL void attn(const float* __restrict__ q, float* __restrict__ out,
                 const unsigned short* __restrict__ kv, int layer, int kv_layers,
                 const int* __restrict__ meta, int metaT, const int* __restrict__ tabs,
                 float scale, int window, float cap) {
  SHARED float qs[GRP * HD];
  SHARED float sm_m[ATT_WARPS * GRP];
  SHARED float sm_l[ATT_WARPS * GRP];
  SHARED float sm_acc[ATT_WARPS * GRP * HD];
  const int t = BX, g = BY, lane = TX & 31, wid = TX >> 5;
  const int pos = meta[metaT + t];
  const int* table = tabs + tabs[t];
  const int n = pos + 1;
  const int lo = window > 0 && n > window ? n - window : 0;
  for (int i = TX; i < GRP * HD; i += ATT_WARPS * 32) qs[i] = q[(u64)t * QD + g * GRP * HD + i];
  SYNC();
  float m[GRP], l[GRP], acc[GRP][DPL];
  for (int j = 0; j < GRP; ++j) {
    m[j] = NEG_INF; l[j] = 0.0f;
    for (int k = 0; k < DPL; ++k) acc[j][k] = 0.0f;
  }
  for (int tile = lo / 32 + wid; tile * 32 < n; tile += ATT_WARPS) {
    const int p = tile * 32 + lane;
    const bool valid = p >= lo && p < n;
    float s[GRP];
    if (valid) {
      const unsigned short* krow = kv + kv_off(table[p / BS], layer, kv_layers, 0, g) + (u64)(p % BS) * HD;
      for (int j = 0; j < GRP; ++j) s[j] = 0.0f;
      for (int d = 0; d < HD; d += 8) {
        uint4 kk = *(const uint4*)(krow + d);
        unsigned qq[4] = {kk.x, kk.y, kk.z, kk.w};
        float kf[8];
        for (int e = 0; e < 4; ++e) {
          kf[2 * e] = h2f((unsigned short)(qq[e] & 0xffffu));
          kf[2 * e + 1] = h2f((unsigned short)(qq[e] >> 16));
        }
        for (int j = 0; j < GRP; ++j)
          for (int e = 0; e < 8; ++e) s[j] += qs[j * HD + d + e] * kf[e];
      }
      for (int j = 0; j < GRP; ++j) s[j] = softcap(s[j] * scale, cap);
    } else {
      for (int j = 0; j < GRP; ++j) s[j] = NEG_INF;
    }
    float pl[GRP];
    for (int j = 0; j < GRP; ++j) {
      const float mn = fmaxf(m[j], warp_max(s[j]));
      const float corr = expf(m[j] - mn);
      pl[j] = valid ? expf(s[j] - mn) : 0.0f;
      l[j] = l[j] * corr + warp_sum(pl[j]);
      for (int k = 0; k < DPL; ++k) acc[j][k] *= corr;
      m[j] = mn;
    }
    const int cnt = min(32, n - tile * 32);
    /* A tile that starts before the window starts reading at its low end: the positions
       before it have weight 0, and their blocks may be given back. */
    for (int jj = max(lo - tile * 32, 0); jj < cnt; ++jj) {
      const int pp = tile * 32 + jj;
      const unsigned short* vrow =
          kv + kv_off(table[pp / BS], layer, kv_layers, 1, g) + (u64)(pp % BS) * HD;
      float vv[DPL];
      for (int k = 0; k < DPL; ++k) {
        const int d = lane + 32 * k;
        vv[k] = d < HD ? h2f(vrow[d]) : 0.0f;
      }
      for (int j = 0; j < GRP; ++j) {
        const float pj = shfl_from(pl[j], jj);
        for (int k = 0; k < DPL; ++k) acc[j][k] += pj * vv[k];
      }
    }
  }
  for (int j = 0; j < GRP; ++j) {
    if (lane == 0) { sm_m[wid * GRP + j] = m[j]; sm_l[wid * GRP + j] = l[j]; }
    for (int k = 0; k < DPL; ++k) {
      const int d = lane + 32 * k;
      if (d < HD) sm_acc[(wid * GRP + j) * HD + d] = acc[j][k];
    }
  }
  SYNC();
  for (int i = TX; i < GRP * HD; i += ATT_WARPS * 32) {
    const int j = i / HD, d = i % HD;
    float mx = NEG_INF;
    for (int ww = 0; ww < ATT_WARPS; ++ww) mx = fmaxf(mx, sm_m[ww * GRP + j]);
    float L = 0.0f, o = 0.0f;
    for (int ww = 0; ww < ATT_WARPS; ++ww) {
      const float e = expf(sm_m[ww * GRP + j] - mx);
      L += sm_l[ww * GRP + j] * e;
      o += sm_acc[(ww * GRP + j) * HD + d] * e;
    }
    out[(u64)t * QD + (g * GRP + j) * HD + d] = o / L;
  }
}

/* GEMM path: RMSNorm of rows to f16 (one block per row). */
KERNEL void rmsnorm_h(const float* __restrict__ x, const float* __restrict__ gamma, float eps,
                      unsigned short* __restrict__ out) {
  SHARED float part[ROW_THREADS / 32];
  const int r = BX, lane = TX & 31, wid = TX >> 5;
  const float* xp = x + (u64)r * HIDDEN;
  float ss = 0.0f;
  for (int j = TX; j < HIDDEN; j += ROW_THREADS) ss += xp[j] * xp[j];
  ss = warp_sum(ss);
  if (lane == 0) part[wid] = ss;
  SYNC();
  float tot = 0.0f;
  for (int i = 0; i < ROW_THREADS / 32; ++i) tot += part[i];
  const float s = 1.0f / sqrtf(tot / (float)HIDDEN + eps);
  for (int j = TX; j < HIDDEN; j += ROW_THREADS) out[(u64)r * HIDDEN + j] = f2h((xp[j] * s) * gamma[j]);
}

/* GEMM path: bias, RoPE and stores of the fused QKV product (rows x NPAIRS threads). */
KERNEL void qkv_post(const float* __restrict__ qkv, int rows, const float* __restrict__ bias,
                     float* __restrict__ q_out, unsigned short* __restrict__ kv, int layer,
                     int kv_layers, const int* __restrict__ meta, int metaT,
                     const int* __restrict__ tabs, int row0,
                     const float* __restrict__ inv_freq) {
  const long long i = (long long)BX * ROW_THREADS + TX;
  if (i >= (long long)rows * NPAIRS) return;
  const int r = (int)(i / NPAIRS), p = (int)(i % NPAIRS);
  int r0, r1, sec, fi;
  pair_rows(p, r0, r1, sec, fi);
  const float* src = qkv + (u64)r * (QD + 2 * KVD);
  qkv_store(row0 + r, p, src[r0], src[r1], bias, q_out, kv, layer, kv_layers, meta, metaT, tabs,
            inv_freq);
}

/* GEMM path: f32 to f16. */
KERNEL void to_half(const float* __restrict__ src, unsigned short* __restrict__ dst, int n) {
  const long long i = (long long)BX * ROW_THREADS + TX;
  if (i < n) dst[i] = f2h(src[i]);
}

/* GEMM path: act(gate) * up from the fused [rows, 2 FFN] product, to f16. */
KERNEL void silu_mul_h(const float* __restrict__ gu, unsigned short* __restrict__ out, int rows,
                       int gelu) {
  const long long i = (long long)BX * ROW_THREADS + TX;
  if (i >= (long long)rows * FFN) return;
  const long long r = i / FFN, c = i % FFN;
  const float g = gu[r * 2 * FFN + c], u = gu[r * 2 * FFN + FFN + c];
  out[i] = f2h(gate_act(g, gelu) * u);
}

/* Bias, per-head RMSNorm (QK norm: q heads by qn, k heads by kn; none when null), RoPE and
   stores of whole heads of fused QKV rows src[0 .. rows) (global rows row0 ..), one block per
   (row, head of q, k or v). */
KERNEL void qkv_heads(const float* __restrict__ src, int rows, int row0,
                      const float* __restrict__ bias, const float* __restrict__ qn,
                      const float* __restrict__ kn, float eps, float* __restrict__ q_out,
                      unsigned short* __restrict__ kv, int layer, int kv_layers,
                      const int* __restrict__ meta, int metaT, const int* __restrict__ tabs,
                      const float* __restrict__ inv_freq) {
  SHARED float hv[HD];
  SHARED float rs[1];
  const int QH = QD / HD, KH = KVD / HD, NH = QH + 2 * KH;
  const int r = BX / NH, hh = BX % NH;
  if (r >= rows) return;
  const int sec = hh < QH ? 0 : (hh < QH + KH ? 1 : 2);
  const int c0 = hh * HD; /* q, k and v heads follow each other in the fused row */
  const float* s = src + (u64)r * (QD + 2 * KVD) + c0;
  for (int d = TX; d < HD; d += ROW_THREADS) hv[d] = s[d] + (bias ? bias[c0 + d] : 0.0f);
  SYNC();
  const float* nw = sec == 0 ? qn : (sec == 1 ? kn : (const float*)0);
  if (nw && TX < 32) {
    float ss = 0.0f;
    for (int d = TX; d < HD; d += 32) ss += hv[d] * hv[d];
    ss = warp_sum(ss);
    if (TX == 0) rs[0] = 1.0f / sqrtf(ss / (float)HD + eps);
  }
  SYNC();
  for (int i = TX; i < HD / 2; i += ROW_THREADS) {
    const int p = c0 / 2 + i;
    int r0, r1, sc, fi;
    pair_rows(p, r0, r1, sc, fi);
    float v0 = hv[r0 - c0], v1 = hv[r1 - c0];
    if (nw) { v0 = (v0 * rs[0]) * nw[r0 - c0]; v1 = (v1 * rs[0]) * nw[r1 - c0]; }
    qkv_store(row0 + r, p, v0, v1, (const float*)0, q_out, kv, layer, kv_layers, meta, metaT, tabs,
              inv_freq);
  }
}

/* x[r, :] += rmsnorm(o[r, :]) * gamma (a post-normed sub-layer output joining the residual;
   one block per row). */
KERNEL void postnorm_add(const float* __restrict__ o, const float* __restrict__ gamma, float eps,
                         float* __restrict__ x) {
  SHARED float part[ROW_THREADS / 32];
  const int r = BX, lane = TX & 31, wid = TX >> 5;
  const float* op = o + (u64)r * HIDDEN;
  float ss = 0.0f;
  for (int j = TX; j < HIDDEN; j += ROW_THREADS) ss += op[j] * op[j];
  ss = warp_sum(ss);
  if (lane == 0) part[wid] = ss;
  SYNC();
  float tot = 0.0f;
  for (int i = 0; i < ROW_THREADS / 32; ++i) tot += part[i];
  const float s = 1.0f / sqrtf(tot / (float)HIDDEN + eps);
  for (int j = TX; j < HIDDEN; j += ROW_THREADS) x[(u64)r * HIDDEN + j] += (op[j] * s) * gamma[j];
}
"#;

/// The per-format constants of the generic unit loader, as `FMT_*(f)` macros over the format
/// id (from [`WFormat::kernel_params`], so the kernels and the host twins share one table), and
/// the IQ4 table from [`IQ4_VALUES`].
fn format_defines() -> String {
    let mut s = String::new();
    let chain = |name: &str, val: &dyn Fn(WFormat) -> i64| {
        let mut c = format!("#define {name}(f) (");
        for f in WFormat::ALL {
            let _ = write!(c, "(f) == {} ? {} : ", f.id(), val(f));
        }
        c.push_str("0)\n");
        c
    };
    s.push_str(&chain("FMT_CB", &|f| {
        i64::try_from(f.kernel_params().0).unwrap_or(0)
    }));
    s.push_str(&chain("FMT_HB", &|f| {
        i64::try_from(f.kernel_params().1).unwrap_or(0)
    }));
    s.push_str(&chain("FMT_BITS", &|f| i64::from(f.kernel_params().2)));
    s.push_str(&chain("FMT_OFF", &|f| i64::from(f.kernel_params().3)));
    s.push_str(&chain("FMT_SUPER", &|f| i64::from(f.kernel_params().4)));
    s.push_str(&chain("FMT_TABLE", &|f| i64::from(f.kernel_params().5)));
    let word = |vals: &[i8]| {
        vals.iter()
            .rev()
            .fold(0u64, |a, v| (a << 8) | u64::from(v.cast_unsigned()))
    };
    let _ = writeln!(s, "#define IQ4_LO 0x{:016x}ull", word(&IQ4_VALUES[..8]));
    let _ = writeln!(s, "#define IQ4_HI 0x{:016x}ull", word(&IQ4_VALUES[8..]));
    s
}

/// The kernel source for `kc`, for `target`.
pub fn source(kc: &KernelConfig, target: Target) -> String {
    let mut s = String::with_capacity(24 * 1024);
    let _ = writeln!(
        s,
        "// slotlight CUDA kernels (generated for one model shape)"
    );
    let defines = [
        ("HIDDEN", kc.hidden),
        ("QD", kc.q_dim),
        ("KVD", kc.kv_dim),
        ("HD", kc.head_dim),
        ("KVH", kc.kv_heads),
        ("GRP", kc.group()),
        ("FFN", kc.ffn),
        ("LAYERS", kc.layers),
        ("BS", kc.block_size),
        ("ROPE_NEOX", usize::from(kc.neox)),
        ("ATT_WARPS", kc.att_warps),
        ("MV_TOKENS", MV_TOKENS),
        ("MV_WARPS", MV_WARPS),
        ("ROW_THREADS", ROW_THREADS),
    ];
    for (k, v) in defines {
        let _ = writeln!(s, "#define {k} {v}");
    }
    s.push_str(match target {
        Target::Cuda => CUDA_PRELUDE,
        Target::Host => HOST_PRELUDE,
    });
    if target == Target::Host {
        s.push_str("using std::max;\nusing std::min;\n");
    }
    s.push_str(&format_defines());
    s.push_str(BODY);
    // Entry points per weight format.
    let mv_bounds = MV_WARPS * 32;
    let lb = |n: usize| match target {
        Target::Cuda => format!(" __launch_bounds__({n})"),
        Target::Host => String::new(),
    };
    for f in &kc.formats {
        let id = f.id();
        let b = lb(mv_bounds);
        let r = lb(ROW_THREADS);
        let _ = write!(
            s,
            r#"
KERNEL void{b} mv_qkv_f{id}(const unsigned char* w, int nrows, int rbase, int p0, int p1, const float* x,
    int T, const float* gamma, float eps, const float* bias, float* q_out, unsigned short* kv, int layer,
    int kv_layers, const int* meta, int metaT, const int* tabs, int row0, const float* inv_freq) {{
  mv_qkv_body<{id}, false>(w, nrows, rbase, p0, p1, x, T, gamma, eps, bias, q_out, kv, layer, kv_layers,
                          meta, metaT, tabs, row0, inv_freq, 0);
}}
KERNEL void{b} mv_qkv_raw_f{id}(const unsigned char* w, int nrows, int rbase, int p0, int p1, const float* x,
    int T, const float* gamma, float eps, float* raw) {{
  mv_qkv_body<{id}, true>(w, nrows, rbase, p0, p1, x, T, gamma, eps, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, raw);
}}
KERNEL void{b} mv_silu_f{id}(const unsigned char* w, const float* x, int T, const float* gamma, float eps,
    float* out, int gelu) {{
  mv_silu_body<{id}>(w, x, T, gamma, eps, out, gelu);
}}
KERNEL void{b} mv_resid_f{id}(const unsigned char* w, int N, int K, const float* x, int T, float* out,
    int add) {{
  mv_resid_body<{id}>(w, N, K, x, T, out, add);
}}
KERNEL void{b} mv_logits_f{id}(const unsigned char* w, int N, const float* x, const int* meta, int metaT,
    int R, const float* gamma, float eps, float* out, float cap) {{
  mv_logits_body<{id}>(w, N, x, meta, metaT, R, gamma, eps, out, cap);
}}
KERNEL void{r} embed_f{id}(const unsigned char* w, int nrows, const int* meta, float* x, float scale) {{
  embed_body<{id}>(w, nrows, meta, x, scale);
}}
KERNEL void{r} dequant_h_f{id}(const unsigned char* w, int nrows, int K, unsigned short* out) {{
  dequant_h_body<{id}>(w, nrows, K, out);
}}
"#
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn smollm2() -> KernelConfig {
        KernelConfig {
            hidden: 576,
            q_dim: 576,
            kv_dim: 192,
            head_dim: 64,
            heads: 9,
            kv_heads: 3,
            ffn: 1536,
            layers: 30,
            block_size: 16,
            neox: false,
            att_warps: 8,
            formats: vec![WFormat::Q4_1, WFormat::Q8_0],
        }
    }

    #[test]
    fn source_bakes_the_shape_and_defines_every_kernel() {
        let kc = smollm2();
        let src = source(&kc, Target::Cuda);
        for d in [
            "#define HIDDEN 576",
            "#define QD 576",
            "#define KVD 192",
            "#define HD 64",
            "#define GRP 3",
            "#define FFN 1536",
            "#define LAYERS 30",
            "#define BS 16",
            "#define ROPE_NEOX 0",
            "#define ATT_WARPS 8",
        ] {
            assert!(src.contains(d), "{d}");
        }
        for name in kc.kernel_names() {
            assert!(
                src.contains(&format!(" {name}(")),
                "kernel {name} is not defined"
            );
        }
        assert_eq!(kc.kernel_names().len(), 7 + 2 * MV_KERNELS.len());
        assert!(src.contains("__launch_bounds__(256) mv_qkv_f1("));
        assert!(
            !src.contains("#include"),
            "NVRTC source must need no headers"
        );
        let host = source(&kc, Target::Host);
        assert!(host.contains("emu_syncthreads") && !host.contains("__shfl"));
    }

    #[test]
    fn shapes_the_kernels_cannot_run_are_refused() {
        let mut cfg = ModelConfig {
            arch: crate::model::config::Arch::Llama,
            name: "t".into(),
            vocab: 100,
            hidden: 64,
            layers: 1,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            ffn: 128,
            context: 64,
            rms_eps: 1e-5,
            rope_theta: 1e4,
            rope_style: RopeStyle::Neox,
            rope_scaling: None,
            qkv_bias: false,
            family: Default::default(),
        };
        let kc = KernelConfig::for_model(&cfg, 16, vec![WFormat::F32]).expect("tiny shape");
        assert!(kc.neox);
        assert_eq!(kc.group(), 2);
        assert_eq!(kc.qkv_pairs(), (64 + 2 * 32) / 2);
        cfg.hidden = 48;
        assert!(KernelConfig::for_model(&cfg, 16, vec![]).is_err());
        cfg.hidden = 64;
        cfg.head_dim = 12;
        assert!(KernelConfig::for_model(&cfg, 16, vec![]).is_err());
    }
}
