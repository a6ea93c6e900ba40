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
use serde_json::Value;

use super::response::{Answer, ContentBlock, Diagnostics, TokenCount};
use super::signature::Signer;
use super::stream::{Streaming, finish_turn};
use super::translate;
use super::types::{Endpoint, MessagesRequest};
use crate::diagnostics::Turn;
use crate::server::body::read_json;
use crate::server::error::{ApiError, ErrorShape};
use crate::server::ids::new_id;
use crate::server::request::arrival::Arrived;
use crate::server::request::launch::{self, launch_request};
use crate::server::request::record::{self, Refused};
use crate::server::request::session;
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

/// Takes the body apart and sets the template variables from `thinking` and `effort`.
fn parse(st: &AppState, v: Value, endpoint: Endpoint) -> Result<MessagesRequest, ApiError> {
    let mut m = MessagesRequest::from_json(v, endpoint, &signer(st))?;
    m.chat.chat_template_kwargs = translate::template_kwargs(
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
    let session = session::resolve(&arrived.headers, translate::session_keys(&m));
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
    req.clamp_to_context(st.context, "messages", Some(asked))?;
    req.tools_skipped.extend(tools_skipped);
    req.session_ttl = session_ttl;
    let turn = Turn::new(
        translate::sections(&req.model, &sent),
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
        context: st.context,
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
