#!/usr/bin/env python3
"""Completion tokens per second, end to end, of an OpenAI-compatible server on the speculative
decoding prompt set (prompts.json beside this script): each prompt is one chat message, sent
greedily (temperature 0), one request at a time, `--rounds` times after one untimed warm-up;
the rate is the reply's completion tokens over the request's wall time as the client sees it
(sending to the last byte, the prefill included). The same client drives slotlight-engine
serve and llama.cpp's llama-server, so the two are measured alike.

Also reports what the server says it drafted: slotlight's `usage.completion_tokens_details`
and llama.cpp's `timings.draft_n` / `draft_n_accepted`.

Usage: serve_bench.py BASE_URL [--rounds N] [--json FILE] [--label NAME]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent


def messages(p: dict) -> list[dict]:
    text = p["instruction"]
    if p.get("file"):
        body = (HERE / p["file"]).read_text()
        fence = p.get("fence")
        text += f"\n\n```{fence}\n{body}```" if fence else f"\n\n{body}"
    return [{"role": "user", "content": text}]


def post(base: str, body: dict) -> tuple[dict, float]:
    req = urllib.request.Request(
        base.rstrip("/") + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=900) as r:
        out = json.loads(r.read())
    return out, time.perf_counter() - t0


def drafts(reply: dict) -> tuple[int | None, int | None]:
    """(drafted, accepted) as the server reports them, when it does."""
    t = reply.get("timings") or {}
    if "draft_n" in t:
        return t["draft_n"], t.get("draft_n_accepted")
    d = (reply.get("usage") or {}).get("completion_tokens_details") or {}
    if "accepted_prediction_tokens" in d:
        a = d["accepted_prediction_tokens"]
        return a + d.get("rejected_prediction_tokens", 0), a
    return None, None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default="")
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    prompts = json.loads((HERE / "prompts.json").read_text())["prompts"]
    rows = []
    for p in prompts:
        body = {
            "messages": messages(p),
            "max_tokens": p["max_tokens"],
            "temperature": 0,
            "stream": False,
        }
        rates, tokens, texts, drafted = [], 0, set(), (None, None)
        for r in range(a.rounds + 1):
            reply, secs = post(a.base, body)
            tokens = reply["usage"]["completion_tokens"]
            texts.add(reply["choices"][0]["message"]["content"])
            drafted = drafts(reply)
            if r > 0:
                rates.append(tokens / secs)
        row = {
            "name": p["name"],
            "kind": p["kind"],
            "completion_tokens": tokens,
            "tps": statistics.median(rates),
            "tps_min": min(rates),
            "tps_max": max(rates),
            "drafted": drafted[0],
            "accepted": drafted[1],
            "same_reply_every_round": len(texts) == 1,
            "reply": texts.pop(),
        }
        rows.append(row)
        acc = (
            f"{row['accepted']} of {row['drafted']} draft tokens taken"
            if row["drafted"] is not None
            else "no draft counts"
        )
        print(
            f"{a.label:<22}{p['name']:<11}{tokens:>5} tokens {row['tps']:>7.1f} tok/s "
            f"(min {row['tps_min']:.1f}, max {row['tps_max']:.1f}); {acc}",
            flush=True,
        )
    if a.json:
        Path(a.json).write_text(json.dumps({"label": a.label, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
