//! The forward description ([`crate::model::ops`]) lowered onto the CUDA kernels.
//!
//! The kernels fuse ops: the attention norm into the QKV matvec, RoPE and the KV store into its
//! epilogue (or, with QK norm, into `qkv_heads`, which sees whole heads), the residual add into
//! the output and down projections (or into `postnorm_add` after a post-norm), the activation
//! into the gate/up matvec. So a layer's ops are read into a [`LayerLaunches`] (the arguments of
//! its launches), and the ops those launches execute ([`LayerLaunches::ops`]) must equal the
//! description: a sequence the kernels cannot run exactly is refused when the model loads.

use crate::model::config::Activation;
use crate::model::ops::{AttentionOp, Op, RopeTable, Sublayer};

/// What one layer's launches do, read from its ops.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerLaunches {
    /// q, k and v get their biases.
    pub bias: bool,
    /// Per-head RMSNorm of q and k (the QKV products go through `qkv_heads`).
    pub qk_norm: bool,
    /// The RoPE frequencies.
    pub rope: RopeTable,
    /// The attention kernel's scale, window and cap.
    pub attention: AttentionOp,
    /// The attention output is post-normed before the residual add.
    pub attn_post_norm: bool,
    /// The gate's activation.
    pub activation: Activation,
    /// The feed-forward output is post-normed before the residual add.
    pub ffn_post_norm: bool,
}

impl LayerLaunches {
    /// The launches of a layer described by `ops`, or why the kernels cannot run it.
    pub fn lower(ops: &[Op]) -> Result<Self, String> {
        if ops.iter().any(|op| matches!(op, Op::Experts { .. })) {
            return Err(
                "mixture-of-experts feed-forwards run on the CPU backend only (for now)".into(),
            );
        }
        let mut bias = None;
        let mut rope = None;
        let mut attention = None;
        let mut activation = None;
        for op in ops {
            match *op {
                Op::QkvProj { bias: b } => bias = Some(b),
                Op::Rope { table } => rope = Some(table),
                Op::Attention(a) => attention = Some(a),
                Op::GateUp { activation: a } => activation = Some(a),
                _ => {}
            }
        }
        let need = |what: &str| format!("the layer has no {what}: {ops:?}");
        let me = Self {
            bias: bias.ok_or_else(|| need("QKV projection"))?,
            qk_norm: ops.contains(&Op::QkNorm),
            rope: rope.ok_or_else(|| need("RoPE"))?,
            attention: attention.ok_or_else(|| need("attention"))?,
            attn_post_norm: ops.contains(&Op::PostNorm(Sublayer::Attention)),
            activation: activation.ok_or_else(|| need("feed-forward"))?,
            ffn_post_norm: ops.contains(&Op::PostNorm(Sublayer::FeedForward)),
        };
        let runs = me.ops();
        if runs != ops {
            return Err(format!(
                "the CUDA kernels run a layer as {runs:?}, but the model describes {ops:?}"
            ));
        }
        Ok(me)
    }

    /// The ops these launches execute, in order.
    pub fn ops(&self) -> Vec<Op> {
        let mut v = vec![Op::AttnNorm, Op::QkvProj { bias: self.bias }];
        if self.qk_norm {
            v.push(Op::QkNorm);
        }
        v.extend([
            Op::Rope { table: self.rope },
            Op::StoreKv,
            Op::Attention(self.attention),
            Op::OutProj,
        ]);
        if self.attn_post_norm {
            v.push(Op::PostNorm(Sublayer::Attention));
        }
        v.extend([
            Op::Residual,
            Op::FfnNorm,
            Op::GateUp {
                activation: self.activation,
            },
            Op::Down,
        ]);
        if self.ffn_post_norm {
            v.push(Op::PostNorm(Sublayer::FeedForward));
        }
        v.push(Op::Residual);
        v
    }

    /// The attention kernel's `window` argument (0: the whole causal prefix).
    pub fn window_arg(&self) -> usize {
        self.attention.window.unwrap_or(0)
    }

    /// The attention kernel's `cap` argument (0: no cap).
    pub fn softcap_arg(&self) -> f32 {
        self.attention.softcap.unwrap_or(0.0)
    }

    /// The gate kernels' `gelu` argument.
    pub fn gelu_arg(&self) -> bool {
        self.activation == Activation::GeluTanh
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::{Arch, Family, ModelConfig, RopeStyle, SlidingWindow};
    use crate::model::ops::ForwardPlan;

    fn cfg(family: Family, qkv_bias: bool) -> ModelConfig {
        ModelConfig {
            arch: Arch::Llama,
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
            qkv_bias,
            family,
        }
    }

    #[test]
    fn every_family_lowers_and_round_trips() {
        let gemma = Family {
            qk_norm: true,
            post_norms: true,
            activation: Activation::GeluTanh,
            embed_scale: 8.0,
            attn_scale: Some(0.25),
            attn_softcap: Some(50.0),
            final_softcap: Some(30.0),
            sliding_window: Some(SlidingWindow {
                window: 8,
                local: vec![true, false],
                local_rope_theta: Some(1e4),
            }),
            rope_linear_factor: None,
            experts: None,
        };
        let qwen3 = Family {
            qk_norm: true,
            ..Family::default()
        };
        for (family, bias) in [
            (Family::default(), false),
            (Family::default(), true),
            (qwen3, false),
            (gemma, false),
        ] {
            let plan = ForwardPlan::new(&cfg(family, bias));
            for ops in &plan.layers {
                let l = LayerLaunches::lower(ops).expect("lowers");
                assert_eq!(&l.ops(), ops);
            }
        }
        let plan = ForwardPlan::new(&cfg(
            Family {
                attn_softcap: Some(50.0),
                activation: Activation::GeluTanh,
                sliding_window: Some(SlidingWindow {
                    window: 8,
                    local: vec![true, false],
                    local_rope_theta: None,
                }),
                ..Family::default()
            },
            false,
        ));
        let local = LayerLaunches::lower(&plan.layers[0]).expect("lowers");
        assert_eq!(
            (local.window_arg(), local.softcap_arg(), local.gelu_arg()),
            (8, 50.0, true)
        );
        let global = LayerLaunches::lower(&plan.layers[1]).expect("lowers");
        assert_eq!(global.window_arg(), 0);
    }

    #[test]
    fn sequences_the_kernels_cannot_fuse_are_refused() {
        let moe = Family {
            qk_norm: true,
            experts: Some(crate::model::config::Experts {
                count: 8,
                used: 2,
                ffn: 32,
                norm_weights: true,
            }),
            ..Family::default()
        };
        let err = LayerLaunches::lower(&ForwardPlan::new(&cfg(moe, false)).layers[0])
            .expect_err("experts are refused");
        assert!(err.contains("mixture-of-experts"), "{err}");
        let ops = ForwardPlan::new(&cfg(Family::default(), false)).layers[0].clone();
        // QK norm after RoPE, a residual add dropped, ops swapped: all refused.
        let mut late_norm = ops.clone();
        late_norm.insert(4, Op::QkNorm);
        let mut no_residual = ops.clone();
        no_residual.remove(6);
        let mut swapped = ops.clone();
        swapped.swap(0, 1);
        for bad in [late_norm, no_residual, swapped, Vec::new()] {
            assert!(LayerLaunches::lower(&bad).is_err(), "{bad:?}");
        }
    }
}
