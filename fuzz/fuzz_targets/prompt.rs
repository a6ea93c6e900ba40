//! Hostile message content through the chat template and the tokenizer, as the handlers use
//! them (`PromptBuilder::chat` for chat requests, `PromptBuilder::raw` for completions), and
//! arbitrary generated ids through the streaming decoder.
//!
//! The model is `$SLOTLIGHT_MODEL` when set (the default SmolLM2 GGUF: its real template and
//! 49k-token byte-level BPE), else the tiny synthetic model of the engine's tests.
//!
//! Checked: nothing panics; streamed deltas concatenate to `decode` of the same ids (the
//! decoder's documented contract) for every encoded prompt; and with the real byte-level
//! vocabulary, `decode(encode(text))` is idempotent and printable ASCII survives it unchanged.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use slotlight_engine::chat_template::{ChatMessage, Role};

#[derive(Arbitrary, Debug)]
struct Input {
    messages: Vec<(u8, String)>,
    raw: String,
    generated: Vec<u32>,
}

const ROLES: [Role; 4] = [Role::System, Role::User, Role::Assistant, Role::Tool];

fuzz_target!(|input: Input| {
    let (model, prompts) = slotlight_fuzz::prompt_model();
    let tok = &model.tokenizer;
    let messages: Vec<ChatMessage> = input
        .messages
        .iter()
        .take(64)
        .map(|(r, c)| ChatMessage::new(ROLES[usize::from(*r) % ROLES.len()], c.as_str()))
        .collect();
    if let Ok((_text, ids)) = prompts.chat(&messages) {
        check_stream(tok, &ids);
    }
    if let Ok(ids) = prompts.raw(&input.raw) {
        check_stream(tok, &ids);
    }
    if let Ok(ids) = tok.encode(&input.raw, false) {
        check_stream(tok, &ids);
        if tok.vocab_size() > 1000 {
            // A byte-level vocabulary need not hold all 256 bytes (SmolLM2 has no token for
            // U+0004, and Hugging Face's tokenizer drops it too), so in general only
            // idempotence holds; text of printable ASCII, spaces and newlines must round-trip.
            let back = tok.decode(&ids).expect("decode of encoded ids");
            let again = tok.encode(&back, false).expect("encode of decoded text");
            assert_eq!(
                tok.decode(&again).expect("decode"),
                back,
                "decode(encode(..)) is not idempotent"
            );
            let plain = |c: char| c.is_ascii_graphic() || c == ' ' || c == '\n';
            if input.raw.chars().all(plain) {
                assert_eq!(back, input.raw, "plain text does not round-trip");
            }
        }
    }
    // Generated ids are whatever the model samples: any id, including ones past the vocabulary.
    let context = tok.encode("Hello", false).unwrap_or_default();
    let mut d = tok.decoder_after(&context);
    let limit = u32::try_from(tok.vocab_size())
        .unwrap_or(u32::MAX)
        .saturating_add(8);
    for &id in input.generated.iter().take(256) {
        let _ = d.push(id % limit);
    }
    let _ = d.flush();
});

fn check_stream(tok: &slotlight_engine::tokenizer::Tokenizer, ids: &[u32]) {
    let Ok(whole) = tok.decode(ids) else { return };
    let mut d = tok.decoder();
    let mut streamed = String::new();
    for &id in ids {
        streamed.push_str(&d.push(id).expect("stream decode"));
    }
    streamed.push_str(&d.flush());
    assert_eq!(streamed, whole, "streamed deltas differ from decode");
}
