//! Span names.
//!
//! The request span follows the GenAI convention `{operation} {model}` (see
//! [`request_span_name`]); its children use dotted, lowercase, stable names.

crate::contract! {
    /// Arrival to admission: the time a request waited for a slot. Ends when the request is admitted to the solo path or a slot; carries the path, slot and group it was admitted to.
    QUEUE = "slotlight.queue", "span", "";
    /// One prefill: the prompt (or, after a preemption, the prompt plus the reply so far) computed into the KV cache, in one or more chunks. A re-prefill is a prefill span of its own.
    PREFILL = "slotlight.prefill", "span", "";
    /// One leg: a stretch of decoding on one path (`solo` or one `slot`). A request that moves from the solo path into a slot has two legs under the same request span; each leg links to the previous one.
    LEG = "slotlight.leg", "span", "";
    /// A prefill progress window, a child of a prefill span: the chunks run since the previous window (at most every `--progress-interval-ms`, and at the prefill's end). Each states where the prefill stands (prompt, cached and processed tokens) and when it started, so that live views show a long prefill advancing before its first token.
    PREFILL_WINDOW = "slotlight.prefill.window", "span", "";
    /// A decode progress window, a child of a leg. Ends at most every `--progress-interval-ms`; these windows are what keeps live views live, since OpenTelemetry exports a span only when it ends.
    DECODE = "slotlight.decode", "span", "";
    /// A Responses API response saved to the store (`store`, OpenAI's default), a child of its request span, from the request's end until the store answered: whether it was saved (`slotlight.store.stored`) and on which backend (`slotlight.store.backend`).
    STORE = "slotlight.store", "span", "";
    /// The engine's start-up, from before the model is read to the moment it listens (an operational span, a trace of its own; exported through the same tracer provider as the request spans).
    STARTUP = "slotlight.startup", "span", "";
    /// Start-up: mapping the model file and assembling its weights.
    STARTUP_MODEL = "slotlight.startup.model", "span", "";
    /// Start-up: building the tokenizer from the model's vocabulary and compiling its chat template.
    STARTUP_TOKENIZER = "slotlight.startup.tokenizer", "span", "";
    /// Start-up: building each device group's backend and allocating its KV cache.
    STARTUP_KV_CACHE = "slotlight.startup.kv_cache", "span", "";
    /// Start-up (CUDA only): compiling the device kernels for this model's shapes and weight formats (NVRTC) and loading them, one per device group, inside `slotlight.startup.kv_cache`.
    STARTUP_KERNEL_COMPILE = "slotlight.startup.kernel_compile", "span", "";
    /// Start-up: one forward step of one token per device group, so the first request does not pay for first use (thread pool start, device modules).
    STARTUP_WARMUP = "slotlight.startup.warmup", "span", "";
    /// The engine's shutdown, from the signal to the last telemetry flush (an operational span, a trace of its own).
    SHUTDOWN = "slotlight.shutdown", "span", "";
    /// Shutdown: in-flight requests finishing (cancelled at `--drain-timeout-s`).
    SHUTDOWN_DRAIN = "slotlight.shutdown.drain", "span", "";
    /// Shutdown: flushing spans and metrics to the collector.
    SHUTDOWN_TELEMETRY_FLUSH = "slotlight.shutdown.telemetry_flush", "span", "";
}

/// The `gen_ai.operation.name` of a chat completion request.
pub const OPERATION_CHAT: &str = "chat";
/// The `gen_ai.operation.name` of a text completion request.
pub const OPERATION_TEXT_COMPLETION: &str = "text_completion";

/// The `tracing` target of the engine's operational spans (start-up, shutdown): the spans of
/// this target, and warnings and errors logged inside them, go out through the tracer provider
/// as spans of their own traces. Here, below every engine layer, so that the model loader and
/// the backends can name it without reaching up to the telemetry setup.
pub const OPS_TARGET: &str = "slotlight::ops";

/// The name of the request (root) span: `{operation} {model}`, for example `chat SmolLM2-135M-Instruct`.
pub fn request_span_name(operation: &str, model: &str) -> String {
    format!("{operation} {model}")
}

/// True when `name` is the name of a request span (`chat …` or `text_completion …`).
pub fn is_request_span_name(name: &str) -> bool {
    [OPERATION_CHAT, OPERATION_TEXT_COMPLETION]
        .iter()
        .any(|op| {
            name.strip_prefix(op)
                .is_some_and(|rest| rest.starts_with(' ') && rest.len() > 1)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_span_names_round_trip() {
        assert_eq!(request_span_name(OPERATION_CHAT, "m"), "chat m");
        assert!(is_request_span_name("chat m"));
        assert!(is_request_span_name("text_completion SmolLM2"));
        assert!(!is_request_span_name("chat"));
        assert!(!is_request_span_name("chatty m"));
        assert!(!is_request_span_name(LEG));
    }
}
