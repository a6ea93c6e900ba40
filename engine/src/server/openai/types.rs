//! OpenAI wire types: request bodies taken apart field by field.
//!
//! Nothing is silently ignored. A body is read as a JSON object and every field is taken out by
//! name, with its own type check (a wrong type is a 400 naming the field in `param`); what is
//! left at the end is refused the same way. Fields of OpenAI's API that slotlight does not
//! implement are refused with a reason ([`REFUSED`]); an explicit `null` asks for nothing and is
//! accepted for any field (several clients write every unset optional field as `null`).
//! `docs/api.md` lists every field and what happens to it.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::super::error::ApiError;
use crate::chat_template::Role;

/// Limits on what a request may ask for.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Most messages in a chat.
    pub max_messages: usize,
    /// Longest message content, in bytes.
    pub max_message_bytes: usize,
    /// Most stop strings.
    pub max_stop: usize,
    /// The largest `max_tokens` a request may ask for; more is refused.
    pub max_tokens: usize,
    /// `max_tokens` when the request gives none.
    pub default_max_tokens: usize,
    /// The most choices (`n`) one request may ask for; more is refused.
    pub max_n: usize,
    /// Most tools in one request.
    pub max_tools: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_messages: 512,
            max_message_bytes: 256 * 1024,
            max_stop: crate::stop::MAX_STOP_STRINGS,
            max_tokens: 4096,
            default_max_tokens: 256,
            max_n: 16,
            max_tools: 128,
        }
    }
}

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

/// A request body being taken apart.
#[derive(Debug)]
pub struct Body {
    map: Map<String, Value>,
    /// The path of this object in the request (`""` at the top, `stream_options.` inside).
    prefix: String,
}

impl Body {
    /// The body, which must be a JSON object.
    pub fn new(v: Value, prefix: &str) -> Result<Self, ApiError> {
        match v {
            Value::Object(map) => Ok(Self {
                map,
                prefix: prefix.to_string(),
            }),
            other => {
                let what = if prefix.is_empty() {
                    "the request body".to_string()
                } else {
                    format!("`{}`", prefix.trim_end_matches('.'))
                };
                let err = format!("{what} must be a JSON object, not {}", kind_of(&other));
                if prefix.is_empty() {
                    Err(ApiError::invalid(err))
                } else {
                    Err(ApiError::invalid_param(prefix.trim_end_matches('.'), err))
                }
            }
        }
    }

    fn path(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// Takes `key` as a `T`; absent or `null` is `None`, a wrong type is a 400 naming it.
    pub fn take<T: DeserializeOwned>(&mut self, key: &str) -> Result<Option<T>, ApiError> {
        match self.map.remove(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => serde_json::from_value(v).map(Some).map_err(|e| {
                let p = self.path(key);
                ApiError::invalid_param(&p, format!("`{p}`: {e}"))
            }),
        }
    }

    /// Takes `key` as a raw JSON value (absent or `null` is `None`).
    pub fn take_value(&mut self, key: &str) -> Option<Value> {
        self.map.remove(key).filter(|v| !v.is_null())
    }

    /// Takes `key`, refusing it unless `accepted` holds for its value.
    pub fn refuse_unless(
        &mut self,
        key: &str,
        accepted: impl Fn(&Value) -> bool,
        why: &str,
    ) -> Result<(), ApiError> {
        match self.map.remove(key) {
            Some(v) if !v.is_null() && !accepted(&v) => {
                let p = self.path(key);
                let mut e = ApiError::invalid_param(&p, format!("`{p}`: {why}"));
                e.code = Some("unsupported_parameter");
                Err(e)
            }
            _ => Ok(()),
        }
    }

    /// Refuses whatever is left: [`REFUSED`] fields with their reason, others as unknown.
    pub fn finish(mut self) -> Result<(), ApiError> {
        self.map.retain(|_, v| !v.is_null());
        let Some(key) = self.map.keys().next().cloned() else {
            return Ok(());
        };
        let p = self.path(&key);
        let why = REFUSED
            .iter()
            .find(|(k, _)| self.prefix.is_empty() && *k == key)
            .map_or_else(
                || {
                    format!(
                        "unknown field `{p}`: slotlight refuses fields it does not implement rather than ignore them"
                    )
                },
                |(_, why)| format!("`{p}`: {why}"),
            );
        let mut e = ApiError::invalid_param(&p, why);
        e.code = Some("unsupported_parameter");
        Err(e)
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Message content: a string or a list of parts (only text parts are supported).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// The content as one string.
    Text(String),
    /// The content as a list of parts, whose texts are joined (only text parts are accepted).
    Parts(Vec<ContentPart>),
}

/// One content part.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    /// Part type (`text`).
    #[serde(rename = "type")]
    pub kind: String,
    /// Text of a text part.
    pub text: Option<String>,
}

/// A tool call in an assistant message of the history.
#[derive(Debug, Clone, Deserialize)]
pub struct WireToolCall {
    /// The call's id, which a later tool message answers by `tool_call_id`.
    pub id: Option<String>,
    /// The call's type; only `function` is accepted.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// The function called and its arguments.
    pub function: WireFunctionCall,
}

/// The function part of a tool call.
#[derive(Debug, Clone, Deserialize)]
pub struct WireFunctionCall {
    /// The name of the function that was called.
    pub name: String,
    /// Arguments, a JSON text (an object is accepted too).
    pub arguments: Value,
}

/// One chat message.
#[derive(Debug, Clone)]
pub struct WireMessage {
    /// `system`, `developer`, `user`, `assistant` or `tool`.
    pub role: String,
    /// Content (may be null for an assistant message with tool calls).
    pub content: Option<Content>,
    /// Optional author name.
    pub name: Option<String>,
    /// An assistant's tool calls.
    pub tool_calls: Option<Vec<WireToolCall>>,
    /// A tool message's call id.
    pub tool_call_id: Option<String>,
    /// An assistant's reasoning from an earlier reply, echoed back (an empty string is none).
    pub reasoning_content: Option<String>,
}

impl WireMessage {
    /// The author of the message, when `role` names one the API knows (`developer` is the
    /// newer name of `system`).
    pub fn author(&self) -> Option<Role> {
        match self.role.as_str() {
            "system" | "developer" => Some(Role::System),
            "user" => Some(Role::User),
            "assistant" => Some(Role::Assistant),
            "tool" => Some(Role::Tool),
            _ => None,
        }
    }

    fn parse(v: Value, i: usize) -> Result<Self, ApiError> {
        let mut b = Body::new(v, &format!("messages[{i}]."))?;
        let role: Option<String> = b.take("role")?;
        let Some(role) = role else {
            return Err(ApiError::invalid_param(
                &format!("messages[{i}].role"),
                "every message needs a `role`",
            ));
        };
        let m = Self {
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

/// A string or a list of strings (`stop`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StringOrList {
    /// A single stop string.
    One(String),
    /// A list of strings, as given.
    Many(Vec<String>),
}

impl StringOrList {
    /// The stop strings as a list, whichever form they were sent in.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            StringOrList::One(s) => vec![s],
            StringOrList::Many(v) => v,
        }
    }
}

/// What a streamed response adds (`stream_options`).
#[derive(Debug, Clone, Default)]
pub struct StreamOptions {
    /// Send a final chunk with `usage` (and empty `choices`) before `[DONE]`.
    pub include_usage: bool,
    /// Attach `usage` to every chunk (vLLM's extension).
    pub continuous_usage_stats: bool,
}

/// A tool definition as sent.
#[derive(Debug, Clone)]
pub struct WireTool {
    /// The function's name.
    pub name: String,
    /// What the function does, for the model (rendered into the prompt).
    pub description: Option<String>,
    /// Its arguments' JSON schema.
    pub parameters: Option<Value>,
}

/// `tool_choice` as sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireToolChoice {
    /// `none`: the model must not call a tool.
    None,
    /// `auto`: the model decides whether to call a tool.
    Auto,
    /// `required`: the model must call at least one tool.
    Required,
    /// `{"type": "function", "function": {"name": ...}}`.
    Function(String),
}

/// `response_format` as sent.
#[derive(Debug, Clone, PartialEq)]
pub enum ResponseFormat {
    /// `{"type": "text"}`.
    Text,
    /// `{"type": "json_object"}`; llama.cpp also takes a `schema` here.
    JsonObject(Option<Value>),
    /// `{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`.
    JsonSchema(Value),
}

/// vLLM's `structured_outputs` as sent: exactly one of its kinds.
#[derive(Debug, Clone, PartialEq)]
pub enum StructuredOutputs {
    /// `json`: a JSON schema (an object, or its JSON text).
    Json(Value),
    /// `json_object: true`.
    JsonObject,
    /// `regex`: the output must match this regular expression.
    Regex(String),
    /// `choice`: the output must be exactly one of these strings.
    Choice(Vec<String>),
    /// `grammar` (Lark).
    Grammar(String),
}

/// Sampling, limits and output fields shared by chat and completions.
#[derive(Debug, Clone, Default)]
pub struct Common {
    /// The model the client asks for (`gen_ai.request.model`).
    pub model: Option<String>,
    /// Completion token limit (legacy name).
    pub max_tokens: Option<i64>,
    /// The most tokens to generate per choice (`max_completion_tokens`, OpenAI's current name).
    pub max_completion_tokens: Option<i64>,
    /// `temperature`, as given (checked by validation; `None` takes the default).
    pub temperature: Option<f32>,
    /// `top_p`: sample only from the most likely tokens whose probabilities add up to this.
    pub top_p: Option<f32>,
    /// `top_k` (extension): sample only from this many most likely tokens.
    pub top_k: Option<i64>,
    /// `min_p` (extension): drop tokens less likely than this fraction of the most likely one.
    pub min_p: Option<f32>,
    /// Repetition penalty (extension).
    pub repetition_penalty: Option<f32>,
    /// `presence_penalty`: lowers the logit of every token already generated, once.
    pub presence_penalty: Option<f32>,
    /// `frequency_penalty`: lowers a token's logit by this much per time it was generated.
    pub frequency_penalty: Option<f32>,
    /// `seed`, as given: makes sampling reproducible.
    pub seed: Option<i64>,
    /// `stop`: strings that end a choice when generated (they are not sent).
    pub stop: Option<StringOrList>,
    /// `n`: how many choices to generate for the one prompt.
    pub n: Option<i64>,
    /// Stream as server-sent events.
    pub stream: bool,
    /// `stream_options`: what a streamed response adds (usage chunks).
    pub stream_options: Option<StreamOptions>,
    /// End-user id (also the session id when no `x-session-id` header is sent).
    pub user: Option<String>,
    /// OpenAI's replacement for `user` as an end-user id.
    pub safety_identifier: Option<String>,
    /// OpenAI's cache routing key: the session (affinity to the group holding the prefix).
    pub prompt_cache_key: Option<String>,
    /// Keep generating past end-of-sequence tokens (extension).
    pub ignore_eos: bool,
    /// llama.cpp's `return_progress`: a stream also carries `prompt_progress` chunks while the
    /// prompt is prefilled (ignored without `stream`).
    pub return_progress: bool,
    /// `logit_bias`: token id → bias.
    pub logit_bias: Option<BTreeMap<String, f32>>,
    /// `response_format`: OpenAI's way to ask for JSON output (a schema or any object).
    pub response_format: Option<ResponseFormat>,
    /// vLLM's `structured_outputs`: a JSON schema, a regex, a choice or a grammar.
    pub structured_outputs: Option<StructuredOutputs>,
    /// llama.cpp's `json_schema`: the output must be JSON of this schema.
    pub json_schema: Option<Value>,
    /// llama.cpp's `grammar` (Lark here).
    pub grammar: Option<String>,
    /// `prediction` (OpenAI's Predicted Outputs): the text the client expects the reply to
    /// be, as one string (a list of text parts is joined).
    pub prediction: Option<String>,
}

impl Common {
    fn parse(b: &mut Body) -> Result<Self, ApiError> {
        let stream_options = match b.take_value("stream_options") {
            None => None,
            Some(v) => {
                let mut so = Body::new(v, "stream_options.")?;
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

/// `prediction`: `{"type": "content", "content": ...}`, the content a string or a list of
/// `{"type": "text", "text": ...}` parts (joined), as OpenAI's Predicted Outputs take it.
fn parse_prediction(v: Value) -> Result<String, ApiError> {
    let mut b = Body::new(v, "prediction.")?;
    let kind: Option<String> = b.take("type")?;
    if kind.as_deref() != Some("content") {
        return Err(ApiError::invalid_param(
            "prediction.type",
            format!(
                "`prediction.type` must be `content`, not `{}`",
                kind.unwrap_or_default()
            ),
        ));
    }
    let text = match b.take::<Content>("content")? {
        None => {
            return Err(ApiError::invalid_param(
                "prediction.content",
                "`prediction` needs a `content`",
            ));
        }
        Some(Content::Text(t)) => t,
        Some(Content::Parts(parts)) => {
            let mut text = String::new();
            for (i, p) in parts.into_iter().enumerate() {
                match (p.kind.as_str(), p.text) {
                    ("text", Some(t)) => text.push_str(&t),
                    _ => {
                        return Err(ApiError::invalid_param(
                            &format!("prediction.content[{i}]"),
                            "a prediction's content parts must be `{\"type\": \"text\", \"text\": ...}`",
                        ));
                    }
                }
            }
            text
        }
    };
    b.finish()?;
    Ok(text)
}

fn parse_response_format(v: Value) -> Result<ResponseFormat, ApiError> {
    let mut b = Body::new(v, "response_format.")?;
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
            let mut j = Body::new(js, "response_format.json_schema.")?;
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
    let mut b = Body::new(v, "structured_outputs.")?;
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

/// `POST /v1/chat/completions` body.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    /// The conversation so far, rendered into the prompt by the chat template.
    pub messages: Vec<WireMessage>,
    /// Sampling, limits and output.
    pub common: Common,
    /// Tools the model may call.
    pub tools: Option<Vec<WireTool>>,
    /// `tool_choice`: whether the model may, must or must not call a tool, or which one.
    pub tool_choice: Option<WireToolChoice>,
    /// `parallel_tool_calls`: false allows at most one tool call per reply.
    pub parallel_tool_calls: Option<bool>,
    /// Return log-probabilities of the output tokens.
    pub logprobs: bool,
    /// How many alternatives per token (0–20; needs `logprobs`).
    pub top_logprobs: Option<i64>,
    /// Extra variables for the chat template (HF's `chat_template_kwargs`, e.g.
    /// `{"enable_thinking": false}`), checked: an object whose keys are not variables the
    /// server sets itself.
    pub chat_template_kwargs: Map<String, Value>,
}

impl ChatRequest {
    /// Takes a chat body apart; any field left over is refused.
    pub fn from_json(v: Value) -> Result<Self, ApiError> {
        let mut b = Body::new(v, "")?;
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
                .map(|(i, m)| WireMessage::parse(m, i))
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
        };
        b.finish()?;
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

fn parse_tool(v: Value, i: usize) -> Result<WireTool, ApiError> {
    let mut b = Body::new(v, &format!("tools[{i}]."))?;
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
    let mut f = Body::new(f, &format!("tools[{i}].function."))?;
    let name: Option<String> = f.take("name")?;
    let name = name.unwrap_or_default();
    let valid = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.');
    if !valid {
        return Err(ApiError::invalid_param(
            &format!("tools[{i}].function.name"),
            format!("invalid function name `{name}`: 1 to 64 letters, digits, `_`, `-` or `.`"),
        ));
    }
    let description: Option<String> = f.take("description")?;
    let parameters = f.take_value("parameters");
    if let Some(p) = &parameters
        && !p.is_object()
    {
        return Err(ApiError::invalid_param(
            &format!("tools[{i}].function.parameters"),
            "`parameters` must be a JSON schema object",
        ));
    }
    // Arguments are always enforced by a grammar when a call is required; `strict` adds nothing.
    let _strict: Option<bool> = f.take("strict")?;
    f.finish()?;
    Ok(WireTool {
        name,
        description,
        parameters,
    })
}

fn parse_tool_choice(v: Value) -> Result<WireToolChoice, ApiError> {
    match v {
        Value::String(s) => match s.as_str() {
            "none" => Ok(WireToolChoice::None),
            "auto" => Ok(WireToolChoice::Auto),
            "required" => Ok(WireToolChoice::Required),
            other => Err(ApiError::invalid_param(
                "tool_choice",
                format!("unknown tool_choice `{other}` (none, auto, required or a function)"),
            )),
        },
        obj @ Value::Object(_) => {
            let mut b = Body::new(obj, "tool_choice.")?;
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
            let mut f = Body::new(f, "tool_choice.function.")?;
            let name: Option<String> = f.take("name")?;
            f.finish()?;
            match name {
                Some(n) if !n.is_empty() => Ok(WireToolChoice::Function(n)),
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

/// A prompt: text, a list of one text, or token ids.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// Plain text content.
    Text(String),
    /// Texts (only one is supported).
    Texts(Vec<String>),
    /// The prompt as token ids, taken as they are.
    Tokens(Vec<u32>),
    /// Lists of token ids (only one is supported).
    TokenLists(Vec<Vec<u32>>),
}

/// `POST /v1/completions` body.
#[derive(Debug, Clone)]
pub struct CompletionRequest {
    /// The text (or token ids) to continue.
    pub prompt: Prompt,
    /// Sampling, limits and output.
    pub common: Common,
    /// Legacy `logprobs`: how many alternatives per token (0–20), or none.
    pub logprobs: Option<i64>,
    /// Return the prompt before the completion.
    pub echo: bool,
    /// `best_of` (only equal to `n`).
    pub best_of: Option<i64>,
}

impl CompletionRequest {
    /// Takes a completion body apart; any field left over is refused.
    pub fn from_json(v: Value) -> Result<Self, ApiError> {
        let mut b = Body::new(v, "")?;
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
        b.finish()?;
        Ok(r)
    }
}
