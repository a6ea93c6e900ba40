//! The CPU backend: quantized SIMD kernels, paged f16 KV cache, threads over weight rows.

pub mod attention;
pub mod gemm;
pub mod isa;
pub mod kv;
pub mod matmul;
pub mod ops;
pub mod packed;
pub mod pool;
pub mod quant;
pub mod weights;

use std::sync::Arc;
use std::time::Instant;

use self::attention::{Rows, attend};
use self::isa::Isa;
use self::kv::KvStore;
use self::matmul::{Input, Weight, matmul, matmul_many};
use self::pool::ComputePool;
use self::quant::QActs;
use self::weights::CpuWeights;
use super::{Backend, BackendError, SeqChunk, StepStats};
use crate::model::config::{ModelConfig, RopeStyle};
use crate::model::llama::LlamaWeights;

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
    /// Attention work: (chunk, first row, end row) runs of at most [`ATTN_ROWS`] rows.
    attn_items: Vec<(usize, usize, usize)>,
}

/// Query rows per attention work item.
const ATTN_ROWS: usize = 16;

thread_local! {
    static ATTN_SCRATCH: std::cell::RefCell<attention::Scratch> = std::cell::RefCell::new(attention::Scratch::default());
}

/// Runs a Llama-family model on the CPU.
pub struct CpuBackend {
    cfg: ModelConfig,
    weights: Arc<CpuWeights>,
    kv: KvStore,
    inv_freq: Vec<f32>,
    isa: Isa,
    pool: Arc<ComputePool>,
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
    /// A backend over `weights` (packed here) with a KV cache of `kv_blocks` blocks of
    /// `block_size` positions, computing on `pool`.
    pub fn new(
        cfg: ModelConfig,
        weights: Arc<LlamaWeights>,
        block_size: usize,
        kv_blocks: usize,
        pool: Arc<ComputePool>,
    ) -> Self {
        let packed = Arc::new(CpuWeights::new(weights));
        Self::with_weights(cfg, packed, block_size, kv_blocks, pool)
    }

    /// Like [`CpuBackend::new`] over weights packed already (shared by several CPU groups).
    pub fn with_weights(
        cfg: ModelConfig,
        weights: Arc<CpuWeights>,
        block_size: usize,
        kv_blocks: usize,
        pool: Arc<ComputePool>,
    ) -> Self {
        let inv_freq = cfg.rope_inv_freq(weights.model.rope_freqs.as_deref());
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

    /// The ISA the kernels run.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Bytes of weights one decode step reads.
    pub fn weight_bytes_per_step(&self) -> usize {
        self.weights.bytes_per_step()
    }

    /// Runs `ws` (all with row length `k`) over the same `rows` inputs in one parallel pass.
    fn mm(
        pool: &ComputePool,
        isa: Isa,
        ws: &[&Weight],
        x: &[f32],
        qa: &QActs,
        rows: usize,
        outs: &mut [&mut Vec<f32>],
    ) {
        for (w, out) in ws.iter().zip(outs.iter_mut()) {
            out.resize(rows * w.rows(), 0.0);
        }
        let input = Input {
            x,
            q: ws.iter().any(|w| w.needs_quantized()).then_some(qa),
            rows,
            k: ws[0].k(),
        };
        let mut slices: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
        matmul_many(pool, isa, ws, &input, &mut slices);
    }

    #[allow(clippy::too_many_arguments)]
    fn quantize_if_needed(
        pool: &ComputePool,
        isa: Isa,
        qa: &mut QActs,
        x: &[f32],
        rows: usize,
        k: usize,
        ws: &[&Weight],
    ) {
        if ws.iter().any(|w| w.needs_quantized()) {
            qa.quantize(pool, isa, x, rows, k);
        }
    }

    fn run(&mut self, chunks: &[SeqChunk<'_>], logits: &mut Vec<f32>) -> Result<(), BackendError> {
        let cfg = &self.cfg;
        let w = &*self.weights;
        let lw = &*w.model;
        let s = &mut self.s;
        let isa = self.isa;
        let pool = Arc::clone(&self.pool);
        let (hd, nh, nkv) = (cfg.head_dim, cfg.heads, cfg.kv_heads);
        let (h, qd, kvd) = (cfg.hidden, cfg.q_dim(), cfg.kv_dim());
        let bs = self.kv.block_size();
        // Validate and flatten.
        let total: usize = chunks.iter().map(|c| c.tokens.len()).sum();
        s.positions.clear();
        s.attn_items.clear();
        let mut slots: Vec<(usize, &[u32])> = Vec::with_capacity(total);
        for (ci, c) in chunks.iter().enumerate() {
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
            let first = s.positions.len();
            for i in 0..c.tokens.len() {
                s.positions.push(c.start_pos + i);
                slots.push((c.start_pos + i, c.blocks));
            }
            let mut r = first;
            while r < s.positions.len() {
                let end = (r + ATTN_ROWS).min(s.positions.len());
                s.attn_items.push((ci, r, end));
                r = end;
            }
        }
        // Embedding.
        s.x.resize(total * h, 0.0);
        let mut t = 0;
        for c in chunks {
            for &tok in c.tokens {
                lw.embed
                    .dequantize_row(tok as usize, &mut s.x[t * h..(t + 1) * h]);
                t += 1;
            }
        }
        ops::rope_table(&s.positions, &self.inv_freq, &mut s.rope);
        let neox = cfg.rope_style == RopeStyle::Neox;
        let kv = &mut self.kv;
        for (l, (blk, lb)) in w.blocks.iter().zip(&lw.blocks).enumerate() {
            s.h.resize(total * h, 0.0);
            ops::rms_norm(&s.x, &lb.attn_norm, cfg.rms_eps, &mut s.h);
            Self::quantize_if_needed(&pool, isa, &mut s.qa, &s.h, total, h, &[&blk.wq, &blk.wk, &blk.wv]);
            Self::mm(
                &pool,
                isa,
                &[&blk.wq, &blk.wk, &blk.wv],
                &s.h,
                &s.qa,
                total,
                &mut [&mut s.q, &mut s.k, &mut s.v],
            );
            if let (Some(bq), Some(bk), Some(bv)) = (&lb.bq, &lb.bk, &lb.bv) {
                ops::add_bias(&mut s.q, bq);
                ops::add_bias(&mut s.k, bk);
                ops::add_bias(&mut s.v, bv);
            }
            ops::rope(&mut s.q, nh, hd, &s.rope, neox);
            ops::rope(&mut s.k, nkv, hd, &s.rope, neox);
            for (ti, &(pos, blocks)) in slots.iter().enumerate() {
                let block = blocks[pos / bs] as usize;
                kv.write(
                    block,
                    pos % bs,
                    l,
                    &s.k[ti * kvd..(ti + 1) * kvd],
                    &s.v[ti * kvd..(ti + 1) * kvd],
                );
            }
            // Attention, parallel over (sequence, kv head, run of up to 16 query rows).
            s.attn.resize(total * qd, 0.0);
            let group = nh / nkv;
            let out = SendPtr(s.attn.as_mut_ptr());
            let q = &s.q;
            let kv_ref: &KvStore = kv;
            let items = &s.attn_items;
            let positions = &s.positions;
            // Later rows attend to more positions: hand out the costliest items first.
            let n_items = items.len() * nkv;
            pool.run(n_items, &|c| {
                ATTN_SCRATCH.with_borrow_mut(|scratch| {
                    {
                        let item = n_items - 1 - c;
                        let (seq, t0, t1) = items[item / nkv];
                        let g = item % nkv;
                        let rows = Rows {
                            blocks: chunks[seq].blocks,
                            positions: &positions[t0..t1],
                            q: &q[t0 * qd..t1 * qd],
                            stride: qd,
                        };
                        // SAFETY: each (rows, kv head) item writes only its own rows' heads.
                        unsafe {
                            attend(
                                kv_ref,
                                l,
                                g,
                                group,
                                hd,
                                rows,
                                out.get().add(t0 * qd),
                                scratch,
                            )
                        };
                    }
                });
            });
            Self::quantize_if_needed(&pool, isa, &mut s.qa, &s.attn, total, qd, &[&blk.wo]);
            Self::mm(
                &pool,
                isa,
                &[&blk.wo],
                &s.attn,
                &s.qa,
                total,
                &mut [&mut s.o],
            );
            ops::add_in_place(&mut s.x, &s.o);
            ops::rms_norm(&s.x, &lb.ffn_norm, cfg.rms_eps, &mut s.h);
            Self::quantize_if_needed(&pool, isa, &mut s.qa, &s.h, total, h, &[&blk.w_gate, &blk.w_up]);
            Self::mm(
                &pool,
                isa,
                &[&blk.w_gate, &blk.w_up],
                &s.h,
                &s.qa,
                total,
                &mut [&mut s.gate, &mut s.up],
            );
            ops::silu_mul(&mut s.gate, &s.up);
            Self::quantize_if_needed(&pool, isa, &mut s.qa, &s.gate, total, cfg.ffn, &[&blk.w_down]);
            Self::mm(
                &pool,
                isa,
                &[&blk.w_down],
                &s.gate,
                &s.qa,
                total,
                &mut [&mut s.o],
            );
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
                    &lw.norm,
                    cfg.rms_eps,
                    &mut s.last_h[i * h..(i + 1) * h],
                );
            }
            Self::quantize_if_needed(&pool, isa, &mut s.qa, &s.last_h, rows, h, &[&w.output]);
            let start = logits.len();
            logits.resize(start + rows * cfg.vocab, 0.0);
            let input = Input {
                x: &s.last_h,
                q: w.output.needs_quantized().then_some(&s.qa),
                rows,
                k: h,
            };
            let out = &mut logits[start..];
            matmul(&pool, isa, &w.output, &input, out);
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
        self.run(chunks, logits)?;
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
            self.pool.threads(),
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
