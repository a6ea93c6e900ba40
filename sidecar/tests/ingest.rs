//! OTLP ingest: every transport and encoding, partial success, other producers, bad input.
#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

mod support;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use prost::Message;
use slotlight_otel::{attr, metric};
use slotlight_sidecar::tools::synth::{self, Request, resource_spans};
use support::*;

fn window(
    instance_slot: i64,
    request_id: &str,
    seed: u64,
    tokens: i64,
) -> opentelemetry_proto::tonic::trace::v1::Span {
    let t0 = now_ns() - S;
    let mut r = Request::new(request_id, seed, t0);
    r.first_token_ns = Some(t0 + 10 * MS);
    let leg = r.leg(0, Some(instance_slot), t0, 0);
    r.decode(&leg, t0 + 10 * MS, t0 + 500 * MS, tokens - 1, tokens)
}

#[tokio::test]
async fn every_transport_and_encoding_arrives() {
    let t = TestSidecar::start().await;
    let inst = "ingest-all";
    // 0: gRPC.
    t.send_grpc(synth::export(inst, vec![window(0, "g", 1, 10)]))
        .await
        .expect("gRPC export");
    // 1: gRPC with gzip.
    let mut c = t
        .grpc()
        .await
        .send_compressed(tonic::codec::CompressionEncoding::Gzip);
    c.export(synth::export(inst, vec![window(1, "gz", 2, 11)]))
        .await
        .expect("gzip gRPC export");
    // 2: HTTP protobuf.
    t.post_proto(&synth::export(inst, vec![window(2, "hp", 3, 12)]))
        .await;
    // 3: HTTP JSON.
    let json = serde_json::to_vec(&synth::export(inst, vec![window(3, "hj", 4, 13)])).unwrap();
    let (status, headers, body) = t.post(json, "application/json", None).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(headers["content-type"], "application/json");
    let _: serde_json::Value = serde_json::from_slice(&body).expect("JSON answer");
    // 4: HTTP protobuf, gzip.
    let gz = gzip(&synth::export(inst, vec![window(4, "hgz", 5, 14)]).encode_to_vec());
    let (status, _, _) = t.post(gz, "application/x-protobuf", Some("gzip")).await;
    assert_eq!(status, 200);
    // 5: HTTP protobuf, chunked transfer encoding, split in three chunks.
    let body = synth::export(inst, vec![window(5, "chunked", 6, 15)]).encode_to_vec();
    let (a, rest) = body.split_at(body.len() / 3);
    let (b, c2) = rest.split_at(rest.len() / 2);
    let head = "POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
    let (status, resp) = raw_http(t.sc.otlp_http, head, &[a, b, c2]).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&resp));
    ExportTraceServiceResponse::decode(&resp[..]).expect("protobuf answer");

    for (slot, tokens) in (0..6).zip(10..) {
        let row = t
            .wait_row(inst, "slot", Some(slot), |r| r["state"] == "decoding")
            .await;
        assert_eq!(row["tokens_generated"], tokens, "slot {slot}");
    }
}

#[tokio::test]
async fn unusable_engine_spans_get_partial_success() {
    let t = TestSidecar::start().await;
    let inst = "partial";
    let mut bad = window(0, "bad", 1, 5);
    bad.attributes
        .retain(|kv| kv.key != attr::DECODE_TOKENS_GENERATED);
    let mut no_id = window(1, "x", 2, 5);
    no_id.attributes.retain(|kv| kv.key != attr::REQUEST_ID);
    let good = window(2, "good", 3, 7);
    let req = synth::export(inst, vec![bad.clone(), no_id.clone(), good]);

    let resp = t.send_grpc(req.clone()).await.expect("gRPC export");
    let ps = resp.partial_success.expect("partial success");
    assert_eq!(ps.rejected_spans, 2);
    assert!(
        ps.error_message.contains(attr::DECODE_TOKENS_GENERATED),
        "{}",
        ps.error_message
    );

    let resp = t.post_proto(&req).await;
    assert_eq!(resp.partial_success.expect("partial").rejected_spans, 2);

    let row = t
        .wait_row(inst, "slot", Some(2), |r| r["state"] == "decoding")
        .await;
    assert_eq!(
        row["tokens_generated"], 7,
        "the usable span of the same request is kept"
    );

    // A resource without service.instance.id: every engine span rejected.
    let mut req = synth::export(inst, vec![window(3, "noinst", 4, 5)]);
    req.resource_spans[0]
        .resource
        .as_mut()
        .unwrap()
        .attributes
        .retain(|kv| kv.key != attr::SERVICE_INSTANCE_ID);
    let resp = t.send_grpc(req).await.expect("export");
    assert_eq!(resp.partial_success.expect("partial").rejected_spans, 1);

    let m = t.metrics().await;
    let rejected = |reason: &str| {
        sample(
            &m,
            &format!("{}{{reason=\"{reason}\"}}", metric::SIDECAR_SPANS_REJECTED),
        )
        .unwrap()
    };
    assert_eq!(rejected("missing_attribute"), 4.0);
    assert_eq!(rejected("missing_instance"), 1.0);
}

#[tokio::test]
async fn other_producers_are_accepted_counted_and_ignored() {
    let t = TestSidecar::start().await;
    let mut other = window(0, "shop-1", 1, 5);
    other.name = "GET /checkout".into();
    let same_name_other_service = window(1, "shop-2", 2, 5);
    let engine_unknown_span = {
        let mut s = window(2, "e", 3, 5);
        s.name = "slotlight.something_new".into();
        s
    };
    let req = opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest {
        resource_spans: vec![
            resource_spans("checkout", Some("c1"), vec![other, same_name_other_service]),
            resource_spans(
                attr::value::SERVICE_NAME_ENGINE,
                Some("e1"),
                vec![engine_unknown_span],
            ),
        ],
    };
    let resp = t.send_grpc(req).await.expect("export");
    assert!(resp.partial_success.is_none());
    let m = t.metrics().await;
    assert_eq!(sample(&m, metric::SIDECAR_SPANS_IGNORED), Some(3.0));
    assert_eq!(sample(&m, metric::SIDECAR_SPANS_RECEIVED), Some(3.0));
    assert!(
        m.contains(&format!(
            "{}{{service_name=\"checkout\",span_name=\"GET /checkout\"",
            metric::SPAN_CALLS
        )),
        "spanmetrics cover other producers:\n{m}"
    );
    let slots = t.get_json("/v1/slots").await;
    assert_eq!(slots["instances"].as_array().map(Vec::len), Some(0));
}

#[tokio::test]
async fn bad_input_gets_the_right_error_and_nothing_else_is_lost() {
    let t = TestSidecar::start_with(|c| c.max_body_bytes = 64 << 10).await;
    let inst = "bad-input";
    t.send_grpc(synth::export(inst, vec![window(0, "before", 1, 9)]))
        .await
        .expect("export");
    t.wait_row(inst, "slot", Some(0), |r| r["tokens_generated"] == 9)
        .await;

    // Garbage protobuf: 400 with a google.rpc.Status body.
    let (status, headers, body) = t
        .post(
            b"\xff\xff\xff\xff garbage".to_vec(),
            "application/x-protobuf",
            None,
        )
        .await;
    assert_eq!(status, 400);
    assert_eq!(headers["content-type"], "application/x-protobuf");
    let st = tonic_types::Status::decode(body).expect("Status body");
    assert!(st.message.contains("protobuf"), "{}", st.message);

    // Bad JSON: 400 with a JSON Status.
    let (status, headers, body) = t
        .post(b"{\"resourceSpans\": [".to_vec(), "application/json", None)
        .await;
    assert_eq!(status, 400);
    assert_eq!(headers["content-type"], "application/json");
    let v: serde_json::Value = serde_json::from_slice(&body).expect("JSON Status");
    assert!(v["message"].as_str().unwrap().contains("JSON"));

    // Wrong content type: 415.
    let (status, _, _) = t.post(b"hello".to_vec(), "text/plain", None).await;
    assert_eq!(status, 415);
    // Unknown content encoding: 415.
    let (status, _, _) = t
        .post(vec![1, 2, 3], "application/x-protobuf", Some("br"))
        .await;
    assert_eq!(status, 415);
    // Oversized (declared length): 413.
    let (status, _, _) = t
        .post(vec![0; 100 << 10], "application/x-protobuf", None)
        .await;
    assert_eq!(status, 413);
    // Oversized, chunked (no length): 413.
    let big = vec![0u8; 40 << 10];
    let head = "POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
    let (status, _) = raw_http(t.sc.otlp_http, head, &[&big, &big]).await;
    assert_eq!(status, 413);
    // A gzip bomb: small on the wire, 32 MiB inflated; cut off at the limit.
    let bomb = gzip(&vec![0u8; 32 << 20]);
    assert!(bomb.len() < 64 << 10);
    let (status, _, _) = t.post(bomb, "application/x-protobuf", Some("gzip")).await;
    assert_eq!(status, 413);
    // Not gzip at all.
    let (status, _, _) = t
        .post(b"plain".to_vec(), "application/x-protobuf", Some("gzip"))
        .await;
    assert_eq!(status, 400);
    // gRPC: garbage bytes, and a message over the limit.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", t.sc.otlp_grpc))
        .unwrap()
        .connect_lazy();
    let mut raw = slotlight_sidecar::receiver::raw::RawExporter::new(channel, false);
    let err = raw
        .export(bytes::Bytes::from_static(b"\xff\xff\xff\xff garbage"))
        .await
        .expect_err("garbage refused");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    let huge: Vec<_> = (0..2000)
        .map(|i| window(1, &format!("h{i}"), i, 5))
        .collect();
    let err = t
        .send_grpc(synth::export(inst, huge))
        .await
        .expect_err("over the limit");
    assert_eq!(
        err.code(),
        tonic::Code::ResourceExhausted,
        "final, not retryable"
    );
    // gRPC gzip bomb: small compressed, 32 MiB inflated.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", t.sc.otlp_grpc))
        .unwrap()
        .connect_lazy();
    let mut gz = slotlight_sidecar::receiver::raw::RawExporter::new(channel, true);
    let err = gz
        .export(bytes::Bytes::from(vec![0u8; 32 << 20]))
        .await
        .expect_err("bomb refused");
    assert_eq!(err.code(), tonic::Code::ResourceExhausted);

    // Still serving; what came before is intact and new data arrives.
    t.send_grpc(synth::export(inst, vec![window(2, "after", 2, 4)]))
        .await
        .expect("export after bad input");
    let v = t
        .wait_row(inst, "slot", Some(2), |r| r["tokens_generated"] == 4)
        .await;
    assert_eq!(v["request_id"], "after");
    let slots = t.get_json("/v1/slots").await;
    assert_eq!(
        find_row(&slots, inst, "slot", Some(0)).unwrap()["tokens_generated"],
        9
    );
    let m = t.metrics().await;
    let refused = |reason: &str| {
        sample(
            &m,
            &format!(
                "{}{{reason=\"{reason}\"}}",
                metric::SIDECAR_REQUESTS_REJECTED
            ),
        )
        .unwrap()
    };
    assert_eq!(refused("malformed"), 4.0);
    assert_eq!(refused("unsupported_media_type"), 2.0);
    assert_eq!(refused("too_large"), 5.0);
}
