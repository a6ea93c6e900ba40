#!/usr/bin/env python3
"""Telemetry cost: decode tok/s with spans exported to a local receiver (the sidecar) against
`--no-telemetry`, side by side in one run. Two engines on the default model take turns (never
both busy), each request streaming 128 greedy tokens; the figures are the requests' own
`usage.decode_tps`.

Usage: .venv/bin/python tests/bench/telemetry_cost.py [--rounds N] [--tokens N]
"""

from __future__ import annotations

import argparse
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
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    a = ap.parse_args()
    sidecar = SidecarProcess()
    on = EngineProcess("--batch", "4", otlp=f"http://{sidecar.grpc}")
    off = EngineProcess("--batch", "4")
    try:
        decode_tps(on, 16)
        decode_tps(off, 16)
        with_t, without = [], []
        for _ in range(a.rounds):
            with_t.append(decode_tps(on, a.tokens))
            without.append(decode_tps(off, a.tokens))
        m_on, m_off = statistics.median(with_t), statistics.median(without)
        exported = on.get("/health")[1]["telemetry"]
        print(f"rounds {a.rounds}, {a.tokens} tokens each")
        print(f"telemetry on  (OTLP/gRPC to the sidecar): median {m_on:7.1f} tok/s  {sorted(round(x, 1) for x in with_t)}")
        print(f"telemetry off (--no-telemetry)          : median {m_off:7.1f} tok/s  {sorted(round(x, 1) for x in without)}")
        print(f"ratio on/off: {m_on / m_off:.4f}  ({(m_on / m_off - 1) * 100:+.2f}%)")
        print(f"spans exported {exported['exported']}, dropped {exported['dropped']}")
    finally:
        on.close()
        off.close()
        sidecar.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
