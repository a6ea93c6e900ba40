//! The same instruments over OTLP (`OTEL_METRICS_EXPORTER=otlp`), through the OpenTelemetry
//! metrics SDK: the gauges and counters are observable instruments whose callbacks read the
//! groups' atomics and the HTTP layer's counts at each collection (nothing is counted twice),
//! and the histograms are recorded beside the engine's own as each value is observed.
//!
//! Names: the GenAI histograms under their convention names
//! ([`slotlight_otel::metric::otlp`]); the engine's own under their exposition names less
//! `_total` (a collector's Prometheus exporter adds it back to a monotonic sum). Units and
//! descriptions are the contract's. Attributes use the Prometheus label names (`slot_group`,
//! `path`, `finish_reason`), except the GenAI attributes and `error.type`, which use the
//! conventions' keys (a Prometheus exporter turns their dots into underscores), so a
//! collector's Prometheus exporter serves the same series as `GET /metrics`.

use std::sync::Arc;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Histogram, Meter};
use slotlight_otel::attr::{self, value};
use slotlight_otel::metric::{self, buckets, engine, label};

use super::exposition::TelemetrySnapshot;
use super::group::{GROUP_COUNTERS, GROUP_GAUGES, GroupMetrics, GroupSnapshot, OUTCOMES};
use super::instruments::{GroupInstruments, RequestInstruments};
use super::requests::RequestMetrics;

/// The contract entry of an exposition name.
fn entry(name: &str) -> Option<&'static slotlight_otel::Entry> {
    engine::ALL
        .iter()
        .chain(metric::ALL)
        .find(|e| e.name == name)
}

fn unit(name: &str) -> &'static str {
    entry(name).map_or("", |e| e.unit)
}

fn doc(name: &str) -> &'static str {
    entry(name).map_or("", |e| e.doc.trim())
}

/// The OTLP name of an engine metric: its exposition name less `_total`.
fn otlp_name(name: &'static str) -> &'static str {
    name.strip_suffix("_total").unwrap_or(name)
}

/// A histogram of `name` with the contract's unit and doc and the given bucket boundaries.
fn histogram(
    meter: &Meter,
    otlp: &'static str,
    name: &'static str,
    bounds: &[f64],
) -> Histogram<f64> {
    meter
        .f64_histogram(otlp)
        .with_unit(unit(name))
        .with_description(doc(name))
        .with_boundaries(bounds.to_vec())
        .build()
}

fn group_attrs(g: &GroupSnapshot) -> Vec<KeyValue> {
    vec![KeyValue::new(
        label::SLOT_GROUP,
        i64::try_from(g.group).unwrap_or(i64::MAX),
    )]
}

/// Registers every engine metric on `meter`: observable gauges and counters over `groups`,
/// `requests` and `telemetry` (read at each collection), and the histograms, which the groups
/// and `requests` record into from now on.
pub fn register(
    meter: &Meter,
    groups: &[Arc<GroupMetrics>],
    requests: &Arc<RequestMetrics>,
    telemetry: Arc<dyn Fn() -> TelemetrySnapshot + Send + Sync>,
) {
    for g in groups {
        g.export_to(GroupInstruments {
            step_duration: histogram(
                meter,
                engine::STEP_DURATION,
                engine::STEP_DURATION,
                buckets::STEP_DURATION,
            ),
            step_batch: histogram(
                meter,
                engine::STEP_BATCH_SIZE,
                engine::STEP_BATCH_SIZE,
                buckets::STEP_BATCH_SIZE,
            ),
            attrs: [KeyValue::new(
                label::SLOT_GROUP,
                i64::try_from(g.group()).unwrap_or(i64::MAX),
            )],
        });
    }
    requests.export_to(RequestInstruments {
        ttft: histogram(
            meter,
            metric::otlp::TIME_TO_FIRST_TOKEN,
            metric::TIME_TO_FIRST_TOKEN,
            buckets::TIME_TO_FIRST_TOKEN,
        ),
        tpot: histogram(
            meter,
            metric::otlp::TIME_PER_OUTPUT_TOKEN,
            metric::TIME_PER_OUTPUT_TOKEN,
            buckets::TIME_PER_OUTPUT_TOKEN,
        ),
        duration: histogram(
            meter,
            metric::otlp::REQUEST_DURATION,
            metric::REQUEST_DURATION,
            buckets::REQUEST_DURATION,
        ),
        queue: histogram(
            meter,
            engine::QUEUE_TIME,
            engine::QUEUE_TIME,
            buckets::REQUEST_DURATION,
        ),
    });
    register_groups(meter, groups);
    register_refusals(meter, requests);
    register_telemetry(meter, telemetry);
}

fn snapshots(groups: &[Arc<GroupMetrics>]) -> Vec<GroupSnapshot> {
    groups.iter().map(|g| g.snapshot()).collect()
}

fn register_groups(meter: &Meter, groups: &[Arc<GroupMetrics>]) {
    for (name, get) in GROUP_GAUGES {
        let groups = groups.to_vec();
        meter
            .u64_observable_gauge(otlp_name(name))
            .with_unit(unit(name))
            .with_description(doc(name))
            .with_callback(move |o| {
                for g in snapshots(&groups) {
                    o.observe(get(&g), &group_attrs(&g));
                }
            })
            .build();
    }
    for (name, get) in GROUP_COUNTERS {
        let groups = groups.to_vec();
        meter
            .u64_observable_counter(otlp_name(name))
            .with_unit(unit(name))
            .with_description(doc(name))
            .with_callback(move |o| {
                for g in snapshots(&groups) {
                    o.observe(get(&g), &group_attrs(&g));
                }
            })
            .build();
    }
    let gs = groups.to_vec();
    meter
        .u64_observable_gauge(otlp_name(engine::REQUESTS_RUNNING))
        .with_unit(unit(engine::REQUESTS_RUNNING))
        .with_description(doc(engine::REQUESTS_RUNNING))
        .with_callback(move |o| {
            for g in snapshots(&gs) {
                for (path, n) in [
                    (value::PATH_SOLO, g.running_solo),
                    (value::PATH_SLOT, g.running_slot),
                ] {
                    let mut a = group_attrs(&g);
                    a.push(KeyValue::new(label::PATH, path));
                    o.observe(n, &a);
                }
            }
        })
        .build();
    let gs = groups.to_vec();
    meter
        .f64_observable_gauge(otlp_name(engine::KV_CACHE_USAGE))
        .with_unit(unit(engine::KV_CACHE_USAGE))
        .with_description(doc(engine::KV_CACHE_USAGE))
        .with_callback(move |o| {
            for g in snapshots(&gs) {
                o.observe(g.kv_usage(), &group_attrs(&g));
            }
        })
        .build();
    let gs = groups.to_vec();
    meter
        .u64_observable_counter(otlp_name(engine::SESSION_KV_EVICTED_BLOCKS))
        .with_unit(unit(engine::SESSION_KV_EVICTED_BLOCKS))
        .with_description(doc(engine::SESSION_KV_EVICTED_BLOCKS))
        .with_callback(move |o| {
            for g in snapshots(&gs) {
                for (reason, n) in g.session_kv.by_reason() {
                    let mut a = group_attrs(&g);
                    a.push(KeyValue::new(label::REASON, reason));
                    o.observe(n, &a);
                }
            }
        })
        .build();
    let gs = groups.to_vec();
    meter
        .u64_observable_counter(otlp_name(engine::REQUESTS_FINISHED))
        .with_unit(unit(engine::REQUESTS_FINISHED))
        .with_description(doc(engine::REQUESTS_FINISHED))
        .with_callback(move |o| {
            for g in snapshots(&gs) {
                for ((finish, error), n) in OUTCOMES.iter().zip(g.finished) {
                    let mut a = group_attrs(&g);
                    a.push(KeyValue::new(label::FINISH_REASON, *finish));
                    if let Some(e) = error {
                        a.push(KeyValue::new(attr::ERROR_TYPE, *e));
                    }
                    o.observe(n, &a);
                }
            }
        })
        .build();
}

fn register_refusals(meter: &Meter, requests: &Arc<RequestMetrics>) {
    let r = Arc::clone(requests);
    meter
        .u64_observable_counter(otlp_name(engine::REQUESTS_REFUSED))
        .with_unit(unit(engine::REQUESTS_REFUSED))
        .with_description(doc(engine::REQUESTS_REFUSED))
        .with_callback(move |o| {
            for (error, n) in r.refusals() {
                o.observe(n, &[KeyValue::new(attr::ERROR_TYPE, error)]);
            }
        })
        .build();
}

fn register_telemetry(meter: &Meter, telemetry: Arc<dyn Fn() -> TelemetrySnapshot + Send + Sync>) {
    type T = fn(&TelemetrySnapshot) -> u64;
    let counters: [(&'static str, T); 3] = [
        (engine::SPANS_EXPORTED, |t| t.spans_exported),
        (engine::SPANS_DROPPED, |t| t.spans_dropped),
        (engine::SPAN_EXPORT_FAILURES, |t| t.export_failures),
    ];
    for (name, get) in counters {
        let t = Arc::clone(&telemetry);
        meter
            .u64_observable_counter(otlp_name(name))
            .with_unit(unit(name))
            .with_description(doc(name))
            .with_callback(move |o| o.observe(get(&t()), &[]))
            .build();
    }
    let t = Arc::clone(&telemetry);
    meter
        .u64_observable_gauge(otlp_name(engine::SPAN_QUEUE_SPANS))
        .with_unit(unit(engine::SPAN_QUEUE_SPANS))
        .with_description(doc(engine::SPAN_QUEUE_SPANS))
        .with_callback(move |o| o.observe(t().spans_queued, &[]))
        .build();
    meter
        .f64_observable_gauge(otlp_name(engine::TRACE_SAMPLING_RATIO))
        .with_unit(unit(engine::TRACE_SAMPLING_RATIO))
        .with_description(doc(engine::TRACE_SAMPLING_RATIO))
        .with_callback(move |o| o.observe(telemetry().sampling_ratio, &[]))
        .build();
}
