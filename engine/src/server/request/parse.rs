//! The shared request read from its JSON shape, which is OpenAI's chat completions and
//! completions bodies: the `openai` door and the render and tokenize endpoints take it, the
//! other doors translate their own bodies into [`super::input`] directly.
//!
//! Nothing is silently ignored. A body is read as a JSON object and every field is taken out by
//! name, with its own type check (a wrong type is a 400 naming the field in `param`); what is
//! left at the end is refused the same way. Fields of OpenAI's API that slotlight does not
//! implement are refused with a reason ([`REFUSED`]); an explicit `null` asks for nothing and is
//! accepted for any field (several clients write every unset optional field as `null`).
//! `docs/api.md` lists every field and what happens to it.

use serde_json::{Map, Value};

use crate::server::body::{Fields, kind_of};
use crate::server::error::ApiError;
use crate::server::request::input::{
    ChatRequest, Common, CompletionRequest, InputMessage, InputTool, InputToolChoice, Prompt,
    ResponseFormat, StreamOptions, StructuredOutputs,
};
use crate::server::request::prediction::parse_prediction;

/// Fields of OpenAI's API (and other servers' extensions) that slotlight refuses, with why.
pub const REFUSED: &[(&str, &str)] = &[
    ("audio", "audio output is not supported"),
    (
        "functions",
        "the deprecated `functions` API is not supported; use `tools`",
    ),
    (
        "function_call",
        "the deprecated `function_call` is not supported; use `tool_choice`",
    ),
    (
        "reasoning_effort",
        "`reasoning_effort` is not supported; thinking templates are switched through `chat_template_kwargs` (e.g. `{\"enable_thinking\": false}`)",
    ),
    ("verbosity", "`verbosity` is not supported"),
    ("web_search_options", "web search is not supported"),
    (
        "metadata",
        "`metadata` belongs to stored completions, which are not supported",
    ),
    (
        "suffix",
        "insertion (`suffix`) is not supported by this model",
    ),
    (
        "guided_json",
        "vLLM's `guided_*` fields were replaced by `structured_outputs`; use `structured_outputs.json`",
    ),
    (
        "guided_regex",
        "use `structured_outputs.regex` (vLLM's `guided_*` fields were replaced)",
    ),
    (
        "guided_choice",
        "use `structured_outputs.choice` (vLLM's `guided_*` fields were replaced)",
    ),
    (
        "guided_grammar",
        "use `structured_outputs.grammar` (vLLM's `guided_*` fields were replaced)",
    ),
    (
        "guided_decoding_backend",
        "structured outputs always use llguidance; there is no backend to choose",
    ),
];

impl InputMessage {
    /// Takes message `i` of `messages` apart.
    fn parse(v: Value, i: usize) -> Result<Self, ApiError> {
        let mut b = Fields::new(v, &format!("messages[{i}]."))?;
        let role: Option<String> = b.take("role")?;
        let Some(role) = role else {
            return Err(ApiError::invalid_param(
                &format!("messages[{i}].role"),
                "every message needs a `role`",
            ));
        };
        let m = Self {
            path: format!("messages[{i}]"),
            role,
            content: b.take("content")?,
            name: b.take("name")?,
            tool_calls: b.take("tool_calls")?,
            tool_call_id: b.take("tool_call_id")?,
            reasoning_content: b
                .take::<String>("reasoning_content")?
                .filter(|r| !r.is_empty()),
        };
        // Fields a client echoes back from an earlier response; empty ones carry nothing.
        for key in ["refusal", "audio", "function_call", "annotations"] {
            b.refuse_unless(
                key,
                |v| v.as_array().is_some_and(Vec::is_empty) || v.as_str() == Some(""),
                "is not supported in messages",
            )?;
        }
        b.finish()?;
        Ok(m)
    }
}

impl Common {
    fn parse(b: &mut Fields) -> Result<Self, ApiError> {
        let stream_options = match b.take_value("stream_options") {
            None => None,
            Some(v) => {
                let mut so = Fields::new(v, "stream_options.")?;
                let r = StreamOptions {
                    include_usage: so.take("include_usage")?.unwrap_or(false),
                    continuous_usage_stats: so.take("continuous_usage_stats")?.unwrap_or(false),
                };
                so.refuse_unless(
                    "include_obfuscation",
                    |v| v == &Value::Bool(false),
                    "stream obfuscation is not supported",
                )?;
                so.finish()?;
                Some(r)
            }
        };
        let response_format = match b.take_value("response_format") {
            None => None,
            Some(v) => Some(parse_response_format(v)?),
        };
        let structured_outputs = match b.take_value("structured_outputs") {
            None => None,
            Some(v) => Some(parse_structured_outputs(v)?),
        };
        let prediction = match b.take_value("prediction") {
            None => None,
            Some(v) => Some(parse_prediction(v)?),
        };
        let c = Self {
            model: b.take("model")?,
            max_tokens: b.take("max_tokens")?,
            max_completion_tokens: b.take("max_completion_tokens")?,
            temperature: b.take("temperature")?,
            top_p: b.take("top_p")?,
            top_k: b.take("top_k")?,
            min_p: b.take("min_p")?,
            repetition_penalty: b.take("repetition_penalty")?,
            presence_penalty: b.take("presence_penalty")?,
            frequency_penalty: b.take("frequency_penalty")?,
            seed: b.take("seed")?,
            stop: b.take("stop")?,
            n: b.take("n")?,
            stream: b.take("stream")?.unwrap_or(false),
            stream_options,
            user: b.take("user")?,
            safety_identifier: b.take("safety_identifier")?,
            prompt_cache_key: b.take("prompt_cache_key")?,
            previous_response_id: None,
            ignore_eos: b.take("ignore_eos")?.unwrap_or(false),
            return_progress: b.take("return_progress")?.unwrap_or(false),
            logit_bias: b.take("logit_bias")?,
            response_format,
            structured_outputs,
            json_schema: b.take_value("json_schema"),
            grammar: b.take("grammar")?,
            prediction,
        };
        // Settings that match what slotlight always does are accepted; others are refused.
        b.refuse_unless(
            "store",
            |v| v == &Value::Bool(false),
            "stored completions are not supported (only `store: false`)",
        )?;
        b.refuse_unless(
            "service_tier",
            |v| matches!(v.as_str(), Some("auto" | "default")),
            "there is one service tier (`auto` or `default`)",
        )?;
        b.refuse_unless(
            "modalities",
            |v| v.as_array().is_some_and(|a| a.iter().all(|m| m == "text")),
            "only the `text` modality is supported",
        )?;
        b.refuse_unless(
            "cache_prompt",
            |v| v == &Value::Bool(true),
            "the prefix cache is always on and cannot be turned off per request",
        )?;
        Ok(c)
    }
}

fn parse_response_format(v: Value) -> Result<ResponseFormat, ApiError> {
    let mut b = Fields::new(v, "response_format.")?;
    let kind: Option<String> = b.take("type")?;
    let r = match kind.as_deref() {
        Some("text") => ResponseFormat::Text,
        Some("json_object") => ResponseFormat::JsonObject(b.take_value("schema")),
        Some("json_schema") => {
            let Some(js) = b.take_value("json_schema") else {
                return Err(ApiError::invalid_param(
                    "response_format.json_schema",
                    "`response_format` of type `json_schema` needs a `json_schema` object",
                ));
            };
            let mut j = Fields::new(js, "response_format.json_schema.")?;
            let _name: Option<String> = j.take("name")?;
            let _description: Option<String> = j.take("description")?;
            // Every schema is enforced by a grammar, so `strict` true or false changes nothing.
            let _strict: Option<bool> = j.take("strict")?;
            let schema = j
                .take_value("schema")
                .unwrap_or_else(|| serde_json::json!({}));
            j.finish()?;
            ResponseFormat::JsonSchema(schema)
        }
        Some(other) => {
            return Err(ApiError::invalid_param(
                "response_format.type",
                format!(
                    "unknown response_format type `{other}` (text, json_object or json_schema)"
                ),
            ));
        }
        None => {
            return Err(ApiError::invalid_param(
                "response_format.type",
                "`response_format` needs a `type`",
            ));
        }
    };
    b.finish()?;
    Ok(r)
}

fn parse_structured_outputs(v: Value) -> Result<StructuredOutputs, ApiError> {
    let mut b = Fields::new(v, "structured_outputs.")?;
    let mut found = Vec::new();
    if let Some(j) = b.take_value("json") {
        let schema = match j {
            Value::String(s) => serde_json::from_str(&s).map_err(|e| {
                ApiError::invalid_param(
                    "structured_outputs.json",
                    format!("`structured_outputs.json` is not a JSON schema: {e}"),
                )
            })?,
            other => other,
        };
        found.push(StructuredOutputs::Json(schema));
    }
    if b.take::<bool>("json_object")?.unwrap_or(false) {
        found.push(StructuredOutputs::JsonObject);
    }
    if let Some(r) = b.take::<String>("regex")? {
        found.push(StructuredOutputs::Regex(r));
    }
    if let Some(c) = b.take::<Vec<String>>("choice")? {
        found.push(StructuredOutputs::Choice(c));
    }
    if let Some(g) = b.take::<String>("grammar")? {
        found.push(StructuredOutputs::Grammar(g));
    }
    // Compact JSON is already what every schema produces.
    b.refuse_unless(
        "disable_any_whitespace",
        |v| v == &Value::Bool(true),
        "generated JSON never has free whitespace; only `true` is supported",
    )?;
    b.refuse_unless(
        "disable_fallback",
        |v| v.is_boolean(),
        "there is no fallback backend",
    )?;
    b.finish()?;
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(ApiError::invalid_param(
            "structured_outputs",
            "`structured_outputs` needs one of `json`, `json_object`, `regex`, `choice` or `grammar`",
        )),
        _ => Err(ApiError::invalid_param(
            "structured_outputs",
            "`structured_outputs` takes only one of `json`, `json_object`, `regex`, `choice` or `grammar`",
        )),
    }
}

impl ChatRequest {
    /// Takes a chat body apart; any field left over is refused.
    pub fn from_json(v: Value) -> Result<Self, ApiError> {
        let mut b = Fields::new(v, "")?;
        let messages = match b.take_value("messages") {
            None => {
                return Err(ApiError::invalid_param(
                    "messages",
                    "`messages` is required",
                ));
            }
            Some(Value::Array(items)) => items
                .into_iter()
                .enumerate()
                .map(|(i, m)| InputMessage::parse(m, i))
                .collect::<Result<Vec<_>, _>>()?,
            Some(other) => {
                return Err(ApiError::invalid_param(
                    "messages",
                    format!("`messages` must be an array, not {}", kind_of(&other)),
                ));
            }
        };
        let tools = match b.take_value("tools") {
            None => None,
            Some(Value::Array(items)) => Some(
                items
                    .into_iter()
                    .enumerate()
                    .map(|(i, t)| parse_tool(t, i))
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            Some(other) => {
                return Err(ApiError::invalid_param(
                    "tools",
                    format!("`tools` must be an array, not {}", kind_of(&other)),
                ));
            }
        };
        let tool_choice = match b.take_value("tool_choice") {
            None => None,
            Some(v) => Some(parse_tool_choice(v)?),
        };
        let chat_template_kwargs = match b.take_value("chat_template_kwargs") {
            None => Map::new(),
            Some(v) => parse_template_kwargs(v)?,
        };
        let r = Self {
            messages,
            common: Common::parse(&mut b)?,
            tools,
            tool_choice,
            parallel_tool_calls: b.take("parallel_tool_calls")?,
            logprobs: b.take("logprobs")?.unwrap_or(false),
            top_logprobs: b.take("top_logprobs")?,
            chat_template_kwargs,
            held_messages: 0,
        };
        b.finish_with(REFUSED)?;
        Ok(r)
    }
}

/// `chat_template_kwargs`: a JSON object of extra template variables. A key naming a variable
/// the server sets itself (`messages`, `tools`, `add_generation_prompt`, `bos_token`,
/// `eos_token`) is refused rather than silently overridden.
fn parse_template_kwargs(v: Value) -> Result<Map<String, Value>, ApiError> {
    const PARAM: &str = "chat_template_kwargs";
    let map = match v {
        Value::Object(map) => map,
        other => {
            return Err(ApiError::invalid_param(
                PARAM,
                format!("`{PARAM}` must be a JSON object, not {}", kind_of(&other)),
            ));
        }
    };
    if let Some(k) = map
        .keys()
        .find(|k| crate::chat_template::STANDARD_VARIABLES.contains(&k.as_str()))
    {
        let p = format!("{PARAM}.{k}");
        return Err(ApiError::invalid_param(
            &p,
            format!(
                "`{p}`: `{k}` is set by the server from the request itself and cannot be given as a template variable"
            ),
        ));
    }
    Ok(map)
}

fn parse_tool(v: Value, i: usize) -> Result<InputTool, ApiError> {
    let mut b = Fields::new(v, &format!("tools[{i}]."))?;
    let kind: Option<String> = b.take("type")?;
    if kind.as_deref() != Some("function") {
        return Err(ApiError::invalid_param(
            &format!("tools[{i}].type"),
            format!(
                "tool type `{}` is not supported (only `function`)",
                kind.unwrap_or_default()
            ),
        ));
    }
    let Some(f) = b.take_value("function") else {
        return Err(ApiError::invalid_param(
            &format!("tools[{i}].function"),
            "a function tool needs a `function` object",
        ));
    };
    b.finish()?;
    let path = format!("tools[{i}].function");
    let mut f = Fields::new(f, &format!("{path}."))?;
    let tool = InputTool::take(&mut f, &path, "parameters")?;
    f.finish()?;
    Ok(tool)
}

fn parse_tool_choice(v: Value) -> Result<InputToolChoice, ApiError> {
    match v {
        Value::String(s) => match s.as_str() {
            "none" => Ok(InputToolChoice::None),
            "auto" => Ok(InputToolChoice::Auto),
            "required" => Ok(InputToolChoice::Required),
            other => Err(ApiError::invalid_param(
                "tool_choice",
                format!("unknown tool_choice `{other}` (none, auto, required or a function)"),
            )),
        },
        obj @ Value::Object(_) => {
            let mut b = Fields::new(obj, "tool_choice.")?;
            let kind: Option<String> = b.take("type")?;
            if kind.as_deref() != Some("function") {
                return Err(ApiError::invalid_param(
                    "tool_choice.type",
                    "a named tool_choice needs `\"type\": \"function\"`",
                ));
            }
            let Some(f) = b.take_value("function") else {
                return Err(ApiError::invalid_param(
                    "tool_choice.function",
                    "a named tool_choice needs `function.name`",
                ));
            };
            b.finish()?;
            let mut f = Fields::new(f, "tool_choice.function.")?;
            let name: Option<String> = f.take("name")?;
            f.finish()?;
            match name {
                Some(n) if !n.is_empty() => Ok(InputToolChoice::Function(n)),
                _ => Err(ApiError::invalid_param(
                    "tool_choice.function.name",
                    "a named tool_choice needs `function.name`",
                )),
            }
        }
        other => Err(ApiError::invalid_param(
            "tool_choice",
            format!(
                "`tool_choice` must be a string or an object, not {}",
                kind_of(&other)
            ),
        )),
    }
}

impl CompletionRequest {
    /// Takes a completion body apart; any field left over is refused.
    pub fn from_json(v: Value) -> Result<Self, ApiError> {
        let mut b = Fields::new(v, "")?;
        let Some(prompt) = b.take::<Prompt>("prompt")? else {
            return Err(ApiError::invalid_param("prompt", "`prompt` is required"));
        };
        let r = Self {
            prompt,
            common: Common::parse(&mut b)?,
            logprobs: b.take("logprobs")?,
            echo: b.take("echo")?.unwrap_or(false),
            best_of: b.take("best_of")?,
        };
        b.finish_with(REFUSED)?;
        Ok(r)
    }
}
