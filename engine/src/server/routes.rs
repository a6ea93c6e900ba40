//! The routes: which handler answers which path, behind which middleware, and the small
//! read-only endpoints (`/v1/models`, `/health`, `/v1/requests`, `/metrics`).

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

use super::error::{ApiError, ErrorShape};
use super::middleware::{authenticate, stamp_arrival};
use super::state::SharedState;
use super::{messages, openai, responses, tokenize};

async fn models(State(st): State<SharedState>) -> Response {
    let data: Vec<_> = st
        .cfg
        .model_names
        .iter()
        .map(|id| {
            json!({
                "id": id,
                "object": "model",
                "created": st.started,
                "owned_by": "slotlight",
                "max_model_len": st.context,
            })
        })
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

async fn health(State(st): State<SharedState>) -> Response {
    let (_, groups) = st.engine.snapshot().await;
    let draining = st.engine.is_shutting_down();
    let body = json!({
        "status": if draining { "shutting_down" } else { "ok" },
        "model": st.cfg.model_names.first(),
        "model_info": st.cfg.model_info,
        "instance_id": st.telemetry.instance_id,
        "queued": st.engine.queued(),
        "in_flight": st.engine.in_flight(),
        "groups": groups,
        "telemetry": st.telemetry.counts(),
        "kv_events": st.engine.kv_events_status(),
        "responses_store": responses::store::ResponseStore::of(&st).ok().map(|s| {
            let s = s.snapshot();
            json!({
                "backend": s.backend,
                "available": s.unavailable.is_none(),
                "reason": s.unavailable,
                "not_stored": s.not_stored,
            })
        }),
    });
    let code = if draining {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    (code, axum::Json(body)).into_response()
}

async fn requests(State(st): State<SharedState>) -> Response {
    let (data, groups) = st.engine.snapshot().await;
    let sessions = st.engine.session_stats();
    axum::Json(json!({"object": "list", "data": data, "groups": groups, "sessions": sessions}))
        .into_response()
}

/// `GET /metrics`: every slot group's counters and gauges, the request latencies and
/// refusals, and the exporter's health, read now; OpenMetrics when the `Accept` header asks.
async fn metrics(State(st): State<SharedState>, headers: HeaderMap) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let (openmetrics, content_type) = crate::metrics::negotiate(accept);
    let scrape = crate::metrics::Scrape {
        groups: st
            .engine
            .group_metrics()
            .iter()
            .map(|g| g.snapshot())
            .collect(),
        requests: st.metrics.snapshot(),
        telemetry: (st.telemetry.snapshot_source())(),
        vllm: st.cfg.vllm_metrics.clone(),
        responses_store: responses::store::ResponseStore::of(&st)
            .ok()
            .map(|s| s.snapshot()),
    };
    let body = crate::metrics::render(scrape, openmetrics);
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// No route: 404 in the shape of the API the path belongs to.
async fn fallback(req: Request) -> Response {
    let path = req.uri().path();
    ApiError::not_found(path).render(ErrorShape::of_path(path))
}

/// The routes, with authentication. The generation routes' handlers refuse requests while
/// draining and record every refusal they answer themselves. `/metrics` is behind the API key unless `--metrics-public`.
pub fn router(st: SharedState) -> Router {
    let public_metrics = st.cfg.metrics_public;
    let mut api = Router::new()
        .route("/v1/chat/completions", post(openai::handler::chat))
        .route("/v1/completions", post(openai::handler::completions))
        .route("/v1/messages", post(messages::handler::create))
        .route(
            "/v1/messages/count_tokens",
            post(messages::handler::count_tokens),
        )
        .route("/v1/responses", post(responses::handler::create))
        .route(
            "/v1/responses/input_tokens",
            post(responses::handler::input_tokens),
        )
        .route(
            "/v1/responses/{id}",
            get(responses::handler::retrieve).delete(responses::handler::delete),
        )
        .route(
            "/v1/responses/{id}/input_items",
            get(responses::handler::input_items),
        )
        .route(
            "/v1/chat/completions/render",
            post(tokenize::handler::render_chat),
        )
        .route(
            "/v1/completions/render",
            post(tokenize::handler::render_completions),
        )
        .route("/tokenize", post(tokenize::handler::tokenize))
        .route("/detokenize", post(tokenize::handler::detokenize))
        .route("/v1/models", get(models))
        .route("/v1/requests", get(requests));
    if !public_metrics {
        api = api.route("/metrics", get(metrics));
    }
    let api = api.route_layer(middleware::from_fn_with_state(
        Arc::clone(&st),
        authenticate,
    ));
    let mut open = Router::new().route("/health", get(health));
    if public_metrics {
        open = open.route("/metrics", get(metrics));
    }
    Router::new()
        .merge(api)
        .merge(open)
        .fallback(fallback)
        .layer(middleware::from_fn(stamp_arrival))
        .with_state(st)
}
