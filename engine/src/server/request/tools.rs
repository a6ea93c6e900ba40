//! Tool calls: definitions, the model's own format, the grammar that enforces a call, and the
//! parsers that turn a reply back into OpenAI `tool_calls`.
//!
//! The format is chosen from the chat template's text ([`ToolFormat::detect`]):
//! - **Hermes / Qwen** (`<tool_call>` in the template): the template lists the tools; the
//!   model answers `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, one block
//!   per call, possibly after some text.
//! - **Llama 3.1 JSON** (the template asks for `{"name": ..., "parameters": ...}`): the model
//!   answers one bare JSON object (Llama 3.1 templates refuse several calls in one turn).
//! - **generic** (any other template, SmolLM2's among them, as llama.cpp's generic format): the
//!   tool definitions go into a system message, and the reply is constrained to one JSON object,
//!   either `{"tool_calls": [{"name": ..., "arguments": {...}}]}` or `{"response": "..."}`
//!   (`auto`), or always the first (`required`, a named function). History is rewritten the
//!   same way: an assistant's earlier calls become that JSON, tool results become user messages
//!   `{"tool_response": {...}}`, so any template renders them.
//!
//! `required` and a named function are enforced by a grammar in every format, so the call
//! always parses and its arguments validate against the function's schema; `auto` lets the
//! model choose and parses what it wrote; `none` leaves the tools out of the prompt.

use serde::Serialize;
use serde_json::{Map, Value, json};
use slotlight_otel::attr::value;

use crate::chat_template::{ChatMessage, Role};
use crate::constraint::{GrammarSpec, lark_string};
use crate::server::ids::new_id;

/// The header that names the tools a request offered that the engine left out of the prompt
/// (hosted tools: the Responses and Messages doors accept them and say so).
pub const TOOLS_SKIPPED_HEADER: &str = "x-slotlight-tools-skipped";

/// How a model writes tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>{...}</tool_call>` blocks (Hermes 2 Pro, Qwen 2.5 and later).
    Hermes,
    /// A bare `{"name": ..., "parameters": {...}}` object (Llama 3.1 and later).
    Llama3Json,
    /// Tools in a system message, the reply constrained to JSON (templates without tools).
    Generic,
}

impl ToolFormat {
    /// The format of a chat template: one that renders `tools` and names a known format is
    /// native; anything else gets the generic format.
    pub fn detect(template: &str) -> Self {
        let uses_tools = template.contains("tools");
        if uses_tools && template.contains("<tool_call>") {
            ToolFormat::Hermes
        } else if uses_tools
            && (template.contains("\"parameters\": dictionary of argument name")
                || template.contains("<|python_tag|>")
                || (template.contains("ipython") && template.contains("\"parameters\"")))
        {
            ToolFormat::Llama3Json
        } else {
            ToolFormat::Generic
        }
    }

    /// The telemetry value.
    pub fn as_str(self) -> &'static str {
        match self {
            ToolFormat::Hermes => value::TOOL_FORMAT_HERMES,
            ToolFormat::Llama3Json => value::TOOL_FORMAT_LLAMA3_JSON,
            ToolFormat::Generic => value::TOOL_FORMAT_GENERIC,
        }
    }
}

/// One function the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    /// The name of the function to call.
    pub name: String,
    /// What the function does, for the model.
    pub description: Option<String>,
    /// The JSON schema of its arguments (an empty object schema when none was given).
    pub parameters: Value,
}

impl Tool {
    /// The OpenAI tool object, as templates read it.
    pub fn to_openai(&self) -> Value {
        let mut f = Map::new();
        f.insert("name".into(), json!(self.name));
        if let Some(d) = &self.description {
            f.insert("description".into(), json!(d));
        }
        f.insert("parameters".into(), self.parameters.clone());
        json!({"type": "function", "function": Value::Object(f)})
    }
}

/// What the request allows of tool calls (`tool_choice`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// No tool may be called; the tools are left out of the prompt.
    None,
    /// The model chooses.
    Auto,
    /// Some tool must be called.
    Required,
    /// This function must be called.
    Function(String),
}

impl ToolChoice {
    /// The telemetry value.
    pub fn as_str(&self) -> &'static str {
        match self {
            ToolChoice::None => value::TOOL_CHOICE_NONE,
            ToolChoice::Auto => value::TOOL_CHOICE_AUTO,
            ToolChoice::Required => value::TOOL_CHOICE_REQUIRED,
            ToolChoice::Function(_) => value::TOOL_CHOICE_FUNCTION,
        }
    }
}

/// A request's tools, validated, with the format the model uses.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSetup {
    /// The model's tool-call format.
    pub format: ToolFormat,
    /// Whether tool calls are forbidden, allowed, required or of one named function.
    pub choice: ToolChoice,
    /// The tools the request offers the model.
    pub tools: Vec<Tool>,
    /// Whether several calls may come in one reply (`parallel_tool_calls`; by default true,
    /// except in the generic format).
    pub parallel: bool,
}

impl ToolSetup {
    /// The tools' names.
    pub fn names(&self) -> Vec<String> {
        self.tools.iter().map(|t| t.name.clone()).collect()
    }

    /// Whether the reply is parsed for tool calls.
    pub fn active(&self) -> bool {
        self.choice != ToolChoice::None && !self.tools.is_empty()
    }

    /// Whether a grammar decides the reply's shape (so the reply is always parsed whole).
    pub fn enforced(&self) -> bool {
        self.active()
            && (self.format == ToolFormat::Generic
                || matches!(self.choice, ToolChoice::Required | ToolChoice::Function(_)))
    }

    /// The tools a call may name (one, for a named function).
    fn callable(&self) -> Vec<&Tool> {
        match &self.choice {
            ToolChoice::Function(name) => self.tools.iter().filter(|t| &t.name == name).collect(),
            _ => self.tools.iter().collect(),
        }
    }

    /// The `tools` variable for a template with native tool support.
    pub fn template_tools(&self) -> Option<Value> {
        (self.active() && self.format != ToolFormat::Generic)
            .then(|| Value::Array(self.tools.iter().map(Tool::to_openai).collect()))
    }

    /// The messages as the template gets them: for the generic format, the tools described in
    /// the system message and earlier calls and results rewritten as JSON.
    pub fn prepare(&self, messages: Vec<ChatMessage>) -> Vec<ChatMessage> {
        if self.format != ToolFormat::Generic {
            return messages;
        }
        let mut out = polyfill_history(messages);
        if self.active() {
            let text = self.generic_instructions();
            match out.first_mut() {
                Some(m) if m.role == Role::System => {
                    if !m.content.is_empty() {
                        m.content.push_str("\n\n");
                    }
                    m.content.push_str(&text);
                }
                _ => out.insert(0, ChatMessage::new(Role::System, text)),
            }
        }
        out
    }

    fn generic_instructions(&self) -> String {
        let tools: Vec<Value> = self.tools.iter().map(Tool::to_openai).collect();
        // Pretty-printed JSON of values: writing it cannot fail.
        let list = format!("{:#}", Value::Array(tools));
        let call = r#"{"tool_calls": [{"name": "<tool name>", "arguments": {<arguments>}}]}"#;
        let how = match &self.choice {
            ToolChoice::Auto => format!(
                "Answer with one JSON object: either {call} to call tools, or {{\"response\": \"<your answer>\"}} to answer directly."
            ),
            ToolChoice::Required => format!("Answer with one JSON object that calls tools: {call}"),
            ToolChoice::Function(name) => {
                format!("Answer with one JSON object that calls the tool `{name}`: {call}")
            }
            ToolChoice::None => String::new(),
        };
        format!("You can call these tools:\n{list}\n\n{how}")
    }

    /// The grammar the reply must follow, when one is enforced.
    pub fn grammar(&self) -> Option<GrammarSpec> {
        self.grammar_answering(json!({"type": "string"}))
    }

    /// Whether an answer may take a shape of its own beside the calls (`text.format` with
    /// tools): the generic format with `tool_choice: auto` says `{"response": ...}` in JSON,
    /// which can be any JSON schema.
    pub fn answers_in_json(&self) -> bool {
        self.format == ToolFormat::Generic && self.choice == ToolChoice::Auto && self.active()
    }

    /// The grammar of the generic format whose direct answer (`response`) follows `answer`
    /// (a JSON schema); the other formats ignore `answer`.
    pub fn grammar_answering(&self, answer: Value) -> Option<GrammarSpec> {
        if !self.enforced() {
            return None;
        }
        let args_key = match self.format {
            ToolFormat::Llama3Json => "parameters",
            _ => "arguments",
        };
        let calls: Vec<Value> = self
            .callable()
            .iter()
            .map(|t| {
                let mut props = Map::new();
                props.insert("name".into(), json!({"const": t.name}));
                props.insert(args_key.into(), closed(&t.parameters));
                json!({
                    "type": "object",
                    "properties": Value::Object(props),
                    "required": ["name", args_key],
                    "additionalProperties": false,
                })
            })
            .collect();
        let one_call = if calls.len() == 1 {
            calls.into_iter().next().unwrap_or_default()
        } else {
            json!({"anyOf": calls})
        };
        Some(match self.format {
            ToolFormat::Generic => {
                let mut list = json!({"type": "array", "items": one_call, "minItems": 1});
                if !self.parallel {
                    list["maxItems"] = json!(1);
                }
                let calls = json!({
                    "type": "object",
                    "properties": {"tool_calls": list},
                    "required": ["tool_calls"],
                    "additionalProperties": false,
                });
                if self.choice == ToolChoice::Auto {
                    GrammarSpec::JsonSchema(json!({"anyOf": [calls, {
                        "type": "object",
                        "properties": {"response": answer},
                        "required": ["response"],
                        "additionalProperties": false,
                    }]}))
                } else {
                    GrammarSpec::JsonSchema(calls)
                }
            }
            ToolFormat::Llama3Json => GrammarSpec::JsonSchema(one_call),
            ToolFormat::Hermes => {
                let schema = GrammarSpec::json_defaults(one_call);
                let block = format!(
                    "{} %json {} {}",
                    lark_string("<tool_call>\n"),
                    schema,
                    lark_string("\n</tool_call>")
                );
                let start = if self.parallel {
                    format!("start: call ({} call)*\ncall: {block}", lark_string("\n"))
                } else {
                    format!("start: call\ncall: {block}")
                };
                GrammarSpec::Lark(start)
            }
        })
    }
}

/// A function's parameters as the grammar enforces them: when the schema does not say whether
/// other arguments are allowed, they are not (what the function declared, and nothing else;
/// small models otherwise copy `type` and `description` from the tool list into the call).
/// The arguments still validate against the schema as given.
fn closed(parameters: &Value) -> Value {
    let mut p = parameters.clone();
    if let Value::Object(m) = &mut p
        && m.contains_key("properties")
        && !m.contains_key("additionalProperties")
        && !m.contains_key("patternProperties")
    {
        m.insert("additionalProperties".into(), Value::Bool(false));
    }
    p
}

/// For templates without tool support: an assistant's calls become the generic format's JSON,
/// tool results become user messages holding `{"tool_response": ...}`, the results of one
/// turn's calls one user message (a line each: templates that need roles to alternate refuse
/// two user messages in a row), and a user message right after them joins that one too (the
/// Messages API sends results and the user's text as one turn).
pub fn polyfill_history(messages: Vec<ChatMessage>) -> Vec<ChatMessage> {
    let mut out: Vec<ChatMessage> = Vec::with_capacity(messages.len());
    let mut results_open = false;
    for m in messages {
        if m.role == Role::Assistant
            && let Some(calls) = &m.tool_calls
        {
            let calls: Vec<Value> = calls
                .iter()
                .map(|c| {
                    let f = &c["function"];
                    json!({"name": f["name"], "arguments": f["arguments"], "id": c["id"]})
                })
                .collect();
            let mut content = json!({"tool_calls": calls}).to_string();
            if !m.content.is_empty() {
                content = format!("{}\n{content}", m.content);
            }
            let mut written = ChatMessage::new(Role::Assistant, content);
            written.generated.clone_from(&m.generated);
            out.push(written);
            results_open = false;
            continue;
        }
        if m.role == Role::Tool {
            let mut r = Map::new();
            if let Some(n) = &m.name {
                r.insert("name".into(), json!(n));
            }
            if let Some(id) = &m.tool_call_id {
                r.insert("tool_call_id".into(), json!(id));
            }
            r.insert("content".into(), json!(m.content));
            let line = json!({"tool_response": Value::Object(r)}).to_string();
            match out.last_mut() {
                Some(last) if results_open => {
                    last.content.push('\n');
                    last.content.push_str(&line);
                }
                _ => out.push(ChatMessage::new(Role::User, line)),
            }
            results_open = true;
            continue;
        }
        if m.role == Role::User
            && results_open
            && let Some(last) = out.last_mut()
        {
            last.content.push('\n');
            last.content.push_str(&m.content);
            results_open = false;
            continue;
        }
        results_open = false;
        out.push(m);
    }
    out
}

/// One tool call in a reply, with the id the response and the span give it (serialized in
/// OpenAI's chat shape; the other APIs write it their own way).
#[derive(Debug, Clone, Serialize)]
pub struct ToolCall {
    /// Call id (`call_…`), for the tool message that answers it.
    pub id: String,
    /// The call's type, always `function`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The function called and its arguments.
    pub function: FunctionCall,
}

/// The function part of a tool call.
#[derive(Debug, Clone, Serialize)]
pub struct FunctionCall {
    /// The name of the function to call, one of the request's tools.
    pub name: String,
    /// Arguments as a JSON text.
    pub arguments: String,
}

impl ToolCall {
    /// A call with a fresh id after `prefix` (`call_`, `toolu_`: the API's style).
    pub fn new(c: &ParsedCall, prefix: &str) -> Self {
        Self {
            id: new_id(prefix),
            kind: "function",
            function: FunctionCall {
                name: c.name.clone(),
                arguments: c.arguments.clone(),
            },
        }
    }
}

/// One parsed call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
    /// The function's name.
    pub name: String,
    /// Its arguments, as a JSON text.
    pub arguments: String,
}

/// A reply taken apart: its text and its calls.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Parsed {
    /// The text for `message.content` (`None` when the reply is only calls).
    pub content: Option<String>,
    /// The calls, in order.
    pub calls: Vec<ParsedCall>,
}

fn call_from(v: &Value, args_keys: &[&str]) -> Option<ParsedCall> {
    let name = v.get("name")?.as_str()?.to_string();
    if name.is_empty() {
        return None;
    }
    let args = args_keys
        .iter()
        .find_map(|k| v.get(*k))
        .cloned()
        .unwrap_or_else(|| json!({}));
    let arguments = match args {
        Value::String(s) => s,
        other => other.to_string(),
    };
    Some(ParsedCall { name, arguments })
}

fn text_only(text: &str) -> Parsed {
    Parsed {
        content: Some(text.to_string()),
        calls: Vec::new(),
    }
}

/// Parses a whole reply in `format`. A reply that does not hold well-formed calls is text.
pub fn parse(format: ToolFormat, text: &str) -> Parsed {
    match format {
        ToolFormat::Hermes => parse_hermes(text),
        ToolFormat::Llama3Json => parse_llama3(text),
        ToolFormat::Generic => parse_generic(text),
    }
}

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";

fn parse_hermes(text: &str) -> Parsed {
    let Some(first) = text.find(HERMES_OPEN) else {
        return text_only(text);
    };
    let mut calls = Vec::new();
    let mut rest = &text[first..];
    while let Some(after) = rest.strip_prefix(HERMES_OPEN) {
        let (body, next) = match after.find(HERMES_CLOSE) {
            Some(end) => (&after[..end], &after[end + HERMES_CLOSE.len()..]),
            None => (after, ""),
        };
        let Some(call) = serde_json::from_str::<Value>(body.trim())
            .ok()
            .and_then(|v| call_from(&v, &["arguments", "parameters"]))
        else {
            return text_only(text);
        };
        calls.push(call);
        rest = next.trim_start();
    }
    // Text around the calls is kept as content.
    let mut content = text[..first].trim().to_string();
    let after = rest.trim();
    if !after.is_empty() {
        if !content.is_empty() {
            content.push('\n');
        }
        content.push_str(after);
    }
    Parsed {
        content: (!content.is_empty()).then_some(content),
        calls,
    }
}

fn parse_llama3(text: &str) -> Parsed {
    let body = text.trim();
    let body = body.strip_prefix("<|python_tag|>").unwrap_or(body).trim();
    if !body.starts_with('{') && !body.starts_with('[') {
        return text_only(text);
    }
    let mut calls = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let Some(Ok(v)) = stream.next() else {
            return text_only(text);
        };
        let used = stream.byte_offset();
        let items = match v {
            Value::Array(items) => items,
            other => vec![other],
        };
        for item in &items {
            match call_from(item, &["parameters", "arguments"]) {
                Some(c) => calls.push(c),
                None => return text_only(text),
            }
        }
        rest = rest[used..].trim_start();
        rest = rest.strip_prefix(';').unwrap_or(rest).trim_start();
    }
    if calls.is_empty() {
        return text_only(text);
    }
    Parsed {
        content: None,
        calls,
    }
}

fn parse_generic(text: &str) -> Parsed {
    let Ok(v) = serde_json::from_str::<Value>(text.trim()) else {
        return text_only(text);
    };
    if let Some(calls) = v.get("tool_calls").and_then(Value::as_array) {
        let parsed: Option<Vec<ParsedCall>> = calls
            .iter()
            .map(|c| call_from(c, &["arguments", "parameters"]))
            .collect();
        if let Some(calls) = parsed.filter(|c| !c.is_empty()) {
            return Parsed {
                content: None,
                calls,
            };
        }
    }
    match v.get("response") {
        Some(Value::String(r)) => text_only(r),
        // An answer in a JSON shape of its own (`text.format` beside tools): its JSON text.
        Some(r @ (Value::Object(_) | Value::Array(_))) => text_only(&r.to_string()),
        _ => text_only(text),
    }
}

/// How the generic format's plain answer starts (compact JSON: the grammar allows no spaces).
const GENERIC_ANSWER: &str = r#"{"response":""#;

/// The text of a JSON string body, decoded as far as it has arrived: up to the closing quote,
/// holding back an escape (or a surrogate pair) that is not whole yet.
fn json_string_prefix(body: &str) -> String {
    let b = body.as_bytes();
    let mut out = String::new();
    let mut i = 0;
    while i < body.len() {
        let Some(c) = body[i..].chars().next() else {
            break;
        };
        match c {
            '"' => break,
            '\\' => {
                let Some(&e) = b.get(i + 1) else { break };
                let simple = match e {
                    b'n' => Some('\n'),
                    b't' => Some('\t'),
                    b'r' => Some('\r'),
                    b'b' => Some('\u{8}'),
                    b'f' => Some('\u{c}'),
                    b'"' => Some('"'),
                    b'\\' => Some('\\'),
                    b'/' => Some('/'),
                    _ => None,
                };
                if let Some(ch) = simple {
                    out.push(ch);
                    i += 2;
                    continue;
                }
                if e != b'u' {
                    break;
                }
                let Some(unit) = hex4(body.get(i + 2..i + 6)) else {
                    break;
                };
                if (0xD800..0xDC00).contains(&unit) {
                    let low = (body.get(i + 6..i + 8) == Some("\\u"))
                        .then(|| hex4(body.get(i + 8..i + 12)))
                        .flatten();
                    let Some(low) = low else { break };
                    let cp = 0x10000 + ((unit - 0xD800) << 10) + (low.wrapping_sub(0xDC00) & 0x3FF);
                    out.push(char::from_u32(cp).unwrap_or('\u{FFFD}'));
                    i += 12;
                } else {
                    out.push(char::from_u32(unit).unwrap_or('\u{FFFD}'));
                    i += 6;
                }
            }
            other => {
                out.push(other);
                i += other.len_utf8();
            }
        }
    }
    out
}

fn hex4(s: Option<&str>) -> Option<u32> {
    s.filter(|h| h.len() == 4 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .and_then(|h| u32::from_str_radix(h, 16).ok())
}

/// Shapes one choice's text as it streams: what can be shown as content now, and what must
/// wait to be parsed as calls at the end.
#[derive(Debug, Clone)]
pub struct Shaper {
    mode: Mode,
    /// Text received but not yet released as content.
    held: String,
    /// Whether the held text is (the start of) tool calls, kept for parsing.
    capturing: bool,
    /// Content released so far (the whole content, for the final parse).
    released: String,
    /// The generic format's answer streamed so far, decoded from its JSON string.
    streamed: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Plain text: everything is content.
    Text,
    /// Content until `<tool_call>`, then calls.
    Hermes,
    /// Content unless the reply opens with `{` or `[`.
    Llama3,
    /// The whole reply is parsed at the end (enforced calls, generic format).
    Whole(ToolFormat),
}

impl Shaper {
    /// The shaper for a request's tools (plain text without).
    pub fn new(tools: Option<&ToolSetup>) -> Self {
        let mode = match tools {
            Some(t) if t.enforced() => Mode::Whole(t.format),
            Some(t) if t.active() => match t.format {
                ToolFormat::Hermes => Mode::Hermes,
                ToolFormat::Llama3Json => Mode::Llama3,
                ToolFormat::Generic => Mode::Whole(ToolFormat::Generic),
            },
            _ => Mode::Text,
        };
        Self {
            mode,
            held: String::new(),
            capturing: false,
            released: String::new(),
            streamed: String::new(),
        }
    }

    fn release(&mut self, upto: usize) -> String {
        let out: String = self.held.drain(..upto).collect();
        self.released.push_str(&out);
        out
    }

    /// Feeds text; returns what may be shown as content now.
    pub fn push(&mut self, text: &str) -> String {
        self.held.push_str(text);
        if self.mode == Mode::Whole(ToolFormat::Generic) {
            // The answer of the generic format streams as it is decoded; calls wait.
            self.capturing = true;
            let Some(body) = self.held.strip_prefix(GENERIC_ANSWER) else {
                return String::new();
            };
            let decoded = json_string_prefix(body);
            let delta = decoded
                .strip_prefix(self.streamed.as_str())
                .unwrap_or_default()
                .to_string();
            self.streamed = decoded;
            return delta;
        }
        if self.capturing {
            return String::new();
        }
        match self.mode {
            Mode::Text => {
                let n = self.held.len();
                self.release(n)
            }
            Mode::Whole(_) => {
                self.capturing = true;
                String::new()
            }
            Mode::Hermes => {
                if let Some(p) = self.held.find(HERMES_OPEN) {
                    self.capturing = true;
                    return self.release(p);
                }
                // Hold back a suffix that may begin the marker.
                let keep = (1..HERMES_OPEN.len())
                    .rev()
                    .find(|&k| {
                        self.held.len() >= k
                            && self.held.is_char_boundary(self.held.len() - k)
                            && HERMES_OPEN.starts_with(&self.held[self.held.len() - k..])
                    })
                    .unwrap_or(0);
                let upto = self.held.len() - keep;
                self.release(upto)
            }
            Mode::Llama3 => {
                let start = self.held.trim_start();
                if start.is_empty() {
                    return String::new();
                }
                if start.starts_with('{')
                    || start.starts_with('[')
                    || "<|python_tag|>".starts_with(start)
                    || start.starts_with("<|python_tag|>")
                {
                    self.capturing = true;
                    return String::new();
                }
                self.mode = Mode::Text;
                let n = self.held.len();
                self.release(n)
            }
        }
    }

    /// Ends the choice: the content not yet released and the calls found.
    pub fn finish(mut self, tail: &str) -> (String, Vec<ParsedCall>) {
        self.held.push_str(tail);
        let format = match self.mode {
            Mode::Text => None,
            Mode::Hermes => Some(ToolFormat::Hermes),
            Mode::Llama3 => Some(ToolFormat::Llama3Json),
            Mode::Whole(f) => Some(f),
        };
        let whole = matches!(self.mode, Mode::Hermes | Mode::Whole(_));
        let Some(format) = format.filter(|_| self.capturing || whole) else {
            return (self.held, Vec::new());
        };
        let parsed = parse(format, &self.held);
        if parsed.calls.is_empty() {
            // Not calls after all: all of it is content (for the generic format, the answer,
            // less what was streamed of it).
            let content = parsed.content.unwrap_or_default();
            let rest = content
                .strip_prefix(self.streamed.as_str())
                .map_or_else(|| content.clone(), str::to_string);
            return (rest, Vec::new());
        }
        // Calls: content is what came before them (released already), plus any text the
        // format put before the calls in the held part.
        let before = parsed.content.unwrap_or_default();
        (before, parsed.calls)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Tool {
        Tool {
            name: "get_weather".into(),
            description: Some("Weather in a city".into()),
            parameters: json!({
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                "required": ["city"]
            }),
        }
    }

    fn setup(format: ToolFormat, choice: ToolChoice) -> ToolSetup {
        ToolSetup {
            format,
            choice,
            tools: vec![
                weather(),
                Tool {
                    name: "get_time".into(),
                    description: None,
                    parameters: json!({"type": "object", "properties": {}}),
                },
            ],
            parallel: true,
        }
    }

    fn call(name: &str, args: Value) -> ParsedCall {
        ParsedCall {
            name: name.into(),
            arguments: serde_json::to_string(&args).expect("json"),
        }
    }

    /// Recorded Qwen2.5-7B-Instruct replies (Hermes format).
    #[test]
    fn hermes_replies_parse() {
        let one = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>";
        let p = parse(ToolFormat::Hermes, one);
        assert_eq!(p.content, None);
        assert_eq!(
            p.calls,
            vec![call("get_weather", json!({"city": "Paris", "unit": "c"}))]
        );

        let two = "I'll check both.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
        let p = parse(ToolFormat::Hermes, two);
        assert_eq!(p.content.as_deref(), Some("I'll check both."));
        assert_eq!(p.calls.len(), 2);
        assert_eq!(p.calls[1], call("get_time", json!({})));

        // Cut off before the closing tag (max_tokens): the block still parses when whole.
        let open = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}";
        assert_eq!(parse(ToolFormat::Hermes, open).calls.len(), 1);
        // Broken JSON inside a block: the reply is text, nothing is lost.
        let broken =
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \n</tool_call>";
        let p = parse(ToolFormat::Hermes, broken);
        assert!(p.calls.is_empty());
        assert_eq!(p.content.as_deref(), Some(broken));
        // A plain answer.
        let plain = "The capital of France is Paris.";
        assert_eq!(parse(ToolFormat::Hermes, plain), text_only(plain));
    }

    /// Recorded Llama-3.1-8B-Instruct replies (JSON format).
    #[test]
    fn llama3_replies_parse() {
        let one = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}";
        let p = parse(ToolFormat::Llama3Json, one);
        assert_eq!(p.calls, vec![call("get_weather", json!({"city": "Paris"}))]);
        assert_eq!(p.content, None);
        let tagged = "<|python_tag|>{\"name\": \"get_time\", \"parameters\": {}}";
        assert_eq!(parse(ToolFormat::Llama3Json, tagged).calls.len(), 1);
        let several = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}; {\"name\": \"get_time\", \"parameters\": {}}";
        assert_eq!(parse(ToolFormat::Llama3Json, several).calls.len(), 2);
        let list = "[{\"name\": \"get_time\", \"parameters\": {}}]";
        assert_eq!(parse(ToolFormat::Llama3Json, list).calls.len(), 1);
        for text in [
            "Paris is the capital of France.",
            "{\"answer\": 42}",
            "{\"name\": \"get_time\", \"parameters\": {} trailing",
        ] {
            assert_eq!(
                parse(ToolFormat::Llama3Json, text),
                text_only(text),
                "{text}"
            );
        }
    }

    /// Replies of SmolLM2-135M-Instruct under the generic format's grammar.
    #[test]
    fn generic_replies_parse() {
        let calls = r#"{"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}}]}"#;
        let p = parse(ToolFormat::Generic, calls);
        assert_eq!(p.calls, vec![call("get_weather", json!({"city": "Paris"}))]);
        let answer = r#"{"response":"Hello! How can I help?"}"#;
        assert_eq!(
            parse(ToolFormat::Generic, answer),
            text_only("Hello! How can I help?")
        );
        let cut = r#"{"tool_calls":[{"name":"get_weather","argu"#;
        assert_eq!(parse(ToolFormat::Generic, cut), text_only(cut));
    }

    #[test]
    fn formats_are_recognised_from_the_template() {
        let qwen = "{%- if tools %}{{- '<tools>' }}{%- for tool in tools %}{{ tool | tojson }}{%- endfor %}For each function call, return a json object within <tool_call></tool_call> XML tags{%- endif %}";
        assert_eq!(ToolFormat::detect(qwen), ToolFormat::Hermes);
        let llama = "{%- if tools is not none %}Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.{%- endif %}";
        assert_eq!(ToolFormat::detect(llama), ToolFormat::Llama3Json);
        assert_eq!(
            ToolFormat::detect(crate::chat_template::CHATML_TEMPLATE),
            ToolFormat::Generic
        );
    }

    #[test]
    fn streaming_holds_back_calls_and_releases_text() {
        let s = setup(ToolFormat::Hermes, ToolChoice::Auto);
        let mut sh = Shaper::new(Some(&s));
        let mut shown = String::new();
        for piece in [
            "Let me ",
            "check.\n<tool",
            "_call>\n{\"name\": \"get_time\", ",
            "\"arguments\": {}}\n</tool_call>",
        ] {
            shown.push_str(&sh.push(piece));
        }
        assert_eq!(shown, "Let me check.\n");
        let (rest, calls) = sh.finish("");
        assert_eq!(calls, vec![call("get_time", json!({}))]);
        assert_eq!(rest, "");

        // `<tool` that turns out to be text is released at the end.
        let mut sh = Shaper::new(Some(&s));
        let mut shown = sh.push("a <tool");
        let (rest, calls) = sh.finish("");
        shown.push_str(&rest);
        assert!(calls.is_empty());
        assert_eq!(shown, "a <tool");

        let s = setup(ToolFormat::Llama3Json, ToolChoice::Auto);
        let mut sh = Shaper::new(Some(&s));
        assert_eq!(sh.push("  "), "");
        assert_eq!(sh.push("Hi"), "  Hi");
        assert_eq!(sh.push(" there"), " there");
        let mut sh = Shaper::new(Some(&s));
        assert_eq!(sh.push("{\"name\": \"get_time\","), "");
        let (_, calls) = sh.finish(" \"parameters\": {}}");
        assert_eq!(calls.len(), 1);

        // The generic format's answer streams as it is decoded, each escape once whole.
        let s = setup(ToolFormat::Generic, ToolChoice::Auto);
        let mut sh = Shaper::new(Some(&s));
        let mut shown = Vec::new();
        for piece in [
            r#"{"resp"#,
            r#"onse":"Hi"#,
            r#" \"#,
            r#"n\u00"#,
            r#"e9 \ud83d"#,
            r#"\ude42"#,
        ] {
            shown.push(sh.push(piece));
        }
        assert_eq!(shown, vec!["", "Hi", " ", "\n", "é ", "🙂"]);
        let (rest, calls) = sh.finish(r#"!"}"#);
        assert_eq!((rest.as_str(), calls.len()), ("!", 0));
        let mut sh = Shaper::new(Some(&s));
        assert_eq!(sh.push(r#"{"tool_calls":[{"name":"get_time","#), "");
        let (rest, calls) = sh.finish(r#""arguments":{}}]}"#);
        assert_eq!((rest.as_str(), calls.len()), ("", 1));

        let mut sh = Shaper::new(None);
        assert_eq!(sh.push("<tool_call>"), "<tool_call>");
    }

    #[test]
    fn generic_prompts_describe_the_tools_and_rewrite_history() {
        let s = setup(ToolFormat::Generic, ToolChoice::Auto);
        let mut call_msg = ChatMessage::new(Role::Assistant, "");
        call_msg.tool_calls = Some(vec![
            json!({"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": {}}}),
        ]);
        let mut result = ChatMessage::new(Role::Tool, "12:00");
        result.tool_call_id = Some("call_1".into());
        result.name = Some("get_time".into());
        let out = s.prepare(vec![
            ChatMessage::new(Role::User, "What time is it?"),
            call_msg,
            result,
        ]);
        assert_eq!(out[0].role, Role::System);
        assert!(out[0].content.contains("get_weather") && out[0].content.contains("tool_calls"));
        assert_eq!(out[2].role, Role::Assistant);
        let v: Value = serde_json::from_str(&out[2].content).expect("json");
        assert_eq!(v["tool_calls"][0]["name"], "get_time");
        assert_eq!(out[3].role, Role::User);
        let v: Value = serde_json::from_str(&out[3].content).expect("json");
        assert_eq!(v["tool_response"]["content"], "12:00");
        assert!(out.iter().all(|m| m.tool_calls.is_none()));

        // Two results of one reply, and the user's text after them, are one user turn.
        let mut second = ChatMessage::new(Role::Tool, "13:00");
        second.tool_call_id = Some("call_2".into());
        let mut first = ChatMessage::new(Role::Tool, "12:00");
        first.tool_call_id = Some("call_1".into());
        let merged = polyfill_history(vec![
            ChatMessage::new(Role::User, "Times?"),
            ChatMessage::new(Role::Assistant, "calling"),
            first,
            second,
            ChatMessage::new(Role::User, "Thanks."),
            ChatMessage::new(Role::Assistant, "ok"),
            ChatMessage::new(Role::User, "Again."),
        ]);
        let roles: Vec<Role> = merged.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            vec![
                Role::User,
                Role::Assistant,
                Role::User,
                Role::Assistant,
                Role::User
            ]
        );
        let lines: Vec<&str> = merged[2].content.lines().collect();
        assert_eq!(lines.len(), 3, "{}", merged[2].content);
        assert!(lines[0].contains("12:00") && lines[1].contains("13:00"));
        assert_eq!(lines[2], "Thanks.");
        // A user message that follows no result stays its own turn.
        assert_eq!(merged[4].content, "Again.");

        // Native formats keep the messages and give the template the tools.
        let h = setup(ToolFormat::Hermes, ToolChoice::Auto);
        assert!(
            h.template_tools()
                .is_some_and(|t| t.as_array().map(Vec::len) == Some(2))
        );
        let none = setup(ToolFormat::Hermes, ToolChoice::None);
        assert!(none.template_tools().is_none() && none.grammar().is_none());
    }

    /// Whether the compiled grammar lets a model write `text` and then stop.
    fn accepts(spec: &GrammarSpec, text: &str) -> bool {
        let tok = std::sync::Arc::new(crate::tokenizer::tests::gpt2_tokenizer(Some("smollm")));
        let vocab = tok.vocab_size();
        let compiler =
            crate::constraint::Compiler::new(std::sync::Arc::clone(&tok), vocab).expect("compiler");
        let mut c = compiler.compile(spec).expect("compiles");
        for t in tok.encode(text, false).expect("encodes") {
            let Ok(mask) = c.compute_mask() else {
                return false;
            };
            if !mask.is_allowed(t) || c.consume(t).is_err() {
                return false;
            }
        }
        c.is_stopped() || c.compute_mask().is_ok_and(|m| m.is_allowed(2))
    }

    #[test]
    fn native_grammars_accept_the_models_own_format_only() {
        let hermes = setup(ToolFormat::Hermes, ToolChoice::Required)
            .grammar()
            .expect("grammar");
        let one = "<tool_call>\n{\"name\":\"get_time\",\"arguments\":{}}\n</tool_call>";
        assert!(accepts(&hermes, one));
        assert!(accepts(&hermes, &format!("{one}\n{one}")), "parallel calls");
        assert!(!accepts(&hermes, "Sure! {\"name\":\"get_time\"}"));
        assert!(!accepts(
            &hermes,
            "<tool_call>\n{\"name\":\"get_time\",\"arguments\":{\"x\":1}}\n</tool_call>"
        ));
        let mut single = setup(
            ToolFormat::Hermes,
            ToolChoice::Function("get_weather".into()),
        );
        single.parallel = false;
        let g = single.grammar().expect("grammar");
        let w = "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}\n</tool_call>";
        assert!(accepts(&g, w));
        assert!(!accepts(&g, &format!("{w}\n{w}")));
        assert!(!accepts(&g, one), "only the named function");
        let llama = setup(ToolFormat::Llama3Json, ToolChoice::Required)
            .grammar()
            .expect("grammar");
        assert!(accepts(
            &llama,
            "{\"name\":\"get_weather\",\"parameters\":{\"city\":\"Oslo\",\"unit\":\"c\"}}"
        ));
        assert!(
            !accepts(
                &llama,
                "{\"name\":\"get_weather\",\"parameters\":{\"unit\":\"c\"}}"
            ),
            "city is required"
        );
        let generic = setup(ToolFormat::Generic, ToolChoice::Auto)
            .grammar()
            .expect("grammar");
        assert!(accepts(&generic, "{\"response\":\"hello\"}"));
        assert!(accepts(
            &generic,
            "{\"tool_calls\":[{\"name\":\"get_time\",\"arguments\":{}}]}"
        ));
        assert!(!accepts(&generic, "hello"));
    }

    #[test]
    fn one_turns_results_are_one_user_message_for_templates_that_alternate() {
        let call = |id: &str| json!({"id": id, "type": "function", "function": {"name": "f", "arguments": {}}});
        let mut asked = ChatMessage::new(Role::Assistant, "");
        asked.tool_calls = Some(vec![call("a"), call("b")]);
        let result = |id: &str, text: &str| {
            let mut m = ChatMessage::new(Role::Tool, text);
            m.tool_call_id = Some(id.into());
            m
        };
        let out = polyfill_history(vec![
            ChatMessage::new(Role::User, "go"),
            asked,
            result("a", "one"),
            result("b", "two"),
            ChatMessage::new(Role::User, "and?"),
        ]);
        let roles: Vec<Role> = out.iter().map(|m| m.role).collect();
        assert_eq!(roles, [Role::User, Role::Assistant, Role::User]);
        let lines: Vec<&str> = out[2].content.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].contains("\"one\"") && lines[1].contains("\"two\""));
        assert_eq!(lines[2], "and?");
    }

    #[test]
    fn a_json_answer_shape_sits_beside_the_generic_calls() {
        let s = setup(ToolFormat::Generic, ToolChoice::Auto);
        assert!(s.answers_in_json());
        let schema = json!({"type": "object", "properties": {"a": {"enum": ["x"]}}});
        let Some(GrammarSpec::JsonSchema(g)) = s.grammar_answering(schema.clone()) else {
            panic!("a JSON schema");
        };
        assert_eq!(g["anyOf"][1]["properties"]["response"], schema);
        assert!(!setup(ToolFormat::Hermes, ToolChoice::Auto).answers_in_json());
        // The answer comes back as its JSON text.
        let p = parse(ToolFormat::Generic, r#"{"response":{"a":"x"}}"#);
        assert!(p.calls.is_empty());
        assert_eq!(p.content.as_deref(), Some(r#"{"a":"x"}"#));
    }

    #[test]
    fn grammars_enforce_required_and_named_calls() {
        assert!(
            setup(ToolFormat::Hermes, ToolChoice::Auto)
                .grammar()
                .is_none()
        );
        assert!(
            setup(ToolFormat::Llama3Json, ToolChoice::Auto)
                .grammar()
                .is_none()
        );
        let Some(GrammarSpec::JsonSchema(g)) =
            setup(ToolFormat::Generic, ToolChoice::Auto).grammar()
        else {
            panic!("generic auto is a JSON schema");
        };
        assert_eq!(g["anyOf"].as_array().map(Vec::len), Some(2));
        let Some(GrammarSpec::JsonSchema(g)) =
            setup(ToolFormat::Generic, ToolChoice::Function("get_time".into())).grammar()
        else {
            panic!("named is a JSON schema");
        };
        let item = &g["properties"]["tool_calls"]["items"];
        assert_eq!(item["properties"]["name"]["const"], "get_time");
        // Undeclared arguments are closed off; a schema that allows them keeps them.
        assert_eq!(
            item["properties"]["arguments"]["additionalProperties"],
            false
        );
        let open = json!({"type": "object", "properties": {}, "additionalProperties": true});
        assert_eq!(closed(&open), open);
        let Some(GrammarSpec::Lark(l)) = setup(ToolFormat::Hermes, ToolChoice::Required).grammar()
        else {
            panic!("hermes is lark");
        };
        assert!(l.contains("%json") && l.contains("<tool_call>"));
        let Some(GrammarSpec::JsonSchema(g)) =
            setup(ToolFormat::Llama3Json, ToolChoice::Required).grammar()
        else {
            panic!("llama3 is a JSON schema");
        };
        assert!(g["anyOf"][0]["properties"]["parameters"].is_object());
    }
}
