"""Agent conversations replayed turn by turn: how much of each turn is prefilled, and how soon
its first token comes, on slotlight with and without its session features and on llama.cpp's
llama-server, on the same GGUF file.

Each scenario is a deterministic conversation (seeded text, greedy `temperature: 0`), replayed
on three servers, one after the other (never two at once), each started fresh and stopped by
its PID:

- `after`: `slotlight-engine serve` with its defaults (remembered replies, checkpoints inside
  long replies on sliding-window models);
- `before`: the same with those features off: `--reply-memory-mib 0` (a resent reply is
  prompted as the re-tokenization of its text), and `--window-checkpoint-every 0` when the
  binary has that flag (the report says whether it had);
- `llama`: llama.cpp's `llama-server` (`--llama-server PATH` or `$LLAMA_SERVER`), the same
  threads (`-t`/`-tb`), one slot per concurrent session of the scenario (`-np`; slotlight gets
  as many, `--batch`), its prompt cache on (`cache_prompt: true` is sent; its defaults
  otherwise, `--cache-ram` included; `--llama-args` adds to them). The Gemma 3 file ships no
  chat template: llama-server is given its Gemma one (`--no-jinja --chat-template gemma`),
  as slotlight renders Gemma's turns, so that both prompt the same tokens.

Every server is asked the same messages; each is sent its own previous replies back (an agent
resends what it was given), so the conversations are the same up to the replies' wording.
Scenarios (`--scenario NAME`, repeatable; all by default):

- `tools` (SmolLM2-135M): an agent loop where every assistant turn is a forced tool call
  (`tools` with one function, `tool_choice: "required"`); the client resends the assistant
  message with its `tool_calls` and a `role: tool` message with the tool's output. The same
  again on the Messages API (`tool_use` blocks resent, then `tool_result`; session key in
  `metadata.user_id`). A server that answers in text instead (llama-server does not offer
  tools to a template without them) is sent its text back and the output as a user message.
- `long` (Gemma 3 270M, sliding window of 512): two sessions at once, each turn a long reply
  (`ignore_eos`, `--long-tokens` tokens) resent as the assistant message, then about 200
  tokens of tool output. Session 0 resends its replies as they came; session 1 replaces
  `--edit-chars` characters of each reply before resending it, by default its last ones (a
  divergence inside the reply); with `--edit-back N` the replaced span ends N characters
  before the reply's end, so that the divergence lies further back than the window's 512
  positions from the turn's end (what checkpoints inside a reply are for; the engine takes
  them every `--window-checkpoint-every` positions of a reply, 2,048 by default, so the
  replies must be longer than that: `--long-tokens 4096`). Turns after an edited reply are
  reported apart: the client changed tokens there, not only added them.
- `side` (SmolLM2-135M): a main conversation and, between its turns, a side call under the
  same session key (its own short system prompt asking for a title, and the last user
  message), as Claude Code does; the next main turn should still resume (`full`).
- `cached13k` (Gemma 3 270M, `--ctx-size 32768`): a system prompt and history of about 13k
  tokens, one warm-up turn (so every server holds it), then turns adding about 200 tokens
  each: time to first token of an agent turn with a long context cached.

Per turn: prompt tokens; new tokens (the prompt minus the previous turn's prompt and reply:
what the client truly added); tokens prefilled (slotlight: `usage.prompt_tokens -
usage.prompt_tokens_details.cached_tokens`, Messages `input_tokens +
cache_creation_input_tokens`; llama-server: `timings.prompt_n`, with `timings.cache_n`);
slotlight's `usage.resume` (and `diverged_at`); time to first token measured on the client
for every server alike (the request streamed, `stream: true`; from sending it to the first
chunk that carries generated content or a tool call), beside the server's own figure
(slotlight `usage.ttft_ms`; llama-server `timings.prompt_ms`, its prefill only).

Output: a Markdown table per scenario, or one JSON object with `--json` (`--save FILE` writes
it beside the Markdown; `--from FILE` prints a saved run's Markdown again).

    cargo build --release -p slotlight-engine
    .venv/bin/python tests/bench/sessions/agent_scenarios.py --llama-server PATH/TO/llama-server
    .venv/bin/python tests/bench/sessions/agent_scenarios.py --scenario side --servers after,before

The models are the engine's known ones (`fetch-model` prints their files; both servers load
the same file). `SLOTLIGHT_ENGINE_BIN` picks the engine binary (else target/release, then
target/debug).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent_replay import Engine, engine_bin, system_prompt, text  # noqa: E402

SERVERS = ("after", "before", "llama")
SCENARIOS = ("tools", "long", "side", "cached13k")
MODELS = {"smollm2": "smollm2-135m", "gemma3": "gemma3-270m"}

RUN_SHELL = {
    "name": "run_shell",
    "description": "Run a shell command in the repository and return what it printed.",
    "parameters": {
        "type": "object",
        # A few commands to choose from: a small model's free-form command runs on to max_tokens.
        "properties": {"command": {"type": "string",
                                   "enum": ["cargo test", "git diff", "ls -R src", "cat README.md"]}},
        "required": ["command"],
    },
}


# ---------------------------------------------------------------------------------------------
# Servers


def model_file(name: str) -> str:
    """The GGUF file of a known model (`fetch-model` prints it; it fetches one that is missing)."""
    out = subprocess.run([str(engine_bin()), "fetch-model", name], capture_output=True, text=True,
                         check=True)
    return out.stdout.strip().splitlines()[-1]


def engine_flags() -> str:
    return subprocess.run([str(engine_bin()), "serve", "--help"], capture_output=True,
                          text=True).stdout


class Slotlight(Engine):
    kind = "slotlight"

    def __init__(self, model: str, ctx: int, threads: int, slots: int, extra: list[str]):
        self.args = ["--model", model, "--ctx-size", str(ctx), "--threads", str(threads),
                     "--batch", str(slots), "--responses-db", ":memory:", *extra]
        super().__init__(self.args)


class LlamaServer:
    """llama.cpp's `llama-server` on a free loopback port; stopped by its own PID."""
    kind = "llama"

    def __init__(self, binary: str, model: str, ctx: int, threads: int, slots: int,
                 extra: list[str]):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.args = ["-m", model, "-t", str(threads), "-tb", str(threads), "-c", str(ctx),
                     "-np", str(slots), "--host", "127.0.0.1", "--port", str(port), *extra]
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([binary, *self.args], stdin=subprocess.DEVNULL,
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while True:
            if self.proc.poll() is not None:
                self.log.seek(0)
                tail = self.log.read()[-2000:]
                raise SystemExit(f"llama-server exited ({self.proc.returncode}):\n{tail}")
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                self.close()
                raise SystemExit("llama-server did not start")
            time.sleep(0.5)

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


# ---------------------------------------------------------------------------------------------
# One streamed turn


def sse(resp):
    """(event, data) pairs of a server-sent event stream."""
    event = None
    for raw in resp:
        line = raw.decode().rstrip("\r\n")
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data = line[5:].strip()
            if data == "[DONE]":
                return
            yield event, json.loads(data)
            event = None


def stream(server, path: str, body: dict, headers: dict) -> tuple[dict, float | None]:
    """Sends `body` streamed; returns the assembled reply and the client's time to first
    token (ms from sending the request to the first chunk carrying generated content)."""
    body = {**body, "stream": True}
    if server.kind == "llama" or path == "/v1/chat/completions":
        # llama-server's prompt cache, asked for; slotlight's chat completions accept it (its
        # prefix cache is always on), its Messages API refuses fields it does not know.
        body["cache_prompt"] = True
    base = server.base
    if path == "/v1/chat/completions":
        body["stream_options"] = {"include_usage": True}
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json", **headers})
    t0 = time.perf_counter()
    first = None
    out = {"content": "", "tool_calls": {}, "blocks": [], "usage": {}, "timings": None}
    try:
        resp = urllib.request.urlopen(req, timeout=1800)
    except urllib.error.HTTPError as e:
        raise SystemExit(f"{base}{path}: HTTP {e.code}: {e.read()[:2000]!r}")
    with resp:
        for event, d in sse(resp):
            got = False
            if path == "/v1/chat/completions":
                for c in d.get("choices") or []:
                    delta = c.get("delta") or {}
                    if delta.get("content"):
                        out["content"] += delta["content"]
                        got = True
                    if delta.get("reasoning_content"):
                        got = True
                    for tc in delta.get("tool_calls") or []:
                        got = True
                        slot = out["tool_calls"].setdefault(
                            tc.get("index", 0),
                            {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
                        if tc.get("id"):
                            slot["id"] = tc["id"]
                        fn = tc.get("function") or {}
                        slot["function"]["name"] += fn.get("name") or ""
                        slot["function"]["arguments"] += fn.get("arguments") or ""
                if d.get("usage"):
                    out["usage"] = d["usage"]
            else:
                kind = d.get("type", event)
                if kind == "message_start":
                    out["usage"].update(d["message"].get("usage") or {})
                elif kind == "content_block_start":
                    b = dict(d["content_block"])
                    if b["type"] == "tool_use":
                        b["partial"] = ""
                        got = True
                    out["blocks"].append(b)
                elif kind == "content_block_delta":
                    b, delta = out["blocks"][-1], d["delta"]
                    if delta["type"] == "text_delta":
                        b["text"] = b.get("text", "") + delta["text"]
                    elif delta["type"] == "input_json_delta":
                        b["partial"] += delta["partial_json"]
                    got = True
                elif kind == "message_delta":
                    out["usage"].update(d.get("usage") or {})
            if d.get("timings"):
                out["timings"] = d["timings"]
            if got and first is None:
                first = (time.perf_counter() - t0) * 1000
    return out, first


def assistant_message(path: str, out: dict) -> tuple[dict, list]:
    """The reply as the client resends it, and its tool calls' ids (empty: a text reply)."""
    if path == "/v1/chat/completions":
        calls = [out["tool_calls"][i] for i in sorted(out["tool_calls"])]
        msg = {"role": "assistant", "content": out["content"] or None}
        if calls:
            msg["tool_calls"] = calls
        return msg, [c["id"] for c in calls]
    blocks = []
    for b in out["blocks"]:
        if b["type"] == "tool_use":
            blocks.append({"type": "tool_use", "id": b["id"], "name": b["name"],
                           "input": json.loads(b["partial"] or "{}")})
        elif b["type"] == "text":
            blocks.append({"type": "text", "text": b.get("text", "")})
    return {"role": "assistant", "content": blocks}, [b["id"] for b in blocks if b["type"] == "tool_use"]


def tool_output_message(path: str, ids: list, output: str) -> list[dict]:
    """What the client adds after a reply: the tool's output, answering its calls."""
    if path == "/v1/chat/completions":
        if ids:
            return [{"role": "tool", "tool_call_id": i, "content": output} for i in ids]
        return [{"role": "user", "content": "Tool output:\n" + output}]
    if ids:
        return [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": i, "content": output}
                                             for i in ids]}]
    return [{"role": "user", "content": "Tool output:\n" + output}]


def counts(server, path: str, out: dict) -> dict:
    """Prompt, cached and prefilled tokens and the resume facts, as the server reports them."""
    u, t = out["usage"], out["timings"] or {}
    row = {}
    if server.kind == "llama" and "prompt_n" in t:
        row["prompt_tokens"] = t["prompt_n"] + t.get("cache_n", 0)
        row["cached_tokens"] = t.get("cache_n", 0)
        row["prefilled"] = t["prompt_n"]
        row["server_ttft_ms"] = t.get("prompt_ms")
    elif path == "/v1/chat/completions":
        row["prompt_tokens"] = u["prompt_tokens"]
        row["cached_tokens"] = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        row["prefilled"] = row["prompt_tokens"] - row["cached_tokens"]
    else:
        uncached = u.get("input_tokens", 0) + u.get("cache_creation_input_tokens", 0)
        row["cached_tokens"] = u.get("cache_read_input_tokens", 0)
        row["prompt_tokens"] = uncached + row["cached_tokens"]
        row["prefilled"] = uncached
    row["completion_tokens"] = u.get("completion_tokens", u.get("output_tokens"))
    if t and row["completion_tokens"] is None:
        row["completion_tokens"] = t.get("predicted_n")
    if server.kind == "slotlight":
        row["server_ttft_ms"] = u.get("ttft_ms")
        for k in ("resume", "reusable_tokens", "diverged_at", "evicted_tokens"):
            row[k] = u.get(k)
    return row


class Conversation:
    """One session's conversation on one server: its messages, resent whole every turn, and
    the turns' rows."""

    def __init__(self, server, path: str, sid: str, system: str, first: str, extra: dict,
                 rows: list, lock: threading.Lock, scenario: str):
        self.server, self.path, self.sid = server, path, sid
        self.extra, self.rows, self.lock, self.scenario = extra, rows, lock, scenario
        self.system = system
        if path == "/v1/chat/completions":
            self.messages = [{"role": "system", "content": system}, {"role": "user", "content": first}]
        else:
            self.messages = [{"role": "user", "content": first}]
        self.last = None  # (prompt tokens, completion tokens) of the last main turn
        self.turn = 0
        self.edits = False  # whether the client edits the replies it resends

    def body(self, messages: list, system: str, max_tokens: int, extra: dict) -> dict:
        b = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, **extra}
        if self.path == "/v1/messages":
            b["system"] = system
            b["metadata"] = {"user_id": self.sid}
        return b

    def headers(self) -> dict:
        return {"x-session-id": self.sid} if self.path == "/v1/chat/completions" else {}

    def send(self, max_tokens: int, kind: str = "main") -> dict:
        out, ttft = stream(self.server, self.path,
                           self.body(self.messages, self.system, max_tokens, self.extra),
                           self.headers())
        row = {"scenario": self.scenario, "session": self.sid, "api": self.path, "turn": self.turn,
               "kind": kind, "edited": self.edits and self.turn > 0, "client_ttft_ms": ttft,
               **counts(self.server, self.path, out)}
        if self.last is not None:
            row["new_tokens"] = row["prompt_tokens"] - sum(self.last)
        else:
            row["new_tokens"] = row["prompt_tokens"]
        msg, ids = assistant_message(self.path, out)
        row["reply"] = "tool call" if ids else "text"
        self.last = (row["prompt_tokens"], row["completion_tokens"])
        self.turn += 1
        with self.lock:
            self.rows.append(row)
        return {"message": msg, "ids": ids}

    def side_call(self, system: str, user: str, max_tokens: int):
        """A request under the same session key that is not the conversation (a title)."""
        if self.path == "/v1/chat/completions":
            msgs = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        else:
            msgs = [{"role": "user", "content": user}]
        out, ttft = stream(self.server, self.path,
                           self.body(msgs, system, max_tokens, {}), self.headers())
        row = {"scenario": self.scenario, "session": self.sid, "api": self.path,
               "turn": self.turn - 0.5, "kind": "side", "edited": False, "client_ttft_ms": ttft,
               **counts(self.server, self.path, out)}
        row["new_tokens"] = None
        row["reply"] = "text"
        with self.lock:
            self.rows.append(row)


# ---------------------------------------------------------------------------------------------
# Scenarios: each returns its server settings and a function that replays it on one server.


def last_user_text(messages: list) -> str:
    for m in reversed(messages):
        if m["role"] in ("user", "tool"):
            c = m["content"]
            if isinstance(c, list):
                return " ".join(b.get("text") or b.get("content") or "" for b in c)
            return c
    return ""


def scenario_tools(a):
    def run(server, rows, lock):
        for path, tag in (("/v1/chat/completions", "chat"), ("/v1/messages", "messages")):
            rng = random.Random(a.seed * 10 + (1 if tag == "chat" else 2))
            tools = ([{"type": "function", "function": RUN_SHELL}] if tag == "chat"
                     else [{"name": RUN_SHELL["name"], "description": RUN_SHELL["description"],
                            "input_schema": RUN_SHELL["parameters"]}])
            choice = "required" if tag == "chat" else {"type": "any"}
            c = Conversation(server, path, f"tools-{tag}-{server.label}", system_prompt(a.system_words),
                             f"Task: fix the failing test in module {text(rng, 12)}",
                             {"tools": tools, "tool_choice": choice}, rows, lock, "tools")
            for _ in range(a.turns):
                r = c.send(a.tool_call_tokens)
                c.messages.append(r["message"])
                c.messages += tool_output_message(path, r["ids"], text(rng, a.tool_words))
    return {"model": "smollm2", "ctx": 4096, "slots": 1, "run": run}


def long_edit(reply: dict, n: int, back: int, rng: random.Random) -> dict:
    """The reply with `n` characters replaced, ending `back` characters before its end (0: its
    last `n`), as a client that trims or rewrites part of what it was given."""
    content = reply["content"] or ""
    end = max(0, len(content) - back)
    cut = max(0, end - n)
    return {**reply, "content": content[:cut] + " [edited] " + text(rng, max(1, n // 8)) + content[end:]}


def scenario_long(a):
    def session(server, s, rows, lock):
        rng = random.Random(a.seed * 10 + 3 + s)
        c = Conversation(server, "/v1/chat/completions", f"long-{s}-{server.label}",
                         "You are a novelist. You write long, detailed chapters.",
                         f"Write a very long story about {text(rng, 8)}. Chapter 1:",
                         {"ignore_eos": True}, rows, lock, "long")
        c.edits = s == 1
        for _ in range(a.long_turns):
            r = c.send(a.long_tokens)
            msg = r["message"] if s == 0 else long_edit(r["message"], a.edit_chars, a.edit_back, rng)
            c.messages.append(msg)
            c.messages.append({"role": "user", "content": "Tool output:\n" + text(rng, a.tool_words)
                               + "\nGo on with the next chapter."})

    def run(server, rows, lock):
        ts = [threading.Thread(target=session, args=(server, s, rows, lock)) for s in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    ctx = (a.long_tokens + 300) * a.long_turns + 1024
    return {"model": "gemma3", "ctx": ctx, "slots": 2, "run": run, "llama_args": GEMMA_TURNS}


# The Gemma 3 base model's file ships no chat template: slotlight renders Gemma's turns
# (`<start_of_turn>user`), llama-server falls back to ChatML unless told to use its Gemma
# template (a built-in one, which its Jinja mode does not take).
GEMMA_TURNS = ["--no-jinja", "--chat-template", "gemma"]

SIDE_SYSTEM = "Write a 5-word title for this conversation. Reply with the title only."


def scenario_side(a):
    def run(server, rows, lock):
        rng = random.Random(a.seed * 10 + 5)
        c = Conversation(server, "/v1/chat/completions", f"side-{server.label}",
                         system_prompt(a.system_words),
                         f"Task: fix the failing test in module {text(rng, 12)}", {}, rows, lock, "side")
        for i in range(a.turns):
            if i > 0:
                c.side_call(SIDE_SYSTEM, last_user_text(c.messages), 12)
            r = c.send(a.reply_tokens)
            c.messages.append(r["message"])
            c.messages.append({"role": "user", "content": "Tool output:\n" + text(rng, a.tool_words)})
    return {"model": "smollm2", "ctx": 4096, "slots": 1, "run": run}


def scenario_cached13k(a):
    def run(server, rows, lock):
        rng = random.Random(a.seed * 10 + 7)
        msgs_hist = []
        # A history of earlier turns, as text: short replies and long tool outputs.
        hist_rng = random.Random(a.seed * 10 + 8)
        for _ in range(a.history_turns):
            msgs_hist.append({"role": "assistant", "content": "Next step: " + text(hist_rng, 20)})
            msgs_hist.append({"role": "user", "content": "Tool output:\n" + text(hist_rng, a.history_words)})
        c = Conversation(server, "/v1/chat/completions", f"cached13k-{server.label}",
                         system_prompt(a.big_system_words),
                         f"Task: fix the failing test in module {text(rng, 12)}", {}, rows, lock, "cached13k")
        c.messages += msgs_hist
        for i in range(a.cached_turns + 1):
            r = c.send(a.reply_tokens, "warm-up" if i == 0 else "main")
            c.messages.append(r["message"])
            c.messages.append({"role": "user", "content": "Tool output:\n" + text(rng, a.tool_words)})
    return {"model": "gemma3", "ctx": 32768, "slots": 1, "run": run, "llama_args": GEMMA_TURNS}


BUILDERS = {"tools": scenario_tools, "long": scenario_long, "side": scenario_side,
            "cached13k": scenario_cached13k}


# ---------------------------------------------------------------------------------------------
# Driving and reporting


def start(label: str, sc: dict, a, checkpoint_flag: bool):
    model = model_file(MODELS[sc["model"]])
    if label == "llama":
        s = LlamaServer(a.llama_server, model, sc["ctx"] * sc["slots"], a.threads, sc["slots"],
                        sc.get("llama_args", []) + a.llama_args.split())
    else:
        extra = []
        if label == "before":
            extra += ["--reply-memory-mib", "0"]
            if checkpoint_flag:
                extra += ["--window-checkpoint-every", "0"]
        s = Slotlight(model, sc["ctx"], a.threads, sc["slots"], extra)
    s.label = label
    return s


def wait_idle(load: float, seconds: float):
    """Waits, at most `seconds`, for the host's 1-minute load average to fall below `load`
    (other jobs on a small machine slow one server more than another)."""
    deadline = time.monotonic() + seconds
    while os.getloadavg()[0] >= load and time.monotonic() < deadline:
        time.sleep(5)


def run_scenario(name: str, a, checkpoint_flag: bool) -> dict:
    sc = BUILDERS[name](a)
    per_server = {}
    for label in a.servers:
        if label == "llama" and not a.llama_server:
            continue
        wait_idle(a.idle_load, a.idle_wait)
        load0 = os.getloadavg()
        server = start(label, sc, a, checkpoint_flag)
        rows: list[dict] = []
        t0 = time.monotonic()
        try:
            sc["run"](server, rows, threading.Lock())
        finally:
            server.close()
        rows.sort(key=lambda r: (r["session"], r["turn"]))
        per_server[label] = {"args": server.args, "wall_s": time.monotonic() - t0,
                             "loadavg_before": load0, "loadavg_after": os.getloadavg(), "rows": rows}
        print(f"# {name}: {label} done in {per_server[label]['wall_s']:.0f} s", file=sys.stderr)
    return {"scenario": name, "model": sc["model"], "ctx": sc["ctx"], "slots": sc["slots"],
            "servers": per_server, "summary": summary(per_server)}


def judged(r: dict) -> bool:
    """Turns the prefill goal is judged on: main turns that extend the conversation's
    previous turn whole (not a conversation's first request, nor a side call, nor a turn
    whose resent reply the client edited: those are reported beside)."""
    return r["kind"] == "main" and r["turn"] > 0 and not r["edited"]


def summary(per_server: dict) -> dict:
    out = {}
    for label, s in per_server.items():
        rows = [r for r in s["rows"] if judged(r)]
        if not rows:
            continue
        ratios = [r["prefilled"] / r["new_tokens"] for r in rows if r["new_tokens"] > 0]
        out[label] = {
            "turns": len(rows),
            "prefilled": sum(r["prefilled"] for r in rows),
            "new_tokens": sum(r["new_tokens"] for r in rows),
            "max_ratio": max(ratios) if ratios else None,
            "within_5pct": sum(1 for x in ratios if x <= 1.05),
            "resume": {k: sum(1 for r in rows if r.get("resume") == k)
                       for k in sorted({str(r.get("resume")) for r in rows})}
            if label != "llama" else None,
        }
        edited = [r for r in s["rows"] if r["edited"]]
        if edited:
            out[label]["edited"] = {"turns": len(edited),
                                    "prefilled": sum(r["prefilled"] for r in edited),
                                    "new_tokens": sum(r["new_tokens"] for r in edited)}
    return out


def fmt_ms(x) -> str:
    return "—" if x is None else f"{x:,.0f} ms"


def ttft(r: dict | None) -> str:
    """The client's time to first token; † where the reply is a tool call, which is streamed
    whole once the call is complete."""
    if r is None:
        return "—"
    return fmt_ms(r["client_ttft_ms"]) + (" †" if r["reply"] == "tool call" else "")


def fmt_resume(r: dict | None) -> str:
    if r is None or r.get("resume") is None:
        return "—"
    s = f"`{r['resume']}`"
    if r.get("diverged_at") is not None:
        s += f" at {r['diverged_at']}"
    return s


def markdown(res: dict) -> str:
    servers = res["servers"]
    base = servers.get("after") or next(iter(servers.values()))
    keyed = {label: {(r["session"].rsplit("-", 1)[0], r["turn"]): r for r in s["rows"]}
             for label, s in servers.items()}
    lines = [
        f"#### `{res['scenario']}` ({res['model']}, context {res['ctx']}; slotlight `--batch {res['slots']}`, "
        f"llama-server `-np {res['slots']}`)",
        "",
        "| session | turn | prompt tokens | new tokens | prefilled after | prefilled before | prefilled llama-server "
        "| resume after | resume before | TTFT after | TTFT before | TTFT llama-server |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in base["rows"]:
        key = (r["session"].rsplit("-", 1)[0], r["turn"])
        cells = {}
        for label in SERVERS:
            x = keyed.get(label, {}).get(key)
            if x is None:
                cells[label] = None
                continue
            cells[label] = x
        def pre(label):
            x = cells[label]
            if x is None:
                return "—"
            s = f"{x['prefilled']:,}"
            if (label != "after" and r["kind"] == "main" and r["turn"] > 0
                    and x["new_tokens"] is not None and x["new_tokens"] != r["new_tokens"]):
                s += f" (of {x['new_tokens']:,} new)"
            return s
        turn = f"{int(r['turn'] + 0.5)} (side call)" if r["kind"] == "side" else (
            f"{r['turn']} (warm-up)" if r["kind"] == "warm-up" else str(r["turn"]))
        new = "—" if r["new_tokens"] is None or r["kind"] != "main" or r["turn"] == 0 else f"{r['new_tokens']:,}"
        if r["edited"] and r.get("diverged_at") is not None:
            # What the client changed or added: from the divergence in the edited reply on.
            new += f" (edited: {r['prompt_tokens'] - r['diverged_at']:,} from `diverged_at`)"
        reply = ", tool call" if r["reply"] == "tool call" else ""
        lines.append(
            f"| {key[0]}{reply} | {turn} | {r['prompt_tokens']:,} | {new} | {pre('after')} | {pre('before')} "
            f"| {pre('llama')} | {fmt_resume(cells['after'])} | {fmt_resume(cells['before'])} "
            f"| {ttft(cells['after'])} | {ttft(cells['before'])} | {ttft(cells['llama'])} |")
    if any(r["reply"] == "tool call" for s in servers.values() for r in s["rows"]):
        lines.append("")
        lines.append("† the reply is a tool call: its first chunk comes once the call is whole.")
    lines.append("")
    for label, s in res["summary"].items():
        ratio = "—" if s["max_ratio"] is None else f"{s['max_ratio']:.2f}"
        resume = "" if not s["resume"] else "; resume " + ", ".join(
            f"`{k}` {v}" for k, v in s["resume"].items())
        lines.append(f"- {label}: {s['turns']} turns after the first: prefilled {s['prefilled']:,} "
                     f"of {s['new_tokens']:,} new tokens ({s['prefilled'] / max(1, s['new_tokens']):.2f}×); "
                     f"worst turn {ratio}×; {s['within_5pct']} of {s['turns']} within 5%{resume}")
        if s.get("edited"):
            e = s["edited"]
            lines.append(f"- {label}: {e['turns']} turns after an edited reply: prefilled {e['prefilled']:,} "
                         f"for {e['new_tokens']:,} new tokens")
    for label, s in servers.items():
        la, lb = s["loadavg_before"], s["loadavg_after"]
        lines.append(f"- {label}: {s['wall_s']:.0f} s, load average {la[0]:.1f} before, {lb[0]:.1f} after")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", action="append", choices=SCENARIOS,
                   help="a scenario to run (repeatable); all by default")
    p.add_argument("--servers", default=",".join(SERVERS),
                   help="which of after,before,llama to run (comma-separated)")
    p.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER"),
                   help="llama.cpp's llama-server binary (default $LLAMA_SERVER); without it, llama is skipped")
    p.add_argument("--llama-args", default="", help="more arguments for llama-server (one string)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=39)
    p.add_argument("--turns", type=int, default=5, help="turns of the `tools` and `side` conversations")
    p.add_argument("--system-words", type=int, default=120, help="words of the agents' system prompt")
    p.add_argument("--tool-words", type=int, default=60, help="words of tool output per turn (~200 tokens)")
    p.add_argument("--tool-call-tokens", type=int, default=64, help="max_tokens of a forced tool call")
    p.add_argument("--reply-tokens", type=int, default=24, help="max_tokens of a text reply")
    p.add_argument("--long-tokens", type=int, default=1024, help="tokens of each long reply (`long`)")
    p.add_argument("--long-turns", type=int, default=3)
    p.add_argument("--edit-chars", type=int, default=100,
                   help="characters replaced in session 1's replies (`long`)")
    p.add_argument("--edit-back", type=int, default=0,
                   help="... ending this many characters before the reply's end (0: its last ones)")
    p.add_argument("--big-system-words", type=int, default=1500,
                   help="words of the system prompt of `cached13k`")
    p.add_argument("--history-turns", type=int, default=13, help="earlier turns in `cached13k`'s history")
    p.add_argument("--history-words", type=int, default=200, help="words of each earlier tool output")
    p.add_argument("--cached-turns", type=int, default=2, help="turns of `cached13k` after its warm-up")
    p.add_argument("--idle-load", type=float, default=1.0,
                   help="before starting each server, wait for the 1-minute load average to fall below this")
    p.add_argument("--idle-wait", type=float, default=0, help="... for at most this many seconds (0: never wait)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of Markdown")
    p.add_argument("--save", metavar="FILE", help="also write the JSON object to FILE")
    p.add_argument("--from", dest="load", metavar="FILE",
                   help="print the Markdown of a JSON object saved before (runs nothing)")
    a = p.parse_args()
    if a.load:
        saved = json.loads(Path(a.load).read_text())
        print(report(saved))
        return
    a.servers = [s for s in a.servers.split(",") if s]
    for s in a.servers:
        if s not in SERVERS:
            p.error(f"unknown server {s!r}")
    checkpoint_flag = "--window-checkpoint-every" in engine_flags()
    notes = []
    if "before" in a.servers and not checkpoint_flag:
        notes.append("this engine has no `--window-checkpoint-every`: `before` turns off remembered "
                     "replies only")
    if "llama" in a.servers and not a.llama_server:
        notes.append("no llama-server given (--llama-server or $LLAMA_SERVER): skipped")
    for n in notes:
        print(f"# note: {n}", file=sys.stderr)
    results = [run_scenario(n, a, checkpoint_flag) for n in (a.scenario or SCENARIOS)]
    out = {"args": vars(a), "engine": str(engine_bin()), "window_checkpoint_flag": checkpoint_flag,
           "notes": notes, "results": results}
    if a.save:
        Path(a.save).write_text(json.dumps(out, indent=1) + "\n")
    if a.json:
        json.dump(out, sys.stdout, indent=1)
        print()
    else:
        print(report(out))


def report(out: dict) -> str:
    head = "".join(f"Note: {n}.\n\n" for n in out["notes"])
    return head + "\n\n".join(markdown(r) for r in out["results"])


if __name__ == "__main__":
    main()
