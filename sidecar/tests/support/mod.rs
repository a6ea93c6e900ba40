//! Helpers for the sidecar's integration tests: an in-process sidecar on loopback port 0,
//! OTLP senders (gRPC, HTTP protobuf/JSON, gzip, chunked), and view readers.
#![allow(dead_code, missing_docs, clippy::unwrap_used)]

use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use prost::Message;
use serde_json::Value;
use slotlight_sidecar::{Config, Sidecar};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub const MS: i64 = 1_000_000;
pub const S: i64 = 1_000_000_000;

pub struct TestSidecar {
    pub sc: Sidecar,
    pub http: reqwest::Client,
    pub token: Option<String>,
}

impl TestSidecar {
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    pub async fn start_with(f: impl FnOnce(&mut Config)) -> Self {
        let mut cfg = Config::ephemeral();
        cfg.publish_interval_ms = 10;
        f(&mut cfg);
        let token = cfg.token.clone();
        let sc = slotlight_sidecar::start(cfg).await.expect("sidecar starts");
        TestSidecar {
            sc,
            http: reqwest::Client::new(),
            token,
        }
    }

    pub fn view_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.sc.listen)
    }

    pub fn traces_url(&self) -> String {
        format!("http://{}/v1/traces", self.sc.otlp_http)
    }

    pub async fn grpc(&self) -> TraceServiceClient<tonic::transport::Channel> {
        TraceServiceClient::connect(format!("http://{}", self.sc.otlp_grpc))
            .await
            .expect("gRPC connects")
    }

    pub async fn send_grpc(
        &self,
        req: ExportTraceServiceRequest,
    ) -> Result<ExportTraceServiceResponse, tonic::Status> {
        self.grpc().await.export(req).await.map(|r| r.into_inner())
    }

    /// POST /v1/traces with a content type and optional content encoding.
    pub async fn post(
        &self,
        body: Vec<u8>,
        content_type: &str,
        encoding: Option<&str>,
    ) -> (u16, reqwest::header::HeaderMap, Bytes) {
        let mut rb = self
            .http
            .post(self.traces_url())
            .header("content-type", content_type)
            .body(body);
        if let Some(e) = encoding {
            rb = rb.header("content-encoding", e);
        }
        let resp = rb.send().await.expect("POST /v1/traces");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        (status, headers, resp.bytes().await.expect("body"))
    }

    pub async fn post_proto(&self, req: &ExportTraceServiceRequest) -> ExportTraceServiceResponse {
        let (status, _, body) = self
            .post(req.encode_to_vec(), "application/x-protobuf", None)
            .await;
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        ExportTraceServiceResponse::decode(body).expect("protobuf answer")
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        let mut rb = self.http.get(self.view_url(path));
        if let Some(t) = &self.token {
            rb = rb.bearer_auth(t);
        }
        let resp = rb.send().await.expect("GET");
        let status = resp.status().as_u16();
        (status, resp.text().await.expect("text"))
    }

    pub async fn get_json(&self, path: &str) -> Value {
        let (status, text) = self.get(path).await;
        assert_eq!(status, 200, "{path}: {text}");
        serde_json::from_str(&text).expect("JSON")
    }

    /// Polls a JSON view until `pred` holds (gives up after 10 s; correctness, not speed).
    pub async fn wait_for(&self, path: &str, pred: impl Fn(&Value) -> bool) -> Value {
        for _ in 0..1000 {
            let v = self.get_json(path).await;
            if pred(&v) {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{path} never matched; last: {}", self.get_json(path).await);
    }

    /// The slot row of `instance` on `path` (`solo`/`slot`) with `index`.
    pub async fn wait_row(
        &self,
        instance: &str,
        path: &str,
        index: Option<i64>,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        let v = self
            .wait_for("/v1/slots", |v| {
                find_row(v, instance, path, index).is_some_and(&pred)
            })
            .await;
        find_row(&v, instance, path, index).cloned().unwrap()
    }

    /// Waits for the turn of `request_id`.
    pub async fn wait_turn(&self, request_id: &str) -> Value {
        let v = self
            .wait_for(&format!("/v1/turns?request_id={request_id}"), |v| {
                v["count"].as_u64() == Some(1)
            })
            .await;
        v["turns"][0].clone()
    }

    pub async fn metrics(&self) -> String {
        let (status, text) = self.get("/metrics").await;
        assert_eq!(status, 200);
        text
    }
}

pub fn find_row<'a>(
    v: &'a Value,
    instance: &str,
    path: &str,
    index: Option<i64>,
) -> Option<&'a Value> {
    v["instances"]
        .as_array()?
        .iter()
        .find(|i| i["instance"] == instance)?["slots"]
        .as_array()?
        .iter()
        .find(|r| r["path"] == path && r["index"].as_i64() == index)
}

/// The value of one sample line (`name{labels} value`) in a metrics text.
pub fn sample(text: &str, name_and_labels: &str) -> Option<f64> {
    text.lines()
        .find(|l| {
            l.strip_prefix(name_and_labels)
                .is_some_and(|rest| rest.starts_with(' '))
        })
        .and_then(|l| l[name_and_labels.len()..].split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// Sends a raw HTTP/1.1 request (for chunked bodies) and returns (status, body).
pub async fn raw_http(addr: SocketAddr, head: &str, chunks: &[&[u8]]) -> (u16, Vec<u8>) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    for c in chunks {
        s.write_all(format!("{:x}\r\n", c.len()).as_bytes())
            .await
            .unwrap();
        s.write_all(c).await.unwrap();
        s.write_all(b"\r\n").await.unwrap();
    }
    s.write_all(b"0\r\n\r\n").await.unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    let text = String::from_utf8_lossy(&out);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|p| out[p + 4..].to_vec())
        .unwrap_or_default();
    (status, body)
}

/// Reads server-sent events from a stream until `n` events named `event` have arrived.
pub async fn read_sse(resp: &mut reqwest::Response, event: &str, n: usize) -> Vec<Value> {
    let mut buf = String::new();
    let mut out = Vec::new();
    while out.len() < n {
        let chunk = tokio::time::timeout(Duration::from_secs(10), resp.chunk())
            .await
            .expect("SSE event within 10 s")
            .expect("SSE chunk")
            .expect("SSE stream open");
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let ev: String = buf.drain(..end + 2).collect();
            let name = ev
                .lines()
                .find_map(|l| l.strip_prefix("event:"))
                .map(str::trim);
            let data: String = ev
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(str::trim_start)
                .collect();
            if name == Some(event) {
                out.push(serde_json::from_str(&data).expect("SSE data is JSON"));
            }
        }
    }
    out
}

pub fn now_ns() -> i64 {
    slotlight_sidecar::unix_now_ns()
}
