//! Qwen2: the Llama block with biases on q, k and v.

use super::block::{Family, RopeStyle};
use super::spec::{Arch, FamilySpec};
use super::tensors::HF_NAMES;
use crate::chat_template::TurnFormat;

const SPEC: FamilySpec = FamilySpec {
    gguf_names: &["qwen2"],
    hf_model_types: &["qwen2"],
    gguf_rope: RopeStyle::Neox,
    qkv_bias: true,
    hf_tensors: &HF_NAMES,
    turn_format: TurnFormat::ChatMl,
    moe: false,
    block: |_| Family::default(),
};

impl Arch {
    /// Qwen2 (attention bias on q, k, v).
    #[allow(non_upper_case_globals)] // named as the enum variant it was
    pub const Qwen2: Arch = Arch::new(&SPEC);
}
