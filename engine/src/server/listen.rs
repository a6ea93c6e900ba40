//! Serving and shutdown: the accept loop with its read timeouts and head limits, and the drain
//! on SIGTERM.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use slotlight_otel::span;
use tracing::Instrument as _;

use super::request::arrival::LocalAddr;
use super::routes::router;
use super::state::{ServeConfig, SharedState};
use crate::telemetry::OPS_TARGET;

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
/// deadline in [`super::body::read_json`].
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
