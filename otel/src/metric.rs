//! Metric names (Prometheus exposition names, as the sidecar serves them) and their labels.
//!
//! Histograms follow the OpenTelemetry GenAI server metrics where they exist: their names, their
//! labels (`gen_ai_operation_name`, `gen_ai_provider_name`, `gen_ai_request_model`,
//! `gen_ai_response_model`, and `error_type` on failures) and their bucket boundaries (the GenAI
//! semantic conventions' advice for each metric). Time to first token and time per output
//! token record successful requests only (`slotlight.request.status` = `ok`), as the
//! conventions ask. A value a request never had is never observed.
//! `traces_span_metrics_*` follow the OpenTelemetry collector's spanmetrics connector, so that
//! Jaeger's Service Performance Monitoring can read the sidecar directly.

crate::contract! {
    /// Histogram: arrival to first token (`usage.ttft_ms`), per successful request.
    TIME_TO_FIRST_TOKEN = "gen_ai_server_time_to_first_token_seconds", "histogram", "s";
    /// Histogram: time per output token after the first (`generation_ms / (completion_tokens - 1)`), per successful request.
    TIME_PER_OUTPUT_TOKEN = "gen_ai_server_time_per_output_token_seconds", "histogram", "s";
    /// Histogram: arrival to finish (`usage.e2e_ms`, or arrival to refusal), per turn; failures carry `error_type`.
    REQUEST_DURATION = "gen_ai_server_request_duration_seconds", "histogram", "s";
    /// Histogram: arrival to admission (`usage.queue_ms`), per admitted request.
    QUEUE_TIME = "slotlight_queue_seconds", "histogram", "s";
    /// Histogram: device time in prefill forward steps (`usage.prefill_ms`), per request with a prefill step.
    PREFILL_TIME = "slotlight_prefill_seconds", "histogram", "s";
    /// Histogram: device time in decode forward steps (`usage.decode_ms`), per request with a decode step.
    DECODE_TIME = "slotlight_decode_seconds", "histogram", "s";
    /// Counter: prompt tokens of finished requests.
    PROMPT_TOKENS = "slotlight_prompt_tokens_total", "counter", "{token}";
    /// Counter: prompt tokens served from the KV cache.
    CACHED_TOKENS = "slotlight_cached_tokens_total", "counter", "{token}";
    /// Counter: generated (completion) tokens of finished requests.
    GENERATED_TOKENS = "slotlight_generated_tokens_total", "counter", "{token}";
    /// Counter: turns (every request the engine answered), by `status` (`ok`, `cancelled`, `refused`, `error`), `finish_reason` (served turns) and `error_type` (the others).
    REQUESTS = "slotlight_requests_total", "counter", "{request}";
    /// Counter: served turns by `resume` outcome (`slotlight.resume`: `first`, `full`, `diverged`, `evicted`, `other_group`, `none`, `prefix`).
    TURNS_BY_RESUME = "slotlight_turns_by_resume_total", "counter", "{turn}";
    /// Counter: moves of a request between paths (solo to slot or back).
    MOVES = "slotlight_moves_total", "counter", "{move}";
    /// Gauge: requests admitted and not yet finished, per engine instance.
    RUNNING_REQUESTS = "slotlight_running_requests", "gauge", "{request}";
    /// Gauge: each busy slot's (or the solo path's) current request rate since its first token, tokens per second.
    SLOT_TOKENS_PER_SECOND = "slotlight_slot_tokens_per_second", "gauge", "{token}/s";
    /// Counter (spanmetrics connector): spans by service, name, kind and status.
    SPAN_CALLS = "traces_span_metrics_calls_total", "counter", "{span}";
    /// Histogram (spanmetrics connector): span durations by service, name, kind and status.
    SPAN_DURATION = "traces_span_metrics_duration_milliseconds", "histogram", "ms";
    /// Counter (sidecar): spans received over OTLP, all producers.
    SIDECAR_SPANS_RECEIVED = "slotlight_sidecar_spans_received_total", "counter", "{span}";
    /// Counter (sidecar): spans rejected as unusable (partial success), by `reason`.
    SIDECAR_SPANS_REJECTED = "slotlight_sidecar_spans_rejected_total", "counter", "{span}";
    /// Counter (sidecar): spans from producers other than the engine, accepted and ignored.
    SIDECAR_SPANS_IGNORED = "slotlight_sidecar_spans_ignored_total", "counter", "{span}";
    /// Counter (sidecar): spans dropped because the ingest queue was full.
    SIDECAR_SPANS_DROPPED = "slotlight_sidecar_spans_dropped_total", "counter", "{span}";
    /// Counter (sidecar): spans that arrived after what they describe was over (a span of a request whose turn record is written, or a decode window of a leg that already ended); applied to no view.
    SIDECAR_SPANS_LATE = "slotlight_sidecar_spans_late_total", "counter", "{span}";
    /// Counter (sidecar): OTLP export requests refused, by `reason` (`malformed`, `too_large`, `unsupported_media_type`, `overloaded`).
    SIDECAR_REQUESTS_REJECTED = "slotlight_sidecar_requests_rejected_total", "counter", "{request}";
    /// Counter (sidecar): in-flight traces evicted (capacity or TTL), by `reason`.
    SIDECAR_TRACES_EVICTED = "slotlight_sidecar_traces_evicted_total", "counter", "{trace}";
    /// Gauge (sidecar): traces being assembled.
    SIDECAR_TRACES_IN_FLIGHT = "slotlight_sidecar_traces_in_flight", "gauge", "{trace}";
    /// Counter (sidecar): export requests forwarded upstream with `--forward-otlp`.
    SIDECAR_FORWARDED = "slotlight_sidecar_forwarded_total", "counter", "{request}";
    /// Counter (sidecar): export requests not forwarded (queue full or upstream failure).
    SIDECAR_FORWARD_DROPPED = "slotlight_sidecar_forward_dropped_total", "counter", "{request}";
}

/// Metric label names.
pub mod label {
    /// The engine instance (`service.instance.id`).
    pub const INSTANCE: &str = "service_instance_id";
    /// GenAI: `gen_ai.operation.name` (`chat`, `text_completion`).
    pub const GEN_AI_OPERATION_NAME: &str = "gen_ai_operation_name";
    /// GenAI: `gen_ai.provider.name` (`slotlight`).
    pub const GEN_AI_PROVIDER_NAME: &str = "gen_ai_provider_name";
    /// GenAI: `gen_ai.request.model`, the model the client asked for.
    pub const GEN_AI_REQUEST_MODEL: &str = "gen_ai_request_model";
    /// GenAI: `gen_ai.response.model`, the model that served the request.
    pub const GEN_AI_RESPONSE_MODEL: &str = "gen_ai_response_model";
    /// GenAI: `error.type`, only on failures.
    pub const ERROR_TYPE: &str = "error_type";
    /// How a turn ended (`slotlight.request.status`).
    pub const STATUS: &str = "status";
    /// A request's finish reason.
    pub const FINISH_REASON: &str = "finish_reason";
    /// A turn's resume outcome (`slotlight.resume`).
    pub const RESUME: &str = "resume";
    /// A slot's device group.
    pub const SLOT_GROUP: &str = "slot_group";
    /// A slot's index, or `solo` for the solo path.
    pub const SLOT: &str = "slot";
    /// Why something was rejected or evicted.
    pub const REASON: &str = "reason";
    /// spanmetrics: `service.name`.
    pub const SERVICE_NAME: &str = "service_name";
    /// spanmetrics: the span name.
    pub const SPAN_NAME: &str = "span_name";
    /// spanmetrics: the span kind (`SPAN_KIND_SERVER`, …).
    pub const SPAN_KIND: &str = "span_kind";
    /// spanmetrics: the status code (`STATUS_CODE_UNSET`, `STATUS_CODE_OK`, `STATUS_CODE_ERROR`).
    pub const STATUS_CODE: &str = "status_code";
}

/// Bucket boundaries, in seconds unless named otherwise.
pub mod buckets {
    /// `gen_ai.server.time_to_first_token`: GenAI semantic conventions' advice.
    pub const TIME_TO_FIRST_TOKEN: &[f64] = &[
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    ];
    /// `gen_ai.server.time_per_output_token`: GenAI semantic conventions' advice.
    pub const TIME_PER_OUTPUT_TOKEN: &[f64] = &[
        0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
    ];
    /// `gen_ai.server.request.duration` (and queue, prefill, decode times): GenAI semantic conventions' advice.
    pub const REQUEST_DURATION: &[f64] = &[
        0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
    ];
    /// `traces_span_metrics_duration_milliseconds`: the spanmetrics connector's defaults, in ms.
    pub const SPAN_DURATION_MS: &[f64] = &[
        2.0, 4.0, 6.0, 8.0, 10.0, 50.0, 100.0, 200.0, 400.0, 800.0, 1000.0, 1400.0, 2000.0, 5000.0,
        10000.0, 15000.0,
    ];
}
