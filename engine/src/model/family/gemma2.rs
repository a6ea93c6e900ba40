//! Gemma 2: the Gemma block ([`super::gemma`]) with soft-capped attention and logits and a
//! sliding window on every other layer.

use super::block::RopeStyle;
use super::gemma::{self, Generation};
use super::spec::{Arch, FamilySpec};
use crate::chat_template::TurnFormat;

const GEMMA2: Generation = Generation {
    qk_norm: false,
    period: 2,
    local_rope_theta: None,
    layers_27b: 46,
};

const SPEC: FamilySpec = FamilySpec {
    gguf_names: &["gemma2"],
    hf_model_types: &["gemma2"],
    gguf_rope: RopeStyle::Neox,
    qkv_bias: false,
    hf_tensors: &gemma::HF_NAMES,
    turn_format: TurnFormat::Gemma,
    moe: false,
    block: |h| gemma::block(h, &GEMMA2),
};

impl Arch {
    /// Gemma 2 (GeGLU, pre- and post-norms, soft-capped attention and logits, sliding window
    /// on every other layer).
    #[allow(non_upper_case_globals)] // named as the enum variant it was
    pub const Gemma2: Arch = Arch::new(&SPEC);
}
