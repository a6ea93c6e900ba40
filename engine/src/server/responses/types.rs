//! A `POST /v1/responses` body taken apart field by field, and its items turned into the one
//! request path's conversation ([`crate::server::request::input`]).
//!
//! Every field the official SDK can send is taken by name: honoured where it means something on
//! a local engine, accepted and documented as ignored where it does not (`docs/api.md`), never
//! a 400 that breaks the client. Tools the engine cannot run (hosted tools, Codex's
//! `namespace`) are accepted and left out of the prompt; the request says so
//! ([`ResponsesRequest::tools_skipped`]). A field no SDK sends is refused, naming it.

use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::server::body::{Fields, kind_of};
use crate::server::error::ApiError;
use crate::server::request::input::{
    Common, InputTool, InputToolChoice, ResponseFormat, StreamOptions,
};
use crate::server::request::prediction::parse_prediction;

/// Fields of the Responses API accepted and ignored, each with why (they mean nothing on a
/// local engine, or only OpenAI's platform has them). `docs/api.md` lists them.
pub const IGNORED: &[(&str, &str)] = &[
    ("service_tier", "there is one service tier"),
    (
        "safety_identifier",
        "echoed on the response and taken as the session key after `prompt_cache_key`; no platform policy applies",
    ),
    (
        "max_tool_calls",
        "hosted tools are not run, so no tool calls are made server-side",
    ),
    (
        "prompt",
        "reusable prompt templates live on OpenAI's platform",
    ),
    (
        "prompt_cache_retention",
        "the prefix cache keeps what fits; see prompt_cache_options.ttl",
    ),
    (
        "context_management",
        "no server-side compaction; the engine keeps the context whole",
    ),
    ("moderation", "no moderation models run here"),
    ("access_programs", "an OpenAI platform programme"),
    (
        "image",
        "image generation is not supported (the option only configures it)",
    ),
    ("background_options", "background requests run at once"),
    (
        "client_metadata",
        "a client's own metadata (Codex CLI's installation, thread and turn ids); the session comes from `prompt_cache_key`",
    ),
];

/// How a prompt too long for the context is handled (`truncation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Truncation {
    /// Refused with 400 (OpenAI's default).
    #[default]
    Disabled,
    /// The oldest items of the conversation are dropped until it fits.
    Auto,
}

impl Truncation {
    /// The wire value.
    pub fn as_str(self) -> &'static str {
        match self {
            Truncation::Disabled => "disabled",
            Truncation::Auto => "auto",
        }
    }
}

/// `prompt_cache_options`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CacheOptions {
    /// The response whose prompt this one's is compared with (`prompt_cache_diagnostics`).
    pub comparison_response_id: Option<String>,
    /// Prefill the prompt without generating.
    pub prewarm: bool,
    /// The cache lifetime asked for (`30m`, `12h`), as sent (the response echoes it).
    pub ttl: Option<String>,
    /// That lifetime as a duration ([`parse_ttl`]): how long the session's KV is kept after
    /// this turn, which the engine bounds by `--session-kv-ttl-max`.
    pub session_ttl: Option<Duration>,
    /// `implicit` or `explicit` breakpoints (every block is a breakpoint here).
    pub mode: Option<String>,
}

/// A `prompt_cache_options.ttl`: `90s`, `30m`, `12h`, `1d`; a bare number is seconds.
pub fn parse_ttl(ttl: &str) -> Result<Duration, ApiError> {
    let bad = || {
        ApiError::invalid_param(
            "prompt_cache_options.ttl",
            format!("`ttl` must be a duration such as `300s`, `30m`, `12h` or `1d`, not `{ttl}`"),
        )
    };
    let t = ttl.trim();
    let (number, unit) = match t.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => t.split_at(i),
        None => (t, "s"),
    };
    let n: u64 = number.parse().map_err(|_| bad())?;
    let scale = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(bad()),
    };
    n.checked_mul(scale)
        .map(Duration::from_secs)
        .ok_or_else(bad)
}

/// `reasoning`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReasoningOptions {
    /// `none`, `minimal`, `low`, `medium`, `high`, `xhigh`.
    pub effort: Option<String>,
    /// `auto`, `concise`, `detailed`: reasoning comes back as summary text.
    pub summary: Option<String>,
}

impl ReasoningOptions {
    /// The thinking switch of the family's template: off for `none` and `minimal`, on for
    /// the others, the template's own default without an effort.
    pub fn enable_thinking(&self) -> Option<bool> {
        match self.effort.as_deref() {
            None => None,
            Some("none" | "minimal") => Some(false),
            Some(_) => Some(true),
        }
    }
}

/// A Responses request, taken apart.
#[derive(Debug, Clone)]
pub struct ResponsesRequest {
    /// Sampling, limits and output options (the model, `max_output_tokens`, `temperature`, …).
    pub common: Common,
    /// The request's own input items, each an object with its `type`.
    pub input: Vec<Value>,
    /// `instructions`: a system message before the conversation.
    pub instructions: Option<String>,
    /// The function tools, as the engine takes them.
    pub tools: Vec<InputTool>,
    /// The function tools as sent (echoed in the response; compared across turns).
    pub tools_wire: Vec<Value>,
    /// Every tool as sent (echoed in the response).
    pub tools_echo: Vec<Value>,
    /// The types of the tools accepted and left out of the prompt.
    pub tools_skipped: Vec<String>,
    /// `tool_choice`.
    pub tool_choice: Option<InputToolChoice>,
    /// `tool_choice` as sent (echoed).
    pub tool_choice_echo: Value,
    /// `parallel_tool_calls`.
    pub parallel_tool_calls: Option<bool>,
    /// `store` (default true).
    pub store: bool,
    /// `previous_response_id`.
    pub previous_response_id: Option<String>,
    /// `conversation` (an id, or `{id}`).
    pub conversation: Option<String>,
    /// `include`.
    pub include: Vec<String>,
    /// `truncation`.
    pub truncation: Truncation,
    /// `metadata` (up to 16 string pairs).
    pub metadata: Option<Map<String, Value>>,
    /// `reasoning`.
    pub reasoning: ReasoningOptions,
    /// `text.format` as sent (echoed), `{"type": "text"}` by default.
    pub text_format: Value,
    /// `text.verbosity` (echoed; no effect).
    pub verbosity: Option<String>,
    /// `prompt_cache_options`.
    pub cache: CacheOptions,
    /// `top_logprobs`: alternatives per token on `output_text` parts.
    pub top_logprobs: Option<i64>,
    /// `background` (run at once: the response is created before it is returned).
    pub background: bool,
    /// Accepted fields with no effect, for the response's echo.
    pub ignored: Map<String, Value>,
}

impl ResponsesRequest {
    /// Whether output logprobs were asked for (`top_logprobs`, or the `include` item).
    pub fn logprobs(&self) -> bool {
        self.top_logprobs.is_some()
            || self
                .include
                .iter()
                .any(|i| i == "message.output_text.logprobs")
    }

    /// Whether reasoning comes back as opaque content a client can send back
    /// (`include: ["reasoning.encrypted_content"]`).
    pub fn encrypted_reasoning(&self) -> bool {
        self.include
            .iter()
            .any(|i| i == "reasoning.encrypted_content")
    }

    /// Takes a body apart; errors name the field.
    pub fn from_json(v: Value) -> Result<Self, ApiError> {
        let mut b = Fields::new(v, "")?;
        let input = match b.take_value("input") {
            None => Vec::new(),
            Some(Value::String(s)) => {
                vec![json!({"type": "message", "role": "user", "content": s})]
            }
            Some(Value::Array(items)) => items
                .into_iter()
                .enumerate()
                .map(|(i, it)| normalize_item(it, &format!("input[{i}]")))
                .collect::<Result<Vec<_>, _>>()?,
            Some(other) => {
                return Err(ApiError::invalid_param(
                    "input",
                    format!(
                        "`input` must be a string or an array of items, not {}",
                        kind_of(&other)
                    ),
                ));
            }
        };
        let (tools, tools_wire, tools_echo, tools_skipped) = match b.take_value("tools") {
            None => (Vec::new(), Vec::new(), Vec::new(), Vec::new()),
            Some(Value::Array(items)) => parse_tools(items)?,
            Some(other) => {
                return Err(ApiError::invalid_param(
                    "tools",
                    format!("`tools` must be an array, not {}", kind_of(&other)),
                ));
            }
        };
        let tool_choice_echo = b.take_value("tool_choice").unwrap_or(json!("auto"));
        let tool_choice = parse_tool_choice(&tool_choice_echo)?;
        let (text_format, verbosity, response_format) = match b.take_value("text") {
            None => (json!({"type": "text"}), None, None),
            Some(t) => parse_text(t)?,
        };
        let reasoning = match b.take_value("reasoning") {
            None => ReasoningOptions::default(),
            Some(r) => {
                let mut r = Fields::new(r, "reasoning.")?;
                let o = ReasoningOptions {
                    effort: r.take("effort")?,
                    summary: r.take::<String>("summary")?.or(r.take("generate_summary")?),
                };
                r.finish()?;
                o
            }
        };
        let cache = match b.take_value("prompt_cache_options") {
            None => CacheOptions::default(),
            Some(c) => {
                let mut c = Fields::new(c, "prompt_cache_options.")?;
                let ttl: Option<String> = c.take("ttl")?;
                let o = CacheOptions {
                    comparison_response_id: c.take("comparison_response_id")?,
                    prewarm: c.take("prewarm")?.unwrap_or(false),
                    session_ttl: ttl.as_deref().map(parse_ttl).transpose()?,
                    ttl,
                    mode: c.take("mode")?,
                };
                c.finish()?;
                o
            }
        };
        let conversation = match b.take_value("conversation") {
            None => None,
            Some(Value::String(s)) => Some(s),
            Some(Value::Object(m)) => match m.get("id") {
                Some(Value::String(s)) => Some(s.clone()),
                _ => {
                    return Err(ApiError::invalid_param(
                        "conversation.id",
                        "`conversation` needs an `id`",
                    ));
                }
            },
            Some(other) => {
                return Err(ApiError::invalid_param(
                    "conversation",
                    format!(
                        "`conversation` must be an id or an object, not {}",
                        kind_of(&other)
                    ),
                ));
            }
        };
        let truncation = match b.take::<String>("truncation")?.as_deref() {
            None | Some("disabled") => Truncation::Disabled,
            Some("auto") => Truncation::Auto,
            Some(other) => {
                return Err(ApiError::invalid_param(
                    "truncation",
                    format!("unknown truncation `{other}` (auto or disabled)"),
                ));
            }
        };
        let metadata: Option<Map<String, Value>> = b.take("metadata")?;
        if let Some(m) = &metadata
            && (m.len() > 16 || m.values().any(|v| !v.is_string()))
        {
            return Err(ApiError::invalid_param(
                "metadata",
                "`metadata` holds at most 16 string values",
            ));
        }
        let stream_options = match b.take_value("stream_options") {
            None => None,
            Some(v) => {
                let mut so = Fields::new(v, "stream_options.")?;
                // Obfuscation pads events against side channels on a shared network; there is
                // none between a client and a local engine.
                let _obfuscate: Option<bool> = so.take("include_obfuscation")?;
                so.finish()?;
                Some(StreamOptions::default())
            }
        };
        let common = Common {
            model: b.take("model")?,
            max_completion_tokens: b.take("max_output_tokens")?,
            temperature: b.take("temperature")?,
            top_p: b.take("top_p")?,
            stream: b.take("stream")?.unwrap_or(false),
            stream_options,
            user: b.take("user")?,
            prompt_cache_key: b.take("prompt_cache_key")?,
            response_format,
            // Predicted Outputs, as chat completions take them (a slotlight extension here).
            prediction: b
                .take_value("prediction")
                .map(parse_prediction)
                .transpose()?,
            ..Common::default()
        };
        let mut ignored = Map::new();
        for (key, _) in IGNORED {
            if let Some(v) = b.take_value(key) {
                ignored.insert((*key).to_string(), v);
            }
        }
        let r = Self {
            common,
            input,
            instructions: b.take("instructions")?,
            tools,
            tools_wire,
            tools_echo,
            tools_skipped,
            tool_choice,
            tool_choice_echo,
            parallel_tool_calls: b.take("parallel_tool_calls")?,
            store: b.take("store")?.unwrap_or(true),
            previous_response_id: b.take("previous_response_id")?,
            conversation,
            include: b.take("include")?.unwrap_or_default(),
            truncation,
            metadata,
            reasoning,
            text_format,
            verbosity,
            cache,
            top_logprobs: b.take("top_logprobs")?,
            background: b.take("background")?.unwrap_or(false),
            ignored,
        };
        let mut r = r;
        r.common
            .previous_response_id
            .clone_from(&r.previous_response_id);
        if r.previous_response_id.is_some() && r.conversation.is_some() {
            return Err(ApiError::invalid_param(
                "previous_response_id",
                "`previous_response_id` and `conversation` cannot both be given",
            ));
        }
        b.finish()?;
        Ok(r)
    }
}

/// An input item as an object with its `type` (a bare `{role, content}` is a message).
fn normalize_item(v: Value, path: &str) -> Result<Value, ApiError> {
    let Value::Object(mut m) = v else {
        return Err(ApiError::invalid_param(
            path,
            format!("`{path}` must be an item object, not {}", kind_of(&v)),
        ));
    };
    if !m.contains_key("type") {
        if m.contains_key("role") {
            m.insert("type".into(), json!("message"));
        } else {
            return Err(ApiError::invalid_param(
                &format!("{path}.type"),
                "every input item needs a `type` (or a `role`, for a message)",
            ));
        }
    }
    Ok(Value::Object(m))
}

/// `tools`: function tools as the engine takes them, the function tools as sent, every tool
/// as sent, and the types of those left out of the prompt.
#[allow(clippy::type_complexity)]
fn parse_tools(
    items: Vec<Value>,
) -> Result<(Vec<InputTool>, Vec<Value>, Vec<Value>, Vec<String>), ApiError> {
    let mut tools = Vec::new();
    let mut wire = Vec::new();
    let mut echo = Vec::new();
    let mut skipped: Vec<String> = Vec::new();
    for (i, t) in items.into_iter().enumerate() {
        let path = format!("tools[{i}]");
        let kind = t
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        echo.push(t.clone());
        if kind != "function" {
            if kind.is_empty() {
                return Err(ApiError::invalid_param(
                    &format!("{path}.type"),
                    "every tool needs a `type`",
                ));
            }
            if !skipped.contains(&kind) {
                skipped.push(kind);
            }
            continue;
        }
        let mut b = Fields::new(t.clone(), &format!("{path}."))?;
        let _kind: Option<String> = b.take("type")?;
        let tool = InputTool::take(&mut b, &path, "parameters")?;
        // Deferred loading is a hosted tool-search feature; the tool is offered at once here.
        let _defer: Option<bool> = b.take("defer_loading")?;
        b.finish()?;
        wire.push(t);
        tools.push(tool);
    }
    Ok((tools, wire, echo, skipped))
}

/// `tool_choice`: a mode, a named function, or a hosted tool (left to the model: `auto`).
fn parse_tool_choice(v: &Value) -> Result<Option<InputToolChoice>, ApiError> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) => match s.as_str() {
            "none" => Ok(Some(InputToolChoice::None)),
            "auto" => Ok(Some(InputToolChoice::Auto)),
            "required" => Ok(Some(InputToolChoice::Required)),
            other => Err(ApiError::invalid_param(
                "tool_choice",
                format!("unknown tool_choice `{other}` (none, auto, required or an object)"),
            )),
        },
        Value::Object(m) => match m.get("type").and_then(Value::as_str) {
            Some("function") => match m.get("name").and_then(Value::as_str) {
                Some(n) if !n.is_empty() => Ok(Some(InputToolChoice::Function(n.to_string()))),
                _ => Err(ApiError::invalid_param(
                    "tool_choice.name",
                    "a function tool_choice needs the function's `name`",
                )),
            },
            Some("allowed_tools") => match m.get("mode").and_then(Value::as_str) {
                Some("required") => Ok(Some(InputToolChoice::Required)),
                _ => Ok(Some(InputToolChoice::Auto)),
            },
            Some(_) => Ok(Some(InputToolChoice::Auto)),
            None => Err(ApiError::invalid_param(
                "tool_choice.type",
                "an object tool_choice needs a `type`",
            )),
        },
        other => Err(ApiError::invalid_param(
            "tool_choice",
            format!(
                "`tool_choice` must be a string or an object, not {}",
                kind_of(other)
            ),
        )),
    }
}

/// `text`: the format as sent (echoed), the verbosity, and the output constraint.
fn parse_text(v: Value) -> Result<(Value, Option<String>, Option<ResponseFormat>), ApiError> {
    let mut t = Fields::new(v, "text.")?;
    let verbosity: Option<String> = t.take("verbosity")?;
    let format = t.take_value("format");
    t.finish()?;
    let Some(format) = format else {
        return Ok((json!({"type": "text"}), verbosity, None));
    };
    let echo = format.clone();
    let mut f = Fields::new(format, "text.format.")?;
    let kind: Option<String> = f.take("type")?;
    let rf = match kind.as_deref() {
        Some("text") => None,
        Some("json_object") => Some(ResponseFormat::JsonObject(None)),
        Some("json_schema") => {
            let _name: Option<String> = f.take("name")?;
            let _description: Option<String> = f.take("description")?;
            let _strict: Option<bool> = f.take("strict")?;
            let Some(schema) = f.take_value("schema") else {
                return Err(ApiError::invalid_param(
                    "text.format.schema",
                    "a `json_schema` format needs its `schema`",
                ));
            };
            Some(ResponseFormat::JsonSchema(schema))
        }
        Some(other) => {
            return Err(ApiError::invalid_param(
                "text.format.type",
                format!("unknown text format `{other}` (text, json_object or json_schema)"),
            ));
        }
        None => {
            return Err(ApiError::invalid_param(
                "text.format.type",
                "`text.format` needs a `type`",
            ));
        }
    };
    f.finish()?;
    Ok((echo, verbosity, rf))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::request::input::Content;
    use crate::server::responses::translate::{open_reasoning, rename_param, seal_reasoning};

    fn parse(v: Value) -> ResponsesRequest {
        ResponsesRequest::from_json(v).expect("valid")
    }

    #[test]
    fn a_string_input_is_one_user_message() {
        let r = parse(json!({"model": "m", "input": "hi", "instructions": "be brief"}));
        let chat = r.chat(&[], None).expect("chat");
        assert_eq!(chat.messages.len(), 2);
        assert_eq!(chat.messages[0].role, "system");
        assert_eq!(chat.messages[1].role, "user");
        assert!(r.store, "store defaults to true, as OpenAI's");
    }

    #[test]
    fn calls_and_outputs_become_one_assistant_turn_and_tool_messages() {
        let r = parse(json!({"input": [
            {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": seal_reasoning("think")},
            {"type": "function_call", "call_id": "call_1", "name": "get", "arguments": "{\"c\":1}"},
            {"type": "function_call", "call_id": "call_2", "name": "get", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "rain"}]},
        ]}));
        let m = r.chat(&[], None).expect("chat").messages;
        assert_eq!(m.len(), 4);
        assert_eq!(m[0].role, "user");
        assert_eq!(m[1].role, "assistant");
        assert_eq!(m[1].tool_calls.as_ref().map(Vec::len), Some(2));
        assert_eq!(m[1].reasoning_content.as_deref(), Some("think"));
        assert_eq!(m[3].tool_call_id.as_deref(), Some("call_2"));
        assert!(matches!(&m[3].content, Some(Content::Text(t)) if t == "rain"));
    }

    #[test]
    fn adjacent_messages_of_one_author_are_one_turn() {
        let r = parse(json!({"instructions": "I", "input": [
            {"type": "message", "role": "developer", "content": "D1"},
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "D2"}]},
            {"type": "message", "role": "user", "content": "U1"},
            {"type": "message", "role": "user", "content": "U2"},
        ]}));
        let m = r.chat(&[], None).expect("chat").messages;
        assert_eq!(m.len(), 2);
        assert!(matches!(&m[0].content, Some(Content::Text(t)) if t == "I\n\nD1\n\nD2"));
        assert!(matches!(&m[1].content, Some(Content::Text(t)) if t == "U1\n\nU2"));
    }

    #[test]
    fn hosted_tools_are_accepted_and_left_out() {
        let r = parse(json!({"input": "x", "tools": [
            {"type": "web_search"},
            {"type": "namespace", "name": "mcp", "tools": []},
            {"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": false},
        ]}));
        assert_eq!(r.tools.len(), 1);
        assert_eq!(r.tools_skipped, vec!["web_search", "namespace"]);
        assert_eq!(r.tools_echo.len(), 3);
    }

    #[test]
    fn errors_name_the_field_as_this_api_names_it() {
        let e = ResponsesRequest::from_json(json!({"input": [{"type": "message", "role": "user",
            "content": [{"type": "input_image", "image_url": "x"}]}]}))
        .and_then(|r| r.chat(&[], None))
        .expect_err("images are refused");
        assert_eq!(e.param.as_deref(), Some("input[0].content[0].type"));
        let e =
            ResponsesRequest::from_json(json!({"input": "x", "bogus": 1})).expect_err("unknown");
        assert_eq!(e.param.as_deref(), Some("bogus"));
        assert_eq!(
            rename_param("max_tokens").as_deref(),
            Some("max_output_tokens")
        );
        assert_eq!(
            rename_param("response_format.json_schema").as_deref(),
            Some("text.format.json_schema")
        );
    }

    #[test]
    fn every_field_the_sdk_sends_is_accepted() {
        let r = parse(json!({
            "model": "m", "input": "x", "instructions": "i", "max_output_tokens": 5,
            "temperature": 0.5, "top_p": 0.9, "top_logprobs": 2, "stream": true,
            "stream_options": {"include_obfuscation": false}, "store": false,
            "prompt_cache_key": "k", "prompt_cache_retention": "24h",
            "prompt_cache_options": {"ttl": "30m", "prewarm": false, "mode": "implicit"},
            "metadata": {"a": "b"}, "user": "u", "safety_identifier": "s",
            "include": ["reasoning.encrypted_content"], "truncation": "auto",
            "reasoning": {"effort": "low", "summary": "auto"}, "parallel_tool_calls": true,
            "text": {"format": {"type": "text"}, "verbosity": "low"}, "service_tier": "auto",
            "max_tool_calls": 3, "background": false, "tool_choice": "auto",
            "context_management": [{"type": "compaction"}],
        }));
        assert_eq!(r.truncation, Truncation::Auto);
        assert!(r.encrypted_reasoning() && r.logprobs());
        assert_eq!(r.reasoning.enable_thinking(), Some(true));
        assert!(r.ignored.contains_key("service_tier"));
    }

    #[test]
    fn sealed_reasoning_opens_to_its_text_and_nothing_else_does() {
        let s = seal_reasoning("naïve plan");
        assert_eq!(open_reasoning(&s).as_deref(), Some("naïve plan"));
        assert_eq!(open_reasoning("gAAAA-other-servers-blob"), None);
        assert_eq!(open_reasoning("sl1zz"), None);
    }
}
