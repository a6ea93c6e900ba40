//! The bodies of `/tokenize`, `/detokenize` and the render API, taken apart: vLLM's and
//! llama.cpp's shapes of `/tokenize`, `/detokenize`'s token ids, and the render API's own
//! switches in front of a generation body.
//!
//! `/tokenize` takes vLLM's `prompt` (with `add_special_tokens`, default true) or `messages`
//! (with the chat's `tools`, `tool_choice`, `parallel_tool_calls` and `chat_template_kwargs`,
//! and `add_generation_prompt`, default true), or llama.cpp's `content` (with `add_special`,
//! default false, and `parse_special`, default true); llama.cpp's `with_pieces` and vLLM's
//! `return_token_strs` shape the answer. Any other field is refused, as the chat endpoint
//! refuses it.

use serde_json::{Map, Value};

use crate::server::body::Fields;
use crate::server::error::ApiError;
use crate::server::request::parse::REFUSED;

/// What `/tokenize` is asked to encode.
#[derive(Debug, Clone)]
pub enum TokenizeInput {
    /// A chat, rendered as a chat completion renders it.
    Chat {
        /// The chat body's prompt fields (`messages`, `tools`, …), as a chat body.
        body: Map<String, Value>,
        /// Whether the prompt ends with the assistant's turn opened.
        add_generation_prompt: bool,
        /// `add_special_tokens: false` encodes the rendered text without special tokens.
        add_special_tokens: Option<bool>,
    },
    /// A text.
    Text {
        /// The text.
        text: String,
        /// The field it came in (`prompt` or `content`), for errors.
        param: &'static str,
        /// Whether to add the model's special tokens (BOS) around it.
        add_special: bool,
        /// Whether special tokens written in the text are read as such.
        parse_special: bool,
    },
}

/// A `/tokenize` body.
#[derive(Debug, Clone)]
pub struct TokenizeRequest {
    /// The model asked for.
    pub model: Option<String>,
    /// What to encode.
    pub input: TokenizeInput,
    /// llama.cpp's `with_pieces`: each token as `{"id", "piece"}`.
    pub with_pieces: bool,
    /// vLLM's `return_token_strs`: the tokens' texts beside them.
    pub token_strs: bool,
}

/// A `/detokenize` body.
#[derive(Debug, Clone)]
pub struct DetokenizeRequest {
    /// The model asked for.
    pub model: Option<String>,
    /// The token ids to decode.
    pub tokens: Vec<u32>,
}

/// The render API's own switches, taken out of a chat generation body.
#[derive(Debug, Clone, Copy)]
pub struct RenderOptions {
    /// vLLM's `add_generation_prompt` (default true).
    pub add_generation_prompt: bool,
}

/// The body as a JSON object.
fn object(v: Value) -> Result<Map<String, Value>, ApiError> {
    match v {
        Value::Object(map) => Ok(map),
        _ => Err(ApiError::invalid("the request body must be a JSON object")),
    }
}

/// A boolean field, `None` when absent or `null`.
fn take_bool(map: &mut Map<String, Value>, key: &str) -> Result<Option<bool>, ApiError> {
    match map.remove(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(b)),
        Some(_) => Err(ApiError::invalid_param(
            key,
            format!("`{key}` must be a boolean"),
        )),
    }
}

/// A string field, `None` when absent or `null`.
fn take_text(map: &mut Map<String, Value>, key: &str) -> Result<Option<String>, ApiError> {
    match map.remove(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(ApiError::invalid_param(
            key,
            format!("`{key}` must be a string"),
        )),
    }
}

/// The fields of a chat body that say what its prompt is.
const CHAT_PROMPT_FIELDS: [&str; 5] = [
    "messages",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "chat_template_kwargs",
];

impl TokenizeRequest {
    /// Takes a `/tokenize` body apart; a text longer than `max_text_bytes` is refused.
    pub fn from_json(v: Value, max_text_bytes: usize) -> Result<Self, ApiError> {
        let mut map = object(v)?;
        let with_pieces = take_bool(&mut map, "with_pieces")?.unwrap_or(false);
        let token_strs = take_bool(&mut map, "return_token_strs")?.unwrap_or(false);
        let add_special_tokens = take_bool(&mut map, "add_special_tokens")?;
        let add_special = take_bool(&mut map, "add_special")?;
        let parse_special = take_bool(&mut map, "parse_special")?;
        let model = take_text(&mut map, "model")
            .map_err(|_| ApiError::invalid_param("model", "`model` must be a string"))?;
        let input = if map.contains_key("messages") {
            let add_generation_prompt =
                take_bool(&mut map, "add_generation_prompt")?.unwrap_or(true);
            // The rest must be what a chat request would accept about its prompt.
            let mut body = Map::new();
            for key in CHAT_PROMPT_FIELDS {
                if let Some(v) = map.remove(key) {
                    body.insert(key.into(), v);
                }
            }
            TokenizeInput::Chat {
                body,
                add_generation_prompt,
                add_special_tokens,
            }
        } else {
            let (text, param, add_special, parse_special) = match (
                take_text(&mut map, "prompt")?,
                take_text(&mut map, "content")?,
            ) {
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
            TokenizeInput::Text {
                text,
                param,
                add_special,
                parse_special,
            }
        };
        Fields::new(Value::Object(map), "")?.finish_with(REFUSED)?;
        if let TokenizeInput::Text { text, param, .. } = &input
            && text.len() > max_text_bytes
        {
            return Err(ApiError::invalid_param(param, "the text is too long"));
        }
        Ok(Self {
            model,
            input,
            with_pieces,
            token_strs,
        })
    }
}

impl DetokenizeRequest {
    /// Takes a `/detokenize` body apart.
    pub fn from_json(v: Value) -> Result<Self, ApiError> {
        let mut b = Fields::new(v, "")?;
        let model: Option<String> = b.take("model")?;
        let Some(tokens) = b.take::<Vec<u32>>("tokens")? else {
            return Err(ApiError::invalid_param("tokens", "`tokens` is required"));
        };
        b.finish_with(REFUSED)?;
        Ok(Self { model, tokens })
    }
}

impl RenderOptions {
    /// Takes the render API's switches out of a chat generation body, leaving the body for
    /// the chat's own reading; `continue_final_message` is refused, as the chat endpoint
    /// refuses it.
    pub fn take(v: Value) -> Result<(Self, Value), ApiError> {
        let mut map = object(v)?;
        let add_generation_prompt = take_bool(&mut map, "add_generation_prompt")?.unwrap_or(true);
        if let Some(v) = map.remove("continue_final_message")
            && v != Value::Bool(false)
            && v != Value::Null
        {
            return Err(ApiError::invalid_param(
                "continue_final_message",
                "continuing the final message is not supported",
            ));
        }
        Ok((
            Self {
                add_generation_prompt,
            },
            Value::Object(map),
        ))
    }
}
