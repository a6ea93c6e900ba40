"""Replays an agent-shaped load against the engine, with and without keeping live sessions' KV.

An agent's session is many turns, each resending the whole history: the system prompt (shared
by every session, as an agent's system prompt and tool list are), the task, and after each reply
the output of the tool the agent ran, which took a while (the tool gap). Many sessions run at
once, and other traffic (one-off requests without a session: other users, sub-agents, batch
jobs) goes on beside them. Scaled to a small CPU machine: SmolLM2-135M, a KV cache smaller
than the sessions' histories together, a few seconds of tool gap.

Each mode starts its own engine (`slotlight-engine serve`, stopped by its PID at the end) and
replays the same load (the same seed: the same tasks, tool outputs, gaps and other traffic):

- `keep`: live sessions' KV kept (`--session-kv-ttl 300`, the default, within
  `--session-kv-share 0.5`);
- `off`: not kept (`--session-kv-ttl 0`): a session's blocks are evicted in plain LRU order
  while its tool runs.

Reported per mode: the sessions' cache-hit ratio (prompt tokens served from the KV cache over
prompt tokens, turns after the first), time to first token per turn index (the engine's own
`usage.ttft_ms`: arrival to first token), and the turns by resume outcome. `--json` prints one
JSON object; otherwise a Markdown table (docs/performance.md, "Agent sessions").

    .venv/bin/python tests/bench/sessions/agent_replay.py
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho "
         "sigma tau upsilon phi chi psi omega file line error test build module crate function "
         "value struct trait import return match branch commit diff patch log trace span").split()

SYSTEM_HEAD = ("You are a coding agent. You work in a repository, run tools (read files, run "
               "tests, search the code) and answer with the next step. Be terse. Tools:\n")


def system_prompt(words: int) -> str:
    """The agents' shared system prompt: instructions and a tool list of about `words` words
    (agents send thousands of tokens of tool definitions with every turn)."""
    rng = random.Random(0)
    tools = []
    while sum(len(t.split()) for t in tools) < words:
        name = rng.choice(WORDS) + "_" + rng.choice(WORDS)
        tools.append(f"- {name}({rng.choice(WORDS)}: string): {text(rng, 12)}")
    return SYSTEM_HEAD + "\n".join(tools)


def engine_bin() -> Path:
    env = os.environ.get("SLOTLIGHT_ENGINE_BIN")
    if env:
        return Path(env)
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    for profile in ("release", "debug"):
        p = target / profile / "slotlight-engine"
        if p.exists():
            return p
    raise SystemExit("slotlight-engine not found: cargo build --release -p slotlight-engine")


class Engine:
    """`slotlight-engine serve` on a free loopback port; stopped by its own PID."""

    def __init__(self, args: list[str]):
        cmd = [str(engine_bin()), "serve", "--port", "0", "--no-telemetry", *args]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        self.base = None
        deadline = time.monotonic() + 300
        while self.base is None:
            line = self.proc.stderr.readline()
            if not line:
                raise SystemExit("the engine exited before listening")
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                self.base = m.group(1)
            if time.monotonic() > deadline:
                raise SystemExit("the engine did not start")
        threading.Thread(target=lambda: [None for _ in self.proc.stderr], daemon=True).start()

    def post(self, path: str, body: dict, headers: dict | None = None) -> dict:
        req = urllib.request.Request(self.base + path, data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json", **(headers or {})})
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.loads(r.read())

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) + str(rng.randrange(100)) for _ in range(words))


def plan(seed: int, sessions: int, turns: int, gap: tuple[float, float], tool_words: int):
    """The load, drawn once: per session its task, and per turn the tool's output and the gap
    before the next turn."""
    rng = random.Random(seed)
    out = []
    for s in range(sessions):
        out.append({
            "task": f"Task {s}: fix the failing test in module {text(rng, 12)}",
            "start": rng.uniform(0, gap[1]),
            "turns": [{"tool": text(rng, tool_words), "gap": rng.uniform(*gap)} for _ in range(turns)],
        })
    return out


def run_session(engine: Engine, sid: str, p: dict, system: str, max_tokens: int, out: list,
                lock: threading.Lock):
    time.sleep(p["start"])
    messages = [{"role": "system", "content": system}, {"role": "user", "content": p["task"]}]
    for i, t in enumerate(p["turns"]):
        r = engine.post("/v1/chat/completions",
                        {"messages": messages, "max_tokens": max_tokens, "temperature": 0},
                        {"x-session-id": sid})
        u = r["usage"]
        with lock:
            out.append({
                "session": sid, "turn": i, "prompt_tokens": u["prompt_tokens"],
                "cached_tokens": u["prompt_tokens_details"]["cached_tokens"],
                "ttft_ms": u["ttft_ms"], "resume": u.get("resume"),
            })
        messages.append({"role": "assistant", "content": r["choices"][0]["message"]["content"]})
        # The agent runs its tool, then sends what it printed.
        time.sleep(t["gap"])
        messages.append({"role": "user", "content": "Tool output:\n" + t["tool"]})


def other_traffic(engine: Engine, seed: int, words: int, pause: float, stop: threading.Event,
                  count: list):
    """One-off requests without a session, one after another with `pause` seconds between,
    until the sessions are done."""
    rng = random.Random(seed + 1)
    while not stop.is_set():
        engine.post("/v1/completions", {"prompt": text(rng, words), "max_tokens": 1})
        count[0] += 1
        stop.wait(pause)


def replay(mode: str, a) -> dict:
    ttl = "300" if mode == "keep" else "0"
    engine = Engine(["--model", a.model, "--ctx-size", str(a.ctx), "--batch", str(a.batch),
                     "--kv-cache-tokens", str(a.kv_tokens), "--session-kv-ttl", ttl,
                     "--session-kv-share", str(a.share)])
    try:
        load = plan(a.seed, a.sessions, a.turns, (a.gap_min, a.gap_max), a.tool_words)
        rows: list[dict] = []
        lock = threading.Lock()
        stop = threading.Event()
        others = [0]
        bg = [threading.Thread(target=other_traffic,
                               args=(engine, a.seed + k, a.other_words, a.other_pause, stop, others))
              for k in range(a.other)]
        system = system_prompt(a.system_words)
        for t in bg:
            t.start()
        started = time.monotonic()
        threads = [threading.Thread(target=run_session,
                                    args=(engine, f"agent-{mode}-{s}", p, system, a.max_tokens, rows, lock))
                   for s, p in enumerate(load)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - started
        stop.set()
        for t in bg:
            t.join()
    finally:
        engine.close()
    later = [r for r in rows if r["turn"] > 0]
    by_turn = {}
    for i in range(a.turns):
        ts = [r for r in rows if r["turn"] == i]
        ttft = [r["ttft_ms"] for r in ts]
        by_turn[i] = {
            "ttft_ms_mean": statistics.fmean(ttft),
            "ttft_ms_p50": statistics.median(ttft),
            "hit_ratio": sum(r["cached_tokens"] for r in ts) / max(1, sum(r["prompt_tokens"] for r in ts)),
            "prompt_tokens_mean": statistics.fmean(r["prompt_tokens"] for r in ts),
        }
    outcomes: dict[str, int] = {}
    for r in later:
        outcomes[r["resume"]] = outcomes.get(r["resume"], 0) + 1
    ttft_later = sorted(r["ttft_ms"] for r in later)
    return {
        "mode": mode, "wall_s": wall, "other_requests": others[0],
        "cache_hit_ratio": sum(r["cached_tokens"] for r in later) / max(1, sum(r["prompt_tokens"] for r in later)),
        "ttft_ms_mean": statistics.fmean(ttft_later),
        "ttft_ms_p50": statistics.median(ttft_later),
        "ttft_ms_p90": ttft_later[int(0.9 * (len(ttft_later) - 1))],
        "by_turn": by_turn, "outcomes": outcomes,
    }


def markdown(results: list[dict], turns: int) -> str:
    keep, off = results
    lines = [
        "| measure (turns after the first) | KV kept (`--session-kv-ttl 300`) | not kept (`--session-kv-ttl 0`) |",
        "|---|---|---|",
        f"| cache-hit ratio | {keep['cache_hit_ratio']:.3f} | {off['cache_hit_ratio']:.3f} |",
        f"| time to first token, mean | {keep['ttft_ms_mean']:.0f} ms | {off['ttft_ms_mean']:.0f} ms |",
        f"| time to first token, median | {keep['ttft_ms_p50']:.0f} ms | {off['ttft_ms_p50']:.0f} ms |",
        f"| time to first token, p90 | {keep['ttft_ms_p90']:.0f} ms | {off['ttft_ms_p90']:.0f} ms |",
        f"| resume outcomes | {fmt(keep['outcomes'])} | {fmt(off['outcomes'])} |",
        f"| other requests served meanwhile | {keep['other_requests']} | {off['other_requests']} |",
        "",
        "| turn | prompt tokens (mean) | hit ratio, kept | hit ratio, not kept | TTFT mean, kept | TTFT mean, not kept |",
        "|---|---|---|---|---|---|",
    ]
    for i in range(turns):
        k, o = keep["by_turn"][i], off["by_turn"][i]
        lines.append(f"| {i} | {k['prompt_tokens_mean']:.0f} | {k['hit_ratio']:.3f} | {o['hit_ratio']:.3f} "
                     f"| {k['ttft_ms_mean']:.0f} ms | {o['ttft_ms_mean']:.0f} ms |")
    return "\n".join(lines)


def fmt(outcomes: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m", help="a model file or a known model name")
    p.add_argument("--sessions", type=int, default=6)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--system-words", type=int, default=120, help="words of the shared system prompt")
    p.add_argument("--gap-min", type=float, default=2.0, help="shortest tool gap, seconds")
    p.add_argument("--gap-max", type=float, default=6.0, help="longest tool gap, seconds")
    p.add_argument("--tool-words", type=int, default=20, help="words of tool output per turn")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--other", type=int, default=1, help="clients of one-off requests beside the sessions")
    p.add_argument("--other-words", type=int, default=200)
    p.add_argument("--other-pause", type=float, default=0.2, help="seconds between one-off requests")
    p.add_argument("--kv-tokens", type=int, default=4096)
    p.add_argument("--ctx", type=int, default=2048)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--share", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=32)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    results = [replay(m, a) for m in ("keep", "off")]
    if a.json:
        json.dump({"args": vars(a), "results": results}, sys.stdout, indent=1)
        print()
    else:
        print(markdown(results, a.turns))


if __name__ == "__main__":
    main()
