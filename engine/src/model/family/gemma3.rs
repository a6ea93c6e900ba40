//! Gemma 3: the Gemma block ([`super::gemma`]) with QK norm and a sliding window on five of
//! six layers, which rotate with their own RoPE base.

use super::block::RopeStyle;
use super::gemma::{self, Generation};
use super::spec::{Arch, FamilySpec};
use crate::chat_template::TurnFormat;

const GEMMA3: Generation = Generation {
    qk_norm: true,
    period: 6,
    local_rope_theta: Some(10000.0),
    layers_27b: 62,
};

const SPEC: FamilySpec = FamilySpec {
    gguf_names: &["gemma3"],
    hf_model_types: &["gemma3_text", "gemma3"],
    gguf_rope: RopeStyle::Neox,
    qkv_bias: false,
    hf_tensors: &gemma::HF_NAMES,
    turn_format: TurnFormat::Gemma,
    moe: false,
    block: |h| gemma::block(h, &GEMMA3),
};

impl Arch {
    /// Gemma 3 (GeGLU, pre- and post-norms, QK norm, sliding window on five of six layers).
    #[allow(non_upper_case_globals)] // named as the enum variant it was
    pub const Gemma3: Arch = Arch::new(&SPEC);
}
