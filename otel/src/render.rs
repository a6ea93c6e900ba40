//! Renders the contract as Markdown (`CONTRACT.md`).

use crate::{Entry, attr, metric, span};

fn table(out: &mut String, title: &str, intro: &str, entries: &[Entry], kind_header: &str) {
    out.push_str(&format!("## {title}\n\n{intro}\n\n"));
    out.push_str(&format!(
        "| name | {kind_header} | unit | meaning | constant |\n|---|---|---|---|---|\n"
    ));
    for e in entries {
        let unit = if e.unit.is_empty() { "" } else { e.unit };
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | `{}` |\n",
            e.name,
            e.kind,
            unit,
            e.doc.trim().replace('|', "\\|"),
            e.ident
        ));
    }
    out.push('\n');
}

fn list(out: &mut String, title: &str, items: &[(&str, &str)]) {
    out.push_str(&format!("## {title}\n\n| value | meaning |\n|---|---|\n"));
    for (value, meaning) in items {
        out.push_str(&format!("| `{value}` | {meaning} |\n"));
    }
    out.push('\n');
}

/// Renders the whole contract as Markdown; `CONTRACT.md` must equal this text.
pub fn render_contract() -> String {
    let mut out = String::new();
    out.push_str(
        "# The slotlight telemetry contract\n\n\
         <!-- Rendered from the slotlight-otel crate by `SLOTLIGHT_BLESS=1 cargo test -p slotlight-otel`; do not edit by hand. -->\n\n\
         Every span name, attribute key and metric name that `slotlight-engine` emits or \
         `slotlight-sidecar` reads. The constants live in the `slotlight-otel` crate and nothing \
         else spells them.\n\n\
         One request gives one trace: a request span `{operation} {model}` (kind SERVER) with \
         children `slotlight.queue`, one `slotlight.prefill` per prefill, one `slotlight.leg` per \
         leg (solo or slot), and `slotlight.decode` progress windows under each leg. Every timing \
         attribute comes from the request's own clocks, never from shared state; the request \
         span's `slotlight.usage.*` attributes equal the `usage` block of the HTTP response.\n\n",
    );
    table(
        &mut out,
        "Spans",
        "The request span's name is `chat {model}` or `text_completion {model}`.",
        span::ALL,
        "kind",
    );
    table(
        &mut out,
        "Attributes",
        "Times `*_time_unix_nano` are wall-clock nanoseconds since the Unix epoch; `*_ms` are milliseconds; `gen_ai.latency.*` are seconds. `gen_ai.latency.*` carry vLLM's meanings (wall-clock intervals between the request's own instants); device time (the sum of the forward steps a request took part in, each counted whole under batching) is only ever under `slotlight.*` keys (`slotlight.usage.prefill_ms`, `slotlight.usage.decode_ms`, `*.device_ms`). A value the request never had is left off, never written as 0.",
        attr::ALL,
        "type",
    );
    list(
        &mut out,
        "Attribute values",
        &[
            (
                attr::value::SERVICE_NAME_ENGINE,
                "`service.name` of the engine",
            ),
            (attr::value::PROVIDER, "`gen_ai.provider.name`"),
            (
                attr::value::API_CHAT_COMPLETIONS,
                "`slotlight.api`: OpenAI chat completions (`/v1/chat/completions`)",
            ),
            (
                attr::value::API_COMPLETIONS,
                "`slotlight.api`: OpenAI completions (`/v1/completions`)",
            ),
            (
                attr::value::API_RESPONSES,
                "`slotlight.api`: OpenAI Responses (`/v1/responses`)",
            ),
            (
                attr::value::API_MESSAGES,
                "`slotlight.api`: Anthropic Messages (`/v1/messages`)",
            ),
            (
                span::OPERATION_CHAT,
                "`gen_ai.operation.name` of chat completions",
            ),
            (
                span::OPERATION_TEXT_COMPLETION,
                "`gen_ai.operation.name` of text completions",
            ),
            (
                attr::value::PATH_SOLO,
                "`slotlight.leg.path`: the batch-1 solo path",
            ),
            (attr::value::PATH_SLOT, "`slotlight.leg.path`: a batch slot"),
            (
                attr::value::LEG_END_MOVED,
                "`slotlight.leg.end_reason`: moved to another path",
            ),
            (
                attr::value::LEG_END_FINISHED,
                "`slotlight.leg.end_reason`: the request finished",
            ),
            (
                attr::value::LEG_END_PREEMPTED,
                "`slotlight.leg.end_reason`: preempted, back to the queue",
            ),
            (
                attr::value::LEG_END_CANCELLED,
                "`slotlight.leg.end_reason`: cancelled or failed",
            ),
            (
                attr::value::PREFILL_INITIAL,
                "`slotlight.prefill.reason`: the prompt",
            ),
            (
                attr::value::PREFILL_PREEMPTED,
                "`slotlight.prefill.reason`: recomputed after a preemption",
            ),
            (
                attr::value::PREFILL_END_FINISHED,
                "`slotlight.prefill.end_reason`: its last chunk produced a token",
            ),
            (
                attr::value::PREFILL_END_PREEMPTED,
                "`slotlight.prefill.end_reason`: cut short by a preemption",
            ),
            (
                attr::value::PREFILL_END_CANCELLED,
                "`slotlight.prefill.end_reason`: the request was cancelled or failed first",
            ),
            (
                attr::value::STATUS_OK,
                "`slotlight.request.status`: ran to its end (`stop` or `length`)",
            ),
            (
                attr::value::STATUS_CANCELLED,
                "`slotlight.request.status`: the client went away",
            ),
            (
                attr::value::STATUS_REFUSED,
                "`slotlight.request.status`: answered with an error before reaching the step loop",
            ),
            (
                attr::value::STATUS_ERROR,
                "`slotlight.request.status`: accepted, then failed",
            ),
            (
                attr::value::FINISH_STOP,
                "`gen_ai.response.finish_reasons`: end of sequence or a stop string",
            ),
            (
                attr::value::FINISH_LENGTH,
                "`gen_ai.response.finish_reasons`: `max_tokens` or the context reached",
            ),
            (
                attr::value::FINISH_CANCELLED,
                "`gen_ai.response.finish_reasons`: the client went away",
            ),
            (
                attr::value::FINISH_ERROR,
                "`gen_ai.response.finish_reasons`: the engine failed or shut down",
            ),
            (
                attr::value::RESUME_FIRST,
                "`slotlight.resume`: the session's first turn (or one no longer remembered)",
            ),
            (
                attr::value::RESUME_FULL,
                "`slotlight.resume`: everything reusable was reused, to block granularity",
            ),
            (
                attr::value::RESUME_DIVERGED,
                "`slotlight.resume`: the history changed; the prompt departs from the last turn",
            ),
            (
                attr::value::RESUME_EVICTED,
                "`slotlight.resume`: blocks of the reusable prefix had been reclaimed",
            ),
            (
                attr::value::RESUME_EXPIRED,
                "`slotlight.resume`: blocks of the reusable prefix had been reclaimed after the session's KV stopped being kept (its TTL had passed)",
            ),
            (
                attr::value::RESUME_WINDOW,
                "`slotlight.resume`: the sliding-window layers' blocks a resume needs had been recycled while the full-attention KV of the whole reusable prefix was still there",
            ),
            (
                attr::value::RESUME_OTHER_GROUP,
                "`slotlight.resume`: the session's KV lives in another slot group",
            ),
            (
                attr::value::RESUME_NONE,
                "`slotlight.resume`: no session, nothing reused",
            ),
            (
                attr::value::RESUME_PREFIX,
                "`slotlight.resume`: no session; a prefix shared with an earlier request reused",
            ),
            (
                attr::value::SESSION_SOURCE_HEADER,
                "`slotlight.session.source`: the `x-session-id` header",
            ),
            (
                attr::value::SESSION_SOURCE_CONVERSATION,
                "`slotlight.session.source`: the Responses `conversation`",
            ),
            (
                attr::value::SESSION_SOURCE_RESPONSE_CHAIN,
                "`slotlight.session.source`: the session of the `previous_response_id` chain",
            ),
            (
                attr::value::SESSION_SOURCE_PROMPT_CACHE_KEY,
                "`slotlight.session.source`: `prompt_cache_key`",
            ),
            (
                attr::value::SESSION_SOURCE_METADATA,
                "`slotlight.session.source`: the Messages `metadata.user_id` (Claude Code's `session_id`)",
            ),
            (
                attr::value::SESSION_SOURCE_USER,
                "`slotlight.session.source`: `user` (else `safety_identifier`)",
            ),
            (
                attr::value::SESSION_SOURCE_FOUND,
                "`slotlight.session.source`: no key; the prompt extends the whole of an earlier turn (engine-made id)",
            ),
            (
                attr::value::FINISH_TOOL_CALLS,
                "`gen_ai.response.finish_reasons`: the reply calls tools",
            ),
            (attr::value::OUTPUT_TYPE_JSON, "`gen_ai.output.type`: JSON"),
            (
                attr::value::CONSTRAINT_JSON_OBJECT,
                "`slotlight.constraint.kind`: `response_format` `json_object`",
            ),
            (
                attr::value::CONSTRAINT_JSON_SCHEMA,
                "`slotlight.constraint.kind`: a JSON schema",
            ),
            (
                attr::value::CONSTRAINT_REGEX,
                "`slotlight.constraint.kind`: a regular expression",
            ),
            (
                attr::value::CONSTRAINT_CHOICE,
                "`slotlight.constraint.kind`: one of a list of strings",
            ),
            (
                attr::value::CONSTRAINT_GRAMMAR,
                "`slotlight.constraint.kind`: a Lark grammar",
            ),
            (
                attr::value::CONSTRAINT_TOOLS,
                "`slotlight.constraint.kind`: a tool call (enforced by `tool_choice` or the generic tool format)",
            ),
            (
                attr::value::TOOL_CHOICE_NONE,
                "`slotlight.tools.choice`: no tool may be called",
            ),
            (
                attr::value::TOOL_CHOICE_AUTO,
                "`slotlight.tools.choice`: the model chooses",
            ),
            (
                attr::value::TOOL_CHOICE_REQUIRED,
                "`slotlight.tools.choice`: some tool must be called",
            ),
            (
                attr::value::TOOL_CHOICE_FUNCTION,
                "`slotlight.tools.choice`: one named function must be called",
            ),
            (
                attr::value::TOOL_FORMAT_HERMES,
                "`slotlight.tools.format`: `<tool_call>{...}</tool_call>` (Hermes, Qwen)",
            ),
            (
                attr::value::TOOL_FORMAT_LLAMA3_JSON,
                "`slotlight.tools.format`: a JSON object with `name` and `parameters` (Llama 3.1)",
            ),
            (
                attr::value::TOOL_FORMAT_GENERIC,
                "`slotlight.tools.format`: tools in a system message, reply constrained to JSON (any template)",
            ),
            (
                attr::value::ERROR_CANCELLED,
                "`error.type`: the client cancelled",
            ),
            (
                attr::value::ERROR_VALIDATION,
                "`error.type`: an invalid request",
            ),
            (
                attr::value::ERROR_CONTEXT_LENGTH,
                "`error.type`: prompt plus `max_tokens` exceed the context",
            ),
            (
                attr::value::ERROR_OVERLOADED,
                "`error.type`: the queue was full",
            ),
            (
                attr::value::ERROR_SHUTDOWN,
                "`error.type`: the engine was shutting down",
            ),
            (
                attr::value::ERROR_INTERNAL,
                "`error.type`: an internal failure",
            ),
            (
                attr::value::ERROR_NOT_FOUND,
                "`error.type`: no such model or route",
            ),
            (
                attr::value::ERROR_TOO_LARGE,
                "`error.type`: the body was over the size limit",
            ),
            (
                attr::value::ERROR_TIMEOUT,
                "`error.type`: the body did not arrive in time",
            ),
            (
                attr::value::ERROR_UNAUTHORIZED,
                "`error.type`: missing or wrong API key",
            ),
            (
                attr::value::ERROR_KV_CACHE_EXHAUSTED,
                "`error.type`: the KV cache could not hold the request",
            ),
            (
                attr::value::ERROR_TEMPLATE,
                "`error.type`: the model's chat template failed",
            ),
        ],
    );
    table(
        &mut out,
        "Metrics",
        "Served by the sidecar on `GET /metrics`, built from the spans it receives: with a trace sampler they count the sampled requests only (`slotlight_sidecar_trace_sampling_ratio` says the ratio each engine stated). The three `gen_ai_server_*` histograms are also served by the engine, over every request. No request ids appear in labels.",
        metric::ALL,
        "type",
    );
    table(
        &mut out,
        "Engine metrics",
        "Served by the engine on `GET /metrics` (and over OTLP with `OTEL_METRICS_EXPORTER=otlp`), counted where the work happens: exact whatever the trace sampler keeps. Per-group series carry `slot_group`. The engine also serves `gen_ai_server_time_to_first_token_seconds`, `gen_ai_server_time_per_output_token_seconds` and `gen_ai_server_request_duration_seconds` with the GenAI labels. `docs/configuration.md` maps each to its vLLM counterpart.",
        metric::engine::ALL,
        "type",
    );
    table(
        &mut out,
        "vLLM-compatible metrics",
        "Served by the engine on `GET /metrics` beside its own with `--metrics-compat vllm`, for the Kubernetes inference gateway's endpoint picker, which reads these names by default. Each carries `model_name` and mirrors `slotlight_engine_*` series of the same scrape (docs/metrics.md has the mapping and the picker's flags for reading slotlight's own names instead).",
        metric::vllm::ALL,
        "type",
    );
    table(
        &mut out,
        "OTLP metric names",
        "With `OTEL_METRICS_EXPORTER=otlp` the engine pushes the same instruments over OTLP: the GenAI histograms under their convention names below, its own under their exposition names less `_total`. Attributes are the Prometheus label names, except the GenAI ones and `error.type`, which keep the conventions' dotted keys (a collector's Prometheus exporter turns dots into underscores), so the collector serves the same series as `GET /metrics`.",
        metric::otlp::ALL,
        "type",
    );
    let labels = [
        metric::label::INSTANCE,
        metric::label::API,
        metric::label::GEN_AI_OPERATION_NAME,
        metric::label::GEN_AI_PROVIDER_NAME,
        metric::label::GEN_AI_REQUEST_MODEL,
        metric::label::GEN_AI_RESPONSE_MODEL,
        metric::label::ERROR_TYPE,
        metric::label::STATUS,
        metric::label::FINISH_REASON,
        metric::label::RESUME,
        metric::label::SLOT_GROUP,
        metric::label::PATH,
        metric::label::SLOT,
        metric::label::REASON,
        metric::label::SERVICE_NAME,
        metric::label::SPAN_NAME,
        metric::label::SPAN_KIND,
        metric::label::STATUS_CODE,
        metric::label::MODEL_NAME,
        metric::label::BLOCK_SIZE,
        metric::label::NUM_GPU_BLOCKS,
        metric::label::MAX_LORA,
        metric::label::RUNNING_LORA_ADAPTERS,
        metric::label::WAITING_LORA_ADAPTERS,
    ];
    out.push_str("## Metric labels\n\n");
    for l in labels {
        out.push_str(&format!("- `{l}`\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn contract_md_matches_the_crate() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/CONTRACT.md");
        let rendered = render_contract();
        if std::env::var_os("SLOTLIGHT_BLESS").is_some() {
            std::fs::write(path, &rendered).expect("write CONTRACT.md");
        }
        let on_disk = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            on_disk == rendered,
            "otel/CONTRACT.md is out of date: run `SLOTLIGHT_BLESS=1 cargo test -p slotlight-otel`"
        );
    }

    #[test]
    fn names_are_unique_and_well_formed() {
        let mut seen = HashSet::new();
        for e in span::ALL
            .iter()
            .chain(attr::ALL)
            .chain(metric::ALL)
            .chain(metric::engine::ALL)
        {
            assert!(seen.insert(e.name), "duplicate contract name {}", e.name);
            assert!(!e.doc.trim().is_empty(), "{} has no doc", e.ident);
            assert!(
                e.name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._".contains(c)),
                "{} is not lowercase dotted",
                e.name
            );
        }
        for m in metric::vllm::ALL {
            assert!(seen.insert(m.name), "duplicate contract name {}", m.name);
            let rest = m.name.strip_prefix("vllm:").expect("a vllm: name");
            assert!(
                rest.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "{} is not vLLM-shaped",
                m.name
            );
        }
        for m in metric::ALL.iter().chain(metric::engine::ALL) {
            assert!(
                !m.name.contains('.'),
                "metric {} must use underscores",
                m.name
            );
            if m.kind == "counter" {
                assert!(
                    m.name.ends_with("_total"),
                    "counter {} must end in _total",
                    m.name
                );
            }
        }
    }
}
