//! Streaming detokenization: ids in, text deltas out.
//!
//! Decoding one token at a time is wrong in two ways: a character can be split across several
//! byte tokens (an emoji is four byte-fallback tokens), and decoders look at neighbours
//! (SentencePiece drops the leading space of the *first* token only). So, like TGI, we decode a
//! small sliding window twice — the text already emitted and the same text plus the new ids —
//! and emit the difference, holding back while the window ends in an incomplete character
//! (U+FFFD). Concatenated deltas equal `decode` of the whole sequence for any valid text.

use super::{Tokenizer, TokenizerError};

/// Ids kept before the first generated one by [`Tokenizer::decoder_after`].
const CONTEXT_TOKENS: usize = 6;

/// A UTF-8 character spans at most 4 tokens (each carries at least one byte): a window still
/// incomplete after more pending tokens than that holds invalid bytes, not a partial character.
const MAX_PENDING: usize = 4;

const REPLACEMENT: char = '\u{FFFD}';

/// Incremental decoder returned by [`Tokenizer::decoder`] / [`Tokenizer::decoder_after`].
#[derive(Debug, Clone)]
pub struct StreamDecoder<'a> {
    tok: &'a Tokenizer,
    /// Window of ids: `[..read_offset]` decodes to text already emitted (kept as context for
    /// the decoder), `[read_offset..]` is pending. Older ids are dropped.
    ids: Vec<u32>,
    read_offset: usize,
}

impl<'a> StreamDecoder<'a> {
    pub(super) fn new(tok: &'a Tokenizer, context: &[u32]) -> Self {
        // Start the context on a character boundary: step back while the window would begin
        // in the middle of a character (a continuation byte, or part of a byte-fallback run).
        let mut start = context.len().saturating_sub(CONTEXT_TOKENS);
        let floor = context.len().saturating_sub(CONTEXT_TOKENS * 3);
        while start > floor
            && tok
                .decode(&context[start..])
                .is_ok_and(|s| s.starts_with(REPLACEMENT))
        {
            start -= 1;
        }
        let ids = context[start..].to_vec();
        let read_offset = ids.len();
        Self {
            tok,
            ids,
            read_offset,
        }
    }

    /// Feeds one generated id; returns the text it completes (possibly empty, never part of a
    /// character).
    pub fn push(&mut self, id: u32) -> Result<String, TokenizerError> {
        self.ids.push(id);
        let prefix = self.tok.decode(&self.ids[..self.read_offset])?;
        let full = self.tok.decode(&self.ids)?;
        if !full.ends_with(REPLACEMENT) {
            // Complete (possibly empty: a skipped special token, a stripped leading space).
            let delta = diff(&prefix, &full);
            self.advance(self.ids.len());
            return Ok(delta);
        }
        if self.ids.len() - self.read_offset > MAX_PENDING {
            // Invalid bytes, not a partial character: emit all but the newest id, which may
            // begin a real character.
            let upto = self.ids.len() - 1;
            let text = self.tok.decode(&self.ids[..upto])?;
            let delta = diff(&prefix, &text);
            self.advance(upto);
            return Ok(delta);
        }
        Ok(String::new())
    }

    /// Ends the stream: returns whatever text is still held back (an incomplete character at
    /// the very end comes out as U+FFFD, as `decode` renders it).
    pub fn flush(&mut self) -> String {
        if self.read_offset >= self.ids.len() {
            return String::new();
        }
        let (Ok(prefix), Ok(full)) = (
            self.tok.decode(&self.ids[..self.read_offset]),
            self.tok.decode(&self.ids),
        ) else {
            return String::new();
        };
        let delta = diff(&prefix, &full);
        self.advance(self.ids.len());
        delta
    }

    /// Marks `ids[..upto]` as emitted and slides the window: what was emitted before this
    /// step is dropped, what this step emitted becomes the decoder's context.
    fn advance(&mut self, upto: usize) {
        let drop = self.read_offset;
        self.ids.drain(..drop);
        self.read_offset = upto - drop;
    }
}

/// The part of `full` after `prefix`. When a decoder rewrote the prefix (only possible with
/// invalid byte sequences), the part after their longest common prefix.
fn diff(prefix: &str, full: &str) -> String {
    if let Some(rest) = full.strip_prefix(prefix) {
        return rest.to_owned();
    }
    let common = prefix
        .char_indices()
        .zip(full.chars())
        .find(|((_, a), b)| a != b)
        .map_or(prefix.len().min(full.len()), |((i, _), _)| i);
    full.get(common..).unwrap_or_default().to_owned()
}

#[cfg(test)]
// Test data: small counts and indices, exact in every cast.
#[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
mod tests {
    use super::super::gguf::tests::llama_tokenizer;
    use super::super::tests::gpt2_tokenizer;
    use super::*;

    const TEXTS: &[&str] = &[
        "hello world",
        " leading space",
        "  two leading spaces and trailing  ",
        "🙂",
        "emoji 🙂🙂 in the middle 👩‍👩‍👧 family",
        "中文字符和日本語のテキスト",
        "e\u{301}combining, ﬁ ligature, ℌ",
        "line\nbreaks\r\n\ttabs",
        "digits 0123456789 and 3.14159",
        "ÅÄÖ åäö ÆØ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𐍈",
        "",
        "<|im_end|> typed by a user",
    ];

    /// Feeds ids one by one; returns the deltas (flush included as the last one).
    fn stream(t: &Tokenizer, context: &[u32], ids: &[u32]) -> Vec<String> {
        let mut d = if context.is_empty() {
            t.decoder()
        } else {
            t.decoder_after(context)
        };
        let mut out: Vec<String> = ids.iter().map(|&id| d.push(id).expect("decodes")).collect();
        out.push(d.flush());
        out
    }

    fn check_concatenation(t: &Tokenizer, name: &str) {
        for text in TEXTS {
            let ids = t.encode(text, false).expect("encodes");
            let deltas = stream(t, &[], &ids);
            let whole = t.decode(&ids).expect("decodes");
            assert_eq!(deltas.concat(), whole, "{name}: {text:?}");
            for d in &deltas {
                assert!(
                    !d.contains(REPLACEMENT),
                    "{name}: broken char in {d:?} of {text:?}"
                );
            }
        }
    }

    #[test]
    fn byte_level_deltas_concatenate_to_decode() {
        check_concatenation(&gpt2_tokenizer(Some("smollm")), "gpt2");
    }

    #[test]
    fn sentencepiece_deltas_concatenate_to_decode() {
        check_concatenation(&llama_tokenizer(), "llama");
    }

    #[test]
    fn an_emoji_split_into_byte_tokens_comes_out_whole() {
        for t in [gpt2_tokenizer(None), llama_tokenizer()] {
            let ids = t.encode("a🙂", false).expect("encodes");
            let deltas = stream(&t, &[], &ids);
            let non_empty: Vec<&String> = deltas.iter().filter(|d| !d.is_empty()).collect();
            assert_eq!(
                non_empty.last().map(|s| s.as_str()),
                Some("🙂"),
                "{deltas:?}"
            );
            assert!(
                deltas.iter().filter(|d| d.is_empty()).count() >= 3,
                "{deltas:?}"
            );
        }
    }

    #[test]
    fn leading_space_survives_after_a_context() {
        let t = llama_tokenizer();
        let prompt = t.encode("hello", false).expect("encodes");
        let generated = t.encode("world hello", false).expect("encodes");
        let generated = &generated[1..]; // drop BOS: "▁world", "▁hello"
        // Without context the first token's space is stripped, as `decode` does.
        assert_eq!(stream(&t, &[], generated).concat(), "world hello");
        // After the prompt it is kept: the text the new ids add to the prompt's text.
        assert_eq!(stream(&t, &prompt, generated).concat(), " world hello");
        // Byte-level vocabularies carry spaces as bytes: the same either way.
        let g = gpt2_tokenizer(Some("smollm"));
        let ids = g.encode(" world", false).expect("encodes");
        assert_eq!(stream(&g, &[], &ids).concat(), " world");
        let prompt = g.encode("hello", false).expect("encodes");
        assert_eq!(stream(&g, &prompt, &ids).concat(), " world");
    }

    #[test]
    fn context_that_ends_inside_a_character_is_harmless() {
        let t = gpt2_tokenizer(None);
        let all = t.encode("x🙂🙂y", false).expect("encodes");
        // Split inside the second emoji's bytes: the context holds its first half.
        let cut = all.len() - 3;
        let deltas = stream(&t, &all[..cut], &all[cut..]);
        let whole = t.decode(&all).expect("decodes");
        let before = t.decode(&all[..cut]).expect("decodes");
        assert_eq!(before.chars().last(), Some(REPLACEMENT));
        // The pending half plus the rest: "🙂y" minus nothing (the half was never emitted).
        assert_eq!(deltas.concat(), "🙂y");
        assert!(whole.ends_with("🙂y"));
    }

    #[test]
    fn special_tokens_are_skipped_in_the_stream() {
        let t = gpt2_tokenizer(Some("smollm"));
        let ids = t.encode("<|im_start|>hi<|im_end|>", true).expect("encodes");
        assert_eq!(stream(&t, &[], &ids).concat(), "hi");
    }

    #[test]
    fn invalid_bytes_do_not_stall_the_stream() {
        let t = gpt2_tokenizer(None);
        // The byte-level symbol for 0xFF is 'ÿ'; a run of lone 0xFF bytes never becomes valid.
        let ff = t.token_to_id("ÿ").expect("byte symbol");
        let a = t.token_to_id("a").expect("byte symbol");
        let mut d = t.decoder();
        let mut out = String::new();
        for _ in 0..10 {
            out.push_str(&d.push(ff).expect("decodes"));
        }
        assert!(out.chars().count() >= 5, "emitted while going: {out:?}");
        out.push_str(&d.push(a).expect("decodes"));
        out.push_str(&d.flush());
        assert_eq!(
            out,
            t.decode(&[ff; 10].iter().copied().chain([a]).collect::<Vec<_>>())
                .expect("decodes")
        );
        // A dangling incomplete character comes out at flush.
        let mut d = t.decoder();
        let start = t.encode("🙂", false).expect("encodes");
        assert_eq!(d.push(start[0]).expect("decodes"), "");
        assert_eq!(d.flush(), REPLACEMENT.to_string());
        assert_eq!(d.flush(), "");
    }

    #[test]
    fn diff_handles_rewritten_prefixes() {
        assert_eq!(diff("abc", "abcdef"), "def");
        assert_eq!(diff("ab\u{FFFD}", "ab🙂x"), "🙂x");
        assert_eq!(diff("abc", "ab"), "");
        assert_eq!(diff("", "x"), "x");
    }

    #[test]
    fn many_random_valid_strings() {
        // Deterministic pseudo-random strings over a mixed alphabet.
        let alphabet: Vec<char> = "ab lo\n\t0123é中🙂👍ü ".chars().collect();
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let tokenizers = [
            gpt2_tokenizer(Some("smollm")),
            gpt2_tokenizer(Some("llama3")),
            llama_tokenizer(),
        ];
        for _ in 0..200 {
            let len = (next() % 24) as usize;
            let s: String = (0..len)
                .map(|_| alphabet[(next() % alphabet.len() as u64) as usize])
                .collect();
            for t in &tokenizers {
                let ids = t.encode(&s, false).expect("encodes");
                let deltas = stream(t, &[], &ids);
                assert_eq!(deltas.concat(), t.decode(&ids).expect("decodes"), "{s:?}");
                assert!(deltas.iter().all(|d| !d.contains(REPLACEMENT)), "{s:?}");
                // And after a context.
                let ctx = t.encode("ctx 🙂", false).expect("encodes");
                let body: Vec<u32> = ids
                    .iter()
                    .copied()
                    .filter(|&i| Some(i) != t.bos_id())
                    .collect();
                let mut all = ctx.clone();
                all.extend(&body);
                let want = t.decode(&all).expect("decodes");
                let prefix = t.decode(&ctx).expect("decodes");
                assert_eq!(
                    stream(t, &ctx, &body).concat(),
                    want.strip_prefix(&prefix).unwrap_or_default(),
                    "{s:?} after context"
                );
            }
        }
    }
}
