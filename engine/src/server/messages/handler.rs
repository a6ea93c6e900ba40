//! The front door of `POST /v1/messages` (with or without `?beta=true`) and
//! `POST /v1/messages/count_tokens`: read the body, take it apart ([`super::types`]), map
//! what only this API has onto the one request path (the thinking switch, `max_tokens`
//! clamped, the session, the cache diagnostics), validate it
//! ([`crate::server::request`]), launch it ([`crate::server::request::launch`]), then answer whole
//! ([`super::response`]) or streamed ([`super::stream`]). Every error is in Anthropic's shape.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value};

use super::response::{Answer, ContentBlock, Diagnostics, TokenCount};
use super::signature::Signer;
use super::stream::{Streaming, finish_turn};
use super::types::{Endpoint, MessagesRequest, SectionsSent, Thinking};
use crate::diagnostics::{Fingerprint, Sections, Turn};
use crate::server::body::read_json;
use crate::server::error::{ApiError, ErrorKind, ErrorShape};
use crate::server::ids::new_id;
use crate::server::request::arrival::Arrived;
use crate::server::request::launch::{self, launch_request};
use crate::server::request::record::{self, Refused};
use crate::server::request::tools::TOOLS_SKIPPED_HEADER;
use crate::server::request::{Api, ValidRequest, validate};
use crate::server::state::{AppState, SharedState};

/// Answers `POST /v1/messages`: a reply, whole or streamed. A refusal is recorded here, where
/// it is answered (a span of status `refused`, a log line, a count).
pub async fn create(State(st): State<SharedState>, request: Request) -> Response {
    let (arrived, body) = Arrived::of(request);
    match generate(&st, &arrived, body).await {
        Ok(r) => r,
        Err(refused) => {
            record::refusal(&st, Api::Messages, &arrived, refused).render(ErrorShape::Anthropic)
        }
    }
}

/// Answers `POST /v1/messages/count_tokens`: the prompt's tokens, counted as `POST
/// /v1/messages` would prefill them.
pub async fn count_tokens(State(st): State<SharedState>, request: Request) -> Response {
    let (_, body) = Arrived::of(request);
    match count(&st, body).await {
        Ok(n) => Json(TokenCount { input_tokens: n }).into_response(),
        Err(e) => e.render(ErrorShape::Anthropic),
    }
}

/// The signer of this engine's thinking blocks.
fn signer(st: &AppState) -> Signer {
    let model = st.cfg.model_names.first().map_or("", String::as_str);
    Signer::new(st.cfg.api_key.as_deref(), model)
}

/// The template variables a request's `thinking` and `output_config.effort` set, for a
/// template that reads them: `enable_thinking` (on unless `disabled`) and `reasoning_effort`
/// (`low`, `medium` or `high`; `xhigh` and `max` are `high`).
pub fn template_kwargs(
    template: &str,
    thinking: Option<Thinking>,
    effort: Option<&str>,
) -> Map<String, Value> {
    let mut kw = Map::new();
    if let Some(t) = thinking
        && template.contains("enable_thinking")
    {
        kw.insert("enable_thinking".into(), Value::Bool(t.mode.on()));
    }
    if let Some(e) = effort
        && template.contains("reasoning_effort")
    {
        let e = match e {
            "low" | "medium" => e,
            _ => "high",
        };
        kw.insert("reasoning_effort".into(), Value::String(e.into()));
    }
    kw
}

/// Takes the body apart and sets the template variables from `thinking` and `effort`.
fn parse(st: &AppState, v: Value, endpoint: Endpoint) -> Result<MessagesRequest, ApiError> {
    let mut m = MessagesRequest::from_json(v, endpoint, &signer(st))?;
    m.chat.chat_template_kwargs = template_kwargs(
        st.prompts.template_source(),
        m.thinking,
        m.effort.as_deref(),
    );
    Ok(m)
}

async fn count(st: &AppState, body: Body) -> Result<usize, ApiError> {
    let v: Value = read_json(body, st.cfg.max_body_bytes, st.cfg.read_timeout).await?;
    let m = parse(st, v, Endpoint::CountTokens)?;
    st.check_model(m.chat.common.model.as_deref())?;
    let (_, prompt, _) = validate::chat_prompt(st, &m.chat, true)?;
    Ok(prompt.len())
}

/// The fingerprints of what a prompt was built from.
fn sections(model: &str, s: &SectionsSent) -> Sections {
    Sections {
        model: model.to_string(),
        system: Fingerprint::of(&s.system),
        tools: Fingerprint::of_json(&s.tools),
        format: Fingerprint::of(&s.format.as_ref().map(Value::to_string)),
        options: Fingerprint::of_json(&s.options),
    }
}

/// Clamps the request's `max_tokens` (already at most `--max-tokens-limit`) to what the
/// context leaves after its prompt; `asked` is what the client asked for, recorded on the
/// span when it was more than the request runs with.
fn clamp_to_context(st: &AppState, req: &mut ValidRequest, asked: usize) -> Result<(), ApiError> {
    let room = st.context.saturating_sub(req.prompt.len());
    if room == 0 {
        let mut e = ApiError::invalid_param(
            "messages",
            format!(
                "the prompt is {} tokens, which leaves no room in the context of {} tokens",
                req.prompt.len(),
                st.context
            ),
        );
        e.error = ErrorKind::ContextLength;
        e.code = Some("context_length_exceeded");
        return Err(e);
    }
    req.opts.max_tokens = req.opts.max_tokens.min(room);
    if asked > req.opts.max_tokens {
        req.max_tokens_asked = Some(asked);
    }
    Ok(())
}

async fn generate(st: &SharedState, arrived: &Arrived, body: Body) -> Result<Response, Refused> {
    if st.engine.is_shutting_down() {
        return Err(ApiError::shutting_down().into());
    }
    let v: Value = read_json(body, st.cfg.max_body_bytes, st.cfg.read_timeout).await?;
    let mut m = parse(st, v, Endpoint::Create)?;
    let asked = m.max_tokens.unwrap_or(0);
    let Ok(asked) = usize::try_from(asked) else {
        return Err(ApiError::invalid_param(
            "max_tokens",
            format!("`max_tokens` must be at least 0 (got {asked})"),
        )
        .into());
    };
    // `max_tokens: 0` prefills the prompt and answers nothing: the engine samples the one
    // token a prefill yields and the answer leaves it out.
    let prewarm = asked == 0;
    let limit = st.cfg.limits.max_tokens;
    m.chat.common.max_tokens = Some(i64::try_from(asked.clamp(1, limit)).unwrap_or(1));
    let session = m.session_key(&arrived.headers);
    let session_ttl = m.session_ttl();
    let MessagesRequest {
        chat,
        thinking,
        diagnostics,
        tools_skipped,
        sections: sent,
        ..
    } = m;
    let mut req = ValidRequest::chat(st, Api::Messages, chat).await?;
    clamp_to_context(st, &mut req, asked)?;
    req.tools_skipped.extend(tools_skipped);
    req.session_ttl = session_ttl;
    let turn = Turn::new(
        sections(&req.model, &sent),
        Arc::from(req.prompt.as_slice()),
    );
    let diagnostics = match &diagnostics {
        Some(Some(previous)) => Diagnostics::of(st.diagnostics.compare(previous, &turn)),
        Some(None) | None => None,
    };
    let stream = req.opts.stream;
    let id = new_id(Api::Messages.id_prefix());
    let launched = launch_request(st, req, id, session, arrived)?;
    st.diagnostics.register(&launched.meta.id, turn);
    let answer = Answer {
        meta: Arc::clone(&launched.meta),
        signer: signer(st),
        omitted: thinking.is_some_and(|t| t.omitted),
        prewarm,
        tokenizer: Arc::clone(st.prompts.tokenizer()),
        diagnostics,
    };
    let headers = headers(&launched.meta.id, &launched.meta.request.tools_skipped);
    let mut response = if stream {
        launch::stream(launched, Streaming::new(answer, Arc::clone(st)))
    } else {
        // An error after the request reached the engine is its outcome, recorded as such.
        match launch::collect(launched).await {
            Ok((choices, outcome)) => whole(st, &answer, choices, &outcome),
            Err(e) => e.render(ErrorShape::Anthropic),
        }
    };
    response.headers_mut().extend(headers);
    Ok(response)
}

/// The response headers: `request-id` (the message id, as Anthropic's clients read it) and
/// the tools left out, when any were.
fn headers(id: &str, skipped: &[String]) -> axum::http::HeaderMap {
    let mut h = axum::http::HeaderMap::new();
    if let Ok(v) = HeaderValue::from_str(id) {
        h.insert(HeaderName::from_static("request-id"), v);
    }
    if !skipped.is_empty()
        && let Ok(v) = HeaderValue::from_str(&skipped.join(","))
    {
        h.insert(HeaderName::from_static(TOOLS_SKIPPED_HEADER), v);
    }
    h
}

/// The whole message of a finished request.
fn whole(
    st: &AppState,
    answer: &Answer,
    choices: Vec<launch::Collected>,
    outcome: &crate::server::request::outcome::RequestOutcome,
) -> Response {
    let Some(c) = choices.into_iter().next() else {
        return ApiError::internal("the request ended without its reply")
            .render(ErrorShape::Anthropic);
    };
    let Some(end) = c.end.as_ref() else {
        return ApiError::internal("the reply never ended").render(ErrorShape::Anthropic);
    };
    finish_turn(&st.diagnostics, answer, end);
    let mut content = Vec::new();
    if !answer.prewarm {
        if !c.reasoning.is_empty() {
            content.push(answer.thinking(&c.reasoning));
        }
        if !c.text.is_empty() {
            content.push(ContentBlock::Text {
                text: c.text.clone(),
            });
        }
        content.extend(end.tool_calls.iter().map(ContentBlock::tool_use));
    }
    let (stop_reason, stop_sequence) = answer.stop(end);
    let mut message = answer.message(content, answer.usage(outcome));
    message.stop_reason = Some(stop_reason);
    message.stop_sequence = stop_sequence;
    Json(message).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::messages::types::ThinkingMode;

    #[test]
    fn thinking_and_effort_reach_templates_that_read_them() {
        let on = Thinking {
            mode: ThinkingMode::Adaptive,
            omitted: false,
        };
        let off = Thinking {
            mode: ThinkingMode::Disabled,
            omitted: false,
        };
        let qwen = "{% if enable_thinking is defined and enable_thinking is false %}";
        assert_eq!(
            template_kwargs(qwen, Some(off), None).get("enable_thinking"),
            Some(&Value::Bool(false))
        );
        assert_eq!(
            template_kwargs(qwen, Some(on), Some("max")).get("enable_thinking"),
            Some(&Value::Bool(true))
        );
        // A template without the switch gets nothing (its own default stands).
        assert!(template_kwargs("{{ messages }}", Some(off), Some("low")).is_empty());
        let oss = "Reasoning: {{ reasoning_effort }}";
        assert_eq!(
            template_kwargs(oss, None, Some("xhigh")).get("reasoning_effort"),
            Some(&Value::String("high".into()))
        );
        assert_eq!(
            template_kwargs(oss, None, Some("low")).get("reasoning_effort"),
            Some(&Value::String("low".into()))
        );
        // No thinking field: the template's default stands.
        assert!(template_kwargs(qwen, None, None).is_empty());
    }
}
