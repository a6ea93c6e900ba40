//! Shared helpers for the engine's integration tests.
#![allow(dead_code, missing_docs)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use slotlight_engine::backend::cpu::CpuBackend;
use slotlight_engine::backend::{Backend, SeqChunk};
use slotlight_engine::model::loader::Model;

/// The default model, when present: `SLOTLIGHT_MODEL`, else the cache. `None` (and a note on
/// stderr) when absent, unless `SLOTLIGHT_REQUIRE_MODEL=1`, in which case the test fails.
pub fn default_model() -> Option<PathBuf> {
    let p = std::env::var_os("SLOTLIGHT_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(slotlight_engine::known_models::path);
    if p.exists() {
        return Some(p);
    }
    if std::env::var("SLOTLIGHT_REQUIRE_MODEL").is_ok_and(|v| v == "1") {
        panic!(
            "the default model is required but missing at {}",
            p.display()
        );
    }
    eprintln!(
        "skipping: the default model is not at {} (run `slotlight-engine fetch-model`)",
        p.display()
    );
    None
}

/// The engine's fixtures folder.
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("fixtures")
}

/// A CPU backend over `model` with room for `positions` positions.
pub fn cpu_backend(model: &Model, positions: usize) -> CpuBackend {
    let pool = Arc::new(slotlight_engine::backend::cpu::pool::ComputePool::new(2));
    CpuBackend::new(
        model.config.clone(),
        Arc::clone(&model.weights),
        16,
        positions.div_ceil(16) + 1,
        pool,
    )
}

/// Logits for every position of `tokens` (teacher forcing), `tokens.len() × vocab`.
pub fn all_logits(backend: &mut dyn Backend, tokens: &[u32]) -> Vec<f32> {
    let blocks: Vec<u32> = (0..u32::try_from(backend.num_blocks()).expect("blocks")).collect();
    let mut logits = Vec::new();
    backend
        .forward(
            &[SeqChunk {
                tokens,
                start_pos: 0,
                blocks: &blocks,
                all_logits: true,
                no_logits: false,
            }],
            &mut logits,
        )
        .expect("forward");
    logits
}

/// Index of the largest value.
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    u32::try_from(best).expect("index")
}

pub mod server;
