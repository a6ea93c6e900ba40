//! The one request path every front door takes, and that no door's types enter.
//!
//! A door takes its wire body apart and translates it into the shared request: the
//! conversation or prompt and the options as the client asked for them ([`input`]; the
//! OpenAI-shaped JSON reading of it that chat completions, completions, render and tokenize
//! share is [`parse`]). [`validate`] checks it into a [`ValidRequest`] (prompt built, tools set
//! up ([`tools`]), grammar compiled, [`prediction`] tokenized) before anything is queued; the
//! door names its session keys in its order and [`session`] resolves them, the same way for
//! every door. [`launch`] puts the request on the engine and answers it, collected whole or
//! streamed through the door's encoder; [`pipeline`] runs its task (events to output, with
//! [`reasoning`] and tool calls parsed). Once it ends, its one [`outcome`] (with its
//! [`usage`]) is what the response, the spans ([`trace`], [`content`] with
//! `--trace-content`), the log line and the metrics ([`record`]) read. [`arrival`] is what the
//! HTTP layer knew when the request came in.
//!
//! [`ValidRequest`] comes out of the checks whole; [`RequestMeta`] adds what the HTTP side
//! knows (the id, the session, the arrival), built once per launched request and shared by the
//! request's task, its spans, its log line and the response, which read it rather than copy
//! it.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

pub mod arrival;
pub mod content;
pub mod input;
pub mod launch;
pub mod outcome;
pub mod parse;
pub mod pipeline;
pub mod prediction;
pub mod reasoning;
pub mod record;
pub mod session;
pub mod tools;
pub mod trace;
pub mod usage;
pub mod validate;

use self::content::InputContent;
use self::input::{ChatRequest, CompletionRequest};
pub use self::validate::{GrammarRequest, ValidOptions};
use crate::constraint::{Constraint, ConstraintKind};
use crate::scheduler::GenerateRequest;
use crate::server::error::{ApiError, ErrorKind};
use crate::server::request::reasoning::ReasoningStart;
use crate::server::request::session::TurnSession;
use crate::server::request::tools::ToolSetup;
use crate::server::state::AppState;

/// Which API (front door) a request came through. Every API takes the one request path; this
/// names the operation, the response ids and the `slotlight.api` attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `POST /v1/chat/completions` (OpenAI chat completions).
    Chat,
    /// `POST /v1/completions` (OpenAI legacy completions).
    Completions,
    /// `POST /v1/responses` (OpenAI Responses).
    Responses,
    /// `POST /v1/messages` (Anthropic Messages).
    Messages,
}

impl Api {
    /// The GenAI operation name (`gen_ai.operation.name`, the log line's `operation`).
    pub fn operation(self) -> &'static str {
        match self {
            Api::Completions => slotlight_otel::span::OPERATION_TEXT_COMPLETION,
            Api::Chat | Api::Responses | Api::Messages => slotlight_otel::span::OPERATION_CHAT,
        }
    }

    /// The `slotlight.api` value (span attribute, log line, metric label, turn record).
    pub fn label(self) -> &'static str {
        use slotlight_otel::attr::value;
        match self {
            Api::Chat => value::API_CHAT_COMPLETIONS,
            Api::Completions => value::API_COMPLETIONS,
            Api::Responses => value::API_RESPONSES,
            Api::Messages => value::API_MESSAGES,
        }
    }

    /// The prefix of the API's response ids, separator included (`chatcmpl-`, `resp_`).
    pub fn id_prefix(self) -> &'static str {
        match self {
            Api::Chat => "chatcmpl-",
            Api::Completions => "cmpl-",
            Api::Responses => "resp_",
            Api::Messages => "msg_",
        }
    }

    /// The prefix of the ids of the tool calls a reply makes (`call_`, Anthropic's `toolu_`).
    pub fn tool_call_prefix(self) -> &'static str {
        match self {
            Api::Messages => "toolu_",
            Api::Chat | Api::Completions | Api::Responses => "call_",
        }
    }
}

/// A request ready to generate: checked, its prompt built and its grammar compiled.
#[derive(Debug, Clone)]
pub struct ValidRequest {
    /// The API the request came through: it shapes the response and names the operation.
    pub api: Api,
    /// The model the client asked for (`gen_ai.request.model`).
    pub request_model: String,
    /// The model that serves the request (`gen_ai.response.model`; names the span).
    pub model: String,
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Prompt text (rendered chat, or the completion prompt).
    pub prompt_text: String,
    /// The checked generation options, the same for every API.
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
    /// The types of the tools the request offered that the engine cannot run (hosted tools),
    /// accepted and left out of the prompt (`slotlight.tools.skipped`).
    pub tools_skipped: Vec<String>,
    /// The completion token limit the client asked for, when the door clamped it to
    /// `opts.max_tokens` (`slotlight.request.max_tokens_asked`).
    pub max_tokens_asked: Option<usize>,
    /// The prediction's token ids (drafted from first; never changes the output).
    pub prediction: Option<Vec<u32>>,
    /// How long after this turn its session's KV should be kept, when the request asked
    /// (Responses `prompt_cache_options.ttl`, Messages `cache_control.ttl`); the engine
    /// clamps it to `--session-kv-ttl-max`.
    pub session_ttl: Option<Duration>,
}

impl ValidRequest {
    /// Validates a chat request that came through `api`, renders its prompt and compiles its
    /// grammar: the request comes out whole, or refused.
    pub async fn chat(st: &AppState, api: Api, req: ChatRequest) -> Result<Self, ApiError> {
        let opts = req.common.validate(&st.cfg.limits, st.vocab)?;
        let model = st.check_model(req.common.model.as_deref())?;
        let logprobs = validate::chat_logprobs(&req)?;
        let (text, prompt, tools) = validate::chat_prompt(st, &req, true)?;
        validate::no_grammar_with_tools(opts.grammar.as_ref(), tools.as_ref())?;
        let reasoning =
            validate::chat_reasoning(st, &req, opts.grammar.as_ref(), tools.as_ref(), &text)?;
        let constraint = validate::compile(st, opts.grammar.as_ref(), tools.as_ref()).await?;
        // Tools offered and not taken: the template cannot call them (`--generic-tools off`).
        let tools_skipped = if tools.is_none() && req.tools.as_ref().is_some_and(|t| !t.is_empty())
        {
            vec!["function".to_string()]
        } else {
            Vec::new()
        };
        let prediction = validate::prediction_tokens(st, opts.prediction.as_deref())?;
        Ok(Self {
            api,
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
            tools_skipped,
            max_tokens_asked: None,
            prediction,
            session_ttl: None,
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
            api: Api::Completions,
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
            tools_skipped: Vec::new(),
            max_tokens_asked: None,
            prediction,
            session_ttl: None,
        })
    }

    /// The engine's request for this one: `id`, the session key, the arrival and the cancel
    /// flag come from the HTTP side. Without a key the engine looks for the session the
    /// prompt continues.
    pub fn to_engine(
        &self,
        id: &str,
        session: Option<String>,
        received: Instant,
        cancel: Arc<AtomicBool>,
    ) -> GenerateRequest {
        let opts = &self.opts;
        GenerateRequest {
            find_session: session.is_none(),
            session_branch: 0,
            session_ttl: self.session_ttl,
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

    /// Clamps `max_tokens` (already at most `--max-tokens-limit`) to what a context of
    /// `context` tokens leaves after the prompt, or refuses a prompt that leaves no room
    /// (`context_length_exceeded`, naming `param`); `asked` is what the client asked for,
    /// recorded on the span when it was more than the request runs with.
    pub fn clamp_to_context(
        &mut self,
        context: usize,
        param: &str,
        asked: Option<usize>,
    ) -> Result<(), ApiError> {
        let room = context.saturating_sub(self.prompt.len());
        if room == 0 {
            let mut e = ApiError::invalid_param(
                param,
                format!(
                    "the prompt is {} tokens, which leaves no room in the context of {context} tokens",
                    self.prompt.len(),
                ),
            );
            e.error = ErrorKind::ContextLength;
            e.code = Some("context_length_exceeded");
            return Err(e);
        }
        self.opts.max_tokens = self.opts.max_tokens.min(room);
        if let Some(asked) = asked
            && asked > self.opts.max_tokens
        {
            self.max_tokens_asked = Some(asked);
        }
        Ok(())
    }

    /// The kind of the request's output constraint, when it has one.
    pub fn constraint_kind(&self) -> Option<ConstraintKind> {
        self.constraint.as_ref().map(Constraint::kind)
    }
}

/// One launched request as everything that answers or records it reads it: the valid request
/// and the facts the HTTP side adds. Built once, when the engine has taken the request (or
/// refused it), and shared by its task, its spans, its log line and its response.
#[derive(Debug)]
pub struct RequestMeta {
    /// Request id (also the response id).
    pub id: String,
    /// The session (`gen_ai.conversation.id`): the request's key, or the session the engine
    /// found for it, with the turn's place in it.
    pub session: Option<TurnSession>,
    /// Arrival at the HTTP layer: the request span's start.
    pub received: Instant,
    /// The request itself.
    pub request: ValidRequest,
}

impl RequestMeta {
    /// The GenAI operation name of the request's api.
    pub fn operation(&self) -> &'static str {
        self.request.api.operation()
    }

    /// The session id, if the request has a session.
    pub fn session_id(&self) -> Option<&str> {
        self.session.as_ref().map(|s| s.id.as_str())
    }
}
