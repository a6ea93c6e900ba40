#!/usr/bin/env python3
"""Load and fault runs against a real engine and sidecar on loopback.

    tests/load/run.py --seconds 300 --clients 64          # the by-hand run (5 minutes)
    tests/load/run.py --seconds 30 --clients 64 --json    # the size the test suite runs

Starts `slotlight-sidecar` and `slotlight-engine serve` (binaries and model found the same way
as the end-to-end tests: $SLOTLIGHT_ENGINE_BIN, $SLOTLIGHT_SIDECAR_BIN, $SLOTLIGHT_MODEL),
drives CLIENTS concurrent streaming chat clients for SECONDS, samples both processes' RSS
from /proc/PID/status once a second, then checks that every accepted request has exactly
one turn record in the sidecar (`GET /v1/turns?request_id=`). Prints the figures; exits 1
when a request failed with anything but an explicit 429, or a turn record is missing or
doubled. Every process it starts is stopped by its own PID; the run stops by itself.

The pieces (`Load`, `RssSampler`, `check_turns`, `stream_chat`) are also what
tests/python/test_reliability.py uses for its shorter runs and fault scenarios.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import sys
import threading
import time
import urllib.parse
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "python"))

from procs import EngineProcess, SidecarProcess, http_json  # noqa: E402

PROMPTS = [
    "Name three colors.",
    "Write one sentence about the sea.",
    "What is the capital of France?",
    "Count from one to five in words.",
    "Give me a word that rhymes with cat.",
    "Describe a lighthouse in a few words.",
]


def stream_chat(base: str, body: dict, timeout: float = 300.0) -> dict:
    """One streamed chat completion over a fresh connection. Returns what happened: HTTP
    status, the response id, the final usage, whether `[DONE]` arrived, and any error."""
    u = urllib.parse.urlsplit(base)
    out = {"status": None, "id": None, "usage": None, "done": False, "error": None, "retry_after": None, "chunks": 0}
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"content-type": "application/json"})
        r = conn.getresponse()
        out["status"] = r.status
        if r.status != 200:
            out["retry_after"] = r.getheader("retry-after")
            raw = r.read()
            try:
                out["error"] = json.loads(raw).get("error")
            except ValueError:
                out["error"] = raw[:200].decode(errors="replace")
            return out
        for line in r:
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                out["done"] = True
                break
            obj = json.loads(data)
            out["chunks"] += 1
            if "error" in obj:
                out["error"] = obj["error"]
                continue
            out["id"] = out["id"] or obj.get("id")
            if obj.get("usage"):
                out["usage"] = obj["usage"]
    except (OSError, http.client.HTTPException, ValueError) as e:
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
    return out


class Load:
    """CLIENTS threads, each sending streamed chat requests back to back until stopped. A 429
    is answered by waiting (Retry-After, capped at one second) and trying again."""

    def __init__(self, base: str, model: str, clients: int = 64, max_tokens: int = 24, seed: int = 1, request_timeout: float = 300.0):
        self.base, self.model, self.clients, self.max_tokens = base, model, clients, max_tokens
        self.request_timeout = request_timeout
        self.stuck = 0
        self.results: list[dict] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._rng = random.Random(seed)
        self.started = None
        self.stopped = None

    def _client(self, n: int):
        rng = random.Random(n)
        i = 0
        while not self._stop.is_set():
            body = {
                "model": self.model,
                "messages": [{"role": "user", "content": f"{rng.choice(PROMPTS)} ({n}.{i})"}],
                "max_tokens": rng.randint(max(1, self.max_tokens // 2), self.max_tokens),
                "stream": True,
                "stream_options": {"include_usage": True},
                "user": f"load-{n}",
            }
            i += 1
            t0 = time.monotonic()
            r = stream_chat(self.base, body, timeout=self.request_timeout)
            r["t0"], r["t1"] = t0, time.monotonic()
            with self._lock:
                self.results.append(r)
            if r["status"] == 429:
                self._stop.wait(min(1.0, float(r["retry_after"] or 1)))
            elif r["status"] is None:
                # No answer at all (an engine restarting): try again shortly, not in a spin.
                self._stop.wait(0.1)

    def start(self):
        self.started = time.monotonic()
        for n in range(self.clients):
            t = threading.Thread(target=self._client, args=(n,), daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self, timeout: float = 600.0):
        """Lets each client finish the request it is in, then stops it. Waits at most
        `timeout` seconds in all; `stuck` counts the clients still in a request after that."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        self.stuck = sum(t.is_alive() for t in self._threads)
        self.stopped = time.monotonic()
        return self

    def snapshot(self) -> list[dict]:
        with self._lock:
            return list(self.results)

    def summary(self, results: list[dict] | None = None) -> dict:
        rs = self.snapshot() if results is None else results
        ok = [r for r in rs if r["status"] == 200 and r["done"] and not r["error"]]
        refused = [r for r in rs if r["status"] == 429]
        errors = [r for r in rs if r not in ok and r["status"] != 429]
        span = max((self.stopped or time.monotonic()) - self.started, 1e-9)
        tokens = sum((r["usage"] or {}).get("completion_tokens", 0) for r in ok)
        ttft = [r["usage"]["ttft_ms"] for r in ok if r["usage"] and "ttft_ms" in r["usage"]]
        e2e = [r["usage"]["e2e_ms"] for r in ok if r["usage"] and "e2e_ms" in r["usage"]]
        return {
            "seconds": round(span, 1),
            "clients": self.clients,
            "completed": len(ok),
            "refused_429": len(refused),
            "errors": len(errors),
            "stuck_clients": self.stuck,
            "error_samples": [{k: r[k] for k in ("status", "error", "done")} for r in errors[:5]],
            "requests_per_s": round(len(ok) / span, 2),
            "completion_tokens_per_s": round(tokens / span, 1),
            "ttft_ms_p50": round(statistics.median(ttft), 1) if ttft else None,
            "ttft_ms_p95": round(sorted(ttft)[int(0.95 * (len(ttft) - 1))], 1) if ttft else None,
            "e2e_ms_p50": round(statistics.median(e2e), 1) if e2e else None,
        }


def rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


class RssSampler:
    """Samples VmRSS of the named PIDs once a second in a thread."""

    def __init__(self, pids: dict[str, int], interval: float = 1.0):
        self.pids, self.interval = pids, interval
        self.samples: dict[str, list[tuple[float, int]]] = {k: [] for k in pids}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        t0 = time.monotonic()
        while not self._stop.is_set():
            for name, pid in self.pids.items():
                v = rss_kib(pid)
                if v is not None:
                    self.samples[name].append((time.monotonic() - t0, v))
            self._stop.wait(self.interval)

    def start(self):
        self._t.start()
        return self

    def stop(self):
        self._stop.set()
        self._t.join(timeout=10)
        return self

    def figures(self) -> dict:
        """Per process: MiB at start, peak, end, and the median of the first and last fifth
        after a warm-up tenth (memory that is flat has last ≈ first)."""
        out = {}
        for name, s in self.samples.items():
            if not s:
                continue
            vals = [v for _, v in s]
            n = len(vals)
            warm = vals[n // 10:] or vals
            k = max(1, len(warm) // 5)
            out[name] = {
                "start_mib": round(vals[0] / 1024, 1),
                "peak_mib": round(max(vals) / 1024, 1),
                "end_mib": round(vals[-1] / 1024, 1),
                "first_fifth_mib": round(statistics.median(warm[:k]) / 1024, 1),
                "last_fifth_mib": round(statistics.median(warm[-k:]) / 1024, 1),
                "samples": n,
            }
        return out


def check_turns(sidecar: SidecarProcess, ids: list[str], wait_s: float = 60.0) -> dict:
    """How many of `ids` have exactly one turn record (polling until all do or `wait_s`)."""
    pending = set(ids)
    doubled: set[str] = set()
    deadline = time.monotonic() + wait_s
    while pending and time.monotonic() < deadline:
        for rid in list(pending):
            v = sidecar.get(f"/v1/turns?request_id={urllib.parse.quote(rid)}")
            if v["count"] >= 1:
                pending.discard(rid)
                if v["count"] > 1:
                    doubled.add(rid)
        if pending:
            time.sleep(0.5)
    return {"checked": len(ids), "missing": sorted(pending), "doubled": sorted(doubled)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=float(os.environ.get("SLOTLIGHT_LOAD_SECONDS", 300)))
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-queue", type=int, default=48, help="engine --max-queue (below CLIENTS, so 429s happen)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args()
    sc = SidecarProcess("--turns", "200000")
    eng = None
    try:
        eng = EngineProcess("--batch", str(a.batch), "--max-queue", str(a.max_queue), otlp=f"http://{sc.grpc}")
        rss = RssSampler({"engine": eng.proc.pid, "sidecar": sc.proc.pid}).start()
        load = Load(eng.base, eng.model, clients=a.clients, max_tokens=a.max_tokens).start()
        time.sleep(a.seconds)
        load.stop()
        rss.stop()
        summary = load.summary()
        ids = [r["id"] for r in load.snapshot() if r["status"] == 200 and r["id"]]
        turns = check_turns(sc, ids)
        health = eng.get("/health")[1]
        report = {
            "load": summary,
            "turns": {k: (len(v) if isinstance(v, list) else v) for k, v in turns.items()},
            "rss": rss.figures(),
            "engine_telemetry": health.get("telemetry"),
        }
        if a.json:
            print(json.dumps(report))
        else:
            print(json.dumps(report, indent=2))
        bad = summary["errors"] > 0 or summary["stuck_clients"] > 0 or turns["missing"] or turns["doubled"]
        return 1 if bad else 0
    finally:
        if eng:
            eng.close()
        sc.close()


if __name__ == "__main__":
    sys.exit(main())
