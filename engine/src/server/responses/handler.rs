//! The Responses API's endpoints: create (whole or streamed), retrieve, delete, list a
//! response's input items, and count a request's input tokens.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::response::{
    Frame, ItemIds, ResponsesUsage, Status, error_object, incomplete_reason, output_items,
};
use super::store::{Pending, ResponseStore, STORED_HEADER, StoredResponse};
use super::translate::rename_param;
use super::types::ResponsesRequest;
use crate::diagnostics::{Fingerprint, MissReason, Sections, Turn};
use crate::server::body::read_json;
use crate::server::error::ApiError;
use crate::server::ids::{created, new_id};
use crate::server::request::arrival::Arrived;
use crate::server::request::launch::{self, launch_request};
use crate::server::request::outcome::RequestOutcome;
use crate::server::request::record::{self, Refused};
use crate::server::request::session::{self, KeySource, SessionKey};
use crate::server::request::tools::TOOLS_SKIPPED_HEADER;
use crate::server::request::{Api, ValidRequest};
use crate::server::state::{AppState, SharedState};

/// Answers `POST /v1/responses`: a response, whole or streamed.
pub async fn create(State(st): State<SharedState>, request: Request) -> Response {
    let (arrived, body) = Arrived::of(request);
    match generate(&st, &arrived, body).await {
        Ok(r) => r,
        Err(refused) => record::refusal(&st, Api::Responses, &arrived, refused).into_response(),
    }
}

/// The name this API gives a field the checks name.
fn renamed(mut e: ApiError) -> ApiError {
    if let Some(p) = e.param.as_deref().and_then(rename_param) {
        e.message = e.message.replace(
            &format!("`{}`", e.param.as_deref().unwrap_or_default()),
            &format!("`{p}`"),
        );
        e.param = Some(p);
    }
    e
}

/// A request ready to launch: valid, with what the door needs to answer and store it.
struct Prepared {
    req: ResponsesRequest,
    valid: ValidRequest,
    prev: Option<StoredResponse>,
    /// The prompt-shaping setup compared across turns (`text.format`, the thinking switch).
    format: Value,
    /// The earlier turns' items (the previous response's conversation).
    history: Vec<Value>,
}

/// The stored response `id`, or 404 naming `param`.
async fn stored(st: &AppState, id: &str, param: &str) -> Result<StoredResponse, ApiError> {
    match ResponseStore::of(st)?.get(id).await {
        Ok(Some(r)) => Ok(r),
        Ok(None) => Err(ApiError::not_found_param(
            param,
            format!("no stored response `{id}`: unknown, deleted or expired (`{param}`)"),
        )),
        Err(e) => Err(e.api_error()),
    }
}

/// Takes a body apart and builds its valid request: the conversation continued from the
/// previous response's exact tokens where its setup is the same.
async fn prepare(st: &AppState, v: Value) -> Result<Prepared, ApiError> {
    let req = ResponsesRequest::from_json(v)?;
    let prev = match (&req.previous_response_id, &req.conversation) {
        (Some(id), _) => Some(stored(st, id, "previous_response_id").await?),
        (None, Some(conv)) => match ResponseStore::of(st)?.latest_in(conv).await {
            Ok(Some(id)) => Some(stored(st, &id, "conversation").await?),
            Ok(None) => None,
            Err(e) => return Err(e.api_error()),
        },
        (None, None) => None,
    };
    let thinking = req.reasoning.enable_thinking();
    let format = json!({"text": req.text_format, "thinking": thinking});
    let mut history = prev
        .as_ref()
        .map(StoredResponse::conversation_items)
        .unwrap_or_default();
    let mut valid = build(st, &req, &history, thinking).await?;
    let exact = prev
        .as_ref()
        .filter(|p| super::continuation::same_setup(p, &req, &format));
    if let Some(p) = exact
        && let Some(ids) =
            super::continuation::exact_prompt(st, p, &req, thinking).map_err(renamed)?
    {
        valid.prompt = ids;
    }
    if req.truncation == super::types::Truncation::Auto {
        // The oldest items go until the prompt and its output fit the context.
        while valid.prompt.len() + valid.opts.max_tokens > st.context && !history.is_empty() {
            history.remove(0);
            valid = build(st, &req, &history, thinking).await?;
        }
    }
    valid
        .tools_skipped
        .extend(req.tools_skipped.iter().cloned());
    if req.cache.prewarm {
        // A prefill without generation: the one token the prefill samples is dropped.
        valid.opts.max_tokens = 1;
    } else if req.common.max_completion_tokens.is_none() {
        // Without `max_output_tokens` the reply may run to the end of the context (OpenAI's
        // meaning), bounded by `--max-tokens-limit`; `--default-max-tokens` is chat
        // completions' and completions' default only.
        valid.opts.max_tokens = st.cfg.limits.max_tokens;
        valid
            .clamp_to_context(st.context, "input", None)
            .map_err(renamed)?;
    }
    Ok(Prepared {
        req,
        valid,
        prev,
        format,
        history,
    })
}

async fn build(
    st: &AppState,
    req: &ResponsesRequest,
    history: &[Value],
    thinking: Option<bool>,
) -> Result<ValidRequest, ApiError> {
    let chat = req.chat(history, thinking)?;
    ValidRequest::chat(st, Api::Responses, chat)
        .await
        .map_err(renamed)
}

async fn generate(st: &SharedState, arrived: &Arrived, body: Body) -> Result<Response, Refused> {
    if st.engine.is_shutting_down() {
        return Err(ApiError::shutting_down().into());
    }
    let v: Value = read_json(body, st.cfg.max_body_bytes, st.cfg.read_timeout).await?;
    let Prepared {
        req,
        mut valid,
        prev,
        format,
        history,
    } = prepare(st, v).await?;
    let id = new_id(Api::Responses.id_prefix());
    let turn = turn_of(
        &valid.model,
        req.instructions.as_deref(),
        &Value::Array(req.tools_wire.clone()),
        &format,
        &valid.prompt,
    );
    let diagnostics = match &req.cache.comparison_response_id {
        Some(cid) => Some(diagnose(st, cid, &turn).await),
        None => None,
    };
    // The session: the header, the conversation, the chain's, the cache key, the user; a
    // stored response with none starts a chain of its own, which later turns continue.
    let chain = prev.as_ref().and_then(|p| p.session.clone());
    let keys = super::translate::session_keys(&req, chain.as_deref());
    let session = session::resolve(&arrived.headers, keys).or_else(|| {
        req.store
            .then(|| SessionKey::new(&id, KeySource::ResponseChain))
            .flatten()
    });
    valid.session_ttl = req.cache.session_ttl;
    let model = valid.model.clone();
    let max_output_tokens = valid.opts.max_tokens;
    let store = req.store.then(|| ResponseStore::of(st)).transpose()?;
    // A response to store needs the store: refused before it is generated when it is down.
    if let Some(store) = &store {
        store.available().map_err(|e| e.api_error())?;
    }
    let pending = store.map(|store| Pending {
        store,
        tracer: Arc::clone(&st.telemetry.tracer),
        record: StoredResponse {
            id: id.clone(),
            created_at: created(),
            session: session.as_ref().map(|k| k.id.clone()),
            conversation: req.conversation.clone(),
            model: model.clone(),
            instructions: req.instructions.clone(),
            tools: Value::Array(req.tools_wire.clone()),
            format,
            previous: prev.as_ref().map(|p| p.id.clone()),
            history,
            input: with_ids(&req.input),
            output: Vec::new(),
            prompt_tokens: valid.prompt.clone(),
            reply_tokens: Vec::new(),
            response: Value::Null,
        },
    });
    let prewarm = req.cache.prewarm;
    let stream = valid.opts.stream;
    let skipped = valid.tools_skipped.join(",");
    let frame = Frame {
        id: id.clone(),
        created_at: created(),
        model,
        request: req,
        max_output_tokens,
        diagnostics,
    };
    let launched = launch_request(st, valid, id, session, arrived).map_err(|mut r| {
        r.error = renamed(r.error);
        r
    })?;
    // Every turn is kept for a later comparison by id, stored or not.
    st.diagnostics.register(&launched.meta.id, turn);
    let bytes = st.prompts.tokenizer().token_bytes();
    let mut response = if stream {
        launch::stream(
            launched,
            super::stream::Streaming::new(frame, bytes, pending, prewarm, Arc::clone(st)),
        )
    } else {
        let rid = launched.meta.id.clone();
        match launch::collect(launched).await {
            Ok((choices, outcome)) => {
                if let Some(end) = choices.first().and_then(|c| c.end.as_ref()) {
                    st.diagnostics.finish(&rid, end.tokens.as_slice().into());
                }
                whole(&frame, &choices, &outcome, pending, prewarm, &bytes).await
            }
            Err(e) => e.into_response(),
        }
    };
    if !skipped.is_empty()
        && let Ok(v) = HeaderValue::from_str(&skipped)
    {
        response.headers_mut().insert(TOOLS_SKIPPED_HEADER, v);
    }
    Ok(response)
}

/// The whole response: its items, status and usage, stored first when asked.
async fn whole(
    frame: &Frame,
    choices: &[launch::Collected],
    outcome: &RequestOutcome,
    pending: Option<Pending>,
    prewarm: bool,
    bytes: &crate::tokenizer::TokenBytes,
) -> Response {
    let Some(c) = choices.first() else {
        return ApiError::internal("the request ended without a reply").into_response();
    };
    let reason = c.finish_reason();
    let error = error_object(outcome);
    let status = if error.is_some() {
        Status::Failed
    } else {
        Status::of(reason)
    };
    let items = if prewarm {
        Vec::new()
    } else {
        output_items(c, &frame.request, &ItemIds::new(), bytes)
    };
    let usage = ResponsesUsage::of(outcome, prewarm);
    let mut object = frame.object(
        status,
        &items,
        Some(&usage),
        error,
        incomplete_reason(reason).filter(|_| status == Status::Incomplete),
    );
    let saved = match pending.filter(|_| status != Status::Failed) {
        Some(p) => {
            let reply = if prewarm {
                Vec::new()
            } else {
                c.end.as_ref().map(|e| e.tokens.clone()).unwrap_or_default()
            };
            Some(
                p.save(items, reply, &mut object, outcome.span.as_ref())
                    .await,
            )
        }
        None => None,
    };
    let mut response = Json(object).into_response();
    if let Some(saved) = saved {
        response.headers_mut().insert(
            STORED_HEADER,
            HeaderValue::from_static(saved.header_value()),
        );
    }
    response
}

/// Input items with ids (`msg_…`, `fc_…`), as `input_items` lists them.
fn with_ids(items: &[Value]) -> Vec<Value> {
    items
        .iter()
        .map(|it| {
            let mut it = it.clone();
            if let Value::Object(m) = &mut it
                && !m.contains_key("id")
            {
                let prefix = match m.get("type").and_then(Value::as_str) {
                    Some("function_call") => "fc_",
                    Some("function_call_output") => "fco_",
                    Some("reasoning") => "rs_",
                    _ => "msg_",
                };
                m.insert("id".into(), json!(new_id(prefix)));
            }
            it
        })
        .collect()
}

/// The turn the cache diagnostics compare: the parts its prompt is built from and the prompt.
fn turn_of(
    model: &str,
    instructions: Option<&str>,
    tools: &Value,
    format: &Value,
    prompt: &[u32],
) -> Turn {
    Turn::new(
        Sections {
            model: model.to_string(),
            system: Fingerprint::of(&instructions),
            tools: Fingerprint::of_json(tools),
            format: Fingerprint::of_json(format.get("text").unwrap_or(&Value::Null)),
            options: Fingerprint::of_json(format.get("thinking").unwrap_or(&Value::Null)),
        },
        Arc::from(prompt),
    )
}

/// `prompt_cache_options.comparison_response_id`: the current turn against the compared one,
/// by the engine's one comparison ([`crate::diagnostics::diagnose`], which Messages' answers
/// come from too). The compared turn is the engine's memory of it (any response, stored or
/// not, while the engine remembers it), else the store's.
async fn diagnose(st: &AppState, cid: &str, current: &Turn) -> Value {
    let d = match st.diagnostics.compare(cid, current) {
        Some(d) => d,
        None => {
            let Ok(store) = ResponseStore::of(st) else {
                return json!({"type": "unavailable"});
            };
            let prev = match store.get(cid).await {
                Ok(Some(p)) => p,
                Ok(None) => return json!({"type": "comparison_response_not_found"}),
                Err(_) => return json!({"type": "unavailable"}),
            };
            let mut turn = turn_of(
                &prev.model,
                prev.instructions.as_deref(),
                &prev.tools,
                &prev.format,
                &prev.prompt_tokens,
            );
            turn.reply = Some(Arc::from(prev.reply_tokens.as_slice()));
            crate::diagnostics::diagnose(&turn, current)
        }
    };
    let Some(reason) = d.reason else {
        return json!({"type": "cache_hit"});
    };
    let reason = match reason {
        MissReason::Model => "model_changed",
        MissReason::Tools => "tools_changed",
        MissReason::Format => "text_format_changed",
        MissReason::Options => "reasoning_effort_changed",
        // OpenAI counts the instructions as input.
        MissReason::System | MissReason::Input => "input_changed",
    };
    json!({
        "type": "cache_miss",
        "reason": reason,
        // OpenAI's count: the input tokens after the first divergence.
        "cache_missed_tokens": current.prompt.len().saturating_sub(d.common_tokens),
        "comparison_reusable_tokens": d.common_tokens,
    })
}

/// Answers `GET /v1/responses/{id}`: the stored response.
pub async fn retrieve(State(st): State<SharedState>, Path(id): Path<String>) -> Response {
    match stored(&st, &id, "response_id").await {
        Ok(r) => Json(r.response).into_response(),
        Err(e) => e.into_response(),
    }
}

/// Answers `DELETE /v1/responses/{id}`.
pub async fn delete(State(st): State<SharedState>, Path(id): Path<String>) -> Response {
    let store = match ResponseStore::of(&st) {
        Ok(store) => store,
        Err(e) => return e.into_response(),
    };
    match store.delete(&id).await {
        Ok(true) => {
            Json(json!({"id": id, "object": "response.deleted", "deleted": true})).into_response()
        }
        Ok(false) => ApiError::not_found_param(
            "response_id",
            format!("no stored response `{id}`: unknown, deleted or expired"),
        )
        .into_response(),
        Err(e) => e.api_error().into_response(),
    }
}

/// `input_items`' paging: `limit` (1 to 100, 20), `order` (`asc` or `desc`, the default),
/// `after` (an item id).
#[derive(Debug, serde::Deserialize)]
pub struct Paging {
    limit: Option<usize>,
    order: Option<String>,
    after: Option<String>,
    /// Accepted; items are returned whole.
    #[allow(dead_code)]
    include: Option<String>,
}

/// Answers `GET /v1/responses/{id}/input_items`: the request's own input items.
pub async fn input_items(
    State(st): State<SharedState>,
    Path(id): Path<String>,
    Query(p): Query<Paging>,
) -> Response {
    let r = match stored(&st, &id, "response_id").await {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let limit = p.limit.unwrap_or(20);
    if !(1..=100).contains(&limit) {
        return ApiError::invalid_param("limit", "`limit` must be between 1 and 100")
            .into_response();
    }
    let mut items = r.input;
    match p.order.as_deref() {
        None | Some("desc") => items.reverse(),
        Some("asc") => {}
        Some(other) => {
            return ApiError::invalid_param(
                "order",
                format!("unknown order `{other}` (asc or desc)"),
            )
            .into_response();
        }
    }
    if let Some(after) = &p.after {
        match items
            .iter()
            .position(|it| it.get("id").and_then(Value::as_str) == Some(after))
        {
            Some(i) => {
                items.drain(..=i);
            }
            None => {
                return ApiError::invalid_param("after", format!("no input item `{after}`"))
                    .into_response();
            }
        }
    }
    let has_more = items.len() > limit;
    items.truncate(limit);
    let id_of = |it: Option<&Value>| it.and_then(|i| i.get("id")).cloned();
    Json(json!({
        "object": "list",
        "data": items,
        "first_id": id_of(items.first()),
        "last_id": id_of(items.last()),
        "has_more": has_more,
    }))
    .into_response()
}

/// Answers `POST /v1/responses/input_tokens`: the prompt tokens a request with this body would
/// have (its exact continuation of `previous_response_id` included).
pub async fn input_tokens(State(st): State<SharedState>, body: Body) -> Response {
    let v: Value = match read_json(body, st.cfg.max_body_bytes, st.cfg.read_timeout).await {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    match prepare(&st, v).await {
        Ok(p) => (
            StatusCode::OK,
            Json(json!({"object": "response.input_tokens", "input_tokens": p.valid.prompt.len()})),
        )
            .into_response(),
        Err(e) => e.into_response(),
    }
}
