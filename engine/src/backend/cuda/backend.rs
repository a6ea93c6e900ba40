//! The GPU backend: weights uploaded once, the KV cache paged on the device exactly like the
//! CPU's (with a window pool for the sliding-window layers when asked, as on the CPU), and one
//! forward step as a queue of kernel launches (plus cuBLAS GEMMs for prompt chunks) with a
//! single host sync when the logits come back.

use std::collections::HashMap;

use super::gpu::{Arg, Gemm, Gpu, GpuError, Launch};
use super::kernels::{KernelConfig, fmt_kernel};
use super::layout::{self, KvLayout, Shape, StepPlan, WFormat};
use super::lower::LayerLaunches;
use crate::backend::{Backend, BackendError, SeqChunk, StepStats, WindowedKv};
use crate::model::config::ModelConfig;
use crate::model::llama::LlamaWeights;
use crate::model::ops::{ForwardPlan, RopeTable};
use crate::model::weights::Tensor;

/// Run-time choices of the GPU backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaOptions {
    /// Prompt chunks of at least [`CudaOptions::gemm_min_rows`] tokens go through f16 copies of
    /// the weights and cuBLAS (when present); otherwise every row takes the quantized matvec
    /// kernels (slower prefill, but bit-for-bit independent of how prompts are chunked).
    pub prefill_gemm: bool,
    /// The smallest chunk that takes the GEMM path (at least 2: decodes never do).
    pub gemm_min_rows: usize,
    /// Replays one-token, one-sequence steps from a CUDA graph (off unless measured faster).
    pub graphs: bool,
}

impl Default for CudaOptions {
    fn default() -> Self {
        Self {
            prefill_gemm: true,
            gemm_min_rows: 16,
            graphs: false,
        }
    }
}

impl CudaOptions {
    /// The defaults, overridden by `SLOTLIGHT_CUDA_PREFILL` (`gemm` or `matvec`),
    /// `SLOTLIGHT_CUDA_GEMM_MIN_ROWS` (a number) and `SLOTLIGHT_CUDA_GRAPHS` (`1`/`on`).
    pub fn from_env() -> Self {
        let mut o = Self::default();
        if let Ok(v) = std::env::var("SLOTLIGHT_CUDA_PREFILL") {
            o.prefill_gemm = !matches!(v.trim(), "matvec" | "off" | "0");
        }
        if let Some(n) = std::env::var("SLOTLIGHT_CUDA_GEMM_MIN_ROWS")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
        {
            o.gemm_min_rows = n.max(2);
        }
        if let Ok(v) = std::env::var("SLOTLIGHT_CUDA_GRAPHS") {
            o.graphs = matches!(v.trim(), "1" | "on" | "true");
        }
        o
    }
}

/// A weight matrix on the device.
#[derive(Debug, Clone, Copy)]
struct DevMat {
    ptr: u64,
    fmt: WFormat,
    rows: usize,
    /// Row-major f16 copy for the GEMM path.
    h16: u64,
}

/// The fused `[Wq; Wk; Wv]` matrix: one packed matrix per run of members with the same device
/// format (one when all agree), each with its first row in the fused matrix.
#[derive(Debug, Clone)]
struct DevStack {
    parts: Vec<(usize, DevMat)>,
    rows: usize,
    /// Row-major f16 copy of the whole stack for the GEMM path.
    h16: u64,
}

/// One layer on the device: its matrices, its vectors (0 for those its ops do not use), and the
/// launches its ops lower to.
#[derive(Debug)]
struct DevLayer {
    qkv: DevStack,
    bias: u64,
    wo: DevMat,
    gu: DevMat,
    down: DevMat,
    attn_norm: u64,
    ffn_norm: u64,
    q_norm: u64,
    k_norm: u64,
    attn_post_norm: u64,
    ffn_post_norm: u64,
    /// The RoPE frequencies of this layer (global or local table).
    inv_freq: u64,
    run: LayerLaunches,
}

/// Indices of one format's kernels.
#[derive(Debug, Clone, Copy, Default)]
struct FmtKernels {
    qkv: usize,
    qkv_raw: usize,
    silu: usize,
    resid: usize,
    logits: usize,
    embed: usize,
    dequant: usize,
}

#[derive(Debug, Default)]
struct Kernels {
    attn: usize,
    rmsnorm_h: usize,
    qkv_post: usize,
    to_half: usize,
    silu_mul_h: usize,
    qkv_heads: usize,
    postnorm_add: usize,
    by_fmt: [FmtKernels; WFormat::ALL.len()],
}

/// A growable device buffer.
#[derive(Debug, Default, Clone, Copy)]
struct Buf {
    ptr: u64,
    bytes: usize,
}

/// Per-step buffers.
#[derive(Debug, Default)]
struct Bufs {
    x: Buf,
    q: Buf,
    att: Buf,
    act: Buf,
    /// Post-normed sub-layer outputs before they join the residual.
    o: Buf,
    logits: Buf,
    meta: Buf,
    /// The window pool's block tables ([`StepPlan::meta_window`]): a buffer of its own, so the
    /// arguments a captured graph holds keep their offsets.
    meta_window: Buf,
    h16: Buf,
    big: Buf,
    /// Bumped whenever a buffer moves (a captured graph holds the old addresses).
    generation: u64,
}

fn grow<G: Gpu>(
    gpu: &mut G,
    b: &mut Buf,
    bytes: usize,
    generation: &mut u64,
) -> Result<u64, GpuError> {
    if b.bytes < bytes {
        if b.ptr != 0 {
            gpu.free(b.ptr);
            *b = Buf::default();
        }
        // Round up so a slowly growing step does not reallocate every time.
        let want = bytes.next_power_of_two().max(4096);
        b.ptr = gpu.alloc(want)?;
        b.bytes = want;
        *generation += 1;
    }
    Ok(b.ptr)
}

fn i32_arg(n: usize) -> Arg {
    Arg::I32(i32::try_from(n).unwrap_or(i32::MAX))
}

/// Bytes of `n` f32 values.
const F32: usize = 4;
/// Bytes of `n` f16 values.
const F16: usize = 2;

/// Where one layer's KV lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct KvSlot {
    /// In the window pool (a local layer, with one), else in the full pool.
    window: bool,
    /// The layer's index within its pool.
    index: usize,
}

/// Per layer, its KV slot: with `windowed`, local layers (`cfg.family.window(l)`) number the
/// window pool's layers and the others the full pool's; without, every layer is in the full
/// pool. Also returns the full and window pools' layer counts.
fn kv_slots(cfg: &ModelConfig, windowed: bool) -> (Vec<KvSlot>, usize, usize) {
    let (mut globals, mut locals) = (0, 0);
    let slots = (0..cfg.layers)
        .map(|l| {
            let window = windowed && cfg.family.window(l).is_some();
            let n = if window { &mut locals } else { &mut globals };
            *n += 1;
            KvSlot {
                window,
                index: *n - 1,
            }
        })
        .collect();
    (slots, globals, locals)
}

/// A Llama-family model on a GPU (or on the kernel emulator).
pub struct GpuBackend<G: Gpu> {
    cfg: ModelConfig,
    gpu: G,
    kc: KernelConfig,
    k: Kernels,
    layers: Vec<DevLayer>,
    embed: DevMat,
    output: DevMat,
    norm: u64,
    /// The forward pass these launches execute.
    plan: ForwardPlan,
    /// The full pool: every layer's KV, or only the global layers' with a window pool.
    kv: u64,
    kv_layout: KvLayout,
    /// The window pool (the local layers' KV, holding only their window) and its layout.
    kv_window: Option<(u64, KvLayout)>,
    /// Per layer: where its KV lives.
    layer_kv: Vec<KvSlot>,
    bufs: Bufs,
    opts: CudaOptions,
    gemm: bool,
    graph_generation: Option<u64>,
    label: String,
    weight_bytes: usize,
    owned: Vec<u64>,
}

impl<G: Gpu> GpuBackend<G> {
    /// Uploads `weights` to `gpu`, compiles the kernels and allocates a KV cache of `kv_blocks`
    /// blocks of `block_size` positions, every layer whole. `label` names the device in
    /// [`Backend::describe`].
    pub fn with_gpu(
        gpu: G,
        cfg: ModelConfig,
        weights: &LlamaWeights,
        block_size: usize,
        kv_blocks: usize,
        opts: CudaOptions,
        label: String,
    ) -> Result<Self, GpuError> {
        Self::with_layout(gpu, cfg, weights, block_size, kv_blocks, None, opts, label)
    }

    /// Like [`GpuBackend::with_gpu`]; with `window_blocks`, a model with sliding-window layers
    /// keeps their KV in a window pool of that many blocks (each sequence holding only its
    /// window: [`Backend::forward_windowed`] takes its tables), and the full pool holds only
    /// the global layers'. A model without such layers keeps every layer whole either way.
    #[allow(clippy::too_many_arguments)]
    pub fn with_layout(
        mut gpu: G,
        cfg: ModelConfig,
        weights: &LlamaWeights,
        block_size: usize,
        kv_blocks: usize,
        window_blocks: Option<usize>,
        opts: CudaOptions,
        label: String,
    ) -> Result<Self, GpuError> {
        let group_fmt =
            |ts: &[&Tensor]| WFormat::for_group(&ts.iter().map(|t| t.dtype()).collect::<Vec<_>>());
        let mut formats: Vec<WFormat> = Vec::new();
        let mut add = |f: WFormat| {
            if !formats.contains(&f) {
                formats.push(f);
            }
        };
        for b in &weights.blocks {
            for (f, _) in WFormat::sections(&[b.wq.dtype(), b.wk.dtype(), b.wv.dtype()]) {
                add(f);
            }
            add(WFormat::for_dtype(b.wo.dtype()));
            add(group_fmt(&[&b.w_gate, &b.w_up]));
            add(WFormat::for_dtype(b.w_down.dtype()));
        }
        add(WFormat::for_dtype(weights.embed.dtype()));
        add(WFormat::for_dtype(weights.output.dtype()));
        let kc = KernelConfig::for_model(&cfg, block_size, formats).map_err(GpuError)?;
        let plan = ForwardPlan::new(&cfg);
        let runs = plan
            .layers
            .iter()
            .enumerate()
            .map(|(l, ops)| {
                LayerLaunches::lower(ops).map_err(|e| GpuError(format!("layer {l}: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let names = kc.kernel_names();
        {
            let _compile = tracing::info_span!(
                target: slotlight_otel::span::OPS_TARGET,
                slotlight_otel::span::STARTUP_KERNEL_COMPILE
            )
            .entered();
            gpu.load(&kc, &names)?;
        }
        let k = resolve(&names, &kc.formats)?;
        let gemm = opts.prefill_gemm && gpu.has_gemm();
        let windowed = window_blocks.filter(|_| cfg.family.sliding_window.is_some());
        let (layer_kv, globals, locals) = kv_slots(&cfg, windowed.is_some());
        let pool = |layers, blocks| KvLayout {
            layers,
            kv_heads: cfg.kv_heads,
            head_dim: cfg.head_dim,
            block_size,
            blocks,
        };
        let kv_layout = pool(globals, kv_blocks);
        let window_layout = windowed.map(|b| pool(locals, b));
        let mut me = Self {
            kc,
            k,
            layers: Vec::with_capacity(cfg.layers),
            embed: DevMat {
                ptr: 0,
                fmt: WFormat::F32,
                rows: 0,
                h16: 0,
            },
            output: DevMat {
                ptr: 0,
                fmt: WFormat::F32,
                rows: 0,
                h16: 0,
            },
            norm: 0,
            plan,
            kv: 0,
            kv_layout,
            kv_window: None,
            layer_kv,
            bufs: Bufs::default(),
            gemm,
            graph_generation: None,
            label,
            weight_bytes: 0,
            owned: Vec::new(),
            opts,
            cfg,
            gpu,
        };
        me.upload_weights(weights, &runs)?;
        me.kv = me.alloc_owned(kv_layout.bytes()).map_err(|e| {
            GpuError(format!(
                "KV cache of {} blocks ({} MiB): {e}",
                kv_blocks,
                kv_layout.bytes() >> 20
            ))
        })?;
        if let Some(wl) = window_layout {
            let ptr = me.alloc_owned(wl.bytes()).map_err(|e| {
                GpuError(format!(
                    "KV window pool of {} blocks ({} MiB): {e}",
                    wl.blocks,
                    wl.bytes() >> 20
                ))
            })?;
            me.kv_window = Some((ptr, wl));
        }
        Ok(me)
    }

    fn alloc_owned(&mut self, bytes: usize) -> Result<u64, GpuError> {
        let p = self.gpu.alloc(bytes)?;
        self.owned.push(p);
        Ok(p)
    }

    fn upload_f32(&mut self, v: &[f32]) -> Result<u64, GpuError> {
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        let p = self.alloc_owned(bytes.len())?;
        self.gpu.upload(p, &bytes)?;
        self.weight_bytes += bytes.len();
        Ok(p)
    }

    /// Packs `parts` in `fmt` and uploads them (no f16 copy).
    fn upload_packed(&mut self, fmt: WFormat, parts: &[&Tensor]) -> Result<DevMat, GpuError> {
        let packed = layout::pack(fmt, parts).map_err(GpuError)?;
        let rows: usize = parts.iter().map(|t| t.rows()).sum();
        let ptr = self.alloc_owned(packed.len())?;
        self.gpu.upload(ptr, &packed)?;
        self.weight_bytes += packed.len();
        Ok(DevMat {
            ptr,
            fmt,
            rows,
            h16: 0,
        })
    }

    /// An f16 copy of `rows` rows of length `k`, filled from `mats` (each at its first row).
    fn f16_copy(
        &mut self,
        rows: usize,
        k: usize,
        mats: &[(usize, DevMat)],
    ) -> Result<u64, GpuError> {
        let h16 = self.alloc_owned(rows * k * F16)?;
        self.weight_bytes += rows * k * F16;
        for (row0, m) in mats {
            self.launch(
                self.k.by_fmt[m.fmt.id()].dequant,
                layout::row_shape(m.rows),
                &[
                    Arg::Ptr(m.ptr),
                    i32_arg(m.rows),
                    i32_arg(k),
                    Arg::Ptr(h16 + (row0 * k * F16) as u64),
                ],
            )?;
        }
        Ok(h16)
    }

    fn upload_mat(&mut self, parts: &[&Tensor], f16_copy: bool) -> Result<DevMat, GpuError> {
        let fmt = WFormat::for_group(&parts.iter().map(|t| t.dtype()).collect::<Vec<_>>());
        let mut m = self.upload_packed(fmt, parts)?;
        if f16_copy {
            let k = parts.first().map_or(0, |t| t.row_len());
            m.h16 = self.f16_copy(m.rows, k, &[(0, m)])?;
        }
        Ok(m)
    }

    /// Q, K and V: each run of members with one device format packed on its own.
    fn upload_stack(&mut self, parts: &[&Tensor], f16_copy: bool) -> Result<DevStack, GpuError> {
        let dtypes: Vec<_> = parts.iter().map(|t| t.dtype()).collect();
        let mut out = DevStack {
            parts: Vec::new(),
            rows: 0,
            h16: 0,
        };
        for (fmt, range) in WFormat::sections(&dtypes) {
            let m = self.upload_packed(fmt, &parts[range])?;
            out.parts.push((out.rows, m));
            out.rows += m.rows;
        }
        if f16_copy {
            let k = parts.first().map_or(0, |t| t.row_len());
            let mats = out.parts.clone();
            out.h16 = self.f16_copy(out.rows, k, &mats)?;
        }
        Ok(out)
    }

    /// Uploads an optional vector that `on` says the layer's ops use (0 when off).
    fn upload_opt(
        &mut self,
        on: bool,
        v: Option<&Vec<f32>>,
        l: usize,
        what: &str,
    ) -> Result<u64, GpuError> {
        match (on, v) {
            (false, _) => Ok(0),
            (true, Some(v)) => self.upload_f32(v),
            (true, None) => Err(GpuError(format!("layer {l} has no {what} weights"))),
        }
    }

    fn upload_weights(&mut self, w: &LlamaWeights, runs: &[LayerLaunches]) -> Result<(), GpuError> {
        let g = self.gemm;
        let inv = self.cfg.rope_inv_freq(w.rope_freqs.as_deref());
        let inv_global = self.upload_f32(&inv)?;
        let inv_local = match self.cfg.rope_inv_freq_local() {
            Some(f) if self.plan.uses_local_rope() => self.upload_f32(&f)?,
            _ => 0,
        };
        if w.blocks.len() != runs.len() {
            return Err(GpuError(format!(
                "{} blocks of weights for {} layers",
                w.blocks.len(),
                runs.len()
            )));
        }
        for (l, (b, run)) in w.blocks.iter().zip(runs).enumerate() {
            let run = *run;
            let qkv = self.upload_stack(&[&b.wq, &b.wk, &b.wv], g)?;
            let bias = match (run.bias, &b.bq, &b.bk, &b.bv) {
                (false, ..) => 0,
                (true, Some(q), Some(k), Some(v)) => {
                    let all: Vec<f32> = q.iter().chain(k).chain(v).copied().collect();
                    self.upload_f32(&all)?
                }
                _ => return Err(GpuError(format!("layer {l} has no q/k/v bias weights"))),
            };
            let wo = self.upload_mat(&[&b.wo], g)?;
            let gu = self.upload_mat(&[&b.w_gate, &b.w_up], g)?;
            let down = self.upload_mat(&[&b.w_down], g)?;
            let attn_norm = self.upload_f32(&b.attn_norm)?;
            let ffn_norm = self.upload_f32(&b.ffn_norm)?;
            let q_norm = self.upload_opt(run.qk_norm, b.q_norm.as_ref(), l, "q norm")?;
            let k_norm = self.upload_opt(run.qk_norm, b.k_norm.as_ref(), l, "k norm")?;
            let attn_post_norm = self.upload_opt(
                run.attn_post_norm,
                b.attn_post_norm.as_ref(),
                l,
                "attention post-norm",
            )?;
            let ffn_post_norm = self.upload_opt(
                run.ffn_post_norm,
                b.ffn_post_norm.as_ref(),
                l,
                "feed-forward post-norm",
            )?;
            let inv_freq = match run.rope {
                RopeTable::Global => inv_global,
                RopeTable::Local if inv_local != 0 => inv_local,
                RopeTable::Local => {
                    return Err(GpuError(format!("layer {l} needs a local RoPE base")));
                }
            };
            self.layers.push(DevLayer {
                qkv,
                bias,
                wo,
                gu,
                down,
                attn_norm,
                ffn_norm,
                q_norm,
                k_norm,
                attn_post_norm,
                ffn_post_norm,
                inv_freq,
                run,
            });
        }
        self.embed = self.upload_mat(&[&w.embed], false)?;
        self.output = if w.output.name() == w.embed.name() {
            self.embed
        } else {
            self.upload_mat(&[&w.output], false)?
        };
        self.norm = self.upload_f32(&w.norm)?;
        Ok(())
    }

    fn launch(&mut self, kernel: usize, s: Shape, args: &[Arg]) -> Result<(), GpuError> {
        self.gpu.launch(
            Launch {
                kernel,
                grid: s.grid,
                block: s.block,
            },
            args,
        )
    }

    fn validate(&self, chunks: &[SeqChunk<'_>]) -> Result<(), BackendError> {
        let bs = self.kv_layout.block_size;
        for c in chunks {
            let end = c.start_pos + c.tokens.len();
            if c.tokens.is_empty() || end > self.cfg.context || end > c.blocks.len() * bs {
                return Err(BackendError::Invalid(format!(
                    "chunk of {} tokens at {} with {} blocks (context {})",
                    c.tokens.len(),
                    c.start_pos,
                    c.blocks.len(),
                    self.cfg.context
                )));
            }
            if let Some(&b) = c
                .blocks
                .iter()
                .find(|&&b| b as usize >= self.kv_layout.blocks)
            {
                return Err(BackendError::Invalid(format!("block {b} out of range")));
            }
            if let Some(&t) = c.tokens.iter().find(|&&t| t as usize >= self.cfg.vocab) {
                return Err(BackendError::Invalid(format!(
                    "token {t} out of vocabulary"
                )));
            }
        }
        Ok(())
    }

    /// Checks each chunk's window-pool table, as the CPU does: one per chunk (none without a
    /// window pool), holding (in range) every block its rows' windows reach.
    fn validate_windows(
        &self,
        chunks: &[SeqChunk<'_>],
        windows: &[&[u32]],
    ) -> Result<(), BackendError> {
        let Some((_, wl)) = self.kv_window else {
            return if windows.is_empty() {
                Ok(())
            } else {
                Err(BackendError::Invalid(
                    "window block tables without a window pool".into(),
                ))
            };
        };
        if windows.len() != chunks.len() {
            return Err(BackendError::Invalid(format!(
                "{} window block tables for {} chunks",
                windows.len(),
                chunks.len()
            )));
        }
        let window = self.window().unwrap_or(1);
        let bs = wl.block_size;
        for (c, table) in chunks.iter().zip(windows) {
            let end = c.start_pos + c.tokens.len();
            let first = (c.start_pos + 1).saturating_sub(window) / bs;
            let held = table.get(first..end.div_ceil(bs)).ok_or_else(|| {
                BackendError::Invalid(format!(
                    "window block table of {} blocks for positions {}..{end}",
                    table.len(),
                    c.start_pos
                ))
            })?;
            if let Some(&b) = held.iter().find(|&&b| b as usize >= wl.blocks) {
                return Err(BackendError::Invalid(format!(
                    "window block {b} out of range (or not held)"
                )));
            }
        }
        Ok(())
    }

    /// The local layers' window, when they keep only it.
    fn window(&self) -> Option<usize> {
        self.kv_window?;
        self.cfg.family.sliding_window.as_ref().map(|w| w.window)
    }

    /// Makes room for a step of `t` rows (`g` of them on the GEMM path), `r` logit rows,
    /// `meta_len` metadata entries and `window_len` window-table entries.
    fn ensure(
        &mut self,
        t: usize,
        g: usize,
        r: usize,
        meta_len: usize,
        window_len: usize,
    ) -> Result<(), GpuError> {
        let c = &self.cfg;
        let (h, qd, f, v) = (c.hidden, c.q_dim(), c.ffn, c.vocab);
        let qkv = qd + 2 * c.kv_dim();
        // With QK norm every row's raw QKV product waits in `big` for `qkv_heads`.
        let raw_rows = if self.layers.iter().any(|l| l.run.qk_norm) {
            t
        } else {
            0
        };
        let b = &mut self.bufs;
        let gpu = &mut self.gpu;
        let bump = &mut b.generation;
        grow(gpu, &mut b.x, t * h * F32, bump)?;
        grow(gpu, &mut b.q, t * qd * F32, bump)?;
        grow(gpu, &mut b.att, t * qd * F32, bump)?;
        grow(gpu, &mut b.act, t * f * F32, bump)?;
        grow(gpu, &mut b.o, t * h * F32, bump)?;
        grow(gpu, &mut b.logits, r.max(1) * v * F32, bump)?;
        grow(gpu, &mut b.meta, meta_len * 4, bump)?;
        if window_len > 0 {
            grow(gpu, &mut b.meta_window, window_len * 4, bump)?;
        }
        if g > 0 {
            grow(gpu, &mut b.h16, g * h.max(qd).max(f) * F16, bump)?;
        }
        let big = (g * qkv.max(2 * f)).max(raw_rows * qkv);
        if big > 0 {
            grow(gpu, &mut b.big, big * F32, bump)?;
        }
        Ok(())
    }

    /// Queues the whole model for a step of `t` rows whose first `a` take the matvec kernels,
    /// with `r` logit rows; the metadata is already on the device. Each layer's launches are
    /// those its ops lowered to ([`LayerLaunches`]).
    fn enqueue(&mut self, t: usize, a: usize, r: usize) -> Result<(), GpuError> {
        let c = self.cfg.clone();
        let (h, qd, f) = (c.hidden, c.q_dim(), c.ffn);
        let nqkv = qd + 2 * c.kv_dim();
        let g = t - a;
        let eps = Arg::F32(c.rms_eps);
        let b = &self.bufs;
        let (x, q, att, act, meta) = (b.x.ptr, b.q.ptr, b.att.ptr, b.act.ptr, b.meta.ptr);
        let (o, h16, big, logits) = (b.o.ptr, b.h16.ptr, b.big.ptr, b.logits.ptr);
        let mt = i32_arg(t);
        // The full pool's tables follow the tokens and positions in `meta`.
        let full_tabs = meta + (2 * t * 4) as u64;
        let window_tabs = b.meta_window.ptr;
        let row = |base: u64, width: usize| base + (a * width * F32) as u64;
        let ek = self.k.by_fmt[self.embed.fmt.id()].embed;
        self.launch(
            ek,
            layout::row_shape(t),
            &[
                Arg::Ptr(self.embed.ptr),
                i32_arg(self.embed.rows),
                Arg::Ptr(meta),
                Arg::Ptr(x),
                Arg::F32(self.plan.embed_scale),
            ],
        )?;
        for li in 0..self.layers.len() {
            let l = &self.layers[li];
            let (qkv, wo, gu, down) = (l.qkv.clone(), l.wo, l.gu, l.down);
            let (bias, attn_norm, ffn_norm) = (l.bias, l.attn_norm, l.ffn_norm);
            let (q_norm, k_norm, inv) = (l.q_norm, l.k_norm, l.inv_freq);
            let (attn_post, ffn_post) = (l.attn_post_norm, l.ffn_post_norm);
            let run = l.run;
            // This layer's pool, its index there, the pool's layer count and block tables.
            let slot = self.layer_kv[li];
            let (kv, kv_layers, tabs) = match self.kv_window {
                Some((ptr, wl)) if slot.window => (ptr, wl.layers, window_tabs),
                _ => (self.kv, self.kv_layout.layers, full_tabs),
            };
            let (layer, kv_layers, tabs) =
                (i32_arg(slot.index), i32_arg(kv_layers), Arg::Ptr(tabs));
            let gelu = Arg::I32(i32::from(run.gelu_arg()));
            // Attention block. Without QK norm the QKV epilogues add the bias, rotate and
            // store; with it the raw products of every row go to `big` and `qkv_heads` does
            // that per whole head, after the norm.
            // One launch per section; a section's rows are whole heads, so its pairs are the
            // fused matrix's pairs row0/2 .. (row0 + rows)/2.
            for &(row0, m) in qkv.parts.iter().filter(|_| a > 0) {
                let fk = self.k.by_fmt[m.fmt.id()];
                let (p0, p1) = (row0 / 2, (row0 + m.rows) / 2);
                let mut args = vec![
                    Arg::Ptr(m.ptr),
                    i32_arg(m.rows),
                    i32_arg(row0),
                    i32_arg(p0),
                    i32_arg(p1),
                    Arg::Ptr(x),
                    i32_arg(a),
                    Arg::Ptr(attn_norm),
                    eps,
                ];
                let kernel = if run.qk_norm {
                    args.push(Arg::Ptr(big));
                    fk.qkv_raw
                } else {
                    args.extend([
                        Arg::Ptr(bias),
                        Arg::Ptr(q),
                        Arg::Ptr(kv),
                        layer,
                        kv_layers,
                        Arg::Ptr(meta),
                        mt,
                        tabs,
                        Arg::I32(0),
                        Arg::Ptr(inv),
                    ]);
                    fk.qkv
                };
                self.launch(kernel, layout::mv_shape(p1 - p0, 1, a), &args)?;
            }
            if g > 0 {
                self.launch(
                    self.k.rmsnorm_h,
                    layout::row_shape(g),
                    &[Arg::Ptr(row(x, h)), Arg::Ptr(attn_norm), eps, Arg::Ptr(h16)],
                )?;
                self.gpu.gemm(&Gemm {
                    m: qkv.rows,
                    n: g,
                    k: h,
                    a: qkv.h16,
                    b: h16,
                    ldb: h,
                    c: if run.qk_norm { row(big, nqkv) } else { big },
                    ldc: qkv.rows,
                    accumulate: false,
                })?;
                if !run.qk_norm {
                    self.launch(
                        self.k.qkv_post,
                        layout::elem_shape(g * self.kc.qkv_pairs()),
                        &[
                            Arg::Ptr(big),
                            i32_arg(g),
                            Arg::Ptr(bias),
                            Arg::Ptr(q),
                            Arg::Ptr(kv),
                            layer,
                            kv_layers,
                            Arg::Ptr(meta),
                            mt,
                            tabs,
                            i32_arg(a),
                            Arg::Ptr(inv),
                        ],
                    )?;
                }
            }
            if run.qk_norm {
                let heads = c.heads + 2 * c.kv_heads;
                self.launch(
                    self.k.qkv_heads,
                    layout::row_shape(t * heads),
                    &[
                        Arg::Ptr(big),
                        mt,
                        Arg::I32(0),
                        Arg::Ptr(bias),
                        Arg::Ptr(q_norm),
                        Arg::Ptr(k_norm),
                        eps,
                        Arg::Ptr(q),
                        Arg::Ptr(kv),
                        layer,
                        kv_layers,
                        Arg::Ptr(meta),
                        mt,
                        tabs,
                        Arg::Ptr(inv),
                    ],
                )?;
            }
            self.launch(
                self.k.attn,
                layout::attn_shape(t, c.kv_heads, self.kc.att_warps),
                &[
                    Arg::Ptr(q),
                    Arg::Ptr(att),
                    Arg::Ptr(kv),
                    layer,
                    kv_layers,
                    Arg::Ptr(meta),
                    mt,
                    tabs,
                    Arg::F32(run.attention.scale),
                    i32_arg(run.window_arg()),
                    Arg::F32(run.softcap_arg()),
                ],
            )?;
            // The output projection adds into the residual, or (post-norm) writes `o`.
            let (dst, add) = if run.attn_post_norm { (o, 0) } else { (x, 1) };
            if a > 0 {
                let kr = self.k.by_fmt[wo.fmt.id()].resid;
                self.launch(
                    kr,
                    layout::mv_shape(h, 2, a),
                    &[
                        Arg::Ptr(wo.ptr),
                        i32_arg(h),
                        i32_arg(qd),
                        Arg::Ptr(att),
                        i32_arg(a),
                        Arg::Ptr(dst),
                        Arg::I32(add),
                    ],
                )?;
            }
            if g > 0 {
                self.launch(
                    self.k.to_half,
                    layout::elem_shape(g * qd),
                    &[Arg::Ptr(row(att, qd)), Arg::Ptr(h16), i32_arg(g * qd)],
                )?;
                self.gpu.gemm(&Gemm {
                    m: h,
                    n: g,
                    k: qd,
                    a: wo.h16,
                    b: h16,
                    ldb: qd,
                    c: row(dst, h),
                    ldc: h,
                    accumulate: add == 1,
                })?;
            }
            if run.attn_post_norm {
                self.launch(
                    self.k.postnorm_add,
                    layout::row_shape(t),
                    &[Arg::Ptr(o), Arg::Ptr(attn_post), eps, Arg::Ptr(x)],
                )?;
            }
            // Feed-forward block.
            let (dst, add) = if run.ffn_post_norm { (o, 0) } else { (x, 1) };
            if a > 0 {
                let ks = self.k.by_fmt[gu.fmt.id()].silu;
                self.launch(
                    ks,
                    layout::mv_shape(f, 1, a),
                    &[
                        Arg::Ptr(gu.ptr),
                        Arg::Ptr(x),
                        i32_arg(a),
                        Arg::Ptr(ffn_norm),
                        eps,
                        Arg::Ptr(act),
                        gelu,
                    ],
                )?;
                let kr = self.k.by_fmt[down.fmt.id()].resid;
                self.launch(
                    kr,
                    layout::mv_shape(h, 2, a),
                    &[
                        Arg::Ptr(down.ptr),
                        i32_arg(h),
                        i32_arg(f),
                        Arg::Ptr(act),
                        i32_arg(a),
                        Arg::Ptr(dst),
                        Arg::I32(add),
                    ],
                )?;
            }
            if g > 0 {
                self.launch(
                    self.k.rmsnorm_h,
                    layout::row_shape(g),
                    &[Arg::Ptr(row(x, h)), Arg::Ptr(ffn_norm), eps, Arg::Ptr(h16)],
                )?;
                self.gpu.gemm(&Gemm {
                    m: 2 * f,
                    n: g,
                    k: h,
                    a: gu.h16,
                    b: h16,
                    ldb: h,
                    c: big,
                    ldc: 2 * f,
                    accumulate: false,
                })?;
                self.launch(
                    self.k.silu_mul_h,
                    layout::elem_shape(g * f),
                    &[Arg::Ptr(big), Arg::Ptr(h16), i32_arg(g), gelu],
                )?;
                self.gpu.gemm(&Gemm {
                    m: h,
                    n: g,
                    k: f,
                    a: down.h16,
                    b: h16,
                    ldb: f,
                    c: row(dst, h),
                    ldc: h,
                    accumulate: add == 1,
                })?;
            }
            if run.ffn_post_norm {
                self.launch(
                    self.k.postnorm_add,
                    layout::row_shape(t),
                    &[Arg::Ptr(o), Arg::Ptr(ffn_post), eps, Arg::Ptr(x)],
                )?;
            }
        }
        if r > 0 {
            let out = self.output;
            let kl = self.k.by_fmt[out.fmt.id()].logits;
            self.launch(
                kl,
                layout::mv_shape(c.vocab, 2, r),
                &[
                    Arg::Ptr(out.ptr),
                    i32_arg(c.vocab),
                    Arg::Ptr(x),
                    Arg::Ptr(meta),
                    mt,
                    i32_arg(r),
                    Arg::Ptr(self.norm),
                    eps,
                    Arg::Ptr(logits),
                    Arg::F32(self.plan.final_softcap.unwrap_or(0.0)),
                ],
            )?;
        }
        Ok(())
    }

    /// Whether this step replays the batch-1 graph (capturing it first when needed).
    fn run_graph(&mut self, plan: &StepPlan) -> Result<bool, GpuError> {
        if !self.opts.graphs || plan.rows != 1 || plan.gemv_rows != 1 || plan.logit_rows != 1 {
            return Ok(false);
        }
        if self.graph_generation != Some(self.bufs.generation) {
            self.gpu.capture_begin()?;
            let recorded = self.enqueue(1, 1, 1);
            let ended = self.gpu.capture_end();
            if let Err(e) = recorded.and(ended) {
                tracing::warn!(error = %e, "CudaBackend.GraphCaptureFailed");
                self.opts.graphs = false;
                return Ok(false);
            }
            self.graph_generation = Some(self.bufs.generation);
        }
        self.gpu.graph_launch()?;
        Ok(true)
    }

    fn step(
        &mut self,
        chunks: &[SeqChunk<'_>],
        windows: &[&[u32]],
        logits: &mut Vec<f32>,
    ) -> Result<StepStats, BackendError> {
        let dev = |e: GpuError| BackendError::Device(e.0);
        self.validate(chunks)?;
        self.validate_windows(chunks, windows)?;
        if chunks.is_empty() {
            return Ok(StepStats::default());
        }
        let gemm_min = self.gemm.then_some(self.opts.gemm_min_rows);
        let plan = StepPlan::build(chunks, self.kv_layout.block_size, gemm_min, windows)
            .map_err(BackendError::Invalid)?;
        let (t, a, r) = (plan.rows, plan.gemv_rows, plan.logit_rows);
        self.ensure(t, t - a, r, plan.meta.len(), plan.meta_window.len())
            .map_err(dev)?;
        let bytes = |v: &[i32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
        self.gpu.timer_start().map_err(dev)?;
        self.gpu
            .upload(self.bufs.meta.ptr, &bytes(&plan.meta))
            .map_err(dev)?;
        if !plan.meta_window.is_empty() {
            self.gpu
                .upload(self.bufs.meta_window.ptr, &bytes(&plan.meta_window))
                .map_err(dev)?;
        }
        if !self.run_graph(&plan).map_err(dev)? {
            self.enqueue(t, a, r).map_err(dev)?;
        }
        self.gpu.timer_stop().map_err(dev)?;
        if r > 0 {
            let start = logits.len();
            logits.resize(start + r * self.cfg.vocab, 0.0);
            self.gpu
                .download(&mut logits[start..], self.bufs.logits.ptr)
                .map_err(dev)?;
        }
        let device_time = self.gpu.timer_read().map_err(dev)?;
        Ok(StepStats { device_time })
    }

    /// Bytes of weights on the device (packed matrices, f16 copies, vectors).
    pub fn weight_bytes(&self) -> usize {
        self.weight_bytes
    }

    /// The KV storage's size in bytes (both pools).
    pub fn kv_bytes(&self) -> usize {
        self.kv_layout.bytes() + self.kv_window.map_or(0, |(_, wl)| wl.bytes())
    }

    /// Fills window-pool blocks `blocks` with f16 NaN: a check (used by the tests) that no
    /// kernel reads blocks the window has passed, since any read of them poisons the output.
    /// Nothing to do without a window pool.
    pub fn poison_window_blocks(&mut self, blocks: &[u32]) -> Result<(), GpuError> {
        let Some((ptr, wl)) = self.kv_window else {
            return Ok(());
        };
        let per_block = wl.offset(1, 0, 0, 0, 0) * F16;
        let nan: Vec<u8> = std::iter::repeat_n(half::f16::NAN.to_le_bytes(), per_block / F16)
            .flatten()
            .collect();
        for &b in blocks {
            let b = b as usize;
            if b >= wl.blocks {
                return Err(GpuError(format!("window block {b} out of range")));
            }
            self.gpu.upload(ptr + (b * per_block) as u64, &nan)?;
        }
        Ok(())
    }

    /// The options in force (graphs are switched off here if a capture failed).
    pub fn options(&self) -> &CudaOptions {
        &self.opts
    }

    /// Whether prompt chunks take the cuBLAS GEMM path.
    pub fn uses_gemm(&self) -> bool {
        self.gemm
    }

    /// The device.
    pub fn gpu(&self) -> &G {
        &self.gpu
    }
}

fn resolve(names: &[String], formats: &[WFormat]) -> Result<Kernels, GpuError> {
    let idx: HashMap<&str, usize> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), i))
        .collect();
    let get = |n: &str| {
        idx.get(n)
            .copied()
            .ok_or_else(|| GpuError(format!("kernel {n} missing")))
    };
    let mut k = Kernels {
        attn: get("attn")?,
        rmsnorm_h: get("rmsnorm_h")?,
        qkv_post: get("qkv_post")?,
        to_half: get("to_half")?,
        silu_mul_h: get("silu_mul_h")?,
        qkv_heads: get("qkv_heads")?,
        postnorm_add: get("postnorm_add")?,
        by_fmt: [FmtKernels::default(); WFormat::ALL.len()],
    };
    for f in formats {
        k.by_fmt[f.id()] = FmtKernels {
            qkv: get(&fmt_kernel("mv_qkv", *f))?,
            qkv_raw: get(&fmt_kernel("mv_qkv_raw", *f))?,
            silu: get(&fmt_kernel("mv_silu", *f))?,
            resid: get(&fmt_kernel("mv_resid", *f))?,
            logits: get(&fmt_kernel("mv_logits", *f))?,
            embed: get(&fmt_kernel("embed", *f))?,
            dequant: get(&fmt_kernel("dequant_h", *f))?,
        };
    }
    Ok(k)
}

#[allow(clippy::cast_precision_loss)]
fn mib(b: usize) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

impl<G: Gpu> Backend for GpuBackend<G> {
    fn forward_windowed(
        &mut self,
        chunks: &[SeqChunk<'_>],
        windows: &[&[u32]],
        logits: &mut Vec<f32>,
    ) -> Result<StepStats, BackendError> {
        // cudarc panics when a library function is missing; keep that from killing the
        // scheduler thread.
        let step = std::panic::AssertUnwindSafe(|| self.step(chunks, windows, logits));
        std::panic::catch_unwind(step).unwrap_or_else(|_| {
            Err(BackendError::Device(
                "the CUDA libraries failed during the step".into(),
            ))
        })
    }

    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn block_size(&self) -> usize {
        self.kv_layout.block_size
    }

    fn num_blocks(&self) -> usize {
        self.kv_layout.blocks
    }

    fn kv_block_bytes(&self) -> usize {
        self.kv_layout.offset(1, 0, 0, 0, 0) * F16
    }

    fn windowed_kv(&self) -> Option<WindowedKv> {
        let (_, wl) = self.kv_window?;
        Some(WindowedKv {
            window: self.window()?,
            blocks: wl.blocks,
            block_bytes: wl.offset(1, 0, 0, 0, 0) * F16,
        })
    }

    fn isa_name(&self) -> &'static str {
        "cuda"
    }

    /// Chunks below the GEMM threshold: their rows take the quantized matvec kernels, each row
    /// as a one-token step does (the cuBLAS GEMM path sums in another order).
    fn exact_rows(&self) -> usize {
        if self.gemm {
            self.opts.gemm_min_rows.saturating_sub(1).max(1)
        } else {
            usize::MAX
        }
    }

    fn weight_bytes_per_step(&self) -> usize {
        self.weight_bytes
    }

    fn describe(&self) -> String {
        let fmts: Vec<&str> = self.kc.formats.iter().map(|f| f.name()).collect();
        format!(
            "{} {} (weights {} on device, {:.0} MiB; prefill {}; KV {} blocks × {} positions{}, {:.0} MiB; graphs {})",
            self.label,
            self.gpu.describe(),
            fmts.join("/"),
            mib(self.weight_bytes),
            if self.gemm {
                format!("f16 GEMM for chunks ≥ {} tokens", self.opts.gemm_min_rows)
            } else {
                "quantized matvec".into()
            },
            self.kv_layout.blocks,
            self.kv_layout.block_size,
            self.windowed_kv().map_or(String::new(), |w| format!(
                " + window pool {} blocks for the last {} positions",
                w.blocks, w.window
            )),
            mib(self.kv_bytes()),
            if self.opts.graphs { "on" } else { "off" },
        )
    }
}

impl<G: Gpu> Drop for GpuBackend<G> {
    fn drop(&mut self) {
        let b = &self.bufs;
        for p in [
            b.x,
            b.q,
            b.att,
            b.act,
            b.o,
            b.logits,
            b.meta,
            b.meta_window,
            b.h16,
            b.big,
        ] {
            if p.ptr != 0 {
                self.gpu.free(p.ptr);
            }
        }
        for p in std::mem::take(&mut self.owned) {
            self.gpu.free(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{kv_block_bytes, kv_bytes_per_sequence};
    use crate::model::config::{Arch, RopeStyle, SlidingWindow};

    /// Gemma 3 270M's shape: 18 layers, every 6th global, the others with a 512-position
    /// window; one KV head of 256 dimensions.
    fn gemma3_270m() -> ModelConfig {
        let mut cfg = ModelConfig {
            arch: Arch::Llama,
            name: "gemma3-270m".into(),
            vocab: 262_144,
            hidden: 640,
            layers: 18,
            heads: 4,
            kv_heads: 1,
            head_dim: 256,
            ffn: 2048,
            context: 32_768,
            rms_eps: 1e-6,
            rope_theta: 1e6,
            rope_style: RopeStyle::Neox,
            rope_scaling: None,
            qkv_bias: false,
            family: Default::default(),
        };
        cfg.family.sliding_window = Some(SlidingWindow::periodic(512, 6, 18));
        cfg
    }

    #[test]
    fn local_layers_number_the_window_pool_and_globals_the_full_pool() {
        let cfg = gemma3_270m();
        let (slots, globals, locals) = kv_slots(&cfg, true);
        assert_eq!((globals, locals), (3, 15));
        for (l, s) in slots.iter().enumerate() {
            assert_eq!(s.window, cfg.family.window(l).is_some(), "layer {l}");
        }
        // Layers 5, 11 and 17 are global: indices 0..3 of the full pool, in order.
        let full: Vec<usize> = (0..18).filter(|&l| !slots[l].window).collect();
        assert_eq!(full, [5, 11, 17]);
        assert_eq!(slots[17].index, 2);
        assert_eq!(slots[16].index, 14);
        // Without a window pool every layer is in the full pool, at its own index.
        let (whole, g, w) = kv_slots(&cfg, false);
        assert_eq!((g, w), (18, 0));
        assert!(
            whole
                .iter()
                .enumerate()
                .all(|(l, s)| !s.window && s.index == l)
        );
    }

    /// The memory figure of `docs/gpu.md`, from the code's own byte functions: at 4,096
    /// positions (blocks of 16) a sequence holds 72 MiB of KV whole and 19.5 MiB windowed, and
    /// the device pools' block bytes are the same functions'.
    #[test]
    fn gemma3_270m_kv_at_4096_positions() {
        let cfg = gemma3_270m();
        let whole = kv_bytes_per_sequence(&cfg, 16, 4096, false);
        let windowed = kv_bytes_per_sequence(&cfg, 16, 4096, true);
        assert_eq!(whole, 72 << 20);
        assert_eq!(windowed, (39 << 20) / 2);
        let (_, globals, locals) = kv_slots(&cfg, true);
        let pool = |layers| KvLayout {
            layers,
            kv_heads: cfg.kv_heads,
            head_dim: cfg.head_dim,
            block_size: 16,
            blocks: 1,
        };
        assert_eq!(pool(globals).bytes(), kv_block_bytes(&cfg, 3, 16));
        assert_eq!(pool(locals).bytes(), kv_block_bytes(&cfg, 15, 16));
    }
}
