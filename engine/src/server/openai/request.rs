//! A request as the server holds it once it is valid. [`ValidRequest`] comes out of the checks
//! whole: its options checked, its prompt built, its tools set up and its grammar compiled,
//! before anything is queued. [`RequestMeta`] adds what the HTTP side knows (the id, the
//! session, the arrival); it is built once per launched request and shared by the request's
//! task, its spans, its log line and the response, which read it rather than copy it. The
//! checks themselves live in [`super::validate`].

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use super::reasoning::ReasoningStart;
use super::tools::ToolSetup;
use super::types::{ChatRequest, CompletionRequest};
use super::validate;
use crate::constraint::{Constraint, ConstraintKind, GrammarSpec};
use crate::sampling::SamplingParams;
use crate::scheduler::GenerateRequest;
use crate::server::AppState;
use crate::server::content::InputContent;
use crate::server::error::ApiError;
use crate::stop::StopMatcher;

/// Which endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completions`.
    Completions,
}

impl Endpoint {
    /// The GenAI operation name (`gen_ai.operation.name`, the log line's `operation`).
    pub fn operation(self) -> &'static str {
        match self {
            Endpoint::Chat => slotlight_otel::span::OPERATION_CHAT,
            Endpoint::Completions => slotlight_otel::span::OPERATION_TEXT_COMPLETION,
        }
    }

    /// The prefix of the endpoint's response ids.
    pub fn id_prefix(self) -> &'static str {
        match self {
            Endpoint::Chat => "chatcmpl",
            Endpoint::Completions => "cmpl",
        }
    }
}

/// A grammar the output must follow, where it came from, and what kind of constraint it is.
#[derive(Debug, Clone, PartialEq)]
pub struct GrammarRequest {
    /// The grammar itself, in the form it was given (schema, regex, choice or Lark).
    pub spec: GrammarSpec,
    /// The request field it came from (the `param` of a 400 when it does not compile).
    pub param: &'static str,
    /// The kind of constraint (`slotlight.constraint.kind` once written).
    pub kind: ConstraintKind,
}

/// Validated generation options shared by both endpoints.
#[derive(Debug, Clone)]
pub struct ValidOptions {
    /// Completion token limit.
    pub max_tokens: usize,
    /// Sampling parameters, checked, with the request's seed.
    pub sampling: SamplingParams,
    /// The stop strings, checked here once: the engine takes the matcher as it is.
    pub stop: StopMatcher,
    /// How many choices to generate (`n`), 1 to the `max_n` limit.
    pub n: usize,
    /// Whether the reply is streamed as server-sent events.
    pub stream: bool,
    /// Whether a stream ends with a chunk of usage (`stream_options.include_usage`).
    pub include_usage: bool,
    /// Whether every chunk carries usage (`stream_options.continuous_usage_stats`).
    pub continuous_usage: bool,
    /// The end-user id (`user`) the client gave, kept apart from the session hint.
    pub user: Option<String>,
    /// The session hint from the body (`prompt_cache_key`, else `user`, else
    /// `safety_identifier`); the `x-session-id` header wins over it.
    pub session_hint: Option<String>,
    /// Whether generation goes on past the end-of-sequence token (`ignore_eos`).
    pub ignore_eos: bool,
    /// Whether a stream carries `prompt_progress` chunks while the prompt is prefilled
    /// (`return_progress` with `stream`; a whole response never does).
    pub return_progress: bool,
    /// The output constraint from `response_format`, `structured_outputs`, `json_schema` or
    /// `grammar`.
    pub grammar: Option<GrammarRequest>,
    /// `frequency_penalty` as the request gave it (`sampling` holds the value in force); the
    /// span records it only when given.
    pub frequency_penalty_given: Option<f32>,
    /// `presence_penalty` as the request gave it; the span records it only when given.
    pub presence_penalty_given: Option<f32>,
    /// `n` as the request gave it; the span records it only when given.
    pub n_given: Option<i64>,
    /// The reply the client expects (`prediction`), as text.
    pub prediction: Option<String>,
}

/// A request ready to generate: checked, its prompt built and its grammar compiled.
#[derive(Debug, Clone)]
pub struct ValidRequest {
    /// The endpoint the request came to: it shapes the response and names the operation.
    pub endpoint: Endpoint,
    /// The model the client asked for (`gen_ai.request.model`).
    pub request_model: String,
    /// The model that serves the request (`gen_ai.response.model`; names the span).
    pub model: String,
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Prompt text (rendered chat, or the completion prompt).
    pub prompt_text: String,
    /// The checked generation options shared by both endpoints.
    pub opts: ValidOptions,
    /// Log-probabilities per token with this many alternatives (`None`: off).
    pub logprobs: Option<usize>,
    /// Completions' `echo`: the prompt comes back before the completion.
    pub echo: bool,
    /// The tools a chat request offers, and how their calls are parsed from the reply.
    pub tools: Option<ToolSetup>,
    /// The compiled constraint, when the request has a grammar or enforced tool calls.
    pub constraint: Option<Constraint>,
    /// Where the reply starts with respect to a reasoning block (chat with a thinking
    /// template); `None`: no reasoning parsing.
    pub reasoning: Option<ReasoningStart>,
    /// The request's content for its span, built only with `--trace-content`.
    pub content: Option<InputContent>,
    /// The prediction's token ids (drafted from first; never changes the output).
    pub prediction: Option<Vec<u32>>,
}

impl ValidRequest {
    /// Validates a chat request, renders its prompt and compiles its grammar: the request
    /// comes out whole, or refused.
    pub async fn chat(st: &AppState, req: ChatRequest) -> Result<Self, ApiError> {
        let opts = req.common.validate(&st.cfg.limits, st.vocab)?;
        let model = st.check_model(req.common.model.as_deref())?;
        let logprobs = validate::chat_logprobs(&req)?;
        let (text, prompt, tools) = validate::chat_prompt(st, &req, true)?;
        validate::no_grammar_with_tools(opts.grammar.as_ref(), tools.as_ref())?;
        let reasoning =
            validate::chat_reasoning(st, &req, opts.grammar.as_ref(), tools.as_ref(), &text)?;
        let constraint = validate::compile(st, opts.grammar.as_ref(), tools.as_ref()).await?;
        let prediction = validate::prediction_tokens(st, opts.prediction.as_deref())?;
        Ok(Self {
            endpoint: Endpoint::Chat,
            request_model: req.common.model.clone().unwrap_or_else(|| model.clone()),
            model,
            prompt,
            prompt_text: text,
            opts,
            logprobs,
            echo: false,
            tools,
            constraint,
            reasoning,
            content: st
                .cfg
                .trace_content
                .then(|| InputContent::chat(&req.messages, req.tools.as_deref())),
            prediction,
        })
    }

    /// Validates a completion request, encodes its prompt and compiles its grammar.
    pub async fn completion(st: &AppState, req: CompletionRequest) -> Result<Self, ApiError> {
        let opts = req.common.validate(&st.cfg.limits, st.vocab)?;
        let model = st.check_model(req.common.model.as_deref())?;
        validate::best_of(&req, opts.n)?;
        let logprobs = validate::completion_logprobs(&req)?;
        let (text, prompt) = validate::completion_prompt(st, &req)?;
        let constraint = validate::compile(st, opts.grammar.as_ref(), None).await?;
        let prediction = validate::prediction_tokens(st, opts.prediction.as_deref())?;
        let content = st
            .cfg
            .trace_content
            .then(|| InputContent::completion(&text));
        Ok(Self {
            endpoint: Endpoint::Completions,
            request_model: req.common.model.clone().unwrap_or_else(|| model.clone()),
            model,
            prompt,
            prompt_text: text,
            opts,
            logprobs,
            echo: req.echo,
            tools: None,
            constraint,
            reasoning: None,
            content,
            prediction,
        })
    }

    /// The engine's request for this one: `id`, the session, the arrival and the cancel flag
    /// come from the HTTP side.
    pub fn to_engine(
        &self,
        id: &str,
        session: Option<String>,
        received: Instant,
        cancel: Arc<AtomicBool>,
    ) -> GenerateRequest {
        let opts = &self.opts;
        GenerateRequest {
            id: id.to_string(),
            prompt: self.prompt.clone(),
            max_tokens: opts.max_tokens,
            sampling: opts.sampling.clone(),
            stop: opts.stop.clone(),
            ignore_eos: opts.ignore_eos,
            session,
            received,
            cancel,
            n: opts.n,
            logprobs: self.logprobs,
            constraint: self.constraint.clone(),
            prediction: self.prediction.clone(),
        }
    }

    /// The kind of the request's output constraint, when it has one.
    pub fn constraint_kind(&self) -> Option<ConstraintKind> {
        self.constraint.as_ref().map(Constraint::kind)
    }
}

/// One launched request as everything that answers or records it reads it: the valid request
/// and the facts the HTTP side adds. Built once, when the request is launched, and shared by
/// its task, its spans, its log line and its response.
#[derive(Debug)]
pub struct RequestMeta {
    /// Request id (also the response id).
    pub id: String,
    /// The session (`gen_ai.conversation.id`), from `x-session-id` or the body's hint.
    pub session: Option<String>,
    /// Arrival at the HTTP layer: the request span's start.
    pub received: Instant,
    /// The request itself.
    pub request: ValidRequest,
}

impl RequestMeta {
    /// The GenAI operation name of the request's endpoint.
    pub fn operation(&self) -> &'static str {
        self.request.endpoint.operation()
    }

    /// The engine's request for this one, cancelled through `cancel`.
    pub fn to_engine(&self, cancel: Arc<AtomicBool>) -> GenerateRequest {
        self.request
            .to_engine(&self.id, self.session.clone(), self.received, cancel)
    }
}
