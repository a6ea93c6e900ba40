//! The HTTP server: OpenAI-compatible chat and completions, `/tokenize` and `/detokenize`,
//! plus `/v1/models`, `/health`, `/v1/requests` and `/metrics`. Routing, authentication and limits live
//! here; request handling in [`openai`]; the per-request task and its telemetry in
//! [`pipeline`] and [`trace`]; `usage` in [`usage`].

pub mod error;
pub mod openai;
pub mod outcome;
pub mod pipeline;
pub mod record;
pub mod trace;
pub mod usage;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use serde_json::json;

use self::error::ApiError;
use self::openai::types::Limits;
use self::trace::ServerAddress;
use crate::constraint::Grammars;
use crate::metrics::RequestMetrics;
use crate::prompt::PromptBuilder;
use crate::scheduler::EngineHandle;
use crate::telemetry::{OPS_TARGET, Telemetry};
use crate::timing::TimeAnchor;
use slotlight_otel::span;
use tracing::Instrument as _;

/// Server settings.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Required bearer token, when set.
    pub api_key: Option<String>,
    /// Largest request body, bytes.
    pub max_body_bytes: usize,
    /// Request limits.
    pub limits: Limits,
    /// Decode progress window (`slotlight.decode` spans); zero turns them off.
    pub progress_interval: Duration,
    /// Record prompt and completion text on spans.
    pub trace_content: bool,
    /// Names the model answers to (the first is reported).
    pub model_names: Vec<String>,
    /// The model's architecture, weight types and context length (reported in `/health`).
    pub model_info: crate::model::loader::ModelInfo,
    /// How long in-flight requests may run after SIGTERM before they are cancelled.
    pub drain_timeout: Duration,
    /// How long a client may take to send a request's headers (then the connection is closed),
    /// and again its body (then 408). Also closes keep-alive connections idle this long.
    pub read_timeout: Duration,
    /// Largest request head (request line and headers), bytes; larger ones get 431.
    pub max_header_bytes: usize,
    /// Serve `GET /metrics` without the API key (for a scraper that has none).
    pub metrics_public: bool,
}

/// When the request arrived (stamped by the outermost middleware).
#[derive(Debug, Clone, Copy)]
pub struct Arrival(pub Instant);

/// The address the server listens on (a request extension), for `server.address` when a
/// request has no `Host` header.
#[derive(Debug, Clone, Copy)]
pub struct LocalAddr(pub SocketAddr);

/// `server.address` and `server.port`: the `Host` header the client sent (HTTP/1.1 requires
/// one), else the listening address.
pub fn server_address(headers: &HeaderMap, local: Option<SocketAddr>) -> ServerAddress {
    let from_host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .and_then(|h| h.parse::<axum::http::uri::Authority>().ok())
        .map(|a| ServerAddress {
            address: Some(
                a.host()
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_string(),
            ),
            port: a.port_u16().or_else(|| local.map(|l| l.port())),
        });
    from_host.unwrap_or_else(|| ServerAddress {
        address: local.map(|l| l.ip().to_string()),
        port: local.map(|l| l.port()),
    })
}

/// Everything handlers share.
pub struct AppState {
    /// The scheduler's handle: submit requests, read what is in flight.
    pub engine: Arc<EngineHandle>,
    /// Prompt building for the served model.
    pub prompts: PromptBuilder,
    /// Structured-output grammars for the served model (compiler built on first use).
    pub grammars: Arc<Grammars>,
    /// The server's settings (limits, timeouts, model names).
    pub cfg: ServeConfig,
    /// The tracer request spans are recorded with, and the exporter's counts.
    pub telemetry: Arc<Telemetry>,
    /// Request latencies and refusals, observed by the HTTP layer (`/metrics`).
    pub metrics: Arc<RequestMetrics>,
    /// Converts request instants to wall-clock time.
    pub anchor: TimeAnchor,
    /// Vocabulary size: token-id prompts are checked against it.
    pub vocab: usize,
    /// Context length served (`/v1/models` reports it as `max_model_len`).
    pub context: usize,
    /// When the server started (unix seconds).
    pub started: u64,
}

/// The state every handler receives.
pub type SharedState = Arc<AppState>;

impl AppState {
    /// The served model's name, or 404 for another one.
    pub fn check_model(&self, asked: Option<&str>) -> Result<String, ApiError> {
        let served = self.cfg.model_names.first().cloned().unwrap_or_default();
        match asked {
            None | Some("") => Ok(served),
            Some(m) if self.cfg.model_names.iter().any(|n| n == m) => Ok(served),
            Some(m) => Err(ApiError::model_not_found(m, &served)),
        }
    }
}

struct HeaderExtractor<'a>(&'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// The caller's trace context from W3C `traceparent`/`tracestate`, or an empty context.
pub fn parent_context(headers: &HeaderMap) -> Context {
    TraceContextPropagator::new().extract(&HeaderExtractor(headers))
}

async fn stamp_arrival(mut req: Request, next: Next) -> Response {
    req.extensions_mut().insert(Arrival(Instant::now()));
    next.run(req).await
}

async fn authenticate(State(st): State<SharedState>, req: Request, next: Next) -> Response {
    if let Some(key) = &st.cfg.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        use subtle::ConstantTimeEq;
        let ok: bool = given.as_bytes().ct_eq(key.as_bytes()).into();
        if !ok {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

async fn models(State(st): State<SharedState>) -> Response {
    let data: Vec<_> = st
        .cfg
        .model_names
        .iter()
        .take(1)
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
    };
    let body = crate::metrics::render(scrape, openmetrics);
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

async fn fallback(req: Request) -> ApiError {
    ApiError::not_found(req.uri().path())
}

/// The routes, with authentication. The generation routes' handlers refuse requests while
/// draining and record every refusal they answer themselves. `/metrics` is behind the API key unless `--metrics-public`.
pub fn router(st: SharedState) -> Router {
    let public_metrics = st.cfg.metrics_public;
    let mut api = Router::new()
        .route("/v1/chat/completions", post(openai::handler::chat))
        .route("/v1/completions", post(openai::handler::completions))
        .route("/tokenize", post(openai::tokenize::tokenize))
        .route("/detokenize", post(openai::tokenize::detokenize))
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

/// Waits for Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

/// Most headers in one request (hyper's default, made explicit); more get 431.
pub const MAX_HEADERS: usize = 100;

/// Serves until `shutdown` resolves, then drains: new requests get 503, in-flight ones finish
/// within the drain timeout (then they are cancelled), and telemetry is flushed.
///
/// Connections are served by hyper directly rather than `axum::serve`, because `axum::serve`
/// sets no timer and so no header read timeout: a client sending its headers a byte at a time
/// (slowloris) would hold its connection forever. Here each connection gets
/// [`ServeConfig::read_timeout`] to deliver each request head (hyper's `header_read_timeout`;
/// it also ends keep-alive connections idle that long), heads are capped at
/// [`ServeConfig::max_header_bytes`] and [`MAX_HEADERS`], and the body read has its own
/// deadline in [`openai::read_json`].
pub async fn serve(
    listener: tokio::net::TcpListener,
    st: SharedState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let addr: SocketAddr = listener.local_addr()?;
    let engine = Arc::clone(&st.engine);
    let drain = st.cfg.drain_timeout;
    let app = router(Arc::clone(&st)).layer(axum::Extension(LocalAddr(addr)));
    let (drained_tx, drained_rx) = tokio::sync::oneshot::channel::<()>();
    let (shutdown_tx, shutdown_rx) = tokio::sync::oneshot::channel::<tracing::Span>();
    let signal = async move {
        shutdown.await;
        let root = tracing::info_span!(target: OPS_TARGET, span::SHUTDOWN);
        tracing::info!(%addr, drain_s = drain.as_secs_f64(), "Server.Draining");
        engine.begin_shutdown();
        let e2 = Arc::clone(&engine);
        let drain_span =
            tracing::info_span!(target: OPS_TARGET, parent: &root, span::SHUTDOWN_DRAIN);
        tokio::spawn(async move {
            async move {
                let deadline = Instant::now() + drain;
                while e2.in_flight() > 0 && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                if e2.in_flight() > 0 {
                    tracing::warn!(
                        in_flight = e2.in_flight(),
                        "Server.DrainTimeout: cancelling what is left"
                    );
                    e2.abort_all();
                }
            }
            .instrument(drain_span)
            .await;
            // After the drain span ended, so that the flush below exports it.
            let _ = drained_tx.send(());
        });
        let _ = shutdown_tx.send(root);
    };
    serve_connections(listener, app, &st.cfg, signal).await;
    let _ = tokio::time::timeout(drain + Duration::from_secs(5), drained_rx).await;
    // The shutdown span (and its drain) end before the exporters shut down, so they are
    // exported too: flush under its own span, end the shutdown span, then shut down.
    let root = shutdown_rx.await.unwrap_or_else(|_| tracing::Span::none());
    st.telemetry
        .flush()
        .instrument(
            tracing::info_span!(target: OPS_TARGET, parent: &root, span::SHUTDOWN_TELEMETRY_FLUSH),
        )
        .await;
    drop(root);
    st.telemetry.shutdown().await;
    Ok(())
}

/// The accept loop: one task per connection, HTTP/1.1 with upgrades, until `signal`
/// resolves; then every connection shuts down gracefully (in-flight requests finish, idle
/// connections close) and this returns once all are closed (as `axum::serve` does).
async fn serve_connections(
    listener: tokio::net::TcpListener,
    app: Router,
    cfg: &ServeConfig,
    signal: impl std::future::Future<Output = ()>,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(cfg.read_timeout)
        .max_headers(MAX_HEADERS)
        // hyper's read buffer must hold a whole head; its minimum is 8 KiB.
        .max_buf_size(cfg.max_header_bytes.max(8192))
        .max_header_size(cfg.max_header_bytes);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (open_tx, open_rx) = tokio::sync::watch::channel(());
    tokio::pin!(signal);
    loop {
        let (stream, _peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::debug!(error = %e, "Server.AcceptFailed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut signal => break,
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let conn = http
            .serve_connection(TokioIo::new(stream), service)
            .with_upgrades();
        let mut stop = stop_rx.clone();
        let open = open_rx.clone();
        tokio::spawn(async move {
            tokio::pin!(conn);
            let stopping = async move {
                let _ = stop.wait_for(|s| *s).await;
            };
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::trace!(error = %e, "Server.ConnectionEnded");
                    }
                }
                () = stopping => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.as_mut().await;
                }
            }
            drop(open);
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    drop(open_rx);
    open_tx.closed().await;
}
