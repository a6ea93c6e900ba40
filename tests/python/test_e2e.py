"""Engine and sidecar as real processes on loopback with the default model: the usage a client
sees equals the sidecar's turn record, the live slot view follows a request that moves, warm
resume shows up on both sides, a burst gives exactly one record per request, Prometheus scrapes
the sidecar, and the engine keeps serving while the sidecar is down."""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.parse
import urllib.request

import openai
import pytest

from procs import EngineProcess, SidecarProcess, http_json, pinned_sidecar

USAGE_TIMINGS = ["queue_ms", "prefill_ms", "ttft_ms", "decode_ms", "generation_ms", "e2e_ms", "decode_tps"]


def client_for(engine):
    return openai.OpenAI(base_url=engine.base + "/v1", api_key="unused", max_retries=0, timeout=300)


def assert_turn_equals_usage(turn, usage: dict, cached: int):
    for f in USAGE_TIMINGS:
        assert turn[f] == usage[f], (f, turn[f], usage[f])
    assert turn["prompt_tokens"] == usage["prompt_tokens"]
    assert turn["completion_tokens"] == usage["completion_tokens"]
    assert turn["cached_tokens"] == cached


def test_streamed_usage_equals_the_turn_record(engine, sidecar):
    c = client_for(engine)
    stream = c.chat.completions.create(
        model=engine.model,
        messages=[{"role": "user", "content": "Name three colors."}],
        max_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
        user="e2e-usage",
    )
    chunks = list(stream)
    rid = chunks[0].id
    u = chunks[-1].usage
    usage = {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens, **u.model_extra}
    turn = sidecar.wait_turn(rid)
    assert_turn_equals_usage(turn, usage, u.prompt_tokens_details.cached_tokens)
    assert turn["session_id"] == "e2e-usage"
    assert turn["finish_reason"] in ("stop", "length")


def _instance(engine):
    return engine.get("/health")[1]["instance_id"]


def test_the_move_is_seen_by_the_sidecar_and_agrees_with_the_engine(engine, sidecar):
    inst = _instance(engine)
    c = client_for(engine)
    out = {}

    def long_request():
        s = c.chat.completions.create(
            model=engine.model,
            messages=[{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
            max_tokens=400,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        for ch in s:
            out.setdefault("id", ch.id)
            if ch.usage is not None:
                out["usage"] = ch.usage

    t = threading.Thread(target=long_request)
    t.start()
    # Alone: the solo row, counting from the request's start.
    solo = sidecar.wait_row(inst, "solo", None, lambda r: r.get("request_id") and (r.get("tokens_generated") or 0) >= 20)
    rid = solo["request_id"]
    elapsed_before = solo["elapsed_s"]
    # A second request arrives: the first moves into a slot.
    c2 = threading.Thread(
        target=lambda: c.chat.completions.create(
            model=engine.model, messages=[{"role": "user", "content": "Say hello."}], max_tokens=30, extra_body={"ignore_eos": True}
        )
    )
    c2.start()
    view = sidecar.wait_for(
        "/v1/slots",
        lambda v: any(
            r.get("request_id") == rid and r["path"] == "slot" and (r.get("tokens_generated") or 0) > solo["tokens_generated"]
            for i in v["instances"]
            if i["instance"] == inst
            for r in i["slots"]
        ),
        "the first request in a slot",
    )
    row = next(r for i in view["instances"] if i["instance"] == inst for r in i["slots"] if r.get("request_id") == rid)
    assert row["elapsed_s"] >= elapsed_before, (row, solo)
    # The engine agrees on where the request runs (400 tokens: it is still running).
    code, reqs = engine.get("/v1/requests")
    mine = [r for r in reqs["data"] if r["id"] == rid]
    assert len(mine) == 1, reqs
    assert mine[0]["path"] == "slot"
    assert mine[0]["slot"] == row["index"]
    assert mine[0]["elapsed_s"] >= elapsed_before
    c2.join()
    t.join()
    turn = sidecar.wait_turn(rid)
    assert turn["moved"] is True
    assert [l["path"] for l in turn["legs"]][:2] == ["solo", "slot"]
    # The sidecar's tok/s is the request's own rate on both sides of the move (the original
    # bug read 3,946 tok/s for a request making 50): within 2x of its rate from its usage.
    u = out["usage"]
    extra = u.model_extra
    own = (u.completion_tokens - 1) / (extra["generation_ms"] / 1000)
    for where, r in (("solo", solo), ("slot", row)):
        assert own / 2 <= r["tok_s"] <= own * 2, (where, r["tok_s"], own)


def test_warm_resume_shows_cached_tokens_in_usage_and_turn(engine, sidecar):
    c = client_for(engine)
    msgs = [{"role": "user", "content": "My favourite bird is the owl. Tell me one fact about owls."}]
    r1 = c.chat.completions.create(model=engine.model, messages=msgs, max_tokens=20, temperature=0, user="warm")
    msgs += [{"role": "assistant", "content": r1.choices[0].message.content}, {"role": "user", "content": "And one more?"}]
    r2 = c.chat.completions.create(model=engine.model, messages=msgs, max_tokens=10, temperature=0, user="warm")
    cached = r2.usage.prompt_tokens_details.cached_tokens
    assert cached > 0
    turn = sidecar.wait_turn(r2.id)
    assert turn["cached_tokens"] == cached
    assert turn["prefilled_tokens"] == r2.usage.prompt_tokens - cached


def test_a_burst_of_50_gives_exactly_50_turn_records(engine, sidecar):
    c = client_for(engine)

    def one(i):
        r = c.chat.completions.create(
            model=engine.model,
            messages=[{"role": "user", "content": f"Give me a word that starts with the letter {chr(97 + i % 26)}."}],
            max_tokens=4 + i % 7,
            extra_body={"ignore_eos": True},
            user=f"burst-{i}",
        )
        return r

    with concurrent.futures.ThreadPoolExecutor(max_workers=50) as ex:
        replies = list(ex.map(one, range(50)))
    assert len({r.id for r in replies}) == 50
    for r in replies:
        turn = sidecar.wait_turn(r.id)
        usage = {"prompt_tokens": r.usage.prompt_tokens, "completion_tokens": r.usage.completion_tokens, **r.usage.model_extra}
        assert_turn_equals_usage(turn, usage, r.usage.prompt_tokens_details.cached_tokens)
    sessions = {f"burst-{i}" for i in range(50)}
    got = sidecar.get("/v1/turns?limit=1000")["turns"]
    assert sum(1 for t in got if t.get("session_id") in sessions) == 50


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_prometheus_scrapes_the_sidecar(engine, sidecar):
    prom = shutil.which("prometheus")
    if not prom:
        if os.environ.get("SLOTLIGHT_REQUIRE_TOOLS") == "1":
            pytest.fail("prometheus is required (Debian package `prometheus`)")
        pytest.skip("prometheus is not installed")
    c = client_for(engine)
    for i in range(3):
        c.chat.completions.create(model=engine.model, messages=[{"role": "user", "content": f"hi {i}"}], max_tokens=4)
    port = _free_port()
    with tempfile.TemporaryDirectory() as d:
        cfg = os.path.join(d, "prometheus.yml")
        with open(cfg, "w") as f:
            f.write(
                "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: sidecar\n    static_configs:\n"
                f"      - targets: ['{sidecar.views}']\n"
            )
        p = subprocess.Popen(
            [prom, f"--config.file={cfg}", f"--storage.tsdb.path={d}/data", f"--web.listen-address=127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            q = "histogram_quantile(0.5, sum by (le) (gen_ai_server_time_to_first_token_seconds_bucket))"
            url = f"http://127.0.0.1:{port}/api/v1/query?query=" + urllib.parse.quote(q)
            value = None
            # Prometheus answers 503 (plain text) until its storage is ready: slow on a busy
            # machine, so the wait is by deadline.
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                try:
                    code, body = http_json("GET", url, timeout=5)
                except (OSError, ValueError):
                    code, body = 0, None
                if code == 200 and body["data"]["result"]:
                    value = float(body["data"]["result"][0]["value"][1])
                    break
                time.sleep(0.1)
            assert value is not None and value > 0, "a TTFT median from Prometheus"
        finally:
            p.terminate()
            p.wait(timeout=30)


def test_the_engine_serves_while_the_sidecar_is_down_and_its_turns_arrive_when_it_is_back():
    sc = SidecarProcess()
    grpc = sc.grpc
    e = EngineProcess("--batch", "4", "--progress-interval-ms", "100", otlp=f"http://{grpc}")
    try:
        c = client_for(e)

        def decode_rates(label: str):
            out, ids = [], []
            for i in range(3):
                r = c.chat.completions.create(
                    model=e.model, messages=[{"role": "user", "content": f"{label} {i}"}], max_tokens=24,
                    extra_body={"ignore_eos": True},
                )
                assert r.usage.completion_tokens == 24
                out.append(r.usage.model_extra["decode_tps"])
                ids.append(r.id)
            return out, ids

        up_rates, up_ids = decode_rates("up")
        sc.wait_turn(up_ids[-1])
        sc.close()
        down_rates, down_ids = decode_rates("down")
        # A figure, not an assertion: exporting never stands in the decode's way.
        print(f"decode tok/s with the sidecar up: {up_rates}, down: {down_rates}")
        # The outage's spans wait in the export queue, retried: none is dropped.
        for _ in range(100):
            if e.get("/health")[1]["telemetry"]["failures"] > 0:
                break
            time.sleep(0.1)
        tel = e.get("/health")[1]["telemetry"]
        assert tel["failures"] > 0 and tel["dropped"] == 0 and tel["queued"] > 0, tel
        # The sidecar comes back on the same port: the turns of the outage arrive, and new ones.
        host, port = grpc.rsplit(":", 1)
        sc = pinned_sidecar(f"{host}:{port}")
        r = c.chat.completions.create(model=e.model, messages=[{"role": "user", "content": "back"}], max_tokens=8)
        # The export queue sends what it held on its own backoff: wait (bounded) until it is empty.
        for _ in range(600):
            if e.get("/health")[1]["telemetry"]["queued"] == 0:
                break
            time.sleep(0.1)
        for rid in down_ids + [r.id]:
            sc.wait_turn(rid)
        tel = e.get("/health")[1]["telemetry"]
        assert tel["dropped"] == 0, tel
    finally:
        e.close()
        sc.close()


def test_one_json_log_line_per_finished_request_without_content():
    e = EngineProcess("--batch", "2", "--log-format", "json")
    try:
        marker = "zebra-marker-7741"
        code, v = e.post("/v1/chat/completions", {"messages": [{"role": "user", "content": f"Say {marker}."}], "max_tokens": 6, "user": "log-test"})
        assert code == 200, v
        rid = v["id"]
        # A refused request (malformed body) is a turn too: its own line, status `refused`.
        code, bad = e.post("/v1/chat/completions", {"messages": [], "max_tokens": 2}, headers={"x-session-id": "log-refused"})
        assert code == 400, bad

        def lines_with(text):
            for _ in range(100):
                if any(text in l for l in e.log):
                    break
                time.sleep(0.05)
            time.sleep(0.2)  # a second line, if there were one, would be written by now
            return [json.loads(l) for l in e.log if text in l and l.lstrip().startswith("{")]

        found = lines_with(rid)
        assert len(found) == 1, "".join(e.log[-20:])
        rec = found[0]
        assert rec["request_id"] == rid
        assert rec["session_id"] == "log-test"
        assert rec["status"] == "ok"
        assert rec["completion_tokens"] == v["usage"]["completion_tokens"]
        assert rec["ttft_ms"] == v["usage"]["ttft_ms"]
        assert json.loads(rec["legs"])[0]["path"] == "solo"
        refused = lines_with('"log-refused"')
        assert len(refused) == 1, "".join(e.log[-20:])
        assert refused[0]["status"] == "refused"
        assert refused[0]["error_type"] == "validation"
        assert refused[0]["http_status"] == 400
        for k in ("queue_ms", "ttft_ms", "prefill_ms", "decode_ms"):
            assert k not in refused[0], f"{k} is unknown for a refused request, never 0"
        assert not any(marker in l for l in e.log), "no prompt text in logs by default"
    finally:
        e.close()


def test_the_sidecar_holds_no_content_without_trace_content(engine, sidecar):
    """Without --trace-content nothing of the conversation reaches the sidecar: the turn
    record, the turn list and the slot view hold no text of the system message, the user's
    message, the tools or the reply."""
    markers = ["system-marker-4410", "user-marker-4411", "tool-marker-4412"]
    code, v = engine.post(
        "/v1/chat/completions",
        {
            "messages": [{"role": "system", "content": markers[0]}, {"role": "user", "content": f"Say {markers[1]}."}],
            "tools": [{"type": "function", "function": {"name": "lookup", "description": markers[2], "parameters": {"type": "object"}}}],
            "tool_choice": "none",
            "max_tokens": 6,
            "user": "no-content-e2e",
        },
    )
    assert code == 200, v
    reply = v["choices"][0]["message"]["content"] or ""
    turn = sidecar.wait_turn(v["id"])
    views = [json.dumps(turn), json.dumps(sidecar.get("/v1/turns?session_id=no-content-e2e")), json.dumps(sidecar.get("/v1/slots"))]
    for text in markers + ([reply] if len(reply) >= 8 else []):
        assert not any(text in view for view in views), f"{text!r} reached the sidecar"
    for key in ("gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions", "gen_ai.tool.definitions", "messages", "prompt"):
        assert key not in turn, key


def test_refused_requests_are_turns_with_their_status_counted_apart(engine, sidecar):
    """A request the engine refuses (validation, context length) is a turn in the sidecar with
    status `refused` and its error type, counted apart from served turns, and never observed in
    the time-to-first-token or queue histograms."""
    code, _ = engine.post("/v1/chat/completions", {"messages": [], "max_tokens": 2}, headers={"x-session-id": "refused-e2e"})
    assert code == 400
    code, _ = engine.post(
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2048},
        headers={"x-session-id": "refused-e2e"},
    )
    assert code == 400
    v = sidecar.wait_for("/v1/turns?session_id=refused-e2e", lambda v: v["count"] == 2, "two refused turns")
    kinds = sorted((t["status"], t["error_type"]) for t in v["turns"])
    assert kinds == [("refused", "context_length"), ("refused", "validation")], v
    for t in v["turns"]:
        for k in ("queue_ms", "ttft_ms", "prefill_ms", "decode_ms", "generation_ms"):
            assert t[k] is None, (k, t)
    metrics = sidecar_metrics(sidecar)
    refused = [l for l in metrics.splitlines() if l.startswith("slotlight_requests_total{") and 'status="refused"' in l]
    assert sum(float(l.rsplit(" ", 1)[1]) for l in refused) >= 2, refused


def sidecar_metrics(sidecar) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://{sidecar.views}/metrics", timeout=10) as r:
        return r.read().decode()


def _common_prefix(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def test_every_turn_says_whether_it_reused_its_conversation_and_why(sidecar):
    """Warm resume explained, with the real model on two CPU groups of one slot each and a small
    KV cache: a three-turn chat gives first, full, full; an edited history gives `diverged` at
    the token where the prompt departs; other traffic filling the cache gives `evicted` with the
    lost tokens counted; a turn whose group is full goes to the other group (`other_group`).
    Each outcome is the same in the HTTP usage, the engine's log line and the sidecar's turn
    record (built from the request span). Live sessions' KV is not kept here
    (`--session-kv-ttl 0`), so that other traffic can reclaim it (tests/python/test_sessions.py
    and engine/tests/sessions.rs show it kept)."""
    e = EngineProcess(
        "--device", "cpu,cpu", "--batch", "1", "--kv-cache-tokens", "1024", "--log-format", "json",
        "--session-kv-ttl", "0",
        "--progress-interval-ms", "100", otlp=f"http://{sidecar.grpc}", ctx_size=1024,
    )
    try:
        def chat(messages, session, max_tokens=12, **extra):
            body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, **extra}
            code, v = e.post("/v1/chat/completions", body, headers={"x-session-id": session})
            assert code == 200, v
            return v

        def log_line(rid):
            for _ in range(200):
                found = [json.loads(l) for l in e.log if rid in l and l.lstrip().startswith("{")]
                if found:
                    return found[0]
                time.sleep(0.05)
            raise AssertionError("no log line for " + rid)

        def check(v, outcome):
            """The outcome agrees in usage, log line and turn record; returns the usage."""
            u = v["usage"]
            assert u["resume"] == outcome, u
            rec = log_line(v["id"])
            turn = sidecar.wait_turn(v["id"])
            for k in ("reusable_tokens", "diverged_at", "evicted_tokens"):
                assert rec.get(k) == u[k], (k, rec, u)
                assert turn[k] == u[k], (k, turn, u)
            assert rec["resume"] == outcome and rec["finish_reason"] != outcome
            assert turn["resume"] == outcome
            assert turn["cached_tokens"] == u["prompt_tokens_details"]["cached_tokens"]
            return u

        def reply(v):
            return {"role": "assistant", "content": v["choices"][0]["message"]["content"]}

        # Without a session: nothing reused the first time, a shared prefix the second.
        code, v = e.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Count from one to five."}], "max_tokens": 4})
        assert code == 200 and v["usage"]["resume"] in ("none", "prefix"), v["usage"]
        assert v["usage"]["reusable_tokens"] is None

        # Three turns: first, full, full. What was reusable was reused.
        msgs = [{"role": "system", "content": "You are a terse assistant."}, {"role": "user", "content": "Name a large ocean."}]
        v1 = chat(msgs, "resume-chat")
        u1 = check(v1, "first")
        assert u1["reusable_tokens"] is None
        msgs += [reply(v1), {"role": "user", "content": "Name a small sea."}]
        v2 = chat(msgs, "resume-chat")
        u2 = check(v2, "full")
        assert u2["reusable_tokens"] > u1["prompt_tokens"]
        assert u2["prompt_tokens_details"]["cached_tokens"] >= (min(u2["reusable_tokens"], u2["prompt_tokens"] - 1) // 16) * 16
        msgs += [reply(v2), {"role": "user", "content": "Name a river."}]
        check(chat(msgs, "resume-chat"), "full")

        # An edited history: diverged where the new prompt departs from the last turn.
        edited = [dict(m) for m in msgs]
        edited[1] = {"role": "user", "content": "Name a large desert."}
        last_prompt = e.post("/tokenize", {"messages": msgs})[1]["tokens"]
        new_prompt = e.post("/tokenize", {"messages": edited})[1]["tokens"]
        u = check(chat(edited, "resume-chat"), "diverged")
        assert u["diverged_at"] == _common_prefix(last_prompt, new_prompt), (u, len(last_prompt))
        assert u["reusable_tokens"] == u["diverged_at"]

        # A turn whose group is busy (its one slot taken) goes to the idle group.
        m = [{"role": "user", "content": "Say hello."}]
        g1 = chat(m, "resume-move")
        check(g1, "first")
        home = g1["usage"]["legs"][0]["group"]
        busy = threading.Event()
        done = {}

        def long_request():
            body = {"messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 160,
                    "ignore_eos": True, "stream": True}
            req = urllib.request.Request(e.base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                         headers={"content-type": "application/json"})
            with urllib.request.urlopen(req, timeout=300) as r:
                for line in r:
                    if line.startswith(b"data: {"):
                        busy.set()
            done["ok"] = True

        t = threading.Thread(target=long_request)
        t.start()
        assert busy.wait(120), "the long request started"
        # The long request (no session) went to the least loaded group: the session's own.
        g2 = chat(m + [reply(g1), {"role": "user", "content": "Again."}], "resume-move", max_tokens=4)
        t.join(300)
        assert done.get("ok")
        u = check(g2, "other_group")
        assert g2["usage"]["legs"][0]["group"] != home
        assert u["reusable_tokens"] > 0

        # Other traffic fills the cache between two turns: evicted, the lost tokens counted.
        m = [{"role": "user", "content": "Tell me about the moon in one sentence."}]
        f1 = chat(m, "resume-evict")
        check(f1, "first")
        for i in range(4):
            filler = " ".join(f"word{i}x{j}" for j in range(120))
            code, _ = e.post("/v1/chat/completions", {"messages": [{"role": "user", "content": filler}], "max_tokens": 2})
            assert code == 200
        u = check(chat(m + [reply(f1), {"role": "user", "content": "And the sun?"}], "resume-evict"), "evicted")
        assert u["evicted_tokens"] > 0
        reachable = (min(u["reusable_tokens"], u["prompt_tokens"] - 1) // 16) * 16
        assert u["evicted_tokens"] == reachable - u["prompt_tokens_details"]["cached_tokens"]

        # The sidecar lists the session's turns in order with their outcomes.
        turns = sidecar.get("/v1/turns?session_id=resume-chat")["turns"]
        assert [t["resume"] for t in turns] == ["first", "full", "full", "diverged"], turns
        # ... and counts turns by outcome.
        with urllib.request.urlopen(f"http://{sidecar.views}/metrics", timeout=10) as r:
            text = r.read().decode()
        assert 'slotlight_turns_by_resume_total{' in text and 'resume="diverged"' in text
    finally:
        e.close()
