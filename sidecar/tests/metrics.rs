//! `/metrics`: Prometheus text (checked with `promtool check metrics` when installed) and
//! OpenMetrics with trace-id exemplars.
#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

mod support;

use std::io::Write;
use std::process::{Command, Stdio};

use slotlight_otel::attr::value;
use slotlight_otel::metric::{self, label};
use slotlight_sidecar::tools::synth::{self, Usage};
use support::*;

async fn populated() -> TestSidecar {
    let t = TestSidecar::start().await;
    // Two finished requests on two models (one resumed, one from an engine that does not say),
    // one still decoding, and another producer's spans.
    for (i, model) in [(1u64, "model-a"), (2, "model-b")] {
        let mut r = synth::Request::new(format!("m{i}"), i, now_ns() - S);
        let usage = Usage {
            legs: 0,
            resume: (i == 1).then(|| value::RESUME_FULL.into()),
            ..Usage::default()
        };
        t.send_grpc(synth::export(
            "engine-m",
            vec![r.root(model, now_ns(), &usage)],
        ))
        .await
        .expect("export");
        t.wait_turn(&format!("m{i}")).await;
    }
    let live = synth::whole_request("live", 9, now_ns() - S, Some(0), 2, 10);
    t.send_grpc(synth::export("engine-m", live[..4].to_vec()))
        .await
        .expect("export");
    t.wait_row("engine-m", "slot", Some(0), |r| r["state"] == "decoding")
        .await;
    let mut other = live[0].clone();
    other.name = "GET /weird \"quoted\" name".into();
    let req = opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest {
        resource_spans: vec![synth::resource_spans("shop", None, vec![other])],
    };
    t.send_grpc(req).await.expect("export");
    t
}

#[tokio::test]
async fn prometheus_text_has_every_family_and_passes_promtool() {
    let t = populated().await;
    let text = t.metrics().await;
    for name in [
        metric::TIME_TO_FIRST_TOKEN,
        metric::TIME_PER_OUTPUT_TOKEN,
        metric::REQUEST_DURATION,
        metric::QUEUE_TIME,
        metric::PREFILL_TIME,
        metric::DECODE_TIME,
        metric::PROMPT_TOKENS,
        metric::CACHED_TOKENS,
        metric::GENERATED_TOKENS,
        metric::REQUESTS,
        metric::TURNS_BY_RESUME,
        metric::MOVES,
        metric::RUNNING_REQUESTS,
        metric::SLOT_TOKENS_PER_SECOND,
        metric::SPAN_CALLS,
        metric::SPAN_DURATION,
        metric::SIDECAR_SPANS_RECEIVED,
        metric::SIDECAR_SPANS_REJECTED,
        metric::SIDECAR_SPANS_IGNORED,
        metric::SIDECAR_SPANS_DROPPED,
        metric::SIDECAR_REQUESTS_REJECTED,
        metric::SIDECAR_TRACES_EVICTED,
        metric::SIDECAR_TRACES_IN_FLIGHT,
        metric::SIDECAR_FORWARDED,
        metric::SIDECAR_FORWARD_DROPPED,
    ] {
        assert!(text.contains(&format!("# TYPE {name} ")), "{name} missing");
    }
    assert_eq!(
        sample(
            &text,
            &format!(
                "{}{{{}=\"engine-m\"}}",
                metric::RUNNING_REQUESTS,
                label::INSTANCE
            )
        ),
        Some(1.0)
    );
    let rate = sample(
        &text,
        &format!(
            "{}{{{}=\"engine-m\",{}=\"0\",{}=\"0\"}}",
            metric::SLOT_TOKENS_PER_SECOND,
            label::INSTANCE,
            label::SLOT_GROUP,
            label::SLOT
        ),
    )
    .expect("slot rate");
    assert!((rate - 50.0).abs() < 1e-6, "{rate}");
    let resumed = text
        .lines()
        .filter(|l| l.starts_with(metric::TURNS_BY_RESUME))
        .collect::<Vec<_>>();
    assert_eq!(
        resumed.len(),
        1,
        "only the turn with a resume outcome: {resumed:?}"
    );
    assert!(
        resumed[0].contains(&format!("{}=\"{}\"", label::RESUME, value::RESUME_FULL))
            && resumed[0].contains("\"model-a\"")
            && resumed[0].ends_with(" 1"),
        "{}",
        resumed[0]
    );
    assert!(!text.contains("m1\""), "no request ids in labels");
    assert!(!text.contains("# EOF"));

    let Ok(mut child) = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    else {
        println!(
            "SKIPPED promtool check: `promtool` is not installed (Debian package `prometheus`)"
        );
        return;
    };
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("promtool");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The one lint that cannot go: the spanmetrics connector's name, which Jaeger's SPM
    // queries, is in milliseconds (promtool prefers base units).
    let known = format!(
        "{} use base unit \"seconds\" instead of \"milliseconds\"",
        metric::SPAN_DURATION
    );
    let problems: Vec<&str> = report
        .lines()
        .filter(|l| !l.trim().is_empty() && l.trim() != known)
        .collect();
    assert!(
        problems.is_empty(),
        "promtool:\n{report}\n--- exposition ---\n{text}"
    );
    assert!(
        matches!(out.status.code(), Some(0) | Some(3)),
        "promtool exit {:?}: {report}",
        out.status.code()
    );
}

#[tokio::test]
async fn openmetrics_on_request_with_exemplars() {
    let t = populated().await;
    let resp = t
        .http
        .get(t.view_url("/metrics"))
        .header(
            "accept",
            "application/openmetrics-text;version=1.0.0,text/plain;q=0.5",
        )
        .send()
        .await
        .expect("scrape");
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text")
    );
    let text = resp.text().await.expect("text");
    assert!(text.ends_with("# EOF\n"));
    let counter_family = metric::PROMPT_TOKENS.strip_suffix("_total").unwrap();
    assert!(text.contains(&format!("# TYPE {counter_family} counter\n")));
    let turn = t.wait_turn("m1").await;
    let trace = turn["trace_id"].as_str().unwrap();
    let exemplar_line = text
        .lines()
        .find(|l| {
            l.starts_with(&format!("{}_bucket", metric::TIME_TO_FIRST_TOKEN)) && l.contains(trace)
        })
        .unwrap_or_else(|| panic!("no exemplar for {trace}:\n{text}"));
    assert!(
        exemplar_line.contains(&format!(" # {{trace_id=\"{trace}\"}} ")),
        "{exemplar_line}"
    );
    // Every line is a comment, or `name{labels} value [# {exemplar} value ts]`.
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        let main = l.split(" # ").next().unwrap();
        let value = main.rsplit(' ').next().unwrap();
        assert!(
            value.parse::<f64>().is_ok() || value == "+Inf",
            "bad sample line {l}"
        );
    }
}
