//! Text ⇄ token ids, built on Hugging Face `tokenizers`.
//!
//! Two ways in:
//! - [`Tokenizer::from_gguf_vocab`]: from the vocabulary metadata of a GGUF file (already
//!   extracted by the GGUF reader into a [`GgufVocab`]), built in memory. `gpt2` vocabularies
//!   become byte-level BPE with the pre-tokenizer named by `tokenizer.ggml.pre`; `llama`
//!   (SentencePiece) vocabularies become BPE with merges derived from the scores and byte
//!   fallback, like HF's `LlamaConverter`. See [`GgufVocab`] for the details and the list of
//!   supported pre-tokenizers.
//! - [`Tokenizer::from_file`]: a Hugging Face `tokenizer.json`, with the special tokens named in
//!   `tokenizer_config.json` ([`TokenizerConfig`]).
//!
//! **Special tokens.** Control tokens (GGUF type 3) and the unknown token are registered as
//! *special* added tokens: they are recognised in text only when [`Tokenizer::encode`] is asked
//! to (`parse_special = true`) and are left out of decoded text. User-defined tokens (type 4)
//! are registered as *non-special* added tokens: always recognised, and kept when decoding, as
//! both llama.cpp and HF do. Chat prompts follow HF `apply_chat_template`: the template is
//! rendered to one string and that string is encoded with `parse_special = true`, so the
//! template's `<|im_start|>` become control tokens — and so does a `<|im_end|>` a user typed into
//! a message (HF behaves the same; escaping user content is the caller's choice). Raw
//! completion prompts and any other user text should use `parse_special = false`.
//!
//! **Decoding** skips special tokens. [`StreamDecoder`] turns a stream of ids into text deltas
//! that never split a UTF-8 character and concatenate to exactly [`Tokenizer::decode`] of the
//! whole sequence (for any valid text).

mod bytes;
mod config;
pub mod export;
mod gguf;
mod stream;

use std::path::Path;

pub use bytes::TokenBytes;
pub use config::TokenizerConfig;
pub use gguf::{GgufVocab, SUPPORTED_PRE_TOKENIZERS};
pub use stream::StreamDecoder;

/// Text of tokens that end a turn or a document in common chat formats. A token with one of
/// these texts that is a special (control) token of the vocabulary is a stop token, in
/// addition to EOS and the GGUF end-of-turn id (llama.cpp's end-of-generation rule, abridged).
pub const END_OF_TURN_TOKENS: &[&str] = &[
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<|endoftext|>",
    "<end_of_turn>",
    "<|end|>",
    "<EOT>",
    "</s>",
];

/// Why a tokenizer could not be built, or text could not be encoded or decoded. Messages are
/// one line, fit for a CLI error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenizerError {
    /// `tokenizer.ggml.model` names a tokenizer type we do not implement.
    #[error("unsupported tokenizer model {0:?} (supported: \"gpt2\", \"llama\")")]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer we do not know. Refused rather than guessed:
    /// a wrong split gives subtly wrong token ids. Loading the model's `tokenizer.json` instead
    /// works for any pre-tokenizer.
    #[error(
        "unsupported pre-tokenizer {name:?} (tokenizer.ggml.pre); supported: {supported}; load the model's tokenizer.json instead"
    )]
    UnsupportedPreTokenizer {
        /// The name found in the metadata.
        name: String,
        /// The names we support, comma-separated.
        supported: String,
    },
    /// The vocabulary metadata is inconsistent (missing merges, lengths that differ, ids out of
    /// range, ...).
    #[error("invalid tokenizer vocabulary: {0}")]
    InvalidVocab(String),
    /// A tokenizer or configuration file could not be read.
    #[error("cannot read {path}: {message}")]
    Io {
        /// The file, as given.
        path: String,
        /// The operating system's message.
        message: String,
    },
    /// A tokenizer or configuration file is not what we expect.
    #[error("cannot parse {path}: {message}")]
    Parse {
        /// The file, as given.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// The `tokenizers` library failed to build the tokenizer.
    #[error("cannot build the tokenizer: {0}")]
    Build(String),
    /// Encoding failed (in practice only on pathological regex backtracking).
    #[error("cannot encode text: {0}")]
    Encode(String),
    /// Decoding failed.
    #[error("cannot decode token ids: {0}")]
    Decode(String),
}

impl TokenizerError {
    /// A stable label for metrics and error bodies: `model` for load-time problems, `encode` /
    /// `decode` for request-time ones.
    pub fn error_type(&self) -> &'static str {
        match self {
            TokenizerError::Encode(_) => "encode",
            TokenizerError::Decode(_) => "decode",
            _ => "model",
        }
    }
}

/// A loaded tokenizer: encoding, decoding, and the special ids the engine needs. `Send + Sync`;
/// share it behind an `Arc`.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    /// Recognises special tokens in text (`parse_special = true`).
    parse: tokenizers::Tokenizer,
    /// Same tokenizer with special-token matching off (`encode_special_tokens`), for raw text.
    plain: tokenizers::Tokenizer,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    /// Whether `encode` prepends BOS itself (GGUF path; a `tokenizer.json` post-processor does
    /// it for the HF path).
    prepend_bos: bool,
    /// Whether `encode` appends EOS itself (GGUF `add_eos_token`).
    append_eos: bool,
    /// Whether encoding adds BOS, by either mechanism.
    adds_bos: bool,
    stop_ids: Vec<u32>,
    vocab_size: usize,
    /// Every token's bytes, built on first use (structured outputs, logprobs, `/tokenize`).
    token_bytes: std::sync::OnceLock<std::sync::Arc<TokenBytes>>,
}

impl Tokenizer {
    /// Builds the tokenizer from GGUF vocabulary metadata, in memory. See [`GgufVocab`].
    pub fn from_gguf_vocab(v: &GgufVocab) -> Result<Self, TokenizerError> {
        let inner = gguf::build(v)?;
        let mut stop_ids = Vec::new();
        stop_ids.extend(v.eos_id);
        stop_ids.extend(v.eot_id);
        for (id, tok) in v.tokens.iter().enumerate() {
            let special = v.token_types.and_then(|t| t.get(id)).is_none_or(|&t| {
                t == gguf::token_type::CONTROL || t == gguf::token_type::USER_DEFINED
            });
            if special && END_OF_TURN_TOKENS.contains(&tok.as_str()) {
                // Lengths were checked by `build`; GGUF vocabularies are far below 2^32.
                stop_ids.push(u32::try_from(id).unwrap_or(u32::MAX));
            }
        }
        let add_bos = v.add_bos && v.bos_id.is_some();
        Ok(Self::assemble(
            inner,
            v.bos_id,
            v.eos_id,
            add_bos,
            v.add_eos && v.eos_id.is_some(),
            add_bos,
            stop_ids,
            v.tokens.len(),
        ))
    }

    /// Loads a Hugging Face `tokenizer.json`. `config` (from `tokenizer_config.json`) names the
    /// BOS and EOS tokens; without it they are unknown. BOS is added when the file's
    /// post-processor adds it (HF semantics); `add_bos_token` in the config is informational.
    pub fn from_file(
        tokenizer_json: &Path,
        config: Option<&TokenizerConfig>,
    ) -> Result<Self, TokenizerError> {
        let bytes = std::fs::read(tokenizer_json).map_err(|e| TokenizerError::Io {
            path: tokenizer_json.display().to_string(),
            message: e.to_string(),
        })?;
        let inner =
            tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| TokenizerError::Parse {
                path: tokenizer_json.display().to_string(),
                message: e.to_string(),
            })?;
        let lookup = |t: Option<&str>| t.and_then(|t| inner.token_to_id(t));
        let bos_id = lookup(config.and_then(|c| c.bos_token.as_deref()));
        let eos_id = lookup(config.and_then(|c| c.eos_token.as_deref()));
        let added = inner.get_added_tokens_decoder();
        let mut stop_ids: Vec<u32> = eos_id.into_iter().collect();
        let mut eot: Vec<u32> = added
            .iter()
            .filter(|(_, t)| t.special && END_OF_TURN_TOKENS.contains(&t.content.as_str()))
            .map(|(&id, _)| id)
            .collect();
        eot.sort_unstable();
        stop_ids.extend(eot);
        let adds_bos = match (bos_id, inner.encode_fast("", true)) {
            (Some(bos), Ok(enc)) => enc.get_ids().first() == Some(&bos),
            _ => false,
        };
        let vocab_size = inner.get_vocab_size(true);
        Ok(Self::assemble(
            inner, bos_id, eos_id, false, false, adds_bos, stop_ids, vocab_size,
        ))
    }

    #[allow(clippy::too_many_arguments)] // private constructor shared by the two loaders
    fn assemble(
        parse: tokenizers::Tokenizer,
        bos_id: Option<u32>,
        eos_id: Option<u32>,
        prepend_bos: bool,
        append_eos: bool,
        adds_bos: bool,
        mut stop_ids: Vec<u32>,
        vocab_size: usize,
    ) -> Self {
        let mut plain = parse.clone();
        plain.set_encode_special_tokens(true);
        let mut seen = std::collections::HashSet::new();
        stop_ids.retain(|id| seen.insert(*id));
        Self {
            parse,
            plain,
            bos_id,
            eos_id,
            prepend_bos,
            append_eos,
            adds_bos,
            stop_ids,
            vocab_size,
            token_bytes: std::sync::OnceLock::new(),
        }
    }

    /// Encodes `text`. With `parse_special`, special tokens written in the text (e.g.
    /// `<|im_start|>`) become their ids; without, they are tokenized as plain text. Adds BOS
    /// when the model asks for it (GGUF `add_bos_token`, or the `tokenizer.json`
    /// post-processor), but never a second one when the text already starts with BOS (chat
    /// templates often write `{{ bos_token }}`); appends EOS when the model asks (rare).
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>, TokenizerError> {
        self.encode_with(text, parse_special, true)
    }

    /// Like [`Tokenizer::encode`]; with `add_special = false` no BOS or EOS is added, whatever
    /// the model asks for (vLLM's `add_special_tokens`, llama.cpp's `add_special`).
    pub fn encode_with(
        &self,
        text: &str,
        parse_special: bool,
        add_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let tk = if parse_special {
            &self.parse
        } else {
            &self.plain
        };
        let enc = tk
            .encode_fast(text, add_special)
            .map_err(|e| TokenizerError::Encode(e.to_string()))?;
        let body = enc.get_ids();
        if !add_special {
            return Ok(body.to_vec());
        }
        let mut ids = Vec::with_capacity(body.len() + 2);
        if let (true, Some(bos)) = (self.prepend_bos, self.bos_id) {
            ids.push(bos);
        }
        ids.extend_from_slice(body);
        if let Some(bos) = self.bos_id
            && ids.len() >= 2
            && ids[0] == bos
            && ids[1] == bos
        {
            ids.remove(0);
        }
        if let (true, Some(eos)) = (self.append_eos, self.eos_id)
            && ids.last() != Some(&eos)
        {
            ids.push(eos);
        }
        Ok(ids)
    }

    /// Decodes ids to text, leaving out special tokens. Ids outside the vocabulary are skipped.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        self.decode_with(ids, true)
    }

    /// Decodes ids to text; `skip_special = false` keeps the text of special tokens.
    pub fn decode_with(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        self.parse
            .decode(ids, skip_special)
            .map_err(|e| TokenizerError::Decode(e.to_string()))
    }

    /// A streaming decoder for generated ids: deltas concatenate to `decode(all ids)`. For
    /// SentencePiece models that means the first token's leading space is dropped, as
    /// [`Tokenizer::decode`] does; use [`Tokenizer::decoder_after`] to keep it.
    pub fn decoder(&self) -> StreamDecoder<'_> {
        StreamDecoder::new(self, &[])
    }

    /// A streaming decoder that continues after `context` (typically the prompt): its deltas
    /// are the text the new ids add to `decode(context)`, so a generated token's leading space
    /// survives even for SentencePiece models. Only the last few context ids are kept.
    pub fn decoder_after(&self, context: &[u32]) -> StreamDecoder<'_> {
        StreamDecoder::new(self, context)
    }

    /// Number of ids, added tokens included (the model's logits may be longer: padding).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The beginning-of-sequence id, when the model has one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// The end-of-sequence id, when the model has one.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos_id
    }

    /// Whether [`Tokenizer::encode`] adds BOS.
    pub fn add_bos(&self) -> bool {
        self.adds_bos
    }

    /// Ids that end generation: EOS, the GGUF end-of-turn id, and every special token whose
    /// text is in [`END_OF_TURN_TOKENS`]; deduplicated, EOS first.
    pub fn stop_token_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    /// Whether `id` ends generation (see [`Tokenizer::stop_token_ids`]).
    pub fn is_stop_token(&self, id: u32) -> bool {
        self.stop_ids.contains(&id)
    }

    /// The vocabulary entry of `id` as stored (byte-level BPE shows a space as `Ġ`,
    /// SentencePiece as `▁`); for special tokens, their text (`<|im_end|>`).
    pub fn token_str(&self, id: u32) -> Option<String> {
        self.parse.id_to_token(id)
    }

    /// The id of a vocabulary entry or added token, written as stored.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.parse.token_to_id(token)
    }

    /// The BOS token's text, for chat templates (`bos_token`).
    pub fn bos_token(&self) -> Option<String> {
        self.bos_id.and_then(|id| self.token_str(id))
    }

    /// The EOS token's text, for chat templates (`eos_token`).
    pub fn eos_token(&self) -> Option<String> {
        self.eos_id.and_then(|id| self.token_str(id))
    }

    /// Every token's bytes (built on the first call, then shared).
    pub fn token_bytes(&self) -> std::sync::Arc<TokenBytes> {
        std::sync::Arc::clone(
            self.token_bytes
                .get_or_init(|| std::sync::Arc::new(TokenBytes::new(self, self.vocab_size))),
        )
    }

    /// The underlying `tokenizers` tokenizer (special tokens recognised).
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.parse
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A small byte-level BPE vocabulary shaped like SmolLM2's: control tokens first, then the
    /// 256 byte symbols, then a few merges.
    pub(crate) fn gpt2_fixture() -> (Vec<String>, Vec<i32>, Vec<String>) {
        let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        let mut types = vec![3, 3, 3];
        let mut alphabet: Vec<char> = tokenizers::pre_tokenizers::byte_level::ByteLevel::alphabet()
            .into_iter()
            .collect();
        alphabet.sort_unstable();
        for c in alphabet {
            tokens.push(c.to_string());
            types.push(1);
        }
        let merges = [
            "e l",
            "el l",
            "h ell",
            "hell o",
            "Ġ t",
            "h e",
            "Ġt he",
            "Ġ a",
            "i n",
            "Ġ w",
            "o r",
            "Ġw or",
            "l d",
            "Ġwor ld",
            "Ġ h",
            "Ġh ell",
            "Ġhell o",
            "Ġ Ġ",
            "ĠĠ ĠĠ",
        ];
        let mut merge_list = Vec::new();
        for m in merges {
            let (a, b) = m.split_once(' ').unwrap_or((m, ""));
            tokens.push(format!("{a}{b}"));
            types.push(1);
            merge_list.push(m.to_owned());
        }
        tokens.push("<my_tool>".to_owned());
        types.push(4);
        (tokens, types, merge_list)
    }

    /// The gpt2 fixture with `<|im_start|>` (id 1) as BOS, added by encoding when `add_bos`.
    pub(crate) fn gpt2_tokenizer_with_bos(add_bos: bool) -> Tokenizer {
        gpt2_with(Some("smollm"), add_bos)
    }

    pub(crate) fn gpt2_tokenizer(pre: Option<&str>) -> Tokenizer {
        gpt2_with(pre, false)
    }

    fn gpt2_with(pre: Option<&str>, add_bos: bool) -> Tokenizer {
        let (tokens, types, merges) = gpt2_fixture();
        Tokenizer::from_gguf_vocab(&GgufVocab {
            model: "gpt2",
            pre,
            tokens: &tokens,
            token_types: Some(&types),
            merges: Some(&merges),
            scores: None,
            bos_id: Some(1),
            eos_id: Some(2),
            eot_id: None,
            add_bos,
            add_eos: false,
            add_space_prefix: true,
        })
        .expect("fixture builds")
    }

    fn id_of(t: &Tokenizer, s: &str) -> u32 {
        t.token_to_id(s).expect("token in fixture")
    }

    #[test]
    fn gpt2_encodes_with_merges_and_round_trips() {
        let t = gpt2_tokenizer(Some("smollm"));
        let ids = t.encode("hello world", false).expect("encodes");
        assert_eq!(ids, vec![id_of(&t, "hello"), id_of(&t, "Ġworld")]);
        assert_eq!(t.decode(&ids).expect("decodes"), "hello world");
        for text in [
            "",
            " ",
            "  two  spaces ",
            "tab\there\nnewline",
            "émoji 🙂 中文 ok",
            "a1234b",
        ] {
            let ids = t.encode(text, false).expect("encodes");
            assert_eq!(t.decode(&ids).expect("decodes"), text, "{text:?}");
        }
    }

    #[test]
    fn special_tokens_only_when_asked() {
        let t = gpt2_tokenizer(Some("smollm"));
        let text = "<|im_start|>user\nhi<|im_end|>";
        let parsed = t.encode(text, true).expect("encodes");
        assert_eq!(parsed.first(), Some(&1));
        assert_eq!(parsed.last(), Some(&2));
        let raw = t.encode(text, false).expect("encodes");
        assert!(!raw.contains(&1) && !raw.contains(&2), "{raw:?}");
        // Raw text decodes back to the literal markers; special tokens vanish from decoded text.
        assert_eq!(t.decode(&raw).expect("decodes"), text);
        assert_eq!(t.decode(&parsed).expect("decodes"), "user\nhi");
        assert_eq!(t.decode_with(&parsed, false).expect("decodes"), text);
        // User-defined tokens are always recognised and always decoded.
        let tool = id_of(&t, "<my_tool>");
        assert_eq!(t.encode("<my_tool>", false).expect("encodes"), vec![tool]);
        assert_eq!(t.decode(&[tool]).expect("decodes"), "<my_tool>");
    }

    #[test]
    fn special_ids_and_stop_tokens() {
        let t = gpt2_tokenizer(Some("smollm"));
        assert_eq!(t.bos_id(), Some(1));
        assert_eq!(t.eos_id(), Some(2));
        assert_eq!(t.bos_token().as_deref(), Some("<|im_start|>"));
        assert_eq!(t.eos_token().as_deref(), Some("<|im_end|>"));
        // EOS first, then <|endoftext|> (a control token named like an end of document).
        assert_eq!(t.stop_token_ids(), &[2, 0]);
        assert!(t.is_stop_token(0) && !t.is_stop_token(1));
        assert_eq!(t.vocab_size(), 3 + 256 + 19 + 1);
        assert!(!t.add_bos());
        assert_eq!(t.token_str(id_of(&t, "Ġworld")).as_deref(), Some("Ġworld"));
        assert_eq!(t.token_str(100_000), None);
    }

    #[test]
    fn bos_is_added_once_when_asked() {
        let (tokens, types, merges) = gpt2_fixture();
        let t = Tokenizer::from_gguf_vocab(&GgufVocab {
            model: "gpt2",
            pre: None,
            tokens: &tokens,
            token_types: Some(&types),
            merges: Some(&merges),
            scores: None,
            bos_id: Some(0),
            eos_id: Some(2),
            eot_id: Some(2),
            add_bos: true,
            add_eos: false,
            add_space_prefix: true,
        })
        .expect("builds");
        assert!(t.add_bos());
        let ids = t.encode("hello", true).expect("encodes");
        assert_eq!(ids, vec![0, id_of(&t, "hello")]);
        let ids = t.encode("<|endoftext|>hello", true).expect("encodes");
        assert_eq!(ids, vec![0, id_of(&t, "hello")], "no double BOS");
        assert_eq!(t.encode("", true).expect("encodes"), vec![0]);
        assert_eq!(t.stop_token_ids(), &[2, 0], "EOS and EOT deduplicated");
    }

    #[test]
    fn from_file_round_trips_a_saved_tokenizer() {
        let t = gpt2_tokenizer(Some("smollm"));
        let dir = std::env::temp_dir().join(format!("slotlight-tok-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("tokenizer.json");
        t.inner().save(&path, false).expect("saves");
        let cfg = TokenizerConfig::from_json_str(
            r#"{"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>", "special": true}, "chat_template": "x"}"#,
        )
        .expect("parses");
        let loaded = Tokenizer::from_file(&path, Some(&cfg)).expect("loads");
        std::fs::remove_dir_all(&dir).ok();
        for text in ["hello world", "<|im_start|>user\n1234 🙂<|im_end|>"] {
            assert_eq!(
                loaded.encode(text, true).expect("encodes"),
                t.encode(text, true).expect("encodes")
            );
            assert_eq!(
                loaded.encode(text, false).expect("encodes"),
                t.encode(text, false).expect("encodes")
            );
        }
        assert_eq!(loaded.bos_id(), Some(1));
        assert_eq!(loaded.eos_id(), Some(2));
        assert_eq!(loaded.stop_token_ids(), &[2, 0]);
        assert_eq!(loaded.vocab_size(), t.vocab_size());
        assert!(!loaded.add_bos());

        let missing = Tokenizer::from_file(&dir.join("nope.json"), None).expect_err("missing");
        assert!(matches!(missing, TokenizerError::Io { .. }));
        assert!(missing.to_string().starts_with("cannot read "));
    }

    /// Engine fixtures written by the model tests, when present.
    #[test]
    fn loads_the_tiny_fixture_tokenizers() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny");
        for name in ["llama", "llama3"] {
            let dir = root.join(name);
            if !dir.join("tokenizer.json").exists() {
                eprintln!("skipping: no fixture {name}/tokenizer.json");
                continue;
            }
            let cfg = TokenizerConfig::from_file(&dir.join("tokenizer_config.json"))
                .expect("config parses");
            let t = Tokenizer::from_file(&dir.join("tokenizer.json"), Some(&cfg)).expect("loads");
            let text = "<|im_start|>user\nHello there<|im_end|>\n";
            let ids = t.encode(text, true).expect("encodes");
            assert_eq!(t.decode_with(&ids, false).expect("decodes"), text);
            assert!(t.eos_id().is_some());
            assert!(cfg.chat_template().is_some());
        }
    }

    #[test]
    fn errors_are_one_line_and_labelled() {
        let e = TokenizerError::UnsupportedPreTokenizer {
            name: "tekken".into(),
            supported: "smollm".into(),
        };
        assert!(!e.to_string().contains('\n'));
        assert_eq!(e.error_type(), "model");
        assert_eq!(TokenizerError::Encode("x".into()).error_type(), "encode");
        assert_eq!(TokenizerError::Decode("x".into()).error_type(), "decode");
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Tokenizer>();
    }
}
