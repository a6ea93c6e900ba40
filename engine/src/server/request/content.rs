//! A request's content in the OpenTelemetry GenAI conventions, for the request span with
//! `--trace-content` only: `gen_ai.input.messages`, `gen_ai.system_instructions`,
//! `gen_ai.tool.definitions` and `gen_ai.output.messages`, each a JSON text in the structure
//! the conventions' JSON schemas give (messages of `role` and `parts`; parts of `type` `text`,
//! `reasoning`, `tool_call` and `tool_call_response`).
//!
//! An OpenAI chat sends its system prompt as messages. The system (and developer) messages the
//! chat starts with are the instructions the template puts first: they are recorded as
//! `gen_ai.system_instructions`, and not again among the input messages. A system message
//! later in the history stays where it is, a `system` message of the input.

use serde_json::{Value, json};

use super::input::{Content, InputMessage, InputTool, InputToolCall};
use crate::chat_template::Role;
use crate::server::request::outcome::ApiFinishReason;
use crate::server::request::tools::ToolCall;

/// The request's side of the content, as JSON texts ready for the request span.
#[derive(Debug, Clone, PartialEq)]
pub struct InputContent {
    /// `gen_ai.input.messages`.
    pub messages: String,
    /// `gen_ai.system_instructions`, when the chat starts with system messages.
    pub system_instructions: Option<String>,
    /// `gen_ai.tool.definitions`, when the request offers tools.
    pub tool_definitions: Option<String>,
}

impl InputContent {
    /// The content of a chat request: its messages (the leading system ones apart) and the
    /// tools it offers.
    pub fn chat(messages: &[InputMessage], tools: Option<&[InputTool]>) -> Self {
        let lead = messages
            .iter()
            .take_while(|m| m.author() == Some(Role::System))
            .count();
        let (system, history) = messages.split_at(lead);
        let instructions: Vec<Value> = system
            .iter()
            .filter_map(|m| m.content.as_ref().map(text_of))
            .map(|t| json!({"type": "text", "content": t}))
            .collect();
        let history: Vec<Value> = history.iter().map(input_message).collect();
        Self {
            messages: Value::Array(history).to_string(),
            system_instructions: (!instructions.is_empty())
                .then(|| Value::Array(instructions).to_string()),
            tool_definitions: tools
                .filter(|t| !t.is_empty())
                .map(|t| Value::Array(t.iter().map(tool_definition).collect()).to_string()),
        }
    }

    /// The content of a completion request: its prompt, as one `user` message.
    pub fn completion(prompt: &str) -> Self {
        Self {
            messages: json!([{"role": "user", "parts": [{"type": "text", "content": prompt}]}])
                .to_string(),
            system_instructions: None,
            tool_definitions: None,
        }
    }
}

/// The text of a message's content (the text parts joined).
fn text_of(c: &Content) -> String {
    match c {
        Content::Text(t) => t.clone(),
        Content::Parts(parts) => parts
            .iter()
            .filter_map(|p| p.text.as_deref())
            .collect::<Vec<_>>()
            .join(""),
    }
}

/// A tool call's arguments as the conventions record them: the JSON value when the text is
/// JSON, else the text as sent.
fn arguments_value(v: &Value) -> Value {
    match v {
        Value::String(s) => serde_json::from_str(s).unwrap_or_else(|_| v.clone()),
        other => other.clone(),
    }
}

fn role_name(m: &InputMessage) -> &str {
    match m.author() {
        Some(Role::System) => "system",
        Some(Role::User) => "user",
        Some(Role::Assistant) => "assistant",
        Some(Role::Tool) => "tool",
        None => m.role.as_str(),
    }
}

fn tool_call_part(c: &InputToolCall) -> Value {
    json!({
        "type": "tool_call",
        "id": c.id,
        "name": c.function.name,
        "arguments": arguments_value(&c.function.arguments),
    })
}

/// One message of the history: a tool message's content is the response to its call; an
/// assistant's earlier reasoning and tool calls are parts beside its text.
fn input_message(m: &InputMessage) -> Value {
    let mut parts = Vec::new();
    if let Some(r) = &m.reasoning_content {
        parts.push(json!({"type": "reasoning", "content": r}));
    }
    if let Some(c) = &m.content {
        let text = text_of(c);
        if m.author() == Some(Role::Tool) {
            parts.push(
                json!({"type": "tool_call_response", "id": m.tool_call_id, "response": text}),
            );
        } else if !text.is_empty() {
            parts.push(json!({"type": "text", "content": text}));
        }
    }
    parts.extend(m.tool_calls.iter().flatten().map(tool_call_part));
    json!({"role": role_name(m), "parts": parts})
}

fn tool_definition(t: &InputTool) -> Value {
    let mut v = json!({"type": "function", "name": t.name});
    if let Some(d) = &t.description {
        v["description"] = json!(d);
    }
    if let Some(p) = &t.parameters {
        v["parameters"] = p.clone();
    }
    v
}

/// One choice's reply as it is produced: its reasoning and its text, then its tool calls and
/// its finish reason when it ends.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OutputMessage {
    reasoning: String,
    text: String,
    calls: Vec<Value>,
    finish_reason: Option<ApiFinishReason>,
}

impl OutputMessage {
    /// Adds reasoning and text shown to the client.
    pub fn push(&mut self, reasoning: &str, text: &str) {
        self.reasoning.push_str(reasoning);
        self.text.push_str(text);
    }

    /// Ends the reply with its tool calls (with the ids the response gives them) and its
    /// finish reason.
    pub fn finish(&mut self, calls: &[ToolCall], reason: ApiFinishReason) {
        self.calls = calls
            .iter()
            .map(|c| {
                json!({
                    "type": "tool_call",
                    "id": c.id,
                    "name": c.function.name,
                    "arguments": arguments_value(&Value::String(c.function.arguments.clone())),
                })
            })
            .collect();
        self.finish_reason = Some(reason);
    }

    /// The message in the conventions' structure; `fallback` is the finish reason of a reply
    /// that never ended.
    fn to_value(&self, fallback: ApiFinishReason) -> Value {
        let mut parts = Vec::new();
        if !self.reasoning.is_empty() {
            parts.push(json!({"type": "reasoning", "content": self.reasoning}));
        }
        if !self.text.is_empty() {
            parts.push(json!({"type": "text", "content": self.text}));
        }
        parts.extend(self.calls.iter().cloned());
        json!({
            "role": "assistant",
            "parts": parts,
            "finish_reason": finish_reason(self.finish_reason.unwrap_or(fallback)),
        })
    }
}

/// The conventions' finish reason: theirs is `tool_call` where the API says `tool_calls`;
/// the others are the API's.
fn finish_reason(r: ApiFinishReason) -> &'static str {
    match r {
        ApiFinishReason::ToolCalls => "tool_call",
        other => other.as_str(),
    }
}

/// `gen_ai.output.messages` for the choices' replies, in choice order; `reasons` gives the
/// finish reason of a choice whose reply never ended.
pub fn output_messages(replies: &[OutputMessage], reasons: &[ApiFinishReason]) -> String {
    Value::Array(
        replies
            .iter()
            .enumerate()
            .map(|(i, m)| m.to_value(reasons.get(i).copied().unwrap_or(ApiFinishReason::Error)))
            .collect(),
    )
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::request::input::InputFunctionCall;
    use crate::server::request::tools::FunctionCall;

    fn msg(role: &str, content: Option<&str>) -> InputMessage {
        InputMessage {
            path: "messages[0]".into(),
            role: role.into(),
            content: content.map(|c| Content::Text(c.into())),
            name: None,
            tool_calls: None,
            tool_call_id: None,
            reasoning_content: None,
        }
    }

    fn parse(s: &str) -> Value {
        serde_json::from_str(s).expect("valid JSON")
    }

    #[test]
    fn a_chat_keeps_its_leading_system_messages_apart_and_its_tool_turns_as_parts() {
        let mut call = msg("assistant", None);
        call.tool_calls = Some(vec![InputToolCall {
            id: Some("call_1".into()),
            kind: Some("function".into()),
            function: InputFunctionCall {
                name: "weather".into(),
                arguments: json!("{\"city\":\"Paris\"}"),
            },
        }]);
        let mut result = msg("tool", Some("sunny"));
        result.tool_call_id = Some("call_1".into());
        let messages = vec![
            msg("system", Some("Be brief.")),
            msg("developer", Some("Use metric units.")),
            msg("user", Some("Weather in Paris?")),
            call,
            result,
            msg("system", Some("Late note.")),
        ];
        let tools = vec![InputTool {
            name_param: "tools[0].function.name".into(),
            name: "weather".into(),
            description: Some("Current weather".into()),
            parameters: Some(json!({"type": "object"})),
        }];
        let c = InputContent::chat(&messages, Some(&tools));
        assert_eq!(
            parse(c.system_instructions.as_deref().expect("instructions")),
            json!([{"type": "text", "content": "Be brief."}, {"type": "text", "content": "Use metric units."}])
        );
        assert_eq!(
            parse(&c.messages),
            json!([
                {"role": "user", "parts": [{"type": "text", "content": "Weather in Paris?"}]},
                {"role": "assistant", "parts": [{"type": "tool_call", "id": "call_1", "name": "weather", "arguments": {"city": "Paris"}}]},
                {"role": "tool", "parts": [{"type": "tool_call_response", "id": "call_1", "response": "sunny"}]},
                {"role": "system", "parts": [{"type": "text", "content": "Late note."}]},
            ])
        );
        assert_eq!(
            parse(c.tool_definitions.as_deref().expect("tools")),
            json!([{"type": "function", "name": "weather", "description": "Current weather", "parameters": {"type": "object"}}])
        );
    }

    #[test]
    fn a_chat_without_system_messages_or_tools_has_neither() {
        let c = InputContent::chat(&[msg("user", Some("hi"))], None);
        assert_eq!(c.system_instructions, None);
        assert_eq!(c.tool_definitions, None);
    }

    #[test]
    fn a_completion_prompt_is_one_user_message() {
        let c = InputContent::completion("Once upon");
        assert_eq!(
            parse(&c.messages),
            json!([{"role": "user", "parts": [{"type": "text", "content": "Once upon"}]}])
        );
    }

    #[test]
    fn output_messages_have_one_message_per_choice_with_its_finish_reason() {
        let mut a = OutputMessage::default();
        a.push("think", "");
        a.push("", "Hello");
        a.finish(&[], ApiFinishReason::Stop);
        let mut b = OutputMessage::default();
        b.finish(
            &[ToolCall {
                id: "call_x".into(),
                kind: "function",
                function: FunctionCall {
                    name: "f".into(),
                    arguments: "{\"a\":1}".into(),
                },
            }],
            ApiFinishReason::ToolCalls,
        );
        let never_ended = OutputMessage::default();
        let v = parse(&output_messages(
            &[a, b, never_ended],
            &[
                ApiFinishReason::Stop,
                ApiFinishReason::ToolCalls,
                ApiFinishReason::Error,
            ],
        ));
        assert_eq!(
            v,
            json!([
                {"role": "assistant", "finish_reason": "stop", "parts": [
                    {"type": "reasoning", "content": "think"},
                    {"type": "text", "content": "Hello"}]},
                {"role": "assistant", "finish_reason": "tool_call", "parts": [
                    {"type": "tool_call", "id": "call_x", "name": "f", "arguments": {"a": 1}}]},
                {"role": "assistant", "finish_reason": "error", "parts": []},
            ])
        );
    }
}
