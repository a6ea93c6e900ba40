//! Start-up and shutdown: binds the three listeners and spawns the tasks.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::serve::ListenerExt;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::assembly::{self, Assembly, AssemblyConfig, Published, TurnLog};
use crate::base::config::Config;
use crate::metrics::Metrics;
use crate::receiver::forward::{ForwardUrlError, Forwarder, Upstream};
use crate::receiver::grpc::{GrpcLogsReceiver, GrpcMetricsReceiver, GrpcReceiver};
use crate::receiver::{AllowList, Ingest, http};
use crate::store::{self, Retention, StoreError, TurnsDb};
use crate::views::{self, ApiState};

/// Why the sidecar could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A listener could not bind.
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        /// Which listener could not bind (`--otlp-grpc`, `--otlp-http` or `--listen`).
        what: &'static str,
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// `--forward-otlp` is not a URL this build can send to.
    #[error(transparent)]
    ForwardUrl(#[from] ForwardUrlError),
    /// `--turns-db` could not be opened or created.
    #[error("--turns-db: {0}")]
    TurnStore(#[from] StoreError),
}

/// A running sidecar.
#[derive(Debug)]
pub struct Sidecar {
    /// The OTLP/gRPC receiver's address.
    pub otlp_grpc: SocketAddr,
    /// The OTLP/HTTP receiver's address.
    pub otlp_http: SocketAddr,
    /// The views' address.
    pub listen: SocketAddr,
    /// What the assembly publishes (for in-process readers and tests).
    pub published: Published,
    /// The sidecar's metrics, served on `/metrics`.
    pub metrics: Arc<Metrics>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    /// The turn store's writer thread; it ends once the assembly is gone.
    store_thread: Option<std::thread::JoinHandle<()>>,
}

impl Sidecar {
    /// The start-up line: where everything listens, and whether it is reachable from outside.
    pub fn startup_line(&self) -> String {
        let all_loopback = [self.otlp_grpc, self.otlp_http, self.listen]
            .iter()
            .all(|a| a.ip().is_loopback());
        let scope = if all_loopback {
            "loopback only"
        } else {
            "NOT loopback only: reachable from the network"
        };
        format!(
            "slotlight-sidecar {} listening otlp_grpc={} otlp_http={} views={} ({scope})",
            env!("CARGO_PKG_VERSION"),
            self.otlp_grpc,
            self.otlp_http,
            self.listen
        )
    }

    /// Stops accepting, ends streams, lets the assembly drain, waits (briefly) for tasks, then
    /// for the turn store to commit what it was handed.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        for t in self.tasks {
            let abort = t.abort_handle();
            if tokio::time::timeout(Duration::from_secs(3), t)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
        if let Some(t) = self.store_thread {
            let joined = tokio::task::spawn_blocking(move || t.join());
            if tokio::time::timeout(Duration::from_secs(10), joined)
                .await
                .is_err()
            {
                tracing::warn!("TurnStore.SlowShutdown: the writer did not finish in 10 s");
            }
        }
    }
}

async fn bind(what: &'static str, addr: SocketAddr) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind { what, addr, source })
}

fn local(l: &TcpListener, what: &'static str, addr: SocketAddr) -> Result<SocketAddr, StartError> {
    l.local_addr()
        .map_err(|source| StartError::Bind { what, addr, source })
}

/// Starts a sidecar on the current tokio runtime.
pub async fn start(cfg: Config) -> Result<Sidecar, StartError> {
    let metrics = Arc::new(Metrics::new(cfg.max_span_metric_series));
    // Servers first, then the assembly and the forwarder (they end when the servers drop their
    // ends of the queues), so shutdown waits in dependency order.
    let mut tasks = Vec::new();
    let mut tail = Vec::new();
    let forwarder = match &cfg.forward_otlp {
        Some(url) => {
            let (f, task) = Forwarder::start(
                Upstream::parse(url)?,
                cfg.forward_queue,
                Duration::from_millis(cfg.forward_timeout_ms.max(1)),
                metrics.clone(),
            )?;
            tail.push(task);
            Some(f)
        }
        None => None,
    };

    let grpc_l = bind("otlp-grpc", cfg.otlp_grpc).await?;
    let http_l = bind("otlp-http", cfg.otlp_http).await?;
    let views_l = bind("listen", cfg.listen).await?;
    let otlp_grpc = local(&grpc_l, "otlp-grpc", cfg.otlp_grpc)?;
    let otlp_http = local(&http_l, "otlp-http", cfg.otlp_http)?;
    let listen = local(&views_l, "listen", cfg.listen)?;

    let (store, store_writer, store_thread) = match TurnsDb::from_flag(cfg.turns_db.as_deref()) {
        TurnsDb::Memory => (None, None, None),
        TurnsDb::File(path) => {
            let retention = Retention {
                max_age: cfg.turns_retention,
                max_rows: cfg.turns_max,
            };
            let open = store::open(&path, retention)?;
            tracing::info!(path = %path.display(), "TurnStore.Open");
            (Some(open.db), Some(open.writer), Some(open.thread))
        }
    };
    let mut assembly = Assembly::new(AssemblyConfig::from_config(&cfg), cfg.turns);
    if let Some(db) = &store {
        // Sessions live when the sidecar stopped are taken up again, to be observed once, whole.
        let now = crate::base::vocab::unix_now_ns();
        match db.live_sessions(cfg.session_idle_ns(), now) {
            Ok(live) => assembly.sessions.load(live, now),
            Err(e) => tracing::warn!(error = %e, "TurnStore.LiveSessionsUnread"),
        }
    }
    let published = assembly.published.clone();
    let (tx, rx) = mpsc::channel(4096);
    let turn_log = if cfg.no_turn_log {
        None
    } else {
        match TurnLog::stdout() {
            Ok(l) => Some(l),
            Err(e) => {
                tracing::warn!(error = %e, "TurnLog.Unavailable");
                None
            }
        }
    };
    tail.insert(
        0,
        tokio::spawn(assembly::run(
            rx,
            assembly,
            metrics.clone(),
            turn_log,
            store_writer,
            cfg.publish_interval(),
        )),
    );

    let ingest = Ingest::new(
        tx,
        cfg.ingest_queue_spans,
        metrics.clone(),
        forwarder,
        AllowList::new(cfg.allow_otlp_from.clone()),
        cfg.max_body_bytes,
    );
    let (shutdown, shutdown_rx) = watch::channel(false);
    let until = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|v| *v).await;
    };

    // OTLP/gRPC.
    let incoming = futures_util::stream::unfold(grpc_l, |l| async move {
        let r = l.accept().await.map(|(s, _)| {
            let _ = s.set_nodelay(true);
            s
        });
        if r.is_err() {
            // Out of descriptors and the like: do not spin.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Some((r, l))
    });
    let svc = GrpcReceiver::service(ingest.clone(), metrics.clone());
    let metrics_svc = GrpcMetricsReceiver::service(ingest.clone(), metrics.clone());
    let logs_svc = GrpcLogsReceiver::service(ingest.clone(), metrics.clone());
    let grpc_shutdown = until(shutdown_rx.clone());
    tasks.push(tokio::spawn(async move {
        let r = tonic::transport::Server::builder()
            .add_service(svc)
            .add_service(metrics_svc)
            .add_service(logs_svc)
            .serve_with_incoming_shutdown(incoming, grpc_shutdown)
            .await;
        if let Err(e) = r {
            tracing::error!(error = %e, "Receiver.GrpcStopped");
        }
    }));

    // OTLP/HTTP.
    let app = http::router(ingest);
    let http_shutdown = until(shutdown_rx.clone());
    tasks.push(tokio::spawn(async move {
        let l = http_l.tap_io(|s| {
            let _ = s.set_nodelay(true);
        });
        let r = axum::serve(l, app.into_make_service_with_connect_info::<SocketAddr>())
            .with_graceful_shutdown(http_shutdown)
            .await;
        if let Err(e) = r {
            tracing::error!(error = %e, "Receiver.HttpStopped");
        }
    }));

    // Views.
    let views_app = views::router(ApiState {
        published: published.clone(),
        store,
        metrics: metrics.clone(),
        session_idle_ns: cfg.session_idle_ns(),
        token: cfg
            .token
            .as_deref()
            .filter(|t| !t.is_empty())
            .map(Arc::from),
        shutdown: shutdown_rx.clone(),
    });
    let views_shutdown = until(shutdown_rx);
    tasks.push(tokio::spawn(async move {
        let l = views_l.tap_io(|s| {
            let _ = s.set_nodelay(true);
        });
        let r = axum::serve(l, views_app)
            .with_graceful_shutdown(views_shutdown)
            .await;
        if let Err(e) = r {
            tracing::error!(error = %e, "Views.Stopped");
        }
    }));

    tasks.extend(tail);
    Ok(Sidecar {
        otlp_grpc,
        otlp_http,
        listen,
        published,
        metrics,
        shutdown,
        tasks,
        store_thread,
    })
}
