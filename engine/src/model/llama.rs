//! The weights of the Llama-shaped families (Llama 2/3, SmolLM, TinyLlama, Mistral, Qwen2/3,
//! Gemma 2/3), found by name in a GGUF file or a Hugging Face checkpoint. Which optional
//! tensors a family has follows from its [`super::config::Family`].

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
    /// Per-head RMSNorm weight of the queries `[head_dim]` (QK norm).
    pub q_norm: Option<Vec<f32>>,
    /// Per-head RMSNorm weight of the keys `[head_dim]` (QK norm).
    pub k_norm: Option<Vec<f32>>,
    /// Output projection `[hidden, q_dim]`.
    pub wo: Tensor,
    /// RMSNorm weight of the attention output (post-norms).
    pub attn_post_norm: Option<Vec<f32>>,
    /// RMSNorm weight before the feed-forward.
    pub ffn_norm: Vec<f32>,
    /// Gate projection `[ffn, hidden]`.
    pub w_gate: Tensor,
    /// Up projection `[ffn, hidden]`.
    pub w_up: Tensor,
    /// Down projection `[hidden, ffn]`.
    pub w_down: Tensor,
    /// RMSNorm weight of the feed-forward output (post-norms).
    pub ffn_post_norm: Option<Vec<f32>>,
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
    /// `q_bias`, `k_bias`, `v_bias`, `q_norm`, `k_norm`, `o`, `attn_post_norm`, `ffn_norm`,
    /// `gate`, `up`, `down`, `ffn_post_norm`.
    pub block: fn(usize, &str) -> String,
    /// Added to every RMSNorm weight when loading: Hugging Face's Gemma stores `w` and
    /// computes `x · (1 + w)`; llama.cpp's converter stores `1 + w` already (so 0 for GGUF).
    pub norm_offset: f32,
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
            "q_norm" => "attn_q_norm.weight",
            "k_norm" => "attn_k_norm.weight",
            "o" => "attn_output.weight",
            "attn_post_norm" => "post_attention_norm.weight",
            "ffn_norm" => "ffn_norm.weight",
            "ffn_post_norm" => "post_ffw_norm.weight",
            "gate" => "ffn_gate.weight",
            "up" => "ffn_up.weight",
            _ => "ffn_down.weight",
        };
        format!("blk.{l}.{s}")
    },
    norm_offset: 0.0,
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
            "q_norm" => "self_attn.q_norm.weight",
            "k_norm" => "self_attn.k_norm.weight",
            "o" => "self_attn.o_proj.weight",
            "ffn_norm" => "post_attention_layernorm.weight",
            "gate" => "mlp.gate_proj.weight",
            "up" => "mlp.up_proj.weight",
            _ => "mlp.down_proj.weight",
        };
        format!("model.layers.{l}.{s}")
    },
    norm_offset: 0.0,
};

/// Hugging Face names of Gemma 2/3: four norms per block (`post_attention_layernorm` is the
/// attention's post-norm there, not the feed-forward's pre-norm), each stored as `w` for
/// `x · (1 + w)`.
pub const HF_GEMMA_NAMES: Names = Names {
    embed: "model.embed_tokens.weight",
    norm: "model.norm.weight",
    output: "lm_head.weight",
    block: |l, part| {
        let s = match part {
            "attn_norm" => "input_layernorm.weight",
            "attn_post_norm" => "post_attention_layernorm.weight",
            "ffn_norm" => "pre_feedforward_layernorm.weight",
            "ffn_post_norm" => "post_feedforward_layernorm.weight",
            other => return (HF_NAMES.block)(l, other),
        };
        format!("model.layers.{l}.{s}")
    },
    norm_offset: 1.0,
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
        let norm = |name: &str, n: usize| {
            vec(name, n).map(|mut w| {
                if names.norm_offset != 0.0 {
                    w.iter_mut().for_each(|v| *v += names.norm_offset);
                }
                w
            })
        };
        let fam = &cfg.family;
        let hd = cfg.head_dim;
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
            let opt_norm =
                |on: bool, p: &str, len: usize| -> Result<Option<Vec<f32>>, WeightsError> {
                    if on {
                        norm(&n(p), len).map(Some)
                    } else {
                        Ok(None)
                    }
                };
            blocks.push(Block {
                attn_norm: norm(&n("attn_norm"), h)?,
                wq: want(&n("q"), &[q, h])?,
                wk: want(&n("k"), &[kv, h])?,
                wv: want(&n("v"), &[kv, h])?,
                bq: bias("q_bias", q)?,
                bk: bias("k_bias", kv)?,
                bv: bias("v_bias", kv)?,
                q_norm: opt_norm(fam.qk_norm, "q_norm", hd)?,
                k_norm: opt_norm(fam.qk_norm, "k_norm", hd)?,
                wo: want(&n("o"), &[h, q])?,
                attn_post_norm: opt_norm(fam.post_norms, "attn_post_norm", h)?,
                ffn_norm: norm(&n("ffn_norm"), h)?,
                w_gate: want(&n("gate"), &[f, h])?,
                w_up: want(&n("up"), &[f, h])?,
                w_down: want(&n("down"), &[h, f])?,
                ffn_post_norm: opt_norm(fam.post_norms, "ffn_post_norm", h)?,
            });
        }
        let output = match get(names.output) {
            Some(_) => want(names.output, &[cfg.vocab, h])?,
            None => embed.clone(),
        };
        let rope_freqs = get("rope_freqs.weight").map(|t| t.to_f32_vec());
        Ok(Self {
            norm: norm(names.norm, h)?,
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
