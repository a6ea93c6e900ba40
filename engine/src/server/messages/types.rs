//! Anthropic's Messages request bodies taken apart field by field into the one request path's
//! input ([`crate::server::request::input`]), plus what only this API has ([`MessagesRequest`]).
//!
//! Every field the current anthropic SDK (messages and beta messages) and Claude Code send is
//! taken by name: honored where it means something on a local engine, accepted and documented
//! as ignored where it does not (`container`, `inference_geo`, `service_tier`, `speed`,
//! `context_management`, …). A wrong type is a 400 naming the field; a field no SDK sends is
//! refused as unknown. Two beta operations that cannot be answered truthfully are refused with
//! their reason: a `compaction` request (it asks for a summary block, not a reply) and
//! `thread: {"type": "continue"}` (server-held conversation state). `docs/api.md` lists every
//! field and what happens to it.
//!
//! The conversation becomes chat messages: `system` (a string or text blocks) leads; a
//! `system` message inside `messages` joins it when no turn came before, else joins the user
//! turn around it (templates such as Gemma's take system text only at the start);
//! consecutive turns of one role are combined into one (as Anthropic documents); text blocks
//! of a turn are joined by a blank line; `tool_use` blocks become the assistant's tool calls,
//! `tool_result` blocks tool messages; `thinking` blocks the assistant's reasoning (their
//! signature checked, see [`super::signature`]); `redacted_thinking` blocks carry nothing a
//! prompt can show and are left out. `image`, `document` and the blocks of Anthropic's server
//! tools are refused, naming the block.

use std::time::Duration;

use serde_json::{Map, Value, json};

use super::signature::Signer;
use crate::server::body::{Fields, kind_of};
use crate::server::error::ApiError;
use crate::server::request::input::{
    ChatRequest, Common, Content, InputFunctionCall, InputMessage, InputTool, InputToolCall,
    InputToolChoice, ResponseFormat, StringOrList,
};
use crate::server::request::prediction::parse_prediction;

/// Which route a body came to: `POST /v1/messages` requires `max_tokens`;
/// `POST /v1/messages/count_tokens` takes the same body without it (and ignores `compaction`,
/// as Anthropic does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/messages`.
    Create,
    /// `POST /v1/messages/count_tokens`.
    CountTokens,
}

/// `thinking.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThinkingMode {
    /// `enabled`, with `budget_tokens` (bounded by `max_tokens`, not enforced apart).
    Enabled {
        /// The budget asked for.
        budget_tokens: i64,
    },
    /// `adaptive`: the model decides.
    Adaptive,
    /// `between_tools`: thinking between tool calls.
    BetweenTools,
    /// `disabled`.
    Disabled,
}

impl ThinkingMode {
    /// Whether the template's thinking switch is on for this mode.
    pub fn on(self) -> bool {
        !matches!(self, ThinkingMode::Disabled)
    }
}

/// `thinking` as sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thinking {
    /// Its `type`.
    pub mode: ThinkingMode,
    /// `display: "omitted"`: thinking blocks come back with empty text and a signature that
    /// carries it.
    pub omitted: bool,
}

/// A `cache_control` breakpoint's `ttl`, the longest of the request's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CacheTtl {
    /// `5m` (the default).
    FiveMinutes,
    /// `1h`.
    OneHour,
}

/// The parts of the request a prompt is built from, as sent (the cache diagnostics compare
/// their fingerprints).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SectionsSent {
    /// The system prompt's text, as it leads the prompt.
    pub system: String,
    /// `tools`, as sent.
    pub tools: Value,
    /// The output format's schema, when one is asked for.
    pub format: Option<Value>,
    /// The other options that shape the prompt: `tool_choice`, `thinking`,
    /// `output_config.effort`.
    pub options: Value,
}

/// A Messages body taken apart: the conversation on the one request path, and what only this
/// API has.
#[derive(Debug, Clone)]
pub struct MessagesRequest {
    /// The conversation, tools and options, as every API hands them to the request path.
    /// `common.max_tokens` is `max_tokens` as asked (the door clamps it).
    pub chat: ChatRequest,
    /// `max_tokens` as asked; `None` only on `count_tokens`.
    pub max_tokens: Option<i64>,
    /// `thinking`, when sent.
    pub thinking: Option<Thinking>,
    /// `output_config.effort`, when sent.
    pub effort: Option<String>,
    /// `diagnostics`: `None` when not asked for; `Some(None)` when asked without a previous
    /// message (a first turn opting in); `Some(Some(id))` to compare with message `id`.
    pub diagnostics: Option<Option<String>>,
    /// `metadata.user_id`, as sent.
    pub user_id: Option<String>,
    /// The longest `ttl` of the request's `cache_control` breakpoints (top level and blocks).
    pub cache_ttl: Option<CacheTtl>,
    /// The types of the tools offered that the engine cannot run (Anthropic's server and
    /// built-in tools, MCP servers): accepted and left out of the prompt.
    pub tools_skipped: Vec<String>,
    /// What the prompt is built from, for the cache diagnostics.
    pub sections: SectionsSent,
}

/// An error naming `param`, with `message` after it.
fn invalid(param: &str, message: impl std::fmt::Display) -> ApiError {
    ApiError::invalid_param(param, format!("`{param}`: {message}"))
}

/// The block types a message may hold (each in the messages of some roles).
const KNOWN_BLOCKS: &[&str] = &[
    "text",
    "tool_use",
    "tool_result",
    "thinking",
    "redacted_thinking",
];

/// The blocks of Anthropic's server tools and of other inputs slotlight has no model for.
const UNSUPPORTED_BLOCKS: &[&str] = &[
    "image",
    "document",
    "search_result",
    "server_tool_use",
    "web_search_tool_result",
    "web_fetch_tool_result",
    "code_execution_tool_result",
    "bash_code_execution_tool_result",
    "text_editor_code_execution_tool_result",
    "tool_search_tool_result",
    "container_upload",
    "mcp_tool_use",
    "mcp_tool_result",
    "compaction",
];

/// Why a block type is refused.
fn refused_block(kind: &str) -> String {
    match kind {
        "image" | "document" => format!(
            "`{kind}` blocks are not supported: this engine serves a text-only model; send the content as `text`"
        ),
        "search_result" => {
            "`search_result` blocks are not supported; send their text as `text`".to_string()
        }
        other if UNSUPPORTED_BLOCKS.contains(&other) => format!(
            "`{other}` blocks belong to Anthropic's server tools, which this engine does not run"
        ),
        other => format!(
            "unknown block type `{other}` (text, tool_use, tool_result, thinking or redacted_thinking)"
        ),
    }
}

/// Reads the request's `cache_control` objects, keeping the longest `ttl` seen.
#[derive(Debug, Default)]
struct Ttl(Option<CacheTtl>);

impl Ttl {
    fn take(&mut self, b: &mut Fields, path: &str) -> Result<(), ApiError> {
        let Some(v) = b.take_value("cache_control") else {
            return Ok(());
        };
        let p = format!("{path}cache_control");
        let mut c = Fields::new(v, &format!("{p}."))?;
        let kind: Option<String> = c.take("type")?;
        if kind.as_deref() != Some("ephemeral") {
            return Err(invalid(
                &format!("{p}.type"),
                "the only cache_control type is `ephemeral`",
            ));
        }
        let ttl = match c.take::<String>("ttl")?.as_deref() {
            None | Some("5m") => CacheTtl::FiveMinutes,
            Some("1h") => CacheTtl::OneHour,
            Some(other) => {
                return Err(invalid(
                    &format!("{p}.ttl"),
                    format!("unknown ttl `{other}` (`5m` or `1h`)"),
                ));
            }
        };
        c.finish()?;
        self.0 = self.0.max(Some(ttl));
        Ok(())
    }
}

/// The text of a `text` block at `path` (its `citations` are accepted: they annotate the text
/// and change nothing in the prompt).
fn text_block(mut b: Fields, path: &str, ttl: &mut Ttl) -> Result<String, ApiError> {
    let Some(text) = b.take::<String>("text")? else {
        return Err(invalid(
            &format!("{path}.text"),
            "a text block needs `text`",
        ));
    };
    ttl.take(&mut b, &format!("{path}."))?;
    let _citations = b.take_value("citations");
    b.finish()?;
    Ok(text)
}

/// The type of a block, taken out of it.
fn block_type(b: &mut Fields, path: &str) -> Result<String, ApiError> {
    b.take::<String>("type")?.ok_or_else(|| {
        invalid(
            &format!("{path}.type"),
            "every content block needs a `type`",
        )
    })
}

/// `system`: a string, or text blocks joined by a blank line.
fn system_text(v: Value, ttl: &mut Ttl) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s),
        Value::Array(blocks) => {
            let mut parts = Vec::with_capacity(blocks.len());
            for (j, block) in blocks.into_iter().enumerate() {
                let path = format!("system[{j}]");
                let mut b = Fields::new(block, &format!("{path}."))?;
                let kind = block_type(&mut b, &path)?;
                if kind != "text" {
                    return Err(invalid(
                        &path,
                        format!("`system` takes only text blocks, not `{kind}`"),
                    ));
                }
                parts.push(text_block(b, &path, ttl)?);
            }
            Ok(parts.join("\n\n"))
        }
        other => Err(invalid(
            "system",
            format!(
                "must be a string or a list of text blocks, not {}",
                kind_of(&other)
            ),
        )),
    }
}

/// The content of a `tool_result` block: a string, or text blocks (Claude Code's
/// `tool_reference` blocks are given as their JSON text).
fn tool_result_content(v: Value, path: &str, ttl: &mut Ttl) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s),
        Value::Array(blocks) => {
            let mut parts = Vec::with_capacity(blocks.len());
            for (k, block) in blocks.into_iter().enumerate() {
                let p = format!("{path}.content[{k}]");
                let mut b = Fields::new(block, &format!("{p}."))?;
                let kind = block_type(&mut b, &p)?;
                match kind.as_str() {
                    "text" => parts.push(text_block(b, &p, ttl)?),
                    "tool_reference" => {
                        let Some(name) = b.take::<String>("tool_name")? else {
                            return Err(invalid(
                                &format!("{p}.tool_name"),
                                "a tool_reference block needs `tool_name`",
                            ));
                        };
                        ttl.take(&mut b, &format!("{p}."))?;
                        b.finish()?;
                        parts
                            .push(json!({"type": "tool_reference", "tool_name": name}).to_string());
                    }
                    other => return Err(invalid(&p, refused_block(other))),
                }
            }
            Ok(parts.join("\n\n"))
        }
        other => Err(invalid(
            &format!("{path}.content"),
            format!(
                "must be a string or a list of blocks, not {}",
                kind_of(&other)
            ),
        )),
    }
}

/// Builds the chat messages from the turns, combining what Anthropic combines.
#[derive(Debug, Default)]
struct Turns {
    out: Vec<InputMessage>,
    /// Whether a user or assistant turn came yet (a `system` message before it joins the
    /// system prompt).
    started: bool,
}

fn message(path: &str, role: &str) -> InputMessage {
    InputMessage {
        path: path.to_string(),
        role: role.to_string(),
        content: None,
        name: None,
        tool_calls: None,
        tool_call_id: None,
        reasoning_content: None,
    }
}

fn append(content: &mut Option<Content>, text: &str) {
    match content {
        Some(Content::Text(t)) if !t.is_empty() => {
            t.push_str("\n\n");
            t.push_str(text);
        }
        _ => *content = Some(Content::Text(text.to_string())),
    }
}

impl Turns {
    /// Text of the system prompt (before any turn).
    fn system(&mut self, path: &str, text: &str) {
        match self.out.first_mut() {
            Some(m) if m.role == "system" => append(&mut m.content, text),
            _ => {
                let mut m = message(path, "system");
                m.content = Some(Content::Text(text.to_string()));
                self.out.insert(0, m);
            }
        }
    }

    /// Text of a user turn, joining the user turn before it.
    fn user(&mut self, path: &str, text: &str) {
        self.started = true;
        match self.out.last_mut() {
            Some(m) if m.role == "user" => append(&mut m.content, text),
            _ => {
                let mut m = message(path, "user");
                m.content = Some(Content::Text(text.to_string()));
                self.out.push(m);
            }
        }
    }

    /// The assistant turn being built (the one before, when it is an assistant's).
    fn assistant(&mut self, path: &str) -> &mut InputMessage {
        self.started = true;
        if self.out.last().is_none_or(|m| m.role != "assistant") {
            self.out.push(message(path, "assistant"));
        }
        let last = self.out.len() - 1;
        &mut self.out[last]
    }

    fn tool_result(&mut self, path: &str, tool_use_id: String, text: String) {
        self.started = true;
        let mut m = message(path, "tool");
        m.tool_call_id = Some(tool_use_id);
        m.content = Some(Content::Text(text));
        self.out.push(m);
    }
}

/// Takes message `i` apart into `turns`.
fn parse_message(
    v: Value,
    i: usize,
    turns: &mut Turns,
    signer: &Signer,
    ttl: &mut Ttl,
) -> Result<(), ApiError> {
    let path = format!("messages[{i}]");
    let mut b = Fields::new(v, &format!("{path}."))?;
    let Some(role) = b.take::<String>("role")? else {
        return Err(invalid(
            &format!("{path}.role"),
            "every message needs a `role`",
        ));
    };
    let Some(content) = b.take_value("content") else {
        return Err(invalid(
            &format!("{path}.content"),
            "every message needs `content`",
        ));
    };
    b.finish()?;
    let blocks = match content {
        Value::String(s) => vec![json!({"type": "text", "text": s})],
        Value::Array(blocks) => blocks,
        other => {
            return Err(invalid(
                &format!("{path}.content"),
                format!(
                    "must be a string or a list of blocks, not {}",
                    kind_of(&other)
                ),
            ));
        }
    };
    for (j, block) in blocks.into_iter().enumerate() {
        let bp = format!("{path}.content[{j}]");
        let mut b = Fields::new(block, &format!("{bp}."))?;
        let kind = block_type(&mut b, &bp)?;
        match (role.as_str(), kind.as_str()) {
            ("system", "text") => {
                let text = text_block(b, &bp, ttl)?;
                if turns.started {
                    turns.user(&path, &text);
                } else {
                    turns.system(&path, &text);
                }
            }
            ("user", "text") => {
                let text = text_block(b, &bp, ttl)?;
                turns.user(&path, &text);
            }
            ("assistant", "text") => {
                let text = text_block(b, &bp, ttl)?;
                append(&mut turns.assistant(&path).content, &text);
            }
            ("user", "tool_result") => {
                let Some(id) = b.take::<String>("tool_use_id")? else {
                    return Err(invalid(
                        &format!("{bp}.tool_use_id"),
                        "a tool_result block needs the `tool_use_id` it answers",
                    ));
                };
                let text = match b.take_value("content") {
                    None => String::new(),
                    Some(c) => tool_result_content(c, &bp, ttl)?,
                };
                let is_error = b.take::<bool>("is_error")?.unwrap_or(false);
                ttl.take(&mut b, &format!("{bp}."))?;
                let _toolset: Option<String> = b.take("toolset_name")?;
                b.finish()?;
                let text = if is_error {
                    format!("Error: {text}")
                } else {
                    text
                };
                turns.tool_result(&bp, id, text);
            }
            ("assistant", "tool_use") => {
                let id: Option<String> = b.take("id")?;
                let Some(name) = b.take::<String>("name")? else {
                    return Err(invalid(
                        &format!("{bp}.name"),
                        "a tool_use block needs the `name` of its tool",
                    ));
                };
                let input = match b.take_value("input") {
                    None => Value::Object(Map::new()),
                    Some(v @ Value::Object(_)) => v,
                    Some(other) => {
                        return Err(invalid(
                            &format!("{bp}.input"),
                            format!("must be an object, not {}", kind_of(&other)),
                        ));
                    }
                };
                ttl.take(&mut b, &format!("{bp}."))?;
                let _caller = b.take_value("caller");
                let _toolset: Option<String> = b.take("toolset_name")?;
                b.finish()?;
                turns
                    .assistant(&path)
                    .tool_calls
                    .get_or_insert_with(Vec::new)
                    .push(InputToolCall {
                        id,
                        kind: Some("function".into()),
                        function: InputFunctionCall {
                            name,
                            arguments: input,
                        },
                    });
            }
            ("assistant", "thinking") => {
                let thinking: String = b.take("thinking")?.unwrap_or_default();
                let Some(signature) = b.take::<String>("signature")? else {
                    return Err(invalid(
                        &format!("{bp}.signature"),
                        "a thinking block needs the `signature` it was returned with",
                    ));
                };
                b.finish()?;
                let text = signer
                    .verify(&thinking, &signature)
                    .map_err(|e| invalid(&format!("{bp}.signature"), e))?;
                let m = turns.assistant(&path);
                match &mut m.reasoning_content {
                    Some(r) => r.push_str(&text),
                    None => m.reasoning_content = Some(text),
                }
            }
            ("assistant", "redacted_thinking") => {
                // Opaque data no engine of ours wrote: nothing a prompt can show.
                let _data: Option<String> = b.take("data")?;
                b.finish()?;
                turns.assistant(&path);
            }
            ("user" | "assistant" | "system", k) => {
                let why = if KNOWN_BLOCKS.contains(&k) {
                    let allowed = match role.as_str() {
                        "user" => "text, tool_result",
                        "assistant" => "text, tool_use, thinking, redacted_thinking",
                        _ => "text",
                    };
                    format!("a `{role}` message cannot hold a `{k}` block (it takes {allowed})")
                } else {
                    refused_block(k)
                };
                return Err(invalid(&bp, why));
            }
            (other, _) => {
                return Err(invalid(
                    &format!("{path}.role"),
                    format!("unknown role `{other}` (user, assistant or system)"),
                ));
            }
        }
    }
    Ok(())
}

/// One entry of `tools`: a custom tool, or the type of a tool the engine cannot run.
enum ToolEntry {
    Custom(InputTool),
    /// Left out of the prompt by the client's own choice (`defer_loading: true`).
    Deferred,
    Skipped(String),
}

fn parse_tool(v: Value, i: usize, ttl: &mut Ttl) -> Result<ToolEntry, ApiError> {
    let path = format!("tools[{i}]");
    let mut b = Fields::new(v, &format!("{path}."))?;
    let kind: Option<String> = b.take("type")?;
    if let Some(k) = kind.filter(|k| k != "custom") {
        // Anthropic's server and built-in tools (`web_search_20250305`, `bash_20250124`, …):
        // their definitions are Anthropic's own; the engine leaves them out of the prompt.
        return Ok(ToolEntry::Skipped(k));
    }
    // The shared parser of a function tool (name, description, schema, `strict`).
    let tool = InputTool::take(&mut b, &path, "input_schema")?;
    if tool.parameters.is_none() {
        return Err(invalid(
            &format!("{path}.input_schema"),
            "a tool needs an `input_schema`",
        ));
    }
    ttl.take(&mut b, &format!("{path}."))?;
    let deferred = b.take::<bool>("defer_loading")?.unwrap_or(false);
    let _callers = b.take_value("allowed_callers");
    let _eager: Option<bool> = b.take("eager_input_streaming")?;
    let _examples = b.take_value("input_examples");
    b.finish()?;
    if deferred {
        return Ok(ToolEntry::Deferred);
    }
    Ok(ToolEntry::Custom(tool))
}

/// `tool_choice`, and whether it forbids parallel calls.
fn parse_tool_choice(v: Value) -> Result<(InputToolChoice, Option<bool>), ApiError> {
    let mut b = Fields::new(v, "tool_choice.")?;
    let kind: Option<String> = b.take("type")?;
    let choice = match kind.as_deref() {
        Some("auto") => InputToolChoice::Auto,
        Some("any") => InputToolChoice::Required,
        Some("none") => InputToolChoice::None,
        Some("tool") => match b.take::<String>("name")? {
            Some(n) if !n.is_empty() => InputToolChoice::Function(n),
            _ => {
                return Err(invalid(
                    "tool_choice.name",
                    "a tool_choice of type `tool` needs the `name` of the tool",
                ));
            }
        },
        Some(other) => {
            return Err(invalid(
                "tool_choice.type",
                format!("unknown tool_choice type `{other}` (auto, any, tool or none)"),
            ));
        }
        None => return Err(invalid("tool_choice.type", "tool_choice needs a `type`")),
    };
    let disable: Option<bool> = b.take("disable_parallel_tool_use")?;
    b.finish()?;
    Ok((choice, disable.map(|d| !d)))
}

fn parse_thinking(v: Value) -> Result<Thinking, ApiError> {
    let mut b = Fields::new(v, "thinking.")?;
    let kind: Option<String> = b.take("type")?;
    let mode = match kind.as_deref() {
        Some("enabled") => {
            let Some(budget_tokens) = b.take::<i64>("budget_tokens")? else {
                return Err(invalid(
                    "thinking.budget_tokens",
                    "`enabled` thinking needs `budget_tokens`",
                ));
            };
            if budget_tokens < 1 {
                return Err(invalid(
                    "thinking.budget_tokens",
                    format!("must be at least 1 (got {budget_tokens})"),
                ));
            }
            ThinkingMode::Enabled { budget_tokens }
        }
        Some("adaptive") => ThinkingMode::Adaptive,
        Some("between_tools") => ThinkingMode::BetweenTools,
        Some("disabled") => ThinkingMode::Disabled,
        Some(other) => {
            return Err(invalid(
                "thinking.type",
                format!(
                    "unknown thinking type `{other}` (enabled, adaptive, between_tools or disabled)"
                ),
            ));
        }
        None => return Err(invalid("thinking.type", "thinking needs a `type`")),
    };
    let omitted = match b.take::<String>("display")?.as_deref() {
        None | Some("summarized") => false,
        Some("omitted") => true,
        Some(other) => {
            return Err(invalid(
                "thinking.display",
                format!("unknown display `{other}` (summarized or omitted)"),
            ));
        }
    };
    b.finish()?;
    Ok(Thinking { mode, omitted })
}

/// A `json_schema` output format at `path`: its schema.
fn parse_format(v: Value, path: &str) -> Result<Value, ApiError> {
    let mut f = Fields::new(v, &format!("{path}."))?;
    let kind: Option<String> = f.take("type")?;
    if kind.as_deref() != Some("json_schema") {
        return Err(invalid(
            &format!("{path}.type"),
            "the only output format is `json_schema`",
        ));
    }
    let schema = match f.take_value("schema") {
        Some(s @ Value::Object(_)) => s,
        Some(other) => {
            return Err(invalid(
                &format!("{path}.schema"),
                format!("must be a JSON schema object, not {}", kind_of(&other)),
            ));
        }
        None => {
            return Err(invalid(
                &format!("{path}.schema"),
                "a json_schema format needs its `schema`",
            ));
        }
    };
    f.finish()?;
    Ok(schema)
}

/// `output_config`: `effort`, `format` (`task_budget` is accepted and ignored).
fn parse_output_config(v: Value) -> Result<(Option<String>, Option<Value>), ApiError> {
    let mut b = Fields::new(v, "output_config.")?;
    let effort: Option<String> = b.take("effort")?;
    if let Some(e) = &effort
        && !["low", "medium", "high", "xhigh", "max"].contains(&e.as_str())
    {
        return Err(invalid(
            "output_config.effort",
            format!("unknown effort `{e}` (low, medium, high, xhigh or max)"),
        ));
    }
    let format = match b.take_value("format") {
        None => None,
        Some(f) => Some(parse_format(f, "output_config.format")?),
    };
    let _task_budget = b.take_value("task_budget");
    b.finish()?;
    Ok((effort, format))
}

impl MessagesRequest {
    /// Takes a Messages body apart; thinking blocks coming back are checked with `signer`.
    pub fn from_json(v: Value, endpoint: Endpoint, signer: &Signer) -> Result<Self, ApiError> {
        let mut b = Fields::new(v, "")?;
        let mut ttl = Ttl::default();
        ttl.take(&mut b, "")?;
        let model: Option<String> = b.take("model")?;
        let max_tokens: Option<i64> = b.take("max_tokens")?;
        if endpoint == Endpoint::Create && max_tokens.is_none() {
            return Err(invalid("max_tokens", "is required"));
        }
        let mut turns = Turns::default();
        let system = match b.take_value("system") {
            None => String::new(),
            Some(v) => system_text(v, &mut ttl)?,
        };
        if !system.is_empty() {
            turns.system("system", &system);
        }
        match b.take_value("messages") {
            None => return Err(invalid("messages", "is required")),
            Some(Value::Array(items)) => {
                for (i, m) in items.into_iter().enumerate() {
                    parse_message(m, i, &mut turns, signer, &mut ttl)?;
                }
            }
            Some(other) => {
                return Err(invalid(
                    "messages",
                    format!("must be an array, not {}", kind_of(&other)),
                ));
            }
        }
        if let Some(last) = turns.out.last()
            && last.role == "assistant"
        {
            return Err(invalid(
                &last.path,
                "the conversation ends with an assistant message: continuing a partial reply (prefill) is not supported; end with a user message",
            ));
        }
        let tools_sent = b.take_value("tools");
        let mut tools_skipped = Vec::new();
        let tools = match tools_sent.clone() {
            None => None,
            Some(Value::Array(items)) => {
                let mut tools = Vec::with_capacity(items.len());
                for (i, t) in items.into_iter().enumerate() {
                    match parse_tool(t, i, &mut ttl)? {
                        ToolEntry::Custom(t) => tools.push(t),
                        ToolEntry::Deferred => {}
                        ToolEntry::Skipped(kind) => tools_skipped.push(kind),
                    }
                }
                Some(tools)
            }
            Some(other) => {
                return Err(invalid(
                    "tools",
                    format!("must be an array, not {}", kind_of(&other)),
                ));
            }
        };
        if let Some(servers) = b.take_value("mcp_servers") {
            let Value::Array(servers) = servers else {
                return Err(invalid("mcp_servers", "must be an array"));
            };
            tools_skipped.extend(servers.iter().map(|_| "mcp_server".to_string()));
        }
        let tool_choice_sent = b.take_value("tool_choice");
        let (tool_choice, parallel_tool_calls) = match tool_choice_sent.clone() {
            None => (None, None),
            Some(v) => {
                let (c, p) = parse_tool_choice(v)?;
                (Some(c), p)
            }
        };
        let thinking_sent = b.take_value("thinking");
        let thinking = thinking_sent.clone().map(parse_thinking).transpose()?;
        let (effort, mut format) = match b.take_value("output_config") {
            None => (None, None),
            Some(v) => parse_output_config(v)?,
        };
        // The beta's earlier name for `output_config.format`.
        if let Some(f) = b.take_value("output_format") {
            if format.is_some() {
                return Err(invalid(
                    "output_format",
                    "`output_format` and `output_config.format` both set the format; send one",
                ));
            }
            format = Some(parse_format(f, "output_format")?);
        }
        let (user_id, diagnostics) = (
            match b.take_value("metadata") {
                None => None,
                Some(v) => {
                    let mut m = Fields::new(v, "metadata.")?;
                    let id: Option<String> = m.take("user_id")?;
                    m.finish()?;
                    id
                }
            },
            match b.take_value("diagnostics") {
                None => None,
                Some(v) => {
                    let mut d = Fields::new(v, "diagnostics.")?;
                    let previous: Option<String> = d.take("previous_message_id")?;
                    d.finish()?;
                    Some(previous)
                }
            },
        );
        let stop: Option<Vec<String>> = b.take("stop_sequences")?;
        let common = Common {
            model,
            max_tokens,
            temperature: b.take("temperature")?,
            top_p: b.take("top_p")?,
            top_k: b.take("top_k")?,
            stop: stop.map(StringOrList::Many),
            stream: b.take("stream")?.unwrap_or(false),
            response_format: format.clone().map(ResponseFormat::JsonSchema),
            // Predicted Outputs, in OpenAI's shape (a slotlight extension here).
            prediction: b
                .take_value("prediction")
                .map(parse_prediction)
                .transpose()?,
            ..Common::default()
        };
        // Accepted; nothing to do on a local engine (docs/api.md says what each means here).
        let _container = b.take_value("container");
        let _geo: Option<String> = b.take("inference_geo")?;
        let _speed: Option<String> = b.take("speed")?;
        let _context_management = b.take_value("context_management");
        let _fallbacks = b.take_value("fallbacks");
        let _fallback_credit = b.take_value("fallback_credit_token");
        let _billing = b.take_value("billing_policy");
        b.refuse_unless(
            "service_tier",
            |v| matches!(v.as_str(), Some("auto" | "standard_only")),
            "the service tiers are `auto` and `standard_only` (there is one tier)",
        )?;
        if let Some(t) = b.take_value("thread") {
            let mut t = Fields::new(t, "thread.")?;
            let kind: Option<String> = t.take("type")?;
            if kind.as_deref() != Some("create") {
                return Err(invalid(
                    "thread",
                    "continuing a server-held thread is not supported: this engine keeps no Messages conversation state; send the whole conversation in `messages`",
                ));
            }
            t.finish()?;
        }
        if b.take_value("compaction").is_some() && endpoint == Endpoint::Create {
            return Err(invalid(
                "compaction",
                "compaction requests (a summary of the conversation) are not supported",
            ));
        }
        b.finish_with(&[])?;
        let sections = SectionsSent {
            system: system.clone(),
            tools: tools_sent.unwrap_or(Value::Null),
            format,
            options: json!({
                "tool_choice": tool_choice_sent,
                "thinking": thinking_sent,
                "effort": effort,
            }),
        };
        Ok(Self {
            chat: ChatRequest {
                messages: turns.out,
                common,
                tools,
                tool_choice,
                parallel_tool_calls,
                logprobs: false,
                top_logprobs: None,
                chat_template_kwargs: Map::new(),
                held_messages: 0,
            },
            max_tokens,
            thinking,
            effort,
            diagnostics,
            user_id,
            cache_ttl: ttl.0,
            tools_skipped,
            sections,
        })
    }

    /// How long the request asks its session's KV to be kept (`cache_control.ttl`, the
    /// longest of its breakpoints; `None` without `cache_control`).
    pub fn session_ttl(&self) -> Option<Duration> {
        self.cache_ttl.map(|t| match t {
            CacheTtl::FiveMinutes => Duration::from_secs(5 * 60),
            CacheTtl::OneHour => Duration::from_secs(60 * 60),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signer() -> Signer {
        Signer::new(None, "m")
    }

    fn parse(v: Value) -> Result<MessagesRequest, ApiError> {
        MessagesRequest::from_json(v, Endpoint::Create, &signer())
    }

    fn message_of(v: Value) -> String {
        let e = parse(v).expect_err("refused");
        assert_eq!(e.status.as_u16(), 400, "{}", e.message);
        e.message
    }

    fn texts(r: &MessagesRequest) -> Vec<(String, String)> {
        r.chat
            .messages
            .iter()
            .map(|m| {
                let t = match &m.content {
                    Some(Content::Text(t)) => t.clone(),
                    _ => String::new(),
                };
                (m.role.clone(), t)
            })
            .collect()
    }

    #[test]
    fn a_claude_code_body_is_accepted_whole() {
        let r = parse(json!({
            "model": "m",
            "max_tokens": 32000,
            "stream": true,
            "system": [
                {"type": "text", "text": "billing header"},
                {"type": "text", "text": "You are an agent.", "cache_control": {"type": "ephemeral"}}
            ],
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "<system-reminder>r</system-reminder>"},
                    {"type": "text", "text": "Say hello.", "cache_control": {"type": "ephemeral", "ttl": "1h"}}
                ]},
                {"role": "system", "content": "# Environment"}
            ],
            "tools": [
                {"name": "Bash", "description": "Run", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}},
                {"name": "Later", "description": "d", "input_schema": {"type": "object"}, "defer_loading": true},
                {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}
            ],
            "metadata": {"user_id": "{\"device_id\":\"d\",\"account_uuid\":\"\",\"session_id\":\"s-1\"}"},
            "thinking": {"type": "adaptive", "display": "omitted"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            "output_config": {"effort": "high"},
            "container": "c", "inference_geo": "us", "service_tier": "auto", "speed": "standard",
            "diagnostics": {"previous_message_id": null}
        }))
        .expect("accepted");
        assert_eq!(
            texts(&r),
            vec![
                (
                    "system".into(),
                    "billing header\n\nYou are an agent.".into()
                ),
                (
                    "user".into(),
                    "<system-reminder>r</system-reminder>\n\nSay hello.\n\n# Environment".into()
                ),
            ]
        );
        let tools = r.chat.tools.as_ref().expect("tools");
        assert_eq!(tools.len(), 1, "the deferred tool is left out");
        assert_eq!(tools[0].name_param, "tools[0].name");
        assert_eq!(r.tools_skipped, vec!["web_search_20250305".to_string()]);
        assert_eq!(
            crate::server::request::session::resolve(
                &axum::http::HeaderMap::new(),
                crate::server::messages::translate::session_keys(&r)
            )
            .map(|k| k.id)
            .as_deref(),
            Some("s-1")
        );
        assert_eq!(r.session_ttl(), Some(Duration::from_secs(3600)));
        assert_eq!(r.cache_ttl, Some(CacheTtl::OneHour));
        assert_eq!(r.max_tokens, Some(32000));
        assert_eq!(r.diagnostics, Some(None));
        assert_eq!(
            r.thinking,
            Some(Thinking {
                mode: ThinkingMode::Adaptive,
                omitted: true
            })
        );
        assert_eq!(r.effort.as_deref(), Some("high"));
        assert!(r.chat.common.stream);
    }

    #[test]
    fn turns_of_one_role_are_combined_and_tools_round_trip() {
        let sig = signer().sign("think", false);
        let r = parse(json!({
            "max_tokens": 8,
            "messages": [
                {"role": "user", "content": "a"},
                {"role": "user", "content": [{"type": "text", "text": "b"}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "think", "signature": sig},
                    {"type": "text", "text": "calling"},
                    {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"x": 1}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "42"}]},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "content": "no", "is_error": true},
                    {"type": "text", "text": "go on"}
                ]}
            ]
        }))
        .expect("accepted");
        let m = &r.chat.messages;
        assert_eq!(m.len(), 5);
        assert_eq!(texts(&r)[0], ("user".into(), "a\n\nb".into()));
        assert_eq!(m[1].role, "assistant");
        assert_eq!(m[1].reasoning_content.as_deref(), Some("think"));
        let calls = m[1].tool_calls.as_ref().expect("calls");
        assert_eq!(calls[0].id.as_deref(), Some("toolu_1"));
        assert_eq!(calls[0].function.arguments, json!({"x": 1}));
        assert_eq!(m[2].role, "tool");
        assert_eq!(m[2].tool_call_id.as_deref(), Some("toolu_1"));
        assert_eq!(texts(&r)[2].1, "42");
        assert_eq!(texts(&r)[3].1, "Error: no");
        assert_eq!(texts(&r)[4], ("user".into(), "go on".into()));
    }

    #[test]
    fn a_thinking_block_comes_back_only_with_its_signature() {
        let carried = signer().sign("the reasoning", true);
        let r = parse(json!({"max_tokens": 8, "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "", "signature": carried}, {"type": "text", "text": "a"}]},
            {"role": "user", "content": "q2"}
        ]}))
        .expect("accepted");
        assert_eq!(
            r.chat.messages[1].reasoning_content.as_deref(),
            Some("the reasoning")
        );
        let sig = signer().sign("the reasoning", false);
        let msg = message_of(json!({"max_tokens": 8, "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "edited", "signature": sig}]},
            {"role": "user", "content": "q2"}
        ]}));
        assert!(msg.contains("messages[1].content[0].signature"), "{msg}");
    }

    #[test]
    fn bad_input_names_the_field() {
        let cases = [
            (
                json!({"messages": [{"role": "user", "content": "x"}]}),
                "max_tokens",
            ),
            (json!({"max_tokens": 8}), "messages"),
            (
                json!({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
                "messages[0].content[0]",
            ),
            (
                json!({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}),
                "messages[0].content[0]",
            ),
            (
                json!({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]}),
                "messages[0].content[0]",
            ),
            (
                json!({"max_tokens": 8, "messages": [{"role": "robot", "content": "x"}]}),
                "messages[0].role",
            ),
            (
                json!({"max_tokens": 8, "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "The answer is ("}]}),
                "messages[1]",
            ),
            (
                json!({"max_tokens": "many", "messages": [{"role": "user", "content": "x"}]}),
                "max_tokens",
            ),
            (
                json!({"max_tokens": 8, "messages": [{"role": "user", "content": "x"}], "tools": [{"name": "bad name", "input_schema": {"type": "object"}}]}),
                "tools[0].name",
            ),
            (
                json!({"max_tokens": 8, "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "tool"}}),
                "tool_choice.name",
            ),
            (
                json!({"max_tokens": 8, "messages": [{"role": "user", "content": "x"}], "thinking": {"type": "enabled"}}),
                "thinking.budget_tokens",
            ),
            (
                json!({"max_tokens": 8, "messages": [{"role": "user", "content": "x"}], "output_config": {"effort": "extreme"}}),
                "output_config.effort",
            ),
            (
                json!({"max_tokens": 8, "messages": [{"role": "user", "content": "x", "cache_control": {"type": "ephemeral"}}]}),
                "messages[0].cache_control",
            ),
            (
                json!({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral", "ttl": "2h"}}]}]}),
                "messages[0].content[0].cache_control.ttl",
            ),
            (
                json!({"max_tokens": 8, "messages": [{"role": "user", "content": "x"}], "frequency_penalty": 1}),
                "frequency_penalty",
            ),
            (
                json!({"max_tokens": 8, "messages": [{"role": "user", "content": "x"}], "compaction": {}}),
                "compaction",
            ),
            (
                json!({"max_tokens": 8, "messages": [{"role": "user", "content": "x"}], "thread": {"type": "continue", "previous_message_id": "msg_1"}}),
                "thread",
            ),
        ];
        for (body, field) in cases {
            let e = parse(body.clone()).expect_err(&format!("refused: {body}"));
            assert_eq!(e.param.as_deref(), Some(field), "{body}: {}", e.message);
            // Anthropic's shape has no `param`: its message names the field.
            let wire = e.body_in(crate::server::error::ErrorShape::Anthropic);
            let message = wire["error"]["message"].as_str().unwrap_or("");
            assert!(message.contains(field), "{body}: {message}");
        }
    }

    #[test]
    fn count_tokens_takes_the_body_without_max_tokens() {
        let body = json!({"messages": [{"role": "user", "content": "x"}], "compaction": {"enabled": true}});
        let r = MessagesRequest::from_json(body, Endpoint::CountTokens, &signer()).expect("ok");
        assert_eq!(r.max_tokens, None);
    }

    #[test]
    fn options_map_onto_the_request_path() {
        let r = parse(json!({
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "x"}],
            "stop_sequences": ["END"],
            "temperature": 0.5, "top_p": 0.9, "top_k": 40,
            "tools": [{"name": "f", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}
        }))
        .expect("ok");
        let c = &r.chat.common;
        assert_eq!(
            (c.temperature, c.top_p, c.top_k),
            (Some(0.5), Some(0.9), Some(40))
        );
        assert!(matches!(&c.stop, Some(StringOrList::Many(v)) if v == &["END".to_string()]));
        assert_eq!(r.chat.tool_choice, Some(InputToolChoice::Required));
        assert_eq!(r.chat.parallel_tool_calls, Some(false));
        assert_eq!(
            c.response_format,
            Some(ResponseFormat::JsonSchema(json!({"type": "object"})))
        );
        assert_eq!(r.sections.format, Some(json!({"type": "object"})));
    }
}
