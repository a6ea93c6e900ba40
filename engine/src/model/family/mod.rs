//! Model families, one file each: the names a family goes by in GGUF and Hugging Face files,
//! its block ([`Family`]) with its defaults, its tensor names and its chat fallback, all in
//! one [`FamilySpec`]. Both loaders look a family up in [`REGISTRY`]: adding a family is
//! adding its file and one line there.

mod block;
mod gemma;
mod gemma2;
mod gemma3;
mod llama;
mod qwen2;
mod qwen3;
mod qwen3moe;
mod spec;
mod tensors;

pub use block::{Activation, Experts, Family, RopeStyle, SlidingWindow};
pub use spec::{Arch, FamilySpec, Hparams, WindowPattern};
pub use tensors::{GGUF_NAMES, HF_NAMES, Names};

/// Every family the engine runs, one line each.
pub const REGISTRY: &[Arch] = &[
    Arch::Llama,
    Arch::Qwen2,
    Arch::Qwen3,
    Arch::Qwen3Moe,
    Arch::Gemma2,
    Arch::Gemma3,
];

/// The family a GGUF file's `general.architecture` names.
pub fn by_gguf_name(name: &str) -> Option<Arch> {
    REGISTRY
        .iter()
        .copied()
        .find(|a| a.spec().gguf_names.contains(&name))
}

/// The family a Hugging Face `config.json`'s `model_type` names.
pub fn by_hf_model_type(model_type: &str) -> Option<Arch> {
    REGISTRY
        .iter()
        .copied()
        .find(|a| a.spec().hf_model_types.contains(&model_type))
}

/// Every family's GGUF names, comma-separated (for messages).
pub fn gguf_names() -> String {
    REGISTRY
        .iter()
        .flat_map(|a| a.spec().gguf_names)
        .copied()
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat_template::TurnFormat;

    #[test]
    fn gemma_families_fall_back_to_gemma_turns_and_the_others_to_chatml() {
        assert_eq!(Arch::Gemma2.turn_format(), TurnFormat::Gemma);
        assert_eq!(Arch::Gemma3.turn_format(), TurnFormat::Gemma);
        for arch in [Arch::Llama, Arch::Qwen2, Arch::Qwen3, Arch::Qwen3Moe] {
            assert_eq!(arch.turn_format(), TurnFormat::ChatMl, "{}", arch.name());
        }
    }

    #[test]
    fn every_name_in_the_registry_finds_its_own_family() {
        for &arch in REGISTRY {
            for name in arch.spec().gguf_names {
                assert_eq!(by_gguf_name(name), Some(arch), "GGUF {name}");
            }
            for name in arch.spec().hf_model_types {
                assert_eq!(by_hf_model_type(name), Some(arch), "HF {name}");
            }
        }
        assert_eq!(
            gguf_names(),
            "llama, mistral, qwen2, qwen3, qwen3moe, gemma2, gemma3"
        );
    }
}
