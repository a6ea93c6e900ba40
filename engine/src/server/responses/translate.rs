//! A Responses body's items into the shared request's conversation: `instructions` first,
//! then the chain's history and the request's input, each item a chat message (reasoning
//! items as the assistant's reasoning, sealed by this engine; function calls and their
//! outputs as tool calls and tool messages); and the session keys the body offers, in this
//! door's order.

use serde_json::{Map, Value, json};

use super::types::ResponsesRequest;
use crate::server::body::kind_of;
use crate::server::error::ApiError;
use crate::server::request::input::{
    ChatRequest, Content, InputFunctionCall, InputMessage, InputToolCall,
};
use crate::server::request::session::{KeySource, Offered};

impl ResponsesRequest {
    /// The conversation for the one request path: `instructions` as a system message, then
    /// `items` (the chain's history and this request's input), with the request's tools and
    /// options. `history` items are named by the response they came from in errors.
    pub fn chat(
        &self,
        history: &[Value],
        enable_thinking: Option<bool>,
    ) -> Result<ChatRequest, ApiError> {
        let mut messages = Vec::new();
        if let Some(i) = &self.instructions {
            messages.push(text_message("instructions", "system", i.clone()));
        }
        let held = to_messages(history, "previous_response_id")?;
        let held_messages = held.len();
        messages.extend(held);
        messages.extend(to_messages(&self.input, "input")?);
        let messages = merge_adjacent(messages);
        let mut chat_template_kwargs = Map::new();
        if let Some(on) = enable_thinking {
            chat_template_kwargs.insert("enable_thinking".into(), Value::Bool(on));
        }
        Ok(ChatRequest {
            messages,
            common: self.common.clone(),
            tools: (!self.tools.is_empty()).then(|| self.tools.clone()),
            tool_choice: self.tool_choice.clone(),
            parallel_tool_calls: self.parallel_tool_calls,
            logprobs: self.logprobs(),
            top_logprobs: self.top_logprobs,
            chat_template_kwargs,
            held_messages,
        })
    }
}

/// The session keys a Responses body offers, in this door's order: `conversation`, the
/// session of the `previous_response_id` chain (`chain`: the response store remembers each
/// chain's session), `prompt_cache_key`, `safety_identifier` (OpenAI's replacement for
/// `user`, echoed on the response), then `user`.
pub fn session_keys<'a>(req: &'a ResponsesRequest, chain: Option<&'a str>) -> [Offered<'a>; 5] {
    let c = &req.common;
    let safety_identifier = req.ignored.get("safety_identifier").and_then(Value::as_str);
    [
        (req.conversation.as_deref(), KeySource::Conversation),
        (chain, KeySource::ResponseChain),
        (c.prompt_cache_key.as_deref(), KeySource::PromptCacheKey),
        (safety_identifier, KeySource::User),
        (c.user.as_deref(), KeySource::User),
    ]
}

/// The names the one request path's checks give a field, as this API names it.
pub fn rename_param(param: &str) -> Option<String> {
    let renamed = match param {
        "max_tokens" | "max_completion_tokens" => "max_output_tokens",
        "messages" => "input",
        "response_format" => "text.format",
        "chat_template_kwargs" => "reasoning.effort",
        other => {
            return other
                .strip_prefix("response_format.")
                .map(|r| format!("text.format.{r}"));
        }
    };
    Some(renamed.to_string())
}

fn text_message(path: &str, role: &str, text: String) -> InputMessage {
    InputMessage {
        path: path.to_string(),
        role: role.to_string(),
        content: Some(Content::Text(text)),
        name: None,
        tool_calls: None,
        tool_call_id: None,
        reasoning_content: None,
    }
}

/// The text of a message's `content` (a string, or its text parts joined). Parts the engine
/// cannot read (images, files, audio) are refused, naming the part.
fn content_text(v: &Value, path: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        Value::Array(parts) => {
            let mut out = String::new();
            for (j, p) in parts.iter().enumerate() {
                let pp = format!("{path}.content[{j}]");
                let kind = p.get("type").and_then(Value::as_str).unwrap_or("");
                match kind {
                    "input_text" | "output_text" | "text" | "summary_text" | "reasoning_text" => {
                        out.push_str(p.get("text").and_then(Value::as_str).unwrap_or(""));
                    }
                    "refusal" => {
                        out.push_str(p.get("refusal").and_then(Value::as_str).unwrap_or(""));
                    }
                    "input_image" | "input_file" | "input_audio" => {
                        let mut e = ApiError::invalid_param(
                            &format!("{pp}.type"),
                            format!(
                                "content of type `{kind}` is not supported: this engine reads text only"
                            ),
                        );
                        e.code = Some("unsupported_content");
                        return Err(e);
                    }
                    other => {
                        return Err(ApiError::invalid_param(
                            &format!("{pp}.type"),
                            format!("unknown content part type `{other}`"),
                        ));
                    }
                }
            }
            Ok(out)
        }
        other => Err(ApiError::invalid_param(
            &format!("{path}.content"),
            format!(
                "`content` must be a string or an array of parts, not {}",
                kind_of(other)
            ),
        )),
    }
}

/// The reasoning text of a `reasoning` item: its content, else its summary, else its
/// `encrypted_content` as this engine wrote it ([`seal_reasoning`]).
fn reasoning_text(item: &Value) -> String {
    let join = |key: &str| {
        item.get(key)
            .and_then(Value::as_array)
            .map(|parts| {
                parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .filter(|s| !s.is_empty())
    };
    join("content")
        .or_else(|| join("summary"))
        .or_else(|| {
            item.get("encrypted_content")
                .and_then(Value::as_str)
                .and_then(open_reasoning)
        })
        .unwrap_or_default()
}

/// The `encrypted_content` of a reasoning item: its text, hex-encoded behind a marker. It is
/// not encrypted (the text is the client's own, on its own machine): it only lets a client
/// that keeps nothing (`store: false`) hand the reasoning back. Documented in `docs/api.md`.
pub fn seal_reasoning(text: &str) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(3 + text.len() * 2);
    s.push_str("sl1");
    for b in text.as_bytes() {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// The text [`seal_reasoning`] sealed; `None` for anything else (another server's opaque
/// content, which carries nothing readable here).
pub fn open_reasoning(sealed: &str) -> Option<String> {
    let hex = sealed.strip_prefix("sl1")?;
    if hex.len() % 2 != 0 {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

/// Items as chat messages. Consecutive calls (and the reasoning and message before them) form
/// one assistant turn; a call's output is a tool message. `prefix` names where they are.
pub fn to_messages(items: &[Value], prefix: &str) -> Result<Vec<InputMessage>, ApiError> {
    let mut out: Vec<InputMessage> = Vec::new();
    let mut reasoning: Option<String> = None;
    for (i, item) in items.iter().enumerate() {
        let path = format!("{prefix}[{i}]");
        let kind = item.get("type").and_then(Value::as_str).unwrap_or("");
        // The assistant turn this item continues: the last message, if it is the assistant's
        // and no tool output came after it.
        let open_assistant = |out: &mut Vec<InputMessage>| -> bool {
            out.last().is_some_and(|m| m.role == "assistant")
        };
        match kind {
            "message" => {
                let role = item.get("role").and_then(Value::as_str).unwrap_or("");
                let role = match role {
                    "user" | "assistant" | "system" | "developer" => role,
                    other => {
                        return Err(ApiError::invalid_param(
                            &format!("{path}.role"),
                            format!(
                                "unknown role `{other}` (user, assistant, system or developer)"
                            ),
                        ));
                    }
                };
                let text = content_text(item.get("content").unwrap_or(&Value::Null), &path)?;
                let mut m = text_message(&path, role, text);
                if role == "assistant" {
                    m.reasoning_content = reasoning.take();
                    if open_assistant(&mut out)
                        && let Some(last) = out.last_mut()
                        && last.tool_calls.is_none()
                    {
                        // Two assistant messages in a row (a client splitting one reply).
                        let prev = match last.content.take() {
                            Some(Content::Text(t)) => t,
                            _ => String::new(),
                        };
                        let now = match m.content {
                            Some(Content::Text(t)) => t,
                            _ => String::new(),
                        };
                        last.content = Some(Content::Text(prev + &now));
                        continue;
                    }
                }
                out.push(m);
            }
            "reasoning" => {
                let t = reasoning_text(item);
                if !t.is_empty() {
                    reasoning = Some(match reasoning.take() {
                        Some(r) => r + "\n" + &t,
                        None => t,
                    });
                }
            }
            "function_call" | "custom_tool_call" => {
                let name = item.get("name").and_then(Value::as_str).unwrap_or("");
                if name.is_empty() {
                    return Err(ApiError::invalid_param(
                        &format!("{path}.name"),
                        "a function call needs the `name` of the function",
                    ));
                }
                let arguments = if kind == "custom_tool_call" {
                    json!({"input": item.get("input").cloned().unwrap_or(Value::Null)})
                } else {
                    item.get("arguments").cloned().unwrap_or(json!("{}"))
                };
                let call = InputToolCall {
                    id: item
                        .get("call_id")
                        .and_then(Value::as_str)
                        .map(str::to_string),
                    kind: Some("function".into()),
                    function: InputFunctionCall {
                        name: name.to_string(),
                        arguments,
                    },
                };
                let joins = open_assistant(&mut out);
                if joins && let Some(last) = out.last_mut() {
                    last.tool_calls.get_or_insert_with(Vec::new).push(call);
                    if last.reasoning_content.is_none() {
                        last.reasoning_content = reasoning.take();
                    }
                } else {
                    let mut m = text_message(&path, "assistant", String::new());
                    m.tool_calls = Some(vec![call]);
                    m.reasoning_content = reasoning.take();
                    out.push(m);
                }
            }
            "function_call_output" | "custom_tool_call_output" => {
                let Some(call_id) = item.get("call_id").and_then(Value::as_str) else {
                    return Err(ApiError::invalid_param(
                        &format!("{path}.call_id"),
                        "a function call output needs the `call_id` it answers",
                    ));
                };
                let output = match item.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(v @ Value::Array(_)) => {
                        content_text(&json!({"content": v})["content"], &format!("{path}.output"))?
                    }
                    Some(Value::Null) | None => String::new(),
                    Some(other) => other.to_string(),
                };
                let mut m = text_message(&path, "tool", output);
                m.tool_call_id = Some(call_id.to_string());
                out.push(m);
            }
            "item_reference" => {
                return Err(ApiError::invalid_param(
                    &format!("{path}.type"),
                    "`item_reference` items are not supported: send the item itself, or continue with `previous_response_id`",
                ));
            }
            other => {
                let mut e = ApiError::invalid_param(
                    &format!("{path}.type"),
                    format!(
                        "input items of type `{other}` are not supported (message, function_call, function_call_output, reasoning)"
                    ),
                );
                e.code = Some("unsupported_parameter");
                return Err(e);
            }
        }
    }
    Ok(out)
}

/// Adjacent plain messages of one author become one, their texts joined by a blank line:
/// `instructions` and developer messages are one system message, and a user's messages in a
/// row one user turn. Agents send items like that (Codex: two developer messages, then two
/// user messages), and many chat templates (Gemma's, Llama 2's) refuse roles that do not
/// alternate.
fn merge_adjacent(messages: Vec<InputMessage>) -> Vec<InputMessage> {
    let plain = |m: &InputMessage| m.tool_calls.is_none() && m.tool_call_id.is_none();
    let author = |m: &InputMessage| match m.role.as_str() {
        "developer" => "system".to_string(),
        r => r.to_string(),
    };
    let mut out: Vec<InputMessage> = Vec::with_capacity(messages.len());
    for m in messages {
        if let Some(last) = out.last_mut()
            && plain(last)
            && plain(&m)
            && author(last) == author(&m)
            && matches!(author(&m).as_str(), "system" | "user")
            && let (Some(Content::Text(a)), Some(Content::Text(b))) =
                (&mut last.content, &m.content)
        {
            if !a.is_empty() && !b.is_empty() {
                a.push_str("\n\n");
            }
            a.push_str(b);
            continue;
        }
        out.push(m);
    }
    out
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderMap;

    use super::*;
    use crate::server::request::session::{SessionKey, resolve};

    fn key(id: &str, source: KeySource) -> Option<SessionKey> {
        SessionKey::new(id, source)
    }

    fn request(body: Value) -> ResponsesRequest {
        ResponsesRequest::from_json(body).expect("valid body")
    }

    #[test]
    fn responses_take_conversation_then_chain_then_cache_key_then_user() {
        let none = HeaderMap::new();
        let all = request(json!({"input": "hi", "conversation": "conv_1",
            "prompt_cache_key": "codex-thread", "user": "u"}));
        assert_eq!(
            resolve(&none, session_keys(&all, Some("chain-s"))),
            key("conv_1", KeySource::Conversation)
        );
        let chain =
            request(json!({"input": "hi", "prompt_cache_key": "codex-thread", "user": "u"}));
        assert_eq!(
            resolve(&none, session_keys(&chain, Some("chain-s"))),
            key("chain-s", KeySource::ResponseChain)
        );
        assert_eq!(
            resolve(&none, session_keys(&chain, None)),
            key("codex-thread", KeySource::PromptCacheKey)
        );
        let safety = request(json!({"input": "hi", "safety_identifier": "si", "user": "u"}));
        assert_eq!(
            resolve(&none, session_keys(&safety, None)),
            key("si", KeySource::User)
        );
        let user = request(json!({"input": "hi", "user": "u"}));
        assert_eq!(
            resolve(&none, session_keys(&user, None)),
            key("u", KeySource::User)
        );
        let nothing = request(json!({"input": "hi"}));
        assert_eq!(resolve(&none, session_keys(&nothing, None)), None);
    }
}
