//! The endpoints' bodies into token ids, through the shared request: a chat is read as a chat
//! completions body and rendered by the same checks and template ([`validate::chat_prompt`]),
//! a completion's prompt encoded as a completion's is, a text encoded with the switches its
//! caller chose.

use serde_json::Value;

use super::types::{TokenizeInput, TokenizeRequest};
use crate::server::error::ApiError;
use crate::server::request::input::{ChatRequest, CompletionRequest};
use crate::server::request::validate;
use crate::server::state::AppState;

/// The token ids `/tokenize` answers for `req`.
pub fn tokenize(st: &AppState, req: TokenizeRequest) -> Result<Vec<u32>, ApiError> {
    let tok = st.prompts.tokenizer();
    match req.input {
        TokenizeInput::Chat {
            body,
            add_generation_prompt,
            add_special_tokens,
        } => {
            let chat = ChatRequest::from_json(Value::Object(body))?;
            let (text, ids, _) = validate::chat_prompt(st, &chat, add_generation_prompt)?;
            if add_special_tokens == Some(false) {
                tok.encode_with(&text, true, false)
                    .map_err(|e| ApiError::invalid_param("messages", e.to_string()))
            } else {
                Ok(ids)
            }
        }
        TokenizeInput::Text {
            text,
            param,
            add_special,
            parse_special,
        } => tok
            .encode_with(&text, parse_special, add_special)
            .map_err(|e| ApiError::invalid_param(param, e.to_string())),
    }
}

/// A chat generation body's prompt ids, as the chat endpoint computes them, and the model it
/// would be served under.
pub fn render_chat(
    st: &AppState,
    body: Value,
    add_generation_prompt: bool,
) -> Result<(String, Vec<u32>), ApiError> {
    let req = ChatRequest::from_json(body)?;
    req.common.validate(&st.cfg.limits, st.vocab)?;
    let model = st.check_model(req.common.model.as_deref())?;
    let (_, ids, _) = validate::chat_prompt(st, &req, add_generation_prompt)?;
    Ok((model, ids))
}

/// A completion generation body's prompt ids, as the completions endpoint computes them, and
/// the model it would be served under.
pub fn render_completion(st: &AppState, body: Value) -> Result<(String, Vec<u32>), ApiError> {
    let req = CompletionRequest::from_json(body)?;
    req.common.validate(&st.cfg.limits, st.vocab)?;
    let model = st.check_model(req.common.model.as_deref())?;
    let (_, ids) = validate::completion_prompt(st, &req)?;
    Ok((model, ids))
}

/// `tokens` checked against the vocabulary and decoded, special tokens written out.
pub fn detokenize(st: &AppState, tokens: &[u32]) -> Result<String, ApiError> {
    if let Some(bad) = tokens.iter().find(|&&t| t as usize >= st.vocab) {
        return Err(ApiError::invalid_param(
            "tokens",
            format!("token id {bad} is outside the vocabulary of {}", st.vocab),
        ));
    }
    st.prompts
        .tokenizer()
        .decode_with(tokens, false)
        .map_err(|e| ApiError::invalid_param("tokens", e.to_string()))
}
