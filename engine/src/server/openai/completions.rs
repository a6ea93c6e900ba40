//! `POST /v1/completions`.

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::types::{CompletionRequest, Prompt};
use super::{created, new_id, read_json, session, sse};
use crate::server::error::ApiError;
use crate::server::pipeline::{CancelOnDrop, Out, launch};
use crate::server::trace::RequestInfo;
use crate::server::{Arrival, SharedState};

/// Handles a text completion, streamed or not.
pub async fn handle(
    State(st): State<SharedState>,
    Extension(Arrival(received)): Extension<Arrival>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let req: CompletionRequest =
        read_json(body, st.cfg.max_body_bytes, st.cfg.read_timeout).await?;
    let opts = req.common.validate(&st.cfg.limits)?;
    let model = st.check_model(req.common.model.as_deref())?;
    let (text, prompt) = match &req.prompt {
        Prompt::Text(t) => (t.clone(), st.prompts.raw(t)),
        Prompt::Texts(v) if v.len() == 1 => (v[0].clone(), st.prompts.raw(&v[0])),
        Prompt::Texts(v) => {
            return Err(ApiError::invalid_param(
                "prompt",
                format!(
                    "{} prompts given; one prompt per request is supported",
                    v.len()
                ),
            ));
        }
        Prompt::Tokens(ids) => {
            let vocab = st.vocab;
            if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
                return Err(ApiError::invalid_param(
                    "prompt",
                    format!("token id {bad} is outside the vocabulary of {vocab}"),
                ));
            }
            (String::new(), Ok(ids.clone()))
        }
    };
    let prompt = prompt.map_err(|e| ApiError::invalid_param("prompt", e.to_string()))?;
    if prompt.is_empty() {
        return Err(ApiError::invalid_param("prompt", "the prompt is empty"));
    }
    let id = new_id("cmpl");
    let info = RequestInfo {
        id: id.clone(),
        operation: slotlight_otel::span::OPERATION_TEXT_COMPLETION,
        request_model: req.common.model.clone().unwrap_or_else(|| model.clone()),
        response_model: model.clone(),
        session: session(&headers, opts.user.as_deref()),
        max_tokens: opts.max_tokens,
        temperature: opts.sampling.temperature,
        top_p: opts.sampling.top_p,
        top_k: opts.sampling.top_k,
        seed: opts.sampling.seed,
        stream: opts.stream,
        requested: (&req.common).into(),
        received,
        prompt_text: st.cfg.trace_content.then_some(text),
    };
    let parent = crate::server::parent_context(&headers);
    let prompt_len = prompt.len();
    let (out, cancel) = launch(&st, info, prompt, &opts, &parent)?;
    let created = created();
    if !opts.stream {
        let mut guard = CancelOnDrop::new(cancel);
        let mut out = out;
        let mut text = String::new();
        while let Some(o) = out.recv().await {
            match o {
                Out::Delta { text: t, .. } => text.push_str(&t),
                Out::Done(f) => {
                    guard.disarm();
                    if let Some(e) = f.error {
                        return Err(e);
                    }
                    text.push_str(&f.tail);
                    return Ok(Json(json!({
                        "id": id,
                        "object": "text_completion",
                        "created": created,
                        "model": model,
                        "system_fingerprint": Value::Null,
                        "choices": [{"index": 0, "text": text, "logprobs": Value::Null, "finish_reason": f.finish_reason}],
                        "usage": f.usage,
                        "timings": f.timings,
                    }))
                    .into_response());
                }
            }
        }
        return Err(ApiError::internal("the request ended without a result"));
    }
    let chunk = move |text: String, finish: Value| {
        json!({
            "id": id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "system_fingerprint": Value::Null,
            "choices": [{"index": 0, "text": text, "logprobs": Value::Null, "finish_reason": finish}],
        })
    };
    let include_usage = opts.include_usage;
    let continuous = opts.continuous_usage;
    let mut guard = Some(CancelOnDrop::new(cancel));
    let body = UnboundedReceiverStream::new(out).flat_map(move |o| {
        let items: Vec<Value> = match o {
            Out::Delta { text, generated } => {
                if text.is_empty() && !continuous {
                    Vec::new()
                } else {
                    let mut c = chunk(text, Value::Null);
                    if continuous {
                        c["usage"] = json!({
                            "prompt_tokens": prompt_len,
                            "completion_tokens": generated,
                            "total_tokens": prompt_len + generated,
                        });
                    }
                    vec![c]
                }
            }
            Out::Done(f) => {
                if let Some(g) = guard.as_mut() {
                    g.disarm();
                }
                if let Some(e) = &f.error {
                    vec![e.body()]
                } else {
                    let mut last = chunk(f.tail.clone(), json!(f.finish_reason));
                    last["timings"] = json!(f.timings);
                    if continuous {
                        last["usage"] = json!(f.usage);
                    }
                    let mut v = vec![last];
                    if include_usage {
                        let mut u = chunk(String::new(), Value::Null);
                        u["choices"] = json!([]);
                        u["usage"] = json!(f.usage);
                        u["timings"] = json!(f.timings);
                        v.push(u);
                    }
                    v
                }
            }
        };
        futures_util::stream::iter(items)
    });
    Ok(sse(body).into_response())
}
