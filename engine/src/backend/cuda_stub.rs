//! Stand-in for the CUDA backend when the `cuda` feature is off: every entry point reports
//! that this build has no CUDA support.

use std::sync::Arc;

use crate::backend::{Backend, BackendError, SeqChunk, StepStats};
use crate::model::config::ModelConfig;
use crate::model::llama::LlamaWeights;

/// Why CUDA cannot be used.
#[derive(Debug, Clone, thiserror::Error)]
#[error("this slotlight-engine was built without CUDA support (rebuild with `--features cuda`)")]
pub struct NotCompiled;

/// Checks whether a CUDA device could be used; always fails in this build.
pub fn probe(_ordinal: usize) -> Result<String, NotCompiled> {
    Err(NotCompiled)
}

/// Run-time choices of the CUDA backend (accepted and ignored in this build).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CudaOptions;

impl CudaOptions {
    /// The defaults.
    pub fn from_env() -> Self {
        Self
    }
}

/// The CUDA backend; no value exists in this build.
#[derive(Debug)]
pub enum CudaBackend {}

impl CudaBackend {
    /// Always fails: this build has no CUDA support.
    pub fn new(
        _cfg: ModelConfig,
        _weights: Arc<LlamaWeights>,
        _ordinal: usize,
        _block_size: usize,
        _kv_blocks: usize,
        _window_blocks: Option<usize>,
        _opts: CudaOptions,
    ) -> Result<Self, NotCompiled> {
        Err(NotCompiled)
    }
}

impl Backend for CudaBackend {
    fn forward_windowed(
        &mut self,
        _chunks: &[SeqChunk<'_>],
        _windows: &[&[u32]],
        _logits: &mut Vec<f32>,
    ) -> Result<StepStats, BackendError> {
        match *self {}
    }

    fn config(&self) -> &ModelConfig {
        match *self {}
    }

    fn block_size(&self) -> usize {
        match *self {}
    }

    fn num_blocks(&self) -> usize {
        match *self {}
    }

    fn describe(&self) -> String {
        match *self {}
    }

    fn isa_name(&self) -> &'static str {
        match *self {}
    }

    fn exact_rows(&self) -> usize {
        match *self {}
    }

    fn weight_bytes_per_step(&self) -> usize {
        match *self {}
    }
}
