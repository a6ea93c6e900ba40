//! `POST /tokenize` and `POST /detokenize`, in vLLM's and llama.cpp's request shapes.
//!
//! `/tokenize` takes vLLM's `prompt` (with `add_special_tokens`, default true) or `messages`
//! (rendered exactly as a chat completion renders them, `tools` included, so `count` equals
//! that request's `prompt_tokens`), or llama.cpp's `content` (with `add_special`, default
//! false, and `parse_special`, default true). It answers `tokens`, `count` and
//! `max_model_len`; llama.cpp's `with_pieces` turns each token into `{"id", "piece"}` (the
//! piece a string, or its bytes when they are not valid UTF-8), vLLM's `return_token_strs`
//! adds `token_strs`. `/detokenize` takes `tokens` and answers the text as `prompt` (vLLM) and
//! `content` (llama.cpp), special tokens written out.

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::server::body::Fields;
use crate::server::body::read_json;
use crate::server::error::ApiError;
use crate::server::request::input::ChatRequest;
use crate::server::request::parse::REFUSED;
use crate::server::request::validate::chat_prompt;
use crate::server::state::SharedState;

/// Answers `POST /tokenize`: the token ids (and, when asked, pieces) of a text or a chat.
pub async fn tokenize(State(st): State<SharedState>, body: Body) -> Result<Response, ApiError> {
    let v: Value = read_json(body, st.cfg.max_body_bytes, st.cfg.read_timeout).await?;
    let Value::Object(mut map) = v else {
        return Err(ApiError::invalid("the request body must be a JSON object"));
    };
    let tok = st.prompts.tokenizer();
    let take_bool = |map: &mut serde_json::Map<String, Value>, key: &str| match map.remove(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(b)),
        Some(_) => Err(ApiError::invalid_param(
            key,
            format!("`{key}` must be a boolean"),
        )),
    };
    let with_pieces = take_bool(&mut map, "with_pieces")?.unwrap_or(false);
    let token_strs = take_bool(&mut map, "return_token_strs")?.unwrap_or(false);
    let add_special_tokens = take_bool(&mut map, "add_special_tokens")?;
    let add_special = take_bool(&mut map, "add_special")?;
    let parse_special = take_bool(&mut map, "parse_special")?;
    let model = match map.remove("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(m)) => Some(m),
        Some(_) => return Err(ApiError::invalid_param("model", "`model` must be a string")),
    };
    st.check_model(model.as_deref())?;
    let text_of = |map: &mut serde_json::Map<String, Value>, key: &str| match map.remove(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(ApiError::invalid_param(
            key,
            format!("`{key}` must be a string"),
        )),
    };
    let ids = if map.contains_key("messages") {
        let add_generation_prompt = take_bool(&mut map, "add_generation_prompt")?.unwrap_or(true);
        // The rest must be what a chat request would accept about its prompt.
        let mut chat = serde_json::Map::new();
        for key in [
            "messages",
            "tools",
            "tool_choice",
            "parallel_tool_calls",
            "chat_template_kwargs",
        ] {
            if let Some(v) = map.remove(key) {
                chat.insert(key.into(), v);
            }
        }
        Fields::new(Value::Object(map), "")?.finish_with(REFUSED)?;
        let req = ChatRequest::from_json(Value::Object(chat))?;
        let (text, ids, _) = chat_prompt(&st, &req, add_generation_prompt)?;
        if add_special_tokens == Some(false) {
            tok.encode_with(&text, true, false)
                .map_err(|e| ApiError::invalid_param("messages", e.to_string()))?
        } else {
            ids
        }
    } else {
        let (text, param, add, parse) =
            match (text_of(&mut map, "prompt")?, text_of(&mut map, "content")?) {
                (Some(p), None) => (p, "prompt", add_special_tokens.unwrap_or(true), true),
                (None, Some(c)) => (
                    c,
                    "content",
                    add_special.or(add_special_tokens).unwrap_or(false),
                    parse_special.unwrap_or(true),
                ),
                (Some(_), Some(_)) => {
                    return Err(ApiError::invalid_param(
                        "content",
                        "send `prompt` (vLLM) or `content` (llama.cpp), not both",
                    ));
                }
                (None, None) => {
                    return Err(ApiError::invalid_param(
                        "prompt",
                        "send `prompt`, `content` or `messages`",
                    ));
                }
            };
        Fields::new(Value::Object(map), "")?.finish_with(REFUSED)?;
        if text.len() > st.cfg.max_body_bytes {
            return Err(ApiError::invalid_param(param, "the text is too long"));
        }
        tok.encode_with(&text, parse, add)
            .map_err(|e| ApiError::invalid_param(param, e.to_string()))?
    };
    let bytes = tok.token_bytes();
    let tokens: Vec<Value> = if with_pieces {
        ids.iter()
            .map(|&id| {
                let b = bytes.bytes(id);
                let piece = match std::str::from_utf8(b) {
                    Ok(s) => json!(s),
                    Err(_) => json!(b),
                };
                json!({"id": id, "piece": piece})
            })
            .collect()
    } else {
        ids.iter().map(|&id| json!(id)).collect()
    };
    let mut out = json!({
        "tokens": tokens,
        "count": ids.len(),
        "max_model_len": st.context,
    });
    if token_strs {
        out["token_strs"] = json!(ids.iter().map(|&id| bytes.text(id)).collect::<Vec<_>>());
    }
    Ok(Json(out).into_response())
}

/// Answers `POST /detokenize`: the text of a list of token ids.
pub async fn detokenize(State(st): State<SharedState>, body: Body) -> Result<Response, ApiError> {
    let v: Value = read_json(body, st.cfg.max_body_bytes, st.cfg.read_timeout).await?;
    let mut b = Fields::new(v, "")?;
    let model: Option<String> = b.take("model")?;
    st.check_model(model.as_deref())?;
    let Some(ids) = b.take::<Vec<u32>>("tokens")? else {
        return Err(ApiError::invalid_param("tokens", "`tokens` is required"));
    };
    b.finish_with(REFUSED)?;
    if let Some(bad) = ids.iter().find(|&&t| t as usize >= st.vocab) {
        return Err(ApiError::invalid_param(
            "tokens",
            format!("token id {bad} is outside the vocabulary of {}", st.vocab),
        ));
    }
    let text = st
        .prompts
        .tokenizer()
        .decode_with(&ids, false)
        .map_err(|e| ApiError::invalid_param("tokens", e.to_string()))?;
    Ok(Json(json!({"prompt": text, "content": text})).into_response())
}
