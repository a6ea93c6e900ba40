"""The engine's own operations as spans (tracing-opentelemetry, through the request spans'
provider), exported over OTLP/HTTP to a Python receiver that decodes with opentelemetry-proto:
the start-up (model, tokenizer, KV cache, warm-up) and the shutdown (drain, telemetry flush),
each a trace of its own, with the engine's resource.

Span names come from otel/CONTRACT.md (SPAN)."""

from __future__ import annotations

from otlp_receiver import OtlpReceiver
from procs import EngineProcess, require_model
from sidecar_support import ATTR, ENGINE_SERVICE, SPAN


def test_startup_and_shutdown_are_spans_of_their_own_traces():
    require_model()
    receiver = OtlpReceiver()
    engine = EngineProcess(otlp=receiver.base, protocol="http/protobuf")
    try:
        assert engine.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})[0] == 200
    finally:
        engine.close()
        receiver.close()
    assert engine.proc.returncode == 0, "".join(engine.log)
    spans = receiver.spans()
    by_name: dict[str, list] = {}
    for s in spans:
        by_name.setdefault(s.name, []).append(s)

    def one(name):
        found = by_name.get(name, [])
        assert len(found) == 1, f"{name}: {len(found)} spans among {sorted(by_name)}"
        return found[0]

    for root, children in [
        (SPAN["STARTUP"], ["STARTUP_MODEL", "STARTUP_TOKENIZER", "STARTUP_KV_CACHE", "STARTUP_WARMUP"]),
        (SPAN["SHUTDOWN"], ["SHUTDOWN_DRAIN", "SHUTDOWN_TELEMETRY_FLUSH"]),
    ]:
        r = one(root)
        assert r.parent_span_id == b"", f"{root} is a root"
        starts = []
        for c in children:
            child = one(SPAN[c])
            assert child.trace_id == r.trace_id and child.parent_span_id == r.span_id, c
            assert r.start_time_unix_nano <= child.start_time_unix_nano <= child.end_time_unix_nano <= r.end_time_unix_nano, c
            starts.append(child.start_time_unix_nano)
        assert starts == sorted(starts), f"{root}'s phases in order"
    model_attrs = {a.key: a.value for a in one(SPAN["STARTUP_MODEL"]).attributes}
    assert model_attrs[ATTR["MODEL_ARCH"]].string_value, model_attrs
    assert model_attrs[ATTR["MODEL_WEIGHT_TYPES"]].string_value, model_attrs
    assert model_attrs[ATTR["MODEL_CONTEXT_LENGTH"]].int_value > 0, model_attrs
    startup, shutdown = one(SPAN["STARTUP"]), one(SPAN["SHUTDOWN"])
    request = next(s for s in spans if s.name.startswith("chat "))
    assert len({startup.trace_id, shutdown.trace_id, request.trace_id}) == 3, "three traces"
    assert startup.end_time_unix_nano <= request.start_time_unix_nano <= shutdown.start_time_unix_nano
    # Same provider, same resource as the request spans.
    resources = {
        tuple(sorted((a.key, a.value.string_value) for a in rs.resource.attributes))
        for r in receiver.traces
        for rs in r.resource_spans
    }
    assert len(resources) == 1
    assert dict(next(iter(resources)))[ATTR["SERVICE_NAME"]] == ENGINE_SERVICE
