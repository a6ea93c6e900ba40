//! Helpers shared by the CUDA tests (`cuda_emu.rs`, `cuda_parity.rs`); included with
//! `#[path]`, and also built on its own as an empty test crate.
#![allow(dead_code, missing_docs)]

use std::path::PathBuf;
use std::sync::Arc;

use slotlight_engine::backend::{Backend, SeqChunk};
use slotlight_engine::model::config::ModelConfig;
use slotlight_engine::model::llama::LlamaWeights;

/// The engine's test fixtures: under `$SLOTLIGHT_ENGINE_DIR` when set (prebuilt test binaries
/// run on another machine, see `scripts/gpu-check.sh`), else this crate's folder.
pub fn fixtures() -> PathBuf {
    std::env::var_os("SLOTLIGHT_ENGINE_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join("tests")
        .join("fixtures")
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

pub fn cpu_backend(cfg: &ModelConfig, w: &Arc<LlamaWeights>, positions: usize) -> impl Backend {
    let pool = Arc::new(slotlight_engine::backend::cpu::pool::ComputePool::new(2));
    slotlight_engine::backend::cpu::CpuBackend::new(
        cfg.clone(),
        Arc::clone(w),
        16,
        positions.div_ceil(16) + 1,
        pool,
    )
}

pub fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

pub fn tokens(n: usize, vocab: usize) -> Vec<u32> {
    (0..n)
        .map(|i| u32::try_from((i * 37 + 11) % vocab).expect("token"))
        .collect()
}

/// Prefills `prompts` one at a time, then decodes `steps` greedy tokens either each sequence
/// alone or all in one batch; returns every decode step's logits per sequence.
pub fn decode(
    b: &mut dyn Backend,
    prompts: &[Vec<u32>],
    steps: usize,
    batched: bool,
) -> Vec<Vec<Vec<f32>>> {
    let vocab = b.config().vocab;
    let per_seq = 8;
    let tables: Vec<Vec<u32>> = (0..prompts.len())
        .map(|s| {
            (0..per_seq)
                .map(|i| u32::try_from(s * per_seq + i).expect("block"))
                .collect()
        })
        .collect();
    let mut next = Vec::new();
    for (s, p) in prompts.iter().enumerate() {
        let mut logits = Vec::new();
        b.forward(
            &[SeqChunk {
                tokens: p,
                start_pos: 0,
                blocks: &tables[s],
                all_logits: false,
                no_logits: false,
            }],
            &mut logits,
        )
        .expect("prefill");
        next.push(argmax(&logits));
    }
    let mut pos: Vec<usize> = prompts.iter().map(Vec::len).collect();
    let mut out = vec![Vec::new(); prompts.len()];
    for _ in 0..steps {
        let toks: Vec<[u32; 1]> = next.iter().map(|&t| [t]).collect();
        let groups: Vec<Vec<usize>> = if batched {
            vec![(0..prompts.len()).collect()]
        } else {
            (0..prompts.len()).map(|s| vec![s]).collect()
        };
        for g in groups {
            let chunks: Vec<SeqChunk<'_>> = g
                .iter()
                .map(|&s| SeqChunk {
                    tokens: &toks[s],
                    start_pos: pos[s],
                    blocks: &tables[s],
                    all_logits: false,
                    no_logits: false,
                })
                .collect();
            let mut logits = Vec::new();
            b.forward(&chunks, &mut logits).expect("decode");
            for (i, &s) in g.iter().enumerate() {
                let row = logits[i * vocab..(i + 1) * vocab].to_vec();
                next[s] = argmax(&row);
                out[s].push(row);
            }
        }
        for p in &mut pos {
            *p += 1;
        }
    }
    out
}
