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
    /// The feed-forward.
    pub ffn: CpuFfn,
}

/// One gated MLP's matrices.
#[derive(Debug)]
pub struct CpuMlp {
    /// Gate projection.
    pub gate: Weight,
    /// Up projection.
    pub up: Weight,
    /// Down projection.
    pub down: Weight,
}

impl CpuMlp {
    fn bytes(&self) -> usize {
        self.gate.bytes() + self.up.bytes() + self.down.bytes()
    }
}

/// A block's feed-forward.
#[derive(Debug)]
pub enum CpuFfn {
    /// One MLP.
    Dense(CpuMlp),
    /// A mixture of experts: the router and each expert's MLP (each packed on its own, read
    /// in place from the file's stacks when not packed).
    Experts {
        /// Router `[count, hidden]`.
        router: Weight,
        /// The experts, in index order.
        experts: Vec<CpuMlp>,
    },
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
    /// Packs `model`'s matrices (into one arena); a mixture of experts is packed expert by
    /// expert.
    pub fn new(model: Arc<LlamaWeights>) -> Self {
        // Each expert's matrices, as slices of the file's stacks (sharing its bytes).
        let expert_slices: Vec<Vec<[Tensor; 3]>> = model
            .blocks
            .iter()
            .map(|b| match &b.router {
                Some(router) => {
                    let count = router.rows();
                    let f = b.w_gate.rows() / count.max(1);
                    let h = b.w_down.rows() / count.max(1);
                    (0..count)
                        .filter_map(|e| {
                            Some([
                                b.w_gate.row_slice(e * f, (e + 1) * f)?,
                                b.w_up.row_slice(e * f, (e + 1) * f)?,
                                b.w_down.row_slice(e * h, (e + 1) * h)?,
                            ])
                        })
                        .collect()
                }
                None => Vec::new(),
            })
            .collect();
        let mut sets: Vec<Vec<&Tensor>> = Vec::new();
        for (b, experts) in model.blocks.iter().zip(&expert_slices) {
            for t in [&b.wq, &b.wk, &b.wv, &b.wo] {
                sets.push(vec![t]);
            }
            match &b.router {
                Some(router) => {
                    sets.push(vec![router]);
                    sets.extend(experts.iter().flat_map(|m| m.iter().map(|t| vec![t])));
                }
                None => sets.extend([&b.w_gate, &b.w_up, &b.w_down].map(|t| vec![t])),
            }
        }
        sets.push(vec![&model.output]);
        // Each set's file pages are released as it is packed.
        let packed = pack_all(&sets);
        let mut weights = packed.into_iter().zip(&sets).map(|(p, set)| match p {
            Some(p) => Weight::Packed(p),
            // A single tensor is always usable in place.
            None => Weight::Plain(set[0].clone()),
        });
        let mut next = || weights.next().expect("one weight per set");
        let mlp = |next: &mut dyn FnMut() -> Weight| CpuMlp {
            gate: next(),
            up: next(),
            down: next(),
        };
        let blocks = model
            .blocks
            .iter()
            .zip(&expert_slices)
            .map(|(b, experts)| CpuBlock {
                wq: next(),
                wk: next(),
                wv: next(),
                wo: next(),
                ffn: match &b.router {
                    Some(_) => CpuFfn::Experts {
                        router: next(),
                        experts: experts.iter().map(|_| mlp(&mut next)).collect(),
                    },
                    None => CpuFfn::Dense(mlp(&mut next)),
                },
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

    /// Bytes of weights one decode step reads (every matrix once; of a mixture of experts,
    /// the router and `experts_used` experts, at their average size).
    pub fn bytes_per_step(&self, experts_used: usize) -> usize {
        let blocks: usize = self
            .blocks
            .iter()
            .map(|b| {
                let attention: usize = [&b.wq, &b.wk, &b.wv, &b.wo].iter().map(|w| w.bytes()).sum();
                let ffn = match &b.ffn {
                    CpuFfn::Dense(m) => m.bytes(),
                    CpuFfn::Experts { router, experts } => {
                        let all: usize = experts.iter().map(CpuMlp::bytes).sum();
                        router.bytes() + all * experts_used / experts.len().max(1)
                    }
                };
                attention + ffn
            })
            .sum();
        blocks + self.output.bytes()
    }
}
