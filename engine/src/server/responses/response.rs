//! The response object and its output items, as `POST /v1/responses` returns them (whole, or
//! inside the stream's lifecycle events) and as `GET /v1/responses/{id}` returns them later.

use serde::Serialize;
use serde_json::{Map, Value, json};

use super::translate::seal_reasoning;
use super::types::ResponsesRequest;
use crate::sampling::TokenLogprobs;
use crate::server::ids::new_id;
use crate::server::request::launch::Collected;
use crate::server::request::outcome::{ApiFinishReason, RequestOutcome};
use crate::server::request::pipeline::finite_logprob as finite;
use crate::server::request::tools::ToolCall;
use crate::server::request::usage::UsageExtras;
use crate::tokenizer::TokenBytes;

/// `usage` in the Responses API's shape, with slotlight's extras (the request's own timings,
/// its resume facts and its legs) beside OpenAI's counts.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ResponsesUsage {
    /// Prompt tokens.
    pub input_tokens: usize,
    /// `cached_tokens`: prompt tokens served from the KV cache (warm resume, prefix cache).
    pub input_tokens_details: InputDetails,
    /// Generated tokens.
    pub output_tokens: usize,
    /// `reasoning_tokens`: generated tokens inside the reasoning block.
    pub output_tokens_details: OutputDetails,
    /// Input and output tokens together.
    pub total_tokens: usize,
    /// slotlight's extras.
    #[serde(flatten)]
    pub extras: UsageExtras,
}

/// `usage.input_tokens_details`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct InputDetails {
    /// Prompt tokens served from the KV cache.
    pub cached_tokens: usize,
    /// Always 0, as Messages' `cache_creation_input_tokens`: slotlight has no separate cache
    /// write; every prompt token it computes is counted in `input_tokens` and kept in the
    /// prefix cache for later requests while there is room.
    pub cache_write_tokens: usize,
}

/// `usage.output_tokens_details`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct OutputDetails {
    /// Generated tokens inside the reasoning block.
    pub reasoning_tokens: usize,
    /// Draft tokens taken as the model's own (only when the request was drafted for: its
    /// `prediction` or its own prompt and reply; OpenAI's name from chat completions).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accepted_prediction_tokens: Option<usize>,
    /// Draft tokens verified and not taken (only when the request was drafted for).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rejected_prediction_tokens: Option<usize>,
}

impl ResponsesUsage {
    /// The usage of a finished request, from its outcome; `prewarm` counts no output (the one
    /// token its prefill sampled is dropped).
    pub fn of(o: &RequestOutcome, prewarm: bool) -> Self {
        let u = &o.usage;
        let output = if prewarm { 0 } else { u.completion_tokens };
        let details = u.completion_tokens_details.as_ref();
        Self {
            input_tokens: u.prompt_tokens,
            input_tokens_details: InputDetails {
                cached_tokens: u.prompt_tokens_details.cached_tokens,
                cache_write_tokens: 0,
            },
            output_tokens: output,
            output_tokens_details: OutputDetails {
                reasoning_tokens: if prewarm { 0 } else { u.reasoning_tokens() },
                accepted_prediction_tokens: details.and_then(|d| d.accepted_prediction_tokens),
                rejected_prediction_tokens: details.and_then(|d| d.rejected_prediction_tokens),
            },
            total_tokens: u.prompt_tokens + output,
            extras: u.extras.clone(),
        }
    }
}

/// How a response ended: `completed`, `incomplete` (with its reason) or `failed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Created, not yet finished (the stream's first events).
    InProgress,
    /// Ran to its end.
    Completed,
    /// Stopped by `max_output_tokens` (or the context).
    Incomplete,
    /// Cut off because the client left (OpenAI's `cancelled`; `incomplete_details` stays
    /// `null`, as `max_output_tokens` and `content_filter` are its only reasons).
    Cancelled,
    /// The engine failed it.
    Failed,
}

impl Status {
    /// The wire value.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::InProgress => "in_progress",
            Status::Completed => "completed",
            Status::Incomplete => "incomplete",
            Status::Cancelled => "cancelled",
            Status::Failed => "failed",
        }
    }

    /// The status of a response whose choice ended with `reason`.
    pub fn of(reason: ApiFinishReason) -> Self {
        match reason {
            ApiFinishReason::Stop | ApiFinishReason::ToolCalls => Status::Completed,
            ApiFinishReason::Length => Status::Incomplete,
            ApiFinishReason::Cancelled => Status::Cancelled,
            ApiFinishReason::Error => Status::Failed,
        }
    }

    /// The stream event that ends a response of this status.
    pub fn final_event(self) -> &'static str {
        match self {
            Status::Completed | Status::InProgress => "response.completed",
            // Nobody reads a cancelled response's stream (its client left); the event is the
            // documented one for a response that did not complete.
            Status::Incomplete | Status::Cancelled => "response.incomplete",
            Status::Failed => "response.failed",
        }
    }
}

/// What the response object is built from, besides its output: the request, its id and
/// creation time, the served model and what the door decided.
#[derive(Debug, Clone)]
pub struct Frame {
    /// `resp_…`.
    pub id: String,
    /// Unix seconds.
    pub created_at: u64,
    /// The served model name.
    pub model: String,
    /// The request as taken apart.
    pub request: ResponsesRequest,
    /// The completion token limit applied.
    pub max_output_tokens: usize,
    /// `prompt_cache_diagnostics`, when a comparison was asked for.
    pub diagnostics: Option<Value>,
}

impl Frame {
    /// The response object with `output`, `status` and `usage` (none while in progress).
    pub fn object(
        &self,
        status: Status,
        output: &[Value],
        usage: Option<&ResponsesUsage>,
        error: Option<Value>,
        incomplete: Option<&'static str>,
    ) -> Value {
        let r = &self.request;
        let mut text = Map::new();
        text.insert("format".into(), r.text_format.clone());
        if let Some(v) = &r.verbosity {
            text.insert("verbosity".into(), json!(v));
        }
        let mut o = json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status.as_str(),
            "background": r.background,
            "error": error,
            "incomplete_details": incomplete.map(|reason| json!({"reason": reason})),
            "instructions": r.instructions,
            "max_output_tokens": self.max_output_tokens,
            "metadata": r.metadata.clone().unwrap_or_default(),
            "model": self.model,
            "output": output,
            "parallel_tool_calls": r.parallel_tool_calls.unwrap_or(true),
            "previous_response_id": r.previous_response_id,
            "prompt_cache_key": r.common.prompt_cache_key,
            "reasoning": {"effort": r.reasoning.effort, "summary": r.reasoning.summary},
            "safety_identifier": r.ignored.get("safety_identifier"),
            "service_tier": "default",
            "store": r.store,
            "temperature": r.common.temperature.unwrap_or(1.0),
            "text": text,
            "tool_choice": r.tool_choice_echo,
            "tools": r.tools_echo,
            "top_logprobs": r.top_logprobs.unwrap_or(0),
            "top_p": r.common.top_p.unwrap_or(1.0),
            "truncation": r.truncation.as_str(),
            "usage": usage,
            "user": r.common.user,
        });
        if let Value::Object(m) = &mut o {
            if status != Status::InProgress {
                m.insert("completed_at".into(), json!(crate::server::ids::created()));
            }
            if let Some(c) = &r.conversation {
                m.insert("conversation".into(), json!({"id": c}));
            }
            if r.cache.comparison_response_id.is_some()
                || r.cache.ttl.is_some()
                || r.cache.mode.is_some()
            {
                m.insert(
                    "prompt_cache_options".into(),
                    json!({
                        "mode": r.cache.mode.as_deref().unwrap_or("implicit"),
                        "ttl": r.cache.ttl.as_deref().unwrap_or("30m"),
                        "comparison_response_id": r.cache.comparison_response_id,
                    }),
                );
            }
            if let Some(d) = &self.diagnostics {
                m.insert("prompt_cache_diagnostics".into(), d.clone());
            }
        }
        o
    }
}

/// The ids of a response's output items, made once so that a stream's events and the final
/// object name them alike.
#[derive(Debug, Default)]
pub struct ItemIds {
    /// The reasoning item's (`rs_…`).
    pub reasoning: String,
    /// The message item's (`msg_…`).
    pub message: String,
}

impl ItemIds {
    /// Fresh ids.
    pub fn new() -> Self {
        Self {
            reasoning: new_id("rs_"),
            message: new_id("msg_"),
        }
    }
}

/// A `reasoning` item of `text`, as far as the request asked for it (summary text with
/// `reasoning.summary`, sealed content with `include: ["reasoning.encrypted_content"]`).
pub fn reasoning_item(id: &str, text: &str, r: &ResponsesRequest, status: &str) -> Value {
    let summary = if r.reasoning.summary.is_some() && !text.is_empty() {
        json!([{"type": "summary_text", "text": text}])
    } else {
        json!([])
    };
    let mut item = json!({
        "type": "reasoning",
        "id": id,
        "summary": summary,
        "content": [{"type": "reasoning_text", "text": text}],
        "status": status,
    });
    if r.encrypted_reasoning()
        && let Value::Object(m) = &mut item
    {
        m.insert("encrypted_content".into(), json!(seal_reasoning(text)));
    }
    item
}

/// A `message` item of `text` (its logprobs when asked for).
pub fn message_item(id: &str, text: &str, logprobs: Option<Value>, status: &str) -> Value {
    json!({
        "type": "message",
        "id": id,
        "status": status,
        "role": "assistant",
        "content": [output_text(text, logprobs)],
    })
}

/// An `output_text` part.
pub fn output_text(text: &str, logprobs: Option<Value>) -> Value {
    json!({
        "type": "output_text",
        "text": text,
        "annotations": [],
        "logprobs": logprobs.unwrap_or_else(|| json!([])),
    })
}

/// A `function_call` item for `call` (its `call_id` the call's id) with `arguments`.
pub fn function_call_item(id: &str, call: &ToolCall, arguments: &str, status: &str) -> Value {
    json!({
        "type": "function_call",
        "id": id,
        "call_id": call.id,
        "name": call.function.name,
        "arguments": arguments,
        "status": status,
    })
}

/// `logprobs` of an `output_text` part: each token with its bytes and alternatives.
pub fn logprobs_json(tokens: &[TokenLogprobs], bytes: &TokenBytes) -> Value {
    let entry = |id: u32, lp: f32| {
        let b = bytes.bytes(id);
        json!({
            "token": bytes.text(id),
            "logprob": finite(lp),
            "bytes": b,
        })
    };
    Value::Array(
        tokens
            .iter()
            .map(|t| {
                let mut e = entry(t.id, t.logprob);
                if let Value::Object(m) = &mut e {
                    m.insert(
                        "top_logprobs".into(),
                        Value::Array(t.top.iter().map(|(id, lp)| entry(*id, *lp)).collect()),
                    );
                }
                e
            })
            .collect(),
    )
}

/// The output items of a whole reply: its reasoning, its message (present unless the reply is
/// only calls), then its calls.
pub fn output_items(
    c: &Collected,
    r: &ResponsesRequest,
    ids: &ItemIds,
    bytes: &TokenBytes,
) -> Vec<Value> {
    let status = match Status::of(c.finish_reason()) {
        Status::Completed => "completed",
        _ => "incomplete",
    };
    let mut items = Vec::new();
    if !c.reasoning.is_empty() {
        items.push(reasoning_item(&ids.reasoning, &c.reasoning, r, status));
    }
    let calls = c.tool_calls();
    if !c.text.is_empty() || calls.is_empty() {
        let lp = r.logprobs().then(|| logprobs_json(&c.logprobs, bytes));
        items.push(message_item(&ids.message, &c.text, lp, status));
    }
    for call in calls {
        items.push(function_call_item(
            &call_item_id(call),
            call,
            &call.function.arguments,
            "completed",
        ));
    }
    items
}

/// The item id of a call's `function_call` item: `fc_` and the call id's own suffix.
pub fn call_item_id(call: &ToolCall) -> String {
    format!("fc_{}", call.id.strip_prefix("call_").unwrap_or(&call.id))
}

/// The reason of an `incomplete` response.
pub fn incomplete_reason(reason: ApiFinishReason) -> Option<&'static str> {
    match reason {
        ApiFinishReason::Length => Some("max_output_tokens"),
        _ => None,
    }
}

/// The `error` of a failed response.
pub fn error_object(o: &RequestOutcome) -> Option<Value> {
    o.api_error()
        .map(|e| json!({"code": e.code.unwrap_or("server_error"), "message": e.message}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_openais_statuses_and_incomplete_reasons_are_written() {
        use ApiFinishReason::*;
        assert_eq!(Status::of(Cancelled).as_str(), "cancelled");
        assert_eq!(incomplete_reason(Cancelled), None);
        assert_eq!(Status::of(Length).as_str(), "incomplete");
        assert_eq!(incomplete_reason(Length), Some("max_output_tokens"));
        for r in [Stop, ToolCalls, Length, Cancelled, Error] {
            let status = Status::of(r).as_str();
            assert!(
                ["completed", "incomplete", "cancelled", "failed"].contains(&status),
                "{status}"
            );
            if let Some(reason) = incomplete_reason(r) {
                assert!(["max_output_tokens", "content_filter"].contains(&reason));
            }
        }
    }
}
