//! A request as every API hands it to the one request path: the conversation (messages, tools,
//! tool choice), or the prompt to continue, and the sampling, limit and output options, each as
//! the client asked for it and not yet checked. The front doors ([`crate::server::openai`], and
//! the others beside it) take their wire bodies apart into these; [`super::validate`] checks them.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::chat_template::Role;
use crate::server::body::Fields;
use crate::server::error::ApiError;

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
pub struct InputToolCall {
    /// The call's id, which a later tool message answers by `tool_call_id`.
    pub id: Option<String>,
    /// The call's type; only `function` is accepted.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// The function called and its arguments.
    pub function: InputFunctionCall,
}

/// The function part of a tool call.
#[derive(Debug, Clone, Deserialize)]
pub struct InputFunctionCall {
    /// The name of the function that was called.
    pub name: String,
    /// Arguments, a JSON text (an object is accepted too).
    pub arguments: Value,
}

/// One chat message.
#[derive(Debug, Clone)]
pub struct InputMessage {
    /// Where the message is in the request as the client sent it (`messages[3]`,
    /// `input[5]`): errors about it name this path.
    pub path: String,
    /// `system`, `developer`, `user`, `assistant` or `tool`.
    pub role: String,
    /// Content (may be null for an assistant message with tool calls).
    pub content: Option<Content>,
    /// Optional author name.
    pub name: Option<String>,
    /// An assistant's tool calls.
    pub tool_calls: Option<Vec<InputToolCall>>,
    /// A tool message's call id.
    pub tool_call_id: Option<String>,
    /// An assistant's reasoning from an earlier reply, echoed back (an empty string is none).
    pub reasoning_content: Option<String>,
}

impl InputMessage {
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
pub struct InputTool {
    /// The request field of the tool's name as the client sent it
    /// (`tools[2].function.name`, `tools[2].name`): errors about the name name it.
    pub name_param: String,
    /// The function's name.
    pub name: String,
    /// What the function does, for the model (rendered into the prompt).
    pub description: Option<String>,
    /// Its arguments' JSON schema.
    pub parameters: Option<Value>,
}

impl InputTool {
    /// Takes a function tool's fields out of `f`, the object at `path` (`tools[2].function`,
    /// `tools[2]`): its `name` (1 to 64 letters, digits, `_`, `-` or `.`), `description`, the
    /// arguments' JSON schema under `schema_key` (`parameters`, Anthropic's `input_schema`),
    /// and `strict` (arguments are enforced by a grammar whenever a call is required, so it adds
    /// nothing). Errors name the field.
    pub fn take(f: &mut Fields, path: &str, schema_key: &str) -> Result<Self, ApiError> {
        let name: String = f.take("name")?.unwrap_or_default();
        let name_param = format!("{path}.name");
        let valid = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.');
        if !valid {
            return Err(ApiError::invalid_param(
                &name_param,
                format!("invalid function name `{name}`: 1 to 64 letters, digits, `_`, `-` or `.`"),
            ));
        }
        let description: Option<String> = f.take("description")?;
        let parameters = f.take_value(schema_key);
        if let Some(p) = &parameters
            && !p.is_object()
        {
            return Err(ApiError::invalid_param(
                &format!("{path}.{schema_key}"),
                format!("`{schema_key}` must be a JSON schema object"),
            ));
        }
        let _strict: Option<bool> = f.take("strict")?;
        Ok(Self {
            name_param,
            name,
            description,
            parameters,
        })
    }
}

/// `tool_choice` as sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputToolChoice {
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
    /// The stored response a Responses request continues (`previous_response_id`).
    pub previous_response_id: Option<String>,
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

/// `POST /v1/chat/completions` body.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    /// The conversation so far, rendered into the prompt by the chat template.
    pub messages: Vec<InputMessage>,
    /// Sampling, limits and output.
    pub common: Common,
    /// Tools the model may call.
    pub tools: Option<Vec<InputTool>>,
    /// `tool_choice`: whether the model may, must or must not call a tool, or which one.
    pub tool_choice: Option<InputToolChoice>,
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
    /// How many of `messages` the server held rather than the client sent (a stored Responses
    /// chain's history): they are not counted against `--max-messages`, which bounds what one
    /// request sends.
    pub held_messages: usize,
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
