//! The endpoints of `POST /v1/chat/completions` and `POST /v1/completions`: read the body,
//! make it a valid request ([`super::translate`]), launch it on the one request path
//! ([`crate::server::request::launch`]), then answer whole ([`super::response`]) or as a
//! stream of typed chunks ([`super::stream`]). The two APIs differ only in how the body is
//! read and how a choice is written out.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::response::Shape;
use super::stream::Streaming;
use super::translate::{self, Kind};
use crate::server::body::read_json;
use crate::server::error::ApiError;
use crate::server::ids::{created, new_id};
use crate::server::request::arrival::Arrived;
use crate::server::request::launch::{self, launch_request};
use crate::server::request::record::{self, Refused};
use crate::server::request::session;
use crate::server::state::SharedState;

/// Answers `POST /v1/chat/completions`: a chat reply, whole or streamed.
pub async fn chat(State(st): State<SharedState>, request: Request) -> Response {
    answer(st, Kind::Chat, request).await
}

/// Answers `POST /v1/completions`: a text completion, whole or streamed.
pub async fn completions(State(st): State<SharedState>, request: Request) -> Response {
    answer(st, Kind::Completions, request).await
}

/// Answers one request of `kind`: its output, or its refusal, which is recorded here, where
/// it is answered (a span of status `refused`, a log line, a count).
async fn answer(st: SharedState, kind: Kind, request: Request) -> Response {
    let (arrived, body) = Arrived::of(request);
    match generate(&st, kind, &arrived, body).await {
        Ok(r) => r,
        Err(refused) => record::refusal(&st, kind.api(), &arrived, refused).into_response(),
    }
}

async fn generate(
    st: &SharedState,
    kind: Kind,
    arrived: &Arrived,
    body: Body,
) -> Result<Response, Refused> {
    if st.engine.is_shutting_down() {
        return Err(ApiError::shutting_down().into());
    }
    let v: Value = read_json(body, st.cfg.max_body_bytes, st.cfg.read_timeout).await?;
    let req = translate::valid_request(st, kind, v).await?;
    let key = session::resolve(&arrived.headers, translate::session_keys(&req));
    let stream = req.opts.stream;
    let launched = launch_request(st, req, new_id(kind.api().id_prefix()), key, arrived)?;
    let shape = Shape {
        meta: Arc::clone(&launched.meta),
        kind,
        created: created(),
        bytes: st.prompts.tokenizer().token_bytes(),
    };
    if stream {
        return Ok(launch::stream(launched, Streaming::new(shape)));
    }
    // An error after the request reached the engine is its outcome, recorded as such.
    Ok(match launch::collect(launched).await {
        Ok((choices, outcome)) => shape.whole(choices, outcome),
        Err(e) => e.into_response(),
    })
}
