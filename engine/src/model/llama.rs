//! The Llama family's weights (Llama 2/3, SmolLM, TinyLlama, Mistral, Qwen2), found by name in
//! a GGUF file or a Hugging Face checkpoint.

use super::config::ModelConfig;
use super::weights::{DType, Tensor};

/// One transformer block.
#[derive(Debug, Clone)]
pub struct Block {
    /// RMSNorm weight before attention.
    pub attn_norm: Vec<f32>,
    /// Query projection `[q_dim, hidden]`.
    pub wq: Tensor,
    /// Key projection `[kv_dim, hidden]`.
    pub wk: Tensor,
    /// Value projection `[kv_dim, hidden]`.
    pub wv: Tensor,
    /// Query bias (Qwen2).
    pub bq: Option<Vec<f32>>,
    /// Key bias (Qwen2).
    pub bk: Option<Vec<f32>>,
    /// Value bias (Qwen2).
    pub bv: Option<Vec<f32>>,
    /// Output projection `[hidden, q_dim]`.
    pub wo: Tensor,
    /// RMSNorm weight before the feed-forward.
    pub ffn_norm: Vec<f32>,
    /// Gate projection `[ffn, hidden]`.
    pub w_gate: Tensor,
    /// Up projection `[ffn, hidden]`.
    pub w_up: Tensor,
    /// Down projection `[hidden, ffn]`.
    pub w_down: Tensor,
}

/// All weights of a Llama-family model.
#[derive(Debug, Clone)]
pub struct LlamaWeights {
    /// Token embedding `[vocab, hidden]`.
    pub embed: Tensor,
    /// The transformer blocks, in order.
    pub blocks: Vec<Block>,
    /// Final RMSNorm weight.
    pub norm: Vec<f32>,
    /// Output projection `[vocab, hidden]` (the embedding when tied).
    pub output: Tensor,
    /// Per-pair RoPE frequency divisors (GGUF `rope_freqs.weight`), when present.
    pub rope_freqs: Option<Vec<f32>>,
}

/// Why weights could not be assembled.
#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    /// A tensor is missing.
    #[error("missing tensor {0}")]
    Missing(String),
    /// A tensor has the wrong shape.
    #[error("tensor {name} has shape {got:?}, expected {want:?}")]
    Shape {
        /// Tensor name.
        name: String,
        /// Shape found.
        got: Vec<usize>,
        /// Shape expected.
        want: Vec<usize>,
    },
}

/// Tensor naming of one file format.
pub struct Names {
    /// The token embedding table's tensor name.
    pub embed: &'static str,
    /// Final norm.
    pub norm: &'static str,
    /// Output projection.
    pub output: &'static str,
    /// Per-block name: `(block, part)` → name, with part one of `attn_norm`, `q`, `k`, `v`,
    /// `q_bias`, `k_bias`, `v_bias`, `o`, `ffn_norm`, `gate`, `up`, `down`.
    pub block: fn(usize, &str) -> String,
}

/// llama.cpp's GGUF names.
pub const GGUF_NAMES: Names = Names {
    embed: "token_embd.weight",
    norm: "output_norm.weight",
    output: "output.weight",
    block: |l, part| {
        let s = match part {
            "attn_norm" => "attn_norm.weight",
            "q" => "attn_q.weight",
            "k" => "attn_k.weight",
            "v" => "attn_v.weight",
            "q_bias" => "attn_q.bias",
            "k_bias" => "attn_k.bias",
            "v_bias" => "attn_v.bias",
            "o" => "attn_output.weight",
            "ffn_norm" => "ffn_norm.weight",
            "gate" => "ffn_gate.weight",
            "up" => "ffn_up.weight",
            _ => "ffn_down.weight",
        };
        format!("blk.{l}.{s}")
    },
};

/// Hugging Face names.
pub const HF_NAMES: Names = Names {
    embed: "model.embed_tokens.weight",
    norm: "model.norm.weight",
    output: "lm_head.weight",
    block: |l, part| {
        let s = match part {
            "attn_norm" => "input_layernorm.weight",
            "q" => "self_attn.q_proj.weight",
            "k" => "self_attn.k_proj.weight",
            "v" => "self_attn.v_proj.weight",
            "q_bias" => "self_attn.q_proj.bias",
            "k_bias" => "self_attn.k_proj.bias",
            "v_bias" => "self_attn.v_proj.bias",
            "o" => "self_attn.o_proj.weight",
            "ffn_norm" => "post_attention_layernorm.weight",
            "gate" => "mlp.gate_proj.weight",
            "up" => "mlp.up_proj.weight",
            _ => "mlp.down_proj.weight",
        };
        format!("model.layers.{l}.{s}")
    },
};

impl LlamaWeights {
    /// Assembles the weights from a tensor lookup, checking every shape against `cfg`.
    pub fn assemble(
        cfg: &ModelConfig,
        names: &Names,
        get: impl Fn(&str) -> Option<Tensor>,
    ) -> Result<Self, WeightsError> {
        let want = |name: &str, shape: &[usize]| -> Result<Tensor, WeightsError> {
            let t = get(name).ok_or_else(|| WeightsError::Missing(name.to_string()))?;
            if t.shape() != shape {
                return Err(WeightsError::Shape {
                    name: name.to_string(),
                    got: t.shape().to_vec(),
                    want: shape.to_vec(),
                });
            }
            Ok(t)
        };
        let vec = |name: &str, n: usize| want(name, &[n]).map(|t| t.to_f32_vec());
        let (h, q, kv, f) = (cfg.hidden, cfg.q_dim(), cfg.kv_dim(), cfg.ffn);
        let embed = want(names.embed, &[cfg.vocab, h])?;
        let mut blocks = Vec::with_capacity(cfg.layers);
        for l in 0..cfg.layers {
            let n = |p: &str| (names.block)(l, p);
            let bias = |p: &str, len: usize| -> Result<Option<Vec<f32>>, WeightsError> {
                if cfg.qkv_bias {
                    vec(&n(p), len).map(Some)
                } else {
                    Ok(None)
                }
            };
            blocks.push(Block {
                attn_norm: vec(&n("attn_norm"), h)?,
                wq: want(&n("q"), &[q, h])?,
                wk: want(&n("k"), &[kv, h])?,
                wv: want(&n("v"), &[kv, h])?,
                bq: bias("q_bias", q)?,
                bk: bias("k_bias", kv)?,
                bv: bias("v_bias", kv)?,
                wo: want(&n("o"), &[h, q])?,
                ffn_norm: vec(&n("ffn_norm"), h)?,
                w_gate: want(&n("gate"), &[f, h])?,
                w_up: want(&n("up"), &[f, h])?,
                w_down: want(&n("down"), &[h, f])?,
            });
        }
        let output = match get(names.output) {
            Some(_) => want(names.output, &[cfg.vocab, h])?,
            None => embed.clone(),
        };
        let rope_freqs = get("rope_freqs.weight").map(|t| t.to_f32_vec());
        Ok(Self {
            norm: vec(names.norm, h)?,
            embed,
            blocks,
            output,
            rope_freqs,
        })
    }

    /// The distinct matrix types, for display (`Q4_1`, `Q8_0`, …).
    pub fn dtypes(&self) -> Vec<DType> {
        let mut v: Vec<DType> = self
            .blocks
            .iter()
            .flat_map(|b| [&b.wq, &b.wk, &b.wv, &b.wo, &b.w_gate, &b.w_up, &b.w_down])
            .chain([&self.embed, &self.output])
            .map(Tensor::dtype)
            .collect();
        v.sort_by_key(|d| d.name());
        v.dedup();
        v
    }
}
