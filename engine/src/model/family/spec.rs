//! What a family file declares ([`FamilySpec`]), the handle a model's configuration keeps on it
//! ([`Arch`]), and what both loaders read for it ([`Hparams`]).

use super::block::{Family, RopeStyle};
use super::tensors::Names;
use crate::chat_template::TurnFormat;

/// One model family, described once and read by both loaders.
pub struct FamilySpec {
    /// Its GGUF `general.architecture` names; the first is its own ([`Arch::name`]).
    pub gguf_names: &'static [&'static str],
    /// Its Hugging Face `config.json` `model_type`s.
    pub hf_model_types: &'static [&'static str],
    /// How RoPE pairs a head's dimensions in its GGUF files (Hugging Face checkpoints always
    /// rotate the two halves).
    pub gguf_rope: RopeStyle,
    /// Whether q, k and v have biases (a Hugging Face config may also ask for them with
    /// `attention_bias`).
    pub qkv_bias: bool,
    /// Its tensors' names in a Hugging Face checkpoint (GGUF files use llama.cpp's, the same
    /// for every family).
    pub hf_tensors: &'static Names,
    /// The turn format its models are prompted with when they ship no chat template.
    pub turn_format: TurnFormat,
    /// Whether its feed-forward is a mixture of experts (its files must then say how many).
    pub moe: bool,
    /// Its block: what it does beyond Llama's, from what the file gives, with the family's
    /// defaults for what it leaves out.
    pub block: fn(&Hparams) -> Family,
}

/// The family of a model: a handle on its [`FamilySpec`], compared by name. Each family file
/// names its own (`Arch::Llama`, `Arch::Gemma3`, ...). Backends read the [`Family`] it builds,
/// never the `Arch`.
#[derive(Clone, Copy)]
pub struct Arch(&'static FamilySpec);

impl Arch {
    /// The handle on `spec` (for its family file).
    pub(crate) const fn new(spec: &'static FamilySpec) -> Self {
        Self(spec)
    }

    /// Its description.
    pub fn spec(self) -> &'static FamilySpec {
        self.0
    }

    /// Its own GGUF `general.architecture` name.
    pub fn name(self) -> &'static str {
        self.0.gguf_names[0]
    }

    /// The turn format its models are prompted with when they ship no chat template.
    pub fn turn_format(self) -> TurnFormat {
        self.0.turn_format
    }
}

impl PartialEq for Arch {
    fn eq(&self, other: &Self) -> bool {
        self.name() == other.name()
    }
}

impl Eq for Arch {}

impl std::fmt::Debug for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Which layers are local, as a file gives it.
#[derive(Debug, Clone, PartialEq)]
pub enum WindowPattern {
    /// One flag per layer, `true` for a local one.
    Layers(Vec<bool>),
    /// Every `n`-th layer global, the others local.
    Period(usize),
}

/// The hyper-parameters a family's block may read, as a GGUF file or a Hugging Face config
/// gives them (`None`: the file does not say).
#[derive(Debug, Clone, PartialEq)]
pub struct Hparams {
    /// Hidden size.
    pub hidden: usize,
    /// Attention (query) heads.
    pub heads: usize,
    /// Size of one head.
    pub head_dim: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// Positions a local layer sees.
    pub sliding_window: Option<usize>,
    /// Which layers are local.
    pub window_pattern: Option<WindowPattern>,
    /// RoPE base of the local layers.
    pub local_rope_theta: Option<f64>,
    /// Linear RoPE scaling factor.
    pub rope_linear_factor: Option<f64>,
    /// Attention score soft-cap.
    pub attn_softcap: Option<f64>,
    /// Logit soft-cap.
    pub final_softcap: Option<f64>,
    /// Queries are scaled by `1/√query_pre_attn_scalar` (Hugging Face: the config's, else
    /// `head_dim`; GGUF files have no such key).
    pub query_pre_attn_scalar: Option<f64>,
    /// Experts per layer, experts per token and one expert's hidden units (GGUF
    /// `expert_count`, `expert_used_count`, `expert_feed_forward_length`), when the file gives
    /// all three.
    pub experts: Option<(usize, usize, usize)>,
}
