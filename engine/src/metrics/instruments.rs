//! The OTLP instruments the step loops and the HTTP layer record into, once OTLP metrics are
//! on. Apart from [`super::otlp`] (which registers them) so that the counters in
//! [`super::group`] and [`super::requests`] can hold them without importing the exporter that
//! reads those counters: the imports run one way.

use opentelemetry::KeyValue;
use opentelemetry::metrics::Histogram;
use slotlight_otel::attr::{self, value};

/// One group's histograms, recorded by its step loop.
#[derive(Debug)]
pub struct GroupInstruments {
    /// The duration of each forward step (`slotlight_engine_step_duration_seconds`).
    pub step_duration: Histogram<f64>,
    /// The requests in each forward step (`slotlight_engine_step_batch_size`).
    pub step_batch: Histogram<f64>,
    /// The `slot_group` label every observation of the group carries.
    pub attrs: [KeyValue; 1],
}

/// The HTTP layer's histograms, recorded as each request is observed.
#[derive(Debug)]
pub struct RequestInstruments {
    /// Arrival to first token of successful requests (`gen_ai.server.time_to_first_token`).
    pub ttft: Histogram<f64>,
    /// Time per token after the first, of successful requests
    /// (`gen_ai.server.time_per_output_token`).
    pub tpot: Histogram<f64>,
    /// Arrival to finish of every request, with its `error.type`
    /// (`gen_ai.server.request.duration`).
    pub duration: Histogram<f64>,
    /// Arrival to first admission of admitted requests (`slotlight_engine_queue_time_seconds`).
    pub queue: Histogram<f64>,
}

/// The attributes of a request series: its API (under the label's name, as `/metrics` shows
/// it) and its GenAI attributes (the request model only when known).
pub fn genai_attrs(
    api: &'static str,
    operation: &'static str,
    request_model: &str,
    response_model: &str,
) -> Vec<KeyValue> {
    let mut v = vec![
        KeyValue::new(slotlight_otel::metric::label::API, api),
        KeyValue::new(attr::GEN_AI_OPERATION_NAME, operation),
        KeyValue::new(attr::GEN_AI_PROVIDER_NAME, value::PROVIDER),
    ];
    if !request_model.is_empty() {
        v.push(KeyValue::new(
            attr::GEN_AI_REQUEST_MODEL,
            request_model.to_string(),
        ));
    }
    v.push(KeyValue::new(
        attr::GEN_AI_RESPONSE_MODEL,
        response_model.to_string(),
    ));
    v
}
