//! The turn formats a model that ships no chat template is prompted with: its family's own
//! (Gemma's for Gemma) or ChatML for the others. A documented fallback, logged once at load.

use super::ChatTemplate;

/// The turn format of a model family, for its models that ship no chat template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnFormat {
    /// ChatML (`<|im_start|>role … <|im_end|>`): [`ChatTemplate::chatml_fallback`].
    ChatMl,
    /// Gemma's turns (`<start_of_turn>user … <end_of_turn>`): [`ChatTemplate::gemma_fallback`].
    Gemma,
}

/// The template a model with turn format `format` that ships no chat template is prompted
/// with.
pub fn fallback_template(
    format: TurnFormat,
    bos_token: Option<String>,
    eos_token: Option<String>,
) -> ChatTemplate {
    match format {
        TurnFormat::Gemma => ChatTemplate::gemma_fallback(bos_token, eos_token),
        TurnFormat::ChatMl => ChatTemplate::chatml_fallback(bos_token, eos_token),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_format_is_its_own_template() {
        let gemma = fallback_template(TurnFormat::Gemma, Some("<bos>".into()), None);
        let chatml = fallback_template(TurnFormat::ChatMl, None, None);
        assert_eq!(gemma.source(), super::super::GEMMA_TEMPLATE);
        assert_eq!(chatml.source(), super::super::CHATML_TEMPLATE);
    }
}
