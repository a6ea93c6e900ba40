"""The official OpenTelemetry Python SDK sends engine-shaped spans (explicit start and end
times) over OTLP/gRPC and OTLP/HTTP; the sidecar's views reflect them."""

import json
import time

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Link, SpanKind

from sidecar_support import ATTR, ENGINE_SERVICE, METRIC, OP_CHAT, PATH_SLOT, PATH_SOLO, SPAN

MS = 1_000_000
S = 1_000_000_000


def provider_for(exporter, instance):
    resource = Resource.create(
        {
            ATTR["SERVICE_NAME"]: ENGINE_SERVICE,
            ATTR["SERVICE_INSTANCE_ID"]: instance,
            ATTR["SERVICE_VERSION"]: "0.1.0-test",
        }
    )
    provider = TracerProvider(resource=resource)
    # Simple processor: each span is exported when it ends, so order is the engine's order.
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def exporter(kind, sidecar, compression=None):
    from opentelemetry.exporter.otlp.proto.grpc import trace_exporter as g

    if kind == "grpc":
        comp = None
        if compression == "gzip":
            from grpc import Compression

            comp = Compression.Gzip
        return GrpcExporter(endpoint=f"http://{sidecar.grpc}", insecure=True, compression=comp)
    from opentelemetry.exporter.otlp.proto.http import Compression as HttpCompression

    return HttpExporter(
        endpoint=f"http://{sidecar.http}/v1/traces",
        compression=HttpCompression.Gzip if compression == "gzip" else HttpCompression.NoCompression,
    )


def ids(request_id, session_id):
    return {ATTR["REQUEST_ID"]: request_id, ATTR["GEN_AI_CONVERSATION_ID"]: session_id}


def place(path, index):
    a = {ATTR["LEG_PATH"]: path, ATTR["SLOT_GROUP"]: 0}
    if index is not None:
        a[ATTR["SLOT_INDEX"]] = index
    return a


def run_request(tracer, request_id, session_id, finish=True, sidecar=None, instance=None):
    """One request: queue → prefill → solo leg (3 s at 50 tok/s) → moves to slot 0 → finishes.

    Returns the usage attributes of its request span. With finish=False it stops before the
    second leg ends (the request is still decoding in slot 0)."""
    t0 = time.time_ns() - 4 * S
    admitted = t0 + 5 * MS
    first = admitted + 45 * MS
    common = ids(request_id, session_id)
    times = {ATTR["REQUEST_START_TIME"]: t0, ATTR["REQUEST_FIRST_TOKEN_TIME"]: first}
    root = tracer.start_span(f"{OP_CHAT} tiny-model", kind=SpanKind.SERVER, start_time=t0, attributes=common)
    ctx = trace.set_span_in_context(root)

    q = tracer.start_span(SPAN["QUEUE"], context=ctx, start_time=t0, attributes={**common, **place(PATH_SOLO, None)})
    q.end(end_time=admitted)
    if sidecar:
        row = sidecar.wait_row(instance, PATH_SOLO, None, lambda r: r["request_id"] == request_id)
        assert row["state"] == "prefill"

    p = tracer.start_span(SPAN["PREFILL"], context=ctx, start_time=admitted, attributes={
        **common,
        ATTR["PREFILL_PROMPT_TOKENS"]: 20,
        ATTR["PREFILL_CACHED_TOKENS"]: 4,
        ATTR["PREFILL_COMPUTED_TOKENS"]: 16,
        ATTR["PREFILL_DEVICE_MS"]: 44.5,
    })
    p.end(end_time=first)

    # Leg 0 on the solo path: 12 windows of 250 ms at 50 tok/s.
    leg0 = tracer.start_span(SPAN["LEG"], context=ctx, start_time=admitted, attributes={
        **common, **place(PATH_SOLO, None), ATTR["LEG_INDEX"]: 0, ATTR["LEG_START_TIME"]: admitted,
        ATTR["LEG_TOKENS_CARRIED"]: 0, **times,
    })
    leg0_ctx = trace.set_span_in_context(leg0)
    generated = 1
    for i in range(12):
        w0 = first + i * 250 * MS
        generated = 1 + (i + 1) * 25 // 2
        d = tracer.start_span(SPAN["DECODE"], context=leg0_ctx, start_time=w0, attributes={
            **common, **place(PATH_SOLO, None), ATTR["LEG_INDEX"]: 0, ATTR["LEG_START_TIME"]: admitted,
            ATTR["LEG_TOKENS_CARRIED"]: 0, ATTR["DECODE_WINDOW_TOKENS"]: 12,
            ATTR["DECODE_TOKENS_GENERATED"]: generated, ATTR["DECODE_LAST_TOKEN_TIME"]: w0 + 250 * MS,
            ATTR["DECODE_DEVICE_MS"]: 240.0, **times,
        })
        d.end(end_time=w0 + 250 * MS)
    moved_at = first + 3 * S
    leg0.set_attributes({ATTR["LEG_TOKENS_GENERATED"]: generated, ATTR["LEG_END_REASON"]: "moved",
                         ATTR["LEG_DEVICE_MS"]: 2900.0, ATTR["LEG_BATCH_SIZE_MAX"]: 1,
                         ATTR["LEG_BATCH_SIZE_MEAN"]: 1.0})
    leg0.end(end_time=moved_at)

    # Leg 1 in slot 0, linked to leg 0.
    carried = generated
    leg1 = tracer.start_span(SPAN["LEG"], context=ctx, start_time=moved_at,
                             links=[Link(leg0.get_span_context())], attributes={
        **common, **place(PATH_SLOT, 0), ATTR["LEG_INDEX"]: 1, ATTR["LEG_START_TIME"]: moved_at,
        ATTR["LEG_TOKENS_CARRIED"]: carried, **times,
    })
    leg1_ctx = trace.set_span_in_context(leg1)
    generated += 10
    d = tracer.start_span(SPAN["DECODE"], context=leg1_ctx, start_time=moved_at, attributes={
        **common, **place(PATH_SLOT, 0), ATTR["LEG_INDEX"]: 1, ATTR["LEG_START_TIME"]: moved_at,
        ATTR["LEG_TOKENS_CARRIED"]: carried, ATTR["DECODE_WINDOW_TOKENS"]: 10,
        ATTR["DECODE_TOKENS_GENERATED"]: generated, ATTR["DECODE_LAST_TOKEN_TIME"]: moved_at + 200 * MS,
        ATTR["DECODE_DEVICE_MS"]: 150.0, **times,
    })
    d.end(end_time=moved_at + 200 * MS)
    if not finish:
        return None
    end = moved_at + 200 * MS
    leg1.set_attributes({ATTR["LEG_TOKENS_GENERATED"]: 10, ATTR["LEG_END_REASON"]: "finished",
                         ATTR["LEG_DEVICE_MS"]: 150.0, ATTR["LEG_BATCH_SIZE_MAX"]: 2,
                         ATTR["LEG_BATCH_SIZE_MEAN"]: 1.5})
    leg1.end(end_time=end)
    usage = {
        ATTR["GEN_AI_OPERATION_NAME"]: OP_CHAT,
        ATTR["GEN_AI_REQUEST_MODEL"]: "tiny-model",
        ATTR["GEN_AI_RESPONSE_MODEL"]: "tiny-model",
        ATTR["GEN_AI_RESPONSE_FINISH_REASONS"]: ["stop"],
        ATTR["GEN_AI_USAGE_INPUT_TOKENS"]: 20,
        ATTR["GEN_AI_USAGE_OUTPUT_TOKENS"]: generated,
        ATTR["GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS"]: 4,
        ATTR["USAGE_PREFILLED_TOKENS"]: 16,
        ATTR["USAGE_QUEUE_MS"]: 5.0,
        ATTR["USAGE_PREFILL_MS"]: 44.5,
        ATTR["USAGE_TTFT_MS"]: 50.0,
        ATTR["USAGE_DECODE_MS"]: 3050.0,
        ATTR["USAGE_GENERATION_MS"]: (end - first) / 1e6,
        ATTR["USAGE_DECODE_TPS"]: (generated - 1) / 3.05,
        ATTR["USAGE_E2E_MS"]: (end + MS - t0) / 1e6,
        ATTR["REQUEST_LEGS"]: 2,
        ATTR["REQUEST_MOVED"]: True,
        ATTR["SLOT_GROUP"]: 0,
        **times,
    }
    root.set_attributes(usage)
    root.end(end_time=end + MS)
    return usage


@pytest.mark.parametrize("transport,compression", [("grpc", None), ("grpc", "gzip"), ("http", None), ("http", "gzip")])
def test_sdk_spans_become_rows_and_turns(sidecar, transport, compression):
    instance = f"py-{transport}-{compression or 'plain'}"
    provider = provider_for(exporter(transport, sidecar, compression), instance)
    tracer = provider.get_tracer("slotlight-engine")
    try:
        # A request still decoding in slot 0 after moving from the solo path.
        run_request(tracer, "live-1", "sess-live", finish=False, sidecar=sidecar, instance=instance)
        row = sidecar.wait_row(instance, PATH_SLOT, 0, lambda r: r["request_id"] == "live-1")
        assert row["state"] == "decoding"
        assert row["session_id"] == "sess-live"
        assert row["tokens_generated"] == 161
        assert row["elapsed_s"] >= 3.2, row  # from the request's own start
        assert abs(row["tok_s"] - 160 / 3.2) < 0.5, row  # the request's rate, not 161 / 0.2 s
        assert abs(row["ttft_ms"] - 50.0) < 1e-6
        solo = sidecar.wait_row(instance, PATH_SOLO, None)
        assert solo["state"] == "idle"

        # A finished request: its turn record equals its request span's attributes.
        usage = run_request(tracer, "done-1", "sess-done")
        turn = sidecar.wait_turn("done-1")
    finally:
        provider.shutdown()
    assert turn["instance"] == instance
    assert turn["session_id"] == "sess-done"
    assert turn["model"] == "tiny-model"
    assert turn["finish_reason"] == "stop"
    for field, key in [
        ("prompt_tokens", "GEN_AI_USAGE_INPUT_TOKENS"),
        ("cached_tokens", "GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS"),
        ("prefilled_tokens", "USAGE_PREFILLED_TOKENS"),
        ("completion_tokens", "GEN_AI_USAGE_OUTPUT_TOKENS"),
        ("queue_ms", "USAGE_QUEUE_MS"),
        ("prefill_ms", "USAGE_PREFILL_MS"),
        ("ttft_ms", "USAGE_TTFT_MS"),
        ("decode_ms", "USAGE_DECODE_MS"),
        ("generation_ms", "USAGE_GENERATION_MS"),
        ("decode_tps", "USAGE_DECODE_TPS"),
        ("e2e_ms", "USAGE_E2E_MS"),
        ("total_ms", "USAGE_E2E_MS"),
    ]:
        assert turn[field] == usage[ATTR[key]], field
    assert turn["moved"] is True
    assert [(l["path"], l["slot"]) for l in turn["legs"]] == [(PATH_SOLO, None), (PATH_SLOT, 0)]
    assert turn["legs"][1]["tokens"] == 10
    assert turn["legs_complete"] is True
    assert len(turn["trace_id"]) == 32

    # The same record is one JSON line on stdout.
    for _ in range(500):
        lines = [json.loads(l) for l in sidecar.stdout_lines if '"done-1"' in l]
        if lines:
            break
        time.sleep(0.01)
    assert lines == [turn]

    metrics = sidecar.get("/metrics")
    genai = f'gen_ai_operation_name="{OP_CHAT}",gen_ai_request_model="tiny-model",gen_ai_response_model="tiny-model"'
    assert f'{METRIC["MOVES"]}{{{genai}}} 1' in metrics
    assert f'{METRIC["REQUESTS"]}{{{genai},status="ok",finish_reason="stop"}} 1' in metrics
    assert METRIC["SPAN_CALLS"] in metrics


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_sdk_metrics_are_accepted_and_counted(sidecar, transport):
    """The Python SDK's OTLP metric exporter (gRPC and HTTP) gets success answers, and the
    sidecar counts the data points it received."""
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetrics
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricExportResult

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    counter = provider.get_meter("test").create_counter("requests")
    counter.add(3, {"route": "a"})
    counter.add(1, {"route": "b"})
    data = reader.get_metrics_data()
    if transport == "grpc":
        exp = GrpcMetrics(endpoint=f"http://{sidecar.grpc}", insecure=True)
    else:
        exp = HttpMetrics(endpoint=f"http://{sidecar.http}/v1/metrics")
    name = METRIC["SIDECAR_METRIC_POINTS_RECEIVED"]

    def points(text):
        return next((float(l.split()[-1]) for l in text.splitlines() if l.startswith(name + " ")), None)

    before = points(sidecar.get("/metrics"))
    assert exp.export(data) == MetricExportResult.SUCCESS
    exp.shutdown()
    provider.shutdown()
    assert points(sidecar.get("/metrics")) == before + 2
