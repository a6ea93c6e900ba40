//! The Responses API's stream: typed events, each with its `sequence_number`, in the order
//! OpenAI documents them. `response.created` and `response.in_progress` first; then each
//! output item in turn (`response.output_item.added`, its content's events, and
//! `response.output_item.done`): the reasoning (`response.reasoning_text.*`, or
//! `response.reasoning_summary_*` when a summary was asked for), the message
//! (`response.content_part.added`, `response.output_text.delta`/`.done`,
//! `response.content_part.done`), and each function call
//! (`response.function_call_arguments.delta`/`.done`); last `response.completed` (or
//! `response.incomplete`, `response.failed`), sent only once the response is stored.

use std::sync::Arc;

use axum::response::sse::Event as SseEvent;
use serde_json::{Value, json};

use super::response::{
    Frame, ItemIds, ResponsesUsage, Status, call_item_id, error_object, function_call_item,
    incomplete_reason, logprobs_json, message_item, output_text, reasoning_item,
};
use super::store::Pending;
use crate::sampling::TokenLogprobs;
use crate::server::request::launch::{Encoder, Finishing};
use crate::server::request::outcome::{ApiFinishReason, RequestOutcome};
use crate::server::request::pipeline::{ChoiceEnd, Out};
use crate::server::state::SharedState;
use crate::tokenizer::TokenBytes;

/// The item being streamed now.
enum Open {
    Reasoning {
        index: usize,
        text: String,
    },
    Message {
        index: usize,
        text: String,
        logprobs: Vec<TokenLogprobs>,
    },
}

/// A Responses stream in progress.
pub struct Streaming {
    frame: Frame,
    ids: ItemIds,
    bytes: Arc<TokenBytes>,
    seq: u64,
    /// Finished items, in order.
    items: Vec<Value>,
    open: Option<Open>,
    /// How the reply ended, and its tokens (once its choice is done).
    end: Option<(ApiFinishReason, Vec<u32>)>,
    /// Where the response is stored (with `store`).
    pending: Option<Pending>,
    /// The shared state, whose diagnostics registry learns the reply's tokens.
    st: SharedState,
    prewarm: bool,
}

impl Streaming {
    /// A stream of the response `frame` describes.
    pub fn new(
        frame: Frame,
        bytes: Arc<TokenBytes>,
        pending: Option<Pending>,
        prewarm: bool,
        st: SharedState,
    ) -> Self {
        Self {
            st,
            frame,
            ids: ItemIds::new(),
            bytes,
            seq: 0,
            items: Vec::new(),
            open: None,
            end: None,
            pending,
            prewarm,
        }
    }

    /// An event of `kind` with `body`, numbered.
    fn event(&mut self, kind: &str, mut body: Value) -> SseEvent {
        if let Value::Object(m) = &mut body {
            m.insert("type".into(), json!(kind));
            m.insert("sequence_number".into(), json!(self.seq));
        }
        self.seq += 1;
        SseEvent::default().event(kind).data(body.to_string())
    }

    fn next_index(&self) -> usize {
        self.items.len()
    }

    fn summary(&self) -> bool {
        self.frame.request.reasoning.summary.is_some()
    }

    /// Opens the reasoning item (closing a message first).
    fn open_reasoning(&mut self, out: &mut Vec<SseEvent>) {
        if matches!(self.open, Some(Open::Reasoning { .. })) {
            return;
        }
        self.close(out);
        let index = self.next_index();
        let item = reasoning_item(&self.ids.reasoning, "", &self.frame.request, "in_progress");
        let e = self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        );
        out.push(e);
        if self.summary() {
            let e = self.event(
                "response.reasoning_summary_part.added",
                json!({"item_id": self.ids.reasoning, "output_index": index, "summary_index": 0,
                       "part": {"type": "summary_text", "text": ""}}),
            );
            out.push(e);
        }
        self.open = Some(Open::Reasoning {
            index,
            text: String::new(),
        });
    }

    /// Opens the message item (closing the reasoning first).
    fn open_message(&mut self, out: &mut Vec<SseEvent>) {
        if matches!(self.open, Some(Open::Message { .. })) {
            return;
        }
        self.close(out);
        let index = self.next_index();
        let item = json!({"type": "message", "id": self.ids.message, "status": "in_progress",
                          "role": "assistant", "content": []});
        let e = self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        );
        out.push(e);
        let e = self.event(
            "response.content_part.added",
            json!({"item_id": self.ids.message, "output_index": index, "content_index": 0,
                   "part": output_text("", None)}),
        );
        out.push(e);
        self.open = Some(Open::Message {
            index,
            text: String::new(),
            logprobs: Vec::new(),
        });
    }

    /// Adds reasoning and text to the items they belong in.
    fn add(
        &mut self,
        reasoning: &str,
        text: &str,
        logprobs: &[TokenLogprobs],
        out: &mut Vec<SseEvent>,
    ) {
        if !reasoning.is_empty() {
            self.open_reasoning(out);
            if let Some(Open::Reasoning { index, text: t }) = &mut self.open {
                t.push_str(reasoning);
                let index = *index;
                let (kind, key) = if self.summary() {
                    ("response.reasoning_summary_text.delta", "summary_index")
                } else {
                    ("response.reasoning_text.delta", "content_index")
                };
                let e = self.event(
                    kind,
                    json!({"item_id": self.ids.reasoning, "output_index": index, key: 0,
                           "delta": reasoning}),
                );
                out.push(e);
            }
        }
        if !text.is_empty() {
            self.open_message(out);
            let wants = self.frame.request.logprobs();
            if let Some(Open::Message {
                index,
                text: t,
                logprobs: lp,
            }) = &mut self.open
            {
                t.push_str(text);
                lp.extend_from_slice(logprobs);
                let index = *index;
                let delta_lp = if wants {
                    logprobs_json(logprobs, &self.bytes)
                } else {
                    json!([])
                };
                let e = self.event(
                    "response.output_text.delta",
                    json!({"item_id": self.ids.message, "output_index": index, "content_index": 0,
                           "delta": text, "logprobs": delta_lp}),
                );
                out.push(e);
            }
        }
    }

    /// Closes the open item: its content's done events, then the item's.
    fn close(&mut self, out: &mut Vec<SseEvent>) {
        let status = self.item_status();
        match self.open.take() {
            None => {}
            Some(Open::Reasoning { index, text }) => {
                let id = self.ids.reasoning.clone();
                if self.summary() {
                    let e = self.event(
                        "response.reasoning_summary_text.done",
                        json!({"item_id": id, "output_index": index, "summary_index": 0, "text": text}),
                    );
                    out.push(e);
                    let e = self.event(
                        "response.reasoning_summary_part.done",
                        json!({"item_id": id, "output_index": index, "summary_index": 0,
                               "part": {"type": "summary_text", "text": text}}),
                    );
                    out.push(e);
                } else {
                    let e = self.event(
                        "response.reasoning_text.done",
                        json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}),
                    );
                    out.push(e);
                }
                let item = reasoning_item(&id, &text, &self.frame.request, status);
                let e = self.event(
                    "response.output_item.done",
                    json!({"output_index": index, "item": item}),
                );
                out.push(e);
                self.items.push(item);
            }
            Some(Open::Message {
                index,
                text,
                logprobs,
            }) => {
                let id = self.ids.message.clone();
                let lp = self
                    .frame
                    .request
                    .logprobs()
                    .then(|| logprobs_json(&logprobs, &self.bytes));
                let e = self.event(
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0,
                           "text": text, "logprobs": lp.clone().unwrap_or_else(|| json!([]))}),
                );
                out.push(e);
                let part = output_text(&text, lp.clone());
                let e = self.event(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
                );
                out.push(e);
                let item = message_item(&id, &text, lp, status);
                let e = self.event(
                    "response.output_item.done",
                    json!({"output_index": index, "item": item}),
                );
                out.push(e);
                self.items.push(item);
            }
        }
    }

    fn item_status(&self) -> &'static str {
        match self.end.as_ref().map(|(r, _)| Status::of(*r)) {
            Some(Status::Completed) | None => "completed",
            Some(_) => "incomplete",
        }
    }

    /// The reply's end: its last text, its items closed, then each call as an item.
    fn choice_done(&mut self, e: &ChoiceEnd) -> Vec<SseEvent> {
        let mut out = Vec::new();
        self.end = Some((e.finish_reason, e.tokens.clone()));
        if self.prewarm {
            return out;
        }
        self.add(&e.reasoning, &e.text, &e.logprobs, &mut out);
        if e.tool_calls.is_empty() && !matches!(self.open, Some(Open::Message { .. })) {
            // A reply with no text and no calls still has its (empty) message.
            self.open_message(&mut out);
        }
        self.close(&mut out);
        for call in &e.tool_calls {
            let index = self.next_index();
            let id = call_item_id(call);
            let added = function_call_item(&id, call, "", "in_progress");
            let ev = self.event(
                "response.output_item.added",
                json!({"output_index": index, "item": added}),
            );
            out.push(ev);
            let args = &call.function.arguments;
            let ev = self.event(
                "response.function_call_arguments.delta",
                json!({"item_id": id, "output_index": index, "delta": args}),
            );
            out.push(ev);
            let ev = self.event(
                "response.function_call_arguments.done",
                json!({"item_id": id, "output_index": index, "arguments": args,
                       "name": call.function.name}),
            );
            out.push(ev);
            let item = function_call_item(&id, call, args, "completed");
            let ev = self.event(
                "response.output_item.done",
                json!({"output_index": index, "item": item}),
            );
            out.push(ev);
            self.items.push(item);
        }
        out
    }
}

impl Encoder for Streaming {
    fn opening(&mut self) -> Vec<SseEvent> {
        let object = self.frame.object(Status::InProgress, &[], None, None, None);
        let created = self.event("response.created", json!({"response": object}));
        let in_progress = self.event("response.in_progress", json!({"response": object}));
        vec![created, in_progress]
    }

    fn on(&mut self, o: Out) -> Vec<SseEvent> {
        match o {
            Out::Delta {
                text,
                reasoning,
                logprobs,
                ..
            } => {
                if self.prewarm {
                    return Vec::new();
                }
                let mut out = Vec::new();
                self.add(&reasoning, &text, &logprobs, &mut out);
                out
            }
            Out::PromptProgress(_) | Out::PromptReused { .. } => Vec::new(),
            Out::ChoiceDone(e) => self.choice_done(&e),
            // The end goes through `finish`, which stores the response first.
            Out::Done(_) => Vec::new(),
        }
    }

    fn finish(&mut self, outcome: &RequestOutcome) -> Option<Finishing> {
        let mut out = Vec::new();
        self.close(&mut out);
        let reason = self
            .end
            .as_ref()
            .map_or(ApiFinishReason::Error, |(r, _)| *r);
        let error = error_object(outcome);
        let status = if error.is_some() {
            Status::Failed
        } else {
            Status::of(reason)
        };
        let usage = ResponsesUsage::of(outcome, self.prewarm);
        let mut object = self.frame.object(
            status,
            &self.items,
            Some(&usage),
            error,
            incomplete_reason(reason).filter(|_| status == Status::Incomplete),
        );
        let tokens = self.end.take().map(|(_, t)| t).unwrap_or_default();
        self.st
            .diagnostics
            .finish(&self.frame.id, tokens.as_slice().into());
        let pending = self.pending.take().filter(|_| status != Status::Failed);
        let items = std::mem::take(&mut self.items);
        let seq = self.seq;
        self.seq += 1;
        let prewarm = self.prewarm;
        let parent = outcome.span.clone();
        Some(Box::pin(async move {
            // A response the store fails to save is still completed, marked `store: false`.
            if let Some(p) = pending {
                let reply = if prewarm { Vec::new() } else { tokens };
                p.save(items, reply, &mut object, parent.as_ref()).await;
            }
            let kind = status.final_event();
            let body = json!({"type": kind, "sequence_number": seq, "response": object});
            out.push(SseEvent::default().event(kind).data(body.to_string()));
            out
        }))
    }
}
