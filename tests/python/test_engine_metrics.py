"""The engine's own `GET /metrics`, against a real engine process on loopback.

- the exposition passes `promtool check metrics` (Prometheus text), and OpenMetrics is served
  when the scraper asks for it;
- `/metrics` is behind `--api-key` unless `--metrics-public`;
- under 64 concurrent clients the waiting gauge rises above 0, then every gauge returns to its
  idle value;
- the counters equal what the test sent: finished requests by finish reason, refusals by
  `error_type`, tokens, and one request-duration observation per request.

Metric names come from otel/CONTRACT.md (ENGINE_METRIC, METRIC).
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from metrics_text import Samples, scrape
from procs import EngineProcess, http_json, require_model
from sidecar_support import ENGINE_METRIC, ENGINE_SERVICE, METRIC, VLLM_METRIC

REPO = Path(__file__).resolve().parents[2]
KEY = "metrics-test-key"
AUTH = {"authorization": f"Bearer {KEY}"}
REQUIRE_TOOLS = os.environ.get("SLOTLIGHT_REQUIRE_TOOLS") == "1"

WAITING = ENGINE_METRIC["REQUESTS_WAITING"]
RUNNING = ENGINE_METRIC["REQUESTS_RUNNING"]
KV_USAGE = ENGINE_METRIC["KV_CACHE_USAGE"]
KV_USED = ENGINE_METRIC["KV_BLOCKS_USED"]
FINISHED = ENGINE_METRIC["REQUESTS_FINISHED"]
REFUSED = ENGINE_METRIC["REQUESTS_REFUSED"]
PROMPT = ENGINE_METRIC["PROMPT_TOKENS"]
CACHED = ENGINE_METRIC["CACHED_TOKENS"]
GENERATED = ENGINE_METRIC["GENERATION_TOKENS"]
QUEUE = ENGINE_METRIC["QUEUE_TIME"]
DURATION = METRIC["REQUEST_DURATION"]
TTFT = METRIC["TIME_TO_FIRST_TOKEN"]

# error.type of each refusal status the tests provoke (the labels of the contract's
# `error.type` values: an invalid request, no such model, the queue was full).
ERROR_TYPE_OF_STATUS = {400: "validation", 404: "not_found", 429: "overloaded"}


@pytest.fixture(scope="module")
def engine():
    require_model()
    e = EngineProcess("--batch", "4", "--max-queue", "48", api_key=KEY)
    yield e
    e.close()


def metrics(e: EngineProcess) -> Samples:
    code, _, body = scrape(e.base, key=KEY)
    assert code == 200, body
    return Samples(body)


def chat(e: EngineProcess, body: dict):
    return http_json("POST", e.base + "/v1/chat/completions", {"model": e.model, **body}, AUTH, timeout=300)


def ask(n: int, max_tokens: int = 8) -> dict:
    return {"messages": [{"role": "user", "content": f"Count to {n}."}], "max_tokens": max_tokens}


def test_prometheus_text_passes_promtool_and_openmetrics_is_served_on_request(engine):
    assert chat(engine, ask(3))[0] == 200
    assert chat(engine, {"messages": []})[0] == 400
    code, ctype, text = scrape(engine.base, key=KEY)
    assert code == 200 and ctype.startswith("text/plain; version=0.0.4"), ctype
    s = Samples(text)
    for name in (WAITING, RUNNING, KV_USAGE, FINISHED, REFUSED, DURATION, TTFT, QUEUE):
        assert s.has(name) or s.has(name + "_count"), f"{name} missing:\n{text}"
    assert "# EOF" not in text

    code, ctype, om = scrape(engine.base, key=KEY, accept="application/openmetrics-text; version=1.0.0")
    assert code == 200 and ctype.startswith("application/openmetrics-text"), ctype
    assert om.endswith("# EOF\n")
    assert f"# TYPE {GENERATED.removesuffix('_total')} counter" in om

    promtool = shutil.which("promtool")
    if promtool is None:
        if REQUIRE_TOOLS:
            pytest.fail("promtool not found (Debian package `prometheus`) (SLOTLIGHT_REQUIRE_TOOLS=1)")
        pytest.skip("promtool not found (Debian package `prometheus`)")
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    report = (r.stdout + r.stderr).strip()
    assert r.returncode == 0 and not report, f"promtool ({r.returncode}):\n{report}\n--- exposition ---\n{text}"


def test_configuration_reference_maps_every_served_metric_to_its_vllm_counterpart(engine):
    """Every family the engine serves has a row in docs/configuration.md's vLLM table, and the
    queue, running, KV and preemption gauges name the vLLM metric they replace."""
    assert chat(engine, ask(2))[0] == 200
    _, _, text = scrape(engine.base, key=KEY)
    families = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    assert WAITING in families, families
    doc = (REPO / "docs" / "configuration.md").read_text()
    section = doc.split("## Engine metrics and their vLLM counterparts", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    unmapped = sorted(f for f in families if not any(f"`{f}" in r for r in rows))
    assert not unmapped, f"not in docs/configuration.md: {unmapped}"
    for vllm, ours in [
        ("vllm:num_requests_waiting", WAITING),
        ("vllm:num_requests_running", RUNNING),
        ("vllm:kv_cache_usage_perc", KV_USAGE),
        ("vllm:num_preemptions_total", ENGINE_METRIC["PREEMPTIONS"]),
    ]:
        assert any(f"`{vllm}`" in r and f"`{ours}" in r for r in rows), (vllm, ours)


def test_metrics_need_the_api_key_unless_public(engine):
    assert scrape(engine.base)[0] == 401
    assert scrape(engine.base, key="wrong")[0] == 401
    assert scrape(engine.base, key=KEY)[0] == 200
    public = EngineProcess("--metrics-public", api_key=KEY)
    try:
        assert scrape(public.base)[0] == 200
        # Only /metrics is opened: the API still wants the key.
        assert http_json("GET", public.base + "/v1/requests")[0] == 401
    finally:
        public.close()


def test_gauges_rise_under_load_and_return_to_idle_and_counters_equal_what_was_sent(engine):
    idle = metrics(engine)
    assert idle.total(WAITING) == 0 and idle.total(RUNNING) == 0
    idle_kv = idle.total(KV_USAGE)

    clients = 64
    seen = {"waiting": 0.0, "running": 0.0, "kv": 0.0}
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            s = metrics(engine)
            seen["waiting"] = max(seen["waiting"], s.total(WAITING))
            seen["running"] = max(seen["running"], s.total(RUNNING))
            seen["kv"] = max(seen["kv"], s.total(KV_USAGE))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        answers = list(pool.map(lambda i: chat(engine, ask(i, 16)), range(clients)))
    stop.set()
    watcher.join()
    # Refusals the test makes on purpose: an invalid body, an unknown model.
    answers.append(chat(engine, {"messages": []}))
    answers.append(chat(engine, {"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}))

    assert seen["waiting"] > 0, seen
    assert seen["running"] >= 1, seen
    assert seen["kv"] > idle_kv, seen

    # Every gauge goes back to idle once the last request is done (the loop publishes after
    # each step; a few scrapes may still see the last one).
    for _ in range(500):
        after = metrics(engine)
        if after.total(WAITING) == 0 and after.total(RUNNING) == 0 and after.total(KV_USED) == idle.total(KV_USED):
            break
        time.sleep(0.02)
    assert after.total(WAITING) == 0, after.text
    assert after.total(RUNNING) == 0, after.text
    assert after.total(KV_USAGE) == idle_kv, after.text

    def delta(name: str, **labels: str) -> float:
        return after.total(name, **labels) - idle.total(name, **labels)

    served = [a for code, a in answers if code == 200]
    refused = [code for code, _ in answers if code != 200]
    assert all(c in ERROR_TYPE_OF_STATUS for c in refused), refused
    by_reason: dict[str, int] = {}
    for a in served:
        r = a["choices"][0]["finish_reason"]
        by_reason[r] = by_reason.get(r, 0) + 1
    for reason in ("stop", "length"):
        assert delta(FINISHED, finish_reason=reason) == by_reason.get(reason, 0), (reason, by_reason)
    assert delta(FINISHED) == len(served)
    for code, error_type in ERROR_TYPE_OF_STATUS.items():
        assert delta(REFUSED, error_type=error_type) == refused.count(code), (error_type, refused)
    assert delta(GENERATED) == sum(a["usage"]["completion_tokens"] for a in served)
    assert delta(PROMPT) == sum(a["usage"]["prompt_tokens"] for a in served)
    assert delta(CACHED) == sum(a["usage"]["prompt_tokens_details"]["cached_tokens"] for a in served)
    # One duration per request answered (served or refused), one TTFT and one queue time per
    # served request.
    assert delta(DURATION + "_count") == len(answers)
    assert delta(TTFT + "_count") == len(served)
    assert delta(QUEUE + "_count") == len(served)
    assert delta(DURATION + "_count", error_type="overloaded") == refused.count(429)


def test_with_a_ratio_sampler_the_engine_counts_every_request_and_the_sidecar_says_what_it_saw():
    """`OTEL_TRACES_SAMPLER=traceidratio` at 0.5: the engine keeps the traces whose id's low 63
    bits fall below half their range (the SDK's rule), so the test chooses ids on both sides
    through `traceparent` and knows which requests the sidecar may see."""
    require_model()
    from procs import SidecarProcess

    sidecar = SidecarProcess()
    engine = EngineProcess(
        otlp=f"http://{sidecar.grpc}",
        env={"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.5"},
    )
    try:
        kept, dropped = [], []
        for i in range(8):
            keep = i % 2 == 1  # the last request is a kept one
            trace_id = f"{i + 1:016x}" + ("0000000000000002" if keep else "fffffffffffffffe")
            (kept if keep else dropped).append(trace_id)
            code, _ = engine.post(
                "/v1/chat/completions",
                {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
                {"traceparent": f"00-{trace_id}-{i + 1:016x}-01"},
            )
            assert code == 200
        # Spans leave the engine in the order their requests finished: once the last kept
        # request is in, every kept one is, and a dropped one would have come before it.
        turns = sidecar.wait_for("/v1/turns", lambda v: kept[-1] in {t["trace_id"] for t in v["turns"]}, "the last kept request")
        assert sorted(t["trace_id"] for t in turns["turns"]) == sorted(kept)

        e = Samples(scrape(engine.base)[2])
        assert e.total(FINISHED) == len(kept) + len(dropped), e.text
        assert e.total(DURATION + "_count") == len(kept) + len(dropped)
        assert e.total(ENGINE_METRIC["TRACE_SAMPLING_RATIO"]) == 0.5

        s = Samples(sidecar.get("/metrics"))
        assert s.total(METRIC["REQUESTS"]) == len(kept), s.text
        assert s.total(DURATION + "_count") == len(kept)
        instance = sidecar.get("/v1/slots")["instances"][0]
        assert instance["sampling_ratio"] == 0.5
        assert s.total(METRIC["SIDECAR_TRACE_SAMPLING_RATIO"], service_instance_id=instance["instance"]) == 0.5
    finally:
        engine.close()
        sidecar.close()


def test_otlp_metrics_reach_a_receiver_with_the_engines_names_and_counts():
    """`OTEL_METRICS_EXPORTER=otlp`: the same instruments, pushed over OTLP/HTTP to a Python
    receiver, count what `/metrics` counts."""
    require_model()
    from otlp_receiver import OtlpReceiver, attrs
    from sidecar_support import _SECTIONS

    otlp_name = _SECTIONS["OTLP metric names"]
    receiver = OtlpReceiver()
    engine = EngineProcess(
        otlp=receiver.base,
        protocol="http/protobuf",
        env={"OTEL_METRICS_EXPORTER": "otlp", "OTEL_METRIC_EXPORT_INTERVAL": "200"},
    )
    try:
        sent = 3
        for i in range(sent):
            assert engine.post("/v1/chat/completions", ask(i, 4))[0] == 200
        assert engine.post("/v1/chat/completions", {"messages": []})[0] == 400
        finished = FINISHED.removesuffix("_total")

        def all_counted(r):
            return sum(p.as_int for p in r.metric_points(finished)) == sent

        receiver.wait(all_counted, f"{finished} = {sent}")
        points = receiver.metric_points(finished)
        assert {attrs(p)["slot_group"] for p in points} == {0}
        assert {attrs(p)["finish_reason"] for p in points} >= {"stop", "length"}
        waiting = receiver.metric_points(WAITING)
        assert [attrs(p) for p in waiting] == [{"slot_group": 0}]
        refused = receiver.metric_points(REFUSED.removesuffix("_total"))
        assert [(attrs(p), p.as_int) for p in refused] == [({"error.type": "validation"}, 1)]
        duration = receiver.metric_points(otlp_name["REQUEST_DURATION"])
        assert sum(p.count for p in duration) == sent + 1
        ok = [p for p in duration if "error.type" not in attrs(p)]
        assert sum(p.count for p in ok) == sent
        assert attrs(ok[0])["gen_ai.operation.name"] == "chat"
        ttft = receiver.metric_points(otlp_name["TIME_TO_FIRST_TOKEN"])
        assert sum(p.count for p in ttft) == sent
        # The conventions' bucket boundaries travel with the histogram.
        assert list(ttft[0].explicit_bounds)[:3] == [0.001, 0.005, 0.01]
        steps = receiver.metric_points(ENGINE_METRIC["STEP_DURATION"])
        assert sum(p.count for p in steps) > 0
        assert receiver.resource_of_metrics()["service.name"] == ENGINE_SERVICE
        # The same counts on /metrics.
        s = Samples(scrape(engine.base)[2])
        assert s.total(FINISHED) == sent and s.total(REFUSED) == 1
    finally:
        engine.close()
        receiver.close()


def test_vllm_compatible_metrics_equal_the_series_they_mirror_under_load():
    """`--metrics-compat vllm`: the endpoint picker's signals under vLLM's names, each equal, in
    every scrape taken under load, to the slotlight_engine_* series it mirrors."""
    require_model()
    e = EngineProcess("--batch", "2", "--max-queue", "64", "--metrics-compat", "vllm", api_key=KEY)
    try:
        v = VLLM_METRIC
        seen_busy = []
        stop = threading.Event()
        problems = []

        def watch():
            while not stop.is_set():
                m = metrics(e)
                model = {"model_name": e.model}
                pairs = [
                    (m.total(v["NUM_REQUESTS_WAITING"], **model), m.total(WAITING)),
                    (m.total(v["NUM_REQUESTS_RUNNING"], **model), m.total(RUNNING)),
                ]
                used, total = m.total(ENGINE_METRIC["KV_BYTES_USED"]), m.total(ENGINE_METRIC["KV_BYTES"])
                pairs.append((m.total(v["KV_CACHE_USAGE_PERC"], **model), used / total if total else 0.0))
                for got, want in pairs:
                    if abs(got - want) > 1e-9:
                        problems.append((got, want, m.text))
                info = m.series(v["CACHE_CONFIG_INFO"])
                if info != [{"model_name": e.model, "block_size": "16",
                             "num_gpu_blocks": str(int(m.total(ENGINE_METRIC["KV_BLOCKS"])))}]:
                    problems.append(("cache_config_info", info))
                lora = m.series(v["LORA_REQUESTS_INFO"])
                if lora != [{"model_name": e.model, "max_lora": "0", "running_lora_adapters": "",
                             "waiting_lora_adapters": ""}]:
                    problems.append(("lora_requests_info", lora))
                if pairs[0][0] > 0 and pairs[1][0] > 0:
                    seen_busy.append(pairs[0][0])
                time.sleep(0.02)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda i: chat(e, ask(i, 16)), range(16)))
        stop.set()
        watcher.join(timeout=30)
        assert all(code == 200 for code, _ in answers), answers[:3]
        assert not problems, problems[:3]
        assert seen_busy, "no scrape saw requests waiting and running"
        # Idle again: the mirrors read 0 with the engine's own gauges.
        m = metrics(e)
        assert m.total(v["NUM_REQUESTS_WAITING"]) == 0 == m.total(WAITING)
        # Without the flag the names are absent (the module's engine runs without it).
    finally:
        e.close()


def test_vllm_names_are_absent_without_the_flag(engine):
    m = metrics(engine)
    assert not any(n.startswith("vllm:") for n, _, _ in m.samples)
