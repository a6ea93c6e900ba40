//! Tensor names: llama.cpp's, which every GGUF file uses, and Hugging Face's for the Llama
//! layout. A family whose checkpoints name their tensors otherwise brings its own [`Names`].

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
    /// `gate`, `up`, `down`, `ffn_post_norm`; for a mixture of experts `router`, `gate_exps`,
    /// `up_exps`, `down_exps` (every expert's matrices stacked).
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
            "router" => "ffn_gate_inp.weight",
            "gate_exps" => "ffn_gate_exps.weight",
            "up_exps" => "ffn_up_exps.weight",
            "down_exps" => "ffn_down_exps.weight",
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
