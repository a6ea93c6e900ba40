#!/usr/bin/env python3
"""The soak run: streaming clients for minutes while the sidecar is SIGKILLed and restarted
on a schedule and the engine is restarted once.

    tests/load/soak.py                                  # 64 clients, 10 minutes (the by-hand run)
    tests/load/soak.py --minutes 2 --clients 16 --json  # a short one

The sidecar keeps its turns in one SQLite file (`--turns-db`) and comes back on the same
OTLP/gRPC address each time; the engine comes back on the same port (SIGTERM: it drains,
then sends the spans it holds). Every accepted request that completed must then have
exactly one turn record in the last sidecar. Prints requests served, refusals, errors (those
of the engine's restart window apart: clients of a stopped engine get refused connections or
`shutting_down`), turn records missing and doubled, the engine's span counts (ended,
exported, dropped: summed over its two lives) and both processes' resident memory every
10 s. Exits 1 on an unexpected error, a stuck client, or a missing or doubled record.
Every process it starts is stopped by its own PID.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "python"))
sys.path.insert(0, str(REPO / "tests" / "load"))

from procs import EngineProcess, SidecarProcess, pinned_sidecar  # noqa: E402
from run import Load, check_turns, rss_kib  # noqa: E402


def engine_on(port: int | None, *extra: str, otlp: str) -> EngineProcess:
    """An engine on `port` (None: a free one), exporting to `otlp`."""
    if port is None:
        return EngineProcess(*extra, otlp=otlp)
    real_popen = subprocess.Popen

    def popen(args, *a, **kw):
        out = list(args)
        i = out.index("--port")
        out[i + 1] = str(port)
        return real_popen(out, *a, **kw)

    subprocess.Popen = popen
    try:
        return EngineProcess(*extra, otlp=otlp)
    finally:
        subprocess.Popen = real_popen


def telemetry(eng: EngineProcess) -> dict:
    try:
        return eng.get("/health")[1]["telemetry"]
    except (OSError, KeyError, TypeError, ValueError):
        return {}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-queue", type=int, default=48)
    ap.add_argument("--sidecar-every", type=float, default=120.0, help="seconds between sidecar kills")
    ap.add_argument("--engine-restart-at", type=float, default=None, help="seconds in (default: half way)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    seconds = a.minutes * 60
    restart_at = a.engine_restart_at if a.engine_restart_at is not None else seconds / 2
    scratch = tempfile.TemporaryDirectory(prefix="slotlight-soak-")
    db = str(Path(scratch.name) / "turns.db")
    sc = SidecarProcess("--turns-db", db, "--turns", "500000")
    grpc = sc.grpc
    otlp = f"http://{grpc}"
    engine_args = ("--batch", str(a.batch), "--max-queue", str(a.max_queue))
    eng = engine_on(None, *engine_args, otlp=otlp)
    port = int(eng.base.rsplit(":", 1)[1])
    lives = []  # the engine's span counts at the end of each life
    rss = []  # (t, engine MiB, sidecar MiB)
    kills = []
    restart_window = None
    try:
        load = Load(eng.base, eng.model, clients=a.clients, max_tokens=a.max_tokens).start()
        t0 = time.monotonic()
        next_kill = a.sidecar_every
        next_rss = 0.0
        restarted = False
        while (now := time.monotonic() - t0) < seconds:
            if now >= next_rss:
                e, s = rss_kib(eng.proc.pid), rss_kib(sc.proc.pid)
                rss.append((round(now), round((e or 0) / 1024, 1), round((s or 0) / 1024, 1)))
                next_rss += 10
            if now >= next_kill:
                sc.proc.kill()
                sc.proc.wait(timeout=10)
                sc.close()
                sc = pinned_sidecar(grpc, "--turns-db", db, "--turns", "500000")
                kills.append(round(now, 1))
                next_kill += a.sidecar_every
            if not restarted and now >= restart_at:
                began = time.monotonic()
                before = telemetry(eng)
                eng.proc.send_signal(signal.SIGTERM)
                eng.proc.wait(timeout=120)
                lives.append({"before_sigterm": before})
                eng = engine_on(port, *engine_args, otlp=otlp)
                restart_window = (began, time.monotonic())
                restarted = True
            time.sleep(0.5)
        load.stop(timeout=300)
        # Let the engine send what it still holds.
        deadline = time.monotonic() + 60
        while telemetry(eng).get("queued", 0) and time.monotonic() < deadline:
            time.sleep(0.5)
        lives.append({"end": telemetry(eng)})
        results = load.snapshot()
        ok = [r for r in results if r["status"] == 200 and r["done"] and not r["error"]]
        refused = [r for r in results if r["status"] == 429]
        errors = [r for r in results if r not in ok and r["status"] != 429]

        def in_restart(r):
            if restart_window is None:
                return False
            lo, hi = restart_window
            return r["t1"] >= lo - 1 and r["t0"] <= hi + 1

        restart_errors = [r for r in errors if in_restart(r)]
        unexpected = [r for r in errors if not in_restart(r)]
        turns = check_turns(sc, [r["id"] for r in ok if r["id"]], wait_s=120)
        ended = sum(v.get("ended", 0) for life in lives for v in life.values())
        exported = sum(v.get("exported", 0) for life in lives for v in life.values())
        dropped = sum(v.get("dropped", 0) for life in lives for v in life.values())
        report = {
            "minutes": a.minutes,
            "clients": a.clients,
            "requests_served": len(ok),
            "refused_429": len(refused),
            "failed_attempts_in_engine_restart": len(restart_errors),
            "errors_unexpected": len(unexpected),
            "error_samples": [{k: r[k] for k in ("status", "error")} for r in unexpected[:5]],
            "stuck_clients": load.stuck,
            "sidecar_kills_at_s": kills,
            "engine_restart_s": round(restart_window[1] - restart_window[0], 1) if restart_window else None,
            "turns": {k: (len(v) if isinstance(v, list) else v) for k, v in turns.items()},
            "missing_sample": turns["missing"][:5],
            "spans": {"ended": ended, "exported": exported, "dropped": dropped},
            "engine_lives": lives,
            "rss_mib_every_10s": rss,
        }
        print(json.dumps(report) if a.json else json.dumps(report, indent=2))
        bad = unexpected or load.stuck or turns["missing"] or turns["doubled"]
        return 1 if bad else 0
    finally:
        eng.close()
        sc.close()
        scratch.cleanup()


if __name__ == "__main__":
    sys.exit(main())
