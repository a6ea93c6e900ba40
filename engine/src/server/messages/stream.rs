//! The Messages stream encoder: the request path's output as Anthropic's server-sent events.
//!
//! `message_start` (the message with no content, `stop_reason: null`, the prompt's tokens as
//! input) and a `ping`; then each content block as `content_block_start`, its deltas
//! (`thinking_delta` then `signature_delta`, `text_delta`, or one `input_json_delta` with a
//! tool call's whole input) and `content_block_stop`; then `message_delta` with the stop
//! reason, the stop sequence and the final usage (the anthropic SDKs take every count it
//! carries), and `message_stop`. A failure after the stream began is one `error` event in
//! Anthropic's shape.

use axum::response::sse::Event as SseEvent;
use serde::Serialize;
use serde_json::{Value, json};

use super::response::{Answer, ContentBlock, MessageUsage, StopReason};
use crate::diagnostics::Registry;
use crate::server::error::{ApiError, ErrorShape};
use crate::server::request::launch::Encoder;
use crate::server::request::outcome::RequestOutcome;
use crate::server::request::pipeline::{ChoiceEnd, Out};
use crate::server::state::SharedState;

/// The content block open in the stream.
#[derive(Debug)]
enum Open {
    /// A thinking block, with its text so far (signed when it closes).
    Thinking(String),
    /// A text block.
    Text,
}

/// The encoder of one Messages stream.
pub struct Streaming {
    answer: Answer,
    /// The shared state, whose diagnostics registry learns the reply's tokens.
    st: SharedState,
    /// The index the next content block takes.
    next: usize,
    open: Option<Open>,
    /// The choice's stop reason and sequence, once it ended.
    stop: Option<(StopReason, Option<String>)>,
    /// Whether `message_start` went out.
    started: bool,
}

/// An event of `kind` with `data` as JSON. A value that does not serialize is reported (a log
/// line, and an error event in its place), never sent as an empty event.
pub fn event(kind: &str, data: &impl Serialize) -> SseEvent {
    match serde_json::to_string(data) {
        Ok(d) => SseEvent::default().event(kind).data(d),
        Err(e) => {
            tracing::error!(error = %e, "Response.ChunkUnserializable");
            error_event(&ApiError::internal(format!(
                "a stream event did not serialize: {e}"
            )))
        }
    }
}

/// An `error` event in Anthropic's shape.
pub fn error_event(e: &ApiError) -> SseEvent {
    SseEvent::default()
        .event("error")
        .data(e.body_in(ErrorShape::Anthropic).to_string())
}

impl Streaming {
    /// The encoder of the request `answer` answers.
    pub fn new(answer: Answer, st: SharedState) -> Self {
        Self {
            answer,
            st,
            next: 0,
            open: None,
            stop: None,
            started: false,
        }
    }

    /// `message_start` (and a `ping`), once: with the prompt's reuse when it is known, as the
    /// final usage will count it.
    fn message_start(&mut self, cached: usize, out: &mut Vec<SseEvent>) {
        if std::mem::replace(&mut self.started, true) {
            return;
        }
        let prompt = self.answer.meta.request.prompt.len();
        let message = self
            .answer
            .message(Vec::new(), MessageUsage::opening(prompt, cached));
        out.push(event(
            "message_start",
            &json!({"type": "message_start", "message": message}),
        ));
        out.push(event("ping", &json!({"type": "ping"})));
    }

    fn start(&mut self, block: &ContentBlock, out: &mut Vec<SseEvent>) -> usize {
        let index = self.next;
        self.next += 1;
        out.push(event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block": block}),
        ));
        index
    }

    fn delta(index: usize, delta: Value) -> SseEvent {
        event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": index, "delta": delta}),
        )
    }

    /// The index of the open block.
    fn current(&self) -> usize {
        self.next.saturating_sub(1)
    }

    /// Closes the open block: a thinking block gets its signature first.
    fn close(&mut self, out: &mut Vec<SseEvent>) {
        let Some(open) = self.open.take() else {
            return;
        };
        let index = self.current();
        if let Open::Thinking(text) = open {
            let signature = self.answer.signer.sign(&text, self.answer.omitted);
            out.push(Self::delta(
                index,
                json!({"type": "signature_delta", "signature": signature}),
            ));
        }
        out.push(event(
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": index}),
        ));
    }

    fn reasoning(&mut self, text: &str, out: &mut Vec<SseEvent>) {
        if text.is_empty() || self.answer.prewarm {
            return;
        }
        if !matches!(self.open, Some(Open::Thinking(_))) {
            self.close(out);
            let block = ContentBlock::Thinking {
                thinking: String::new(),
                signature: String::new(),
            };
            self.start(&block, out);
            self.open = Some(Open::Thinking(String::new()));
        }
        if let Some(Open::Thinking(all)) = &mut self.open {
            all.push_str(text);
        }
        if !self.answer.omitted {
            out.push(Self::delta(
                self.current(),
                json!({"type": "thinking_delta", "thinking": text}),
            ));
        }
    }

    fn text(&mut self, text: &str, out: &mut Vec<SseEvent>) {
        if text.is_empty() || self.answer.prewarm {
            return;
        }
        if !matches!(self.open, Some(Open::Text)) {
            self.close(out);
            let block = ContentBlock::Text {
                text: String::new(),
            };
            self.start(&block, out);
            self.open = Some(Open::Text);
        }
        out.push(Self::delta(
            self.current(),
            json!({"type": "text_delta", "text": text}),
        ));
    }

    fn choice_done(&mut self, e: &ChoiceEnd) -> Vec<SseEvent> {
        let mut out = Vec::new();
        self.reasoning(&e.reasoning, &mut out);
        self.text(&e.text, &mut out);
        self.close(&mut out);
        if !self.answer.prewarm {
            for call in &e.tool_calls {
                let ContentBlock::ToolUse { id, name, input } = ContentBlock::tool_use(call) else {
                    continue;
                };
                let start = ContentBlock::ToolUse {
                    id,
                    name,
                    input: json!({}),
                };
                let index = self.start(&start, &mut out);
                out.push(Self::delta(
                    index,
                    json!({"type": "input_json_delta", "partial_json": input.to_string()}),
                ));
                out.push(event(
                    "content_block_stop",
                    &json!({"type": "content_block_stop", "index": index}),
                ));
            }
        }
        self.stop = Some(self.answer.stop(e));
        finish_turn(&self.st.diagnostics, &self.answer, e);
        out
    }

    fn done(&mut self, f: &RequestOutcome) -> Vec<SseEvent> {
        if let Some(e) = f.api_error() {
            return vec![error_event(&e)];
        }
        let Some((stop_reason, stop_sequence)) = self.stop.take() else {
            // Cancelled before the choice ended: the client is gone, nothing to send.
            return Vec::new();
        };
        let usage: MessageUsage = self.answer.usage(f);
        vec![
            event(
                "message_delta",
                &json!({
                    "type": "message_delta",
                    "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                    "usage": usage,
                }),
            ),
            event("message_stop", &json!({"type": "message_stop"})),
        ]
    }
}

/// Records the reply of a finished choice for the cache diagnostics of a later request.
pub fn finish_turn(registry: &Registry, answer: &Answer, e: &ChoiceEnd) {
    if e.choice == 0 {
        registry.finish(&answer.meta.id, e.tokens.as_slice().into());
    }
}

impl Encoder for Streaming {
    /// Nothing yet: `message_start` waits until the prompt's reuse is known, so that its
    /// `input_tokens` and `cache_read_input_tokens` are the final ones (a proxy that counts
    /// from `message_start` counts right).
    fn opening(&mut self) -> Vec<SseEvent> {
        Vec::new()
    }

    fn on(&mut self, o: Out) -> Vec<SseEvent> {
        let mut out = Vec::new();
        if let Out::PromptReused { cached } = o {
            self.message_start(cached, &mut out);
            return out;
        }
        // Output before the reuse was told (a request that failed before its prefill): the
        // start goes first, with what is known.
        self.message_start(0, &mut out);
        out.extend(match o {
            Out::Delta {
                text, reasoning, ..
            } => {
                let mut ev = Vec::new();
                self.reasoning(&reasoning, &mut ev);
                self.text(&text, &mut ev);
                ev
            }
            Out::PromptProgress(_) | Out::PromptReused { .. } => Vec::new(),
            Out::ChoiceDone(e) => self.choice_done(&e),
            Out::Done(f) => self.done(&f),
        });
        out
    }
}
