//! Qwen3: the Llama block with a per-head RMSNorm of q and k, and no bias.

use super::block::{Family, RopeStyle};
use super::spec::{Arch, FamilySpec};
use super::tensors::HF_NAMES;
use crate::chat_template::TurnFormat;

const SPEC: FamilySpec = FamilySpec {
    gguf_names: &["qwen3"],
    hf_model_types: &["qwen3"],
    gguf_rope: RopeStyle::Neox,
    qkv_bias: false,
    hf_tensors: &HF_NAMES,
    turn_format: TurnFormat::ChatMl,
    moe: false,
    block: |_| Family {
        qk_norm: true,
        ..Family::default()
    },
};

impl Arch {
    /// Qwen3 (per-head RMSNorm on q and k, no bias).
    #[allow(non_upper_case_globals)] // named as the enum variant it was
    pub const Qwen3: Arch = Arch::new(&SPEC);
}
