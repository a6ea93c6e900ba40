//! The bytes of every token: what a token adds to the output when it is generated.
//!
//! Structured outputs need it (the token trie that masks are computed over is built from every
//! token's bytes), and so do `logprobs` (`bytes` of each token) and `/tokenize` (`with_pieces`).
//! A token's vocabulary entry is not its bytes:
//! - **byte-level BPE** (GPT-2, SmolLM2, Llama 3, Qwen2) stores each byte as a printable
//!   character of the GPT-2 alphabet (`Ġ` is a space, `Ċ` a newline); mapping the alphabet back
//!   gives the bytes, which may be part of a UTF-8 character;
//! - **SentencePiece** vocabularies (Llama 2, Mistral) store a space as `▁` and bytes as
//!   `<0xNN>` pieces (byte fallback);
//! - **added tokens** hold raw text; special (control) ones are marked as special: they never
//!   come out of ordinary text, only by id.

use std::collections::HashMap;

use tokenizers::DecoderWrapper;

use super::Tokenizer;

/// Every token's bytes, by id, and which tokens are special.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBytes {
    bytes: Vec<Vec<u8>>,
    special: Vec<bool>,
}

/// How the model's own vocabulary entries encode bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scheme {
    ByteLevel,
    SentencePiece,
}

fn scheme_of(decoder: Option<&DecoderWrapper>) -> Scheme {
    fn has_byte_level(d: &DecoderWrapper) -> bool {
        match d {
            DecoderWrapper::ByteLevel(_) => true,
            DecoderWrapper::Sequence(s) => s.get_decoders().iter().any(has_byte_level),
            _ => false,
        }
    }
    match decoder {
        Some(d) if has_byte_level(d) => Scheme::ByteLevel,
        _ => Scheme::SentencePiece,
    }
}

/// `<0xNN>` → the byte `NN`.
fn byte_piece(s: &str) -> Option<u8> {
    let hex = s.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2)
        .then(|| u8::from_str_radix(hex, 16).ok())
        .flatten()
}

impl TokenBytes {
    /// Builds the table for `tok`, padded with empty special entries up to `vocab` ids (a
    /// model's output layer may be wider than its tokenizer).
    pub fn new(tok: &Tokenizer, vocab: usize) -> Self {
        let inner = tok.inner();
        let scheme = scheme_of(inner.get_decoder());
        let alphabet: HashMap<char, u8> =
            tokenizers::pre_tokenizers::byte_level::ByteLevel::alphabet()
                .into_iter()
                .map(|c| (c, gpt2_byte(c)))
                .collect();
        let added = inner.get_added_tokens_decoder();
        let n = vocab.max(tok.vocab_size());
        let mut bytes = Vec::with_capacity(n);
        let mut special = Vec::with_capacity(n);
        for id in 0..n {
            let idu = u32::try_from(id).unwrap_or(u32::MAX);
            if let Some(a) = added.get(&idu) {
                bytes.push(a.content.as_bytes().to_vec());
                special.push(a.special);
                continue;
            }
            let Some(piece) = inner.id_to_token(idu) else {
                bytes.push(Vec::new());
                special.push(true);
                continue;
            };
            let b = match scheme {
                Scheme::ByteLevel => {
                    let mapped: Option<Vec<u8>> =
                        piece.chars().map(|c| alphabet.get(&c).copied()).collect();
                    mapped.unwrap_or_else(|| piece.as_bytes().to_vec())
                }
                Scheme::SentencePiece => match byte_piece(&piece) {
                    Some(b) => vec![b],
                    None => piece.replace('\u{2581}', " ").into_bytes(),
                },
            };
            bytes.push(b);
            special.push(false);
        }
        Self { bytes, special }
    }

    /// How many token ids have bytes here.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The bytes `id` adds to the output (for a special token, its text); empty for an id
    /// outside the vocabulary.
    pub fn bytes(&self, id: u32) -> &[u8] {
        self.bytes.get(id as usize).map_or(&[], Vec::as_slice)
    }

    /// Whether `id` is a special (control) token, or padding outside the tokenizer.
    pub fn is_special(&self, id: u32) -> bool {
        self.special.get(id as usize).copied().unwrap_or(true)
    }

    /// The token as text: its bytes read as UTF-8, with U+FFFD for a partial character (the
    /// exact bytes come with [`TokenBytes::bytes`]).
    pub fn text(&self, id: u32) -> String {
        String::from_utf8_lossy(self.bytes(id)).into_owned()
    }

    /// The words of a token trie: bytes for ordinary tokens; special tokens (and ids with no
    /// bytes) behind the trie's special marker `0xFF`, so that no ordinary text produces them.
    pub fn trie_words(&self) -> Vec<Vec<u8>> {
        self.bytes
            .iter()
            .zip(&self.special)
            .enumerate()
            .map(|(id, (b, &special))| {
                if special || b.is_empty() {
                    let mut w = vec![0xFF];
                    if b.is_empty() {
                        w.extend_from_slice(format!("<[{id}]>").as_bytes());
                    } else {
                        w.extend_from_slice(b);
                    }
                    w
                } else {
                    b.clone()
                }
            })
            .collect()
    }
}

/// The byte a character of the GPT-2 byte-level alphabet stands for: printable Latin-1
/// characters stand for themselves, the others were shifted up past U+0100 in byte order.
fn gpt2_byte(c: char) -> u8 {
    let self_mapped = |b: u32| matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
    let cp = c as u32;
    if cp < 0x100 && self_mapped(cp) {
        return u8::try_from(cp).unwrap_or(0);
    }
    // The n-th byte that is not self-mapped is U+0100 + n.
    let n = cp.saturating_sub(0x100);
    let mut k = 0;
    for b in 0u32..256 {
        if !self_mapped(b) {
            if k == n {
                return u8::try_from(b).unwrap_or(0);
            }
            k += 1;
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::super::gguf::tests::llama_tokenizer;
    use super::super::tests::gpt2_tokenizer;
    use super::*;

    #[test]
    fn the_gpt2_alphabet_maps_back_to_every_byte() {
        let alphabet = tokenizers::pre_tokenizers::byte_level::ByteLevel::alphabet();
        let mut seen: Vec<u8> = alphabet.into_iter().map(gpt2_byte).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 256);
        assert_eq!(gpt2_byte('Ġ'), b' ');
        assert_eq!(gpt2_byte('Ċ'), b'\n');
        assert_eq!(gpt2_byte('a'), b'a');
    }

    #[test]
    fn byte_level_tokens_decode_to_their_bytes() {
        let t = gpt2_tokenizer(Some("smollm"));
        let tb = TokenBytes::new(&t, t.vocab_size() + 2);
        assert_eq!(tb.len(), t.vocab_size() + 2);
        let id = |s: &str| t.token_to_id(s).expect("token");
        assert_eq!(tb.bytes(id("Ġworld")), b" world");
        assert_eq!(tb.bytes(id("hello")), b"hello");
        // Control tokens are special, user-defined ones are plain text.
        assert!(tb.is_special(2) && tb.bytes(2) == b"<|im_end|>");
        assert!(!tb.is_special(id("<my_tool>")));
        assert_eq!(tb.bytes(id("<my_tool>")), b"<my_tool>");
        // Padding past the tokenizer is special and has no bytes.
        let pad = u32::try_from(t.vocab_size()).expect("fits");
        assert!(tb.is_special(pad) && tb.bytes(pad).is_empty());
        // Every encoded text is the concatenation of its tokens' bytes.
        for text in ["hello world", "émoji 🙂 中文", "  two  spaces\n"] {
            let ids = t.encode(text, false).expect("encodes");
            let joined: Vec<u8> = ids.iter().flat_map(|&i| tb.bytes(i).to_vec()).collect();
            assert_eq!(joined, text.as_bytes(), "{text:?}");
        }
        let words = tb.trie_words();
        assert_eq!(words[2][0], 0xFF);
        assert_eq!(&words[2][1..], b"<|im_end|>");
        assert_eq!(words[usize::try_from(pad).expect("fits")][0], 0xFF);
    }

    #[test]
    fn sentencepiece_tokens_decode_to_their_bytes() {
        let t = llama_tokenizer();
        let tb = TokenBytes::new(&t, t.vocab_size());
        for text in ["Hello world", "a 🙂 b"] {
            let ids = t.encode(text, false).expect("encodes");
            let joined: Vec<u8> = ids
                .iter()
                .filter(|&&i| !tb.is_special(i))
                .flat_map(|&i| tb.bytes(i).to_vec())
                .collect();
            let s = String::from_utf8(joined).expect("utf-8");
            assert_eq!(s.trim_start(), text, "{text:?}");
        }
    }
}
