//! `POST /v1/chat/completions/render` and `POST /v1/completions/render`: vLLM's render API.
//!
//! Each takes the body its generation endpoint takes and answers the prompt's token ids as
//! that request would compute them (the same checks, template, tools and encoding), without
//! generating: `{"request_id", "model", "token_ids"}` for a chat, a list of one such object for
//! a completion. Routers that tokenize prompts themselves (llm-d's token producer) ask here, so
//! the keys they compute over the tokens are the keys of the engine's own prefix cache. A chat
//! body may also carry vLLM's `add_generation_prompt` (default true); `continue_final_message`
//! and a per-request `chat_template` are refused, as the chat endpoint refuses them.

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::server::body::read_json;
use crate::server::error::ApiError;
use crate::server::ids::new_id;
use crate::server::request::input::{ChatRequest, CompletionRequest};
use crate::server::request::{Api, validate};
use crate::server::state::SharedState;

/// Answers `POST /v1/chat/completions/render`.
pub async fn chat(State(st): State<SharedState>, body: Body) -> Result<Response, ApiError> {
    let v: Value = read_json(body, st.cfg.max_body_bytes, st.cfg.read_timeout).await?;
    let Value::Object(mut map) = v else {
        return Err(ApiError::invalid("the request body must be a JSON object"));
    };
    let add_generation_prompt = match map.remove("add_generation_prompt") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => b,
        Some(_) => {
            return Err(ApiError::invalid_param(
                "add_generation_prompt",
                "`add_generation_prompt` must be a boolean",
            ));
        }
    };
    if let Some(v) = map.remove("continue_final_message")
        && v != Value::Bool(false)
        && v != Value::Null
    {
        return Err(ApiError::invalid_param(
            "continue_final_message",
            "continuing the final message is not supported",
        ));
    }
    let req = ChatRequest::from_json(Value::Object(map))?;
    req.common.validate(&st.cfg.limits, st.vocab)?;
    let model = st.check_model(req.common.model.as_deref())?;
    let (_, ids, _) = validate::chat_prompt(&st, &req, add_generation_prompt)?;
    Ok(Json(rendered(Api::Chat, &model, &ids)).into_response())
}

/// Answers `POST /v1/completions/render`.
pub async fn completions(State(st): State<SharedState>, body: Body) -> Result<Response, ApiError> {
    let v: Value = read_json(body, st.cfg.max_body_bytes, st.cfg.read_timeout).await?;
    let req = CompletionRequest::from_json(v)?;
    req.common.validate(&st.cfg.limits, st.vocab)?;
    let model = st.check_model(req.common.model.as_deref())?;
    let (_, ids) = validate::completion_prompt(&st, &req)?;
    Ok(Json(json!([rendered(Api::Completions, &model, &ids)])).into_response())
}

fn rendered(api: Api, model: &str, ids: &[u32]) -> Value {
    json!({"request_id": new_id(api.id_prefix()), "model": model, "token_ids": ids})
}
