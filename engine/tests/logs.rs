//! The per-turn records as OTLP log records: the real logs pipeline ([`otlp_logs`] over
//! OTLP/HTTP, installed by [`init_logs`]) sends them to a receiver in this test, which decodes
//! them with `opentelemetry-proto` as a collector would. Each finished request has exactly one
//! `Request.Finished` record, with its request span's trace and span ids, its severity and its
//! fields as attributes; a refused request has one `Request.Refused` record under its span.
//! One test per binary: the log subscriber is process-wide.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use opentelemetry::trace::Status;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::logs::v1::LogRecord;
use prost::Message as _;
use serde_json::json;
use slotlight_engine::telemetry::{LogFormat, OtlpProtocol, init_logs, otlp_logs};
use slotlight_otel::{attr, span};
use support::server::{Options, TestServer, tiny_model};

/// A minimal OTLP/HTTP logs receiver on loopback: every record it was sent.
async fn receiver() -> (String, Arc<Mutex<Vec<LogRecord>>>) {
    let got: Arc<Mutex<Vec<LogRecord>>> = Arc::default();
    let sink = Arc::clone(&got);
    let app = axum::Router::new().route(
        "/v1/logs",
        axum::routing::post(move |body: Bytes| {
            let sink = Arc::clone(&sink);
            async move {
                let req = ExportLogsServiceRequest::decode(body).expect("OTLP logs protobuf");
                let mut all = sink.lock().expect("lock");
                for rl in req.resource_logs {
                    for sl in rl.scope_logs {
                        all.extend(sl.log_records);
                    }
                }
                axum::http::StatusCode::OK
            }
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    (format!("http://{addr}"), got)
}

fn attr_str(r: &LogRecord, key: &str) -> Option<String> {
    r.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
        .map(|v| match v {
            Any::StringValue(s) => s.clone(),
            Any::IntValue(i) => i.to_string(),
            Any::DoubleValue(d) => d.to_string(),
            Any::BoolValue(b) => b.to_string(),
            other => format!("{other:?}"),
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_turn_leaves_one_otlp_log_record_under_its_span() {
    let (url, got) = receiver().await;
    let provider =
        otlp_logs(OtlpProtocol::HttpProtobuf, Some(&url), "test-instance").expect("logs pipeline");
    init_logs(LogFormat::Json, None, Some(&provider));

    let m = tiny_model();
    let s = TestServer::start(&m, Options::default()).await;
    for i in 0..3 {
        let (code, v) = s
            .chat(json!({"messages": [{"role": "user", "content": format!("hello {i}")}], "max_tokens": 4}))
            .await;
        assert_eq!(code, 200, "{v}");
    }
    let (code, _) = s
        .chat(json!({"messages": [{"role": "user", "content": "hi"}], "temperature": 7}))
        .await;
    assert_eq!(code, 400, "a refused request");
    let _ = tokio::task::spawn_blocking({
        let p = provider.clone();
        move || p.force_flush()
    })
    .await;

    let spans = s.spans.spans();
    let roots: Vec<_> = spans
        .iter()
        .filter(|x| span::is_request_span_name(&x.name))
        .collect();
    assert_eq!(roots.len(), 4, "three chats and a refusal");
    let mut records = Vec::new();
    for _ in 0..500 {
        records = got.lock().expect("lock").clone();
        if records.len() >= 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for root in &roots {
        let trace_id = root.span_context.trace_id().to_bytes().to_vec();
        let span_id = root.span_context.span_id().to_bytes().to_vec();
        let mine: Vec<&LogRecord> = records.iter().filter(|r| r.trace_id == trace_id).collect();
        let refused = matches!(root.status, Status::Error { .. });
        let want = if refused {
            "Request.Refused"
        } else {
            "Request.Finished"
        };
        assert_eq!(mine.len(), 1, "one record per request: {mine:?}");
        let r = mine[0];
        assert_eq!(r.event_name, want);
        assert_eq!(r.span_id, span_id, "the request span's id");
        assert_eq!(r.severity_text, "INFO");
        assert_eq!(r.severity_number, 9, "SEVERITY_NUMBER_INFO");
        let id = root
            .attributes
            .iter()
            .find(|kv| kv.key.as_str() == attr::REQUEST_ID)
            .map(|kv| kv.value.as_str().into_owned());
        assert_eq!(
            attr_str(r, "request_id"),
            id,
            "the line's fields as attributes"
        );
        if refused {
            assert_eq!(attr_str(r, "status").as_deref(), Some("refused"));
            assert!(attr_str(r, "error_type").is_some());
        } else {
            assert_eq!(attr_str(r, "status").as_deref(), Some("ok"));
            assert_eq!(attr_str(r, "completion_tokens").as_deref(), Some("4"));
        }
    }
    assert_eq!(records.len(), 4, "nothing else is a record: {records:?}");
    s.stop().await;
}
