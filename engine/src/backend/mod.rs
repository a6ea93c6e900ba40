//! Compute backends. Each runs the model's forward pass over a batch of sequence chunks and
//! owns the KV cache storage on its device; which blocks belong to which sequence is decided
//! by the host-side [`crate::kv_cache::BlockManager`], the same for every backend.

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

/// A device that can run the model.
pub trait Backend: Send {
    /// Runs one forward step; appends `vocab`-wide logit rows to `logits` in chunk order.
    fn forward(
        &mut self,
        chunks: &[SeqChunk<'_>],
        logits: &mut Vec<f32>,
    ) -> Result<StepStats, BackendError>;
    /// The model's configuration.
    fn config(&self) -> &ModelConfig;
    /// Positions per KV block.
    fn block_size(&self) -> usize;
    /// Number of KV blocks the device holds.
    fn num_blocks(&self) -> usize;
    /// A one-line description (device, kernels, threads).
    fn describe(&self) -> String;
    /// The kernels' instruction set or device kind, as benchmarks report it (`avx2`, `scalar`,
    /// `cuda`).
    fn isa_name(&self) -> &'static str;
    /// Bytes of weights one decode step reads.
    fn weight_bytes_per_step(&self) -> usize;
}
