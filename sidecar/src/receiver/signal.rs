//! The three OTLP signals the receivers accept and the forwarder sends on, and where each one
//! goes on either transport: one table, read by the HTTP routes, the gRPC services and the
//! forwarder alike.

/// An OTLP signal the receivers accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// Spans (`/v1/traces`, `TraceService`): viewed, counted, forwarded.
    Traces,
    /// Metrics (`/v1/metrics`, `MetricsService`): counted and forwarded.
    Metrics,
    /// Log records (`/v1/logs`, `LogsService`): counted and forwarded.
    Logs,
}

impl Signal {
    /// Every signal.
    pub const ALL: [Signal; 3] = [Signal::Traces, Signal::Metrics, Signal::Logs];

    /// Its name in OTLP/HTTP paths: `traces`, `metrics`, `logs`.
    pub const fn name(self) -> &'static str {
        match self {
            Signal::Traces => "traces",
            Signal::Metrics => "metrics",
            Signal::Logs => "logs",
        }
    }

    /// The OTLP/HTTP path: `/v1/traces`, `/v1/metrics`, `/v1/logs`.
    pub const fn http_path(self) -> &'static str {
        match self {
            Signal::Traces => "/v1/traces",
            Signal::Metrics => "/v1/metrics",
            Signal::Logs => "/v1/logs",
        }
    }

    /// The OTLP/gRPC service.
    pub const fn grpc_service(self) -> &'static str {
        match self {
            Signal::Traces => "opentelemetry.proto.collector.trace.v1.TraceService",
            Signal::Metrics => "opentelemetry.proto.collector.metrics.v1.MetricsService",
            Signal::Logs => "opentelemetry.proto.collector.logs.v1.LogsService",
        }
    }

    /// The path of the OTLP/gRPC service's one method, `Export`.
    pub const fn grpc_method(self) -> &'static str {
        match self {
            Signal::Traces => "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
            Signal::Metrics => "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
            Signal::Logs => "/opentelemetry.proto.collector.logs.v1.LogsService/Export",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_signal_has_its_own_paths_on_both_transports() {
        for s in Signal::ALL {
            assert_eq!(s.http_path(), format!("/v1/{}", s.name()));
            assert_eq!(s.grpc_method(), format!("/{}/Export", s.grpc_service()));
        }
        let services: std::collections::HashSet<_> =
            Signal::ALL.iter().map(|s| s.grpc_service()).collect();
        assert_eq!(services.len(), Signal::ALL.len());
    }
}
