//! What Gemma 2 and Gemma 3 share: GeGLU, pre- and post-norms, embeddings scaled by `√hidden`,
//! soft-caps, sliding-window layers, and Hugging Face checkpoints with four norms per block.

use super::block::{Activation, Family, SlidingWindow};
use super::spec::{Hparams, WindowPattern};
use super::tensors::{HF_NAMES as LLAMA_HF_NAMES, Names};

/// What tells one Gemma generation from another.
pub(super) struct Generation {
    /// Per-head RMSNorm of q and k.
    pub qk_norm: bool,
    /// Every `period`-th layer is global when the file gives no pattern (llama.cpp's
    /// `set_swa_pattern`).
    pub period: usize,
    /// The local layers' own RoPE base when the file gives none; `None`: they rotate with the
    /// global layers' frequencies.
    pub local_rope_theta: Option<f64>,
    /// Layers of the 27B model. GGUF has no `query_pre_attn_scalar`: llama.cpp scales queries
    /// by `1/√head_dim`, except the 27B model's by `1/√(hidden/heads)`.
    pub layers_27b: usize,
}

/// The block of Gemma generation `g` from `h`.
#[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
pub(super) fn block(h: &Hparams, g: &Generation) -> Family {
    let sliding_window = h.sliding_window.filter(|&w| w > 0).map(|window| {
        let mut sw = match &h.window_pattern {
            Some(WindowPattern::Layers(local)) => SlidingWindow {
                window,
                local: local.clone(),
                local_rope_theta: None,
            },
            Some(WindowPattern::Period(period)) => {
                SlidingWindow::periodic(window, *period, h.layers)
            }
            None => SlidingWindow::periodic(window, g.period, h.layers),
        };
        sw.local_rope_theta = g
            .local_rope_theta
            .map(|theta| h.local_rope_theta.unwrap_or(theta));
        sw
    });
    let query_scalar = h.query_pre_attn_scalar.unwrap_or_else(|| {
        (if h.layers == g.layers_27b {
            h.hidden.checked_div(h.heads).unwrap_or(h.head_dim)
        } else {
            h.head_dim
        }) as f64
    });
    Family {
        qk_norm: g.qk_norm,
        post_norms: true,
        activation: Activation::GeluTanh,
        embed_scale: (h.hidden as f32).sqrt(),
        attn_scale: Some(1.0 / (query_scalar as f32).sqrt()),
        attn_softcap: h.attn_softcap.filter(|&c| c > 0.0).map(|c| c as f32),
        final_softcap: h.final_softcap.filter(|&c| c > 0.0).map(|c| c as f32),
        sliding_window,
        rope_linear_factor: h.rope_linear_factor.filter(|&f| f > 0.0 && f != 1.0),
        experts: None,
    }
}

/// Hugging Face names of Gemma 2/3: four norms per block (`post_attention_layernorm` is the
/// attention's post-norm there, not the feed-forward's pre-norm), each stored as `w` for
/// `x · (1 + w)`.
pub(super) const HF_NAMES: Names = Names {
    block: |l, part| {
        let s = match part {
            "attn_norm" => "input_layernorm.weight",
            "attn_post_norm" => "post_attention_layernorm.weight",
            "ffn_norm" => "pre_feedforward_layernorm.weight",
            "ffn_post_norm" => "post_feedforward_layernorm.weight",
            other => return (LLAMA_HF_NAMES.block)(l, other),
        };
        format!("model.layers.{l}.{s}")
    },
    norm_offset: 1.0,
    ..LLAMA_HF_NAMES
};
