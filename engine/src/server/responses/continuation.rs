//! A request continuing a stored response (`previous_response_id`) continues from that
//! response's exact tokens: its prompt's token ids, then its reply's as they were generated
//! (so the KV cache holds them), then only the template's text from the end of the reply
//! through the new turn's generation prompt. Nothing of the earlier turns is rendered again,
//! so a template whose rendering of a reply differs from the tokens generated (reasoning left
//! out, whitespace trimmed, tool calls rewritten) cannot cost the turn its cache.
//!
//! The text after the reply is found by rendering the conversation with a sentinel in place of
//! the reply: whatever the template writes after the sentinel is what follows a reply.

use serde_json::{Value, json};

use super::types::ResponsesRequest;
use crate::server::error::ApiError;
use crate::server::request::validate::chat_prompt;
use crate::server::responses::store::StoredResponse;
use crate::server::state::AppState;

/// Stands in for the earlier reply in the sentinel rendering: private-use characters no
/// template writes, trims or escapes.
const SENTINEL: &str = "\u{E000}slotlight-reply\u{E001}";

/// Whether `req` renders its earlier turns as `prev` did: the same instructions, tools and
/// format. Otherwise the prompt is rendered anew (and departs from the cache where it
/// changed).
pub fn same_setup(prev: &StoredResponse, req: &ResponsesRequest, format: &Value) -> bool {
    prev.instructions == req.instructions
        && prev.tools == Value::Array(req.tools_wire.clone())
        && &prev.format == format
}

/// The exact prompt of `req` continuing `prev`, or `None` when the template does not write the
/// reply where the sentinel shows it (then the prompt is rendered anew).
pub fn exact_prompt(
    st: &AppState,
    prev: &StoredResponse,
    req: &ResponsesRequest,
    enable_thinking: Option<bool>,
) -> Result<Option<Vec<u32>>, ApiError> {
    let mut history = prev.history.clone();
    history.extend(prev.input.iter().cloned());
    history.push(json!({"type": "message", "role": "assistant", "content": SENTINEL}));
    let chat = req.chat(&history, enable_thinking)?;
    let (text, _, _) = chat_prompt(st, &chat, true)?;
    let Some(at) = text.find(SENTINEL) else {
        return Ok(None);
    };
    let mut after = &text[at + SENTINEL.len()..];
    let tok = st.prompts.tokenizer();
    // A reply that ended with its end-of-turn token holds it already: the template's text
    // after the reply then starts with that token's text, which is not written twice.
    if let Some(&last) = prev.reply_tokens.last()
        && tok.is_stop_token(last)
        && let Ok(end) = tok.decode_with(&[last], false)
        && !end.is_empty()
    {
        after = after.strip_prefix(end.as_str()).unwrap_or(after);
    }
    let suffix = tok
        .encode_with(after, true, false)
        .map_err(|e| ApiError::invalid_param("input", e.to_string()))?;
    let mut ids =
        Vec::with_capacity(prev.prompt_tokens.len() + prev.reply_tokens.len() + suffix.len());
    ids.extend_from_slice(&prev.prompt_tokens);
    ids.extend_from_slice(&prev.reply_tokens);
    ids.extend(suffix);
    Ok(Some(ids))
}
