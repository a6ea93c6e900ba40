"""Checks of deploy/ that need neither Docker nor a cluster.

- every YAML (multi-document) and JSON file under deploy/ parses;
- `promtool check config deploy/prometheus/prometheus.yml` passes (a missing promtool fails the test
  when SLOTLIGHT_REQUIRE_TOOLS=1, as in CI, and skips it otherwise);
- every metric the Grafana dashboard queries appears, with the labels the queries use, in a
  real scrape of a running sidecar fed engine-shaped spans (OpenTelemetry Python SDK over
  OTLP/gRPC), or, for the engine's own saturation panels, of a running engine (with the
  default model; skipped without it unless SLOTLIGHT_REQUIRE_MODEL=1), and histogram panels
  with exemplars get trace-id exemplars under the label the Grafana data source links to
  Jaeger;
- Prometheus scrapes the engine's /metrics and the sidecar's; the collector's metrics pipeline
  reaches Prometheus; the Kubernetes autoscaling example scales the engine on its queue gauge;
- every span name and attribute key the collector configs match on is in otel/CONTRACT.md;
- compose services, Kubernetes manifests and Dockerfiles reference files, flags, services and
  ports that exist.

Names come from otel/CONTRACT.md (rendered from the slotlight-otel crate): this file spells
no span name, attribute key or metric name of its own.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from procs import stop_process
from deploy_support import (
    ALERTS,
    ALERT_TESTS,
    ATTR,
    COLLECTOR,
    COMPOSE,
    DASHBOARDS,
    DEPLOY,
    ENGINE_METRIC,
    ENGINE_SERVICE,
    K8S,
    METRIC,
    METRIC_LABELS,
    OP_CHAT,
    PATH_SLOT,
    PATH_SOLO,
    PROMETHEUS,
    PROVIDER,
    PROVISIONING,
    REPO,
    SPAN,
    binary,
    compose,
    compose_args,
    containers,
    deploy_files,
    flag_value,
    flags,
    help_flags,
    is_contract_span_name,
    k8s_objects,
    k8s_resources,
    missing,
    pod_spec,
    sidecar_bin,
    yaml_docs,
    yaml_one,
)


# --- PromQL --------------------------------------------------------------------------------

_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
    "bool", "offset", "inf", "nan", "atan2",
}
_IDENT = r"[a-zA-Z_:][a-zA-Z0-9_:]*"


def _grafana_vars(expr: str) -> str:
    expr = re.sub(r"\$__(rate_interval|interval|range)\b", "5m", expr)
    return re.sub(r"\$\{?(\w+)(:\w+)?\}?", "VAR", expr)


def promql_selectors(expr: str) -> list[tuple[str, dict[str, str | None]]]:
    """(metric name, {label: literal value of an `=` matcher, else None}) for every vector
    selector in `expr`."""
    expr = _grafana_vars(expr)
    out = []
    names_only = promql_metric_names(expr)
    for m in re.finditer(rf"(?<![\w:.$])({_IDENT})\s*\{{([^}}]*)\}}", expr):
        if m.group(1) in names_only:
            matchers = {}
            for lbl, op, val in re.findall(rf'({_IDENT})\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"', m.group(2)):
                matchers[lbl] = val if op == "=" and val != "VAR" else None
            out.append((m.group(1), matchers))
    for n in names_only:
        if not any(n == s for s, _ in out):
            out.append((n, {}))
    return out


def promql_metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (functions, keywords, labels and numbers removed)."""
    e = _grafana_vars(expr)
    e = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', e)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    names = set()
    for m in re.finditer(rf"(?<![\w:.$])({_IDENT})(\s*\()?", e):
        word, call = m.group(1), m.group(2)
        if call or word.lower() in _KEYWORDS or word == "VAR":
            continue
        names.add(word)
    return names


def promql_grouping_labels(expr: str) -> set[str]:
    out = set()
    for m in re.finditer(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", expr):
        out.update(x.strip() for x in m.group(1).split(",") if x.strip())
    return out


def dashboard_queries() -> list[dict]:
    """Every PromQL query of every dashboard: panel targets and template variables."""
    out = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        dash = json.loads(path.read_text())
        panels = list(dash.get("panels", []))
        for p in list(panels):
            panels.extend(p.get("panels", []))
        for p in panels:
            for t in p.get("targets", []):
                if t.get("expr"):
                    out.append({"where": f"{path.name}: panel {p.get('title')!r} {t.get('refId')}",
                                "expr": t["expr"], "legend": t.get("legendFormat", ""),
                                "exemplar": bool(t.get("exemplar")), "panel": p})
        for v in dash.get("templating", {}).get("list", []):
            if v.get("type") != "query":
                continue
            q = v.get("query")
            q = q.get("query", "") if isinstance(q, dict) else (q or "")
            m = re.fullmatch(r"\s*label_values\((.*),\s*(" + _IDENT + r")\s*\)\s*", q)
            assert m, f"{path.name}: variable {v.get('name')}: expected label_values(selector, label), got {q!r}"
            out.append({"where": f"{path.name}: variable {v.get('name')}", "expr": m.group(1),
                        "legend": "{{" + m.group(2) + "}}", "exemplar": False, "panel": None})
    return out


# --- exposition ----------------------------------------------------------------------------


class Scrape:
    """A parsed Prometheus / OpenMetrics text exposition."""

    def __init__(self, text: str):
        self.text = text
        self.types: dict[str, str] = {}
        self.labels: dict[str, set[str]] = {}  # sample name -> label names seen
        self.exemplars: dict[str, list[tuple[str, str]]] = {}  # sample name -> (label, value)
        self.totals: dict[str, float] = {}  # sample name -> sum over its series
        self.values: dict[tuple[str, str], set[str]] = {}  # (sample name, label) -> values seen
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                _, _, fam, typ = line.split(" ", 3)
                self.types[fam] = typ.strip()
                continue
            if not line or line.startswith("#"):
                continue
            name, labels, rest = self._split(line)
            self.labels.setdefault(name, set()).update(labels)
            for k, v in labels.items():
                self.values.setdefault((name, k), set()).add(v)
            self.totals[name] = self.totals.get(name, 0.0) + float(rest.split()[0])
            if " # " in rest:
                ex = rest.split(" # ", 1)[1]
                self.exemplars.setdefault(name, []).extend(
                    re.findall(r'(' + _IDENT + r')="((?:[^"\\]|\\.)*)"', ex.split("}", 1)[0]))

    @staticmethod
    def _split(line: str) -> tuple[str, dict[str, str], str]:
        m = re.match(_IDENT, line)
        name, i = m.group(0), m.end()
        labels: dict[str, str] = {}
        if i < len(line) and line[i] == "{":
            j, quoted, esc = i + 1, False, False
            while j < len(line):
                c = line[j]
                if esc:
                    esc = False
                elif c == "\\":
                    esc = True
                elif c == '"':
                    quoted = not quoted
                elif c == "}" and not quoted:
                    break
                j += 1
            labels = dict(re.findall(r"(" + _IDENT + r')="((?:[^"\\]|\\.)*)"', line[i:j + 1]))
            i = j + 1
        return name, labels, line[i:]

    def histogram_family(self, sample: str) -> str | None:
        for suffix in ("_bucket", "_sum", "_count"):
            base = sample.removesuffix(suffix)
            if base != sample and self.types.get(base) == "histogram":
                return base
        return None


# --- a sidecar fed engine-shaped spans -----------------------------------------------------


class Sidecar:
    """The sidecar binary on loopback port 0; stopped by its own PID."""

    def __init__(self, tmp: Path):
        self.err_path = tmp / "sidecar.stderr"
        self.err = self.err_path.open("w")
        self.proc = subprocess.Popen(
            [str(sidecar_bin()), "--otlp-grpc", "127.0.0.1:0", "--otlp-http", "127.0.0.1:0",
             "--listen", "127.0.0.1:0", "--publish-interval-ms", "20", "--no-turn-log",
             "--turns-db", str(tmp / "turns.db")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.err)
        line = None
        for _ in range(1200):  # bounded: start-up, not speed
            text = self.err_path.read_text()
            line = next((x for x in text.splitlines() if "listening otlp_grpc=" in x), None)
            if line or self.proc.poll() is not None:
                break
            time.sleep(0.05)
        if not line:
            code = self.proc.poll()
            self.close()
            raise RuntimeError(f"{sidecar_bin()} did not start (exit status {code}; a stale build?): "
                               + self.err_path.read_text())
        addr = dict(re.findall(r"(\w+)=(\S+)", line))
        self.grpc, self.views = addr["otlp_grpc"], addr["views"]

    def close(self):
        stop_process(self.proc, timeout=10)
        self.err.close()

    def metrics(self, openmetrics: bool = False) -> str:
        headers = {"accept": "application/openmetrics-text; version=1.0.0"} if openmetrics else {}
        req = urllib.request.Request(f"http://{self.views}/metrics", headers=headers)
        with _NO_PROXY.open(req, timeout=10) as r:
            return r.read().decode()


MS = 1_000_000
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def engine_spans(instance: str, model: str):
    """Three requests as the engine would trace them, with explicit times.

    `done`: queued, prefilled (a third of the prompt cached), decoded on the solo path, moved
    into slot 0, finished. `live`: decoding in slot 1, its leg and request span still open
    (so only its queue, prefill and decode-window spans are exported). `refused`: answered 429
    by a full queue (a request span only, status `refused`).
    Returns (spans, trace id of `done` as hex).
    """
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON
    from opentelemetry.trace import Link, SpanKind

    mem = InMemorySpanExporter()
    provider = TracerProvider(
        sampler=ALWAYS_ON,
        resource=Resource({ATTR["SERVICE_NAME"]: ENGINE_SERVICE, ATTR["SERVICE_INSTANCE_ID"]: instance,
                           ATTR["SERVICE_VERSION"]: "0.0.0-deploy-check"}),
    )
    provider.add_span_processor(SimpleSpanProcessor(mem))
    tracer = provider.get_tracer(ENGINE_SERVICE)
    a = ATTR

    def place(slot):
        if slot is None:
            return {a["LEG_PATH"]: PATH_SOLO, a["SLOT_GROUP"]: 0}
        return {a["LEG_PATH"]: PATH_SLOT, a["SLOT_INDEX"]: slot, a["SLOT_GROUP"]: 0}

    def child(parent, name, start, end, attrs, links=()):
        s = tracer.start_span(name, context=trace.set_span_in_context(parent), start_time=start,
                              attributes=attrs, links=list(links))
        if end is not None:
            s.end(end_time=end)
        return s

    def request(rid, t0, first, slots, windows, finish):
        """slots: the place of each leg; windows: (start, end, tokens) per leg."""
        root = tracer.start_span(f"{OP_CHAT} {model}", kind=SpanKind.SERVER, start_time=t0,
                                 attributes={a["REQUEST_ID"]: rid})
        times = {a["REQUEST_ID"]: rid, a["REQUEST_START_TIME"]: t0, a["REQUEST_FIRST_TOKEN_TIME"]: first}
        admitted = t0 + 5 * MS
        child(root, SPAN["QUEUE"], t0, admitted, {a["REQUEST_ID"]: rid, **place(slots[0])})
        child(root, SPAN["PREFILL"], admitted, first, {
            a["REQUEST_ID"]: rid, a["PREFILL_PROMPT_TOKENS"]: 24, a["PREFILL_CACHED_TOKENS"]: 8,
            a["PREFILL_COMPUTED_TOKENS"]: 16, a["PREFILL_CHUNKS"]: 1, a["PREFILL_DEVICE_MS"]: 20.0})
        generated, prev, leg_start = 1, None, admitted
        for i, (slot, (w0, w1, n)) in enumerate(zip(slots, windows)):
            carried = generated
            leg = tracer.start_span(SPAN["LEG"], context=trace.set_span_in_context(root), start_time=leg_start,
                                    links=[Link(prev.get_span_context())] if prev else [])
            leg_attrs = {**times, **place(slot), a["LEG_INDEX"]: i, a["LEG_START_TIME"]: leg_start,
                         a["LEG_TOKENS_CARRIED"]: carried if i else 0}
            generated += n
            child(leg, SPAN["DECODE"], w0, w1, {
                **leg_attrs, a["DECODE_WINDOW_TOKENS"]: n, a["DECODE_TOKENS_GENERATED"]: generated,
                a["DECODE_LAST_TOKEN_TIME"]: w1, a["DECODE_DEVICE_MS"]: (w1 - w0) / MS})
            if finish is None:
                return root  # still decoding: leg and request span stay open
            leg.set_attributes({**leg_attrs, a["LEG_TOKENS_GENERATED"]: generated - carried,
                                a["LEG_BATCH_SIZE_MAX"]: 2, a["LEG_BATCH_SIZE_MEAN"]: 1.5,
                                a["LEG_DEVICE_MS"]: (w1 - w0) / MS,
                                a["LEG_END_REASON"]: "moved" if i + 1 < len(slots) else "finished"})
            leg.end(end_time=w1)
            prev, leg_start = leg, w1
        end = leg_start + 2 * MS
        root.set_attributes({
            **times,
            a["GEN_AI_OPERATION_NAME"]: OP_CHAT, a["GEN_AI_PROVIDER_NAME"]: PROVIDER,
            a["GEN_AI_REQUEST_MODEL"]: model, a["GEN_AI_RESPONSE_MODEL"]: model,
            a["GEN_AI_RESPONSE_FINISH_REASONS"]: (finish,),
            a["GEN_AI_USAGE_INPUT_TOKENS"]: 24, a["GEN_AI_USAGE_OUTPUT_TOKENS"]: generated,
            a["GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS"]: 8, a["USAGE_PREFILLED_TOKENS"]: 16,
            a["USAGE_QUEUE_MS"]: 5.0, a["USAGE_PREFILL_MS"]: 20.0, a["USAGE_TTFT_MS"]: (first - t0) / MS,
            a["USAGE_DECODE_MS"]: (leg_start - first) / MS, a["USAGE_GENERATION_MS"]: (leg_start - first) / MS,
            a["USAGE_DECODE_TPS"]: (generated - 1) / ((leg_start - first) / 1e9),
            a["USAGE_E2E_MS"]: (end - t0) / MS, a["REQUEST_LEGS"]: len(slots), a["REQUEST_MOVED"]: len(slots) > 1,
            a["SLOT_GROUP"]: 0,
            a["GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN"]: (first - t0) / 1e9, a["GEN_AI_LATENCY_E2E"]: (end - t0) / 1e9,
            a["GEN_AI_LATENCY_TIME_IN_QUEUE"]: 0.005, a["REQUEST_STATUS"]: "ok",
            a["RESUME"]: "full", a["RESUME_REUSABLE_TOKENS"]: 8,
        })
        root.end(end_time=end)
        return root

    now = time.time_ns()
    t0 = now - 10_000 * MS
    first = t0 + 30 * MS
    done = request("deploy-done", t0, first, [None, 0],
                   [(first, first + 200 * MS, 5), (first + 200 * MS, first + 500 * MS, 14)], "stop")
    t1 = now - 2_000 * MS
    request("deploy-live", t1, t1 + 20 * MS, [1], [(t1 + 20 * MS, t1 + 1_020 * MS, 20)], None)
    from opentelemetry.trace import Status, StatusCode

    t2 = now - 1_000 * MS
    refused = tracer.start_span(f"{OP_CHAT} {model}", kind=SpanKind.SERVER, start_time=t2, attributes={
        a["REQUEST_ID"]: "deploy-refused", a["REQUEST_START_TIME"]: t2,
        a["GEN_AI_OPERATION_NAME"]: OP_CHAT, a["GEN_AI_PROVIDER_NAME"]: PROVIDER,
        a["REQUEST_STATUS"]: "refused", a["ERROR_TYPE"]: "overloaded"})
    refused.set_status(Status(StatusCode.ERROR, "the queue is full"))
    refused.end(end_time=t2 + MS)
    spans = mem.get_finished_spans()
    provider.shutdown()
    return spans, format(done.get_span_context().trace_id, "032x")


@pytest.fixture(scope="module")
def scraped(tmp_path_factory):
    """A running sidecar's /metrics (Prometheus text and OpenMetrics) after engine-shaped spans.

    Scrapes until every metric the dashboards query has samples (bounded; the sidecar
    publishes asynchronously), then stops the sidecar.
    """
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    wanted = set()
    for q in dashboard_queries():
        wanted |= promql_metric_names(q["expr"])
    sc = Sidecar(tmp_path_factory.mktemp("sidecar"))
    try:
        spans, trace_id = engine_spans("deploy-check-engine", "deploy-check-model")
        exporter = OTLPSpanExporter(endpoint=f"http://{sc.grpc}", insecure=True, timeout=10)
        assert exporter.export(spans) == SpanExportResult.SUCCESS
        exporter.shutdown()
        text = ""
        for _ in range(400):  # bounded: correctness, not speed
            text = sc.metrics()
            if wanted <= set(Scrape(text).labels):
                break
            time.sleep(0.025)
        om = sc.metrics(openmetrics=True)
    finally:
        sc.close()
    return {"text": Scrape(text), "openmetrics": Scrape(om), "trace_id": trace_id,
            "stderr": sc.err_path.read_text()}


# --- tests: files --------------------------------------------------------------------------


def test_every_yaml_and_json_file_parses():
    yamls, jsons = deploy_files(".yaml", ".yml"), deploy_files(".json")
    assert COMPOSE in yamls and any(p.parent == DASHBOARDS for p in jsons)
    for p in yamls:
        try:
            docs = yaml_docs(p)
        except yaml.YAMLError as e:
            pytest.fail(f"{p.relative_to(REPO)}: {e}")
        assert docs, f"{p.relative_to(REPO)}: no document"
        for d in docs:
            assert isinstance(d, dict), f"{p.relative_to(REPO)}: a document is not a mapping"
    for p in jsons:
        try:
            json.loads(p.read_text())
        except json.JSONDecodeError as e:
            pytest.fail(f"{p.relative_to(REPO)}: {e}")
    # Configs embedded in ConfigMaps parse too.
    for path, obj in k8s_objects():
        if obj.get("kind") == "ConfigMap":
            for key, text in obj.get("data", {}).items():
                if key.endswith((".yaml", ".yml")):
                    assert isinstance(yaml.safe_load(text), dict), f"{path.name}: {key}"


def test_promtool_accepts_the_prometheus_config():
    promtool = shutil.which("promtool")
    if promtool is None:
        missing("promtool not found (Debian package `prometheus`)")
    r = subprocess.run([promtool, "check", "config", str(PROMETHEUS)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_alert_rules_pass_promtool_and_their_unit_tests():
    promtool = shutil.which("promtool")
    if promtool is None:
        missing("promtool not found (Debian package `prometheus`)")
    assert ALERTS.name in yaml_one(PROMETHEUS).get("rule_files", []), "Prometheus does not load the alert rules"
    r = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([promtool, "test", "rules", ALERT_TESTS.name], cwd=ALERT_TESTS.parent,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def test_every_alert_the_issue_asks_for_exists_and_is_unit_tested():
    rules = [r for g in yaml_one(ALERTS)["groups"] for r in g["rules"]]
    alerts = {r["alert"]: r for r in rules if "alert" in r}
    exprs = " ".join(r["expr"] for r in rules)
    e = ENGINE_METRIC
    need = {
        "TTFT burn rate": lambda a, r: METRIC["TIME_TO_FIRST_TOKEN"] in exprs and a.startswith("SlotlightTTFTBudgetBurn"),
        "TPOT burn rate": lambda a, r: METRIC["TIME_PER_OUTPUT_TOKEN"] in exprs and a.startswith("SlotlightTPOTBudgetBurn"),
        "queue growth": lambda a, r: e["REQUESTS_WAITING"] in r["expr"],
        "KV cache saturation": lambda a, r: e["KV_CACHE_USAGE"] in r["expr"],
        "preemption storms": lambda a, r: e["PREEMPTIONS"] in r["expr"],
        "span export failures": lambda a, r: e["SPAN_EXPORT_FAILURES"] in r["expr"],
        "span drops": lambda a, r: e["SPANS_DROPPED"] in r["expr"],
        "engine down": lambda a, r: 'job="slotlight-engine"' in r["expr"] and "up" in r["expr"],
        "sidecar down": lambda a, r: 'job="slotlight-sidecar"' in r["expr"] and "up" in r["expr"],
    }
    for what, pred in need.items():
        assert any(pred(a, r) for a, r in alerts.items()), f"no alert for {what}"
    # Multi-window: every burn-rate alert compares a long and a short window.
    for a, r in alerts.items():
        if "BudgetBurn" in a:
            assert len(re.findall(r":rate\d+[mhd]", r["expr"])) == 2, a
        assert r["labels"]["severity"] in ("page", "ticket"), a
        assert r.get("annotations", {}).get("summary"), f"{a}: no summary"
    # Every alert has a unit test in which it fires.
    tests = yaml_one(ALERT_TESTS)["tests"]
    fired = {t["alertname"] for g in tests for t in g.get("alert_rule_test", []) if t.get("exp_alerts")}
    quiet = {t["alertname"] for g in tests for t in g.get("alert_rule_test", []) if not t.get("exp_alerts")}
    assert set(alerts) <= fired, f"alerts never shown firing: {sorted(set(alerts) - fired)}"
    # And most have one in which they stay quiet (the rest are quiet for other series of a
    # test in which they fire).
    assert len(quiet) >= 5, quiet
    # Metric names in the rules are the contract's.
    names = set(METRIC.values()) | set(ENGINE_METRIC.values()) | {"up"}
    for r in rules:
        own = re.sub(r"\b[a-zA-Z_]\w*:[\w:]+", " ", r["expr"])  # this file's recording rules
        for n in promql_metric_names(own):
            base = re.sub(r"_(bucket|sum|count)$", "", n)
            assert n in names or base in names, f"{r.get('alert') or r.get('record')}: {n} is not a contract metric"


def test_prometheus_scrapes_the_sidecar_with_exemplars():
    prom = yaml_one(PROMETHEUS)
    svc = compose()["services"]
    targets = {t for job in prom["scrape_configs"] for sc in job.get("static_configs", [])
               for t in sc.get("targets", [])}
    listen = flag_value(compose_args(svc["sidecar"]), "--listen")
    assert listen, "the sidecar service sets no --listen"
    assert f"sidecar:{listen.rsplit(':', 1)[1]}" in targets, targets
    args = compose_args(svc["prometheus"])
    assert "--enable-feature=exemplar-storage" in args, args
    config = flag_value(args, "--config.file")
    assert host_path(svc["prometheus"], config) == PROMETHEUS.resolve()
    # The rule files the config names are mounted beside it.
    for rules in yaml_one(PROMETHEUS).get("rule_files", []):
        inside = str(Path(config).parent / rules)
        assert host_path(svc["prometheus"], inside) == (PROMETHEUS.parent / rules).resolve(), rules


def host_path(service: dict, inside: str) -> Path:
    """The file of this repository that a compose service sees at `inside` (through a file
    mount or a mounted directory above it)."""
    for v in service.get("volumes", []):
        src, dst = v.split(":")[:2]
        if not src.startswith((".", "/")):
            continue  # a named volume
        if inside == dst:
            return (DEPLOY / src).resolve()
        if inside.startswith(dst.rstrip("/") + "/"):
            return (DEPLOY / src / inside[len(dst.rstrip("/")) + 1:]).resolve()
    raise AssertionError(f"nothing mounted at {inside}: {service.get('volumes')}")


def test_prometheus_scrapes_the_engine_whichever_profile_runs():
    prom = yaml_one(PROMETHEUS)
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    svc = compose()["services"]
    targets = [t for sc in jobs["slotlight-engine"].get("static_configs", []) for t in sc["targets"]]
    assert jobs["slotlight-engine"].get("metrics_path", "/metrics") == "/metrics"
    assert len(targets) == 1, targets
    host, port = targets[0].split(":")
    for name in ("engine", "engine-cpu"):
        args = compose_args(svc[name])
        assert flag_value(args, "--port") == port, (name, args)
        assert "--api-key" not in args or "--metrics-public" in args, f"{name}: Prometheus has no key"
        names = {name} | set(((svc[name].get("networks") or {}).get("default") or {}).get("aliases", []))
        assert host in names, f"{name} does not answer to {host}: {names}"
    # The engine's metrics pushed over OTLP reach Prometheus through the collector.
    cfg = yaml_one(COLLECTOR)
    pipe = cfg["service"]["pipelines"]["metrics"]
    assert "otlp" in pipe["receivers"] and "prometheus" in pipe["exporters"], pipe
    exporter_port = cfg["exporters"]["prometheus"]["endpoint"].rsplit(":", 1)[1]
    otel_targets = [t for sc in jobs["otel-collector"]["static_configs"] for t in sc["targets"]]
    assert otel_targets == [f"otel-collector:{exporter_port}"], otel_targets


def test_k8s_autoscaling_example_scales_the_engine_on_its_queue():
    auto = K8S / "autoscaling"
    waiting = ENGINE_METRIC["REQUESTS_WAITING"]
    deployments = {o["metadata"]["name"] for _, o in k8s_resources() if o.get("kind") == "Deployment"}
    kust = yaml_one(auto / "kustomization.yaml")
    hpas = [d for r in kust["resources"] for d in yaml_docs(auto / r) if d.get("kind") == "HorizontalPodAutoscaler"]
    assert len(hpas) == 1
    hpa = hpas[0]
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"]["name"] in deployments
    assert [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]] == [waiting]
    adapter = yaml_one(auto / "prometheus-adapter.yaml")
    rules = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    assert any(waiting in r["seriesQuery"] and r["name"]["as"] == waiting for r in rules), rules
    keda = yaml_one(auto / "keda-scaledobject.yaml")
    assert keda["spec"]["scaleTargetRef"]["name"] in deployments
    assert all(waiting in t["metadata"]["query"] for t in keda["spec"]["triggers"])
    assert "Autoscaling" in (DEPLOY / "README.md").read_text(), "deploy/README.md documents it"


def test_k8s_pod_monitor_scrapes_engine_and_sidecar_ports():
    """The Prometheus Operator example scrapes both containers by port names the pod has."""
    mon = K8S / "monitoring"
    kust = yaml_one(mon / "kustomization.yaml")
    monitors = [d for r in kust["resources"] for d in yaml_docs(mon / r) if d.get("kind") == "PodMonitor"]
    assert len(monitors) == 1
    pm = monitors[0]
    pods = [o for _, o in k8s_resources() if pod_spec(o)]
    sel = pm["spec"]["selector"]["matchLabels"]
    match = [o for o in pods if sel.items() <= o["spec"]["template"]["metadata"]["labels"].items()]
    assert len(match) == 1, "the PodMonitor selects the engine pod"
    ports = {p["name"]: c["name"] for c in containers(match[0]) for p in c.get("ports", []) if "name" in p}
    scraped = {ports.get(e["port"]) for e in pm["spec"]["podMetricsEndpoints"]}
    assert scraped == {"engine", "sidecar"}, (scraped, ports)
    assert all(e["path"] == "/metrics" for e in pm["spec"]["podMetricsEndpoints"])


# --- tests: the dashboard against a real scrape --------------------------------------------


def test_dashboard_covers_the_required_views():
    queries = dashboard_queries()
    exprs = [q["expr"] for q in queries]

    def has(pred, what):
        assert any(pred(q) for q in queries), f"no dashboard query for {what}"

    for key in ("TIME_TO_FIRST_TOKEN", "TIME_PER_OUTPUT_TOKEN", "REQUEST_DURATION", "QUEUE_TIME"):
        bucket = METRIC[key] + "_bucket"
        for quantile in ("0.5", "0.95", "0.99"):
            has(lambda q: bucket in promql_metric_names(q["expr"]) and f"histogram_quantile({quantile}," in q["expr"],
                f"{METRIC[key]} p{quantile}")
        has(lambda q: bucket in promql_metric_names(q["expr"]) and q["exemplar"], f"{METRIC[key]} exemplars")
    has(lambda q: METRIC["GENERATED_TOKENS"] in promql_metric_names(q["expr"]) and "rate(" in q["expr"],
        "generated tokens/s")
    has(lambda q: METRIC["SLOT_TOKENS_PER_SECOND"] in promql_metric_names(q["expr"])
        and all(f"{{{{{lbl}}}}}" in q["legend"] for lbl in ("service_instance_id", "slot_group", "slot")),
        "each slot's live tok/s by instance, group and slot")
    has(lambda q: {METRIC["CACHED_TOKENS"], METRIC["PROMPT_TOKENS"]} <= promql_metric_names(q["expr"])
        and re.search(re.escape(METRIC["CACHED_TOKENS"]) + r".*\)\s*/\s*.*" + re.escape(METRIC["PROMPT_TOKENS"]),
                      q["expr"]),
        "cached / prompt token ratio")
    has(lambda q: METRIC["MOVES"] in promql_metric_names(q["expr"]), "solo to slot moves")
    # Saturation, from the engine's own /metrics.
    e = ENGINE_METRIC
    has(lambda q: e["REQUESTS_WAITING"] in promql_metric_names(q["expr"]), "requests waiting (the queue)")
    has(lambda q: e["REQUESTS_RUNNING"] in promql_metric_names(q["expr"]) and "path" in promql_grouping_labels(q["expr"]),
        "requests running by path")
    has(lambda q: e["KV_CACHE_USAGE"] in promql_metric_names(q["expr"]), "KV cache usage")
    has(lambda q: e["PREEMPTIONS"] in promql_metric_names(q["expr"]) and "rate(" in q["expr"], "preemptions/s")
    has(lambda q: re.search(re.escape(e["PREFIX_CACHE_HIT_TOKENS"]) + r".*\)\s*/\s*.*"
                            + re.escape(e["PREFIX_CACHE_QUERIED_TOKENS"]), q["expr"]),
        "prefix-cache hit rate (hits / queries)")
    # The GenAI histograms exist on both processes: panels on them name the process.
    for q in queries:
        if any(n.startswith(tuple(METRIC[k] for k in ("TIME_TO_FIRST_TOKEN", "TIME_PER_OUTPUT_TOKEN", "REQUEST_DURATION")))
               for n in promql_metric_names(q["expr"])) and q["panel"] is not None:
            assert re.search(r'job="[\w-]+"', q["expr"]), f"{q['where']}: served by both engine and sidecar; say which job"
    assert all(promql_metric_names(e) for e in exprs)
    for path in DASHBOARDS.glob("*.json"):
        dash = json.loads(path.read_text())
        defined = {v["name"] for v in dash.get("templating", {}).get("list", [])}
        used = set(re.findall(r"\$\{?(\w+)", path.read_text())) - {"__all"}
        used = {u for u in used if not u.startswith("__")}
        assert used <= defined, f"{path.name}: undefined variables {sorted(used - defined)}"


def test_the_sidecar_took_the_spans_as_engine_spans(scraped):
    text: Scrape = scraped["text"]
    for key in ("SIDECAR_SPANS_REJECTED", "SIDECAR_SPANS_IGNORED", "SIDECAR_SPANS_DROPPED"):
        assert text.totals.get(METRIC[key]) == 0, (METRIC[key], scraped["stderr"][-3000:])
    assert text.totals[METRIC["SIDECAR_SPANS_RECEIVED"]] > 0
    assert text.totals[METRIC["MOVES"]] == 1
    assert text.totals[METRIC["CACHED_TOKENS"]] > 0


def is_engine_query(q: dict) -> bool:
    """A query of the engine's own metrics only (served by the engine, not the sidecar)."""
    engine = set(ENGINE_METRIC.values())
    names = promql_metric_names(q["expr"])
    strip = lambda n: re.sub(r"_(bucket|sum|count)$", "", n)  # noqa: E731
    return bool(names) and all(n in engine or strip(n) in engine for n in names)


def dashboard_problems(text: "Scrape", queries: list[dict], who: str) -> list[str]:
    """What in `queries` does not match a real scrape `text` of `who`: metrics without samples,
    names or labels outside the contract, label values no series has."""
    contract_metrics = set(METRIC.values()) | set(ENGINE_METRIC.values())
    problems = []
    for q in queries:
        names = promql_metric_names(q["expr"])
        if not names:
            problems.append(f"{q['where']}: names no metric: {q['expr']}")
        labels_here = {"job", "instance"}  # added by Prometheus at scrape time
        for name in names:
            fam = text.histogram_family(name)
            if (fam or name) not in contract_metrics:
                problems.append(f"{q['where']}: {name} is not a contract metric")
            if name not in text.labels:
                problems.append(f"{q['where']}: {name} has no sample in the {who}'s /metrics")
                continue
            if name.endswith(("_bucket", "_sum", "_count")) and fam is None and text.types.get(name) is None:
                problems.append(f"{q['where']}: {name} is a histogram suffix of no histogram family")
            labels_here |= text.labels[name]
        for name, matchers in promql_selectors(q["expr"]):
            for lbl, val in matchers.items():
                if lbl in ("job", "instance"):
                    continue
                if lbl not in text.labels.get(name, set()):
                    problems.append(f"{q['where']}: {name} has no label {lbl}")
                elif val is not None and val not in text.values.get((name, lbl), set()):
                    problems.append(f"{q['where']}: {name}{{{lbl}={val!r}}} matches no series the {who} serves")
        for lbl in promql_grouping_labels(q["expr"]) | set(re.findall(r"\{\{\s*(\w+)\s*\}\}", q["legend"])):
            if lbl not in labels_here:
                problems.append(f"{q['where']}: label {lbl} is on none of {sorted(names)}")
            elif lbl not in METRIC_LABELS | {"job", "instance", "le"}:
                problems.append(f"{q['where']}: label {lbl} is not a contract label")
    return problems


def test_every_dashboard_metric_and_label_is_in_a_real_scrape(scraped):
    queries = [q for q in dashboard_queries() if not is_engine_query(q)]
    problems = dashboard_problems(scraped["text"], queries, "sidecar")
    assert not problems, "\n".join(problems) + "\n--- sidecar stderr:\n" + scraped["stderr"][-3000:]


@pytest.fixture(scope="module")
def engine_scraped():
    """A running engine's own /metrics after one request (needs the default model)."""
    from procs import EngineProcess, require_model

    require_model()
    e = EngineProcess("--batch", "2")
    try:
        code, v = e.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert code == 200, v
        with urllib.request.urlopen(e.base + "/metrics", timeout=30) as r:
            text = r.read().decode()
    finally:
        e.close()
    return Scrape(text)


def test_every_engine_panel_metric_and_label_is_in_a_real_engine_scrape(engine_scraped):
    queries = [q for q in dashboard_queries() if is_engine_query(q)]
    assert len(queries) >= 5, [q["where"] for q in queries]
    problems = dashboard_problems(engine_scraped, queries, "engine")
    assert not problems, "\n".join(problems)


def test_histogram_panels_get_trace_exemplars_grafana_can_link(scraped):
    om: Scrape = scraped["openmetrics"]
    ds = [d for p in sorted((PROVISIONING / "datasources").glob("*.y*ml")) for d in yaml_one(p)["datasources"]]
    uids = {d["uid"]: d for d in ds}
    prom = [d for d in ds if d["type"] == "prometheus"]
    assert len(prom) == 1, prom
    dests = prom[0]["jsonData"]["exemplarTraceIdDestinations"]
    for d in dests:
        assert uids.get(d["datasourceUid"], {}).get("type") == "jaeger", d
    label = dests[0]["name"]
    with_exemplars = [q for q in dashboard_queries() if q["exemplar"]]
    assert with_exemplars
    for q in with_exemplars:
        for name in promql_metric_names(q["expr"]):
            assert name.endswith("_bucket"), f"{q['where']}: exemplars asked of {name}, not a histogram bucket"
            ex = om.exemplars.get(name, [])
            ids = {v for k, v in ex if k == label}
            assert ids, f"{q['where']}: no {label} exemplar on {name}: {ex}"
            assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids), ids
            if name.startswith(tuple(METRIC[k] for k in ("TIME_TO_FIRST_TOKEN", "REQUEST_DURATION"))):
                assert scraped["trace_id"] in ids, (name, ids, scraped["trace_id"])


def test_dashboard_panels_use_provisioned_data_sources():
    ds = {d["uid"] for p in (PROVISIONING / "datasources").glob("*.y*ml") for d in yaml_one(p)["datasources"]}
    for path in DASHBOARDS.glob("*.json"):
        dash = json.loads(path.read_text())
        for p in dash["panels"]:
            for obj in [p, *p.get("targets", [])]:
                uid = (obj.get("datasource") or {}).get("uid")
                assert uid is None or uid in ds, f"{path.name}: {p['title']}: data source {uid} not provisioned"
    providers = [pr for p in (PROVISIONING / "dashboards").glob("*.y*ml") for pr in yaml_one(p)["providers"]]
    grafana = compose()["services"]["grafana"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in grafana["volumes"] if v.startswith(".")}
    for pr in providers:
        src = mounts.get(pr["options"]["path"])
        assert src and (DEPLOY / src).resolve() == DASHBOARDS.resolve(), (pr, mounts)
    assert (DEPLOY / mounts["/etc/grafana/provisioning"]).resolve() == PROVISIONING.resolve()


# --- tests: the collector ------------------------------------------------------------------


def collector_configs() -> list[tuple[str, dict]]:
    out = [("deploy/otel-collector.yaml", yaml_one(COLLECTOR))]
    for path, obj in k8s_objects():
        if obj.get("kind") == "ConfigMap":
            for key, text in obj.get("data", {}).items():
                cfg = yaml.safe_load(text)
                if isinstance(cfg, dict) and "receivers" in cfg and "service" in cfg:
                    out.append((f"{path.relative_to(REPO)}: {key}", cfg))
    return out


def all_collector_configs() -> list[tuple[str, dict]]:
    """The compose and Kubernetes collector configs, and the backend recipes'
    (deploy/observability/*/otel-collector.yaml, docs/observability.md)."""
    recipes = sorted((DEPLOY / "observability").glob("*/otel-collector.yaml"))
    return collector_configs() + [(str(p.relative_to(REPO)), yaml_one(p)) for p in recipes]


def _ottl_refs(stmt: str) -> tuple[set[str], set[str], set[str]]:
    """(attribute keys, span names, span-name regexes) an OTTL condition or statement names."""
    keys = set(re.findall(r'attributes\["([^"]+)"\]', stmt))
    names = {m[1] for m in re.findall(r'\bname\s*(==|!=)\s*"([^"]*)"', stmt)}
    regexes = set(re.findall(r'IsMatch\(\s*name\s*,\s*"([^"]*)"\s*\)', stmt))
    return keys, names, regexes


def collector_references(cfg: dict) -> tuple[set[str], set[str], set[str]]:
    keys, names, regexes = set(), set(), set()

    def match_config(mc):
        if not isinstance(mc, dict):
            return
        keys.update(a["key"] for a in mc.get("attributes", []) or [])
        keys.update(a["key"] for a in mc.get("resources", []) or [])
        target = regexes if mc.get("match_type") == "regexp" else names
        target.update(mc.get("span_names", []) or [])

    def strings(x):
        if isinstance(x, str):
            yield x
        elif isinstance(x, list):
            for y in x:
                yield from strings(y)
        elif isinstance(x, dict):
            for y in x.values():
                yield from strings(y)

    for pid, p in (cfg.get("processors") or {}).items():
        kind, p = pid.split("/")[0], p or {}
        if kind in ("attributes", "resource"):
            keys.update(a["key"] for a in p.get("actions", []) if "key" in a)
            keys.update(a["from_attribute"] for a in p.get("actions", []) if "from_attribute" in a)
            match_config(p.get("include"))
            match_config(p.get("exclude"))
        elif kind == "filter":
            for s in strings(p.get("traces", {})):
                k, n, r = _ottl_refs(s)
                keys |= k
                names |= n
                regexes |= r
            for side in ("include", "exclude"):
                match_config((p.get("spans") or {}).get(side))
        elif kind == "transform":
            for s in strings(p.get("trace_statements", [])):
                k, n, r = _ottl_refs(s)
                keys |= k
                names |= n
                regexes |= r
        elif kind == "span":
            match_config(p.get("include"))
            match_config(p.get("exclude"))
    return keys, names, regexes


def test_collector_matches_only_contract_names():
    contract_keys = set(ATTR.values())
    checked = 0
    for where, cfg in all_collector_configs():
        keys, names, regexes = collector_references(cfg)
        checked += len(keys) + len(names) + len(regexes)
        for k in sorted(keys):
            # Resource keys of other producers (e.g. k8s.*) are not ours to check; ours are.
            assert k in contract_keys, f"{where}: attribute {k!r} is not in otel/CONTRACT.md"
        for n in sorted(names):
            assert is_contract_span_name(n), f"{where}: span name {n!r} is not in otel/CONTRACT.md"
        for r in sorted(regexes):
            assert any(re.search(r, n) for n in [*SPAN.values(), f"{OP_CHAT} m"]), \
                f"{where}: span-name pattern {r!r} matches no contract span"
    assert checked, "the collector configs reference no span name or attribute: the check would be vacuous"


def test_collector_pipelines_are_wired():
    for where, cfg in all_collector_configs():
        svc = cfg["service"]
        for ext in svc.get("extensions", []):
            assert ext in cfg.get("extensions", {}), f"{where}: extension {ext} undefined"
        for name, pipe in svc["pipelines"].items():
            for section in ("receivers", "processors", "exporters"):
                for c in pipe.get(section, []):
                    # A connector is the exporter of one pipeline and the receiver of another.
                    connectors = (cfg.get("connectors") or {}) if section != "processors" else {}
                    defined = {**(cfg.get(section) or {}), **connectors}
                    assert c in defined, f"{where}: {name}: {section[:-1]} {c} undefined"
            procs = pipe.get("processors", [])
            assert "batch" in procs, f"{where}: {name} has no batch processor"
            if "memory_limiter" in procs:
                assert procs[0] == "memory_limiter", f"{where}: memory_limiter must come first"
        grpc = cfg["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]
        assert grpc.startswith("0.0.0.0:"), f"{where}: the collector must listen on 0.0.0.0 in a container"
    # Compose: the collector fans out to Jaeger and the sidecar, at the services' OTLP ports.
    cfg = yaml_one(COLLECTOR)
    services = compose()["services"]
    exporters = {e for p in cfg["service"]["pipelines"].values() for e in p["exporters"]}
    assert {"otlp/jaeger", "otlp/sidecar"} <= exporters, exporters
    side = flag_value(compose_args(services["sidecar"]), "--otlp-grpc")
    assert cfg["exporters"]["otlp/sidecar"]["endpoint"] == f"sidecar:{side.rsplit(':', 1)[1]}"
    assert cfg["exporters"]["otlp/jaeger"]["endpoint"].split(":")[0] in services
    for e in ("otlp/jaeger", "otlp/sidecar"):
        assert cfg["exporters"][e]["tls"]["insecure"] is True
    # The sidecar must see every span: nothing filters or rewrites its pipeline.
    for p in cfg["service"]["pipelines"].values():
        if "otlp/sidecar" in p["exporters"]:
            assert set(p.get("processors", [])) <= {"memory_limiter", "batch"}, p


# --- tests: compose ------------------------------------------------------------------------


def test_compose_references_files_that_exist():
    c = compose()
    services = c["services"]
    assert {"sidecar", "otel-collector", "jaeger", "prometheus", "grafana"} <= set(services)
    engines = {n: s for n, s in services.items() if "Dockerfile.engine" in str((s.get("build") or {}).get("dockerfile"))}
    assert "engine" in engines and len(engines) >= 2, "an engine service plus a CPU fallback"
    for name, s in services.items():
        b = s.get("build")
        if b is not None:
            ctx = DEPLOY / (b if isinstance(b, str) else b.get("context", "."))
            assert ctx.is_dir(), f"{name}: build context {ctx} missing"
            df = ctx / (b.get("dockerfile", "Dockerfile") if isinstance(b, dict) else "Dockerfile")
            assert df.is_file(), f"{name}: {df} missing"
        for v in s.get("volumes", []):
            src = v.split(":")[0] if isinstance(v, str) else v.get("source", "")
            if src.startswith((".", "/")):
                assert (DEPLOY / src).exists(), f"{name}: bind-mount source {src} missing"
            else:
                assert src in (c.get("volumes") or {}), f"{name}: volume {src} undeclared"
        for f in ([s["env_file"]] if isinstance(s.get("env_file"), str) else s.get("env_file", [])):
            assert (DEPLOY / f).is_file(), f"{name}: env_file {f} missing"
        deps = s.get("depends_on", [])
        for d in deps:
            assert d in services, f"{name}: depends on unknown service {d}"
            dprof = set(services[d].get("profiles", []))
            if dprof:
                assert set(s.get("profiles", [])) and set(s.get("profiles", [])) <= dprof, \
                    f"{name} depends on {d}, which its profiles do not start"
        for p in s.get("ports", []):
            assert str(p).startswith("127.0.0.1:"), f"{name}: published port {p} should bind 127.0.0.1"


def test_compose_engines_pick_gpu_or_cpu_and_listen_everywhere():
    services = compose()["services"]
    engines = {n: s for n, s in services.items() if "Dockerfile.engine" in str((s.get("build") or {}).get("dockerfile"))
               and "serve" in compose_args(s)}
    gpu = [n for n, s in engines.items() if s.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices")]
    assert gpu == ["engine"], gpu
    dev = services["engine"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert "gpu" in dev["capabilities"]
    cpu = [n for n in engines if n not in gpu]
    assert cpu, "no CPU fallback engine"
    profiles = [tuple(engines[n].get("profiles", [])) for n in engines]
    assert all(profiles) and len(set(profiles)) == len(profiles), f"each engine needs its own profile: {profiles}"
    for n, s in engines.items():
        args = compose_args(s)
        assert flag_value(args, "--host") == "0.0.0.0", n
        assert flag_value(args, "--device") == ("cuda" if n in gpu else "cpu"), n
        env = s.get("environment", {})
        assert env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").startswith("http://otel-collector:"), n
        assert "OTEL_SERVICE_NAME" not in env or env["OTEL_SERVICE_NAME"] == ENGINE_SERVICE, n
    side = compose_args(services["sidecar"])
    for f in ("--otlp-grpc", "--otlp-http", "--listen"):
        assert (flag_value(side, f) or "").startswith("0.0.0.0:"), f"sidecar {f} must bind 0.0.0.0 in a container"


def test_deployed_sidecar_flags_exist():
    real = help_flags(str(sidecar_bin()), "--help")
    used = {"compose": flags(compose_args(compose()["services"]["sidecar"]))}
    for path, obj in k8s_objects():
        for c in containers(obj):
            if c["name"] == "sidecar" or "sidecar" in str(c.get("image", "")):
                used[f"{path.relative_to(REPO)}: {c['name']}"] = flags([str(a) for a in c.get("args", [])])
    used["Dockerfile.sidecar"] = flags(_dockerfile_cmd(DEPLOY / "Dockerfile.sidecar"))
    assert len(used) >= 3
    for where, fl in used.items():
        assert fl, f"{where}: no flags"
        assert fl <= real, f"{where}: unknown sidecar flags {sorted(fl - real)}"


def test_deployed_engine_flags_exist():
    b = binary("slotlight-engine", "SLOTLIGHT_ENGINE_BIN")
    if b is None:
        missing("slotlight-engine is not built: run `cargo build --workspace` or set SLOTLIGHT_ENGINE_BIN")
    real = help_flags(str(b), "serve", "--help")
    # export-tokenizer's flags: test_k8s.py.
    subcommands = {"serve", "fetch-model", "export-tokenizer"}
    used = {}
    for n, s in compose()["services"].items():
        if "Dockerfile.engine" in str((s.get("build") or {}).get("dockerfile")):
            used[f"compose {n}"] = compose_args(s)
    for path, obj in k8s_objects():
        for c in containers(obj):
            if (c["name"] == "engine" or "engine" in str(c.get("image", ""))) and c.get("args"):
                used[f"{path.relative_to(REPO)}: {c['name']}"] = [str(a) for a in c["args"]]
    used["Dockerfile.engine"] = _dockerfile_cmd(DEPLOY / "Dockerfile.engine")
    for where, args in used.items():
        assert args and args[0] in subcommands, f"{where}: {args}"
        if args[0] == "serve":
            assert flags(args) <= real, f"{where}: unknown engine flags {sorted(flags(args) - real)}"
        elif args[0] == "fetch-model":
            assert args == ["fetch-model"], where


# --- tests: Dockerfiles --------------------------------------------------------------------


def _dockerfile_lines(path: Path) -> list[str]:
    text = re.sub(r"\\\n", " ", path.read_text())
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def _dockerfile_cmd(path: Path) -> list[str]:
    cmd = [ln for ln in _dockerfile_lines(path) if ln.startswith("CMD ")][-1]
    return json.loads(cmd[4:])


def _dockerfile_froms(path: Path) -> list[str]:
    lines = _dockerfile_lines(path)
    args = dict(re.findall(r"^ARG (\w+)=(\S+)", "\n".join(lines), re.M))
    froms = [ln.split()[1] for ln in lines if ln.startswith("FROM ")]
    return [re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), f) for f in froms]


def test_dockerfiles_build_the_workspace_binaries():
    eng, side = DEPLOY / "Dockerfile.engine", DEPLOY / "Dockerfile.sidecar"
    froms = _dockerfile_froms(eng)
    assert len(froms) >= 2 and froms[0].startswith("rust:"), froms
    assert re.match(r"nvidia/cuda:13\.0\.\d+-runtime-ubuntu24\.04$", froms[-1]), froms
    text = eng.read_text()
    assert "--features cuda" in text and "-p slotlight-engine" in text
    assert re.search(r"apt-get install[^\n]*python3[^\n]*python3-pip", text), "python3 and pip for fetch-model"
    assert "SLOTLIGHT_MODEL_DIR" in text
    froms = _dockerfile_froms(side)
    assert len(froms) >= 2 and froms[0].startswith("rust:"), froms
    assert re.match(r"debian:\S+-slim$", froms[-1]), froms
    assert "-p slotlight-sidecar" in side.read_text()
    for df in (eng, side):
        text = "\n".join(_dockerfile_lines(df))
        assert "target-cpu=native" not in text, f"{df.name}: images run on other CPUs"
        assert "--locked" in text, f"{df.name}: build from Cargo.lock"
        for src in re.findall(r"^COPY (?!--from)(\S+)", text, re.M):
            assert (REPO / src).exists(), f"{df.name}: COPY {src}: not in the build context (the repository root)"
        ignore = df.with_name(df.name + ".dockerignore")
        assert ignore.is_file(), f"{ignore.name} missing (keeps target/ and .venv/ out of the context)"


# --- tests: Kubernetes ---------------------------------------------------------------------


def test_kustomizations_reference_files_that_exist():
    kusts = sorted(K8S.rglob("kustomization.yaml"))
    assert kusts
    for k in kusts:
        doc = yaml_one(k)
        for r in doc.get("resources", []):
            assert (k.parent / r).exists(), f"{k.relative_to(REPO)}: resource {r} missing"
        for p in doc.get("patches", []):
            assert (k.parent / p["path"]).is_file(), f"{k.relative_to(REPO)}: patch {p['path']} missing"
    kubectl = shutil.which("kubectl")
    if kubectl:  # optional: kustomize itself, where kubectl is installed
        for k in kusts:
            r = subprocess.run([kubectl, "kustomize", str(k.parent)], capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, f"{k.relative_to(REPO)}: {r.stderr}"


def test_k8s_engine_pod_runs_engine_and_sidecar_with_a_model_volume():
    objs = [o for _, o in k8s_resources()]
    deps = {o["metadata"]["name"]: o for o in objs if o.get("kind") == "Deployment"}
    engine_pods = [o for o in deps.values()
                   if {"engine", "sidecar"} <= {c["name"] for c in o["spec"]["template"]["spec"]["containers"]}]
    assert len(engine_pods) == 1, list(deps)
    spec = engine_pods[0]["spec"]["template"]["spec"]
    cont = {c["name"]: c for c in spec["containers"]}
    eng, side = cont["engine"], cont["sidecar"]
    env = {e["name"]: e.get("value") for e in eng.get("env", [])}
    side_args = [str(a) for a in side["args"]]
    grpc = flag_value(side_args, "--otlp-grpc")
    endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")
    services = {o["metadata"]["name"] for o in objs if o.get("kind") == "Service"}
    if endpoint.startswith(("http://127.0.0.1:", "http://localhost:")):
        assert endpoint.rsplit(":", 1)[1] == grpc.rsplit(":", 1)[1], (endpoint, grpc)
        fwd = flag_value(side_args, "--forward-otlp")
        assert fwd and re.match(r"^(grpc|http)://([\w-]+):\d+", fwd).group(2) in services, fwd
    else:
        assert re.match(r"^http://([\w-]+):\d+", endpoint).group(1) in services, endpoint
    assert (flag_value(side_args, "--listen") or "").startswith("0.0.0.0:"), "Prometheus scrapes the sidecar"
    assert flag_value([str(a) for a in eng["args"]], "--host") == "0.0.0.0"
    assert "OTEL_SERVICE_NAME" not in env or env["OTEL_SERVICE_NAME"] == ENGINE_SERVICE
    # The model: a volume mounted at SLOTLIGHT_MODEL_DIR, filled by an init container.
    vols = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in eng["volumeMounts"]}
    model_vol = mounts[env["SLOTLIGHT_MODEL_DIR"]]
    assert "persistentVolumeClaim" in vols[model_vol] or "emptyDir" in vols[model_vol]
    init = spec.get("initContainers", [])
    assert any(c.get("args") == ["fetch-model"] and any(m["name"] == model_vol for m in c["volumeMounts"])
               for c in init), "an init container runs fetch-model into the model volume"
    claim = vols[model_vol].get("persistentVolumeClaim", {}).get("claimName")
    if claim:
        assert claim in {o["metadata"]["name"] for o in objs if o.get("kind") == "PersistentVolumeClaim"}


def test_k8s_objects_are_consistent():
    objs = [o for _, o in k8s_resources()]
    by_kind: dict[str, dict[str, dict]] = {}
    for o in objs:
        by_kind.setdefault(o["kind"], {})[o["metadata"]["name"]] = o
    assert {"Deployment", "Service", "ConfigMap", "PersistentVolumeClaim"} <= set(by_kind)
    pods = [o for o in objs if pod_spec(o)]
    for o in pods:
        for c in containers(o):
            req = (c.get("resources") or {}).get("requests") or {}
            assert {"cpu", "memory"} <= set(req), f"{o['metadata']['name']}/{c['name']}: resource requests"
        for v in pod_spec(o).get("volumes", []):
            if "configMap" in v:
                assert v["configMap"]["name"] in by_kind.get("ConfigMap", {}), v
        sel = o["spec"]["selector"]["matchLabels"]
        labels = o["spec"]["template"]["metadata"]["labels"]
        assert sel.items() <= labels.items(), o["metadata"]["name"]
    for name, svc in by_kind["Service"].items():
        sel = svc["spec"]["selector"]
        match = [o for o in pods if sel.items() <= o["spec"]["template"]["metadata"]["labels"].items()]
        assert match, f"Service {name} selects no pod"
        ports = {p.get("name"): p["containerPort"] for o in match for c in containers(o) for p in c.get("ports", [])}
        for p in svc["spec"]["ports"]:
            t = p.get("targetPort", p["port"])
            assert t in ports or t in ports.values(), f"Service {name}: targetPort {t} not in {ports}"
    # Every Service the collector exports to exists.
    for where, cfg in collector_configs()[1:]:
        for e in cfg["exporters"].values():
            host = e["endpoint"].split("://")[-1].split(":")[0]
            assert host in by_kind["Service"], f"{where}: exporter endpoint {host} is no Service"
    # The GPU overlay patches an existing Deployment's container and asks for a GPU.
    for patch in (K8S / "gpu").glob("*.yaml"):
        for d in yaml_docs(patch):
            if d.get("kind") != "Deployment":
                continue
            base = by_kind["Deployment"][d["metadata"]["name"]]
            names = {c["name"] for c in containers(base)}
            for c in d["spec"]["template"]["spec"]["containers"]:
                assert c["name"] in names, c["name"]
                assert "nvidia.com/gpu" in c["resources"]["limits"]


def test_collector_files_the_per_turn_log_records():
    """The compose collector has a logs pipeline from the OTLP receiver to a file exporter on
    a volume, and the engines send their per-turn records to it (OTEL_LOGS_EXPORTER=otlp)."""
    cfg = yaml_one(COLLECTOR)
    logs = [p for name, p in cfg["service"]["pipelines"].items() if name.split("/")[0] == "logs"]
    assert logs, "no logs pipeline"
    files = [e for p in logs for e in p["exporters"] if e.split("/")[0] == "file"]
    assert files and all("otlp" in p["receivers"] for p in logs), logs
    path = cfg["exporters"][files[0]]["path"]
    services = compose()["services"]
    mounts = [v.split(":")[1] for v in services["otel-collector"].get("volumes", []) if isinstance(v, str)]
    assert any(path.startswith(m.rstrip("/") + "/") for m in mounts), (path, mounts)
    engines = [s for name, s in services.items() if name.startswith("engine")]
    assert engines and all(s["environment"]["OTEL_LOGS_EXPORTER"] == "otlp" for s in engines), \
        "every engine sends its per-turn records over OTLP"
