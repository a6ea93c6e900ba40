//! The weights of the Llama-shaped families (Llama 2/3, SmolLM, TinyLlama, Mistral, Qwen2/3,
//! Gemma 2/3), found by name in a GGUF file or a Hugging Face checkpoint. Which optional
//! tensors a family has follows from its [`super::config::Family`].

use super::config::ModelConfig;
use super::family::Names;
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
    /// Gate projection `[ffn, hidden]`; with experts, every expert's stacked
    /// `[count·ffn, hidden]` (expert `e`'s rows `e·ffn..(e+1)·ffn`).
    pub w_gate: Tensor,
    /// Up projection `[ffn, hidden]`; with experts, stacked as the gate.
    pub w_up: Tensor,
    /// Down projection `[hidden, ffn]`; with experts, every expert's stacked
    /// `[count·hidden, ffn]`.
    pub w_down: Tensor,
    /// With experts: the router `[count, hidden]`.
    pub router: Option<Tensor>,
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
            // A dense matrix `[rows, k]`, or with experts the stack `[count, rows, k]` seen as
            // one matrix.
            let ffn = |part: &str, rows: usize, k: usize| -> Result<Tensor, WeightsError> {
                let Some(x) = fam.experts else {
                    return want(&n(part), &[rows, k]);
                };
                let (rows, k) = if part == "down" {
                    (h, x.ffn)
                } else {
                    (x.ffn, h)
                };
                let name = n(&format!("{part}_exps"));
                let stack = want(&name, &[x.count, rows, k])?;
                stack
                    .reshaped(vec![x.count * rows, k])
                    .ok_or(WeightsError::Missing(name))
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
                w_gate: ffn("gate", f, h)?,
                w_up: ffn("up", f, h)?,
                w_down: ffn("down", h, f)?,
                router: match fam.experts {
                    Some(x) => Some(want(&n("router"), &[x.count, h])?),
                    None => None,
                },
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
