//! The stream encoder of chat completions and completions: the request path's output as
//! chunks of `data:` JSON, then `[DONE]`.

use axum::response::sse::Event as SseEvent;

use super::response::Shape;
use super::translate::Kind;
use super::types::{
    ChatChunk, ChunkChoice, ChunkUsage, Delta, TextChoice, TextCompletion, ToolCallDelta,
};
use crate::sampling::TokenLogprobs;
use crate::scheduler::PromptProgress;
use crate::server::error::ApiError;
use crate::server::request::launch::Encoder;
use crate::server::request::outcome::{ApiFinishReason, RequestOutcome};
use crate::server::request::pipeline::{ChoiceEnd, Out};

/// A chunk of either API.
enum Chunk {
    Chat(ChatChunk),
    Text(TextCompletion),
}

impl Chunk {
    /// The chunk as an SSE event. A chunk that does not serialize is reported (a log line,
    /// and an error body in its place), never sent as an empty event.
    fn event(&self) -> SseEvent {
        let r = match self {
            Chunk::Chat(c) => serde_json::to_string(c),
            Chunk::Text(c) => serde_json::to_string(c),
        };
        let data = r.unwrap_or_else(|e| {
            tracing::error!(error = %e, "Response.ChunkUnserializable");
            ApiError::internal(format!("a response chunk did not serialize: {e}"))
                .body()
                .to_string()
        });
        SseEvent::default().data(data)
    }

    fn set_usage(&mut self, usage: Option<ChunkUsage>) {
        match self {
            Chunk::Chat(c) => c.usage = usage,
            Chunk::Text(c) => c.usage = usage,
        }
    }

    fn set_timings(&mut self, f: &RequestOutcome) {
        match self {
            Chunk::Chat(c) => c.timings = Some(f.timings.clone()),
            Chunk::Text(c) => c.timings = Some(f.timings.clone()),
        }
    }
}

/// The stream encoder of chat completions and completions: chunks of `data:` JSON, then
/// `[DONE]`.
pub struct Streaming {
    shape: Shape,
    remaining: usize,
    /// Characters sent per choice (legacy `text_offset`).
    offsets: Vec<usize>,
    /// The last choice's finishing chunk, held until the usage is known.
    held: Option<Chunk>,
}

impl Streaming {
    /// The stream encoder of the response `shape` writes.
    pub fn new(shape: Shape) -> Self {
        let n = shape.n();
        Self {
            remaining: n,
            offsets: vec![0; n],
            held: None,
            shape,
        }
    }

    /// A chunk with these choices (chat) and nothing else.
    fn chat_chunk(&self, choices: Vec<ChunkChoice>) -> ChatChunk {
        ChatChunk {
            head: self.shape.head(true),
            choices,
            usage: None,
            timings: None,
            prompt_progress: None,
        }
    }

    /// A chunk with these choices (completions) and nothing else.
    fn text_chunk(&self, choices: Vec<TextChoice>) -> TextCompletion {
        TextCompletion {
            head: self.shape.head(true),
            choices,
            usage: None,
            timings: None,
            prompt_progress: None,
        }
    }

    /// A chunk of no choices (progress, usage), in the API's shape.
    fn bare_chunk(&self) -> Chunk {
        match self.shape.kind {
            Kind::Chat => Chunk::Chat(self.chat_chunk(Vec::new())),
            Kind::Completions => Chunk::Text(self.text_chunk(Vec::new())),
        }
    }

    /// A `prompt_progress` chunk: no choices (like the usage chunk, which OpenAI's own
    /// clients read), and the prefill's counts beside them.
    fn progress(&self, p: PromptProgress) -> Chunk {
        let mut c = self.bare_chunk();
        match &mut c {
            Chunk::Chat(c) => c.prompt_progress = Some(p),
            Chunk::Text(c) => c.prompt_progress = Some(p),
        }
        c
    }

    /// A chunk of content and reasoning (and their tokens' log-probabilities) for one choice.
    /// A chunk of reasoning alone carries no `content`.
    fn content(
        &mut self,
        index: usize,
        text: String,
        reasoning: String,
        logprobs: &[TokenLogprobs],
        finish: Option<ApiFinishReason>,
    ) -> Chunk {
        match self.shape.kind {
            Kind::Chat => Chunk::Chat(self.chat_chunk(vec![ChunkChoice {
                index,
                delta: Delta {
                    role: None,
                    content: (!text.is_empty() || (finish.is_none() && reasoning.is_empty()))
                        .then_some(text),
                    reasoning_content: (!reasoning.is_empty()).then_some(reasoning),
                    tool_calls: Vec::new(),
                },
                logprobs: (!logprobs.is_empty())
                    .then(|| self.shape.chat_logprobs(logprobs))
                    .flatten(),
                finish_reason: finish,
            }])),
            Kind::Completions => {
                let offset = self.offsets.get(index).copied().unwrap_or(0);
                if let Some(o) = self.offsets.get_mut(index) {
                    *o += text.chars().count();
                }
                let logprobs = (!logprobs.is_empty())
                    .then(|| self.shape.text_logprobs(logprobs, offset))
                    .flatten();
                Chunk::Text(self.text_chunk(vec![TextChoice {
                    index,
                    text,
                    logprobs,
                    finish_reason: finish,
                }]))
            }
        }
    }

    /// A chat chunk with one choice's tool calls, each whole.
    fn tool_calls(&self, e: &ChoiceEnd) -> Chunk {
        let calls = e
            .tool_calls
            .iter()
            .enumerate()
            .map(|(index, c)| ToolCallDelta {
                index,
                call: c.clone(),
            })
            .collect();
        Chunk::Chat(self.chat_chunk(vec![ChunkChoice {
            index: e.choice,
            delta: Delta {
                tool_calls: calls,
                ..Delta::default()
            },
            logprobs: None,
            finish_reason: None,
        }]))
    }

    /// The end of one choice: its last content, its tool calls (chat) and its finishing
    /// chunk, the last choice's held until the usage is known.
    fn choice_done(&mut self, e: &ChoiceEnd) -> Vec<SseEvent> {
        let mut v = Vec::new();
        let mut logprobs = e.logprobs.clone();
        if !e.text.is_empty() || !e.reasoning.is_empty() {
            let c = self.content(
                e.choice,
                e.text.clone(),
                e.reasoning.clone(),
                &logprobs,
                None,
            );
            v.push(c.event());
            logprobs.clear();
        }
        if !e.tool_calls.is_empty() && self.shape.kind == Kind::Chat {
            v.push(self.tool_calls(e).event());
        }
        let finish = self.content(
            e.choice,
            String::new(),
            String::new(),
            &logprobs,
            Some(e.finish_reason),
        );
        self.remaining = self.remaining.saturating_sub(1);
        if self.remaining == 0 {
            self.held = Some(finish);
        } else {
            v.push(finish.event());
        }
        v
    }

    /// The request's end: the held finishing chunk with the timings (and the usage with
    /// `continuous_usage_stats`), then the usage chunk with `include_usage`.
    fn done(&mut self, f: &RequestOutcome) -> Vec<SseEvent> {
        if let Some(e) = f.api_error() {
            return vec![SseEvent::default().data(e.body().to_string())];
        }
        let mut v = Vec::new();
        if let Some(mut last) = self.held.take() {
            last.set_timings(f);
            if self.shape.continuous() {
                last.set_usage(Some(ChunkUsage::Full(Box::new(f.usage.clone()))));
            }
            v.push(last.event());
        }
        if self.shape.req().opts.include_usage {
            let mut c = self.bare_chunk();
            c.set_usage(Some(ChunkUsage::Full(Box::new(f.usage.clone()))));
            c.set_timings(f);
            v.push(c.event());
        }
        v
    }
}

impl Encoder for Streaming {
    /// Chat: each choice's role chunk. Completions with `echo`: each choice's prompt.
    fn opening(&mut self) -> Vec<SseEvent> {
        let n = self.shape.n();
        match self.shape.kind {
            Kind::Chat => (0..n)
                .map(|index| {
                    Chunk::Chat(self.chat_chunk(vec![ChunkChoice {
                        index,
                        delta: Delta {
                            role: Some("assistant"),
                            content: Some(String::new()),
                            ..Delta::default()
                        },
                        logprobs: None,
                        finish_reason: None,
                    }]))
                    .event()
                })
                .collect(),
            Kind::Completions => match self.shape.echo().map(str::to_string) {
                Some(echo) => (0..n)
                    .map(|index| {
                        self.offsets[index] = echo.chars().count();
                        Chunk::Text(self.text_chunk(vec![TextChoice {
                            index,
                            text: echo.clone(),
                            logprobs: None,
                            finish_reason: None,
                        }]))
                        .event()
                    })
                    .collect(),
                None => Vec::new(),
            },
        }
    }

    fn on(&mut self, o: Out) -> Vec<SseEvent> {
        match o {
            Out::Delta {
                choice,
                text,
                reasoning,
                generated,
                logprobs,
            } => {
                if text.is_empty() && reasoning.is_empty() && !self.shape.continuous() {
                    return Vec::new();
                }
                let mut c = self.content(choice, text, reasoning, &logprobs, None);
                if self.shape.continuous() {
                    let prompt_tokens = self.shape.req().prompt.len();
                    c.set_usage(Some(ChunkUsage::Partial {
                        prompt_tokens,
                        completion_tokens: generated,
                        total_tokens: prompt_tokens + generated,
                    }));
                }
                vec![c.event()]
            }
            Out::PromptProgress(p) => vec![self.progress(p).event()],
            Out::PromptReused { .. } => Vec::new(),
            Out::ChoiceDone(e) => self.choice_done(&e),
            Out::Done(f) => self.done(&f),
        }
    }

    fn closing(&mut self) -> Vec<SseEvent> {
        vec![SseEvent::default().data("[DONE]")]
    }
}
