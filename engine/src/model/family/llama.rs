//! Llama 2/3, SmolLM, TinyLlama and Mistral: the plain block every other family adds to.

use super::block::{Family, RopeStyle};
use super::spec::{Arch, FamilySpec};
use super::tensors::HF_NAMES;
use crate::chat_template::TurnFormat;

const SPEC: FamilySpec = FamilySpec {
    gguf_names: &["llama", "mistral"],
    hf_model_types: &["llama", "mistral"],
    // llama.cpp's converter permutes the Q and K rows (`llama_model_rope_type`: NORM).
    gguf_rope: RopeStyle::Interleaved,
    qkv_bias: false,
    hf_tensors: &HF_NAMES,
    turn_format: TurnFormat::ChatMl,
    moe: false,
    block: |_| Family::default(),
};

impl Arch {
    /// Llama 2/3, SmolLM, TinyLlama, Mistral (GGUF `llama`).
    #[allow(non_upper_case_globals)] // named as the enum variant it was
    pub const Llama: Arch = Arch::new(&SPEC);
}
