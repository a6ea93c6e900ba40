//! What a family's block does beyond Llama's: the description every backend executes
//! ([`crate::model::ops`] turns it into each layer's ops).

/// How RoPE pairs the dimensions of a head.
///
/// Must match the weights' layout: llama.cpp's converter permutes the Q and K rows of `llama`
/// models so that GGUF files rotate adjacent pairs, while Hugging Face checkpoints (and GGUF
/// `qwen2` files) rotate the two halves of a head. Using the wrong convention corrupts
/// attention patterns without any error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs `(x[2i], x[2i+1])` (GGUF `llama`).
    Interleaved,
    /// Pairs `(x[i], x[i + d/2])` (Hugging Face, GGUF `qwen2`).
    Neox,
}

/// The feed-forward's gate activation (`act(gate) * up`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Activation {
    /// SiLU (SwiGLU: Llama, Qwen).
    #[default]
    Silu,
    /// GELU, tanh approximation (GeGLU: Gemma; ggml's `gelu`, PyTorch's `gelu(approximate="tanh")`).
    GeluTanh,
}

/// Which layers attend only to the last `window` positions (sliding-window attention).
#[derive(Debug, Clone, PartialEq)]
pub struct SlidingWindow {
    /// Positions a local layer sees, its own included: key `p` is visible from query `q` when
    /// `q - p < window` (llama.cpp's standard SWA, Hugging Face's `sliding_window`).
    pub window: usize,
    /// Per layer: `true` for a local (windowed) layer, `false` for a global one.
    pub local: Vec<bool>,
    /// RoPE base of the local layers (Gemma 3: 10000; global layers use
    /// [`ModelConfig::rope_theta`](crate::model::config::ModelConfig::rope_theta) and its scaling).
    pub local_rope_theta: Option<f64>,
}

impl SlidingWindow {
    /// Every `period`-th layer global, the others local (llama.cpp's `set_swa_pattern`, Gemma 3
    /// with period 6, Gemma 2 with period 2).
    pub fn periodic(window: usize, period: usize, layers: usize) -> Self {
        Self {
            window,
            local: (0..layers)
                .map(|l| period == 0 || l % period < period - 1)
                .collect(),
            local_rope_theta: None,
        }
    }
}

/// A mixture-of-experts feed-forward: a router scores `count` experts per token, the `used`
/// best run (each a gated MLP of `ffn` hidden units) and their outputs are summed, weighted by
/// the router's softmax probabilities (renormalized over the chosen ones when
/// `norm_weights`: Qwen3-MoE's `norm_topk_prob`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Experts {
    /// Experts per layer.
    pub count: usize,
    /// Experts each token runs.
    pub used: usize,
    /// Hidden units of one expert.
    pub ffn: usize,
    /// The chosen experts' weights are renormalized to sum to 1.
    pub norm_weights: bool,
}

/// What a family does beyond the Llama block (pre-norm attention and SwiGLU, both added to the
/// residual). One description per family, read by every backend; the defaults are Llama's.
///
/// The block, in order: `h = norm(x) · attn_norm`; q, k, v projections (+ bias); per-head
/// `qk_norm`; RoPE; q scaled by [`Family::attn_scale`]; attention (windowed on local layers,
/// scores soft-capped by `attn_softcap`); output projection; `post_norms`: normed by
/// `attn_post_norm`; added to `x`. Then `h = norm(x) · ffn_norm`; `activation(gate) · up`; down
/// projection (or, with `experts`, the router's chosen experts, weighted); `post_norms`: normed by `ffn_post_norm`; added to `x`.
#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    /// Per-head RMSNorm of q and k before RoPE (`attn_q_norm`, `attn_k_norm`: Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// RMSNorm of the attention and feed-forward outputs before the residual add
    /// (`post_attention_norm`, `post_ffw_norm`: Gemma 2/3).
    pub post_norms: bool,
    /// The feed-forward activation.
    pub activation: Activation,
    /// The embedding rows are multiplied by this (Gemma: `√hidden`).
    pub embed_scale: f32,
    /// Queries are multiplied by this before attention: `1/√head_dim`, or Gemma's
    /// `1/√query_pre_attn_scalar`. `None`: `1/√head_dim`.
    pub attn_scale: Option<f32>,
    /// Attention scores become `cap · tanh(score / cap)` (Gemma 2's `attn_logit_softcapping`).
    pub attn_softcap: Option<f32>,
    /// Logits become `cap · tanh(logit / cap)` (Gemma 2's `final_logit_softcapping`).
    pub final_softcap: Option<f32>,
    /// Local layers, when the family has them.
    pub sliding_window: Option<SlidingWindow>,
    /// Linear RoPE scaling of the global layers: positions are divided by this (Gemma 3 4B+).
    pub rope_linear_factor: Option<f64>,
    /// The feed-forward is a mixture of experts (Qwen3-MoE) instead of one gated MLP.
    pub experts: Option<Experts>,
}

impl Default for Family {
    fn default() -> Self {
        Self {
            qk_norm: false,
            post_norms: false,
            activation: Activation::Silu,
            embed_scale: 1.0,
            attn_scale: None,
            attn_softcap: None,
            final_softcap: None,
            sliding_window: None,
            rope_linear_factor: None,
            experts: None,
        }
    }
}

impl Family {
    /// Whether layer `l` is local, and its window.
    pub fn window(&self, l: usize) -> Option<usize> {
        let sw = self.sliding_window.as_ref()?;
        sw.local
            .get(l)
            .copied()
            .unwrap_or(false)
            .then_some(sw.window)
    }
}
