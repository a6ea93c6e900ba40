//! The endpoints: `POST /tokenize` and `POST /detokenize` (vLLM's and llama.cpp's shapes) and
//! vLLM's render API, `POST /v1/chat/completions/render` and `POST /v1/completions/render`.
//!
//! Each render endpoint takes the body its generation endpoint takes and answers the prompt's
//! token ids as that request would compute them (the same checks, template, tools and
//! encoding), without generating: an object for a chat, a list of one for a completion.
//! Routers that tokenize prompts themselves (llm-d's token producer) ask here, so the keys
//! they compute over the tokens are the keys of the engine's own prefix cache.

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::types::{DetokenizeRequest, RenderOptions, TokenizeRequest};
use super::{response, translate};
use crate::server::body::read_json;
use crate::server::error::ApiError;
use crate::server::request::Api;
use crate::server::state::SharedState;

/// Answers `POST /tokenize`: the token ids (and, when asked, pieces) of a text or a chat.
pub async fn tokenize(State(st): State<SharedState>, body: Body) -> Result<Response, ApiError> {
    let v: Value = read_json(body, st.cfg.max_body_bytes, st.cfg.read_timeout).await?;
    let req = TokenizeRequest::from_json(v, st.cfg.max_body_bytes)?;
    st.check_model(req.model.as_deref())?;
    let (with_pieces, token_strs) = (req.with_pieces, req.token_strs);
    let ids = translate::tokenize(&st, req)?;
    let bytes = st.prompts.tokenizer().token_bytes();
    let out = response::tokens(&ids, &bytes, with_pieces, token_strs, st.context);
    Ok(Json(out).into_response())
}

/// Answers `POST /detokenize`: the text of a list of token ids.
pub async fn detokenize(State(st): State<SharedState>, body: Body) -> Result<Response, ApiError> {
    let v: Value = read_json(body, st.cfg.max_body_bytes, st.cfg.read_timeout).await?;
    let req = DetokenizeRequest::from_json(v)?;
    st.check_model(req.model.as_deref())?;
    let text = translate::detokenize(&st, &req.tokens)?;
    Ok(Json(response::detokenized(&text)).into_response())
}

/// Answers `POST /v1/chat/completions/render`.
pub async fn render_chat(State(st): State<SharedState>, body: Body) -> Result<Response, ApiError> {
    let v: Value = read_json(body, st.cfg.max_body_bytes, st.cfg.read_timeout).await?;
    let (options, body) = RenderOptions::take(v)?;
    let (model, ids) = translate::render_chat(&st, body, options.add_generation_prompt)?;
    Ok(Json(response::rendered(Api::Chat, &model, &ids)).into_response())
}

/// Answers `POST /v1/completions/render`.
pub async fn render_completions(
    State(st): State<SharedState>,
    body: Body,
) -> Result<Response, ApiError> {
    let v: Value = read_json(body, st.cfg.max_body_bytes, st.cfg.read_timeout).await?;
    let (model, ids) = translate::render_completion(&st, v)?;
    Ok(Json(json!([response::rendered(Api::Completions, &model, &ids)])).into_response())
}
