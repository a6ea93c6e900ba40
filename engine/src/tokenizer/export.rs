//! The engine's tokenizer as Hugging Face files, for routers that tokenize prompts themselves
//! (llm-d's precise prefix-cache scorer loads them with `transformers`' `AutoTokenizer`).
//!
//! Two files make a folder `AutoTokenizer.from_pretrained` loads as the engine tokenizes:
//! - `tokenizer.json`: the vocabulary, with a post-processor that adds BOS (and EOS) when the
//!   engine adds them itself (GGUF models: [`Tokenizer::encode`] prepends BOS rather than the
//!   `tokenizers` pipeline), so `add_special_tokens=True` gives the engine's completion tokens;
//! - `tokenizer_config.json`: `PreTrainedTokenizerFast`, the BOS/EOS tokens' text and the chat
//!   template the engine renders chat prompts with (the model's own, else its family's
//!   fallback), so `apply_chat_template(..., tokenize=True)` gives its chat tokens.

use serde_json::{Value, json};
use tokenizers::processors::template::TemplateProcessing;

use super::{Tokenizer, TokenizerError};

/// `tokenizer.json` text: the engine's tokenizer, with BOS/EOS added by a post-processor
/// where the engine adds them outside the `tokenizers` pipeline.
pub fn tokenizer_json(tok: &Tokenizer) -> Result<String, TokenizerError> {
    let mut inner = tok.inner().clone();
    let bos = tok.bos_id.filter(|_| tok.prepend_bos);
    let eos = tok.eos_id.filter(|_| tok.append_eos);
    if bos.is_some() || eos.is_some() {
        let named = |id: Option<u32>| id.and_then(|id| tok.token_str(id).map(|s| (s, id)));
        let (bos, eos) = (named(bos), named(eos));
        let (b, e) = (
            bos.as_ref().map(|t| t.0.as_str()),
            eos.as_ref().map(|t| t.0.as_str()),
        );
        let wrap = |body: &str| {
            [b, Some(body), e]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(" ")
        };
        let single = wrap("$A:0");
        let pair = format!("{single} {}", wrap("$B:1"));
        let specials: Vec<(String, u32)> = bos.iter().chain(eos.iter()).cloned().collect();
        let pp = TemplateProcessing::builder()
            .try_single(single.as_str())
            .and_then(|b| b.try_pair(pair.as_str()))
            .map_err(|e| TokenizerError::Encode(format!("post-processor template: {e}")))?
            .special_tokens(specials)
            .build()
            .map_err(|e| TokenizerError::Encode(format!("post-processor: {e}")))?;
        inner.with_post_processor(Some(pp));
    }
    inner
        .to_string(false)
        .map_err(|e| TokenizerError::Encode(format!("serializing the tokenizer: {e}")))
}

/// `tokenizer_config.json`: the fast tokenizer class, the special tokens' text, whether
/// encoding adds BOS/EOS, and `chat_template`.
pub fn tokenizer_config(tok: &Tokenizer, chat_template: &str) -> Value {
    json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tok.bos_token().map_or(Value::Null, Value::from),
        "eos_token": tok.eos_token().map_or(Value::Null, Value::from),
        "add_bos_token": tok.add_bos(),
        "add_eos_token": tok.append_eos,
        "clean_up_tokenization_spaces": false,
        "chat_template": chat_template,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(add_bos: bool) -> Tokenizer {
        super::super::tests::gpt2_tokenizer_with_bos(add_bos)
    }

    #[test]
    fn a_tokenizer_that_prepends_bos_exports_a_post_processor_that_does() {
        for add_bos in [false, true] {
            let tok = vocab(add_bos);
            let text = tokenizer_json(&tok).expect("export");
            let back = tokenizers::Tokenizer::from_bytes(text.as_bytes()).expect("reload");
            let theirs = back.encode("hello world", true).expect("encode");
            let ours = tok.encode("hello world", false).expect("encode");
            assert_eq!(theirs.get_ids(), ours.as_slice(), "add_bos = {add_bos}");
            assert_eq!(ours.first() == tok.bos_id().as_ref(), add_bos);
            // Without special tokens, neither adds BOS.
            let plain = back.encode("hello world", false).expect("encode");
            let ours = tok
                .encode_with("hello world", false, false)
                .expect("encode");
            assert_eq!(plain.get_ids(), ours.as_slice());
        }
    }

    #[test]
    fn the_config_names_the_template_and_special_tokens() {
        let tok = vocab(true);
        let cfg = tokenizer_config(&tok, "{{ messages }}");
        assert_eq!(cfg["tokenizer_class"], "PreTrainedTokenizerFast");
        assert_eq!(cfg["chat_template"], "{{ messages }}");
        assert_eq!(cfg["add_bos_token"], true);
        assert_eq!(cfg["bos_token"].as_str(), tok.bos_token().as_deref());
        assert_eq!(cfg["eos_token"].as_str(), tok.eos_token().as_deref());
    }
}
