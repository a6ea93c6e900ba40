//! The forward pass as data: a model's embedding, each layer's operations in order, and its
//! head, derived once from [`ModelConfig`] and its [`super::config::Family`].
//!
//! Every backend executes this description with its own kernels (the CPU one op at a time,
//! the CUDA backend fused into its launches after checking it can run the exact sequence), so
//! a family that needs a new step adds it to [`layer_ops`] and its tests, not to two forward
//! passes (a family that only sets [`super::config::Family`]'s fields changes nothing here).
//!
//! The values a layer reads and writes: `x` the residual stream, `h` the normed input of a
//! sub-layer, `q`/`k`/`v` the projections, `att` the attention output, `o` a sub-layer's output
//! before it joins the residual, `act` the feed-forward's hidden activations.

use super::config::{Activation, Experts, ModelConfig};

/// Which RoPE inverse frequencies a layer rotates with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeTable {
    /// The model's ([`ModelConfig::rope_inv_freq`]: its base, with any scaling).
    Global,
    /// The local layers' own base ([`ModelConfig::rope_inv_freq_local`], Gemma 3).
    Local,
}

/// Which sub-layer's output a post-norm applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sublayer {
    /// The attention output (`attn_post_norm`).
    Attention,
    /// The feed-forward output (`ffn_post_norm`).
    FeedForward,
}

/// How a layer attends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionOp {
    /// Queries are multiplied by this (`1/√head_dim` unless the family says otherwise).
    pub scale: f32,
    /// Positions a query sees, its own included (`q - p < window`), on local layers.
    pub window: Option<usize>,
    /// Scores become `cap · tanh(score / cap)`.
    pub softcap: Option<f32>,
}

/// One step of a layer, in execution order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Op {
    /// `h = rmsnorm(x) · attn_norm`.
    AttnNorm,
    /// `q, k, v = h · [Wq; Wk; Wv]`, plus their biases when `bias`.
    QkvProj {
        /// Whether q, k and v have biases (Qwen2).
        bias: bool,
    },
    /// Per-head RMSNorm of `q` and `k` (`attn_q_norm`, `attn_k_norm`).
    QkNorm,
    /// Rotates `q` and `k` at their positions.
    Rope {
        /// The frequencies of this layer.
        table: RopeTable,
    },
    /// Stores `k` and `v` in the KV cache at their positions.
    StoreKv,
    /// `att = softmax(scale · q · kᵀ, masked causally [and by the window], capped) · v`.
    Attention(AttentionOp),
    /// `o = att · Wo`.
    OutProj,
    /// `o = rmsnorm(o) · post_norm` of that sub-layer.
    PostNorm(Sublayer),
    /// `x += o`.
    Residual,
    /// `h = rmsnorm(x) · ffn_norm`.
    FfnNorm,
    /// `act = activation(h · Wgate) · (h · Wup)`.
    GateUp {
        /// The gate's activation.
        activation: Activation,
    },
    /// `o = act · Wdown`.
    Down,
    /// A mixture of experts in place of `GateUp` and `Down`: the router scores every expert
    /// for each row of `h`, the `used` best run (`activation(h · Wgate_e) · (h · Wup_e) ·
    /// Wdown_e`), and `o` is their sum weighted by the router's softmax probabilities
    /// (renormalized over the chosen when the family says so). Each row's sum runs over its
    /// experts in index order, so a row's result does not depend on the others in the step.
    Experts {
        /// The gates' activation.
        activation: Activation,
        /// How many experts, how many per row, and the weighting.
        experts: Experts,
    },
}

/// The whole pass: `x = embed[token] · embed_scale`, each layer's ops, then
/// `logits = rmsnorm(x) · norm · Wout`, capped by `final_softcap`.
#[derive(Debug, Clone, PartialEq)]
pub struct ForwardPlan {
    /// The embedding rows are multiplied by this (1: unchanged).
    pub embed_scale: f32,
    /// Per layer, its ops in order.
    pub layers: Vec<Vec<Op>>,
    /// Logits become `cap · tanh(logit / cap)`.
    pub final_softcap: Option<f32>,
}

impl ForwardPlan {
    /// The description of `cfg`'s forward pass.
    pub fn new(cfg: &ModelConfig) -> Self {
        Self {
            embed_scale: cfg.family.embed_scale,
            layers: (0..cfg.layers).map(|l| layer_ops(cfg, l)).collect(),
            final_softcap: cfg.family.final_softcap,
        }
    }

    /// Whether any layer rotates with the local table.
    pub fn uses_local_rope(&self) -> bool {
        self.layers.iter().flatten().any(|op| {
            *op == Op::Rope {
                table: RopeTable::Local,
            }
        })
    }
}

/// The ops of layer `l` of `cfg`, in order.
pub fn layer_ops(cfg: &ModelConfig, l: usize) -> Vec<Op> {
    let fam = &cfg.family;
    let window = fam.window(l);
    let local_base = fam
        .sliding_window
        .as_ref()
        .is_some_and(|sw| sw.local_rope_theta.is_some());
    #[allow(clippy::cast_precision_loss)]
    let scale = fam.attn_scale.unwrap_or(1.0 / (cfg.head_dim as f32).sqrt());
    let mut ops = vec![Op::AttnNorm, Op::QkvProj { bias: cfg.qkv_bias }];
    if fam.qk_norm {
        ops.push(Op::QkNorm);
    }
    ops.push(Op::Rope {
        table: if window.is_some() && local_base {
            RopeTable::Local
        } else {
            RopeTable::Global
        },
    });
    ops.push(Op::StoreKv);
    ops.push(Op::Attention(AttentionOp {
        scale,
        window,
        softcap: fam.attn_softcap,
    }));
    ops.push(Op::OutProj);
    if fam.post_norms {
        ops.push(Op::PostNorm(Sublayer::Attention));
    }
    ops.push(Op::Residual);
    ops.push(Op::FfnNorm);
    match fam.experts {
        Some(experts) => ops.push(Op::Experts {
            activation: fam.activation,
            experts,
        }),
        None => {
            ops.push(Op::GateUp {
                activation: fam.activation,
            });
            ops.push(Op::Down);
        }
    }
    if fam.post_norms {
        ops.push(Op::PostNorm(Sublayer::FeedForward));
    }
    ops.push(Op::Residual);
    ops
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::{Arch, Family, RopeStyle, SlidingWindow};

    fn cfg(arch: Arch, family: Family) -> ModelConfig {
        ModelConfig {
            arch,
            name: "t".into(),
            vocab: 100,
            hidden: 64,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            ffn: 128,
            context: 64,
            rms_eps: 1e-6,
            rope_theta: 1e6,
            rope_style: RopeStyle::Neox,
            rope_scaling: None,
            qkv_bias: arch == Arch::Qwen2,
            family,
        }
    }

    fn gemma3() -> Family {
        Family {
            qk_norm: true,
            post_norms: true,
            activation: Activation::GeluTanh,
            embed_scale: 8.0,
            attn_scale: Some(0.25),
            attn_softcap: None,
            final_softcap: None,
            sliding_window: Some(SlidingWindow {
                window: 8,
                local: vec![true, false],
                local_rope_theta: Some(1e4),
            }),
            rope_linear_factor: None,
            experts: None,
        }
    }

    #[test]
    fn the_llama_block_is_the_eleven_classic_steps() {
        let plan = ForwardPlan::new(&cfg(Arch::Llama, Family::default()));
        let attn = Op::Attention(AttentionOp {
            scale: 0.25,
            window: None,
            softcap: None,
        });
        let want = vec![
            Op::AttnNorm,
            Op::QkvProj { bias: false },
            Op::Rope {
                table: RopeTable::Global,
            },
            Op::StoreKv,
            attn,
            Op::OutProj,
            Op::Residual,
            Op::FfnNorm,
            Op::GateUp {
                activation: Activation::Silu,
            },
            Op::Down,
            Op::Residual,
        ];
        assert_eq!(plan.layers, vec![want.clone(), want]);
        assert_eq!(plan.embed_scale, 1.0);
        assert!(!plan.uses_local_rope());
    }

    #[test]
    fn qwen_adds_its_bias_or_its_qk_norm() {
        let q2 = layer_ops(&cfg(Arch::Qwen2, Family::default()), 0);
        assert_eq!(q2[1], Op::QkvProj { bias: true });
        assert!(!q2.contains(&Op::QkNorm));
        let q3 = layer_ops(
            &cfg(
                Arch::Qwen3,
                Family {
                    qk_norm: true,
                    ..Family::default()
                },
            ),
            1,
        );
        assert_eq!(&q3[1..3], &[Op::QkvProj { bias: false }, Op::QkNorm]);
    }

    #[test]
    fn gemma3_local_and_global_layers_differ_in_window_and_rope() {
        let plan = ForwardPlan::new(&cfg(Arch::Gemma3, gemma3()));
        assert_eq!(plan.embed_scale, 8.0);
        assert!(plan.uses_local_rope());
        let attn = |ops: &[Op]| {
            ops.iter().find_map(|o| match o {
                Op::Attention(a) => Some(*a),
                _ => None,
            })
        };
        let (local, global) = (&plan.layers[0], &plan.layers[1]);
        assert_eq!(attn(local).map(|a| a.window), Some(Some(8)));
        assert_eq!(attn(global).map(|a| a.window), Some(None));
        assert_eq!(attn(global).map(|a| a.scale), Some(0.25));
        assert!(local.contains(&Op::Rope {
            table: RopeTable::Local
        }));
        assert!(global.contains(&Op::Rope {
            table: RopeTable::Global
        }));
        // Post-norms sit between each sub-layer's output and its residual add.
        for ops in &plan.layers {
            let at = |op: Op| ops.iter().position(|o| *o == op);
            let post_attn = at(Op::PostNorm(Sublayer::Attention)).expect("attention post-norm");
            assert_eq!(at(Op::OutProj), Some(post_attn - 1));
            assert_eq!(ops[post_attn + 1], Op::Residual);
            assert_eq!(
                ops[ops.len() - 2..],
                [Op::PostNorm(Sublayer::FeedForward), Op::Residual]
            );
            assert!(ops.contains(&Op::GateUp {
                activation: Activation::GeluTanh
            }));
        }
    }

    #[test]
    fn a_window_without_its_own_base_keeps_the_global_table() {
        let mut fam = gemma3();
        if let Some(sw) = fam.sliding_window.as_mut() {
            sw.local_rope_theta = None;
        }
        fam.attn_softcap = Some(50.0);
        fam.final_softcap = Some(30.0);
        let plan = ForwardPlan::new(&cfg(Arch::Gemma2, fam));
        assert!(!plan.uses_local_rope());
        assert_eq!(plan.final_softcap, Some(30.0));
        assert!(plan.layers[0].contains(&Op::Attention(AttentionOp {
            scale: 0.25,
            window: Some(8),
            softcap: Some(50.0),
        })));
    }
}
