//! Qwen3-MoE (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B): Qwen3's attention with a mixture-of-experts
//! feed-forward in every layer: a softmax router over all experts, the top `used` run, their
//! weights renormalized to sum to 1 (`norm_topk_prob`).

use super::block::{Experts, Family, RopeStyle};
use super::spec::{Arch, FamilySpec};
use super::tensors::HF_NAMES;
use crate::chat_template::TurnFormat;

const SPEC: FamilySpec = FamilySpec {
    gguf_names: &["qwen3moe"],
    // Hugging Face checkpoints store each expert as its own tensors: GGUF files only, for now.
    hf_model_types: &[],
    gguf_rope: RopeStyle::Neox,
    qkv_bias: false,
    hf_tensors: &HF_NAMES,
    turn_format: TurnFormat::ChatMl,
    moe: true,
    block: |h| Family {
        qk_norm: true,
        experts: h.experts.map(|(count, used, ffn)| Experts {
            count,
            used,
            ffn,
            norm_weights: true,
        }),
        ..Family::default()
    },
};

impl Arch {
    /// Qwen3-MoE (Qwen3's attention, a mixture of experts with renormalized top-k weights).
    #[allow(non_upper_case_globals)] // named as the enum variant it was
    pub const Qwen3Moe: Arch = Arch::new(&SPEC);
}
