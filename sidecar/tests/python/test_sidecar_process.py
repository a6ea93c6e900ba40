"""The sidecar as a process: its command line, start-up line, bad input over HTTP, and a
clean exit on SIGTERM."""

import gzip
import json
import subprocess
import time
import urllib.error
import urllib.request

from sidecar_support import ATTR, ENGINE_SERVICE, METRIC, SidecarProcess, sidecar_binary


def post(sc, body, content_type, encoding=None):
    headers = {"content-type": content_type}
    if encoding:
        headers["content-encoding"] = encoding
    req = urllib.request.Request(f"http://{sc.http}/v1/traces", data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_help_lists_the_options():
    out = subprocess.run([str(sidecar_binary()), "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0
    for flag in ["--otlp-grpc", "--otlp-http", "--listen", "--forward-otlp", "--token",
                 "--allow-otlp-from", "--turns", "--max-body-bytes", "--max-traces"]:
        assert flag in out.stdout, flag
    bench = subprocess.run([str(sidecar_binary()), "bench", "--help"], capture_output=True, text=True, timeout=30)
    assert bench.returncode == 0 and "--duration-s" in bench.stdout


def test_startup_line_and_sigterm():
    sc = SidecarProcess()
    try:
        assert "(loopback only)" in sc.startup_line
        assert sc.get("/healthz").strip() == "ok"
    finally:
        sc.proc.terminate()
        assert sc.proc.wait(timeout=10) == 0
        sc.close()


def test_logs_to_a_pipe_carry_no_colour_codes():
    # Regression: the sidecar wrote ANSI colour codes into its logs whatever stderr was.
    sc = SidecarProcess()
    sc.proc.terminate()
    assert sc.proc.wait(timeout=10) == 0
    for _ in range(200):
        if any("shutting down" in line for line in sc.stderr_lines):
            break
        time.sleep(0.01)
    logs = "".join(sc.stderr_lines)
    assert "shutting down" in logs and "\x1b[" not in logs, logs
    sc.close()


def test_bad_input_then_still_serving(sidecar):
    status, headers, _ = post(sidecar, b"\xff\xff\xff\xff garbage", "application/x-protobuf")
    assert status == 400 and headers["content-type"] == "application/x-protobuf"
    status, _, body = post(sidecar, b"{not json", "application/json")
    assert status == 400 and "message" in json.loads(body)
    status, _, _ = post(sidecar, b"hello", "text/plain")
    assert status == 415
    bomb = gzip.compress(b"\0" * (64 << 20), compresslevel=9)
    status, _, _ = post(sidecar, bomb, "application/x-protobuf", "gzip")
    assert status == 413

    body = {"resourceSpans": [{
        "resource": {"attributes": [
            {"key": ATTR["SERVICE_NAME"], "value": {"stringValue": "someone-else"}}]},
        "scopeSpans": [{"spans": [{
            "traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b174",
            "name": "GET /", "kind": 2, "startTimeUnixNano": "1", "endTimeUnixNano": "2000001"}]}],
    }]}
    status, _, resp = post(sidecar, json.dumps(body).encode(), "application/json")
    assert status == 200, resp
    metrics = sidecar.get("/metrics")
    assert f"{METRIC['SIDECAR_SPANS_IGNORED']} 1" in metrics
    assert f'{METRIC["SIDECAR_REQUESTS_REJECTED"]}{{reason="malformed"}} 2' in metrics
    assert f'{METRIC["SIDECAR_REQUESTS_REJECTED"]}{{reason="too_large"}} 1' in metrics
    assert 'service_name="someone-else",span_name="GET /",span_kind="SPAN_KIND_SERVER"' in metrics
    assert ENGINE_SERVICE not in json.dumps(sidecar.get("/v1/slots"))
