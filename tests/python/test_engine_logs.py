"""The per-turn records as OTLP log records, end to end: with OTEL_LOGS_EXPORTER=otlp the
engine process sends one `Request.Finished` (or `Request.Refused`) record per request to a
Python receiver that decodes them with opentelemetry-proto, each under its request span's
trace and span ids, with the line's fields as attributes; without the variable it sends none;
and the sidecar counts the records it receives (slotlight_sidecar_log_records_received_total).

Metric names come from otel/CONTRACT.md (METRIC)."""

from __future__ import annotations

import re
import time

from otlp_receiver import OtlpReceiver
from procs import EngineProcess, SidecarProcess, require_model
from sidecar_support import METRIC, SPAN

LOGS = {"OTEL_LOGS_EXPORTER": "otlp"}


def _chat(engine, text, **extra):
    return engine.post("/v1/chat/completions", {"messages": [{"role": "user", "content": text}], "max_tokens": 3, **extra})


def _attrs(r) -> dict[str, str]:
    out = {}
    for a in r.attributes:
        kind = a.value.WhichOneof("value")
        out[a.key] = str(getattr(a.value, kind)) if kind else None
    return out


def test_each_request_has_one_record_under_its_request_span():
    require_model()
    receiver = OtlpReceiver()
    engine = EngineProcess("--data-parallel-rank", "2", otlp=receiver.base, protocol="http/protobuf", env=LOGS)
    try:
        assert _chat(engine, "hello")[0] == 200
        assert _chat(engine, "hello again")[0] == 200
        assert _chat(engine, "too hot", temperature=9)[0] == 400
    finally:
        engine.close()  # shutdown flushes the records
        receiver.close()
    roots = [s for s in receiver.spans() if s.name.startswith("chat ")]
    assert len(roots) == 3, [s.name for s in receiver.spans() if not s.name.startswith(SPAN["DECODE"])]
    records = receiver.log_records()
    assert len(records) == 3, records
    for root in roots:
        mine = [r for r in records if r.trace_id == root.trace_id]
        assert len(mine) == 1, f"one record per request: {mine}"
        r = mine[0]
        assert r.span_id == root.span_id
        refused = root.status.code == 2  # STATUS_CODE_ERROR
        assert r.event_name == ("Request.Refused" if refused else "Request.Finished")
        assert (r.severity_text, r.severity_number) == ("INFO", 9)
        # The replica that served it, on its request span (issue 25): instance and rank.
        span_attrs = {x.key: x.value for x in root.attributes}
        assert span_attrs["slotlight.engine.data_parallel_rank"].int_value == 2
        assert span_attrs["slotlight.engine.instance"].string_value
        a = _attrs(r)
        span_id = {x.key: x.value.string_value for x in root.attributes}["slotlight.request.id"]
        assert a["request_id"] == span_id
        assert a["status"] == ("refused" if refused else "ok")


def test_without_the_variable_no_record_is_sent():
    require_model()
    receiver = OtlpReceiver()
    engine = EngineProcess(otlp=receiver.base, protocol="http/protobuf")
    try:
        assert _chat(engine, "hello")[0] == 200
    finally:
        engine.close()
        receiver.close()
    assert any(s.name.startswith("chat ") for s in receiver.spans()), "spans still go"
    assert receiver.logs == [], "no logs exporter without OTEL_LOGS_EXPORTER=otlp"


def test_the_sidecar_counts_the_records():
    require_model()
    sidecar = SidecarProcess()
    engine = EngineProcess(otlp=f"http://{sidecar.grpc}", env=LOGS)
    try:
        for i in range(2):
            assert _chat(engine, f"hi {i}")[0] == 200
        engine.close()
        name = METRIC["SIDECAR_LOG_RECORDS_RECEIVED"]
        value = None
        for _ in range(500):
            m = re.search(rf"^{name} (\S+)$", sidecar.get("/metrics"), re.M)
            value = float(m.group(1)) if m else None
            if value == 2:
                break
            time.sleep(0.02)
        assert value == 2, f"{name} = {value}"
    finally:
        engine.close()
        sidecar.close()
