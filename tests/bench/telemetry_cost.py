#!/usr/bin/env python3
"""Telemetry cost: decode tok/s with spans exported to a local receiver (the sidecar) against
`--no-telemetry`, side by side in one run. Two engines on the default model take turns (never
both busy; the order alternates between rounds so that neither always runs second), each request
streaming 128 greedy tokens; the figures are the requests' own `usage.decode_tps`.

Two processes differ in more than their flags (where their memory lands, for one), so the pair
of engines is started afresh `--restarts` times, the one with telemetry first every other time,
and the rounds are spread over the pairs.

Telling a cost from noise: each round gives one paired ratio on/off. The script prints the
median ratio and a 95% bootstrap confidence interval of it (10,000 resamples of the rounds,
seeded); a cost is shown when the whole interval lies below 1, and "under 1%" holds when the
interval's lower end is above 0.99.

Usage: .venv/bin/python tests/bench/telemetry_cost.py [--rounds N] [--restarts N] [--tokens N]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from procs import EngineProcess, SidecarProcess  # noqa: E402


def decode_tps(engine: EngineProcess, tokens: int) -> float:
    code, v = engine.post(
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
            "max_tokens": tokens,
            "temperature": 0,
            "ignore_eos": True,
        },
    )
    assert code == 200, v
    return v["usage"]["decode_tps"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--restarts", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=128)
    a = ap.parse_args()
    sidecar = SidecarProcess()
    with_t, without, exported = [], [], {"exported": 0, "dropped": 0}
    try:
        for pair in range(a.restarts):

            def start_on():
                return EngineProcess("--batch", "4", otlp=f"http://{sidecar.grpc}")

            def start_off():
                return EngineProcess("--batch", "4")

            if pair % 2 == 0:
                on, off = start_on(), start_off()
            else:
                off, on = start_off(), start_on()
            try:
                decode_tps(on, 16)
                decode_tps(off, 16)
                rounds = a.rounds // a.restarts + (pair < a.rounds % a.restarts)
                for r in range(rounds):
                    if r % 2 == 0:
                        with_t.append(decode_tps(on, a.tokens))
                        without.append(decode_tps(off, a.tokens))
                    else:
                        without.append(decode_tps(off, a.tokens))
                        with_t.append(decode_tps(on, a.tokens))
                t = on.get("/health")[1]["telemetry"]
                exported["exported"] += t["exported"]
                exported["dropped"] += t["dropped"]
            finally:
                on.close()
                off.close()
        m_on, m_off = statistics.median(with_t), statistics.median(without)
        ratios = [x / y for x, y in zip(with_t, without)]
        rng = random.Random(1)
        boot = sorted(
            statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(10_000)
        )
        lo, hi = boot[249], boot[9_749]
        print(f"rounds {a.rounds} over {a.restarts} pairs of engines, {a.tokens} tokens each")
        print(f"telemetry on  (OTLP/gRPC to the sidecar): median {m_on:7.1f} tok/s  {sorted(round(x, 1) for x in with_t)}")
        print(f"telemetry off (--no-telemetry)          : median {m_off:7.1f} tok/s  {sorted(round(x, 1) for x in without)}")
        med = statistics.median(ratios)
        print(f"paired ratio on/off: median {med:.4f} ({(med - 1) * 100:+.2f}%), 95% CI [{lo:.4f}, {hi:.4f}]")
        verdict = (
            "a cost is shown (the interval lies below 1)" if hi < 1
            else "no cost is shown (the interval contains 1 or lies above it)"
        )
        print(f"{verdict}; under 1%: {'yes' if lo > 0.99 else 'not shown'}")
        print(f"spans exported {exported['exported']}, dropped {exported['dropped']}")
    finally:
        sidecar.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
