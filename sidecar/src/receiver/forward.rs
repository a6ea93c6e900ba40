//! `--forward-otlp`: everything received is also sent on, unchanged, to an upstream
//! collector or Jaeger, so engine → sidecar → Jaeger works without a collector.
//!
//! * `http://host:port` → OTLP/HTTP protobuf `POST http://host:port/v1/traces`; a URL with a
//!   path (`http://host:port/otlp/v1/traces`) is used as given. Metrics go to the same URL
//!   with `/v1/traces` replaced by `/v1/metrics` (a path not ending in `/v1/traces` forwards
//!   spans only; metrics are then dropped and counted).
//! * `grpc://host:port` → OTLP/gRPC (plaintext HTTP/2) to `host:port`, spans to
//!   `TraceService`, metrics to `MetricsService`.
//! * `https://` and `grpcs://` are refused at start-up: this build has no TLS stack (it keeps
//!   the build free of C dependencies). Forward to a collector on loopback instead.
//!
//! The receivers only `try_reserve` a place in a bounded queue; a slow or dead upstream fills
//! the queue and further exports are dropped and counted
//! (`slotlight_sidecar_forward_dropped_total`), never waited for.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::raw::RawExporter;
pub use super::signal::Signal;
use crate::metrics::Metrics;

/// `--forward-otlp` is not a URL this build can send to.
#[derive(Debug, thiserror::Error)]
#[error("--forward-otlp {url:?}: {why}")]
pub struct ForwardUrlError {
    /// The URL given.
    pub url: String,
    /// What is wrong with it.
    pub why: String,
}

/// Where to forward.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Upstream {
    /// OTLP/HTTP protobuf to this URL.
    Http(String),
    /// OTLP/gRPC to this endpoint (`http://host:port`).
    Grpc(String),
}

impl Upstream {
    /// Parses `--forward-otlp`.
    pub fn parse(url: &str) -> Result<Upstream, ForwardUrlError> {
        let bad = |why: &str| ForwardUrlError {
            url: url.to_string(),
            why: why.to_string(),
        };
        let parsed = reqwest::Url::parse(url).map_err(|e| bad(&e.to_string()))?;
        if parsed.host_str().is_none_or(str::is_empty) {
            return Err(bad("no host"));
        }
        match parsed.scheme() {
            "http" => {
                let mut u = parsed.clone();
                if u.path().is_empty() || u.path() == "/" {
                    u.set_path("/v1/traces");
                }
                Ok(Upstream::Http(u.to_string()))
            }
            "grpc" => {
                let host = parsed.host_str().unwrap_or_default();
                let port = parsed.port().unwrap_or(4317);
                let host = if host.contains(':') && !host.starts_with('[') {
                    format!("[{host}]")
                } else {
                    host.to_string()
                };
                Ok(Upstream::Grpc(format!("http://{host}:{port}")))
            }
            "https" | "grpcs" => Err(bad(
                "TLS upstreams are not built in; forward to a collector on loopback (http:// or grpc://)",
            )),
            other => Err(bad(&format!(
                "unknown scheme {other:?}; use http://host:port (OTLP/HTTP) or grpc://host:port (OTLP/gRPC)"
            ))),
        }
    }
}

/// The receivers' end of the forward queue.
#[derive(Debug, Clone)]
pub struct Forwarder {
    tx: mpsc::Sender<(Signal, Bytes)>,
    metrics: Arc<Metrics>,
}

/// The OTLP/HTTP URL of `signal` (`metrics`, `logs`) beside a traces URL, when it ends in
/// `/v1/traces`.
fn signal_url(traces: &str, signal: &str) -> Option<String> {
    traces
        .strip_suffix(Signal::Traces.http_path())
        .map(|base| format!("{base}/v1/{signal}"))
}

impl Forwarder {
    /// Starts the forwarding task.
    pub fn start(
        upstream: Upstream,
        queue: usize,
        timeout: Duration,
        metrics: Arc<Metrics>,
    ) -> Result<(Forwarder, JoinHandle<()>), ForwardUrlError> {
        let (tx, rx) = mpsc::channel(queue.max(1));
        let sender = match &upstream {
            Upstream::Http(url) => {
                let client = reqwest::Client::builder()
                    .timeout(timeout)
                    .build()
                    .map_err(|e| ForwardUrlError {
                        url: url.clone(),
                        why: e.to_string(),
                    })?;
                Sender::Http {
                    client,
                    url: url.clone(),
                    metrics_url: signal_url(url, Signal::Metrics.name()),
                    logs_url: signal_url(url, Signal::Logs.name()),
                }
            }
            Upstream::Grpc(endpoint) => {
                let channel = tonic::transport::Endpoint::from_shared(endpoint.clone())
                    .map_err(|e| ForwardUrlError {
                        url: endpoint.clone(),
                        why: e.to_string(),
                    })?
                    .connect_timeout(timeout)
                    .timeout(timeout)
                    .connect_lazy();
                Sender::Grpc(RawExporter::new(channel, false))
            }
        };
        let task = tokio::spawn(run(rx, sender, metrics.clone(), upstream));
        Ok((Forwarder { tx, metrics }, task))
    }

    /// Queues one export request of `signal` for the upstream, encoding it only when there
    /// is room.
    pub fn offer(&self, signal: Signal, body: impl FnOnce() -> Bytes) {
        match self.tx.try_reserve() {
            Ok(permit) => permit.send((signal, body())),
            Err(_) => self.metrics.count_forward_dropped(),
        }
    }
}

enum Sender {
    Http {
        client: reqwest::Client,
        url: String,
        metrics_url: Option<String>,
        logs_url: Option<String>,
    },
    Grpc(RawExporter),
}

impl Sender {
    async fn send(&mut self, signal: Signal, body: Bytes) -> Result<(), String> {
        match self {
            Sender::Http {
                client,
                url,
                metrics_url,
                logs_url,
            } => {
                let beside = |u: &Option<String>, what: &str| {
                    u.clone().ok_or_else(|| {
                        format!("no {what} URL beside {url} (it does not end in /v1/traces)")
                    })
                };
                let url = match signal {
                    Signal::Traces => url.clone(),
                    Signal::Metrics => beside(metrics_url, "metrics")?,
                    Signal::Logs => beside(logs_url, "logs")?,
                };
                let resp = client
                    .post(url)
                    .header("content-type", "application/x-protobuf")
                    .body(body)
                    .send()
                    .await
                    .map_err(|e| e.to_string())?;
                if resp.status().is_success() {
                    Ok(())
                } else {
                    Err(format!("upstream answered {}", resp.status()))
                }
            }
            Sender::Grpc(exp) => exp
                .export_to(signal.grpc_method(), body)
                .await
                .map(|_| ())
                .map_err(|s| format!("upstream answered {:?}: {}", s.code(), s.message())),
        }
    }
}

async fn run(
    mut rx: mpsc::Receiver<(Signal, Bytes)>,
    mut sender: Sender,
    metrics: Arc<Metrics>,
    up: Upstream,
) {
    let mut failures: u64 = 0;
    while let Some((signal, body)) = rx.recv().await {
        match sender.send(signal, body).await {
            Ok(()) => metrics.count_forwarded(),
            Err(e) => {
                metrics.count_forward_dropped();
                // Warn on the first failure and then every 1000th, not per request.
                if failures.is_multiple_of(1000) {
                    tracing::warn!(upstream = ?up, error = %e, failures = failures + 1, "Forward.Failed");
                }
                failures += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            Upstream::parse("http://127.0.0.1:4318").expect("http"),
            Upstream::Http("http://127.0.0.1:4318/v1/traces".into())
        );
        assert_eq!(
            Upstream::parse("http://h:4318/custom/path").expect("path"),
            Upstream::Http("http://h:4318/custom/path".into())
        );
        assert_eq!(
            Upstream::parse("grpc://jaeger:4317").expect("grpc"),
            Upstream::Grpc("http://jaeger:4317".into())
        );
        assert_eq!(
            Upstream::parse("grpc://[::1]:4317").expect("grpc v6"),
            Upstream::Grpc("http://[::1]:4317".into())
        );
        assert_eq!(
            signal_url("http://h:4318/otlp/v1/traces", "metrics").as_deref(),
            Some("http://h:4318/otlp/v1/metrics")
        );
        assert_eq!(signal_url("http://h:4318/custom/path", "metrics"), None);
        assert_eq!(
            signal_url("http://h:4318/v1/traces", "logs").as_deref(),
            Some("http://h:4318/v1/logs")
        );
        assert!(Upstream::parse("https://h:4318").is_err());
        assert!(Upstream::parse("ftp://h").is_err());
        assert!(Upstream::parse("not a url").is_err());
    }
}
