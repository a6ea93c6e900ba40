//! `--forward-otlp`: engine → sidecar → upstream over OTLP/HTTP and OTLP/gRPC (the upstream
//! here is a second sidecar), and a dead upstream never blocks ingest.
#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

mod support;

use slotlight_otel::metric;
use slotlight_sidecar::tools::synth;
use support::*;

async fn forwards_to(scheme_url: impl FnOnce(&TestSidecar) -> String) {
    let upstream = TestSidecar::start().await;
    let url = scheme_url(&upstream);
    let t = TestSidecar::start_with(|c| c.forward_otlp = Some(url)).await;
    let spans = synth::whole_request("fwd", 1, now_ns() - S, Some(0), 2, 5);
    // Over gRPC and over HTTP JSON into the first sidecar; both arrive upstream.
    t.send_grpc(synth::export("engine-f", spans[..3].to_vec()))
        .await
        .expect("export");
    let json = serde_json::to_vec(&synth::export("engine-f", spans[3..].to_vec())).unwrap();
    let (status, _, _) = t.post(json, "application/json", None).await;
    assert_eq!(status, 200);
    let here = t.wait_turn("fwd").await;
    let there = upstream.wait_turn("fwd").await;
    assert_eq!(here, there, "the upstream assembled the same record");
    let m = wait_metric(&t, metric::SIDECAR_FORWARDED, 2.0).await;
    assert_eq!(sample(&m, metric::SIDECAR_FORWARD_DROPPED), Some(0.0));
}

/// Polls `/metrics` until `name` reaches `value` (bounded; correctness, not speed).
async fn wait_metric(t: &TestSidecar, name: &str, value: f64) -> String {
    for _ in 0..1000 {
        let m = t.metrics().await;
        if sample(&m, name) == Some(value) {
            return m;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("{name} never reached {value}:\n{}", t.metrics().await);
}

/// POSTs `body` as `content_type` to `url` through the test's client: the status code.
async fn post_status(t: &TestSidecar, url: &str, content_type: &str, body: Vec<u8>) -> u16 {
    t.http
        .post(url)
        .header("content-type", content_type)
        .body(body)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
async fn forwards_over_http() {
    forwards_to(|u| format!("http://{}", u.sc.otlp_http)).await;
}

#[tokio::test]
async fn forwards_over_grpc() {
    forwards_to(|u| format!("grpc://{}", u.sc.otlp_grpc)).await;
}

#[tokio::test]
async fn dead_upstream_never_blocks_ingest() {
    // A port that was just free: nothing listens there.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let t = TestSidecar::start_with(|c| {
        c.forward_otlp = Some(format!("http://{dead}"));
        c.forward_queue = 2;
    })
    .await;
    for i in 0..50u64 {
        let spans = synth::whole_request(&format!("d{i}"), i, now_ns() - S, Some(0), 1, 5);
        t.send_grpc(synth::export("engine-d", spans))
            .await
            .expect("export");
    }
    // Every request was accepted and assembled while the upstream was dead...
    t.wait_for("/v1/turns", |v| v["count"] == 50).await;
    // ...and every forward was dropped (queue full or connection refused) and counted.
    let text = wait_metric(&t, metric::SIDECAR_FORWARD_DROPPED, 50.0).await;
    assert_eq!(sample(&text, metric::SIDECAR_FORWARDED), Some(0.0));
}

#[tokio::test]
async fn tls_upstream_is_refused_at_start() {
    let mut cfg = slotlight_sidecar::Config::ephemeral();
    cfg.forward_otlp = Some("https://collector.example:4318".into());
    let err = slotlight_sidecar::start(cfg).await.expect_err("refused");
    assert!(err.to_string().contains("TLS"), "{err}");
}

/// Three data points: a gauge of two and a sum of one.
fn metrics_export()
-> opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest {
    use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
    use opentelemetry_proto::tonic::metrics::v1::{
        Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum, metric::Data,
    };
    let point = || NumberDataPoint {
        time_unix_nano: u64::try_from(now_ns()).unwrap(),
        ..Default::default()
    };
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            scope_metrics: vec![ScopeMetrics {
                metrics: vec![
                    Metric {
                        name: "g".into(),
                        data: Some(Data::Gauge(Gauge {
                            data_points: vec![point(), point()],
                        })),
                        ..Default::default()
                    },
                    Metric {
                        name: "s".into(),
                        data: Some(Data::Sum(Sum {
                            data_points: vec![point()],
                            is_monotonic: true,
                            aggregation_temporality: 2,
                        })),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

/// OTLP metrics: accepted over HTTP (protobuf and JSON) and gRPC, their data points counted,
/// and forwarded to the upstream's metrics endpoint (which counts them too); a payload that
/// does not decode is refused like a span payload.
async fn metrics_are_accepted_counted_and_forwarded(
    scheme_url: impl FnOnce(&TestSidecar) -> String,
) {
    use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_client::MetricsServiceClient;
    let upstream = TestSidecar::start().await;
    let url = scheme_url(&upstream);
    let t = TestSidecar::start_with(|c| c.forward_otlp = Some(url)).await;
    let req = metrics_export();
    let metrics_url = format!("http://{}/v1/metrics", t.sc.otlp_http);
    assert_eq!(
        post_status(
            &t,
            &metrics_url,
            "application/x-protobuf",
            prost::Message::encode_to_vec(&req)
        )
        .await,
        200
    );
    assert_eq!(
        post_status(
            &t,
            &metrics_url,
            "application/json",
            serde_json::to_vec(&req).unwrap()
        )
        .await,
        200
    );
    let mut grpc = MetricsServiceClient::connect(format!("http://{}", t.sc.otlp_grpc))
        .await
        .unwrap();
    let answer = grpc
        .export(req)
        .await
        .expect("gRPC metrics export")
        .into_inner();
    assert_eq!(answer.partial_success, None);
    assert_eq!(
        post_status(
            &t,
            &metrics_url,
            "application/x-protobuf",
            vec![0xff, 0xff, 0xff]
        )
        .await,
        400,
        "not a metrics export"
    );
    let m = wait_metric(&t, metric::SIDECAR_METRIC_POINTS_RECEIVED, 9.0).await;
    assert_eq!(sample(&m, metric::SIDECAR_SPANS_RECEIVED), Some(0.0));
    wait_metric(&t, metric::SIDECAR_FORWARDED, 3.0).await;
    wait_metric(&upstream, metric::SIDECAR_METRIC_POINTS_RECEIVED, 9.0).await;
}

#[tokio::test]
async fn metrics_are_accepted_and_forwarded_over_http() {
    metrics_are_accepted_counted_and_forwarded(|u| format!("http://{}", u.sc.otlp_http)).await;
}

#[tokio::test]
async fn metrics_are_accepted_and_forwarded_over_grpc() {
    metrics_are_accepted_counted_and_forwarded(|u| format!("grpc://{}", u.sc.otlp_grpc)).await;
}

/// Two log records of one resource, one scope (the engine's per-turn records' shape).
fn logs_export() -> opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest {
    use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
    use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
    let record = |id: &str| LogRecord {
        event_name: "Request.Finished".into(),
        severity_number: 9,
        severity_text: "INFO".into(),
        trace_id: vec![7; 16],
        span_id: vec![8; 8],
        attributes: vec![KeyValue {
            key: "request_id".into(),
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValue(id.into())),
            }),
            ..Default::default()
        }],
        ..Default::default()
    };
    ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            scope_logs: vec![ScopeLogs {
                log_records: vec![record("a"), record("b")],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

/// OTLP logs: accepted over HTTP (protobuf and JSON) and the gRPC `LogsService`, their records
/// counted (`slotlight_sidecar_log_records_received_total`), and forwarded to the upstream's
/// logs endpoint (which counts them too); a payload that does not decode is a 400.
async fn logs_are_accepted_counted_and_forwarded(scheme_url: impl FnOnce(&TestSidecar) -> String) {
    use opentelemetry_proto::tonic::collector::logs::v1::logs_service_client::LogsServiceClient;
    let upstream = TestSidecar::start().await;
    let url = scheme_url(&upstream);
    let t = TestSidecar::start_with(|c| c.forward_otlp = Some(url)).await;
    let req = logs_export();
    let logs_url = format!("http://{}/v1/logs", t.sc.otlp_http);
    for (ct, body) in [
        (
            "application/x-protobuf",
            prost::Message::encode_to_vec(&req),
        ),
        ("application/json", serde_json::to_vec(&req).unwrap()),
    ] {
        assert_eq!(post_status(&t, &logs_url, ct, body).await, 200, "{ct}");
    }
    let mut grpc = LogsServiceClient::connect(format!("http://{}", t.sc.otlp_grpc))
        .await
        .unwrap();
    let answer = grpc
        .export(req)
        .await
        .expect("gRPC logs export")
        .into_inner();
    assert_eq!(answer.partial_success, None);
    assert_eq!(
        post_status(
            &t,
            &logs_url,
            "application/x-protobuf",
            vec![0xff, 0xff, 0xff]
        )
        .await,
        400,
        "not a logs export"
    );
    let m = wait_metric(&t, metric::SIDECAR_LOG_RECORDS_RECEIVED, 6.0).await;
    assert_eq!(sample(&m, metric::SIDECAR_SPANS_RECEIVED), Some(0.0));
    assert_eq!(
        sample(&m, metric::SIDECAR_METRIC_POINTS_RECEIVED),
        Some(0.0)
    );
    wait_metric(&t, metric::SIDECAR_FORWARDED, 3.0).await;
    wait_metric(&upstream, metric::SIDECAR_LOG_RECORDS_RECEIVED, 6.0).await;
}

#[tokio::test]
async fn logs_are_accepted_and_forwarded_over_http() {
    logs_are_accepted_counted_and_forwarded(|u| format!("http://{}", u.sc.otlp_http)).await;
}

#[tokio::test]
async fn logs_are_accepted_and_forwarded_over_grpc() {
    logs_are_accepted_counted_and_forwarded(|u| format!("grpc://{}", u.sc.otlp_grpc)).await;
}
