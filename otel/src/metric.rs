//! Metric names (Prometheus exposition names) and their labels.
//!
//! Two processes serve metrics, and each name says which: the top-level names are the
//! sidecar's, built from the spans it receives (so with a trace sampler they count sampled
//! requests only); [`engine`] holds the engine's own, counted where the work happens and exact
//! whatever the sampler does. The three GenAI histograms are served by both with the same
//! meaning and labels: scrape them with a `job` label to tell the two apart.
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
    /// Histogram: arrival to first token (`usage.ttft_ms`), per successful request. Served by the sidecar (requests whose traces it received) and by the engine (every request).
    TIME_TO_FIRST_TOKEN = "gen_ai_server_time_to_first_token_seconds", "histogram", "s";
    /// Histogram: time per output token after the first (`generation_ms / (completion_tokens - 1)`), per successful request. Served by the sidecar (requests whose traces it received) and by the engine (every request).
    TIME_PER_OUTPUT_TOKEN = "gen_ai_server_time_per_output_token_seconds", "histogram", "s";
    /// Histogram: arrival to finish (`usage.e2e_ms`, or arrival to refusal), per turn; failures carry `error_type`. Served by the sidecar (requests whose traces it received) and by the engine (every request).
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
    /// Counter: draft tokens verified (speculative decoding) of finished requests (`slotlight.usage.drafted_tokens`, `usage.drafted_tokens`); a turn whose request span does not state it adds nothing. Over `slotlight_drafted_tokens_total`, `slotlight_accepted_tokens_total` is the acceptance rate.
    DRAFTED_TOKENS = "slotlight_drafted_tokens_total", "counter", "{token}";
    /// Counter: of those, draft tokens taken as the model's own (`slotlight.usage.accepted_tokens`, `usage.accepted_tokens`), of finished requests.
    ACCEPTED_TOKENS = "slotlight_accepted_tokens_total", "counter", "{token}";
    /// Counter: turns (every request the engine answered), by `status` (`ok`, `cancelled`, `refused`, `error`), `finish_reason` (served turns) and `error_type` (the others).
    REQUESTS = "slotlight_requests_total", "counter", "{request}";
    /// Counter: served turns by `resume` outcome (`slotlight.resume`: `first`, `full`, `diverged`, `evicted`, `expired`, `other_group`, `none`, `prefix`).
    TURNS_BY_RESUME = "slotlight_turns_by_resume_total", "counter", "{turn}";
    /// Histogram: turns per session, observed once per session when it stops being live (its last turn ended longer ago than the engine keeps its KV, else `--session-idle-s`), as `/v1/sessions` counts them (`turns`).
    SESSION_TURNS = "slotlight_session_turns", "histogram", "{turn}";
    /// Histogram: a session's duration, its first turn's arrival to its last turn's end (`last_turn_at - first_turn_at`), observed once per session when it stops being live.
    SESSION_DURATION = "slotlight_session_duration_seconds", "histogram", "s";
    /// Histogram: a session's cache-hit ratio, its prompt tokens served from the KV cache over its prompt tokens (`cache_hit_ratio`), observed once per session with prompt tokens when it stops being live.
    SESSION_CACHE_HIT_RATIO = "slotlight_session_cache_hit_ratio", "histogram", "1";
    /// Histogram: the client's share of a session's time, the gaps between one turn's end and the next turn's arrival (`client_s`, the agent's tools and its user) over the session's model time plus those gaps (`model_s + client_s`), observed once per session of two turns or more when it stops being live.
    SESSION_CLIENT_SHARE = "slotlight_session_client_share", "histogram", "1";
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
    /// Gauge (sidecar), per `service_instance_id`: the share of request traces that engine keeps, as its latest request span stated (`slotlight.trace.sampling_ratio`). Below 1, every count above is of the sampled requests only; the engine's own metrics count them all.
    SIDECAR_TRACE_SAMPLING_RATIO = "slotlight_sidecar_trace_sampling_ratio", "gauge", "1";
    /// Counter (sidecar): metric data points received over OTLP (`/v1/metrics`, the gRPC `MetricsService`), accepted, counted and forwarded with `--forward-otlp`; the sidecar builds no view from them.
    SIDECAR_METRIC_POINTS_RECEIVED = "slotlight_sidecar_metric_points_received_total", "counter", "{point}";
    /// Counter (sidecar): log records received over OTLP (`/v1/logs`, the gRPC `LogsService`; the engine's per-turn records with `OTEL_LOGS_EXPORTER=otlp`), accepted, counted and forwarded with `--forward-otlp`; the sidecar builds no view from them.
    SIDECAR_LOG_RECORDS_RECEIVED = "slotlight_sidecar_log_records_received_total", "counter", "{record}";
    /// Counter (sidecar): export requests (spans, metrics or logs) forwarded upstream with `--forward-otlp`.
    SIDECAR_FORWARDED = "slotlight_sidecar_forwarded_total", "counter", "{request}";
    /// Counter (sidecar): export requests not forwarded (queue full or upstream failure).
    SIDECAR_FORWARD_DROPPED = "slotlight_sidecar_forward_dropped_total", "counter", "{request}";
    /// Counter (sidecar): turn records the turn store (`--turns-db`) did not take because its writer was behind (its queue full); they reached `/v1/turns/stream` and the stdout log but are not in `/v1/turns`.
    SIDECAR_TURNS_NOT_STORED = "slotlight_sidecar_turns_not_stored_total", "counter", "{turn}";
    /// Counter (sidecar): turn records written without their request span (it never arrived: lost past the engine's export queue bound, or evicted before it came), `complete: false` with `status` `unknown`; they are in `/v1/turns` but no request metric observes them.
    SIDECAR_TURNS_INCOMPLETE = "slotlight_sidecar_turns_incomplete_total", "counter", "{turn}";
}

/// The engine's own metrics, served by the engine on `GET /metrics` (and exported over OTLP
/// with `OTEL_METRICS_EXPORTER=otlp`). They are counted where the work happens (each slot
/// group owns its counters and gauges; the HTTP layer owns the request latencies and
/// refusals) and count every request, whatever the trace sampler keeps. The engine also serves
/// the GenAI histograms [`TIME_TO_FIRST_TOKEN`], [`TIME_PER_OUTPUT_TOKEN`] and
/// [`REQUEST_DURATION`] under their convention names. The vLLM counterpart of each is named in
/// its doc (see also `docs/configuration.md`).
pub mod engine {
    crate::contract! {
        /// Gauge (engine), per `slot_group`: requests waiting for admission to the group, new ones and preempted ones waiting to run again (vLLM `vllm:num_requests_waiting`).
        REQUESTS_WAITING = "slotlight_engine_requests_waiting", "gauge", "{request}";
        /// Gauge (engine), per `slot_group` and `path` (`solo`, `slot`): requests admitted and running (vLLM `vllm:num_requests_running`, split by path).
        REQUESTS_RUNNING = "slotlight_engine_requests_running", "gauge", "{request}";
        /// Gauge (engine), per `slot_group`: batch slots of the group (`--batch`), the most requests it runs at once.
        BATCH_SLOTS = "slotlight_engine_batch_slots", "gauge", "{slot}";
        /// Gauge (engine), per `slot_group`: KV cache blocks in all (of the full pool: every layer's KV, or only the global layers' when the sliding-window layers have a window pool of their own).
        KV_BLOCKS = "slotlight_engine_kv_blocks", "gauge", "{block}";
        /// Gauge (engine), per `slot_group`: KV cache blocks held by running requests (neither free nor evictable prefix cache), of the full pool.
        KV_BLOCKS_USED = "slotlight_engine_kv_blocks_used", "gauge", "{block}";
        /// Gauge (engine), per `slot_group`: blocks of the window pool, where the sliding-window (local) layers keep only the KV their window still sees; 0 without one (every layer whole).
        KV_WINDOW_BLOCKS = "slotlight_engine_kv_window_blocks", "gauge", "{block}";
        /// Gauge (engine), per `slot_group`: window-pool blocks held by running requests (neither free nor evictable prefix cache).
        KV_WINDOW_BLOCKS_USED = "slotlight_engine_kv_window_blocks_used", "gauge", "{block}";
        /// Gauge (engine), per `slot_group`: bytes of KV cache storage, both pools.
        KV_BYTES = "slotlight_engine_kv_bytes", "gauge", "By";
        /// Gauge (engine), per `slot_group`: bytes of the KV blocks held by running requests, both pools.
        KV_BYTES_USED = "slotlight_engine_kv_bytes_used", "gauge", "By";
        /// Gauge (engine), per `slot_group`: KV cache usage, bytes held over bytes in all (both pools; with one pool, blocks used over blocks in all), from 0 to 1; 0 when idle (vLLM `vllm:kv_cache_usage_perc`, formerly `vllm:gpu_cache_usage_perc`).
        KV_CACHE_USAGE = "slotlight_engine_kv_cache_usage_ratio", "gauge", "1";
        /// Counter (engine), per `slot_group`: cached prefix blocks evicted to make room.
        KV_EVICTED_BLOCKS = "slotlight_engine_kv_evicted_blocks_total", "counter", "{block}";
        /// Gauge (engine), per `slot_group`: KV blocks kept for live sessions (`--session-kv-ttl`): their last turn's blocks, evicted only after every other cached prefix, at most `--session-kv-share` of the group's blocks.
        SESSION_KV_BLOCKS = "slotlight_engine_session_kv_blocks", "gauge", "{block}";
        /// Gauge (engine), per `slot_group`: window-pool blocks kept for live sessions, on a model with sliding-window layers (their last window, their prompt's checkpoint and their latest checkpoints inside long replies, within the pool's `--session-windows` room), evicted only after every other window block; 0 without a window pool.
        SESSION_KV_WINDOW_BLOCKS = "slotlight_engine_session_kv_window_blocks", "gauge", "{block}";
        /// Counter (engine), per `slot_group`: sessions whose KV stopped being kept because their TTL passed without a next turn.
        SESSION_KV_EXPIRIES = "slotlight_engine_session_kv_expiries_total", "counter", "{session}";
        /// Counter (engine), per `slot_group` and `reason`: blocks of live sessions that lost their keeping before the TTL: `pressure` (reclaimed for a request when nothing else was evictable) or `share` (let go to keep the sessions' blocks within `--session-kv-share`, the longest-idle session first).
        SESSION_KV_EVICTED_BLOCKS = "slotlight_engine_session_kv_evicted_blocks_total", "counter", "{block}";
        /// Counter (engine), per `slot_group`: requests preempted (their KV freed; they wait and re-prefill) (vLLM `vllm:num_preemptions_total`).
        PREEMPTIONS = "slotlight_engine_preemptions_total", "counter", "{preemption}";
        /// Counter (engine), per `slot_group`: prompt tokens looked up in the prefix cache, at every admission (re-admissions after a preemption included) (vLLM `vllm:prefix_cache_queries_total`).
        PREFIX_CACHE_QUERIED_TOKENS = "slotlight_engine_prefix_cache_queried_tokens_total", "counter", "{token}";
        /// Counter (engine), per `slot_group`: of those, tokens found in the prefix cache (vLLM `vllm:prefix_cache_hits_total`).
        PREFIX_CACHE_HIT_TOKENS = "slotlight_engine_prefix_cache_hit_tokens_total", "counter", "{token}";
        /// Counter (engine), per `slot_group`: prompt tokens of admitted requests, once per request (`usage.prompt_tokens`) (vLLM `vllm:prompt_tokens_total`).
        PROMPT_TOKENS = "slotlight_engine_prompt_tokens_total", "counter", "{token}";
        /// Counter (engine), per `slot_group`: prompt tokens served from the KV cache at a request's first admission (`usage.prompt_tokens_details.cached_tokens`).
        CACHED_TOKENS = "slotlight_engine_cached_tokens_total", "counter", "{token}";
        /// Counter (engine), per `slot_group`: generated tokens, counted as they are sampled (`usage.completion_tokens` once the requests finish) (vLLM `vllm:generation_tokens_total`).
        GENERATION_TOKENS = "slotlight_engine_generation_tokens_total", "counter", "{token}";
        /// Counter (engine), per `slot_group`: requests (each choice of a request with `n` > 1) finished by the step loop, by `finish_reason` (`stop`, `length`, `cancelled`, `error`; tool calls count as `stop`) and, for `cancelled` and `error`, `error_type` (vLLM `vllm:request_success_total`).
        REQUESTS_FINISHED = "slotlight_engine_requests_finished_total", "counter", "{request}";
        /// Counter (engine), per `slot_group`: verification steps with a draft (speculative decoding: each decode step of a sequence that checked a draft from its prompt, its reply or the client's prediction) (vLLM `vllm:spec_decode_num_drafts_total`).
        SPEC_DECODE_DRAFTS = "slotlight_engine_spec_decode_drafts_total", "counter", "{draft}";
        /// Counter (engine), per `slot_group`: draft tokens verified (vLLM `vllm:spec_decode_num_draft_tokens_total`).
        SPEC_DECODE_DRAFT_TOKENS = "slotlight_engine_spec_decode_draft_tokens_total", "counter", "{token}";
        /// Counter (engine), per `slot_group`: of those, draft tokens taken as the model's own (`usage.completion_tokens_details.accepted_prediction_tokens` once the requests finish) (vLLM `vllm:spec_decode_num_accepted_tokens_total`).
        SPEC_DECODE_ACCEPTED_TOKENS = "slotlight_engine_spec_decode_accepted_tokens_total", "counter", "{token}";
        /// Counter (engine), per `slot_group` and `position` (0 for a draft's first token): draft tokens taken at each position of their draft; position 0 counts drafts whose first token was taken (vLLM `vllm:spec_decode_num_accepted_tokens_per_pos_total`).
        SPEC_DECODE_ACCEPTED_TOKENS_PER_POS = "slotlight_engine_spec_decode_accepted_tokens_per_pos_total", "counter", "{token}";
        /// Counter (engine): requests answered with an error before reaching a step loop, by `error_type` (`validation`, `overloaded`, `shutdown`, …); the same requests the sidecar counts with status `refused`. Requests without a valid API key are not counted.
        REQUESTS_REFUSED = "slotlight_engine_requests_refused_total", "counter", "{request}";
        /// Histogram (engine), per admitted request: arrival to first admission (`usage.queue_ms`), with the GenAI labels (vLLM `vllm:request_queue_time_seconds`).
        QUEUE_TIME = "slotlight_engine_queue_time_seconds", "histogram", "s";
        /// Histogram (engine), per `slot_group`: duration of each forward step, as the backend measures it (the device time every request in the step is charged) (TGI `tgi_batch_forward_duration`).
        STEP_DURATION = "slotlight_engine_step_duration_seconds", "histogram", "s";
        /// Histogram (engine), per `slot_group`: requests in each forward step (decodes plus prefill chunks) (TGI `tgi_batch_current_size`).
        STEP_BATCH_SIZE = "slotlight_engine_step_batch_size", "histogram", "{request}";
        /// Counter (engine): spans handed to the OTLP collector successfully.
        SPANS_EXPORTED = "slotlight_engine_spans_exported_total", "counter", "{span}";
        /// Counter (engine): spans lost, exactly: beyond the export queue's bounds (`--otlp-queue-spans`, `--otlp-queue-bytes`), refused for good by the collector (a non-retryable status), or still queued at shutdown's deadline. Spans of failed exports are retried, not dropped.
        SPANS_DROPPED = "slotlight_engine_spans_dropped_total", "counter", "{span}";
        /// Counter (engine): failed span export attempts (a batch is retried with backoff until delivered, so one outage counts many).
        SPAN_EXPORT_FAILURES = "slotlight_engine_span_export_failures_total", "counter", "{export}";
        /// Gauge (engine): spans in the export queue (queued or being sent), at most `--otlp-queue-spans`; it grows while the collector is down and empties when it is back.
        SPAN_QUEUE_SPANS = "slotlight_engine_span_queue_spans", "gauge", "{span}";
        /// Gauge (engine): the share of request traces the engine's sampler keeps, from 0 to 1 (`OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`); 1 without a ratio sampler, 0 with telemetry off. Every engine metric counts all requests whatever this is.
        TRACE_SAMPLING_RATIO = "slotlight_engine_trace_sampling_ratio", "gauge", "1";
        /// Gauge (engine), per `backend` (`sqlite`, `memory`, `redis`, `unavailable`): 1 when the Responses store was opened, 0 when it could not be (corrupt, unreadable, locked past the busy timeout), with the reason in `reason`; the engine serves everything else without it.
        RESPONSES_STORE_AVAILABLE = "slotlight_engine_responses_store_available", "gauge", "1";
        /// Counter (engine), per `backend`: finished Responses API responses the store failed to save (Redis down, a full disk); each was still returned, marked as not stored (`store: false`, the `x-slotlight-stored: false` header, a `slotlight.store` span with `slotlight.store.stored` false).
        RESPONSES_NOT_STORED = "slotlight_engine_responses_not_stored_total", "counter", "{response}";
    }
}

/// OpenTelemetry instrument names of the metrics that follow a semantic convention, for OTLP
/// export (a collector's Prometheus exporter turns them back into the exposition names above).
/// The engine's own metrics go out over OTLP under their exposition names, less `_total`.
pub mod otlp {
    crate::contract! {
        /// OTLP name of `gen_ai_server_time_to_first_token_seconds` (engine, with `OTEL_METRICS_EXPORTER=otlp`).
        TIME_TO_FIRST_TOKEN = "gen_ai.server.time_to_first_token", "histogram", "s";
        /// OTLP name of `gen_ai_server_time_per_output_token_seconds` (engine, with `OTEL_METRICS_EXPORTER=otlp`).
        TIME_PER_OUTPUT_TOKEN = "gen_ai.server.time_per_output_token", "histogram", "s";
        /// OTLP name of `gen_ai_server_request_duration_seconds` (engine, with `OTEL_METRICS_EXPORTER=otlp`).
        REQUEST_DURATION = "gen_ai.server.request.duration", "histogram", "s";
    }
}

/// The model-server protocol's signals under vLLM's names, which the Kubernetes inference
/// gateway's endpoint picker reads by default: served by the engine beside its own with
/// `--metrics-compat vllm`, each with vLLM's meaning, each labelled with `model_name`, each the
/// same number as the `slotlight_engine_*` series it mirrors (summed over slot groups) in the
/// same scrape.
pub mod vllm {
    crate::contract! {
        /// Gauge (engine, `--metrics-compat vllm`): requests waiting, the sum over groups of `slotlight_engine_requests_waiting`.
        NUM_REQUESTS_WAITING = "vllm:num_requests_waiting", "gauge", "{request}";
        /// Gauge (engine, `--metrics-compat vllm`): requests running, the sum over groups and paths of `slotlight_engine_requests_running`.
        NUM_REQUESTS_RUNNING = "vllm:num_requests_running", "gauge", "{request}";
        /// Gauge (engine, `--metrics-compat vllm`): KV cache usage from 0 to 1, bytes held by running requests over bytes in all, over every group (`slotlight_engine_kv_bytes_used` / `slotlight_engine_kv_bytes`; with one group, `slotlight_engine_kv_cache_usage_ratio`).
        KV_CACHE_USAGE_PERC = "vllm:kv_cache_usage_perc", "gauge", "1";
        /// Gauge (engine, `--metrics-compat vllm`), always 1: the KV cache's `block_size` (positions per block) and `num_gpu_blocks` (blocks over every group, `slotlight_engine_kv_blocks`) as labels.
        CACHE_CONFIG_INFO = "vllm:cache_config_info", "gauge", "1";
        /// Gauge (engine, `--metrics-compat vllm`): the scrape time in Unix seconds, with `max_lora` 0 and empty `running_lora_adapters` and `waiting_lora_adapters` as labels (the engine serves no LoRA adapters).
        LORA_REQUESTS_INFO = "vllm:lora_requests_info", "gauge", "s";
        /// Counter (engine, `--metrics-compat vllm`): verification steps with a draft, the sum over groups of `slotlight_engine_spec_decode_drafts_total`.
        SPEC_DECODE_NUM_DRAFTS = "vllm:spec_decode_num_drafts_total", "counter", "{draft}";
        /// Counter (engine, `--metrics-compat vllm`): draft tokens verified, the sum over groups of `slotlight_engine_spec_decode_draft_tokens_total`.
        SPEC_DECODE_NUM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total", "counter", "{token}";
        /// Counter (engine, `--metrics-compat vllm`): draft tokens taken, the sum over groups of `slotlight_engine_spec_decode_accepted_tokens_total`.
        SPEC_DECODE_NUM_ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens_total", "counter", "{token}";
        /// Counter (engine, `--metrics-compat vllm`), per `position`: draft tokens taken at each position of their draft, the sum over groups of `slotlight_engine_spec_decode_accepted_tokens_per_pos_total`.
        SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter", "{token}";
    }
}

/// Metric label names.
pub mod label {
    /// The engine instance (`service.instance.id`).
    pub const INSTANCE: &str = "service_instance_id";
    /// The API a request came through (`slotlight.api`: `chat.completions`, `completions`,
    /// `responses`, `messages`).
    pub const API: &str = "slotlight_api";
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
    /// A request's path: `solo` or `slot` (`slotlight.leg.path`).
    pub const PATH: &str = "path";
    /// A slot's index, or `solo` for the solo path.
    pub const SLOT: &str = "slot";
    /// Why something was rejected or evicted.
    pub const REASON: &str = "reason";
    /// The Responses store's backend (`sqlite`, `memory`, `redis`, `unavailable`).
    pub const BACKEND: &str = "backend";
    /// spanmetrics: `service.name`.
    pub const SERVICE_NAME: &str = "service_name";
    /// spanmetrics: the span name.
    pub const SPAN_NAME: &str = "span_name";
    /// spanmetrics: the span kind (`SPAN_KIND_SERVER`, …).
    pub const SPAN_KIND: &str = "span_kind";
    /// spanmetrics: the status code (`STATUS_CODE_UNSET`, `STATUS_CODE_OK`, `STATUS_CODE_ERROR`).
    pub const STATUS_CODE: &str = "status_code";
    /// vLLM-compatible metrics: the served model's name.
    pub const MODEL_NAME: &str = "model_name";
    /// `vllm:cache_config_info`: positions per KV block.
    pub const BLOCK_SIZE: &str = "block_size";
    /// `vllm:cache_config_info`: KV blocks in all.
    pub const NUM_GPU_BLOCKS: &str = "num_gpu_blocks";
    /// `vllm:lora_requests_info`: adapters served at most at once.
    pub const MAX_LORA: &str = "max_lora";
    /// `vllm:lora_requests_info`: adapters of running requests, comma-separated.
    pub const RUNNING_LORA_ADAPTERS: &str = "running_lora_adapters";
    /// A draft token's position in its draft, from 0 (`*_spec_decode_*accepted_tokens_per_pos`).
    pub const POSITION: &str = "position";
    /// `vllm:lora_requests_info`: adapters of waiting requests, comma-separated.
    pub const WAITING_LORA_ADAPTERS: &str = "waiting_lora_adapters";
}

/// Values of the `reason` label of the engine's session KV metrics.
pub mod reason {
    /// `slotlight_engine_session_kv_evicted_blocks_total`: reclaimed for a request when nothing
    /// else was evictable.
    pub const PRESSURE: &str = "pressure";
    /// `slotlight_engine_session_kv_evicted_blocks_total`: let go to keep the sessions' blocks
    /// within `--session-kv-share`.
    pub const SHARE: &str = "share";
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
    /// `slotlight_engine_step_duration_seconds`: from half a millisecond (a batch-1 decode step
    /// of a small model on a GPU) to 10 s (a long prefill chunk on a CPU).
    pub const STEP_DURATION: &[f64] = &[
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ];
    /// `slotlight_session_turns`: vLLM's agent sessions have a median of 43 turns; powers of
    /// two up to 1024.
    pub const SESSION_TURNS: &[f64] = &[
        1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
    ];
    /// `slotlight_session_duration_seconds`: from a second to a working day.
    pub const SESSION_DURATION: &[f64] = &[
        1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0,
    ];
    /// `slotlight_session_cache_hit_ratio` and `slotlight_session_client_share`: tenths, with
    /// finer steps near 1 (agent sessions' prefix-cache hit rates sit above 0.9).
    pub const RATIO: &[f64] = &[
        0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 1.0,
    ];
    /// `slotlight_engine_step_batch_size`: powers of two, as vLLM's `vllm:iteration_tokens_total`
    /// buckets are.
    pub const STEP_BATCH_SIZE: &[f64] =
        &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];
    /// `traces_span_metrics_duration_milliseconds`: the spanmetrics connector's defaults, in ms.
    pub const SPAN_DURATION_MS: &[f64] = &[
        2.0, 4.0, 6.0, 8.0, 10.0, 50.0, 100.0, 200.0, 400.0, 800.0, 1000.0, 1400.0, 2000.0, 5000.0,
        10000.0, 15000.0,
    ];
}
