//! Unit tests of the sidecar's metrics and their exposition.

use super::requests::MAX_OUTCOMES;
use super::*;
use crate::records::spans::{Body, EngineSpan, RequestSpan};
use crate::records::turn::TurnRecord;
use crate::records::usage::UsageTiming;
use slotlight_otel::metric::{self, label};
use std::sync::Arc;

/// The GenAI labels of [`turn`]'s series, as rendered before `le`.
const GENAI: &str = "gen_ai_operation_name=\"chat\",gen_ai_provider_name=\"slotlight\",gen_ai_request_model=\"m\",gen_ai_response_model=\"m\"";

fn turn() -> TurnRecord {
    turn_with(RequestSpan::default())
}

fn turn_with(over: RequestSpan) -> TurnRecord {
    let req = RequestSpan {
        operation: Some("chat".into()),
        provider: Some("slotlight".into()),
        request_model: Some("m".into()),
        response_model: Some("m".into()),
        ..over
    };
    let req = RequestSpan {
        name: "chat m".into(),
        usage: UsageTiming {
            ttft_ms: Some(30.0),
            e2e_ms: Some(1500.0),
            generation_ms: Some(1000.0),
            completion_tokens: Some(11),
            prompt_tokens: Some(5),
            ..req.usage
        },
        finish_reasons: vec!["stop".into()],
        ..req
    };
    let root = EngineSpan {
        instance: Arc::from("i"),
        service_version: None,
        trace_id: [0xab; 16],
        start_ns: 0,
        end_ns: 1_700_000_000_000_000_000,
        error: false,
        request_id: "r".into(),
        session_id: None,
        body: Body::Request(Box::new(req.clone())),
    };
    TurnRecord::build(&root, &req, vec![])
}

#[test]
fn histogram_buckets_are_cumulative() {
    let m = Metrics::new(10);
    m.observe_turn(&turn());
    let text = m.render(&SlotsSnapshot::default(), false);
    let ttft = metric::TIME_TO_FIRST_TOKEN;
    assert!(
        text.contains(&format!("{ttft}_bucket{{{GENAI},le=\"0.02\"}} 0\n")),
        "{text}"
    );
    assert!(text.contains(&format!("{ttft}_bucket{{{GENAI},le=\"0.04\"}} 1\n")));
    assert!(text.contains(&format!("{ttft}_bucket{{{GENAI},le=\"+Inf\"}} 1\n")));
    assert!(text.contains(&format!(
        "{}_bucket{{{GENAI},le=\"0.1\"}} 1\n",
        metric::TIME_PER_OUTPUT_TOKEN
    )));
    assert!(text.contains(&format!(
        "{}{{{GENAI},status=\"ok\",finish_reason=\"stop\"}} 1\n",
        metric::REQUESTS
    )));
    assert!(!text.contains("# EOF"));
    assert!(
        !text.contains("trace_id"),
        "no exemplars in the Prometheus format"
    );
}

#[test]
fn openmetrics_has_exemplars_and_eof() {
    let m = Metrics::new(10);
    m.observe_turn(&turn());
    let text = m.render(&SlotsSnapshot::default(), true);
    assert!(text.ends_with("# EOF\n"));
    let family = metric::PROMPT_TOKENS
        .strip_suffix("_total")
        .expect("counter");
    assert!(text.contains(&format!("# TYPE {family} counter\n")));
    // The bucket's count, then its exemplar: the trace, the value, the turn's end (seconds).
    let hex = "ab".repeat(16);
    let bucket = text
        .lines()
        .find(|l| {
            l.starts_with(&format!("{}_bucket{{", metric::TIME_TO_FIRST_TOKEN))
                && l.contains("le=\"0.04\"")
        })
        .unwrap_or_else(|| panic!("no 0.04 bucket: {text}"));
    assert!(
        bucket.ends_with(&format!(" 1 # {{trace_id=\"{hex}\"}} 0.03 1700000000.0")),
        "{bucket}"
    );
}

/// A count of the observations in `name`'s histogram series carrying `labels`.
fn count_of(text: &str, name: &str, labels: &str) -> Option<u64> {
    let prefix = format!("{name}_count{{{labels}}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.parse().ok())
}

/// Regression: a request that never got admitted or never produced a token used to report
/// 0.0 for what it never had, and those zeros pulled the TTFT and queue histograms down.
#[test]
fn unknown_times_and_failures_are_never_observed_as_values() {
    let m = Metrics::new(10);
    m.observe_turn(&turn());
    // Refused: no queue, no token, no prefill; a span 2 ms long.
    let mut refused = turn_with(RequestSpan {
        status: Some("refused".into()),
        error_type: Some("overloaded".into()),
        ..Default::default()
    });
    refused.usage.ttft_ms = None;
    refused.usage.e2e_ms = None;
    refused.usage.generation_ms = None;
    refused.end_time_unix_nano = refused.start_time_unix_nano + 2_000_000;
    m.observe_turn(&refused);
    // Cancelled after its first token: a TTFT, but not a successful response.
    let cancelled = turn_with(RequestSpan {
        status: Some("cancelled".into()),
        error_type: Some("cancelled".into()),
        usage: UsageTiming {
            queue_ms: Some(3.0),
            ..Default::default()
        },
        ..Default::default()
    });
    m.observe_turn(&cancelled);
    let text = m.render(&SlotsSnapshot::default(), false);
    let ttft = metric::TIME_TO_FIRST_TOKEN;
    assert_eq!(count_of(&text, ttft, GENAI), Some(1), "{text}");
    assert_eq!(
        count_of(&text, metric::TIME_PER_OUTPUT_TOKEN, GENAI),
        Some(1)
    );
    assert_eq!(
        count_of(&text, metric::QUEUE_TIME, GENAI),
        Some(1),
        "only the cancelled request had a queue time: {text}"
    );
    let dur = metric::REQUEST_DURATION;
    assert_eq!(count_of(&text, dur, GENAI), Some(1));
    assert_eq!(
        count_of(&text, dur, &format!("{GENAI},error_type=\"overloaded\"")),
        Some(1),
        "{text}"
    );
    assert!(text.contains(&format!(
        "{dur}_sum{{{GENAI},error_type=\"overloaded\"}} 0.002\n"
    )));
    for (status, error) in [("refused", "overloaded"), ("cancelled", "cancelled")] {
        assert!(
            text.contains(&format!(
                "{}{{{GENAI},status=\"{status}\",error_type=\"{error}\"}} 1\n",
                metric::REQUESTS
            )),
            "{status}: {text}"
        );
    }
}

/// The `slotlight_turns_by_resume_total` sample of [`turn`]'s series for `resume`.
fn resume_count(text: &str, resume: &str) -> Option<u64> {
    let prefix = format!(
        "{}{{{GENAI},{}=\"{resume}\"}} ",
        metric::TURNS_BY_RESUME,
        label::RESUME
    );
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.parse().ok())
}

#[test]
fn turns_are_counted_by_resume_outcome_and_unadmitted_ones_not_at_all() {
    use slotlight_otel::attr::value;
    let m = Metrics::new(10);
    let with = |resume: &str| {
        turn_with(RequestSpan {
            usage: UsageTiming {
                resume: Some(resume.into()),
                ..Default::default()
            },
            ..Default::default()
        })
    };
    for r in [
        value::RESUME_FULL,
        value::RESUME_FULL,
        value::RESUME_DIVERGED,
        value::RESUME_FIRST,
    ] {
        m.observe_turn(&with(r));
    }
    // Refused before admission: no resume attribute.
    m.observe_turn(&turn_with(RequestSpan {
        status: Some("refused".into()),
        error_type: Some("overloaded".into()),
        ..Default::default()
    }));
    m.observe_turn(&turn());
    let text = m.render(&SlotsSnapshot::default(), false);
    assert!(
        text.contains(&format!("# TYPE {} counter\n", metric::TURNS_BY_RESUME)),
        "{text}"
    );
    assert_eq!(resume_count(&text, value::RESUME_FULL), Some(2), "{text}");
    assert_eq!(resume_count(&text, value::RESUME_DIVERGED), Some(1));
    assert_eq!(resume_count(&text, value::RESUME_FIRST), Some(1));
    assert_eq!(resume_count(&text, value::RESUME_EVICTED), None);
    let total: u64 = text
        .lines()
        .filter(|l| l.starts_with(metric::TURNS_BY_RESUME))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert_eq!(total, 4, "the two turns without a resume are not counted");
}

#[test]
fn resume_labels_are_capped() {
    let m = Metrics::new(10);
    for i in 0..MAX_OUTCOMES + 5 {
        m.observe_turn(&turn_with(RequestSpan {
            usage: UsageTiming {
                resume: Some(format!("made_up_{i}")),
                ..Default::default()
            },
            ..Default::default()
        }));
    }
    let text = m.render(&SlotsSnapshot::default(), false);
    let series = text
        .lines()
        .filter(|l| l.starts_with(metric::TURNS_BY_RESUME))
        .count();
    assert_eq!(series, MAX_OUTCOMES + 1, "{text}");
    assert_eq!(resume_count(&text, OVERFLOW), Some(5));
}

#[test]
fn draft_tokens_are_counted_over_turns_by_genai_labels() {
    let m = Metrics::new(10);
    for (drafted, accepted) in [(40, 30), (20, 5)] {
        m.observe_turn(&turn_with(RequestSpan {
            usage: UsageTiming {
                drafted_tokens: Some(drafted),
                accepted_tokens: Some(accepted),
                ..Default::default()
            },
            ..Default::default()
        }));
    }
    // A turn from an engine that does not say adds nothing.
    m.observe_turn(&turn());
    let text = m.render(&SlotsSnapshot::default(), false);
    for (name, want) in [(metric::DRAFTED_TOKENS, 60), (metric::ACCEPTED_TOKENS, 35)] {
        assert!(
            text.contains(&format!("# TYPE {name} counter\n")),
            "{name}: {text}"
        );
        assert!(
            text.contains(&format!("{name}{{{GENAI}}} {want}\n")),
            "{name}: {text}"
        );
    }
}

#[test]
fn late_spans_are_exported() {
    let m = Metrics::new(10);
    m.count_late(3);
    let text = m.render(&SlotsSnapshot::default(), false);
    assert!(
        text.contains(&format!("{} 3\n", metric::SIDECAR_SPANS_LATE)),
        "{text}"
    );
}

#[test]
fn span_series_are_capped() {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
    let m = Metrics::new(2);
    let spans = (0..5)
        .map(|i| Span {
            name: format!("s{i}"),
            trace_id: vec![1; 16],
            start_time_unix_nano: 0,
            end_time_unix_nano: 3_000_000,
            ..Default::default()
        })
        .collect();
    let req = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            scope_spans: vec![ScopeSpans {
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let buf = prost::Message::encode_to_vec(&req);
    let mut batch = crate::metrics::spanmetrics::SpanBatch::default();
    crate::receiver::decode::convert(&buf, &mut batch).expect("decodes");
    m.merge_spans(batch);
    let text = m.render(&SlotsSnapshot::default(), false);
    let calls: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with(metric::SPAN_CALLS))
        .collect();
    assert_eq!(calls.len(), 3, "{calls:?}");
    assert!(text.contains(&format!("{}=\"{OVERFLOW}\"", label::SPAN_NAME)));
    assert!(text.contains(&format!("{}=\"unknown_service\"", label::SERVICE_NAME)));
}

#[test]
fn label_values_are_escaped() {
    let m = Metrics::new(10);
    let mut t = turn();
    t.response_model = Some("x\"y\\z\n".into());
    m.observe_turn(&t);
    let text = m.render(&SlotsSnapshot::default(), false);
    assert!(
        text.contains("gen_ai_response_model=\"x\\\"y\\\\z\\n\""),
        "{text}"
    );
}

#[test]
fn negotiation() {
    assert!(negotiate(Some("application/openmetrics-text;version=1.0.0")).0);
    assert!(!negotiate(Some("text/plain")).0);
    assert!(!negotiate(None).0);
}
