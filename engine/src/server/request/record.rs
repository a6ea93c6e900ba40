//! A request's log lines and latency observations, written from what was decided once: a
//! finished request's [`RequestOutcome`], or a [`Refusal`]. Nothing here decides how a request
//! ended; it only writes it down.

use std::time::Instant;

use crate::metrics::{Observation, RequestMetrics};
use crate::server::error::ApiError;
use crate::server::request::arrival::Arrived;
use crate::server::request::outcome::{Failure, RequestOutcome};
use crate::server::request::trace::{self, Refusal, RequestTrace};
use crate::server::request::{Api, RequestMeta};
use crate::server::state::AppState;

/// A generation request answered with an error before it reached a step loop, with what was
/// known of it when it was refused.
pub struct Refused {
    /// The error the client is answered with.
    pub error: ApiError,
    /// The request span (and through it the request), when the request was refused after its
    /// span started (by the scheduler: the queue is full, the engine is stopping).
    pub started: Option<Box<RequestTrace>>,
}

impl From<ApiError> for Refused {
    fn from(error: ApiError) -> Self {
        Self {
            error,
            started: None,
        }
    }
}

/// Records a refused generation request (its span, its log line, its count and duration): the
/// one place every refusal of a generation route is recorded, called by the route's handler,
/// which answers the error it returns in its API's shape. `api` is the route's own.
pub fn refusal(st: &AppState, api: Api, arrived: &Arrived, refused: Refused) -> ApiError {
    let Arrived {
        received,
        headers,
        server,
    } = arrived;
    let received = *received;
    let Refused { error, started } = refused;
    let now = Instant::now();
    match started {
        Some(trace) => {
            let meta = std::sync::Arc::clone(trace.meta());
            let r = Refusal {
                id: meta.id.clone(),
                api: meta.request.api,
                response_model: meta.request.model.clone(),
                session: meta.session_id().map(str::to_string),
                received: meta.received,
                refused: now,
                error_type: error.label(),
                message: error.message.clone(),
            };
            let cx = trace.context().clone();
            trace.refuse(r.error_type, &r.message, now);
            // Under the request span's context, so that its OTLP log record carries its ids.
            let _cx = cx.attach();
            refused_request(
                st.metrics.as_ref(),
                &r,
                error.status.as_u16(),
                Some(&meta.request.request_model),
            );
        }
        None => {
            let r = Refusal {
                id: crate::server::ids::new_id(api.id_prefix()),
                api,
                response_model: st.cfg.model_names.first().cloned().unwrap_or_default(),
                session: crate::server::request::session::from_header(headers).map(|k| k.id),
                received,
                refused: now,
                error_type: error.label(),
                message: error.message.clone(),
            };
            let parent = crate::server::request::arrival::parent_context(headers);
            let sc = trace::record_refusal(&st.telemetry, st.anchor, &r, &parent, server);
            use opentelemetry::trace::TraceContextExt as _;
            let _cx = parent.with_remote_span_context(sc).attach();
            refused_request(st.metrics.as_ref(), &r, error.status.as_u16(), None);
        }
    }
    error
}

/// Records a finished request: its `Request.Finished` log line, a `Request.Failed` warning
/// when the engine failed it, and its latency observation.
pub fn finished(metrics: &RequestMetrics, meta: &RequestMeta, trace_id: &str, o: &RequestOutcome) {
    log_finished(meta, trace_id, o);
    if let Some(Failure::Engine(e)) = &o.failure {
        // A failure of the engine (not the client's doing): a warning, which also becomes an
        // event on the request span.
        tracing::warn!(
            name: "Request.Failed",
            target: "slotlight::request",
            request_id = %meta.id,
            error_type = e.label(),
            error = %e,
            "Request.Failed"
        );
    }
    observe_finished(metrics, meta, o);
}

/// Writes down a refused request: its `Request.Refused` log line, its refusal count and its
/// duration (arrival to refusal) with its `error.type`; `request_model` when the body was
/// read.
fn refused_request(
    metrics: &RequestMetrics,
    r: &Refusal,
    http_status: u16,
    request_model: Option<&str>,
) {
    log_refused(r, http_status);
    metrics.count_refused(r.error_type);
    metrics.observe(&Observation {
        api: r.api.label(),
        operation: r.api.operation(),
        request_model,
        response_model: &r.response_model,
        error_type: Some(r.error_type),
        ttft: None,
        tpot: None,
        duration: r
            .refused
            .saturating_duration_since(r.received)
            .as_secs_f64(),
        queue: None,
    });
}

/// One structured log line per finished request. A value the request never had is left out
/// of the line, never written as zero.
fn log_finished(meta: &RequestMeta, trace_id: &str, o: &RequestOutcome) {
    let legs: Vec<serde_json::Value> = o
        .legs
        .iter()
        .map(|l| {
            let r = &l.record;
            serde_json::json!({
                "choice": l.choice,
                "path": r.path.as_str(),
                "group": r.group,
                "slot": r.slot,
                "tokens_carried": r.tokens_carried,
                "tokens": r.tokens_generated,
                "ms": r.end.map(|e| e.saturating_duration_since(r.start).as_secs_f64() * 1000.0),
                "device_ms": r.device.as_secs_f64() * 1000.0,
                "drafted_tokens": r.drafted_tokens,
                "accepted_tokens": r.accepted_tokens,
                "end": r.end_reason.map(|e| e.as_str()),
            })
        })
        .collect();
    let legs = serde_json::Value::Array(legs).to_string();
    let usage = &o.usage;
    let u = &usage.extras.timings;
    let reasons: Vec<&str> = o.finish_reasons.iter().map(|r| r.as_str()).collect();
    tracing::info!(
        name: "Request.Finished",
        target: "slotlight::request",
        request_id = %meta.id,
        session_id = meta.session_id(),
        session_source = meta.session.as_ref().map(|s| s.source.as_str()),
        session_turn = meta.session.as_ref().and_then(|s| s.turn),
        session_branch = meta.session.as_ref().and_then(|s| s.branch),
        side_call = meta.session.as_ref().is_some_and(|s| s.side_call),
        trace_id = %trace_id,
        api = meta.request.api.label(),
        operation = meta.operation(),
        status = o.status.as_str(),
        finish_reason = reasons.join(","),
        error_type = o.error_type(),
        choices = o.finish_reasons.len(),
        prompt_tokens = usage.prompt_tokens,
        cached_tokens = usage.prompt_tokens_details.cached_tokens,
        prefilled_tokens = o.prefilled_tokens,
        resume = usage.extras.resume,
        reusable_tokens = usage.extras.reusable_tokens,
        diverged_at = usage.extras.diverged_at,
        evicted_tokens = usage.extras.evicted_tokens,
        completion_tokens = usage.completion_tokens,
        reasoning_tokens = o.reasoning_tokens(),
        speculation = o.speculation.as_str(),
        drafted_tokens = o.drafts.drafted_tokens,
        accepted_tokens = o.drafts.accepted_tokens,
        queue_ms = u.queue_ms,
        prefill_ms = u.prefill_ms,
        ttft_ms = u.ttft_ms,
        decode_ms = u.decode_ms,
        generation_ms = u.generation_ms,
        decode_tps = u.decode_tps,
        e2e_ms = u.e2e_ms,
        group = o.group,
        legs = %legs,
        "Request.Finished"
    );
}

/// Observes a finished request in the engine's latency histograms, with the same definitions
/// as its span (and so as the sidecar's histograms): time to first token and time per output
/// token for successful requests only, the duration of every request, with the outcome's
/// `error.type`, and the queue time of an admitted one.
fn observe_finished(metrics: &RequestMetrics, meta: &RequestMeta, o: &RequestOutcome) {
    let usage = &o.usage;
    let u = &usage.extras.timings;
    let secs = |ms: Option<f64>| ms.map(|v| v / 1e3);
    #[allow(clippy::cast_precision_loss)] // token counts are far below 2^53
    let tpot = secs(u.generation_ms)
        .filter(|_| usage.completion_tokens > 1)
        .map(|g| g / (usage.completion_tokens - 1) as f64);
    metrics.observe(&Observation {
        api: meta.request.api.label(),
        operation: meta.operation(),
        request_model: Some(&meta.request.request_model),
        response_model: &meta.request.model,
        error_type: o.error_type(),
        ttft: secs(u.ttft_ms),
        tpot,
        duration: secs(u.e2e_ms).unwrap_or_else(|| meta.received.elapsed().as_secs_f64()),
        queue: secs(u.queue_ms),
    });
}

/// One structured log line per refused request (status `refused`): what is known of it, the
/// HTTP status and the `error.type`.
fn log_refused(r: &Refusal, http_status: u16) {
    tracing::info!(
        name: "Request.Refused",
        target: "slotlight::request",
        request_id = %r.id,
        session_id = r.session.as_deref(),
        api = r.api.label(),
        operation = r.api.operation(),
        status = slotlight_otel::attr::value::STATUS_REFUSED,
        error_type = r.error_type,
        http_status,
        e2e_ms = r.refused.saturating_duration_since(r.received).as_secs_f64() * 1000.0,
        message = %r.message,
        "Request.Refused"
    );
}
