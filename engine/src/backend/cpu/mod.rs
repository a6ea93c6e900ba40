//! The CPU backend: quantized SIMD kernels, paged f16 KV cache, threads over weight rows.

pub mod attention;
pub mod dot;
pub mod isa;
pub mod kv;
pub mod matmul;
pub mod ops;
pub mod quant;

use std::sync::Arc;
use std::time::Instant;

use rayon::prelude::*;

use self::attention::{TokenCtx, attend};
use self::isa::Isa;
use self::kv::KvStore;
use self::matmul::{Input, matmul, needs_quantized};
use self::quant::QActs;
use super::{Backend, BackendError, SeqChunk, StepStats};
use crate::model::config::{ModelConfig, RopeStyle};
use crate::model::llama::LlamaWeights;
use crate::model::weights::Tensor;

/// Scratch buffers reused across steps.
#[derive(Default)]
struct Scratch {
    x: Vec<f32>,
    h: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    o: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    qa: QActs,
    rope: Vec<(f32, f32)>,
    positions: Vec<usize>,
    logit_rows: Vec<usize>,
    last_h: Vec<f32>,
}

/// Runs a Llama-family model on the CPU.
pub struct CpuBackend {
    cfg: ModelConfig,
    weights: Arc<LlamaWeights>,
    kv: KvStore,
    inv_freq: Vec<f32>,
    isa: Isa,
    pool: Arc<rayon::ThreadPool>,
    s: Scratch,
}

#[derive(Clone, Copy)]
struct SendPtr(*mut f32);

impl SendPtr {
    /// The pointer (a method, so closures capture the whole `Send` wrapper).
    fn get(self) -> *mut f32 {
        self.0
    }
}
// SAFETY: attention tasks write disjoint (token, head-group) slices.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

impl CpuBackend {
    /// A backend over `weights` with a KV cache of `kv_blocks` blocks of `block_size` positions,
    /// computing on `pool`.
    pub fn new(
        cfg: ModelConfig,
        weights: Arc<LlamaWeights>,
        block_size: usize,
        kv_blocks: usize,
        pool: Arc<rayon::ThreadPool>,
    ) -> Self {
        let inv_freq = cfg.rope_inv_freq(weights.rope_freqs.as_deref());
        let kv = KvStore::new(
            cfg.layers,
            cfg.kv_heads,
            cfg.head_dim,
            block_size,
            kv_blocks,
        );
        Self {
            cfg,
            weights,
            kv,
            inv_freq,
            isa: isa::detect(),
            pool,
            s: Scratch::default(),
        }
    }

    /// Uses a specific ISA (tests compare kernels).
    pub fn with_isa(mut self, isa: Isa) -> Self {
        self.isa = isa;
        self
    }

    /// The KV storage's size in bytes.
    pub fn kv_bytes(&self) -> usize {
        self.kv.bytes_per_token() * self.kv.block_size() * self.kv.blocks()
    }

    fn mm(isa: Isa, w: &Tensor, x: &[f32], qa: &QActs, rows: usize, out: &mut Vec<f32>) {
        out.resize(rows * w.rows(), 0.0);
        let input = Input {
            x,
            q: needs_quantized(w).then_some(qa),
            rows,
            k: w.row_len(),
        };
        matmul(isa, w, &input, out);
    }

    fn quantize_if_needed(qa: &mut QActs, x: &[f32], rows: usize, k: usize, ws: &[&Tensor]) {
        if ws.iter().any(|w| needs_quantized(w)) {
            qa.quantize(x, rows, k);
        }
    }

    fn run(&mut self, chunks: &[SeqChunk<'_>], logits: &mut Vec<f32>) -> Result<(), BackendError> {
        let cfg = &self.cfg;
        let w = &*self.weights;
        let s = &mut self.s;
        let isa = self.isa;
        let (hd, nh, nkv) = (cfg.head_dim, cfg.heads, cfg.kv_heads);
        let (h, qd, kvd) = (cfg.hidden, cfg.q_dim(), cfg.kv_dim());
        let bs = self.kv.block_size();
        // Validate and flatten.
        let total: usize = chunks.iter().map(|c| c.tokens.len()).sum();
        s.positions.clear();
        let mut ctxs: Vec<TokenCtx<'_>> = Vec::with_capacity(total);
        for c in chunks {
            let end = c.start_pos + c.tokens.len();
            if c.tokens.is_empty() || end > cfg.context || end > c.blocks.len() * bs {
                return Err(BackendError::Invalid(format!(
                    "chunk of {} tokens at {} with {} blocks (context {})",
                    c.tokens.len(),
                    c.start_pos,
                    c.blocks.len(),
                    cfg.context
                )));
            }
            if let Some(&b) = c.blocks.iter().find(|&&b| b as usize >= self.kv.blocks()) {
                return Err(BackendError::Invalid(format!("block {b} out of range")));
            }
            if let Some(&t) = c.tokens.iter().find(|&&t| t as usize >= cfg.vocab) {
                return Err(BackendError::Invalid(format!(
                    "token {t} out of vocabulary"
                )));
            }
            for i in 0..c.tokens.len() {
                s.positions.push(c.start_pos + i);
                ctxs.push(TokenCtx {
                    pos: c.start_pos + i,
                    blocks: c.blocks,
                });
            }
        }
        // Embedding.
        s.x.resize(total * h, 0.0);
        let mut t = 0;
        for c in chunks {
            for &tok in c.tokens {
                w.embed
                    .dequantize_row(tok as usize, &mut s.x[t * h..(t + 1) * h]);
                t += 1;
            }
        }
        ops::rope_table(&s.positions, &self.inv_freq, &mut s.rope);
        let neox = cfg.rope_style == RopeStyle::Neox;
        let kv = &mut self.kv;
        for (l, blk) in w.blocks.iter().enumerate() {
            s.h.resize(total * h, 0.0);
            ops::rms_norm(&s.x, &blk.attn_norm, cfg.rms_eps, &mut s.h);
            Self::quantize_if_needed(&mut s.qa, &s.h, total, h, &[&blk.wq, &blk.wk, &blk.wv]);
            Self::mm(isa, &blk.wq, &s.h, &s.qa, total, &mut s.q);
            Self::mm(isa, &blk.wk, &s.h, &s.qa, total, &mut s.k);
            Self::mm(isa, &blk.wv, &s.h, &s.qa, total, &mut s.v);
            if let (Some(bq), Some(bk), Some(bv)) = (&blk.bq, &blk.bk, &blk.bv) {
                ops::add_bias(&mut s.q, bq);
                ops::add_bias(&mut s.k, bk);
                ops::add_bias(&mut s.v, bv);
            }
            ops::rope(&mut s.q, nh, hd, &s.rope, neox);
            ops::rope(&mut s.k, nkv, hd, &s.rope, neox);
            for (ti, ctx) in ctxs.iter().enumerate() {
                let block = ctx.blocks[ctx.pos / bs] as usize;
                kv.write(
                    block,
                    ctx.pos % bs,
                    l,
                    &s.k[ti * kvd..(ti + 1) * kvd],
                    &s.v[ti * kvd..(ti + 1) * kvd],
                );
            }
            // Attention, parallel over (token, kv head).
            s.attn.resize(total * qd, 0.0);
            let group = nh / nkv;
            let out = SendPtr(s.attn.as_mut_ptr());
            let q = &s.q;
            let kv_ref: &KvStore = kv;
            let ctxs_ref = &ctxs;
            self.pool.install(|| {
                (0..total * nkv).into_par_iter().for_each_init(
                    || (Vec::new(), Vec::new()),
                    |(scores, buf), item| {
                        let (ti, g) = (item / nkv, item % nkv);
                        let off = ti * qd + g * group * hd;
                        // SAFETY: each (token, kv head) item owns its own output slice.
                        let o = unsafe {
                            std::slice::from_raw_parts_mut(out.get().add(off), group * hd)
                        };
                        attend(
                            kv_ref,
                            l,
                            g,
                            ctxs_ref[ti],
                            &q[off..off + group * hd],
                            hd,
                            o,
                            scores,
                            buf,
                        );
                    },
                );
            });
            Self::quantize_if_needed(&mut s.qa, &s.attn, total, qd, &[&blk.wo]);
            Self::mm(isa, &blk.wo, &s.attn, &s.qa, total, &mut s.o);
            ops::add_in_place(&mut s.x, &s.o);
            ops::rms_norm(&s.x, &blk.ffn_norm, cfg.rms_eps, &mut s.h);
            Self::quantize_if_needed(&mut s.qa, &s.h, total, h, &[&blk.w_gate, &blk.w_up]);
            Self::mm(isa, &blk.w_gate, &s.h, &s.qa, total, &mut s.gate);
            Self::mm(isa, &blk.w_up, &s.h, &s.qa, total, &mut s.up);
            ops::silu_mul(&mut s.gate, &s.up);
            Self::quantize_if_needed(&mut s.qa, &s.gate, total, cfg.ffn, &[&blk.w_down]);
            Self::mm(isa, &blk.w_down, &s.gate, &s.qa, total, &mut s.o);
            ops::add_in_place(&mut s.x, &s.o);
        }
        // Logits only for the rows asked for.
        s.logit_rows.clear();
        let mut t0 = 0;
        for c in chunks {
            let n = c.tokens.len();
            let rows = c.logit_rows();
            s.logit_rows.extend(t0 + n - rows..t0 + n);
            t0 += n;
        }
        let rows = s.logit_rows.len();
        if rows > 0 {
            s.last_h.resize(rows * h, 0.0);
            for (i, &r) in s.logit_rows.iter().enumerate() {
                ops::rms_norm(
                    &s.x[r * h..(r + 1) * h],
                    &w.norm,
                    cfg.rms_eps,
                    &mut s.last_h[i * h..(i + 1) * h],
                );
            }
            Self::quantize_if_needed(&mut s.qa, &s.last_h, rows, h, &[&w.output]);
            let start = logits.len();
            logits.resize(start + rows * cfg.vocab, 0.0);
            let input = Input {
                x: &s.last_h,
                q: needs_quantized(&w.output).then_some(&s.qa),
                rows,
                k: h,
            };
            let out = &mut logits[start..];
            self.pool.install(|| matmul(isa, &w.output, &input, out));
        }
        Ok(())
    }
}

impl Backend for CpuBackend {
    fn forward(
        &mut self,
        chunks: &[SeqChunk<'_>],
        logits: &mut Vec<f32>,
    ) -> Result<StepStats, BackendError> {
        let started = Instant::now();
        let pool = Arc::clone(&self.pool);
        pool.install(|| self.run(chunks, logits))?;
        Ok(StepStats {
            device_time: started.elapsed(),
        })
    }

    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn block_size(&self) -> usize {
        self.kv.block_size()
    }

    fn num_blocks(&self) -> usize {
        self.kv.blocks()
    }

    fn describe(&self) -> String {
        format!(
            "cpu ({} kernels, {} threads, KV {} blocks × {} positions, {:.0} MiB)",
            self.isa.name(),
            self.pool.current_num_threads(),
            self.kv.blocks(),
            self.kv.block_size(),
            bytes_to_mib(self.kv_bytes())
        )
    }
}

#[allow(clippy::cast_precision_loss)]
fn bytes_to_mib(b: usize) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}
