//! Chat templates: turn a conversation into the prompt text a model was trained on.
//!
//! Models ship a Jinja template (GGUF `tokenizer.chat_template`, or `chat_template` in a
//! Hugging Face `tokenizer_config.json`). We render it with minijinja set up the way Hugging
//! Face `transformers` sets up Jinja2 in `apply_chat_template`, so prompts match byte for byte:
//!
//! - `trim_blocks` and `lstrip_blocks` on, trailing newline of the template dropped;
//! - Python string/dict methods (`.strip()`, `.startswith()`, `.items()`, ...) through
//!   minijinja-contrib's pycompat callback;
//! - `raise_exception(msg)` (templates use it to refuse a conversation, e.g. roles that do not
//!   alternate) becomes [`TemplateError::Raised`], a caller error;
//! - `strftime_now(fmt)` (Llama 3.x templates print today's date; here in UTC);
//! - a `tojson` filter that behaves like HF's (`json.dumps` with `ensure_ascii=False`: no HTML
//!   escaping, Python's `", "`/`": "` separators, `indent`, `separators`, `sort_keys`,
//!   `ensure_ascii` keyword arguments);
//! - `{% generation %}` / `{% endgeneration %}` (HF's assistant-mask extension) are accepted
//!   and render their body;
//! - variables `messages`, `add_generation_prompt`, `bos_token`, `eos_token` (only when known),
//!   `tools` and `documents` (`none` unless given through [`ChatTemplate::render_with`]).
//!
//! Message content is data: it is passed as a value, never spliced into the template source, so
//! Jinja syntax inside a message is rendered literally. Special-token text inside a message
//! (a user typing `<|im_end|>`) does end up in the prompt string, exactly as in HF; the prompt
//! is then tokenized with special tokens recognised (see [`crate::tokenizer::Tokenizer::encode`]).
//!
//! Rendering cost is bounded: minijinja's fuel limit caps the number of instructions a render
//! may execute ([`DEFAULT_FUEL`], adjustable with [`ChatTemplate::set_fuel`]), and its recursion
//! limit caps nesting. A template that runs out fails with [`TemplateError::OutOfFuel`]. Memory
//! is not metered: the template is trusted configuration (it ships with the model, and a
//! template that doubles a string in a loop can exhaust memory within its fuel), while messages
//! are untrusted data that no usual template copies more than a few times.
//!
//! JSON objects given as extra variables (`tools`) reach the template through serde_json's map,
//! which keeps the caller's key order (serde_json's `preserve_order` feature is on in this build,
//! required by llguidance), as HF does.

use std::borrow::Cow;
use std::collections::BTreeMap;

use minijinja::value::{Serde, Value};
use minijinja::{AutoEscape, Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};

mod fallback;
mod pycompat;

pub use fallback::{TurnFormat, fallback_template};
#[cfg(test)]
use pycompat::strftime;
use pycompat::{Raised, raise_exception, strftime_now, tojson};

/// Name under which the template is registered in its environment (shows up in error
/// locations, e.g. `(in chat_template:3)`).
const TEMPLATE_NAME: &str = "chat_template";

/// Instructions one render may execute. A ChatML turn costs a few dozen; tool-calling
/// templates a few hundred per message. Ten million is far beyond any real conversation and
/// still bounds a hostile template to a fraction of a second.
pub const DEFAULT_FUEL: u64 = 10_000_000;

/// The ChatML template used by [`ChatTemplate::chatml_fallback`] (the text of HF's former
/// default chat template).
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// The Gemma turn format, for Gemma GGUFs that ship no template (the base models' files do
/// not): written here to render exactly what Google's Gemma 3 template renders for text
/// messages under Hugging Face's `apply_chat_template`: BOS; a system message folded into the
/// first user turn (its text, then a blank line); `assistant` called `model`; each message
/// trimmed and closed by `<end_of_turn>` and a newline; roles must alternate user/assistant.
pub const GEMMA_TEMPLATE: &str = "{{ bos_token }}
{%- if messages and messages[0]['role'] == 'system' -%}
    {%- set system = messages[0]['content'] + '\n\n' -%}
    {%- set turns = messages[1:] -%}
{%- else -%}
    {%- set system = '' -%}
    {%- set turns = messages -%}
{%- endif -%}
{%- for m in turns -%}
    {%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif -%}
    {{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\n' + (system if loop.first else '') + (m['content'] | trim) + '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{ '<start_of_turn>model\n' }}
{%- endif -%}
";

/// Why a template could not be loaded or rendered. Never a panic.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// The template does not compile (a model or configuration problem, found at load time).
    #[error("chat template does not compile: {0}")]
    Syntax(String),
    /// The template called `raise_exception`: it refuses this conversation (for instance roles
    /// that do not alternate). A caller error; the message is the template's own.
    #[error("chat template rejected the conversation: {0}")]
    Raised(String),
    /// Rendering used up its fuel (instruction budget): the template loops too long.
    #[error("chat template exceeded its instruction budget ({0} instructions)")]
    OutOfFuel(u64),
    /// Any other failure while rendering (unknown filter, bad operation on a value, ...).
    #[error("chat template failed to render: {0}")]
    Render(String),
}

impl TemplateError {
    /// A stable label for metrics and error bodies: `validation` when the conversation is at
    /// fault ([`TemplateError::Raised`]), `template` when the template is.
    pub fn error_type(&self) -> &'static str {
        match self {
            TemplateError::Raised(_) => slotlight_otel::attr::value::ERROR_VALIDATION,
            _ => slotlight_otel::attr::value::ERROR_TEMPLATE,
        }
    }
}

/// Who wrote a message. Templates see it as its lowercase name (`message.role`), the only
/// place it becomes a string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions to the model (the API's `system` and `developer`).
    System,
    /// The person talking to the model.
    User,
    /// The model's own replies.
    Assistant,
    /// A tool's result, answering an assistant's call.
    Tool,
}

/// One message of a conversation, as the OpenAI API and HF templates see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// Who wrote it.
    pub role: Role,
    /// The message text.
    pub content: String,
    /// The author's name (OpenAI `name`), when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// An assistant message's tool calls, as templates read them: `[{"id", "type":
    /// "function", "function": {"name", "arguments": {...}}}]` (arguments as an object, as
    /// Hugging Face templates expect). Absent, not empty, when there are none: templates test
    /// `'tool_calls' in message`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// A tool message's `tool_call_id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// An earlier assistant reply's reasoning, as a client echoes it back (thinking templates
    /// such as Qwen 3's read `message.reasoning_content`). Absent when there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// An assistant message that is a reply the engine generated, sent back as it was: the
    /// reply's ids as generated (its text, tool calls and reasoning all in them), which the
    /// prompt takes in its place ([`crate::prompt::PromptBuilder::chat_generated`]). Never
    /// from a client, never rendered.
    #[serde(skip)]
    pub generated: Option<std::sync::Arc<[u32]>>,
}

impl ChatMessage {
    /// A message with the given role and content.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            name: None,
            tool_calls: None,
            tool_call_id: None,
            reasoning_content: None,
            generated: None,
        }
    }
}

/// The variables [`ChatTemplate::render_with`] sets itself: extra variables of these names
/// would be overridden, so callers taking extras from a client refuse them.
pub const STANDARD_VARIABLES: &[&str] = &[
    "messages",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
    "tools",
];

/// A compiled chat template, ready to render conversations. Cheap to share behind an `Arc`
/// (`Send + Sync`); rendering takes `&self`.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
    fuel: u64,
}

impl ChatTemplate {
    /// Compiles `source`. `bos_token`/`eos_token` are the special tokens' text (e.g. `<s>`),
    /// exposed to the template as `bos_token`/`eos_token` when given.
    pub fn new(
        source: &str,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .keep_trailing_newline(false)
                .build()
                .map_err(|e| TemplateError::Syntax(e.to_string()))?,
        );
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_fuel(Some(DEFAULT_FUEL));
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        let prepared = rewrite_generation_tags(source).into_owned();
        env.add_template_owned(TEMPLATE_NAME, prepared)
            .map_err(|e| TemplateError::Syntax(describe(&e)))?;
        Ok(Self {
            env,
            source: source.to_owned(),
            bos_token,
            eos_token,
            fuel: DEFAULT_FUEL,
        })
    }

    /// The ChatML template ([`CHATML_TEMPLATE`]), for models that ship none. Whether to use it
    /// or refuse chat requests is the caller's decision: a model not trained on ChatML will
    /// follow it poorly.
    pub fn chatml_fallback(bos_token: Option<String>, eos_token: Option<String>) -> Self {
        // The constant template is tested to compile; failing here would be a bug in this file.
        #[allow(clippy::expect_used)]
        Self::new(CHATML_TEMPLATE, bos_token, eos_token).expect("the ChatML template compiles")
    }

    /// The Gemma turn format ([`GEMMA_TEMPLATE`]), for Gemma models that ship no template.
    pub fn gemma_fallback(bos_token: Option<String>, eos_token: Option<String>) -> Self {
        // The constant template is tested to compile; failing here would be a bug in this file.
        #[allow(clippy::expect_used)]
        Self::new(GEMMA_TEMPLATE, bos_token, eos_token).expect("the Gemma template compiles")
    }

    /// The template text as given to [`ChatTemplate::new`].
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Changes the instruction budget of each render (see [`DEFAULT_FUEL`]).
    pub fn set_fuel(&mut self, fuel: u64) {
        self.fuel = fuel;
        self.env.set_fuel(Some(fuel));
    }

    /// Renders the conversation. With `add_generation_prompt` the text ends with the header
    /// of an assistant turn, ready for generation.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        self.render_with(messages, add_generation_prompt, &serde_json::Map::new())
    }

    /// Like [`ChatTemplate::render`], with extra template variables (HF's `**kwargs` of
    /// `apply_chat_template`: `tools`, `documents`, `enable_thinking`, ...). The standard
    /// variables (`messages`, `add_generation_prompt`, `bos_token`, `eos_token`) take precedence
    /// over extras of the same name.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, TemplateError> {
        let mut ctx: BTreeMap<String, Value> = BTreeMap::new();
        ctx.insert("tools".into(), Value::from(()));
        ctx.insert("documents".into(), Value::from(()));
        for (k, v) in extra {
            ctx.insert(k.clone(), Value::from(Serde(v)));
        }
        ctx.insert("messages".into(), Value::from(Serde(messages)));
        ctx.insert(
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt),
        );
        if let Some(bos) = &self.bos_token {
            ctx.insert("bos_token".into(), Value::from(bos.as_str()));
        }
        if let Some(eos) = &self.eos_token {
            ctx.insert("eos_token".into(), Value::from(eos.as_str()));
        }
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| TemplateError::Render(describe(&e)))?;
        template
            .render(Value::from(ctx))
            .map_err(|e| self.classify(&e))
    }

    fn classify(&self, err: &Error) -> TemplateError {
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
        while let Some(e) = source {
            if let Some(raised) = e.downcast_ref::<Raised>() {
                return TemplateError::Raised(raised.0.clone());
            }
            source = e.source();
        }
        if err.kind() == ErrorKind::OutOfFuel {
            return TemplateError::OutOfFuel(self.fuel);
        }
        TemplateError::Render(describe(err))
    }
}

/// A one-line description of a minijinja error, with its location when known.
fn describe(err: &Error) -> String {
    let mut s = err.kind().to_string();
    if let Some(detail) = err.detail() {
        s.push_str(": ");
        s.push_str(detail);
    }
    if let Some(line) = err.line() {
        s.push_str(&format!(" (line {line})"));
    }
    s
}

/// Rewrites HF's `{% generation %}`/`{% endgeneration %}` tags, which minijinja does not know,
/// to `{% if true %}`/`{% endif %}`: same output, same whitespace control.
fn rewrite_generation_tags(src: &str) -> Cow<'_, str> {
    if !src.contains("generation") {
        return Cow::Borrowed(src);
    }
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(pos) = rest.find("{%") {
        out.push_str(&rest[..pos]);
        let tag = &rest[pos..];
        match parse_generation_tag(tag) {
            Some((len, end, ws_open, ws_close)) => {
                out.push_str("{%");
                out.push_str(ws_open);
                out.push_str(if end { " endif " } else { " if true " });
                out.push_str(ws_close);
                out.push_str("%}");
                rest = &tag[len..];
            }
            None => {
                out.push_str("{%");
                rest = &tag[2..];
            }
        }
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// If `tag` starts with a `generation`/`endgeneration` block tag, returns its length, whether
/// it is the end tag, and its whitespace-control markers.
fn parse_generation_tag(tag: &str) -> Option<(usize, bool, &str, &str)> {
    let b = tag.as_bytes();
    let mut i = 2; // after "{%"
    let ws_open = match b.get(i) {
        Some(b'-') | Some(b'+') => {
            i += 1;
            &tag[2..3]
        }
        _ => "",
    };
    while b.get(i).is_some_and(u8::is_ascii_whitespace) {
        i += 1;
    }
    let word_start = i;
    while b
        .get(i)
        .is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_')
    {
        i += 1;
    }
    let end = match &tag[word_start..i] {
        "generation" => false,
        "endgeneration" => true,
        _ => return None,
    };
    while b.get(i).is_some_and(u8::is_ascii_whitespace) {
        i += 1;
    }
    let ws_close = match b.get(i) {
        Some(b'-') | Some(b'+') => {
            i += 1;
            &tag[i - 1..i]
        }
        _ => "",
    };
    if tag.get(i..i + 2) == Some("%}") {
        Some((i + 2, end, ws_open, ws_close))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolLM2-135M-Instruct's template, as in its GGUF `tokenizer.chat_template`.
    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    /// Meta-Llama-3-8B-Instruct's template.
    const LLAMA3: &str = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

    /// A Llama-3.1-style template (date, tools in the first user message, `tojson(indent=4)`,
    /// slicing, `in` on a message, `raise_exception`), abridged from Meta's.
    const LLAMA31: &str = r#"{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{%- if tools_in_user_message and not tools is none %}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
    {%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"#;

    /// Mistral-7B-Instruct-v0.1's template: refuses non-alternating roles.
    const MISTRAL: &str = "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}";

    fn msgs(pairs: &[(&str, &str)]) -> Vec<ChatMessage> {
        pairs
            .iter()
            .map(|(r, c)| {
                let role = serde_json::from_value(serde_json::Value::from(*r)).expect("a role");
                ChatMessage::new(role, *c)
            })
            .collect()
    }

    fn smollm() -> ChatTemplate {
        ChatTemplate::new(
            SMOLLM2,
            Some("<|im_start|>".into()),
            Some("<|im_end|>".into()),
        )
        .expect("SmolLM2 template compiles")
    }

    #[test]
    fn smollm2_inserts_the_default_system_message() {
        let out = smollm()
            .render(&msgs(&[("user", "What is 2+2?")]), true)
            .expect("renders");
        assert_eq!(
            out,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn smollm2_keeps_a_given_system_message_and_multi_turn() {
        let out = smollm()
            .render(
                &msgs(&[
                    ("system", "Be brief."),
                    ("user", "Hi"),
                    ("assistant", "Hello!"),
                    ("user", "Bye"),
                ]),
                false,
            )
            .expect("renders");
        assert_eq!(
            out,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
        );
    }

    #[test]
    fn llama3_uses_bos_and_trims_content() {
        let t = ChatTemplate::new(
            LLAMA3,
            Some("<|begin_of_text|>".into()),
            Some("<|eot_id|>".into()),
        )
        .expect("compiles");
        let out = t
            .render(&msgs(&[("system", " sys "), ("user", "Hello\n")]), true)
            .expect("renders");
        assert_eq!(
            out,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nsys<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        );
    }

    #[test]
    fn llama31_style_template_with_date_and_tools() {
        let t = ChatTemplate::new(
            LLAMA31,
            Some("<|begin_of_text|>".into()),
            Some("<|eot_id|>".into()),
        )
        .expect("compiles");
        let conversation = msgs(&[
            ("system", "You are terse. "),
            ("user", "Weather in Paris?"),
            ("assistant", "Let me check."),
            ("user", "Thanks"),
        ]);
        let mut extra = serde_json::Map::new();
        extra.insert("date_string".into(), "26 Jul 2024".into());
        // Expected strings rendered by Jinja2 the way transformers sets it up.
        assert_eq!(
            t.render_with(&conversation, true, &extra).expect("renders"),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nYou are terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWeather in Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nLet me check.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nThanks<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        );
        // Tools go into the first user message. (Object keys are given in sorted order: JSON
        // objects reach the template through serde_json's map, which sorts them.)
        extra.insert(
            "tools".into(),
            serde_json::json!([{"function": {"name": "get_weather", "parameters": {"properties": {"city": {"type": "string"}}, "type": "object"}}, "type": "function"}]),
        );
        assert_eq!(
            t.render_with(&conversation, true, &extra).expect("renders"),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nYou are terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON for a function call.\n\n{\n    \"function\": {\n        \"name\": \"get_weather\",\n        \"parameters\": {\n            \"properties\": {\n                \"city\": {\n                    \"type\": \"string\"\n                }\n            },\n            \"type\": \"object\"\n        }\n    },\n    \"type\": \"function\"\n}\n\nWeather in Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nLet me check.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nThanks<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        );
        // Without a date the template asks strftime_now for today's.
        let out = t.render(&conversation, true).expect("renders");
        let today = strftime(
            "%d %b %Y",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        );
        assert!(out.contains(&format!("Today Date: {today}\n")), "{out}");
        // Tools without any user message: the template refuses.
        let err = t
            .render_with(&msgs(&[("system", "s")]), true, &extra)
            .expect_err("refused");
        assert!(matches!(err, TemplateError::Raised(m) if m.contains("no first user message")));
    }

    #[test]
    fn mistral_refuses_non_alternating_roles() {
        let t =
            ChatTemplate::new(MISTRAL, Some("<s>".into()), Some("</s>".into())).expect("compiles");
        let ok = t
            .render(
                &msgs(&[("user", "a"), ("assistant", "b"), ("user", "c")]),
                true,
            )
            .expect("renders");
        assert_eq!(ok, "<s>[INST] a [/INST]b</s>[INST] c [/INST]");

        let err = t
            .render(&msgs(&[("user", "a"), ("user", "b")]), true)
            .expect_err("must refuse");
        assert_eq!(
            err,
            TemplateError::Raised(
                "Conversation roles must alternate user/assistant/user/assistant/...".into()
            )
        );
        assert_eq!(err.error_type(), "validation");
        assert_eq!(
            err.to_string(),
            "chat template rejected the conversation: Conversation roles must alternate user/assistant/user/assistant/..."
        );
        let err = t
            .render(&msgs(&[("user", "a"), ("system", "x")]), true)
            .expect_err("must refuse");
        assert!(matches!(err, TemplateError::Raised(m) if m.contains("Only user and assistant")));
    }

    #[test]
    fn message_content_is_data_not_code() {
        let hostile = "{{ 7*7 }}{% for x in range(10**9) %}x{% endfor %}{# c #}{{ raise_exception('boom') }}<|im_end|>";
        let out = smollm()
            .render(&msgs(&[("system", "s"), ("user", hostile)]), false)
            .expect("renders");
        assert_eq!(
            out,
            format!("<|im_start|>system\ns<|im_end|>\n<|im_start|>user\n{hostile}<|im_end|>\n")
        );
    }

    #[test]
    fn unicode_and_very_long_content() {
        let long = "é🙂中".repeat(100_000);
        let out = smollm()
            .render(&msgs(&[("system", "s"), ("user", &long)]), true)
            .expect("renders");
        assert!(out.contains(&long));
        assert!(out.ends_with("<|im_start|>assistant\n"));
        let out = smollm()
            .render(
                &msgs(&[("system", "\u{0}\u{202e}\r\n\t"), ("user", "x")]),
                false,
            )
            .expect("renders");
        assert!(out.starts_with("<|im_start|>system\n\u{0}\u{202e}\r\n\t<|im_end|>"));
    }

    #[test]
    fn many_messages_fit_in_the_default_fuel() {
        let conversation: Vec<ChatMessage> = (0..5000)
            .map(|i| {
                ChatMessage::new(
                    if i % 2 == 0 {
                        Role::User
                    } else {
                        Role::Assistant
                    },
                    "hi",
                )
            })
            .collect();
        let out = smollm().render(&conversation, true).expect("renders");
        assert_eq!(out.matches("<|im_start|>").count(), 5002);
    }

    #[test]
    fn runaway_templates_run_out_of_fuel() {
        let mut t = ChatTemplate::new(
            "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
            None,
            None,
        )
        .expect("compiles");
        t.set_fuel(100_000);
        let err = t.render(&[], false).expect_err("out of fuel");
        assert_eq!(err, TemplateError::OutOfFuel(100_000));
        assert_eq!(err.error_type(), "template");

        let t = ChatTemplate::new(
            "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
            None,
            None,
        )
        .expect("compiles");
        let err = t.render(&[], false).expect_err("recursion is bounded");
        assert!(matches!(err, TemplateError::Render(_)), "{err:?}");
    }

    #[test]
    fn syntax_errors_are_reported() {
        let err = ChatTemplate::new("{% for m in messages %}{{ m.content }", None, None)
            .expect_err("bad syntax");
        assert!(
            matches!(&err, TemplateError::Syntax(m) if m.contains("syntax error")),
            "{err}"
        );
        assert!(
            err.to_string()
                .starts_with("chat template does not compile: syntax error")
        );
        let err = ChatTemplate::new("{{ x | no_such_filter }}", None, None)
            .and_then(|t| t.render(&[], false))
            .expect_err("unknown filter");
        assert!(
            err.to_string().contains("no_such_filter")
                || err.to_string().contains("unknown filter"),
            "{err}"
        );
    }

    #[test]
    fn gemma_fallback_renders_like_hugging_face() {
        // The strings Google's Gemma 3 template renders under transformers'
        // `apply_chat_template` for these conversations.
        let t = ChatTemplate::gemma_fallback(Some("<bos>".into()), Some("<eos>".into()));
        let msgs = [
            ChatMessage::new(Role::System, "You are terse."),
            ChatMessage::new(Role::User, "  Hi there \n"),
            ChatMessage::new(Role::Assistant, "Hello."),
            ChatMessage::new(Role::User, "Name a colour."),
        ];
        assert_eq!(
            t.render(&msgs, true).expect("renders"),
            "<bos><start_of_turn>user\nYou are terse.\n\nHi there<end_of_turn>\n\
             <start_of_turn>model\nHello.<end_of_turn>\n\
             <start_of_turn>user\nName a colour.<end_of_turn>\n<start_of_turn>model\n"
        );
        assert_eq!(
            t.render(&msgs[1..2], false).expect("renders"),
            "<bos><start_of_turn>user\nHi there<end_of_turn>\n"
        );
        let bad = [
            ChatMessage::new(Role::User, "a"),
            ChatMessage::new(Role::User, "b"),
        ];
        assert!(matches!(
            t.render(&bad, true),
            Err(TemplateError::Raised(_))
        ));
    }

    #[test]
    fn chatml_fallback_renders_chatml() {
        let t = ChatTemplate::chatml_fallback(None, None);
        assert_eq!(t.source(), CHATML_TEMPLATE);
        let out = t.render(&msgs(&[("user", "hi")]), true).expect("renders");
        assert_eq!(
            out,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn trim_blocks_lstrip_blocks_and_pycompat() {
        // Block tags on their own lines leave no blank lines behind (trim_blocks + lstrip_blocks),
        // and Python string methods work.
        let src = "{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.content.strip().upper() }}]\n    {% endif %}\n{% endfor %}\n";
        let t = ChatTemplate::new(src, None, None).expect("compiles");
        let out = t
            .render(
                &msgs(&[("user", "  hi  "), ("assistant", "x"), ("user", "yo")]),
                false,
            )
            .expect("renders");
        assert_eq!(out, "[HI]\n[YO]\n");
        let t = ChatTemplate::new(
            "{{ messages[0].content.startswith('/') }} {{ messages[0]['content'].split(' ') | length }}",
            None,
            None,
        )
        .expect("compiles");
        assert_eq!(
            t.render(&msgs(&[("user", "/cmd a b")]), false)
                .expect("renders"),
            "True 3"
        );
    }

    #[test]
    fn bos_and_eos_are_undefined_when_unknown() {
        let t = ChatTemplate::new(
            "{% if bos_token is defined %}B{% endif %}{{ eos_token }}|{{ tools is none }}",
            None,
            None,
        )
        .expect("compiles");
        assert_eq!(t.render(&[], false).expect("renders"), "|True");
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let mut extra = serde_json::Map::new();
        extra.insert(
            "tools".into(),
            serde_json::json!([{"name": "get<weather>", "args": {"city": "Zürich & co", "n": 1.5, "ok": true, "none": null, "list": []}}]),
        );
        let render = |src: &str| {
            ChatTemplate::new(src, None, None)
                .expect("compiles")
                .render_with(&[], false, &extra)
                .expect("renders")
        };
        assert_eq!(
            render("{{ tools | tojson }}"),
            r#"[{"args": {"city": "Zürich & co", "list": [], "n": 1.5, "none": null, "ok": true}, "name": "get<weather>"}]"#
        );
        assert_eq!(
            render("{{ tools[0].args | tojson(indent=2) }}"),
            "{\n  \"city\": \"Zürich & co\",\n  \"list\": [],\n  \"n\": 1.5,\n  \"none\": null,\n  \"ok\": true\n}"
        );
        assert_eq!(
            render("{{ tools[0].args.city | tojson(ensure_ascii=true) }}"),
            r#""Z\u00fcrich & co""#
        );
        assert_eq!(
            render("{{ {'b': 1, 'a': [1, 2]} | tojson(separators=(',', ':'), sort_keys=true) }}"),
            r#"{"a":[1,2],"b":1}"#
        );
        assert_eq!(render("{{ 'a\"\\\n' | tojson }}"), r#""a\"\\\n""#);
        assert_eq!(
            render("{{ '🙂' | tojson(ensure_ascii=true) }}"),
            r#""\ud83d\ude42""#
        );
        let err = ChatTemplate::new("{{ 1 | tojson(bogus=1) }}", None, None)
            .expect("compiles")
            .render(&[], false)
            .expect_err("unknown keyword");
        assert!(matches!(err, TemplateError::Render(_)));
    }

    #[test]
    fn messages_serialize_for_tojson() {
        let t = ChatTemplate::new("{{ messages | tojson }}", None, None).expect("compiles");
        assert_eq!(
            t.render(&msgs(&[("user", "<b>hi</b>")]), false)
                .expect("renders"),
            r#"[{"role": "user", "content": "<b>hi</b>"}]"#
        );
    }

    #[test]
    fn generation_tags_are_accepted() {
        let src = "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{%- endgeneration %}{% else %}{{ m.content }}{% endif %}|{% endfor %}";
        let t = ChatTemplate::new(src, None, None).expect("compiles");
        assert_eq!(
            t.render(&msgs(&[("user", "q"), ("assistant", "a")]), false)
                .expect("renders"),
            "q|a|"
        );
        assert_eq!(
            rewrite_generation_tags("{{ generation }}"),
            "{{ generation }}"
        );
        assert_eq!(
            rewrite_generation_tags("{%- generation +%}x{% endgeneration -%}"),
            "{%- if true +%}x{% endif -%}"
        );
        assert_eq!(
            rewrite_generation_tags("{% generational %}{% set generation = 1 %}"),
            "{% generational %}{% set generation = 1 %}"
        );
    }

    #[test]
    fn strftime_now_and_strftime() {
        // 2024-07-23 14:05:09 UTC, a Tuesday, day 205 of a leap year.
        let t = 1_721_743_509;
        assert_eq!(
            strftime(
                "%d %b %Y|%A %a|%B|%H:%M:%S|%I %p|%j|%y %m %e|%F %T|%Z %z|%%|%Q",
                t
            ),
            "23 Jul 2024|Tuesday Tue|July|14:05:09|02 PM|205|24 07 23|2024-07-23 14:05:09|UTC +0000|%|%Q"
        );
        assert_eq!(strftime("%Y-%m-%d %a", 0), "1970-01-01 Thu");
        assert_eq!(strftime("%Y-%m-%d %j", 951_782_400), "2000-02-29 060");
        assert_eq!(strftime("trailing %", 0), "trailing %");
        let t = ChatTemplate::new("{{ strftime_now('%Y') }}", None, None).expect("compiles");
        let year: i32 = t
            .render(&[], false)
            .expect("renders")
            .parse()
            .expect("a year");
        assert!(year >= 2024);
    }

    #[test]
    fn extras_are_visible_and_standard_names_win() {
        let mut extra = serde_json::Map::new();
        extra.insert("enable_thinking".into(), serde_json::Value::Bool(false));
        extra.insert(
            "add_generation_prompt".into(),
            serde_json::Value::Bool(false),
        );
        let t = ChatTemplate::new(
            "{{ enable_thinking }} {{ add_generation_prompt }}",
            None,
            None,
        )
        .expect("compiles");
        assert_eq!(
            t.render_with(&[], true, &extra).expect("renders"),
            "False True"
        );
    }

    /// A Qwen 3-style thinking template, reduced to what matters here: ChatML turns, the
    /// reasoning of assistant turns after the last user query rendered in a `<think>` block
    /// (from `reasoning_content`, or split out of the content), and `enable_thinking: false`
    /// closing an empty block in the generation prompt.
    const QWEN3_LIKE: &str = r#"{%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(searching=true, last_query=messages|length - 1) %}
{%- for m in messages[::-1] %}
    {%- if ns.searching and m.role == 'user' %}
        {%- set ns.searching = false %}
        {%- set ns.last_query = messages|length - 1 - loop.index0 %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = message.content if message.content is string else '' %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set reasoning = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query and (loop.last or reasoning) %}
            {{- '<|im_start|>assistant\n<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
        {%- else %}
            {{- '<|im_start|>assistant\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"#;

    #[test]
    fn qwen3_style_template_reads_enable_thinking_and_reasoning_content() {
        let t = ChatTemplate::new(QWEN3_LIKE, None, Some("<|im_end|>".into())).expect("compiles");
        let question = msgs(&[("system", "Be brief."), ("user", "2+2?")]);
        let head = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n";
        // Thinking on (the default): the model opens its own block.
        assert_eq!(
            t.render(&question, true).expect("renders"),
            format!("{head}<|im_start|>assistant\n")
        );
        let mut kwargs = serde_json::Map::new();
        kwargs.insert("enable_thinking".into(), serde_json::Value::Bool(true));
        assert_eq!(
            t.render_with(&question, true, &kwargs).expect("renders"),
            format!("{head}<|im_start|>assistant\n")
        );
        // `enable_thinking: false` closes an empty block in the generation prompt.
        kwargs.insert("enable_thinking".into(), serde_json::Value::Bool(false));
        assert_eq!(
            t.render_with(&question, true, &kwargs).expect("renders"),
            format!("{head}<|im_start|>assistant\n<think>\n\n</think>\n\n")
        );
        // An assistant turn after the last query keeps its echoed `reasoning_content`; an
        // earlier one is rendered without it.
        let mut answered = question.clone();
        let mut reply = ChatMessage::new(Role::Assistant, "\n4");
        reply.reasoning_content = Some("\nadd them\n".into());
        answered.push(reply.clone());
        assert_eq!(
            t.render(&answered, false).expect("renders"),
            format!("{head}<|im_start|>assistant\n<think>\nadd them\n</think>\n\n4<|im_end|>\n")
        );
        answered.push(ChatMessage::new(Role::User, "3+3?"));
        assert_eq!(
            t.render(&answered, false).expect("renders"),
            format!(
                "{head}<|im_start|>assistant\n\n4<|im_end|>\n<|im_start|>user\n3+3?<|im_end|>\n"
            )
        );
        // Reasoning left inline in the content is split out the same way.
        let inline = [
            ChatMessage::new(Role::User, "q"),
            ChatMessage::new(Role::Assistant, "<think>\nr\n</think>\n\na"),
        ];
        assert_eq!(
            t.render(&inline, false).expect("renders"),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\na<|im_end|>\n"
        );
    }

    #[test]
    fn chat_message_serde() {
        let m: ChatMessage =
            serde_json::from_str(r#"{"role":"user","content":"hi"}"#).expect("parses");
        assert_eq!(m, ChatMessage::new(Role::User, "hi"));
        let t = smollm();
        fn assert_send_sync<T: Send + Sync>(_: &T) {}
        assert_send_sync(&t);
    }
}
