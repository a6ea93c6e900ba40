//! Building a `tokenizers` tokenizer from GGUF vocabulary metadata.

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::normalizers::prepend::Prepend;
use tokenizers::normalizers::replace::Replace;
use tokenizers::normalizers::unicode::NFC;
use tokenizers::normalizers::utils::Sequence as NormalizerSequence;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, DecoderWrapper, PreTokenizerWrapper, SplitDelimiterBehavior};

use super::TokenizerError;

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
pub(crate) mod token_type {
    /// An ordinary vocabulary entry.
    pub const NORMAL: i32 = 1;
    /// The unknown token (`<unk>`).
    pub const UNKNOWN: i32 = 2;
    /// A control token (`<s>`, `<|im_end|>`): special, matched in text only on request.
    pub const CONTROL: i32 = 3;
    /// A user-defined token: matched in text always, decoded as text.
    pub const USER_DEFINED: i32 = 4;
    /// A reserved, unused entry.
    #[allow(dead_code)] // listed for completeness: unused entries need no handling
    pub const UNUSED: i32 = 5;
    /// A byte-fallback token (`<0x0A>`).
    #[allow(dead_code)] // byte tokens are found by their text (`<0xNN>`), not their type
    pub const BYTE: i32 = 6;
}

/// Names accepted in `tokenizer.ggml.pre` (and what they mean):
/// - `default`, `gpt2`, `gpt-2`, `phi-2`, `mpt`, `olmo` (or no `pre` at all): GPT-2 byte-level
///   BPE with its split regex;
/// - `smollm`, `starcoder`: each digit split off first, then as GPT-2 (HF: `Digits(individual)`
///   + `ByteLevel`);
/// - `llama3`, `llama-v3`, `llama-bpe`, `dbrx`, `smaug-bpe`: the Llama-3 (cl100k) split regex,
///   then byte-level; `llama*` also "ignore merges" (a pre-token found whole in the vocabulary is
///   one token), as llama.cpp and HF's Llama-3 `tokenizer.json` do;
/// - `qwen2`, `deepseek-r1-qwen`: NFC, the Qwen2 split regex (digits one by one), byte-level.
pub const SUPPORTED_PRE_TOKENIZERS: &[&str] = &[
    "default",
    "gpt2",
    "gpt-2",
    "phi-2",
    "mpt",
    "olmo",
    "smollm",
    "starcoder",
    "llama3",
    "llama-v3",
    "llama-bpe",
    "dbrx",
    "smaug-bpe",
    "qwen2",
    "deepseek-r1-qwen",
];

/// The Llama-3 pre-tokenizer split (as in Meta's `tokenizer.json`; cl100k's pattern).
const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The Qwen2 pre-tokenizer split: Llama-3's with single digits.
const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// SentencePiece's word-boundary marker.
const SPIECE_UNDERLINE: &str = "\u{2581}";

/// The tokenizer metadata of a GGUF file (`tokenizer.ggml.*`), extracted by the GGUF reader.
///
/// - `model`: `"gpt2"` (byte-level BPE; needs `merges`) or `"llama"` (SentencePiece; needs
///   `scores`, or else `merges`). `llama` vocabularies become a BPE whose merges are derived
///   from the scores (every split of a normal token into two normal tokens, ranked by the
///   token's score, like HF's `LlamaConverter`), with byte fallback (`<0xNN>` tokens), a `▁`
///   prefix and `▁` for spaces (HF's Llama-2 normalizer: the prefix is added to every piece of
///   text between special tokens, as llama.cpp does with `add_space_prefix`), and the matching
///   decoder (`▁`→space, byte fallback, fuse, strip one leading space).
/// - `pre`: the pre-tokenizer name (see [`SUPPORTED_PRE_TOKENIZERS`]); an unknown name is an
///   error ([`TokenizerError::UnsupportedPreTokenizer`]), not a silent fallback. Ignored for
///   `llama`.
/// - `token_types`: llama.cpp types; control (3) and unknown (2) tokens become special added
///   tokens, user-defined (4) ones non-special added tokens. Without types only BOS/EOS/EOT are
///   registered as special.
/// - `bos_id`/`eos_id`/`eot_id`, `add_bos`/`add_eos`: as in the metadata.
///
/// - `add_space_prefix`: whether a `llama` vocabulary prepends `▁` (and its decoder strips
///   one leading space).
#[derive(Debug, Clone, Copy)]
pub struct GgufVocab<'a> {
    /// `tokenizer.ggml.model`: `"gpt2"` or `"llama"`.
    pub model: &'a str,
    /// `tokenizer.ggml.pre`.
    pub pre: Option<&'a str>,
    /// `tokenizer.ggml.tokens`, indexed by id.
    pub tokens: &'a [String],
    /// `tokenizer.ggml.token_type`, same length as `tokens`.
    pub token_types: Option<&'a [i32]>,
    /// `tokenizer.ggml.merges`, each `"left right"`.
    pub merges: Option<&'a [String]>,
    /// `tokenizer.ggml.scores`, same length as `tokens`.
    pub scores: Option<&'a [f32]>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_id: Option<u32>,
    /// `tokenizer.ggml.eot_token_id` (end of turn).
    pub eot_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`: prepend BOS when encoding.
    pub add_bos: bool,
    /// `tokenizer.ggml.add_eos_token`: append EOS when encoding.
    pub add_eos: bool,
    /// `tokenizer.ggml.add_space_prefix` (`llama` vocabularies; llama.cpp's default: true):
    /// prepend `▁` to the text (Llama 2), or not (Gemma).
    pub add_space_prefix: bool,
}

/// Which pre-tokenization a `gpt2` vocabulary uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PreKind {
    Gpt2,
    DigitsGpt2,
    Llama3 { ignore_merges: bool },
    Qwen2,
}

fn pre_kind(name: Option<&str>) -> Result<PreKind, TokenizerError> {
    Ok(match name.unwrap_or("default") {
        "default" | "gpt2" | "gpt-2" | "phi-2" | "mpt" | "olmo" => PreKind::Gpt2,
        "smollm" | "starcoder" => PreKind::DigitsGpt2,
        "llama3" | "llama-v3" | "llama-bpe" => PreKind::Llama3 {
            ignore_merges: true,
        },
        "dbrx" | "smaug-bpe" => PreKind::Llama3 {
            ignore_merges: false,
        },
        "qwen2" | "deepseek-r1-qwen" => PreKind::Qwen2,
        other => {
            return Err(TokenizerError::UnsupportedPreTokenizer {
                name: other.to_owned(),
                supported: SUPPORTED_PRE_TOKENIZERS.join(", "),
            });
        }
    })
}

fn build_err(e: impl std::fmt::Display) -> TokenizerError {
    TokenizerError::Build(e.to_string())
}

fn invalid(msg: impl Into<String>) -> TokenizerError {
    TokenizerError::InvalidVocab(msg.into())
}

/// Checks the metadata is self-consistent.
fn validate(v: &GgufVocab) -> Result<(), TokenizerError> {
    let n = v.tokens.len();
    if n == 0 {
        return Err(invalid("tokenizer.ggml.tokens is empty"));
    }
    if u32::try_from(n).is_err() {
        return Err(invalid(format!("{n} tokens do not fit 32-bit ids")));
    }
    if let Some(t) = v.token_types
        && t.len() != n
    {
        return Err(invalid(format!("{} token types for {n} tokens", t.len())));
    }
    if let Some(s) = v.scores
        && s.len() != n
    {
        return Err(invalid(format!("{} scores for {n} tokens", s.len())));
    }
    for (name, id) in [("bos", v.bos_id), ("eos", v.eos_id), ("eot", v.eot_id)] {
        if let Some(id) = id
            && id as usize >= n
        {
            return Err(invalid(format!(
                "{name} token id {id} is outside the vocabulary ({n} tokens)"
            )));
        }
    }
    Ok(())
}

/// Token string → id; a string listed twice keeps its first id.
fn vocab_map(tokens: &[String]) -> Vocab {
    let mut vocab = Vocab::default();
    vocab.reserve(tokens.len());
    for (id, tok) in tokens.iter().enumerate() {
        // `validate` checked that every id fits in u32.
        vocab
            .entry(tok.clone())
            .or_insert(u32::try_from(id).unwrap_or(u32::MAX));
    }
    vocab
}

fn parse_merges(merges: &[String]) -> Result<Vec<(String, String)>, TokenizerError> {
    merges
        .iter()
        .enumerate()
        .map(|(i, m)| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_owned(), b.to_owned()))
                .ok_or_else(|| invalid(format!("merge {i} ({m:?}) is not \"left right\"")))
        })
        .collect()
}

/// HF `SentencePieceExtractor`: every way to split a token into two tokens is a merge, ranked
/// by the merged token's score (higher first; ties in id order, then by the pieces' ids).
/// Only normal and user-defined tokens take part.
fn merges_from_scores(
    tokens: &[String],
    scores: &[f32],
    types: Option<&[i32]>,
    vocab: &Vocab,
) -> Vec<(String, String)> {
    let mergeable = |id: usize| {
        types.is_none_or(|t| {
            matches!(
                t.get(id),
                Some(&token_type::NORMAL) | Some(&token_type::USER_DEFINED)
            )
        })
    };
    // (score, merged id, left id, right id, split byte offset)
    let mut found: Vec<(f32, usize, u32, u32, usize)> = Vec::new();
    for (id, tok) in tokens.iter().enumerate() {
        if !mergeable(id) || vocab.get(tok).is_none_or(|&first| first as usize != id) {
            continue;
        }
        let start = found.len();
        for (split, _) in tok.char_indices().skip(1) {
            let (l, r) = tok.split_at(split);
            if let (Some(&li), Some(&ri)) = (vocab.get(l), vocab.get(r))
                && mergeable(li as usize)
                && mergeable(ri as usize)
            {
                found.push((scores[id], id, li, ri, split));
            }
        }
        found[start..].sort_by_key(|m| (m.2, m.3));
    }
    // Stable: equal scores keep vocabulary order.
    found.sort_by(|a, b| b.0.total_cmp(&a.0));
    found
        .into_iter()
        .map(|(_, id, _, _, split)| {
            let (l, r) = tokens[id].split_at(split);
            (l.to_owned(), r.to_owned())
        })
        .collect()
}

/// Builds the tokenizer described by `v` (special tokens registered, special matching on).
pub(super) fn build(v: &GgufVocab) -> Result<tokenizers::Tokenizer, TokenizerError> {
    validate(v)?;
    let vocab = vocab_map(v.tokens);
    let mut tk = match v.model {
        "gpt2" => {
            let kind = pre_kind(v.pre)?;
            let merges = v
                .merges
                .ok_or_else(|| invalid("a gpt2 vocabulary needs tokenizer.ggml.merges"))?;
            let merges = parse_merges(merges)?;
            let ignore_merges = matches!(
                kind,
                PreKind::Llama3 {
                    ignore_merges: true
                }
            );
            let bpe = BPE::builder()
                .vocab_and_merges(vocab, merges)
                .ignore_merges(ignore_merges)
                .build()
                .map_err(build_err)?;
            let mut tk = tokenizers::Tokenizer::new(bpe);
            let byte_level = ByteLevel::new(false, true, true);
            let pre: PreTokenizerWrapper = match kind {
                PreKind::Gpt2 => byte_level.into(),
                PreKind::DigitsGpt2 => {
                    PreSequence::new(vec![Digits::new(true).into(), byte_level.into()]).into()
                }
                PreKind::Llama3 { .. } => regex_then_bytes(LLAMA3_PATTERN)?,
                PreKind::Qwen2 => {
                    tk.with_normalizer(Some(NFC)).map_err(build_err)?;
                    regex_then_bytes(QWEN2_PATTERN)?
                }
            };
            tk.with_pre_tokenizer(Some(pre));
            tk.with_decoder(Some(ByteLevel::default()));
            tk
        }
        "llama" => {
            let merges = match (v.scores, v.merges) {
                (Some(scores), _) => merges_from_scores(v.tokens, scores, v.token_types, &vocab),
                (None, Some(m)) => parse_merges(m)?,
                (None, None) => {
                    return Err(invalid(
                        "a llama vocabulary needs tokenizer.ggml.scores or tokenizer.ggml.merges",
                    ));
                }
            };
            let unk = v
                .token_types
                .and_then(|t| t.iter().position(|&t| t == token_type::UNKNOWN))
                .and_then(|id| v.tokens.get(id))
                .or_else(|| v.tokens.iter().find(|t| t.as_str() == "<unk>"))
                .cloned();
            let mut builder = BPE::builder()
                .vocab_and_merges(vocab, merges)
                .byte_fallback(true)
                .fuse_unk(true);
            if let Some(unk) = unk {
                builder = builder.unk_token(unk);
            }
            let mut tk = tokenizers::Tokenizer::new(builder.build().map_err(build_err)?);
            let mut normalizers = Vec::new();
            if v.add_space_prefix {
                normalizers.push(Prepend::new(SPIECE_UNDERLINE.to_owned()).into());
            }
            normalizers.push(
                Replace::new(" ", SPIECE_UNDERLINE)
                    .map_err(build_err)?
                    .into(),
            );
            tk.with_normalizer(Some(NormalizerSequence::new(normalizers)))
                .map_err(build_err)?;
            let mut decoders: Vec<DecoderWrapper> = vec![
                Replace::new(SPIECE_UNDERLINE, " ")
                    .map_err(build_err)?
                    .into(),
                ByteFallback::new().into(),
                Fuse::new().into(),
            ];
            if v.add_space_prefix {
                decoders.push(Strip::new(' ', 1, 0).into());
            }
            let decoder: DecoderWrapper = DecoderSequence::new(decoders).into();
            tk.with_decoder(Some(decoder));
            tk
        }
        other => return Err(TokenizerError::UnsupportedModel(other.to_owned())),
    };

    let mut special: Vec<AddedToken> = Vec::new();
    let mut user: Vec<AddedToken> = Vec::new();
    let mut is_special = vec![false; v.tokens.len()];
    if let Some(types) = v.token_types {
        for (id, (&ty, tok)) in types.iter().zip(v.tokens).enumerate() {
            if tok.is_empty() {
                continue;
            }
            match ty {
                token_type::CONTROL | token_type::UNKNOWN => {
                    is_special[id] = true;
                    special.push(AddedToken::from(tok.clone(), true));
                }
                token_type::USER_DEFINED => {
                    user.push(AddedToken::from(tok.clone(), false).normalized(false));
                }
                _ => {}
            }
        }
    }
    for id in [v.bos_id, v.eos_id, v.eot_id].into_iter().flatten() {
        let id = id as usize; // checked against the vocabulary length by `validate`
        if let Some(tok) = v.tokens.get(id)
            && !tok.is_empty()
            && !is_special[id]
        {
            is_special[id] = true;
            special.push(AddedToken::from(tok.clone(), true));
        }
    }
    tk.add_special_tokens(special).map_err(build_err)?;
    tk.add_tokens(user).map_err(build_err)?;
    Ok(tk)
}

/// A regex split (isolating each match) followed by byte-level mapping without GPT-2's regex.
fn regex_then_bytes(pattern: &str) -> Result<PreTokenizerWrapper, TokenizerError> {
    let split = Split::new(
        SplitPattern::Regex(pattern.to_owned()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(build_err)?;
    Ok(PreSequence::new(vec![
        split.into(),
        ByteLevel::new(false, true, false).into(),
    ])
    .into())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::Tokenizer;
    use super::super::tests::{gpt2_fixture, gpt2_tokenizer};
    use super::*;
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

    /// How `t` splits `text` before BPE, with byte-level symbols mapped back to text.
    fn splits(t: &Tokenizer, text: &str) -> Vec<String> {
        let mut normalized = tokenizers::NormalizedString::from(text);
        if let Some(n) = t.inner().get_normalizer() {
            tokenizers::Normalizer::normalize(n, &mut normalized).expect("normalizes");
        }
        let mut pts = PreTokenizedString::from(normalized);
        t.inner()
            .get_pre_tokenizer()
            .expect("has a pre-tokenizer")
            .pre_tokenize(&mut pts)
            .expect("pre-tokenizes");
        pts.get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(s, _, _)| s.replace('Ġ', " ").replace('Ċ', "\n").replace('ĉ', "\t"))
            .collect()
    }

    #[test]
    fn pre_tokenizers_split_like_the_reference_regexes() {
        // Expected splits computed with Python's `regex` module on the same patterns.
        let cases: &[(Option<&str>, &str, &[&str])] = &[
            (
                Some("smollm"),
                "abc 123  45",
                &["abc", " ", "1", "2", "3", "  ", "4", "5"],
            ),
            (None, "abc 123  45", &["abc", " 123", " ", " 45"]),
            (
                Some("gpt2"),
                "12345 hello\tworld",
                &["12345", " hello", "\t", "world"],
            ),
            (
                Some("llama-bpe"),
                "abc 123  45",
                &["abc", " ", "123", " ", " ", "45"],
            ),
            (
                Some("llama3"),
                "I'M here!!\n\n  x",
                &["I", "'M", " here", "!!\n\n", " ", " x"],
            ),
            (
                Some("llama3"),
                "12345 hello\tworld",
                &["123", "45", " hello", "\tworld"],
            ),
            (
                Some("qwen2"),
                "abc 123  45",
                &["abc", " ", "1", "2", "3", " ", " ", "4", "5"],
            ),
            (
                Some("smollm"),
                "I'M here!!\n\n  x",
                &["I", "'", "M", " here", "!!", "\n\n ", " x"],
            ),
        ];
        for (pre, text, want) in cases {
            let t = gpt2_tokenizer(*pre);
            assert_eq!(splits(&t, text), *want, "pre {pre:?} on {text:?}");
        }
    }

    #[test]
    fn every_supported_pre_tokenizer_builds_and_round_trips() {
        for pre in SUPPORTED_PRE_TOKENIZERS {
            let t = gpt2_tokenizer(Some(pre));
            for text in ["Hello, world! 123", "ＡＢＣ é 🙂\r\n", "it's  done\t"] {
                let ids = t.encode(text, false).expect("encodes");
                // Qwen2 normalises to NFC; these strings are already NFC.
                assert_eq!(t.decode(&ids).expect("decodes"), text, "{pre}");
            }
        }
    }

    #[test]
    fn unknown_pre_tokenizer_and_model_are_refused() {
        let (tokens, types, merges) = gpt2_fixture();
        let v = GgufVocab {
            model: "gpt2",
            pre: Some("tekken"),
            tokens: &tokens,
            token_types: Some(&types),
            merges: Some(&merges),
            scores: None,
            bos_id: None,
            eos_id: None,
            eot_id: None,
            add_bos: false,
            add_eos: false,
            add_space_prefix: true,
        };
        let err = Tokenizer::from_gguf_vocab(&v).expect_err("unknown pre");
        assert!(
            matches!(err, TokenizerError::UnsupportedPreTokenizer { ref name, .. } if name == "tekken")
        );
        assert!(err.to_string().contains("smollm"), "{err}");
        let err = Tokenizer::from_gguf_vocab(&GgufVocab { model: "bert", ..v })
            .expect_err("unknown model");
        assert_eq!(err, TokenizerError::UnsupportedModel("bert".into()));
    }

    #[test]
    fn inconsistent_metadata_is_refused() {
        let (tokens, types, merges) = gpt2_fixture();
        let base = GgufVocab {
            model: "gpt2",
            pre: None,
            tokens: &tokens,
            token_types: Some(&types),
            merges: Some(&merges),
            scores: None,
            bos_id: None,
            eos_id: None,
            eot_id: None,
            add_bos: false,
            add_eos: false,
            add_space_prefix: true,
        };
        let short_types = &types[..5];
        let bad_merges = vec!["nospace".to_owned()];
        let unknown_merge = vec!["Ġ zzz".to_owned()];
        let cases = [
            GgufVocab {
                tokens: &[],
                ..base
            },
            GgufVocab {
                token_types: Some(short_types),
                ..base
            },
            GgufVocab {
                eos_id: Some(1_000_000),
                ..base
            },
            GgufVocab {
                merges: None,
                ..base
            },
            GgufVocab {
                merges: Some(&bad_merges),
                ..base
            },
            GgufVocab {
                model: "llama",
                scores: None,
                merges: None,
                ..base
            },
            GgufVocab {
                scores: Some(&[0.0; 3]),
                ..base
            },
        ];
        for (i, v) in cases.iter().enumerate() {
            let err = Tokenizer::from_gguf_vocab(v).expect_err("refused");
            assert!(
                matches!(err, TokenizerError::InvalidVocab(_)),
                "case {i}: {err:?}"
            );
        }
        let err = Tokenizer::from_gguf_vocab(&GgufVocab {
            merges: Some(&unknown_merge),
            ..base
        })
        .expect_err("merge outside the vocabulary");
        assert!(matches!(err, TokenizerError::Build(_)), "{err:?}");
    }

    /// A tiny SentencePiece-style vocabulary: `<unk> <s> </s>`, the 256 byte tokens, then
    /// pieces with scores (higher = merged earlier).
    pub(crate) fn llama_fixture() -> (Vec<String>, Vec<i32>, Vec<f32>) {
        let mut tokens = vec!["<unk>".to_owned(), "<s>".to_owned(), "</s>".to_owned()];
        let mut types = vec![
            token_type::UNKNOWN,
            token_type::CONTROL,
            token_type::CONTROL,
        ];
        let mut scores = vec![0.0, 0.0, 0.0];
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            types.push(token_type::BYTE);
            scores.push(0.0);
        }
        let pieces: &[(&str, f32)] = &[
            ("▁", -1.0),
            ("e", -2.0),
            ("h", -3.0),
            ("l", -4.0),
            ("o", -5.0),
            ("w", -6.0),
            ("r", -7.0),
            ("d", -8.0),
            ("a", -9.0),
            ("t", -10.0),
            ("!", -11.0),
            ("é", -12.0),
            ("ll", -20.0),
            ("he", -21.0),
            ("hell", -22.0),
            ("hello", -23.0),
            ("▁hello", -24.0),
            ("or", -25.0),
            ("▁w", -26.0),
            ("▁wor", -27.0),
            ("▁world", -28.0),
            ("ld", -29.0),
            ("▁t", -30.0),
            ("▁a", -31.0),
        ];
        for (p, s) in pieces {
            tokens.push((*p).to_owned());
            types.push(token_type::NORMAL);
            scores.push(*s);
        }
        tokens.push("<0x0A>".to_owned()); // a duplicate string: first id wins
        types.push(token_type::UNUSED);
        scores.push(0.0);
        (tokens, types, scores)
    }

    pub(crate) fn llama_tokenizer() -> Tokenizer {
        let (tokens, types, scores) = llama_fixture();
        Tokenizer::from_gguf_vocab(&GgufVocab {
            model: "llama",
            pre: Some("default"),
            tokens: &tokens,
            token_types: Some(&types),
            merges: None,
            scores: Some(&scores),
            bos_id: Some(1),
            eos_id: Some(2),
            eot_id: None,
            add_bos: true,
            add_eos: false,
            add_space_prefix: true,
        })
        .expect("llama fixture builds")
    }

    #[test]
    fn merges_from_scores_follow_the_scores() {
        let (tokens, types, scores) = llama_fixture();
        let vocab = vocab_map(&tokens);
        let merges = merges_from_scores(&tokens, &scores, Some(&types), &vocab);
        // Ranked by the merged token's score: "ll" (-20), "he" (-21), "hell" = "he"+"ll" (-22).
        let pos = |a: &str, b: &str| {
            merges
                .iter()
                .position(|(l, r)| l == a && r == b)
                .unwrap_or(usize::MAX)
        };
        assert!(pos("l", "l") < pos("h", "e"));
        assert!(pos("h", "e") < pos("he", "ll"));
        assert!(pos("hell", "o") < pos("▁", "hello"));
        assert_eq!(pos("<", "0x0A>"), usize::MAX, "byte tokens never merge");
        // "▁wor" splits into two tokens only as "▁w"+"or" ("wor" is not a token).
        assert_eq!(
            merges
                .iter()
                .filter(|(l, r)| format!("{l}{r}") == "▁wor")
                .count(),
            1
        );
    }

    #[test]
    fn sentencepiece_encoding() {
        let t = llama_tokenizer();
        let id = |s: &str| t.token_to_id(s).expect("in vocab");
        assert!(t.add_bos());
        // BOS, then "▁hello" "▁world" (prefix added, spaces as ▁).
        assert_eq!(
            t.encode("hello world", false).expect("encodes"),
            vec![1, id("▁hello"), id("▁world")]
        );
        // Characters outside the vocabulary fall back to bytes: "\n" is <0x0A> (id 3 + 10).
        assert_eq!(
            t.encode("hello\n", false).expect("encodes"),
            vec![1, id("▁hello"), 13]
        );
        // 🙂 = F0 9F 99 82.
        let emoji = t.encode("🙂", false).expect("encodes");
        assert_eq!(
            emoji,
            vec![1, id("▁"), 3 + 0xF0, 3 + 0x9F, 3 + 0x99, 3 + 0x82]
        );
        // Special tokens are recognised on request (no second BOS), and the prefix follows each
        // of them, like llama.cpp and HF's Llama-2 tokenizer.
        assert_eq!(
            t.encode("<s>hello</s>hello", true).expect("encodes"),
            vec![1, id("▁hello"), 2, id("▁hello")]
        );
        let raw = t.encode("<s>", false).expect("encodes");
        assert!(
            raw.len() > 2 && raw.iter().skip(1).all(|&i| i != 1),
            "{raw:?}"
        );
    }

    #[test]
    fn sentencepiece_decoding() {
        let t = llama_tokenizer();
        for text in [
            "hello world",
            "hello\n",
            "🙂 é! a",
            "  two leading spaces",
            "t\tab",
            "",
        ] {
            let ids = t.encode(text, false).expect("encodes");
            assert_eq!(t.decode(&ids).expect("decodes"), text, "{text:?}");
        }
        // The unknown token: no byte token and no piece for it can't happen with byte
        // fallback, so <unk> only appears by id; it is special and decodes to nothing.
        assert_eq!(t.decode(&[0, 1, 2]).expect("decodes"), "");
        assert_eq!(t.stop_token_ids(), &[2]);
    }
}
