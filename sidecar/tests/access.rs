//! `--token` on the views and `--allow-otlp-from` on the receivers.
#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

mod support;

use slotlight_sidecar::tools::synth;
use support::*;

#[tokio::test]
async fn token_guards_views_and_metrics() {
    let t = TestSidecar::start_with(|c| c.token = Some("s3cret".into())).await;
    for path in ["/v1/slots", "/v1/turns", "/metrics", "/v1/slots/stream"] {
        let resp = t.http.get(t.view_url(path)).send().await.unwrap();
        assert_eq!(resp.status(), 401, "{path}");
        assert_eq!(resp.headers()["www-authenticate"], "Bearer");
        let resp = t
            .http
            .get(t.view_url(path))
            .bearer_auth("wrong")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 401, "{path}");
    }
    let (status, _) = t.get("/v1/slots").await; // sends the bearer token
    assert_eq!(status, 200);
    let resp = t
        .http
        .get(t.view_url("/v1/turns?token=s3cret&limit=1"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // The static page and the health check stay open; the page passes ?token= on.
    let resp = t.http.get(t.view_url("/")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.text().await.unwrap().contains("token="));
    // The receivers are not guarded by the view token.
    t.send_grpc(synth::export("e", vec![]))
        .await
        .expect("export");
}

#[tokio::test]
async fn allow_list_guards_the_receivers() {
    let t = TestSidecar::start_with(|c| {
        c.allow_otlp_from = vec!["10.0.0.0/8".parse().unwrap()];
    })
    .await;
    let err = t
        .send_grpc(synth::export("e", vec![]))
        .await
        .expect_err("refused");
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    let (status, _, _) = t
        .post(
            prost::Message::encode_to_vec(&synth::export("e", vec![])),
            "application/x-protobuf",
            None,
        )
        .await;
    assert_eq!(status, 403);

    let ok = TestSidecar::start_with(|c| {
        c.allow_otlp_from = vec!["127.0.0.0/8".parse().unwrap()];
    })
    .await;
    ok.send_grpc(synth::export("e", vec![]))
        .await
        .expect("allowed");
}
