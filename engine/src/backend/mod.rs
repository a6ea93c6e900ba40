//! Compute backends. Each runs the model's forward pass over a batch of sequence chunks and
//! owns the KV cache storage on its device; which blocks belong to which sequence is decided
//! by the host-side [`crate::kv_cache::KvPools`], the same for every backend. A backend whose
//! [`Backend::windowed_kv`] says so keeps the sliding-window layers' KV in a pool of its own,
//! holding only their window; the others keep every layer's KV whole.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(not(feature = "cuda"))]
pub mod cuda_stub;
#[cfg(not(feature = "cuda"))]
pub use cuda_stub as cuda;

use std::time::Duration;

use crate::model::config::ModelConfig;

/// New tokens of one sequence to run through the model in one step.
#[derive(Debug, Clone, Copy)]
pub struct SeqChunk<'a> {
    /// The tokens (a prefill chunk, or the one token to decode).
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`.
    pub start_pos: usize,
    /// The sequence's KV block table, long enough for `start_pos + tokens.len()` positions.
    pub blocks: &'a [u32],
    /// Logits for every token (true) or only the last (false).
    pub all_logits: bool,
    /// No logits at all (a prefill chunk that is not the prompt's last).
    pub no_logits: bool,
}

impl SeqChunk<'_> {
    /// How many logit rows this chunk produces.
    pub fn logit_rows(&self) -> usize {
        if self.no_logits {
            0
        } else if self.all_logits {
            self.tokens.len()
        } else {
            1
        }
    }
}

/// What one forward step measured.
#[derive(Debug, Clone, Copy, Default)]
pub struct StepStats {
    /// Time the device spent on the step (wall time on the CPU; event time on a GPU).
    pub device_time: Duration,
}

/// Why a step failed.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// A chunk does not fit its block table or the context.
    #[error("invalid step: {0}")]
    Invalid(String),
    /// The device failed.
    #[error("device error: {0}")]
    Device(String),
}

/// The window pool of a backend whose local (sliding-window) layers keep only their window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct WindowedKv {
    /// Positions a local layer sees (`q - p < window`).
    pub window: usize,
    /// Blocks in the window pool.
    pub blocks: usize,
    /// Bytes of one window-pool block (the local layers' keys and values).
    pub block_bytes: usize,
}

/// Bytes of one block of `block_size` positions of f16 keys and values over `layers` layers.
pub fn kv_block_bytes(cfg: &ModelConfig, layers: usize, block_size: usize) -> usize {
    layers * 2 * cfg.kv_dim() * std::mem::size_of::<u16>() * block_size
}

/// Bytes of f16 KV a sequence of `positions` positions holds, in blocks of `block_size`:
/// with `windowed`, the global layers hold every block and the local (sliding-window) layers
/// only the blocks from the one their window starts in
/// ([`crate::kv_cache::pools::first_kept`]) on; without, every layer holds every block.
pub fn kv_bytes_per_sequence(
    cfg: &ModelConfig,
    block_size: usize,
    positions: usize,
    windowed: bool,
) -> usize {
    let bs = block_size.max(1);
    let blocks = positions.div_ceil(bs);
    let Some(sw) = cfg.family.sliding_window.as_ref().filter(|_| windowed) else {
        return blocks * kv_block_bytes(cfg, cfg.layers, bs);
    };
    let locals = (0..cfg.layers)
        .filter(|&l| cfg.family.window(l).is_some())
        .count();
    let first = crate::kv_cache::pools::first_kept(positions, sw.window, bs);
    blocks * kv_block_bytes(cfg, cfg.layers - locals, bs)
        + blocks.saturating_sub(first) * kv_block_bytes(cfg, locals, bs)
}

/// A device that can run the model.
pub trait Backend: Send {
    /// Runs one forward step; appends `vocab`-wide logit rows to `logits` in chunk order.
    /// The same as [`Backend::forward_windowed`] without window tables.
    fn forward(
        &mut self,
        chunks: &[SeqChunk<'_>],
        logits: &mut Vec<f32>,
    ) -> Result<StepStats, BackendError> {
        self.forward_windowed(chunks, &[], logits)
    }
    /// The model's configuration.
    fn config(&self) -> &ModelConfig;
    /// Positions per KV block.
    fn block_size(&self) -> usize;
    /// Number of KV blocks the device holds (in the full pool, with a window pool beside it).
    fn num_blocks(&self) -> usize;
    /// A one-line description (device, kernels, threads).
    fn describe(&self) -> String;
    /// The kernels' instruction set or device kind, as benchmarks report it (`avx2`, `scalar`,
    /// `cuda`).
    fn isa_name(&self) -> &'static str;
    /// Bytes of weights one decode step reads.
    fn weight_bytes_per_step(&self) -> usize;
    /// The most positions of one chunk for which every row's logits are, bit for bit, those a
    /// one-token step at that position gives. A draft's verification (speculative decoding)
    /// stays within it, so that greedy output is the same with drafts and without. 1 (no
    /// drafts) unless the backend says more.
    fn exact_rows(&self) -> usize {
        1
    }
    /// Bytes of one block of the (full) KV pool. By default every layer's f16 keys and values.
    fn kv_block_bytes(&self) -> usize {
        kv_block_bytes(self.config(), self.config().layers, self.block_size())
    }
    /// The window pool, when the local layers keep only their window's KV; `None` (the
    /// default) keeps every layer's KV whole in the full pool.
    fn windowed_kv(&self) -> Option<WindowedKv> {
        None
    }
    /// One forward step with each chunk's window-pool block table (`windows[i]` for
    /// `chunks[i]`, indexed like its full table; entries the window has passed are
    /// [`crate::kv_cache::RELEASED`]); empty without [`Backend::windowed_kv`].
    fn forward_windowed(
        &mut self,
        chunks: &[SeqChunk<'_>],
        windows: &[&[u32]],
        logits: &mut Vec<f32>,
    ) -> Result<StepStats, BackendError>;
}
