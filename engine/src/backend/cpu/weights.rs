//! The model's weights as the CPU backend uses them: matrices with integer kernels repacked
//! once at load ([`super::packed`]), everything else read in place from the model file.

use std::sync::Arc;

use super::matmul::Weight;
use super::packed::pack_all;
use crate::model::llama::LlamaWeights;
use crate::model::weights::Tensor;

/// One transformer block's matrices.
#[derive(Debug)]
pub struct CpuBlock {
    /// Query projection.
    pub wq: Weight,
    /// Key projection.
    pub wk: Weight,
    /// Value projection.
    pub wv: Weight,
    /// Output projection.
    pub wo: Weight,
    /// Gate projection.
    pub w_gate: Weight,
    /// Up projection.
    pub w_up: Weight,
    /// Down projection.
    pub w_down: Weight,
}

/// All weights, shared by every CPU group of the process (packed once).
#[derive(Debug)]
pub struct CpuWeights {
    /// The model's own weights (embedding, norms, biases; the file's matrices).
    pub model: Arc<LlamaWeights>,
    /// Per block matrices.
    pub blocks: Vec<CpuBlock>,
    /// The output projection (the embedding when tied).
    pub output: Weight,
}

impl CpuWeights {
    /// Packs `model`'s matrices (into one arena).
    pub fn new(model: Arc<LlamaWeights>) -> Self {
        let mut sets: Vec<Vec<&Tensor>> = Vec::new();
        for b in &model.blocks {
            for t in [&b.wq, &b.wk, &b.wv, &b.wo, &b.w_gate, &b.w_up, &b.w_down] {
                sets.push(vec![t]);
            }
        }
        sets.push(vec![&model.output]);
        let packed = pack_all(&sets);
        for (p, set) in packed.iter().zip(&sets) {
            if p.is_some() {
                set.iter().for_each(|t| t.release_resident());
            }
        }
        let mut weights = packed.into_iter().zip(&sets).map(|(p, set)| match p {
            Some(p) => Weight::Packed(p),
            // A single tensor is always usable in place.
            None => Weight::Plain(set[0].clone()),
        });
        let mut next = || weights.next().expect("one weight per set");
        let blocks = model
            .blocks
            .iter()
            .map(|_| CpuBlock {
                wq: next(),
                wk: next(),
                wv: next(),
                wo: next(),
                w_gate: next(),
                w_up: next(),
                w_down: next(),
            })
            .collect();
        let output = next();
        drop(sets);
        Self {
            model,
            blocks,
            output,
        }
    }

    /// Bytes of weights one decode step reads (every matrix once).
    pub fn bytes_per_step(&self) -> usize {
        let blocks: usize = self
            .blocks
            .iter()
            .map(|b| {
                [&b.wq, &b.wk, &b.wv, &b.wo, &b.w_gate, &b.w_up, &b.w_down]
                    .iter()
                    .map(|w| w.bytes())
                    .sum::<usize>()
            })
            .sum();
        blocks + self.output.bytes()
    }
}
