//! Attribute keys, and the enumerated values some of them take.
//!
//! Keys reuse `gen_ai.*` (OpenTelemetry GenAI semantic conventions), `server.*` and vLLM's
//! `gen_ai.latency.*` with the meaning their convention gives them; slotlight's own keys live
//! under `slotlight.*`. Times named `*_time_unix_nano` are absolute wall-clock times in
//! nanoseconds since the Unix epoch; durations named `*_ms` are milliseconds;
//! `gen_ai.latency.*` are seconds.
//!
//! Two kinds of duration appear, and never under each other's names:
//!
//! - **wall-clock intervals** between two of the request's own instants (`queue_ms`, `ttft_ms`,
//!   `generation_ms`, `e2e_ms`, and every `gen_ai.latency.*`, which follow vLLM's definitions);
//! - **device time** (`slotlight.usage.prefill_ms`, `slotlight.usage.decode_ms` and every
//!   `*.device_ms`): the sum of the durations of the forward steps the request took part in.
//!   Under batching one step serves many requests, so each of them counts the whole step.
//!
//! A value the request never had (no admission, no token, no decode step) is left off the
//! span, never written as zero.

crate::contract! {
    /// Resource: the logical service name (`slotlight-engine` for the engine).
    SERVICE_NAME = "service.name", "string", "";
    /// Resource: a unique id of one engine process. The sidecar keys its views by it.
    SERVICE_INSTANCE_ID = "service.instance.id", "string", "";
    /// Resource: the engine's version.
    SERVICE_VERSION = "service.version", "string", "";

    /// Request span: the GenAI operation (`chat` or `text_completion`).
    GEN_AI_OPERATION_NAME = "gen_ai.operation.name", "string", "";
    /// Request span: the provider, always `slotlight`.
    GEN_AI_PROVIDER_NAME = "gen_ai.provider.name", "string", "";
    /// Request span: the model the client asked for.
    GEN_AI_REQUEST_MODEL = "gen_ai.request.model", "string", "";
    /// Request span: the completion token limit the request asked for (or the default applied).
    GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens", "int", "{token}";
    /// Request span: sampling temperature.
    GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature", "double", "";
    /// Request span: nucleus sampling threshold.
    GEN_AI_REQUEST_TOP_P = "gen_ai.request.top_p", "double", "";
    /// Request span: top-k sampling limit (0 means off).
    GEN_AI_REQUEST_TOP_K = "gen_ai.request.top_k", "double", "";
    /// Request span: the sampling seed, when the request gave one.
    GEN_AI_REQUEST_SEED = "gen_ai.request.seed", "int", "";
    /// Request span: the frequency penalty, when the request gave one.
    GEN_AI_REQUEST_FREQUENCY_PENALTY = "gen_ai.request.frequency_penalty", "double", "";
    /// Request span: the presence penalty, when the request gave one.
    GEN_AI_REQUEST_PRESENCE_PENALTY = "gen_ai.request.presence_penalty", "double", "";
    /// Request span: the stop strings, when the request gave any.
    GEN_AI_REQUEST_STOP_SEQUENCES = "gen_ai.request.stop_sequences", "string[]", "";
    /// Request span: the number of choices asked for (`n`), when the request gave it.
    GEN_AI_REQUEST_CHOICE_COUNT = "gen_ai.request.choice.count", "int", "";
    /// Request span: whether the reply was streamed.
    GEN_AI_REQUEST_STREAM = "gen_ai.request.stream", "bool", "";
    /// Request span of a Responses request that continues a stored response: its `previous_response_id`.
    GEN_AI_REQUEST_PREVIOUS_RESPONSE_ID = "gen_ai.request.previous_response.id", "string", "";
    /// Request span of a streamed request: seconds from its arrival to its first chunk of output (its first token), on every door.
    GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK = "gen_ai.response.time_to_first_chunk", "double", "s";
    /// Request span: the response id returned to the client (`chatcmpl-…` or `cmpl-…`).
    GEN_AI_RESPONSE_ID = "gen_ai.response.id", "string", "";
    /// Request span: the model that served the request.
    GEN_AI_RESPONSE_MODEL = "gen_ai.response.model", "string", "";
    /// Request span: finish reasons, one per choice (`stop`, `length`, `cancelled`, `error`).
    GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons", "string[]", "";
    /// Request span: prompt tokens (`usage.prompt_tokens`).
    GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens", "int", "{token}";
    /// Request span: completion tokens (`usage.completion_tokens`).
    GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens", "int", "{token}";
    /// Request span: prompt tokens served from the KV cache (`usage.prompt_tokens_details.cached_tokens`).
    GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS = "gen_ai.usage.cache_read.input_tokens", "int", "{token}";
    /// Request span: generated tokens inside the reasoning block (`<think>` to `</think>`, both tags included), over all choices (`usage.completion_tokens_details.reasoning_tokens`). Only on chats whose template is a thinking template.
    GEN_AI_USAGE_REASONING_OUTPUT_TOKENS = "gen_ai.usage.reasoning.output_tokens", "int", "{token}";

    /// Request span: the conversation (session) the turn belongs to, however its key was found (`slotlight.session.source`): the `x-session-id` header, the Responses `conversation`, the session of a `previous_response_id` chain, `prompt_cache_key`, the Messages `metadata.user_id` (Claude Code's `session_id`), the `user` field, or an engine-made id for a prompt that extends the whole of an earlier turn. Also on every child span, which the sidecar keys by it.
    GEN_AI_CONVERSATION_ID = "gen_ai.conversation.id", "string", "";
    /// Request span: the same session id as `gen_ai.conversation.id`, under the key OpenInference (Arize Phoenix) and Langfuse group traces into sessions by.
    SESSION_ID = "session.id", "string", "";
    /// Request span of a turn with a session: how its key was found: `header` (`x-session-id`), `conversation` (Responses `conversation`), `response_chain` (the session of the `previous_response_id` chain), `prompt_cache_key`, `metadata` (Messages `metadata.user_id`, its `session_id` when it holds Claude Code's JSON), `user` (`user`, else `safety_identifier`), or `found` (no key: the prompt extends the whole of an earlier turn, prompt and reply, and joins that turn's session under an engine-made id).
    SESSION_SOURCE = "slotlight.session.source", "string", "";
    /// Request span of a turn with a session: the turn's index in its session, from 0, in the order the engine received the session's turns (restarts at 0 for a session the engine no longer remembers, `--max-sessions`).
    SESSION_TURN = "slotlight.session.turn", "int", "";
    /// Request span of the second turn of a found session (`slotlight.session.source` `found`, `slotlight.session.turn` 1): the request id of the earlier turn, sent without a key, whose whole prompt and reply its prompt extends: that turn is the session's turn 0 (the sidecar files it under the session).
    SESSION_EXTENDS = "slotlight.session.extends", "string", "";
    /// Request span of a turn with a session: the branch of the session the turn extends or starts, numbered in the order the session's branches began (0: its first conversation). A keyed turn whose prompt does not begin with the whole prompt of the session's main conversation's last turn starts a branch of its own (a side call: titles, topics, quota checks under the main conversation's key); a turn that extends a side branch continues it, and makes it the main conversation when the main one had no turn since that branch began.
    SESSION_BRANCH = "slotlight.session.branch", "int", "";
    /// Request span of a turn with a session: whether the turn is a side call, its branch not the session's main conversation. A side call neither replaces the main conversation's remembered last turn (the next turn is still compared with it) nor its kept KV; the sidecar counts side calls per session (`side_calls`).
    SESSION_SIDE_CALL = "slotlight.session.side_call", "bool", "";
    /// Request span of a served turn with a session: how long after the turn's end the engine keeps the session's KV ahead of other cached prefixes (`--session-kv-ttl`, or the request's own TTL within `--session-kv-ttl-max`); 0 when it keeps none. For a side call (`slotlight.session.side_call`), what is left of the main conversation's keeping. The sidecar counts the session live until then.
    SESSION_KV_TTL_MS = "slotlight.session.kv_ttl_ms", "double", "ms";
    /// Request span (refusals too): the API the request came through: `chat.completions`, `completions`, `responses` (OpenAI Responses) or `messages` (Anthropic Messages). Every API takes the one request path; only the wire format differs.
    API = "slotlight.api", "string", "";
    /// Request span: the types of tools the request offered that the engine cannot run (hosted tools such as `web_search`, Codex's `namespace`), accepted and left out of the prompt.
    TOOLS_SKIPPED = "slotlight.tools.skipped", "string[]", "";
    /// Request span: the completion token limit the client asked for, when it was more than the engine allows (`--max-tokens-limit`, or what the context leaves) and was clamped to `gen_ai.request.max_tokens` (the Messages API's `max_tokens` is required and clients ask for more than a local model's context).
    REQUEST_MAX_TOKENS_ASKED = "slotlight.request.max_tokens_asked", "int", "{token}";
    /// Request span: the host name the client addressed (its `Host` header), else the address the engine listens on.
    SERVER_ADDRESS = "server.address", "string", "";
    /// Request span: the port the client addressed (its `Host` header), else the port the engine listens on.
    SERVER_PORT = "server.port", "int", "";

    /// Request span (vLLM's meaning): arrival to first token, wall clock, seconds. Absent without a token.
    GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN = "gen_ai.latency.time_to_first_token", "double", "s";
    /// Request span (vLLM's meaning): arrival to finish, wall clock, seconds.
    GEN_AI_LATENCY_E2E = "gen_ai.latency.e2e", "double", "s";
    /// Request span (vLLM's meaning): arrival to admission (first scheduled), wall clock, seconds. Absent when never admitted.
    GEN_AI_LATENCY_TIME_IN_QUEUE = "gen_ai.latency.time_in_queue", "double", "s";
    /// Request span (vLLM's meaning): admission (first scheduled) to first token, wall clock, seconds. Not device time: that is `slotlight.usage.prefill_ms`.
    GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL = "gen_ai.latency.time_in_model_prefill", "double", "s";
    /// Request span (vLLM's meaning): first token to last token, wall clock, seconds. Not device time: that is `slotlight.usage.decode_ms`.
    GEN_AI_LATENCY_TIME_IN_MODEL_DECODE = "gen_ai.latency.time_in_model_decode", "double", "s";
    /// Request span (vLLM's meaning): admission (first scheduled) to finish, wall clock, seconds.
    GEN_AI_LATENCY_TIME_IN_MODEL_INFERENCE = "gen_ai.latency.time_in_model_inference", "double", "s";

    /// Why the request failed, was refused or was cancelled; one of the `ERROR_*` values (`cancelled`, `validation`, `context_length`, `overloaded`, `shutdown`, `not_found`, `too_large`, `timeout`, `unauthorized`, `kv_cache_exhausted`, `internal`). Set with an error status.
    ERROR_TYPE = "error.type", "string", "";

    /// `slotlight.startup.model`: the architecture family the engine runs the model as (`llama`, `qwen2`, `qwen3`, `gemma2`, `gemma3`). Also in `/health` and `bench --json` (`model_info.arch`).
    MODEL_ARCH = "slotlight.model.arch", "string", "";
    /// `slotlight.startup.model`: the distinct types of the model's matrices, comma-separated in name order (e.g. `Q4_K,Q5_0,Q6_K,Q8_0`). Also in `/health` and `bench --json` (`model_info.weight_types`, a list).
    MODEL_WEIGHT_TYPES = "slotlight.model.weight_types", "string", "";
    /// `slotlight.startup.model`: the context length the model was trained for (its metadata; `--ctx-size` may serve less). Also in `/health` and `bench --json` (`model_info.context_length`).
    MODEL_CONTEXT_LENGTH = "slotlight.model.context_length", "int", "{token}";

    /// All request spans and their children: the engine's request id (also the response id).
    REQUEST_ID = "slotlight.request.id", "string", "";
    /// Request, leg and decode spans: the request's own arrival time. Never reset by a move.
    REQUEST_START_TIME = "slotlight.request.start_time_unix_nano", "int", "ns";
    /// Request, leg and decode spans: when the request's first token was produced (absent before it).
    REQUEST_FIRST_TOKEN_TIME = "slotlight.request.first_token_time_unix_nano", "int", "ns";
    /// Request span: how many legs the request had.
    REQUEST_LEGS = "slotlight.request.legs", "int", "";
    /// Request span: whether the request moved between paths (solo to slot or back).
    REQUEST_MOVED = "slotlight.request.moved", "bool", "";
    /// Request span: how the request ended (`ok`, `cancelled`, `refused`, `error`).
    REQUEST_STATUS = "slotlight.request.status", "string", "";
    /// Store span: the Responses store's backend (`sqlite`, `memory`, `redis`).
    STORE_BACKEND = "slotlight.store.backend", "string", "";
    /// Store span: whether the response was saved. When it was not (the backend failed; its error is the span's status message and `error.type` is `store_failed`), the response was still returned, with `store: false`, and a later `previous_response_id` to it is a 404.
    STORE_STORED = "slotlight.store.stored", "bool", "";
    /// Request span: the share of request traces the engine's sampler keeps, from 0 to 1 (`OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`; 1 by default). Spans of the other requests never leave the engine, so the sidecar's views and metrics count the sampled requests only; the engine's own metrics count all of them.
    TRACE_SAMPLING_RATIO = "slotlight.trace.sampling_ratio", "double", "1";
    /// Request span: the engine process that served the request (its resource's `service.instance.id`), so a trace read without its resource (or a backend that shows span attributes only) still names the replica.
    ENGINE_INSTANCE = "slotlight.engine.instance", "string", "";
    /// Request span: the engine's data-parallel rank (`--data-parallel-rank`, 0 by default), the rank its KV-cache events state.
    ENGINE_DATA_PARALLEL_RANK = "slotlight.engine.data_parallel_rank", "int", "";
    /// Event on a request span (a warning or error logged while serving the request; the event's name is the log message, its other attributes the log line's fields) or on an operational span: the log level (`WARN`, `ERROR`).
    EVENT_LEVEL = "level", "string", "";
    /// Event on a request or operational span: the log target (the module that logged it).
    EVENT_TARGET = "target", "string", "";

    /// Request span (same as `usage.queue_ms`): arrival to admission, wall clock. Absent when the request was never admitted.
    USAGE_QUEUE_MS = "slotlight.usage.queue_ms", "double", "ms";
    /// Request span (same as `usage.prefill_ms`): device time, the sum of the prefill forward steps the request took part in (every prefill, a cut one included; equals the sum of its prefill spans' `slotlight.prefill.device_ms`). Absent without a prefill step.
    USAGE_PREFILL_MS = "slotlight.usage.prefill_ms", "double", "ms";
    /// Request span (same as `usage.ttft_ms`): arrival to first token produced, wall clock. Absent without a token.
    USAGE_TTFT_MS = "slotlight.usage.ttft_ms", "double", "ms";
    /// Request span (same as `usage.decode_ms`): device time, the sum of the decode forward steps the request took part in. Absent without a decode step.
    USAGE_DECODE_MS = "slotlight.usage.decode_ms", "double", "ms";
    /// Request span (same as `usage.generation_ms`): first token to last token, wall clock. Absent without a token.
    USAGE_GENERATION_MS = "slotlight.usage.generation_ms", "double", "ms";
    /// Request span (same as `usage.decode_tps`): tokens produced by decode steps per second of `decode_ms`: numerator and denominator cover the same steps (a plain decode step produces one token of the request, a verification step of a draft the draft tokens taken and one more); a token a prefill produces (the first, or one after a preemption's re-prefill) is in neither. Absent without a decode step.
    USAGE_DECODE_TPS = "slotlight.usage.decode_tps", "double", "{token}/s";
    /// Request span (same as `usage.e2e_ms`): arrival to finish, wall clock.
    USAGE_E2E_MS = "slotlight.usage.e2e_ms", "double", "ms";
    /// Request span: how the request was drafted for (speculative decoding): `ngram` (from its own prompt and reply), `prediction` (from the client's `prediction`, and from the prompt and reply where it has nothing to offer when the engine drafts from them too) or `off` (no drafts: `--speculative off` and no prediction).
    SPECULATION = "slotlight.speculation", "string", "";
    /// Request span (same as `usage.drafts`): verification steps with a draft, over all choices. Each is one decode step: its device time is in `slotlight.usage.decode_ms` once.
    USAGE_DRAFTS = "slotlight.usage.drafts", "int", "{draft}";
    /// Request span (same as `usage.drafted_tokens`): draft tokens verified, over all choices; `slotlight.usage.drafted_tokens` − `slotlight.usage.accepted_tokens` is `usage.completion_tokens_details.rejected_prediction_tokens`.
    USAGE_DRAFTED_TOKENS = "slotlight.usage.drafted_tokens", "int", "{token}";
    /// Request span (same as `usage.accepted_tokens` and `usage.completion_tokens_details.accepted_prediction_tokens`): draft tokens taken as the model's own, over all choices (each is one of `gen_ai.usage.output_tokens`).
    USAGE_ACCEPTED_TOKENS = "slotlight.usage.accepted_tokens", "int", "{token}";
    /// Request span: prompt tokens actually computed (prompt − cached, plus any re-prefill). Every prefill rate slotlight shows (the sidecar's `prefill_tps`, llama.cpp `timings.prompt_per_second`, `generate`'s prefill figure) is these tokens per second of prefill: tokens reused from the cache are never counted.
    USAGE_PREFILLED_TOKENS = "slotlight.usage.prefilled_tokens", "int", "{token}";
    /// Request span: whether the turn reused its conversation's KV and, if not, why: `first` (no earlier turn of the session remembered), `full` (everything reusable was reused, to block granularity), `diverged` (the prompt departs from the last turn), `evicted` (blocks of the reusable prefix had been reclaimed while the session's KV was kept, or with no keeping at all), `expired` (they had been reclaimed after the session's KV stopped being kept: the turn came later than `slotlight.session.kv_ttl_ms` after the last), `other_group` (the session's KV lives in another slot group); without a session `none` or `prefix` (a prefix shared with any earlier request was reused). Decided at admission from the session's remembered last turn and what the prefix cache gave; absent for a request never admitted.
    RESUME = "slotlight.resume", "string", "";
    /// Request span: tokens the prompt has in common with the session's remembered last turn (its prompt and the reply tokens whose KV was computed): what could have been reused. Absent without a remembered turn.
    RESUME_REUSABLE_TOKENS = "slotlight.resume.reusable_tokens", "int", "{token}";
    /// Request span: the token index where the prompt departs from the session's last turn (`diverged`, and `evicted` when the history changed too).
    RESUME_DIVERGED_AT = "slotlight.resume.diverged_at", "int", "{token}";
    /// Request span (`evicted`, `expired`): reusable tokens, to block granularity, whose KV blocks had been reclaimed by other traffic.
    RESUME_EVICTED_TOKENS = "slotlight.resume.evicted_tokens", "int", "{token}";

    /// Queue, leg and decode spans: `solo` or `slot`.
    LEG_PATH = "slotlight.leg.path", "string", "";
    /// Queue, leg and decode spans on the slot path: the slot index within its group. Absent on the solo path.
    SLOT_INDEX = "slotlight.slot.index", "int", "";
    /// Queue, leg, decode and request spans: the device group (0 on one device).
    SLOT_GROUP = "slotlight.slot.group", "int", "";
    /// Leg and decode spans: the leg's index within its request, from 0.
    LEG_INDEX = "slotlight.leg.index", "int", "";
    /// Leg and decode spans: when the leg started.
    LEG_START_TIME = "slotlight.leg.start_time_unix_nano", "int", "ns";
    /// Leg and decode spans: reply tokens the request carried into this leg.
    LEG_TOKENS_CARRIED = "slotlight.leg.tokens_carried", "int", "{token}";
    /// Leg span: tokens generated during this leg.
    LEG_TOKENS_GENERATED = "slotlight.leg.tokens_generated", "int", "{token}";
    /// Leg span: the largest batch among the forward steps of this leg.
    LEG_BATCH_SIZE_MAX = "slotlight.leg.batch_size.max", "int", "";
    /// Leg span: the mean batch size over the forward steps of this leg.
    LEG_BATCH_SIZE_MEAN = "slotlight.leg.batch_size.mean", "double", "";
    /// Leg span: time inside the forward steps of this leg.
    LEG_DEVICE_MS = "slotlight.leg.device_ms", "double", "ms";
    /// Leg span: draft tokens verified during this leg (speculative decoding).
    LEG_DRAFTED_TOKENS = "slotlight.leg.drafted_tokens", "int", "{token}";
    /// Leg span: of those, draft tokens taken; over `slotlight.leg.drafted_tokens`, the leg's acceptance rate.
    LEG_ACCEPTED_TOKENS = "slotlight.leg.accepted_tokens", "int", "{token}";
    /// Leg span: why the leg ended (`moved`, `finished`, `preempted`, `cancelled`).
    LEG_END_REASON = "slotlight.leg.end_reason", "string", "";

    /// Prefill span and its progress windows: the prompt's tokens (or prompt plus reply so far, for a re-prefill): llama.cpp's `prompt_progress.total`.
    PREFILL_PROMPT_TOKENS = "slotlight.prefill.prompt_tokens", "int", "{token}";
    /// Prefill span and its progress windows: tokens reused from the KV cache (llama.cpp's `prompt_progress.cache`).
    PREFILL_CACHED_TOKENS = "slotlight.prefill.cached_tokens", "int", "{token}";
    /// Prefill span: tokens computed by this prefill.
    PREFILL_COMPUTED_TOKENS = "slotlight.prefill.computed_tokens", "int", "{token}";
    /// Prefill span: the number of chunks the prefill was split into. Prefill window: chunks run so far, the window's last included.
    PREFILL_CHUNKS = "slotlight.prefill.chunks", "int", "";
    /// Prefill span: time inside the forward steps of this prefill. Prefill window: of this window's chunks only.
    PREFILL_DEVICE_MS = "slotlight.prefill.device_ms", "double", "ms";
    /// Prefill span: why it ran (`initial`, `preempted`).
    PREFILL_REASON = "slotlight.prefill.reason", "string", "";
    /// Prefill span: how it ended: `finished` (its last chunk produced a token), `preempted` (cut by a preemption; the request re-prefills later) or `cancelled` (the request was cancelled or failed first).
    PREFILL_END_REASON = "slotlight.prefill.end_reason", "string", "";
    /// Prefill window: positions of the prefill in the KV cache after the window's last chunk, the cached ones included (llama.cpp's `prompt_progress.processed`); it reaches `slotlight.prefill.prompt_tokens` with the last chunk. Tokens computed so far are this minus `slotlight.prefill.cached_tokens`.
    PREFILL_PROCESSED_TOKENS = "slotlight.prefill.processed_tokens", "int", "{token}";
    /// Prefill window: positions computed by the chunks of this window, for the window's own rate.
    PREFILL_WINDOW_TOKENS = "slotlight.prefill.window_tokens", "int", "{token}";
    /// Prefill window: when the prefill's first chunk started; the prefill's own rate is (processed − cached) over the time from here to `slotlight.prefill.last_chunk_time_unix_nano`.
    PREFILL_START_TIME = "slotlight.prefill.start_time_unix_nano", "int", "ns";
    /// Prefill window: when the window's last chunk's forward pass ended.
    PREFILL_LAST_CHUNK_TIME = "slotlight.prefill.last_chunk_time_unix_nano", "int", "ns";

    /// Decode span: tokens produced by decode steps in this window. A window holds only decode steps: the token a prefill produces is in none, and a leg's first window starts where its first decode step starts. A verification step (speculative decoding) produces the draft tokens taken and one more, so this may exceed `slotlight.decode.window_steps`.
    DECODE_WINDOW_TOKENS = "slotlight.decode.window_tokens", "int", "{token}";
    /// Decode span: tokens generated by the request so far, over all its legs.
    DECODE_TOKENS_GENERATED = "slotlight.decode.tokens_generated", "int", "{token}";
    /// Decode span: when the window's last token was produced.
    DECODE_LAST_TOKEN_TIME = "slotlight.decode.last_token_time_unix_nano", "int", "ns";
    /// Decode span: decode steps in this window (a verification step of a draft is one step).
    DECODE_WINDOW_STEPS = "slotlight.decode.window_steps", "int", "{step}";
    /// Decode span: draft tokens verified in this window's steps.
    DECODE_DRAFTED_TOKENS = "slotlight.decode.drafted_tokens", "int", "{token}";
    /// Decode span: of those, draft tokens taken; over `slotlight.decode.drafted_tokens`, the window's acceptance rate.
    DECODE_ACCEPTED_TOKENS = "slotlight.decode.accepted_tokens", "int", "{token}";
    /// Decode span: time inside the decode forward steps of this window (never a prefill step).
    DECODE_DEVICE_MS = "slotlight.decode.device_ms", "double", "ms";

    /// Request span: `json` when the reply is constrained to JSON (`response_format` `json_object` or `json_schema`, or a JSON schema through a vendor field).
    GEN_AI_OUTPUT_TYPE = "gen_ai.output.type", "string", "";
    /// Queue, prefill, leg and decode spans: which choice of the request (`n`) the span belongs to, from 0. Leg indices count per choice.
    CHOICE_INDEX = "slotlight.choice.index", "int", "";

    /// Request span of a constrained request: the kind of constraint (`json_object`, `json_schema`, `regex`, `choice`, `grammar`, `tools`). Never the schema or grammar itself.
    CONSTRAINT_KIND = "slotlight.constraint.kind", "string", "";
    /// Request span of a constrained request: time spent computing token masks, over all choices (computed beside the forward step, so a slow grammar shows here before it shows in step times).
    CONSTRAINT_MASK_MS = "slotlight.constraint.mask_ms", "double", "ms";
    /// Request span of a constrained request: token masks computed, over all choices.
    CONSTRAINT_MASKS = "slotlight.constraint.masks", "int", "";
    /// Request span of a request with `tools`: the names of the tools offered.
    TOOLS_NAMES = "slotlight.tools.names", "string[]", "";
    /// Request span of a request with `tools`: `tool_choice` (`none`, `auto`, `required`, `function`).
    TOOLS_CHOICE = "slotlight.tools.choice", "string", "";
    /// Request span of a request with `tools`: the tool-call format (`hermes`, `llama3_json`, `generic`), chosen from the model's chat template.
    TOOLS_FORMAT = "slotlight.tools.format", "string", "";
    /// Request span of a request with `tools`: tool calls produced, over all choices. Their arguments are never recorded (only as `tool_call` parts of `gen_ai.output.messages`, with `--trace-content`).
    TOOLS_CALLS = "slotlight.tools.calls", "int", "";

    /// Request span, only with `--trace-content`: the chat history as a JSON array of messages in the GenAI input-messages structure (`role`, `parts` of `text`, `tool_call`, `tool_call_response` and `reasoning`); the leading system messages are in `gen_ai.system_instructions` instead. A completion's prompt is one `user` message.
    GEN_AI_INPUT_MESSAGES = "gen_ai.input.messages", "string", "";
    /// Request span, only with `--trace-content`: the reply as a JSON array of output messages, one per choice in choice order (`role` `assistant`, `parts` of `reasoning`, `text` and `tool_call`, and the choice's `finish_reason`).
    GEN_AI_OUTPUT_MESSAGES = "gen_ai.output.messages", "string", "";
    /// Request span, only with `--trace-content`, when the chat begins with system (or developer) messages: their text as a JSON array of `text` parts.
    GEN_AI_SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions", "string", "";
    /// Request span, only with `--trace-content`, of a request with `tools`: the tools offered, as a JSON array of `{type: "function", name, description, parameters}`.
    GEN_AI_TOOL_DEFINITIONS = "gen_ai.tool.definitions", "string", "";
}

/// Enumerated attribute values.
pub mod value {
    /// `service.name` of the engine.
    pub const SERVICE_NAME_ENGINE: &str = "slotlight-engine";

    /// `slotlight.api`: OpenAI chat completions (`POST /v1/chat/completions`).
    pub const API_CHAT_COMPLETIONS: &str = "chat.completions";
    /// `slotlight.api`: OpenAI legacy completions (`POST /v1/completions`).
    pub const API_COMPLETIONS: &str = "completions";
    /// `slotlight.api`: OpenAI Responses (`POST /v1/responses`).
    pub const API_RESPONSES: &str = "responses";
    /// `slotlight.api`: Anthropic Messages (`POST /v1/messages`).
    pub const API_MESSAGES: &str = "messages";
    /// `gen_ai.provider.name` of the engine.
    pub const PROVIDER: &str = "slotlight";
    /// `slotlight.leg.path` of the batch-1 solo path.
    pub const PATH_SOLO: &str = "solo";
    /// `slotlight.leg.path` of a batch slot.
    pub const PATH_SLOT: &str = "slot";

    /// `slotlight.leg.end_reason`: the request moved to another path.
    pub const LEG_END_MOVED: &str = "moved";
    /// `slotlight.leg.end_reason`: the request finished.
    pub const LEG_END_FINISHED: &str = "finished";
    /// `slotlight.leg.end_reason`: the request was preempted and went back to the queue.
    pub const LEG_END_PREEMPTED: &str = "preempted";
    /// `slotlight.leg.end_reason`: the request was cancelled or failed.
    pub const LEG_END_CANCELLED: &str = "cancelled";

    /// `slotlight.prefill.reason`: the request's prompt.
    pub const PREFILL_INITIAL: &str = "initial";
    /// `slotlight.prefill.reason`: prompt and reply recomputed after a preemption.
    pub const PREFILL_PREEMPTED: &str = "preempted";

    /// `slotlight.prefill.end_reason`: the last chunk ran and produced a token.
    pub const PREFILL_END_FINISHED: &str = "finished";
    /// `slotlight.prefill.end_reason`: a preemption cut the prefill short.
    pub const PREFILL_END_PREEMPTED: &str = "preempted";
    /// `slotlight.prefill.end_reason`: the request was cancelled or failed during the prefill.
    pub const PREFILL_END_CANCELLED: &str = "cancelled";

    /// `slotlight.request.status`: the request ran to its end (`stop` or `length`).
    pub const STATUS_OK: &str = "ok";
    /// `slotlight.request.status`: the client went away before the end.
    pub const STATUS_CANCELLED: &str = "cancelled";
    /// `slotlight.request.status`: answered with an error before it reached the scheduler's
    /// step loop (validation, overload, context length, shutdown).
    pub const STATUS_REFUSED: &str = "refused";
    /// `slotlight.request.status`: accepted, then failed (engine error, shutdown, lost).
    pub const STATUS_ERROR: &str = "error";

    /// `gen_ai.response.finish_reasons`: an end-of-sequence token or a stop string.
    pub const FINISH_STOP: &str = "stop";
    /// `gen_ai.response.finish_reasons`: `max_tokens` or the context was reached.
    pub const FINISH_LENGTH: &str = "length";
    /// `gen_ai.response.finish_reasons`: the client went away.
    pub const FINISH_CANCELLED: &str = "cancelled";
    /// `gen_ai.response.finish_reasons`: the engine failed or shut down.
    pub const FINISH_ERROR: &str = "error";
    /// `gen_ai.response.finish_reasons`: the reply is a call of one or more tools.
    pub const FINISH_TOOL_CALLS: &str = "tool_calls";

    /// `gen_ai.output.type`: JSON.
    pub const OUTPUT_TYPE_JSON: &str = "json";

    /// `slotlight.constraint.kind`: `response_format` `json_object`.
    pub const CONSTRAINT_JSON_OBJECT: &str = "json_object";
    /// `slotlight.constraint.kind`: a JSON schema.
    pub const CONSTRAINT_JSON_SCHEMA: &str = "json_schema";
    /// `slotlight.constraint.kind`: a regular expression.
    pub const CONSTRAINT_REGEX: &str = "regex";
    /// `slotlight.constraint.kind`: one of a list of strings.
    pub const CONSTRAINT_CHOICE: &str = "choice";
    /// `slotlight.constraint.kind`: a Lark grammar.
    pub const CONSTRAINT_GRAMMAR: &str = "grammar";
    /// `slotlight.constraint.kind`: a tool call enforced by `tool_choice` or by the generic tool format.
    pub const CONSTRAINT_TOOLS: &str = "tools";

    /// `slotlight.tools.choice`: no tool may be called.
    pub const TOOL_CHOICE_NONE: &str = "none";
    /// `slotlight.tools.choice`: the model chooses.
    pub const TOOL_CHOICE_AUTO: &str = "auto";
    /// `slotlight.tools.choice`: some tool must be called.
    pub const TOOL_CHOICE_REQUIRED: &str = "required";
    /// `slotlight.tools.choice`: one named function must be called.
    pub const TOOL_CHOICE_FUNCTION: &str = "function";

    /// `slotlight.tools.format`: `<tool_call>{...}</tool_call>` (Hermes, Qwen).
    pub const TOOL_FORMAT_HERMES: &str = "hermes";
    /// `slotlight.tools.format`: a bare `{"name": ..., "parameters": ...}` object (Llama 3.1).
    pub const TOOL_FORMAT_LLAMA3_JSON: &str = "llama3_json";
    /// `slotlight.tools.format`: tools described in a system message, the reply constrained to a JSON object of tool calls or an answer (templates without tool support).
    pub const TOOL_FORMAT_GENERIC: &str = "generic";

    /// `slotlight.resume`: the session's first turn (or one no longer remembered).
    pub const RESUME_FIRST: &str = "first";
    /// `slotlight.resume`: everything reusable was reused, to block granularity.
    pub const RESUME_FULL: &str = "full";
    /// `slotlight.resume`: the history changed; the prompt departs from the last turn.
    pub const RESUME_DIVERGED: &str = "diverged";
    /// `slotlight.resume`: blocks of the reusable prefix had been reclaimed.
    pub const RESUME_EVICTED: &str = "evicted";
    /// `slotlight.resume`: blocks of the reusable prefix had been reclaimed after the session's
    /// KV stopped being kept (the turn came after its TTL).
    pub const RESUME_EXPIRED: &str = "expired";
    /// `slotlight.resume`: the sliding-window layers' blocks a resume needs had been recycled
    /// while the full-attention KV of the whole reusable prefix was still there.
    pub const RESUME_WINDOW: &str = "window";
    /// `slotlight.resume`: the session's KV lives in another slot group.
    pub const RESUME_OTHER_GROUP: &str = "other_group";
    /// `slotlight.resume`: no session, nothing reused.
    pub const RESUME_NONE: &str = "none";
    /// `slotlight.resume`: no session; a prefix shared with an earlier request was reused.
    pub const RESUME_PREFIX: &str = "prefix";

    /// `slotlight.speculation`: drafts from the request's own prompt and reply.
    pub const SPECULATION_NGRAM: &str = "ngram";
    /// `slotlight.speculation`: drafts from the client's `prediction` first.
    pub const SPECULATION_PREDICTION: &str = "prediction";
    /// `slotlight.speculation`: no drafts.
    pub const SPECULATION_OFF: &str = "off";
    /// `slotlight.session.source`: the `x-session-id` header.
    pub const SESSION_SOURCE_HEADER: &str = "header";
    /// `slotlight.session.source`: the Responses API's `conversation`.
    pub const SESSION_SOURCE_CONVERSATION: &str = "conversation";
    /// `slotlight.session.source`: the session of the stored response a Responses request
    /// continues (`previous_response_id`).
    pub const SESSION_SOURCE_RESPONSE_CHAIN: &str = "response_chain";
    /// `slotlight.session.source`: `prompt_cache_key` (Codex sends its conversation id there).
    pub const SESSION_SOURCE_PROMPT_CACHE_KEY: &str = "prompt_cache_key";
    /// `slotlight.session.source`: the Messages API's `metadata.user_id` (Claude Code's
    /// `session_id` when it holds Claude Code's JSON object, else the string itself).
    pub const SESSION_SOURCE_METADATA: &str = "metadata";
    /// `slotlight.session.source`: the `user` field (else `safety_identifier`).
    pub const SESSION_SOURCE_USER: &str = "user";
    /// `slotlight.session.source`: no key; the prompt extends the whole of an earlier turn
    /// and joins its session under an engine-made id.
    pub const SESSION_SOURCE_FOUND: &str = "found";

    /// `error.type`: the client cancelled (disconnected).
    pub const ERROR_CANCELLED: &str = "cancelled";
    /// `error.type`: the request was invalid.
    pub const ERROR_VALIDATION: &str = "validation";
    /// `error.type`: prompt plus `max_tokens` exceed the context.
    pub const ERROR_CONTEXT_LENGTH: &str = "context_length";
    /// `error.type`: the queue was full.
    pub const ERROR_OVERLOADED: &str = "overloaded";
    /// `error.type`: the engine was shutting down.
    pub const ERROR_SHUTDOWN: &str = "shutdown";
    /// `error.type`: an internal failure.
    pub const ERROR_INTERNAL: &str = "internal";
    /// `error.type`: the model or route asked for does not exist.
    pub const ERROR_NOT_FOUND: &str = "not_found";
    /// `error.type`: the request body was over the size limit.
    pub const ERROR_TOO_LARGE: &str = "too_large";
    /// `error.type`: the request body did not arrive within the read timeout.
    pub const ERROR_TIMEOUT: &str = "timeout";
    /// `error.type`: the API key was missing or wrong.
    pub const ERROR_UNAUTHORIZED: &str = "unauthorized";
    /// `error.type`: the KV cache could not hold the request.
    pub const ERROR_KV_CACHE_EXHAUSTED: &str = "kv_cache_exhausted";
    /// `error.type`: the model's chat template failed (the server's fault, not the request's).
    pub const ERROR_TEMPLATE: &str = "template";
}
