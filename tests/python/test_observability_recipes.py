"""The backend recipes under deploy/observability/ (docs/observability.md): every config
parses, and the fields each backend needs are there and wired:

- Langfuse: an OTLP/HTTP exporter with the Basic auth header and the ingestion-version header,
  in a traces pipeline that keeps the content;
- Datadog LLM Observability: OTLP http/protobuf to the site's intake with the API key and
  `dd-otlp-source: llmobs`;
- Grafana Tempo: the metrics-generator's span-metrics and service-graphs processors enabled,
  remote-writing to Prometheus, with buckets from milliseconds to ten minutes;
- Jaeger SPM: the collector's spanmetrics connector between a traces pipeline and a metrics
  pipeline that Prometheus scrapes and Jaeger queries, with explicit buckets from 5 ms to
  10 min (not the connector's 15 s default).

The recipes that reach outside services were not run here, only parsed and checked. With
`otelcol-contrib`, `tempo` or `promtool` on PATH, the configs are also validated by them
(skipped without them; promtool, which CI installs, is required under
SLOTLIGHT_REQUIRE_TOOLS=1).

Names come from otel/CONTRACT.md: this file spells no span name or attribute key of its own.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from deploy_support import ATTR, DEPLOY, REPO, missing, yaml_one

RECIPES = DEPLOY / "observability"
DOC = REPO / "docs" / "observability.md"
CONTENT_KEYS = {
    ATTR["GEN_AI_INPUT_MESSAGES"], ATTR["GEN_AI_OUTPUT_MESSAGES"],
    ATTR["GEN_AI_SYSTEM_INSTRUCTIONS"], ATTR["GEN_AI_TOOL_DEFINITIONS"],
}
TEN_MINUTES_S = 600.0


def collector(name: str) -> dict:
    return yaml_one(RECIPES / name / "otel-collector.yaml")


def traces_pipelines_to(cfg: dict, exporter: str) -> list[dict]:
    pipes = [p for n, p in cfg["service"]["pipelines"].items() if n.split("/")[0] == "traces" and exporter in p["exporters"]]
    assert pipes, f"no traces pipeline exports to {exporter}"
    return pipes


def deleted_keys(cfg: dict, pipeline: dict) -> set[str]:
    keys = set()
    for pid in pipeline.get("processors", []):
        if pid.split("/")[0] == "attributes":
            keys |= {a["key"] for a in cfg["processors"][pid].get("actions", []) if a.get("action") == "delete"}
    return keys


def go_duration_s(d: str) -> float:
    units = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)", d)
    assert parts and "".join(n + u for n, u in parts) == d, f"not a Go duration: {d!r}"
    return sum(float(n) * units[u] for n, u in parts)


def assert_llm_buckets(buckets_s: list[float], where: str):
    assert buckets_s == sorted(buckets_s) and len(set(buckets_s)) == len(buckets_s), f"{where}: {buckets_s}"
    assert buckets_s[0] <= 0.01, f"{where}: the first bucket must be in milliseconds, got {buckets_s[0]} s"
    assert buckets_s[-1] >= TEN_MINUTES_S, f"{where}: the last bucket must reach 10 min, got {buckets_s[-1]} s"
    # Enough resolution in between: TTFT (sub-second) and long generations (minutes).
    assert sum(1 for b in buckets_s if b < 1) >= 4 and sum(1 for b in buckets_s if b >= 60) >= 2, buckets_s


def port(endpoint: str) -> str:
    return endpoint.rsplit(":", 1)[1].split("/")[0]


def test_every_recipe_has_its_configs():
    for rel in ["langfuse/otel-collector.yaml", "datadog/otel-collector.yaml", "tempo/tempo.yaml",
                "tempo/otel-collector.yaml", "jaeger-spm/otel-collector.yaml", "jaeger-spm/jaeger.yaml",
                "jaeger-spm/prometheus.yml"]:
        assert isinstance(yaml_one(RECIPES / rel), dict), rel


def test_langfuse_gets_otlp_http_with_auth_and_ingestion_version():
    cfg = collector("langfuse")
    (eid, e), = [(k, v) for k, v in cfg["exporters"].items() if k.split("/")[0] == "otlphttp"]
    assert e["endpoint"] == "${env:LANGFUSE_OTLP_ENDPOINT}", e
    assert e.get("encoding", "proto") == "proto"
    h = e["headers"]
    assert re.fullmatch(r"Basic \$\{env:LANGFUSE_AUTH\}", h["Authorization"]), h
    assert h["x-langfuse-ingestion-version"] == "4", h
    for p in traces_pipelines_to(cfg, eid):
        # Langfuse shows the prompts and replies: the recipe must not strip them.
        assert not (deleted_keys(cfg, p) & CONTENT_KEYS), p


def test_datadog_gets_http_protobuf_with_llmobs_source_and_api_key():
    cfg = collector("datadog")
    (eid, e), = [(k, v) for k, v in cfg["exporters"].items() if k.split("/")[0] == "otlphttp"]
    assert e["encoding"] == "proto", e
    assert e["traces_endpoint"] == "https://otlp.${env:DD_SITE}/v1/traces", e
    assert e["headers"]["dd-otlp-source"] == "llmobs", e
    assert e["headers"]["dd-api-key"] == "${env:DD_API_KEY}", e
    for p in traces_pipelines_to(cfg, eid):
        assert not (deleted_keys(cfg, p) & CONTENT_KEYS), p


def test_tempo_metrics_generator_is_enabled_and_remote_writes():
    tempo = yaml_one(RECIPES / "tempo" / "tempo.yaml")
    gen = tempo["metrics_generator"]
    rw = gen["storage"]["remote_write"]
    assert rw and all(w["url"].startswith("http") and w["url"].endswith("/api/v1/write") for w in rw), rw
    procs = tempo["overrides"]["defaults"]["metrics_generator"]["processors"]
    assert {"span-metrics", "service-graphs"} <= set(procs), procs
    sm = gen["processor"]["span_metrics"]
    assert_llm_buckets([float(b) for b in sm["histogram_buckets"]], "tempo span_metrics")
    assert_llm_buckets([float(b) for b in gen["processor"]["service_graphs"]["histogram_buckets"]], "tempo service_graphs")
    assert set(sm["dimensions"]) <= set(ATTR.values()), sm["dimensions"]
    # The collector sends to Tempo's OTLP gRPC receiver, without the content.
    cfg = collector("tempo")
    grpc = tempo["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]
    (eid, e), = [(k, v) for k, v in cfg["exporters"].items() if k.split("/")[0] == "otlp"]
    assert port(e["endpoint"]) == port(grpc), (e, grpc)
    for p in traces_pipelines_to(cfg, eid):
        assert deleted_keys(cfg, p) >= CONTENT_KEYS, p


def test_jaeger_spm_spanmetrics_connector_has_llm_buckets_and_is_wired():
    cfg = collector("jaeger-spm")
    conn = cfg["connectors"]["spanmetrics"]
    buckets = [go_duration_s(b) for b in conn["histogram"]["explicit"]["buckets"]]
    assert_llm_buckets(buckets, "jaeger-spm spanmetrics")
    dims = [d["name"] for d in conn["dimensions"]]
    assert set(dims) <= set(ATTR.values()), dims
    pipes = cfg["service"]["pipelines"]
    assert any(n.startswith("traces") and "spanmetrics" in p["exporters"] for n, p in pipes.items()), pipes
    metrics = [p for n, p in pipes.items() if n.startswith("metrics") and "spanmetrics" in p["receivers"]]
    assert metrics and all("prometheus" in p["exporters"] for p in metrics), pipes
    for p in traces_pipelines_to(cfg, "otlp/jaeger"):
        assert deleted_keys(cfg, p) >= CONTENT_KEYS, p
    # Prometheus scrapes the exporter, and Jaeger reads Prometheus for the Monitor tab.
    prom = yaml_one(RECIPES / "jaeger-spm" / "prometheus.yml")
    targets = [t for j in prom["scrape_configs"] for sc in j["static_configs"] for t in sc["targets"]]
    assert port(cfg["exporters"]["prometheus"]["endpoint"]) in {port(t) for t in targets}, targets
    jaeger = yaml_one(RECIPES / "jaeger-spm" / "jaeger.yaml")
    ext = jaeger["extensions"]
    metrics_store = ext["jaeger_query"]["storage"]["metrics"]
    backend = ext["jaeger_storage"]["metric_backends"][metrics_store]["prometheus"]
    assert backend["endpoint"].startswith("http://prometheus:"), backend
    assert ext["jaeger_query"]["storage"]["traces"] in ext["jaeger_storage"]["backends"]
    for ext_id in jaeger["service"]["extensions"]:
        assert ext_id in ext, ext_id


def test_the_doc_covers_every_recipe_and_says_what_was_run():
    text = DOC.read_text()
    for rel in sorted(p.relative_to(REPO) for p in RECIPES.rglob("*") if p.is_file()):
        assert str(rel) in text, f"docs/observability.md does not mention {rel}"
    assert "images/phoenix-trace.png" in text and (REPO / "docs" / "images" / "phoenix-trace.png").exists()
    assert re.search(r"[Rr]un here", text) and re.search(r"only (parsed|validated)", text), \
        "the doc must say which recipes were run and which only validated"


def _env_for_validation() -> dict[str, str]:
    return dict(os.environ, LANGFUSE_OTLP_ENDPOINT="http://127.0.0.1:1/api/public/otel",
                LANGFUSE_AUTH="cGs6c2s=", DD_SITE="datadoghq.com", DD_API_KEY="x")


def test_collector_recipes_pass_otelcol_validate():
    otelcol = shutil.which("otelcol-contrib")
    if not otelcol:
        pytest.skip("otelcol-contrib is not installed: the collector recipes are only parsed and checked")
    for path in sorted(RECIPES.glob("*/otel-collector.yaml")):
        r = subprocess.run([otelcol, "validate", f"--config={path}"], capture_output=True, text=True,
                           env=_env_for_validation(), timeout=60)
        assert r.returncode == 0, f"{path.relative_to(REPO)}: {r.stderr}"


def test_tempo_recipe_passes_tempo_verify():
    tempo = shutil.which("tempo")
    if not tempo:
        pytest.skip("tempo is not installed: tempo.yaml is only parsed and checked")
    r = subprocess.run([tempo, f"-config.file={RECIPES / 'tempo' / 'tempo.yaml'}", "-config.verify"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_jaeger_spm_prometheus_config_passes_promtool():
    promtool = shutil.which("promtool")
    if not promtool:
        missing("promtool is not installed (Debian package `prometheus`)")
    r = subprocess.run([promtool, "check", "config", "--syntax-only", str(RECIPES / "jaeger-spm" / "prometheus.yml")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
