"""A minimal OTLP/HTTP (protobuf) receiver on loopback, decoding with opentelemetry-proto:
what the engine exports, kept for the test to read. Stops itself on close()."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


class OtlpReceiver:
    """POST /v1/traces, /v1/metrics and /v1/logs on 127.0.0.1:0; every decoded request is kept."""

    def __init__(self):
        self.traces: list[ExportTraceServiceRequest] = []
        self.metrics: list[ExportMetricsServiceRequest] = []
        self.logs: list[ExportLogsServiceRequest] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.path == "/v1/traces":
                    req, resp = ExportTraceServiceRequest(), ExportTraceServiceResponse()
                    sink = receiver.traces
                elif self.path == "/v1/metrics":
                    req, resp = ExportMetricsServiceRequest(), ExportMetricsServiceResponse()
                    sink = receiver.metrics
                elif self.path == "/v1/logs":
                    req, resp = ExportLogsServiceRequest(), ExportLogsServiceResponse()
                    sink = receiver.logs
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                req.ParseFromString(body)
                with receiver.lock:
                    sink.append(req)
                out = resp.SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def spans(self) -> list:
        with self.lock:
            return [s for r in self.traces for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]

    def log_records(self) -> list:
        with self.lock:
            return [r for req in self.logs for rl in req.resource_logs for sl in rl.scope_logs for r in sl.log_records]

    def metric_points(self, name: str) -> list:
        """Every data point of metric `name` from the newest export that has it (cumulative
        metrics: the newest says everything so far)."""
        with self.lock:
            exports = list(self.metrics)
        for req in reversed(exports):
            points = []
            for rm in req.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        if m.name == name:
                            data = getattr(m, m.WhichOneof("data"))
                            points.extend(data.data_points)
            if points:
                return points
        return []

    def resource_of_metrics(self) -> dict[str, str]:
        with self.lock:
            req = self.metrics[-1]
        return {a.key: a.value.string_value for a in req.resource_metrics[0].resource.attributes}

    def wait(self, pred, what: str):
        """Polls until pred(self) holds (bounded: correctness, not speed)."""
        for _ in range(1500):
            if pred(self):
                return
            time.sleep(0.02)
        raise AssertionError(f"the receiver never got {what}")


def attrs(point) -> dict[str, object]:
    """A data point's attributes as a dict of plain values."""
    out = {}
    for a in point.attributes:
        v = a.value
        out[a.key] = getattr(v, v.WhichOneof("value"))
    return out
