"""Faults and load against the real engine and sidecar processes on loopback, each scenario
bounded in time and asserting outcomes, never speed:

* a short overload (64 streaming clients, a queue smaller than that): only explicit 429s,
  exactly one turn record per accepted request;
* misbehaving clients (one disconnects mid-stream, one reads a byte at a time, one sends its
  body or its headers a byte at a time, one sends an oversized head) while others are served:
  each gets its documented answer, the others finish, and nothing stays in flight;
* the sidecar SIGKILLed and restarted on the same port under load;
* an OTLP collector answering 503 (to the engine, and to the sidecar's `--forward-otlp`) or
  not listening at all;
* the sidecar down for 10 s under load: within the export queue's bound no span is lost and
  every turn arrives once it is back; beyond the bound the engine's drop count equals the
  spans that never arrived;
* the KV cache exhausted by long prompts (requests preempted, none lost, no block leaked);
* SIGTERM under load: exit code 0 after the drain, every client answered, every finished
  request recorded.

The long by-hand run is `tests/load/run.py --seconds 300 --clients 64`; its pieces are
reused here with shorter runs.
"""

from __future__ import annotations

import json
import select
import signal
import socket
import sys
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from procs import REPO, EngineProcess, SidecarProcess, pinned_sidecar, require_model
from sidecar_support import METRIC

sys.path.insert(0, str(REPO / "tests" / "load"))

from run import Load, RssSampler, check_turns, stream_chat  # noqa: E402


@pytest.fixture(autouse=True)
def _model():
    require_model()


# ---------------------------------------------------------------------------------------------
# helpers


def wait_until(pred, timeout: float, what: str, interval: float = 0.2):
    """Polls `pred` until it returns a truthy value (returned) or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def assert_no_crash_logged(*logs: list[str]):
    """No panic and no ERROR line in the processes' logs."""
    bad = [l for log in logs for l in list(log) if "panicked" in l or " ERROR " in l]
    assert bad == [], bad[:10]


def health(engine) -> dict:
    code, v = engine.get("/health")
    assert code == 200, v
    return v


def assert_idle(engine, timeout: float = 30.0) -> dict:
    """Waits (bounded) until the engine holds nothing: no request in flight or queued, no
    active sequence, every KV block free or evictable; returns the last /health."""

    def idle():
        h = health(engine)
        listed = engine.get("/v1/requests")[1]["data"]
        ok = (
            h["in_flight"] == 0
            and h["queued"] == 0
            and not listed
            and all(g["active"] == 0 and g["queued"] == 0 and g["kv_blocks_available"] == g["kv_blocks"] for g in h["groups"])
        )
        return h if ok else None

    try:
        return wait_until(idle, timeout, "the engine to hold nothing")
    except AssertionError:
        raise AssertionError(f"engine not idle: {json.dumps(health(engine))} requests={engine.get('/v1/requests')[1]['data']}") from None


def chat_body(engine, content: str, max_tokens: int = 8, **extra) -> dict:
    return {
        "model": engine.model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }


def ok(r: dict) -> bool:
    return r["status"] == 200 and r["done"] and not r["error"]


def addr(engine) -> tuple[str, int]:
    u = urllib.parse.urlsplit(engine.base)
    return u.hostname, u.port


def raw_request(body: dict, extra_headers: str = "") -> bytes:
    data = json.dumps(body).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        f"content-length: {len(data)}\r\n{extra_headers}\r\n"
    )
    return head.encode() + data


def read_response(s: socket.socket, timeout: float) -> tuple[int | None, dict, bytes]:
    """Reads one whole (content-length) HTTP response; (None, {}, what came) when the server
    closed or reset the connection without one, or sent none within `timeout`."""
    s.settimeout(timeout)
    buf = b""
    try:
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(65536)
            if not chunk:
                return None, {}, buf
            buf += chunk
        head, _, body = buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, v in (l.split(":", 1) for l in lines[1:] if ":" in l)}
        n = int(headers.get("content-length", "0"))
        while len(body) < n:
            chunk = s.recv(65536)
            if not chunk:
                break
            body += chunk
        return status, headers, body
    except (ConnectionResetError, BrokenPipeError, TimeoutError):
        return None, {}, buf


def openai_error(body: bytes) -> dict:
    err = json.loads(body)["error"]
    assert err["message"] and err["type"], err
    return err


def metric_sum(text: str, name: str) -> float:
    """The sum over label sets of a Prometheus sample `name` (0 when absent)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name)] in " {":
            total += float(line.rsplit(" ", 1)[1])
    return total


class Collector503:
    """A stand-in OTLP/HTTP collector on loopback that answers 503 to every POST."""

    def __init__(self):
        self.posts: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length") or 0))
                outer.posts.append(self.path)
                body = b'{"code": 14, "message": "unavailable"}'
                self.send_response(503)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# ---------------------------------------------------------------------------------------------
# 1. a short overload


def test_overload_gives_only_429s_and_one_turn_record_per_accepted_request():
    sc = SidecarProcess()
    eng = None
    try:
        eng = EngineProcess("--batch", "8", "--max-queue", "16", otlp=f"http://{sc.grpc}")
        rss = RssSampler({"engine": eng.proc.pid, "sidecar": sc.proc.pid}).start()
        load = Load(eng.base, eng.model, clients=64, max_tokens=12, request_timeout=120).start()
        time.sleep(20)
        load.stop(timeout=120)
        rss.stop()
        results = load.snapshot()
        summary = load.summary()
        print("load:", json.dumps(summary))
        print("rss:", json.dumps(rss.figures()))
        assert load.stuck == 0, "a client never got an answer"
        assert summary["errors"] == 0, summary["error_samples"]
        refused = [r for r in results if r["status"] == 429]
        assert refused, "64 clients against 8 slots and a queue of 16 must see 429s"
        for r in refused:
            assert r["retry_after"] and int(r["retry_after"]) >= 1, r
            assert r["error"]["code"] == "queue_full" and r["error"]["message"], r
        accepted = [r for r in results if r["status"] == 200]
        assert accepted and all(ok(r) and r["id"] and r["usage"] for r in accepted)
        turns = check_turns(sc, [r["id"] for r in accepted])
        print("turns:", json.dumps({k: (len(v) if isinstance(v, list) else v) for k, v in turns.items()}))
        assert turns["missing"] == [] and turns["doubled"] == [], turns
        assert eng.proc.poll() is None and sc.proc.poll() is None
        assert_idle(eng)
        assert_no_crash_logged(eng.log, sc.stderr_lines)
    finally:
        if eng:
            eng.close()
        sc.close()


# ---------------------------------------------------------------------------------------------
# 2. misbehaving clients while others are served


def test_misbehaving_clients_get_their_answers_while_others_are_served():
    max_header = 16384
    eng = EngineProcess("--batch", "4", "--read-timeout-s", "2", "--max-header-bytes", str(max_header))
    host, port = addr(eng)
    outcomes: dict[str, object] = {}
    normal: list[dict] = []
    misbehaving_done = threading.Event()
    try:

        def normal_client(n: int):
            i = 0
            while not misbehaving_done.is_set() or i == 0:
                normal.append(stream_chat(eng.base, chat_body(eng, f"Name a color. ({n}.{i})"), timeout=120))
                i += 1

        def disconnects_mid_stream():
            # A long request (it would run for minutes), dropped after its first token.
            s = socket.create_connection((host, port), timeout=60)
            s.sendall(raw_request(chat_body(eng, "Tell me a long story.", max_tokens=1024, ignore_eos=True)))
            buf = b""
            while buf.count(b"data: ") < 3:
                chunk = s.recv(4096)
                if not chunk:
                    break
                buf += chunk
            s.close()
            outcomes["disconnect"] = buf.split(b"\r\n", 1)[0]

        def slow_reader():
            # A small receive buffer, one byte every 0.3 s for 4 s, then gone.
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
            s.settimeout(60)
            s.connect((host, port))
            s.sendall(raw_request(chat_body(eng, "Tell me another long story.", max_tokens=1024, ignore_eos=True)))
            got = b""
            end = time.monotonic() + 4
            while time.monotonic() < end:
                b = s.recv(1)
                if not b:
                    break
                got += b
                time.sleep(0.3)
            s.close()
            outcomes["slow_reader"] = got

        def slow_body():
            # The head at once, then the body a byte every 0.5 s: 408 after the 2 s read timeout.
            req = raw_request(chat_body(eng, "slow body"))
            head, _, body = req.partition(b"\r\n\r\n")
            s = socket.create_connection((host, port), timeout=10)
            s.sendall(head + b"\r\n\r\n")
            end = time.monotonic() + 10
            for b in body:
                if time.monotonic() > end or select.select([s], [], [], 0.5)[0]:
                    break
                try:
                    s.send(bytes([b]))
                except OSError:
                    break
            outcomes["slow_body"] = read_response(s, timeout=10)
            s.close()

        def slow_head():
            # Headers a byte every 0.5 s (slowloris): the server ends it after 2 s, long
            # before the head would be whole (our own limit is 10 s).
            s = socket.create_connection((host, port), timeout=10)
            end = time.monotonic() + 10
            cut = False
            for b in raw_request(chat_body(eng, "slow head")):
                if time.monotonic() > end:
                    break
                if select.select([s], [], [], 0.5)[0]:
                    cut = True
                    break
                try:
                    s.send(bytes([b]))
                except OSError:
                    cut = True
                    break
            outcomes["slow_head"] = (read_response(s, timeout=5), cut)
            s.close()

        def oversized_head():
            s = socket.create_connection((host, port), timeout=10)
            try:
                s.sendall(raw_request(chat_body(eng, "big"), extra_headers=f"x-padding: {'a' * (max_header + 4096)}\r\n"))
            except OSError:
                pass
            outcomes["oversized_head"] = read_response(s, timeout=10)
            s.close()

        normals = [threading.Thread(target=normal_client, args=(n,), daemon=True) for n in range(3)]
        bad = [threading.Thread(target=f, daemon=True) for f in (disconnects_mid_stream, slow_reader, slow_body, slow_head, oversized_head)]
        for t in normals + bad:
            t.start()
        for t in bad:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in bad), f"a misbehaving client hung: {outcomes.keys()}"
        misbehaving_done.set()
        for t in normals:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in normals), "a normal client hung"

        print("misbehaving:", {k: (v if k != "slow_reader" else v[:16]) for k, v in outcomes.items()})
        assert outcomes["disconnect"].startswith(b"HTTP/1.1 200"), outcomes["disconnect"]
        assert outcomes["slow_reader"].startswith(b"HTTP/1.1 200"), outcomes["slow_reader"]
        status, _, body = outcomes["slow_body"]
        assert status == 408, outcomes["slow_body"]
        assert openai_error(body)["code"] == "request_timeout"
        (status, _, body), cut = outcomes["slow_head"]
        assert cut, "the server let a head arrive a byte every 0.5 s for 10 s"
        assert status in (None, 408), (status, body)
        status, _, body = outcomes["oversized_head"]
        assert status == 431, outcomes["oversized_head"]

        print(f"normal requests served meanwhile: {len(normal)}")
        assert len(normal) >= 3
        assert all(ok(r) for r in normal), [r for r in normal if not ok(r)][:3]
        # The dropped and the slow stream were cancelled: nothing left in flight, no slot or
        # KV block held (left running they would take minutes).
        assert_idle(eng, timeout=30)
        assert eng.proc.poll() is None
        assert_no_crash_logged(eng.log)
    finally:
        eng.close()


# ---------------------------------------------------------------------------------------------
# 3. the sidecar SIGKILLed and restarted in place under load


def test_sidecar_killed_and_restarted_under_load():
    sc = SidecarProcess()
    grpc = sc.grpc
    eng = EngineProcess("--batch", "8", otlp=f"http://{grpc}")
    try:
        load = Load(eng.base, eng.model, clients=6, max_tokens=12, request_timeout=120).start()
        wait_until(lambda: sum(ok(r) for r in load.snapshot()) >= 4, 60, "requests before the kill")
        sc.proc.kill()
        sc.proc.wait(timeout=10)
        killed = time.monotonic()
        before = health(eng)["telemetry"]
        wait_until(lambda: health(eng)["telemetry"]["failures"] > before["failures"], 30, "failed exports counted")
        time.sleep(2)
        sc = pinned_sidecar(grpc)
        restarted = time.monotonic()
        after_restart = health(eng)["telemetry"]
        wait_until(lambda: sum(ok(r) and r["t0"] > restarted + 1.0 for r in load.snapshot()) >= 6, 90, "requests after the restart")
        load.stop(timeout=120)
        results = load.snapshot()
        summary = load.summary()
        # The export queue tries again on its own backoff: wait (bounded) for it to reach the
        # new sidecar rather than read the counts the moment the load ends.
        tel = wait_until(
            lambda: (t := health(eng)["telemetry"])["exported"] > after_restart["exported"] and t,
            60,
            "export resumed after the restart",
        )
        print("load:", json.dumps(summary))
        print("telemetry:", json.dumps(tel))
        assert load.stuck == 0
        assert summary["errors"] == 0 and summary["refused_429"] == 0, summary["error_samples"]
        # The spans of the outage were retried, not dropped (the queue's bound is far away).
        assert tel["failures"] > 0 and tel["dropped"] == 0, tel
        # Requests that finished after the kill (with a margin for a batch sent just before
        # it) have their records in the new sidecar: those of the outage too, and those that
        # started before the kill and lost their earlier spans with the old sidecar.
        later = [r["id"] for r in results if ok(r) and r["t1"] > killed + 1.0]
        print("finished after the kill:", len(later), "during the outage:", sum(ok(r) and killed + 1.0 < r["t1"] < restarted for r in results))
        turns = check_turns(sc, later, wait_s=30)
        assert turns["missing"] == [] and turns["doubled"] == [], turns
        assert eng.proc.poll() is None
        assert_idle(eng)
        assert_no_crash_logged(eng.log, sc.stderr_lines)
    finally:
        eng.close()
        sc.close()


# ---------------------------------------------------------------------------------------------
# 4. a collector that answers 503, or is not there


def test_engine_exporting_to_a_collector_answering_503_retries_and_counts_what_passes_its_bound():
    col = Collector503()
    eng = None
    try:
        # A queue of 10 spans: three requests make more than that.
        eng = EngineProcess("--batch", "4", "--otlp-queue-spans", "10", otlp=col.url, protocol="http/protobuf")
        rs = [stream_chat(eng.base, chat_body(eng, f"Say hello. ({i})"), timeout=120) for i in range(3)]
        assert all(ok(r) for r in rs), rs
        tel = wait_until(
            lambda: (t := health(eng)["telemetry"])["failures"] > 1 and t["dropped"] > 0 and t,
            30,
            "export failures and the queue's overflow counted",
        )
        print("telemetry:", json.dumps(tel))
        # 503 is retried (the same batch, again and again), never dropped for itself: what is
        # lost is exactly what passed the bound, and the rest is still held.
        assert tel["exported"] == 0, tel
        assert tel["queue_max_spans"] == 10 and tel["queued"] == 10, tel
        assert tel["ended"] == tel["exported"] + tel["dropped"] + tel["queued"], tel
        assert col.posts and set(col.posts) == {"/v1/traces"}, col.posts
        assert len(col.posts) > 1, "the batch was sent again"
        assert_idle(eng)
        assert_no_crash_logged(eng.log)
    finally:
        if eng:
            eng.close()
        col.close()


def sidecar_received(sc) -> float:
    with urllib.request.urlopen(f"http://{sc.views}/metrics", timeout=10) as r:
        return metric_sum(r.read().decode(), METRIC["SIDECAR_SPANS_RECEIVED"])


def test_a_10_s_sidecar_outage_under_load_loses_no_span_within_the_queue_bound(tmp_path):
    db = str(tmp_path / "turns.db")
    sc = SidecarProcess("--turns-db", db)
    grpc = sc.grpc
    eng = EngineProcess("--batch", "8", otlp=f"http://{grpc}")
    try:
        load = Load(eng.base, eng.model, clients=6, max_tokens=12, request_timeout=120).start()
        wait_until(lambda: sum(ok(r) for r in load.snapshot()) >= 4, 60, "requests before the outage")
        time.sleep(5)
        up_t0 = time.monotonic() - 5
        sc.close()
        down = time.monotonic()
        time.sleep(10)
        back = time.monotonic()
        during = health(eng)["telemetry"]
        sc = pinned_sidecar(grpc, "--turns-db", db)
        load.stop(timeout=120)
        results = load.snapshot()
        # Throughput with the sidecar up (5 s before) and down (the 10 s): figures, printed.
        served = lambda a, b: sum(ok(r) and a <= r["t1"] < b for r in results)  # noqa: E731
        print(f"requests/s with the sidecar up: {served(up_t0, down) / (down - up_t0):.1f}, "
              f"down: {served(down, back) / (back - down):.1f}")
        print("telemetry during the outage:", json.dumps(during))
        assert during["queued"] > 0 and during["failures"] > 0 and during["dropped"] == 0, during
        assert served(down, back) > 0, "requests were served while the sidecar was down"
        tel = wait_until(lambda: (t := health(eng)["telemetry"])["queued"] == 0 and t, 60, "the export queue emptied")
        print("telemetry after:", json.dumps(tel))
        assert tel["dropped"] == 0 and tel["ended"] == tel["exported"], tel
        # Every turn, before, during and after the outage, is in the store the sidecar reopened,
        # once.
        assert load.stuck == 0
        ids = [r["id"] for r in results if ok(r)]
        turns = check_turns(sc, ids, wait_s=60)
        print("turns:", {k: (len(v) if isinstance(v, list) else v) for k, v in turns.items()})
        assert turns["missing"] == [] and turns["doubled"] == [], turns
        assert_idle(eng)
        assert_no_crash_logged(eng.log, sc.stderr_lines)
    finally:
        eng.close()
        sc.close()


def test_beyond_the_export_queue_bound_the_engine_counts_exactly_the_spans_that_never_arrived():
    sc = SidecarProcess()
    grpc = sc.grpc
    eng = EngineProcess("--batch", "4", "--otlp-queue-spans", "40", otlp=f"http://{grpc}")
    try:
        rs = [stream_chat(eng.base, chat_body(eng, f"Before ({i})"), timeout=120) for i in range(3)]
        assert all(ok(r) for r in rs), rs
        # Quiet before the outage: everything sent was received, nothing is in flight.
        wait_until(lambda: health(eng)["telemetry"]["queued"] == 0, 30, "the first spans exported")
        wait_until(lambda: sidecar_received(sc) == health(eng)["telemetry"]["exported"], 30, "the sidecar counted them")
        first = sidecar_received(sc)
        sc.proc.kill()
        sc.proc.wait(timeout=10)
        load = Load(eng.base, eng.model, clients=4, max_tokens=12, request_timeout=120).start()
        time.sleep(10)
        load.stop(timeout=120)
        during = health(eng)["telemetry"]
        print("telemetry during the outage:", json.dumps(during))
        assert during["dropped"] > 0 and during["queued"] == 40, during
        sc = pinned_sidecar(grpc)
        tel = wait_until(lambda: (t := health(eng)["telemetry"])["queued"] == 0 and t, 60, "the held spans exported")
        wait_until(lambda: first + sidecar_received(sc) >= tel["exported"], 30, "the sidecar counted them")
        received = first + sidecar_received(sc)
        print("telemetry after:", json.dumps(tel), "received by the sidecars:", received)
        # Both sides counted: what the engine made is what arrived plus what it says it dropped.
        assert tel["ended"] == tel["exported"] + tel["dropped"], tel
        assert received == tel["exported"], (received, tel)
        assert tel["dropped"] == tel["ended"] - received, (received, tel)
        assert_no_crash_logged(eng.log)
    finally:
        eng.close()
        sc.close()


@pytest.mark.parametrize("upstream", ["http-503", "grpc-closed-port"])
def test_sidecar_forwarding_to_a_failing_upstream_still_records_turns(upstream):
    col = Collector503() if upstream == "http-503" else None
    url = col.url if col else f"grpc://127.0.0.1:{closed_port()}"
    sc = SidecarProcess("--forward-otlp", url, "--forward-timeout-ms", "1000")
    eng = None
    try:
        eng = EngineProcess("--batch", "4", otlp=f"http://{sc.grpc}")
        rs = [stream_chat(eng.base, chat_body(eng, f"Say hello. ({i})"), timeout=120) for i in range(3)]
        assert all(ok(r) for r in rs), rs
        turns = check_turns(sc, [r["id"] for r in rs], wait_s=30)
        assert turns["missing"] == [] and turns["doubled"] == [], turns
        dropped = METRIC["SIDECAR_FORWARD_DROPPED"]
        text = wait_until(lambda: (m := sc.get("/metrics")) and metric_sum(m, dropped) > 0 and m, 30, f"{dropped} > 0")
        print(f"{upstream}: {dropped}={metric_sum(text, dropped)}")
        assert metric_sum(text, METRIC["SIDECAR_FORWARDED"]) == 0, text
        if col:
            assert col.posts and set(col.posts) == {"/v1/traces"}, col.posts
        assert sc.proc.poll() is None
        assert_no_crash_logged(eng.log, sc.stderr_lines)
    finally:
        if eng:
            eng.close()
        sc.close()
        if col:
            col.close()


# ---------------------------------------------------------------------------------------------
# 5. the KV cache exhausted by long prompts


def test_kv_cache_exhausted_by_long_prompts():
    # Context and cache of 128 positions: 8 + 1 blocks of 16. A 56-token prompt takes 4 blocks
    # at admission, so two run at once (8 blocks, 1 left); each needs a 5th block at position
    # 64, which only one can get: the other is preempted and prefilled again later.
    ctx, prompt_len, max_tokens = 128, 56, 16
    eng = EngineProcess("--batch", "4", "--kv-cache-tokens", str(ctx), ctx_size=ctx)
    try:

        def prompt(i: int, n: int) -> list[int]:
            return [1000 + (i * 997 + j * 13) % 40000 for j in range(n)]

        results: dict[int, tuple[int, dict]] = {}

        def one(i: int):
            body = {"model": eng.model, "prompt": prompt(i, prompt_len), "max_tokens": max_tokens, "ignore_eos": True}
            results[i] = eng.post("/v1/completions", body)

        threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(8)]
        for t in threads:
            t.start()
        too_long = eng.post("/v1/completions", {"model": eng.model, "prompt": prompt(99, ctx + 72), "max_tokens": 4})
        for t in threads:
            t.join(timeout=150)
        assert not any(t.is_alive() for t in threads), "a request hung"

        code, v = too_long
        assert code == 400 and v["error"]["code"] == "context_length_exceeded" and v["error"]["message"], too_long
        served = 0
        for i, (code, v) in sorted(results.items()):
            if code == 200:
                assert v["usage"]["completion_tokens"] == max_tokens, v
                assert v["usage"]["prompt_tokens"] == prompt_len, v
                served += 1
            else:
                assert code in (400, 429, 503) and v["error"]["message"], (i, code, v)
        h = assert_idle(eng)
        preemptions = sum(g["preemptions"] for g in h["groups"])
        print(f"served {served}/8, preemptions {preemptions}, groups {h['groups']}")
        assert preemptions > 0, "the cache was never exhausted"
        assert eng.proc.poll() is None
        code, v = eng.post("/v1/completions", {"model": eng.model, "prompt": "The sky is", "max_tokens": 4})
        assert code == 200 and v["usage"]["completion_tokens"] >= 1, v
        assert_no_crash_logged(eng.log)
    finally:
        eng.close()


# ---------------------------------------------------------------------------------------------
# 6. SIGTERM under load


def test_sigterm_under_load_drains_and_flushes_telemetry():
    drain_s = 4
    sc = SidecarProcess()
    eng = EngineProcess("--batch", "8", "--drain-timeout-s", str(drain_s), otlp=f"http://{sc.grpc}")
    try:
        load = Load(eng.base, eng.model, clients=16, max_tokens=16, request_timeout=drain_s + 60).start()
        wait_until(lambda: sum(ok(r) for r in load.snapshot()) >= 6, 90, "requests before SIGTERM")
        eng.proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        load.stop(timeout=drain_s + 60)
        assert load.stuck == 0, "a client hung through shutdown"
        # Bounded: the drain, then the export queue's last sends (at most 5 s more).
        rc = eng.proc.wait(timeout=drain_s + 15)
        print(f"exit code {rc}, {time.monotonic() - signalled:.1f} s after SIGTERM")
        assert rc == 0, "".join(eng.log[-20:])

        results = load.snapshot()
        done = [r for r in results if ok(r)]
        refused, cancelled, bad = [], [], []
        for r in results:
            if ok(r):
                continue
            if r["status"] == 503 and r["error"]["code"] == "shutting_down":
                refused.append(r)
            elif r["status"] is None and str(r["error"]).startswith("ConnectionRefusedError"):
                refused.append(r)
            elif r["status"] == 200 and r["done"] and isinstance(r["error"], dict) and r["error"].get("message"):
                cancelled.append(r)
            else:
                bad.append(r)
        print(f"completed {len(done)}, refused {len(refused)}, cancelled {len(cancelled)}")
        assert bad == [], bad[:5]
        for r in cancelled:
            assert "shutting down" in r["error"]["message"], r
        # The exporter was flushed on the way out: every finished request has its record.
        turns = check_turns(sc, [r["id"] for r in done], wait_s=30)
        assert turns["missing"] == [] and turns["doubled"] == [], turns
        assert_no_crash_logged(eng.log, sc.stderr_lines)
    finally:
        eng.close()
        sc.close()
