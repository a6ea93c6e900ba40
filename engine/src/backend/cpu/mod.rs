//! The CPU backend: quantized SIMD kernels, paged f16 KV cache, threads over weight rows.

pub mod attention;
pub mod gemm;
pub mod isa;
pub mod kv;
pub mod matmul;
pub mod membw;
pub mod ops;
pub mod packed;
pub mod pool;
pub mod quant;
#[cfg(target_arch = "x86_64")]
pub mod simd;
pub mod weights;

use std::sync::Arc;
use std::time::Instant;

use self::attention::{CHUNK_BLOCKS, Heads, Rows, attend, chunk_states, chunks_for};
use self::isa::Isa;
use self::kv::KvStore;
use self::matmul::{Input, Weight, matmul, matmul_many};
use self::pool::ComputePool;
use self::quant::QActs;
use self::weights::{CpuFfn, CpuMlp, CpuWeights};
use super::{Backend, BackendError, SeqChunk, StepStats, WindowedKv};
use crate::model::config::{Activation, Experts, ModelConfig, RopeStyle};
use crate::model::llama::LlamaWeights;
use crate::model::ops::{ForwardPlan, Op, RopeTable, Sublayer};

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
    /// Router scores of a mixture of experts, `rows × count`.
    router: Vec<f32>,
    /// One expert's rows of `h`, and its output.
    expert_in: Vec<f32>,
    expert_out: Vec<f32>,
    qa: QActs,
    rope: Vec<(f32, f32)>,
    /// The local (sliding-window) layers' table, when their RoPE base differs.
    rope_local: Vec<(f32, f32)>,
    positions: Vec<usize>,
    logit_rows: Vec<usize>,
    last_h: Vec<f32>,
    /// Attention work items of this step (each taken for every KV head).
    attn_items: Vec<AttnItem>,
    /// Partial softmax states of decode rows' chunks, `items × kv heads × group` states.
    attn_parts: Vec<f32>,
    /// One decode row's merged states.
    attn_merged: Vec<f32>,
}

/// One unit of attention work (for one KV head).
#[derive(Clone, Copy, Debug)]
enum AttnItem {
    /// Rows `t0..t1` of sequence `seq` (prefill), every chunk of the cache.
    Run { seq: usize, t0: usize, t1: usize },
    /// Chunk `c` of the cache for decode row `t` of sequence `seq`; its partial states go to
    /// slot `slot` of the partials buffer.
    Chunk {
        seq: usize,
        t: usize,
        c: usize,
        slot: usize,
    },
}

impl AttnItem {
    /// Rough cost (query rows × cache positions), to hand out the costliest first.
    fn cost(&self, positions: &[usize], chunk_positions: usize) -> usize {
        match *self {
            AttnItem::Run { t0, t1, .. } => (t1 - t0) * (positions[t1 - 1] + 1),
            AttnItem::Chunk { .. } => chunk_positions,
        }
    }
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
    /// The full pool: every layer's KV, or only the global layers' with a window pool.
    kv: KvStore,
    /// The window pool: the local layers' KV, holding only their window.
    kv_window: Option<KvStore>,
    /// Per layer: whether its KV lives in the window pool, and its index in its pool.
    layer_kv: Vec<(bool, usize)>,
    inv_freq: Vec<f32>,
    /// The local layers' inverse frequencies, when they differ from `inv_freq`.
    inv_freq_local: Option<Vec<f32>>,
    /// The forward pass this backend executes.
    plan: ForwardPlan,
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
        Self::with_layout(cfg, weights, block_size, kv_blocks, None, pool)
    }

    /// Like [`CpuBackend::with_weights`]; with `window_blocks`, a model with sliding-window
    /// layers keeps their KV in a window pool of that many blocks (each sequence holding only
    /// its window), and the full pool holds only the global layers'. A model without such
    /// layers keeps every layer whole either way.
    pub fn with_layout(
        cfg: ModelConfig,
        weights: Arc<CpuWeights>,
        block_size: usize,
        kv_blocks: usize,
        window_blocks: Option<usize>,
        pool: Arc<ComputePool>,
    ) -> Self {
        let inv_freq = cfg.rope_inv_freq(weights.model.rope_freqs.as_deref());
        let inv_freq_local = cfg.rope_inv_freq_local();
        let windowed = window_blocks.filter(|_| cfg.family.sliding_window.is_some());
        let (mut globals, mut locals) = (0, 0);
        let layer_kv: Vec<(bool, usize)> = (0..cfg.layers)
            .map(|l| {
                if windowed.is_some() && cfg.family.window(l).is_some() {
                    locals += 1;
                    (true, locals - 1)
                } else {
                    globals += 1;
                    (false, globals - 1)
                }
            })
            .collect();
        let store =
            |layers, blocks| KvStore::new(layers, cfg.kv_heads, cfg.head_dim, block_size, blocks);
        let kv = store(globals, kv_blocks);
        let kv_window = windowed.map(|b| store(locals, b));
        Self {
            plan: ForwardPlan::new(&cfg),
            cfg,
            weights,
            kv,
            kv_window,
            layer_kv,
            inv_freq,
            inv_freq_local,
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

    /// The KV storage's size in bytes (both pools).
    pub fn kv_bytes(&self) -> usize {
        [Some(&self.kv), self.kv_window.as_ref()]
            .into_iter()
            .flatten()
            .map(|kv| kv.bytes_per_token() * kv.block_size() * kv.blocks())
            .sum()
    }

    /// The ISA the kernels run.
    pub fn isa(&self) -> Isa {
        self.isa
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

    /// `gate = activation(x · Wgate) · (x · Wup)` over `rows` rows (`up` is scratch).
    #[allow(clippy::too_many_arguments)]
    fn gate_up(
        pool: &ComputePool,
        isa: Isa,
        m: &CpuMlp,
        activation: Activation,
        x: &[f32],
        rows: usize,
        qa: &mut QActs,
        [gate, up]: [&mut Vec<f32>; 2],
    ) {
        let ws = [&m.gate, &m.up];
        Self::quantize_if_needed(pool, isa, qa, x, rows, ws[0].k(), &ws);
        Self::mm(pool, isa, &ws, x, qa, rows, &mut [gate, up]);
        match activation {
            Activation::Silu => ops::silu_mul(isa, gate, up),
            Activation::GeluTanh => ops::gelu_tanh_mul(isa, gate, up),
        }
    }

    /// A mixture-of-experts feed-forward over `total` rows of `s.h` into `s.o`: the router's
    /// scores, each row's chosen experts ([`route`]), then expert by expert (in index order)
    /// its rows gathered, run through its MLP and added to theirs, weighted.
    #[allow(clippy::too_many_arguments)]
    fn experts(
        pool: &ComputePool,
        isa: Isa,
        s: &mut Scratch,
        router: &Weight,
        experts: &[CpuMlp],
        activation: Activation,
        x: Experts,
        total: usize,
        h: usize,
    ) {
        let ws = [router];
        Self::quantize_if_needed(pool, isa, &mut s.qa, &s.h, total, h, &ws);
        Self::mm(pool, isa, &ws, &s.h, &s.qa, total, &mut [&mut s.router]);
        let mut rows_of: Vec<Vec<(usize, f32)>> = vec![Vec::new(); x.count];
        for t in 0..total {
            let scores = &s.router[t * x.count..(t + 1) * x.count];
            for (e, w) in route(scores, x.used, x.norm_weights) {
                rows_of[e].push((t, w));
            }
        }
        s.o.clear();
        s.o.resize(total * h, 0.0);
        for (m, rows) in experts.iter().zip(&rows_of) {
            if rows.is_empty() {
                continue;
            }
            let n = rows.len();
            s.expert_in.resize(n * h, 0.0);
            for (i, &(t, _)) in rows.iter().enumerate() {
                s.expert_in[i * h..(i + 1) * h].copy_from_slice(&s.h[t * h..(t + 1) * h]);
            }
            Self::gate_up(
                pool,
                isa,
                m,
                activation,
                &s.expert_in,
                n,
                &mut s.qa,
                [&mut s.gate, &mut s.up],
            );
            let ws = [&m.down];
            Self::quantize_if_needed(pool, isa, &mut s.qa, &s.gate, n, x.ffn, &ws);
            Self::mm(pool, isa, &ws, &s.gate, &s.qa, n, &mut [&mut s.expert_out]);
            for (i, &(t, w)) in rows.iter().enumerate() {
                let out = &mut s.o[t * h..(t + 1) * h];
                for (o, v) in out.iter_mut().zip(&s.expert_out[i * h..(i + 1) * h]) {
                    *o += w * v;
                }
            }
        }
    }

    /// One layer's attention, parallel over (work item, KV head): runs of prefill rows walk
    /// the cache themselves; decode rows' chunks are items of their own, whose partial states
    /// are merged here afterwards, in chunk order.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        pool: &ComputePool,
        isa: Isa,
        kv: &KvStore,
        tables: &[&[u32]],
        s: &mut Scratch,
        heads: impl Fn(usize) -> Heads + Sync,
        nkv: usize,
        qd: usize,
    ) {
        let total = s.positions.len();
        s.attn.resize(total * qd, 0.0);
        let state = heads(0).group * heads(0).state_len();
        let parts_len = s.attn_items.len() * nkv * state;
        if s.attn_parts.len() < parts_len {
            s.attn_parts.resize(parts_len, 0.0);
        }
        let out = SendPtr(s.attn.as_mut_ptr());
        let parts = SendPtr(s.attn_parts.as_mut_ptr());
        let (q, items, positions) = (&s.q, &s.attn_items, &s.positions);
        pool.run(items.len() * nkv, &|c| {
            let (item, g) = (items[c / nkv], c % nkv);
            ATTN_SCRATCH.with_borrow_mut(|scratch| match item {
                AttnItem::Run { seq, t0, t1 } => {
                    let rows = Rows {
                        blocks: tables[seq],
                        positions: &positions[t0..t1],
                        q: &q[t0 * qd..t1 * qd],
                        stride: qd,
                    };
                    // SAFETY: each (rows, kv head) item writes only its own rows' heads.
                    unsafe { attend(isa, kv, heads(g), rows, out.get().add(t0 * qd), scratch) };
                }
                AttnItem::Chunk { seq, t, c, slot } => {
                    let rows = Rows {
                        blocks: tables[seq],
                        positions: &positions[t..=t],
                        q: &q[t * qd..(t + 1) * qd],
                        stride: qd,
                    };
                    // SAFETY: each (item, kv head) owns its slot of the partials buffer, sized
                    // above.
                    let dst = unsafe {
                        std::slice::from_raw_parts_mut(
                            parts.get().add((slot * nkv + g) * state),
                            state,
                        )
                    };
                    chunk_states(isa, kv, heads(g), rows, c, dst, scratch);
                }
            });
        });
        // Merge each decode row's chunks in chunk order (items of a row are adjacent in
        // building order, so their slots are consecutive from chunk 0).
        let merged = &mut s.attn_merged;
        merged.resize(state, 0.0);
        for it in &s.attn_items {
            let AttnItem::Chunk { t, c: 0, slot, .. } = *it else {
                continue;
            };
            let n = chunks_for(s.positions[t], kv.block_size());
            for g in 0..nkv {
                let h = heads(g);
                merged.copy_from_slice(&s.attn_parts[(slot * nkv + g) * state..][..state]);
                for c in 1..n {
                    let at = ((slot + c) * nkv + g) * state;
                    attention::merge(merged, &s.attn_parts[at..at + state], h.state_len());
                }
                let dst = &mut s.attn[t * qd + g * h.group * h.head_dim..][..h.group * h.head_dim];
                // SAFETY: `dst` holds group × head_dim floats.
                unsafe { attention::finish(merged, h.head_dim, dst.as_mut_ptr()) };
            }
        }
    }

    /// Checks each chunk's window-pool table: one per chunk, holding (in range) every block
    /// its rows' windows reach.
    fn check_windows(
        &self,
        chunks: &[SeqChunk<'_>],
        windows: &[&[u32]],
    ) -> Result<(), BackendError> {
        let Some(kvw) = &self.kv_window else {
            return if windows.is_empty() {
                Ok(())
            } else {
                Err(BackendError::Invalid(
                    "window block tables without a window pool".into(),
                ))
            };
        };
        let window = self
            .cfg
            .family
            .sliding_window
            .as_ref()
            .map_or(1, |w| w.window);
        if windows.len() != chunks.len() {
            return Err(BackendError::Invalid(format!(
                "{} window block tables for {} chunks",
                windows.len(),
                chunks.len()
            )));
        }
        let bs = kvw.block_size();
        for (c, table) in chunks.iter().zip(windows) {
            let end = c.start_pos + c.tokens.len();
            let first = (c.start_pos + 1).saturating_sub(window) / bs;
            let reach = end.div_ceil(bs);
            let held = table.get(first..reach).ok_or_else(|| {
                BackendError::Invalid(format!(
                    "window block table of {} blocks for positions {}..{end}",
                    table.len(),
                    c.start_pos
                ))
            })?;
            if let Some(&b) = held.iter().find(|&&b| b as usize >= kvw.blocks()) {
                return Err(BackendError::Invalid(format!(
                    "window block {b} out of range (or not held)"
                )));
            }
        }
        Ok(())
    }

    fn run(
        &mut self,
        chunks: &[SeqChunk<'_>],
        windows: &[&[u32]],
        logits: &mut Vec<f32>,
    ) -> Result<(), BackendError> {
        self.check_windows(chunks, windows)?;
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
        let mut slots: Vec<(usize, usize)> = Vec::with_capacity(total);
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
                slots.push((c.start_pos + i, ci));
            }
            if c.tokens.len() == 1 {
                // A decode row: its cache chunks are separate items, merged afterwards.
                for chunk in 0..chunks_for(c.start_pos, bs) {
                    let slot = s.attn_items.len();
                    s.attn_items.push(AttnItem::Chunk {
                        seq: ci,
                        t: first,
                        c: chunk,
                        slot,
                    });
                }
            } else {
                let mut r = first;
                while r < s.positions.len() {
                    let end = (r + ATTN_ROWS).min(s.positions.len());
                    s.attn_items.push(AttnItem::Run {
                        seq: ci,
                        t0: r,
                        t1: end,
                    });
                    r = end;
                }
            }
        }
        let positions = &s.positions;
        s.attn_items
            .sort_by_key(|it| std::cmp::Reverse(it.cost(positions, bs * CHUNK_BLOCKS)));
        let plan = &self.plan;
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
        if plan.embed_scale != 1.0 {
            ops::scale(&mut s.x, plan.embed_scale);
        }
        ops::rope_table(&s.positions, &self.inv_freq, &mut s.rope);
        if let Some(f) = &self.inv_freq_local {
            ops::rope_table(&s.positions, f, &mut s.rope_local);
        }
        let neox = cfg.rope_style == RopeStyle::Neox;
        let full_tables: Vec<&[u32]> = chunks.iter().map(|c| c.blocks).collect();
        let (kv_full, mut kv_window) = (&mut self.kv, self.kv_window.as_mut());
        let missing = |l: usize, what: &str| {
            BackendError::Invalid(format!("layer {l} has no {what} weights"))
        };
        for (l, ((blk, lb), layer_ops)) in w
            .blocks
            .iter()
            .zip(&lw.blocks)
            .zip(&plan.layers)
            .enumerate()
        {
            // A local layer's KV is in the window pool when there is one.
            let (in_window, layer) = self.layer_kv[l];
            let (kv, tables): (&mut KvStore, &[&[u32]]) = match kv_window.as_deref_mut() {
                Some(kvw) if in_window => (kvw, windows),
                _ => (&mut *kv_full, &full_tables),
            };
            for op in layer_ops {
                match *op {
                    Op::AttnNorm => {
                        s.h.resize(total * h, 0.0);
                        ops::rms_norm(&s.x, &lb.attn_norm, cfg.rms_eps, &mut s.h);
                    }
                    Op::QkvProj { bias } => {
                        let ws = [&blk.wq, &blk.wk, &blk.wv];
                        Self::quantize_if_needed(&pool, isa, &mut s.qa, &s.h, total, h, &ws);
                        Self::mm(
                            &pool,
                            isa,
                            &ws,
                            &s.h,
                            &s.qa,
                            total,
                            &mut [&mut s.q, &mut s.k, &mut s.v],
                        );
                        if bias {
                            let (Some(bq), Some(bk), Some(bv)) = (&lb.bq, &lb.bk, &lb.bv) else {
                                return Err(missing(l, "q/k/v bias"));
                            };
                            ops::add_bias(&mut s.q, bq);
                            ops::add_bias(&mut s.k, bk);
                            ops::add_bias(&mut s.v, bv);
                        }
                    }
                    Op::QkNorm => {
                        let (Some(qn), Some(kn)) = (&lb.q_norm, &lb.k_norm) else {
                            return Err(missing(l, "q/k norm"));
                        };
                        // Per head: the weights are `head_dim` long, so every head is a row.
                        ops::rms_norm_in_place(&mut s.q, qn, cfg.rms_eps);
                        ops::rms_norm_in_place(&mut s.k, kn, cfg.rms_eps);
                    }
                    Op::Rope { table } => {
                        let table = match table {
                            RopeTable::Local if self.inv_freq_local.is_some() => &s.rope_local,
                            RopeTable::Local => return Err(missing(l, "local RoPE base")),
                            RopeTable::Global => &s.rope,
                        };
                        ops::rope(&mut s.q, nh, hd, table, neox);
                        ops::rope(&mut s.k, nkv, hd, table, neox);
                    }
                    Op::StoreKv => {
                        for (ti, &(pos, ci)) in slots.iter().enumerate() {
                            let block = tables[ci][pos / bs] as usize;
                            kv.write(
                                block,
                                pos % bs,
                                layer,
                                &s.k[ti * kvd..(ti + 1) * kvd],
                                &s.v[ti * kvd..(ti + 1) * kvd],
                            );
                        }
                    }
                    Op::Attention(a) => {
                        ops::scale(&mut s.q, a.scale);
                        let heads = |kv_head| Heads {
                            layer,
                            kv_head,
                            group: nh / nkv,
                            head_dim: hd,
                            window: a.window,
                            softcap: a.softcap,
                        };
                        Self::attention(&pool, isa, kv, tables, s, heads, nkv, qd);
                    }
                    Op::OutProj => {
                        let ws = [&blk.wo];
                        Self::quantize_if_needed(&pool, isa, &mut s.qa, &s.attn, total, qd, &ws);
                        Self::mm(&pool, isa, &ws, &s.attn, &s.qa, total, &mut [&mut s.o]);
                    }
                    Op::PostNorm(which) => {
                        let (norm, what) = match which {
                            Sublayer::Attention => (&lb.attn_post_norm, "attention post-norm"),
                            Sublayer::FeedForward => (&lb.ffn_post_norm, "feed-forward post-norm"),
                        };
                        let pn = norm.as_ref().ok_or_else(|| missing(l, what))?;
                        ops::rms_norm_in_place(&mut s.o, pn, cfg.rms_eps);
                    }
                    Op::Residual => ops::add_in_place(&mut s.x, &s.o),
                    Op::FfnNorm => {
                        s.h.resize(total * h, 0.0);
                        ops::rms_norm(&s.x, &lb.ffn_norm, cfg.rms_eps, &mut s.h);
                    }
                    Op::GateUp { activation } => {
                        let CpuFfn::Dense(m) = &blk.ffn else {
                            return Err(missing(l, "dense feed-forward"));
                        };
                        Self::gate_up(
                            &pool,
                            isa,
                            m,
                            activation,
                            &s.h,
                            total,
                            &mut s.qa,
                            [&mut s.gate, &mut s.up],
                        );
                    }
                    Op::Down => {
                        let CpuFfn::Dense(m) = &blk.ffn else {
                            return Err(missing(l, "dense feed-forward"));
                        };
                        let ws = [&m.down];
                        Self::quantize_if_needed(
                            &pool, isa, &mut s.qa, &s.gate, total, cfg.ffn, &ws,
                        );
                        Self::mm(&pool, isa, &ws, &s.gate, &s.qa, total, &mut [&mut s.o]);
                    }
                    Op::Experts {
                        activation,
                        experts: x,
                    } => {
                        let CpuFfn::Experts { router, experts } = &blk.ffn else {
                            return Err(missing(l, "expert"));
                        };
                        if experts.len() != x.count {
                            return Err(missing(l, "expert"));
                        }
                        Self::experts(&pool, isa, s, router, experts, activation, x, total, h);
                    }
                }
            }
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
            if let Some(cap) = plan.final_softcap {
                ops::softcap(out, cap);
            }
        }
        Ok(())
    }
}

impl Backend for CpuBackend {
    fn forward_windowed(
        &mut self,
        chunks: &[SeqChunk<'_>],
        windows: &[&[u32]],
        logits: &mut Vec<f32>,
    ) -> Result<StepStats, BackendError> {
        let started = Instant::now();
        self.run(chunks, windows, logits)?;
        Ok(StepStats {
            device_time: started.elapsed(),
        })
    }

    fn kv_block_bytes(&self) -> usize {
        self.kv.bytes_per_token() * self.kv.block_size()
    }

    fn windowed_kv(&self) -> Option<WindowedKv> {
        let kvw = self.kv_window.as_ref()?;
        Some(WindowedKv {
            window: self.cfg.family.sliding_window.as_ref()?.window,
            blocks: kvw.blocks(),
            block_bytes: kvw.bytes_per_token() * kvw.block_size(),
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

    fn isa_name(&self) -> &'static str {
        self.isa.name()
    }

    fn weight_bytes_per_step(&self) -> usize {
        self.weights
            .bytes_per_step(self.cfg.family.experts.map_or(0, |x| x.used))
    }

    /// Any chunk: each row has its own activations' quantization and accumulators in the
    /// integer kernels ([`gemm`]), its own dot products on float weights ([`matmul`](mod@matmul)), and
    /// attention states computed and merged in the same order whether it decodes alone or runs
    /// among others ([`attention`]).
    fn exact_rows(&self) -> usize {
        usize::MAX
    }

    fn describe(&self) -> String {
        let window = self.windowed_kv().map_or(String::new(), |w| {
            format!(
                " + window pool {} blocks for the last {} positions",
                w.blocks, w.window
            )
        });
        format!(
            "cpu ({} kernels, {} threads, KV {} blocks × {} positions{window}, {:.0} MiB)",
            self.isa.name(),
            self.pool.threads(),
            self.kv.blocks(),
            self.kv.block_size(),
            bytes_to_mib(self.kv_bytes())
        )
    }
}

/// The experts a row runs and their weights, from the router's `scores` (one per expert): the
/// `used` most probable under the softmax of all scores (ties: the lower index), weighted by
/// their probabilities, renormalized to sum to 1 when `norm`. In the order chosen.
fn route(scores: &[f32], used: usize, norm: bool) -> Vec<(usize, f32)> {
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exp: Vec<f32> = scores.iter().map(|&v| (v - max).exp()).collect();
    let sum: f32 = exp.iter().sum();
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    order.truncate(used);
    let chosen: f32 = order.iter().map(|&e| exp[e]).sum();
    let denom = if norm { chosen } else { sum };
    order.into_iter().map(|e| (e, exp[e] / denom)).collect()
}

#[allow(clippy::cast_precision_loss)]
fn bytes_to_mib(b: usize) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

#[cfg(test)]
mod tests {
    use super::route;

    #[test]
    fn a_row_runs_its_top_experts_weighted_by_the_softmax() {
        let scores = [0.0, 2.0, 1.0, 2.0];
        // The two best, ties to the lower index, renormalized over the two.
        let r = route(&scores, 2, true);
        assert_eq!(r.iter().map(|p| p.0).collect::<Vec<_>>(), [1, 3]);
        assert!(r.iter().all(|p| (p.1 - 0.5).abs() < 1e-6), "{r:?}");
        // Without renormalizing: the softmax over all four.
        let all: f32 = scores.iter().map(|v| v.exp()).sum();
        let r = route(&scores, 3, false);
        assert_eq!(r.iter().map(|p| p.0).collect::<Vec<_>>(), [1, 3, 2]);
        assert!((r[2].1 - 1f32.exp() / all).abs() < 1e-6, "{r:?}");
    }
}
