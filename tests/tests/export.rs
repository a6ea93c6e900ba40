//! The engine exports to the sidecar's real OTLP receivers over both gRPC and HTTP/protobuf,
//! and the sidecar's turn record equals the usage the client received.

use std::time::Duration;

use serde_json::{Value, json};
use slotlight_e2e::{Proc, binary, fields};

fn run(protocol: &str) {
    let model = slotlight_engine::model::testing::TinyLlama::default().write_temp();
    let (sidecar, line) = Proc::start(
        &binary("slotlight-sidecar"),
        &[
            "--otlp-grpc",
            "127.0.0.1:0",
            "--otlp-http",
            "127.0.0.1:0",
            "--listen",
            "127.0.0.1:0",
            // Turns in memory: the test leaves no store behind (and the two tests, run in
            // parallel, share none).
            "--turns-db",
            ":memory:",
        ]
        .map(String::from),
        "listening otlp_grpc=",
    )
    .expect("sidecar");
    let f = fields(&line);
    let endpoint = match protocol {
        "grpc" => format!("http://{}", f["otlp_grpc"]),
        _ => format!("http://{}", f["otlp_http"]),
    };
    let views = format!("http://{}", f["views"]);
    let args = [
        "serve",
        "--port",
        "0",
        "--model",
        model.to_str().expect("path"),
        "--otlp-endpoint",
        &endpoint,
        "--otlp-protocol",
        protocol,
        "--responses-db",
        ":memory:",
    ]
    .map(String::from);
    let (engine, line) =
        Proc::start(&binary("slotlight-engine"), &args, "listening on http://").expect("engine");
    let base = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .expect("address")
        .to_string();
    let client = reqwest::blocking::Client::new();
    let reply: Value = client
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 12, "ignore_eos": true, "user": protocol}))
        .send()
        .expect("chat")
        .json()
        .expect("json");
    let id = reply["id"].as_str().expect("id");
    let mut turn = Value::Null;
    for _ in 0..600 {
        let v: Value = client
            .get(format!("{views}/v1/turns?request_id={id}"))
            .send()
            .and_then(|r| r.json())
            .unwrap_or(Value::Null);
        if v["count"] == 1 {
            turn = v["turns"][0].clone();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        turn.is_object(),
        "the sidecar recorded the request ({protocol}): {:?}",
        sidecar.drain()
    );
    let u = &reply["usage"];
    for k in [
        "queue_ms",
        "prefill_ms",
        "ttft_ms",
        "decode_ms",
        "generation_ms",
        "e2e_ms",
        "decode_tps",
        "prompt_tokens",
        "completion_tokens",
    ] {
        assert_eq!(turn[k], u[k], "{protocol}: {k}");
    }
    assert_eq!(turn["session_id"], protocol);
    drop(engine);
    drop(sidecar);
}

#[test]
fn engine_exports_to_the_sidecar_over_grpc() {
    run("grpc");
}

#[test]
fn engine_exports_to_the_sidecar_over_http_protobuf() {
    run("http/protobuf");
}
