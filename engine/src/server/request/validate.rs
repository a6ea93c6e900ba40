//! The checks that turn a request as a front door took it apart ([`super::input`]) into the
//! parts of a [`ValidRequest`](super::ValidRequest): every value checked against the limits,
//! the prompt built, tools set up, and the grammar compiled, all before anything is queued.
//! Every API meets here; [`super`] puts the checked parts together.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde_json::{Value, json};

use super::input::{
    ChatRequest, Common, CompletionRequest, Content, InputToolChoice, Prompt, ResponseFormat,
    StringOrList, StructuredOutputs,
};
use crate::chat_template::{ChatMessage, Role};
use crate::constraint::{Constraint, ConstraintKind, GrammarSpec};
use crate::replies::ReplyKey;
use crate::sampling::SamplingParams;
use crate::server::error::ApiError;
use crate::server::request::reasoning::ReasoningStart;
use crate::server::request::tools::{self, Tool, ToolChoice, ToolFormat, ToolSetup};
use crate::server::state::{AppState, Limits};
use crate::stop::StopMatcher;

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
    /// `prompt_cache_key`, kept apart (a session key of its own source,
    /// [`crate::server::request::session`]).
    pub prompt_cache_key: Option<String>,
    /// The stored response a Responses request continues (`previous_response_id`).
    pub previous_response_id: Option<String>,
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

/// Refuses `param` when it holds more than `max` items (`what` names them in the message).
fn at_most(param: &str, what: &str, given: usize, max: usize) -> Result<(), ApiError> {
    if given > max {
        return Err(ApiError::invalid_param(
            param,
            format!("{given} {what} given; at most {max} are allowed"),
        ));
    }
    Ok(())
}

fn check_id(param: &str, s: &Option<String>) -> Result<(), ApiError> {
    if let Some(u) = s
        && u.len() > 256
    {
        return Err(ApiError::invalid_param(
            param,
            format!("{param} is longer than 256 bytes"),
        ));
    }
    Ok(())
}

impl Common {
    /// Checks every field against the limits; `vocab` bounds `logit_bias` ids.
    pub fn validate(&self, limits: &Limits, vocab: usize) -> Result<ValidOptions, ApiError> {
        let n = match self.n {
            None => 1,
            Some(n) if n < 1 || usize::try_from(n).map_or(true, |n| n > limits.max_n) => {
                return Err(ApiError::invalid_param(
                    "n",
                    format!("n must be between 1 and {} (got {n})", limits.max_n),
                ));
            }
            Some(n) => usize::try_from(n).unwrap_or(1),
        };
        let max_tokens = match self.max_completion_tokens.or(self.max_tokens) {
            None => limits.default_max_tokens,
            Some(v) if v < 1 => {
                return Err(ApiError::invalid_param(
                    "max_tokens",
                    format!("max_tokens must be at least 1 (got {v})"),
                ));
            }
            Some(v) => {
                let v = usize::try_from(v).unwrap_or(usize::MAX);
                if v > limits.max_tokens {
                    return Err(ApiError::invalid_param(
                        "max_tokens",
                        format!(
                            "max_tokens is {v}, above the limit of {}",
                            limits.max_tokens
                        ),
                    ));
                }
                v
            }
        };
        let top_k = match self.top_k {
            None => 0,
            Some(k) if k < 0 => 0, // -1 means off (vLLM)
            Some(k) => usize::try_from(k).unwrap_or(usize::MAX),
        };
        let mut logit_bias = Vec::new();
        for (k, &b) in self.logit_bias.iter().flatten() {
            let id = k
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|&t| (t as usize) < vocab);
            let Some(id) = id else {
                return Err(ApiError::invalid_param(
                    "logit_bias",
                    format!("logit_bias key `{k}` is not a token id of this model (0..{vocab})"),
                ));
            };
            logit_bias.push((id, b));
        }
        let sampling = SamplingParams {
            temperature: self.temperature.unwrap_or(1.0),
            top_k,
            top_p: self.top_p.unwrap_or(1.0),
            min_p: self.min_p.unwrap_or(0.0),
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            repetition_penalty: self.repetition_penalty.unwrap_or(1.0),
            seed: self.seed.map(i64::cast_unsigned),
            logit_bias,
        };
        sampling.validate().map_err(|e| {
            let p = match &e {
                crate::sampling::SamplingError::OutOfRange { param, .. } => *param,
            };
            ApiError::invalid_param(p, e.to_string())
        })?;
        let stop = self
            .stop
            .clone()
            .map(StringOrList::into_vec)
            .unwrap_or_default();
        at_most("stop", "stop strings", stop.len(), limits.max_stop)?;
        let stop = crate::stop::StopMatcher::new(&stop)
            .map_err(|e| ApiError::invalid_param("stop", e.to_string()))?;
        let so = self.stream_options.clone().unwrap_or_default();
        if self.stream_options.is_some() && !self.stream {
            return Err(ApiError::invalid_param(
                "stream_options",
                "stream_options is only allowed with stream: true",
            ));
        }
        if let Some(p) = &self.prediction {
            at_most(
                "prediction",
                "bytes of prediction",
                p.len(),
                limits.max_message_bytes,
            )?;
        }
        check_id("user", &self.user)?;
        check_id("safety_identifier", &self.safety_identifier)?;
        check_id("prompt_cache_key", &self.prompt_cache_key)?;
        Ok(ValidOptions {
            max_tokens,
            sampling,
            stop,
            n,
            stream: self.stream,
            include_usage: so.include_usage,
            continuous_usage: so.continuous_usage_stats,
            user: self.user.clone().or_else(|| self.safety_identifier.clone()),
            session_hint: self
                .prompt_cache_key
                .clone()
                .or_else(|| self.user.clone())
                .or_else(|| self.safety_identifier.clone())
                .filter(|s| !s.is_empty()),
            prompt_cache_key: self.prompt_cache_key.clone(),
            previous_response_id: self.previous_response_id.clone(),
            ignore_eos: self.ignore_eos,
            // A whole response has no chunk to carry progress in: the field is ignored there.
            return_progress: self.return_progress && self.stream,
            grammar: self.grammar_request()?,
            frequency_penalty_given: self.frequency_penalty,
            presence_penalty_given: self.presence_penalty,
            n_given: self.n,
            prediction: self.prediction.clone(),
        })
    }

    /// The one constraint the request asks for, from whichever field it uses.
    fn grammar_request(&self) -> Result<Option<GrammarRequest>, ApiError> {
        let mut found: Vec<GrammarRequest> = Vec::new();
        let object = || GrammarSpec::JsonSchema(json!({"type": "object"}));
        match &self.response_format {
            None | Some(ResponseFormat::Text) => {}
            Some(ResponseFormat::JsonObject(None)) => found.push(GrammarRequest {
                spec: object(),
                param: "response_format",
                kind: ConstraintKind::JsonObject,
            }),
            Some(ResponseFormat::JsonObject(Some(s)) | ResponseFormat::JsonSchema(s)) => {
                found.push(GrammarRequest {
                    spec: GrammarSpec::JsonSchema(s.clone()),
                    param: "response_format",
                    kind: ConstraintKind::JsonSchema,
                });
            }
        }
        if let Some(so) = &self.structured_outputs {
            let (spec, kind) = match so {
                StructuredOutputs::Json(s) => (
                    GrammarSpec::JsonSchema(s.clone()),
                    ConstraintKind::JsonSchema,
                ),
                StructuredOutputs::JsonObject => (object(), ConstraintKind::JsonObject),
                StructuredOutputs::Regex(r) => {
                    (GrammarSpec::Regex(r.clone()), ConstraintKind::Regex)
                }
                StructuredOutputs::Choice(c) => {
                    (GrammarSpec::Choice(c.clone()), ConstraintKind::Choice)
                }
                StructuredOutputs::Grammar(g) => {
                    (GrammarSpec::Lark(g.clone()), ConstraintKind::Grammar)
                }
            };
            found.push(GrammarRequest {
                spec,
                param: "structured_outputs",
                kind,
            });
        }
        if let Some(s) = &self.json_schema {
            found.push(GrammarRequest {
                spec: GrammarSpec::JsonSchema(s.clone()),
                param: "json_schema",
                kind: ConstraintKind::JsonSchema,
            });
        }
        if let Some(g) = &self.grammar {
            found.push(GrammarRequest {
                spec: GrammarSpec::Lark(g.clone()),
                param: "grammar",
                kind: ConstraintKind::Grammar,
            });
        }
        if found.len() > 1 {
            return Err(ApiError::invalid_param(
                found[1].param,
                format!(
                    "`{}` and `{}` both constrain the output; send only one",
                    found[0].param, found[1].param
                ),
            ));
        }
        Ok(found.pop())
    }
}

fn top_logprobs(param: &str, v: i64) -> Result<usize, ApiError> {
    usize::try_from(v).ok().filter(|&k| k <= 20).ok_or_else(|| {
        ApiError::invalid_param(param, format!("{param} must be between 0 and 20 (got {v})"))
    })
}

/// A chat request's `logprobs` and `top_logprobs`: how many alternatives per token, or `None`
/// when log-probabilities are off.
pub fn chat_logprobs(req: &ChatRequest) -> Result<Option<usize>, ApiError> {
    match (req.logprobs, req.top_logprobs) {
        (false, None | Some(0)) => Ok(None),
        (false, Some(_)) => Err(ApiError::invalid_param(
            "top_logprobs",
            "top_logprobs needs logprobs: true",
        )),
        (true, k) => Ok(Some(top_logprobs("top_logprobs", k.unwrap_or(0))?)),
    }
}

/// Refuses a grammar together with tools that may be called (the two would fight over the
/// output), except a JSON answer shape beside the generic format's calls (the answer is then
/// `{"response": <that shape>}`: OpenAI allows `text.format` with tools).
pub fn no_grammar_with_tools(
    grammar: Option<&GrammarRequest>,
    tools: Option<&ToolSetup>,
) -> Result<(), ApiError> {
    if let (Some(t), Some(g)) = (tools, grammar)
        && t.active()
        && !(t.answers_in_json() && answer_schema(g).is_some())
    {
        return Err(ApiError::invalid_param(
            g.param,
            format!(
                "`{}` cannot be combined with tools (unless tool_choice is `none`, or the model takes tools in the generic JSON format with tool_choice `auto`)",
                g.param
            ),
        ));
    }
    Ok(())
}

/// The JSON schema of an answer shape that can sit beside tool calls: a JSON schema or
/// object, not a regex, a choice or a grammar.
fn answer_schema(g: &GrammarRequest) -> Option<Value> {
    match &g.spec {
        GrammarSpec::JsonSchema(s) => Some(s.clone()),
        _ => None,
    }
}

/// Where a chat's reply starts with respect to reasoning, given its rendered prompt `text` and
/// the constraint it asks for: a constraint inside a reasoning block the prompt opened is
/// refused, naming the field that asked for it.
pub fn chat_reasoning(
    st: &AppState,
    req: &ChatRequest,
    grammar: Option<&GrammarRequest>,
    tools: Option<&ToolSetup>,
    text: &str,
) -> Result<Option<ReasoningStart>, ApiError> {
    // The field that asked for a constraint: a grammar's own, else the enforced tools'
    // (`tool_choice` when given, else `tools`: the generic format's `auto` is enforced).
    let tools_param = if req.tool_choice.is_some() {
        "tool_choice"
    } else {
        "tools"
    };
    let constrained = grammar
        .map(|g| g.param)
        .or_else(|| tools.filter(|t| t.enforced()).map(|_| tools_param));
    reasoning_start(st.prompts.template_source(), text, constrained)
}

/// A completion's `best_of`, which must equal `n` (choices are not ranked).
pub fn best_of(req: &CompletionRequest, n: usize) -> Result<(), ApiError> {
    if let Some(b) = req.best_of
        && usize::try_from(b).ok() != Some(n)
    {
        return Err(ApiError::invalid_param(
            "best_of",
            format!("best_of must equal n ({n}): choices are not ranked server-side"),
        ));
    }
    Ok(())
}

/// A completion's `logprobs` (alternatives per token, `None`: off), refused with `echo`.
pub fn completion_logprobs(req: &CompletionRequest) -> Result<Option<usize>, ApiError> {
    let logprobs = req
        .logprobs
        .map(|k| top_logprobs("logprobs", k))
        .transpose()?;
    if req.echo && logprobs.is_some() {
        return Err(ApiError::invalid_param(
            "echo",
            "echo with logprobs would need prompt logprobs, which are not supported",
        ));
    }
    Ok(logprobs)
}

/// A prediction's token ids (OpenAI's Predicted Outputs: drafted from, verified like any
/// draft); an empty prediction gives none.
pub fn prediction_tokens(st: &AppState, text: Option<&str>) -> Result<Option<Vec<u32>>, ApiError> {
    let Some(text) = text.filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    let ids = st
        .prompts
        .tokenizer()
        .encode(text, false)
        .map_err(|e| ApiError::invalid_param("prediction", e.to_string()))?;
    Ok(Some(ids))
}

/// A completion's one prompt, as text and as token ids (a prompt of ids is checked against
/// the vocabulary and decoded); an empty prompt is refused.
pub fn completion_prompt(
    st: &AppState,
    req: &CompletionRequest,
) -> Result<(String, Vec<u32>), ApiError> {
    let one = |n: usize, what: &str| {
        ApiError::invalid_param(
            "prompt",
            format!("{n} {what} given; one prompt per request is supported"),
        )
    };
    let tok = st.prompts.tokenizer();
    let ids_prompt = |ids: &[u32]| -> Result<(String, Vec<u32>), ApiError> {
        if let Some(bad) = ids.iter().find(|&&t| t as usize >= st.vocab) {
            return Err(ApiError::invalid_param(
                "prompt",
                format!("token id {bad} is outside the vocabulary of {}", st.vocab),
            ));
        }
        let text = tok
            .decode_with(ids, false)
            .map_err(|e| ApiError::invalid_param("prompt", e.to_string()))?;
        Ok((text, ids.to_vec()))
    };
    let text_prompt = |t: &str| -> Result<(String, Vec<u32>), ApiError> {
        let ids = st
            .prompts
            .raw(t)
            .map_err(|e| ApiError::invalid_param("prompt", e.to_string()))?;
        Ok((t.to_string(), ids))
    };
    let (text, prompt) = match &req.prompt {
        Prompt::Text(t) => text_prompt(t)?,
        Prompt::Texts(v) if v.len() == 1 => text_prompt(&v[0])?,
        Prompt::Texts(v) => return Err(one(v.len(), "prompts")),
        Prompt::Tokens(ids) => ids_prompt(ids)?,
        Prompt::TokenLists(v) if v.len() == 1 => ids_prompt(&v[0])?,
        Prompt::TokenLists(v) => return Err(one(v.len(), "token prompts")),
    };
    if prompt.is_empty() {
        return Err(ApiError::invalid_param("prompt", "the prompt is empty"));
    }
    Ok((text, prompt))
}

/// Compiles a request's grammar, or its enforced tools' (and checks the schemas of tools
/// whose calls are parsed rather than enforced), off the async runtime. A grammar that does
/// not compile is a 400 that says why.
pub async fn compile(
    st: &AppState,
    grammar: Option<&GrammarRequest>,
    tools: Option<&ToolSetup>,
) -> Result<Option<Constraint>, ApiError> {
    let enforce = match (grammar, tools) {
        // An answer shape beside the generic format's calls: one grammar of both.
        (Some(g), Some(t)) if t.active() && t.answers_in_json() => answer_schema(g)
            .and_then(|schema| t.grammar_answering(schema))
            .map(|spec| (spec, g.param, g.kind)),
        (Some(g), _) => Some((g.spec.clone(), g.param, g.kind)),
        (None, Some(t)) if t.enforced() => t.grammar().map(|g| (g, "tools", ConstraintKind::Tools)),
        _ => None,
    };
    // Tools whose calls are parsed rather than enforced still get their schemas checked.
    let check = match (&enforce, tools) {
        (None, Some(t)) if !t.tools.is_empty() => {
            let mut all = t.clone();
            all.choice = ToolChoice::Required;
            all.grammar()
        }
        _ => None,
    };
    if enforce.is_none() && check.is_none() {
        return Ok(None);
    }
    let grammars = Arc::clone(&st.grammars);
    let compiled = tokio::task::spawn_blocking(move || {
        let compiler = grammars.compiler().map_err(|e| (e, "model"))?;
        if let Some(c) = &check {
            compiler.compile(c).map_err(|e| (e, "tools"))?;
        }
        enforce
            .map(|(spec, param, kind)| {
                compiler
                    .compile(&spec)
                    .map(|c| c.with_kind(kind))
                    .map_err(|e| (e, param))
            })
            .transpose()
    })
    .await
    .map_err(|e| ApiError::internal(format!("grammar compilation failed: {e}")))?;
    match compiled {
        Ok(c) => Ok(c),
        Err((crate::constraint::ConstraintError::Unavailable(m), _)) => Err(ApiError::internal(m)),
        Err((e, param)) => {
            let mut a = ApiError::invalid_param(param, format!("`{param}`: {e}"));
            a.code = Some("invalid_grammar");
            Err(a)
        }
    }
}

/// Where the reply of a chat starts with respect to reasoning ([`ReasoningStart::detect`]).
/// A constraint (`constrained` names the field asking for it) shapes the reply from its first
/// token: with a prompt that opened a reasoning block it would force the constrained text
/// inside the block, so that is refused; where the model would open the block itself, the
/// constraint leaves it no room, and the whole reply is content.
fn reasoning_start(
    template: &str,
    prompt: &str,
    constrained: Option<&'static str>,
) -> Result<Option<ReasoningStart>, ApiError> {
    let start = ReasoningStart::detect(template, prompt);
    match (start, constrained) {
        (Some(ReasoningStart::Open), Some(param)) => {
            let mut e = ApiError::invalid_param(
                param,
                format!(
                    "`{param}` constrains the reply from its first token, but this model's chat template opens a reasoning block (`<think>`) in the prompt; turn reasoning off through `chat_template_kwargs` (e.g. `{{\"enable_thinking\": false}}`) where the template supports it, or drop the constraint"
                ),
            );
            e.code = Some("unsupported_parameter");
            Err(e)
        }
        (Some(ReasoningStart::MayOpen), Some(_)) => Ok(Some(ReasoningStart::Closed)),
        (start, _) => Ok(start),
    }
}

/// The prompt of a chat: messages checked, tools set up in the model's format, the template
/// rendered (with a generation prompt when asked) and the text encoded. `/tokenize` uses the
/// same function, so its counts equal a chat request's `prompt_tokens`.
pub fn chat_prompt(
    st: &AppState,
    req: &ChatRequest,
    add_generation_prompt: bool,
) -> Result<(String, Vec<u32>, Option<ToolSetup>), ApiError> {
    let limits = &st.cfg.limits;
    let format = ToolFormat::detect(st.prompts.template_source());
    let tools = if format == ToolFormat::Generic && !st.cfg.generic_tools {
        no_generic_tools(req)?
    } else {
        tool_setup(req, format, limits)?
    };
    let messages = messages(req, limits)?;
    // Replies the engine generated, sent back: their generated ids go in their place (never
    // the last message, which a generation may continue). They travel with their messages
    // through the tool formats' rewriting of the history.
    let replies = st.prompts.replies();
    let last = messages.len().saturating_sub(1);
    let mut messages = messages;
    for m in &mut messages[..last] {
        m.generated = ReplyKey::of_message(m).and_then(|k| replies.recall(&k));
    }
    let recalled = messages.iter().filter(|m| m.generated.is_some()).count();
    let messages = match &tools {
        Some(t) => t.prepare(messages),
        None if format == ToolFormat::Generic => tools::polyfill_history(messages),
        None => messages,
    };
    let template_tools = tools.as_ref().and_then(ToolSetup::template_tools);
    let (text, prompt, used) = st
        .prompts
        .chat_generated(
            &messages,
            template_tools.as_ref(),
            &req.chat_template_kwargs,
            add_generation_prompt,
        )
        .map_err(|e| {
            let mut a = ApiError::invalid_param("messages", e.to_string());
            a.code = Some("invalid_messages");
            a
        })?;
    tracing::debug!(
        recalled,
        used,
        messages = messages.len(),
        "Prompt.GeneratedReplies"
    );
    Ok((text, prompt, tools))
}

/// With `--generic-tools off`, a model whose template cannot call tools is offered none: the
/// tools are left out of the prompt (the request span lists them as skipped) and the reply is
/// text; a request that must call one is refused.
fn no_generic_tools(req: &ChatRequest) -> Result<Option<ToolSetup>, ApiError> {
    match &req.tool_choice {
        Some(InputToolChoice::Required | InputToolChoice::Function(_))
            if req.tools.as_ref().is_some_and(|t| !t.is_empty()) =>
        {
            let mut e = ApiError::invalid_param(
                "tool_choice",
                "this model's chat template cannot call tools, and the server offers no generic tool format (`--generic-tools off`)",
            );
            e.code = Some("unsupported_parameter");
            Err(e)
        }
        _ => Ok(None),
    }
}

fn tool_setup(
    req: &ChatRequest,
    format: ToolFormat,
    limits: &Limits,
) -> Result<Option<ToolSetup>, ApiError> {
    let wire = req.tools.clone().unwrap_or_default();
    if wire.is_empty() {
        return match &req.tool_choice {
            None | Some(InputToolChoice::None | InputToolChoice::Auto) => Ok(None),
            Some(_) => Err(ApiError::invalid_param(
                "tool_choice",
                "tool_choice asks for a tool call, but no `tools` were given",
            )),
        };
    }
    at_most("tools", "tools", wire.len(), limits.max_tools)?;
    let mut seen = HashSet::new();
    let mut tools = Vec::with_capacity(wire.len());
    for t in wire {
        if !seen.insert(t.name.clone()) {
            return Err(ApiError::invalid_param(
                &t.name_param,
                format!("two tools are named `{}`", t.name),
            ));
        }
        tools.push(Tool {
            name: t.name,
            description: t.description,
            parameters: t
                .parameters
                .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
        });
    }
    let choice = match req.tool_choice.clone() {
        None | Some(InputToolChoice::Auto) => ToolChoice::Auto,
        Some(InputToolChoice::None) => ToolChoice::None,
        Some(InputToolChoice::Required) => ToolChoice::Required,
        Some(InputToolChoice::Function(name)) => {
            if !tools.iter().any(|t| t.name == name) {
                return Err(ApiError::invalid_param(
                    "tool_choice.function.name",
                    format!("tool_choice names `{name}`, which is not among the tools"),
                ));
            }
            ToolChoice::Function(name)
        }
    };
    Ok(Some(ToolSetup {
        format,
        choice,
        tools,
        // OpenAI's default is parallel calls. The generic format defaults to one call, as
        // llama.cpp's does: a model never trained on tools, offered a list, repeats its call
        // until `max_tokens`. An explicit `parallel_tool_calls: true` allows the list.
        parallel: req
            .parallel_tool_calls
            .unwrap_or(format != ToolFormat::Generic),
    }))
}

/// The messages as the chat template takes them.
pub fn messages(req: &ChatRequest, limits: &Limits) -> Result<Vec<ChatMessage>, ApiError> {
    if req.messages.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "messages must not be empty",
        ));
    }
    at_most(
        "messages",
        "messages",
        req.messages.len().saturating_sub(req.held_messages),
        limits.max_messages,
    )?;
    let mut names: HashMap<String, String> = HashMap::new();
    let mut out = Vec::with_capacity(req.messages.len());
    for (i, m) in req.messages.iter().enumerate() {
        let Some(role) = m.author() else {
            return Err(ApiError::invalid_param(
                &format!("{}.role", m.path),
                format!(
                    "unknown role `{}` (system, user, assistant, tool or developer)",
                    m.role
                ),
            ));
        };
        let content = match &m.content {
            None => String::new(),
            Some(Content::Text(s)) => s.clone(),
            Some(Content::Parts(parts)) => {
                let mut s = String::new();
                for (j, p) in parts.iter().enumerate() {
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(t)) => s.push_str(t),
                        _ => {
                            return Err(ApiError::invalid_param(
                                &format!("{}.content[{j}]", m.path),
                                format!(
                                    "content part of type `{}` is not supported (only text)",
                                    p.kind
                                ),
                            ));
                        }
                    }
                }
                s
            }
        };
        if content.len() > limits.max_message_bytes {
            return Err(ApiError::invalid_param(
                &format!("{}.content", m.path),
                format!(
                    "message content is {} bytes; the limit is {}",
                    content.len(),
                    limits.max_message_bytes
                ),
            ));
        }
        let mut msg = ChatMessage::new(role, content);
        msg.name = m.name.clone();
        if let Some(r) = &m.reasoning_content {
            if role != Role::Assistant {
                return Err(ApiError::invalid_param(
                    &format!("{}.reasoning_content", m.path),
                    "only assistant messages carry reasoning_content",
                ));
            }
            msg.reasoning_content = Some(r.clone());
        }
        if let Some(calls) = &m.tool_calls {
            if role != Role::Assistant {
                return Err(ApiError::invalid_param(
                    &format!("{}.tool_calls", m.path),
                    "only assistant messages carry tool_calls",
                ));
            }
            let mut list = Vec::with_capacity(calls.len());
            for (j, c) in calls.iter().enumerate() {
                if c.kind.as_deref().is_some_and(|k| k != "function") {
                    return Err(ApiError::invalid_param(
                        &format!("{}.tool_calls[{j}].type", m.path),
                        "only function tool calls are supported",
                    ));
                }
                // Templates expect arguments as an object (vLLM and HF do the same).
                let args = match &c.function.arguments {
                    Value::String(s) => serde_json::from_str::<Value>(s)
                        .ok()
                        .filter(Value::is_object)
                        .unwrap_or_else(|| Value::String(s.clone())),
                    other => other.clone(),
                };
                let id = c.id.clone().unwrap_or_else(|| format!("call_{i}_{j}"));
                names.insert(id.clone(), c.function.name.clone());
                list.push(json!({
                    "id": id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": args},
                }));
            }
            msg.tool_calls = Some(list);
        }
        if role == Role::Tool {
            let Some(id) = &m.tool_call_id else {
                return Err(ApiError::invalid_param(
                    &format!("{}.tool_call_id", m.path),
                    "a tool message needs the `tool_call_id` it answers",
                ));
            };
            msg.tool_call_id = Some(id.clone());
            if msg.name.is_none() {
                msg.name = names.get(id).cloned();
            }
        } else if m.tool_call_id.is_some() {
            return Err(ApiError::invalid_param(
                &format!("{}.tool_call_id", m.path),
                "only tool messages carry a tool_call_id",
            ));
        }
        out.push(msg);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const THINKING: &str = "{{ '<think>' }}";

    #[test]
    fn constraints_and_reasoning_blocks() {
        let opened = "<|im_start|>assistant\n<think>\n";
        let free = "<|im_start|>assistant\n";
        // No constraint: where the reply starts is the prompt's say.
        assert_eq!(
            reasoning_start(THINKING, opened, None).expect("ok"),
            Some(ReasoningStart::Open)
        );
        assert_eq!(
            reasoning_start(THINKING, free, None).expect("ok"),
            Some(ReasoningStart::MayOpen)
        );
        // A constraint inside a block the prompt opened is refused, naming its field.
        let e = reasoning_start(THINKING, opened, Some("response_format")).expect_err("refused");
        assert_eq!(e.param.as_deref(), Some("response_format"));
        assert_eq!(e.code, Some("unsupported_parameter"));
        assert!(e.message.contains("chat_template_kwargs"), "{}", e.message);
        // Where the model would open the block itself, the constraint leaves no room for it.
        assert_eq!(
            reasoning_start(THINKING, free, Some("tools")).expect("ok"),
            Some(ReasoningStart::Closed)
        );
        // Templates without `<think>` are never parsed, constrained or not.
        assert_eq!(
            reasoning_start("{{ x }}", opened, Some("grammar")).expect("ok"),
            None
        );
    }
}
