"""OpenAI's Responses API through the official `openai` SDK and the OpenAI Agents SDK, against
the engine with the default model: plain and streamed responses, `previous_response_id`
chains that continue from the stored response's exact tokens (a warm resume of its KV),
branches, tools, structured output, `GET`/`DELETE`/`input_items`/`input_tokens`, cache
diagnostics and prewarm, `store: false`, bad input in the API's own error shape, and the
store's durability: SQLite across a restart and a kill -9, and Redis shared by two engines."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest
from pydantic import BaseModel, Field

from procs import EngineProcess, http_json, post_stream, require_model, stop_process

INSTRUCTIONS = "You are a helpful assistant. Answer in one short sentence."


@pytest.fixture(scope="module")
def engine():
    require_model()
    e = EngineProcess("--batch", "4")
    yield e
    e.close()


@pytest.fixture(scope="module")
def client(engine):
    return openai.OpenAI(base_url=engine.base + "/v1", api_key="unused", max_retries=0, timeout=300)


def create(client, engine, **kw):
    kw.setdefault("model", engine.model)
    kw.setdefault("temperature", 0)
    kw.setdefault("max_output_tokens", 40)
    return client.responses.create(**kw)


def extras(usage) -> dict:
    return usage.model_extra or {}


def test_a_plain_response_has_its_output_text_and_usage(client, engine):
    r = create(client, engine, input="Name the capital of France.", instructions=INSTRUCTIONS)
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.status in ("completed", "incomplete")
    assert r.output[0].type == "message" and r.output[0].role == "assistant"
    assert r.output_text, r
    u = r.usage
    assert u.input_tokens > 0 and u.output_tokens > 0
    assert u.total_tokens == u.input_tokens + u.output_tokens
    assert u.input_tokens_details.cached_tokens >= 0
    assert u.output_tokens_details.reasoning_tokens == 0
    # slotlight's extras beside OpenAI's counts, as in chat usage.
    x = extras(u)
    for key in ("queue_ms", "prefill_ms", "ttft_ms", "e2e_ms", "resume", "legs"):
        assert key in x, key
    assert x["legs"] and x["legs"][0]["tokens"] == u.output_tokens


def test_a_streamed_response_sends_the_documented_events_in_order(client, engine):
    kinds = []
    seqs = []
    with client.responses.stream(
        model=engine.model, input="Say hello.", temperature=0, max_output_tokens=300,
    ) as s:
        for ev in s:
            kinds.append(ev.type)
            seqs.append(ev.sequence_number)
        final = s.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    for k in ("response.output_item.added", "response.content_part.added",
              "response.output_text.delta", "response.output_text.done",
              "response.content_part.done", "response.output_item.done"):
        assert k in kinds, k
    assert seqs == list(range(len(seqs))), "sequence numbers count up from 0"
    assert final.status == "completed" and final.output_text
    # The stored response is what the stream ended with.
    got = client.responses.retrieve(final.id)
    assert got.output_text == final.output_text


def test_a_chain_continues_from_the_exact_tokens_and_resumes_the_kv(client, engine):
    r1 = create(client, engine, input="Name the capital of France.", instructions=INSTRUCTIONS)
    first_total = r1.usage.input_tokens + r1.usage.output_tokens
    r2 = create(client, engine, input="And of Italy?", instructions=INSTRUCTIONS,
                previous_response_id=r1.id)
    x = extras(r2.usage)
    assert x["resume"] == "full", x
    # The second prompt starts with every token of the first prompt and reply: what the prefix
    # cache reuses is those tokens to block granularity (the reply's last token has no KV yet).
    assert r2.usage.input_tokens > first_total
    assert r2.usage.input_tokens_details.cached_tokens >= (first_total - 1) // 16 * 16
    # input_tokens counts the same exact prompt without generating.
    n = client.responses.input_tokens.count(
        model=engine.model, input="And of Italy?", instructions=INSTRUCTIONS,
        previous_response_id=r1.id,
    )
    assert n.input_tokens == r2.usage.input_tokens
    # A third turn continues the chain again.
    r3 = create(client, engine, input="And of Spain?", instructions=INSTRUCTIONS,
                previous_response_id=r2.id)
    assert extras(r3.usage)["resume"] == "full"
    assert r3.usage.input_tokens > r2.usage.input_tokens + r2.usage.output_tokens


def test_two_continuations_of_one_response_both_work_and_share_its_prefix(client, engine):
    root = create(client, engine, input="Name a color.", instructions=INSTRUCTIONS)
    a = create(client, engine, input="Another one?", instructions=INSTRUCTIONS,
               previous_response_id=root.id)
    b = create(client, engine, input="Why that one?", instructions=INSTRUCTIONS,
               previous_response_id=root.id)
    shared = (root.usage.input_tokens + root.usage.output_tokens - 1) // 16 * 16
    assert a.usage.input_tokens_details.cached_tokens >= shared
    assert b.usage.input_tokens_details.cached_tokens >= shared
    assert a.previous_response_id == b.previous_response_id == root.id


def test_an_unknown_previous_response_is_a_404_naming_the_parameter(client, engine):
    with pytest.raises(openai.NotFoundError) as e:
        create(client, engine, input="x", previous_response_id="resp_doesnotexist")
    assert e.value.body["param"] == "previous_response_id"
    r = create(client, engine, input="Say hi.")
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError) as e:
        create(client, engine, input="x", previous_response_id=r.id)
    assert e.value.body["param"] == "previous_response_id"


def test_store_false_keeps_nothing_but_the_session_kv(client, engine):
    key = "session-store-false"
    r1 = create(client, engine, input="Name a fruit.", instructions=INSTRUCTIONS, store=False,
                prompt_cache_key=key)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r1.id)
    # The next turn resends the whole input, as Codex does: the prefix cache gives it back.
    r2 = create(client, engine, store=False, prompt_cache_key=key, instructions=INSTRUCTIONS,
                input=[{"role": "user", "content": "Name a fruit."},
                       {"role": "assistant", "content": r1.output_text},
                       {"role": "user", "content": "Another?"}])
    assert r2.usage.input_tokens_details.cached_tokens > 0
    assert extras(r2.usage)["resume"] in ("full", "diverged")


def test_input_items_lists_the_request_input_with_ids(client, engine):
    r = create(client, engine, input=[{"role": "user", "content": "One."},
                                      {"role": "user", "content": "Two."}])
    items = client.responses.input_items.list(r.id, order="asc")
    assert [i.type for i in items.data] == ["message", "message"]
    assert all(i.id for i in items.data)
    desc = client.responses.input_items.list(r.id, limit=1)
    assert len(desc.data) == 1 and desc.has_more


def test_a_forced_function_call_is_a_function_call_item_and_its_output_continues(client, engine):
    tools = [{"type": "function", "name": "get_weather", "description": "Current weather",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                             "required": ["city"]}},
             {"type": "web_search"}]
    r = create(client, engine, input="What is the weather in Paris?", tools=tools,
                tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=80)
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls, r.output
    call = calls[0]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    assert "city" in json.loads(call.arguments)
    # The hosted tool was accepted and left out, and the header says so.
    raw = client.responses.with_raw_response.create(
        model=engine.model, input="hi", tools=tools, max_output_tokens=5, temperature=0)
    assert raw.headers.get("x-slotlight-tools-skipped") == "web_search"
    r2 = create(client, engine, previous_response_id=r.id, tools=tools, input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}])
    assert r2.status in ("completed", "incomplete")
    assert extras(r2.usage)["resume"] == "full"


class City(BaseModel):
    name: str = Field(max_length=30)
    country: str = Field(max_length=30)


def test_structured_output_follows_the_schema(client, engine):
    r = client.responses.parse(model=engine.model, input="Describe Paris.", text_format=City,
                               temperature=0, max_output_tokens=80)
    assert isinstance(r.output_parsed, City)


def test_cache_diagnostics_are_exact(client, engine):
    r1 = create(client, engine, input="Name a planet.", instructions=INSTRUCTIONS)
    hit = create(client, engine, input="Another?", instructions=INSTRUCTIONS,
                 previous_response_id=r1.id,
                 prompt_cache_options={"comparison_response_id": r1.id})
    # The SDK's own types read the diagnostics.
    assert hit.prompt_cache_diagnostics.type == "cache_hit"
    miss = create(client, engine, input="Name a moon.", instructions="Answer in French.",
                  prompt_cache_options={"comparison_response_id": r1.id})
    d = miss.prompt_cache_diagnostics
    assert d.type == "cache_miss" and d.reason == "input_changed"
    assert 0 < d.cache_missed_tokens <= miss.usage.input_tokens
    # Exact: the tokens after the common prefix with the compared prompt and reply.
    assert d.cache_missed_tokens == miss.usage.input_tokens - d.comparison_reusable_tokens
    gone = create(client, engine, input="x", max_output_tokens=2,
                  prompt_cache_options={"comparison_response_id": "resp_nope"})
    assert gone.prompt_cache_diagnostics.type == "comparison_response_not_found"


def test_prewarm_prefills_without_output_and_the_next_request_hits(client, engine):
    long = INSTRUCTIONS + " " + "Background: " + "the sky is blue and the grass is green. " * 20
    w = create(client, engine, input="Ready?", instructions=long,
               prompt_cache_options={"prewarm": True})
    assert w.output == [] and w.usage.output_tokens == 0
    r = create(client, engine, input="Ready?", instructions=long)
    assert r.usage.input_tokens_details.cached_tokens >= w.usage.input_tokens // 16 * 16 - 16


def test_bad_input_is_refused_in_openai_shape_naming_the_field(engine):
    cases = [
        ({"input": 3}, "input"),
        ({"input": [{"type": "message", "role": "user",
                     "content": [{"type": "input_image", "image_url": "http://x"}]}]},
         "input[0].content[0].type"),
        ({"input": "x", "max_output_tokens": 10**9}, "max_output_tokens"),
        ({"input": "x", "text": {"format": {"type": "xml"}}}, "text.format.type"),
        ({"input": "x", "truncation": "sometimes"}, "truncation"),
        ({"input": "x", "not_a_field": 1}, "not_a_field"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
    ]
    for body, param in cases:
        code, err = http_json("POST", engine.base + "/v1/responses", {"model": engine.model, **body})
        assert code == 400, (body, err)
        assert err["error"]["param"] == param, (body, err)
        assert err["error"]["type"] == "invalid_request_error"
    assert http_json("GET", engine.base + "/health")[0] == 200


def test_every_sdk_field_is_accepted(client, engine):
    r = client.responses.create(
        model=engine.model, input="Say hi.", instructions=INSTRUCTIONS, max_output_tokens=10,
        temperature=0.2, top_p=0.9, top_logprobs=2, include=["message.output_text.logprobs",
                                                             "reasoning.encrypted_content"],
        metadata={"k": "v"}, user="u1", safety_identifier="s1", prompt_cache_key="pk",
        prompt_cache_retention="24h", truncation="auto", reasoning={"effort": "low", "summary": "auto"},
        parallel_tool_calls=False, text={"format": {"type": "text"}, "verbosity": "low"},
        service_tier="auto", max_tool_calls=2, store=True, background=False,
        tool_choice="auto",
    )
    assert r.metadata == {"k": "v"}
    lp = r.output[0].content[0].logprobs
    assert lp and len(lp[0].top_logprobs) == 2


def test_the_agents_sdk_runs_an_agent(engine):
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, set_tracing_disabled

    set_tracing_disabled(True)
    model = OpenAIResponsesModel(
        model=engine.model,
        openai_client=openai.AsyncOpenAI(base_url=engine.base + "/v1", api_key="unused", max_retries=0),
    )
    # Greedy: a sampled 135M model can ramble to the end of its context, and the SDK raises on
    # an `incomplete` response (the engine's answer to a reply cut at the context's end).
    agent = Agent(name="brief", instructions=INSTRUCTIONS, model=model,
                  model_settings=ModelSettings(temperature=0))
    result = Runner.run_sync(agent, "Name the capital of France.")
    assert isinstance(result.final_output, str) and result.final_output


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sqlite_store_survives_a_restart_and_a_kill_9(client, engine, tmp_path):
    require_model()
    db = tmp_path / "responses.db"
    e1 = EngineProcess("--batch", "2", "--responses-db", str(db))
    try:
        c1 = openai.OpenAI(base_url=e1.base + "/v1", api_key="u", max_retries=0, timeout=300)
        r1 = create(c1, e1, input="Name the capital of France.", instructions=INSTRUCTIONS)
        # A stream's response is stored before its last event.
        with c1.responses.stream(model=e1.model, input="Say hi.", temperature=0,
                                 max_output_tokens=300) as s:
            for _ in s:
                pass
            streamed = s.get_final_response()
    finally:
        e1.proc.send_signal(signal.SIGKILL)
        e1.proc.wait()
    e2 = EngineProcess("--batch", "2", "--responses-db", str(db))
    try:
        c2 = openai.OpenAI(base_url=e2.base + "/v1", api_key="u", max_retries=0, timeout=300)
        assert c2.responses.retrieve(r1.id).output_text == r1.output_text
        assert c2.responses.retrieve(streamed.id).output_text == streamed.output_text
        # The continuation after the restart is exact too: the KV is gone, so `evicted`... or
        # `first` (the engine's memory of sessions is new); the prompt is the same tokens.
        r2 = create(c2, e2, input="And of Italy?", instructions=INSTRUCTIONS,
                    previous_response_id=r1.id)
        assert r2.usage.input_tokens > r1.usage.input_tokens + r1.usage.output_tokens
    finally:
        e2.close()


def test_a_response_store_of_redis_is_shared_by_two_engines(tmp_path):
    require_model()
    server = _redis_server()
    port = _free_port()
    redis = _start_redis(server, port, tmp_path)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        a = EngineProcess("--batch", "2", "--responses-db", url)
        b = EngineProcess("--batch", "2", "--responses-db", url)
        try:
            ca = openai.OpenAI(base_url=a.base + "/v1", api_key="u", max_retries=0, timeout=300)
            cb = openai.OpenAI(base_url=b.base + "/v1", api_key="u", max_retries=0, timeout=300)
            r1 = create(ca, a, input="Name the capital of France.", instructions=INSTRUCTIONS)
            # Another replica reads it and continues from its exact tokens.
            assert cb.responses.retrieve(r1.id).output_text == r1.output_text
            r2 = create(cb, b, input="And of Italy?", instructions=INSTRUCTIONS,
                        previous_response_id=r1.id)
            assert r2.usage.input_tokens > r1.usage.input_tokens + r1.usage.output_tokens
            cb.responses.delete(r1.id)
            with pytest.raises(openai.NotFoundError):
                ca.responses.retrieve(r1.id)
        finally:
            a.close()
            b.close()
    finally:
        stop_process(redis)


def test_the_store_is_behind_the_api_key(tmp_path):
    require_model()
    e = EngineProcess("--batch", "2", api_key="sekret")
    try:
        c = openai.OpenAI(base_url=e.base + "/v1", api_key="sekret", max_retries=0, timeout=300)
        r = create(c, e, input="Say hi.", max_output_tokens=5)
        code, _ = http_json("GET", e.base + f"/v1/responses/{r.id}")
        assert code == 401
        code, _ = http_json("DELETE", e.base + f"/v1/responses/{r.id}")
        assert code == 401
        assert c.responses.retrieve(r.id).id == r.id
    finally:
        e.close()


def test_a_store_that_cannot_be_opened_leaves_the_engine_serving(tmp_path):
    """A corrupt store file: the engine starts, chat and unstored responses are served, a
    response to store is a 503 naming the reason, /health stays up."""
    require_model()
    db = tmp_path / "responses.db"
    db.write_bytes(b"this is not an SQLite database\n" * 64)
    e = EngineProcess("--batch", "2", "--responses-db", str(db))
    try:
        code, _ = http_json("GET", e.base + "/health")
        assert code == 200
        code, v = http_json("POST", e.base + "/v1/chat/completions", {
            "model": e.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert code == 200, v
        code, v = http_json("POST", e.base + "/v1/responses", {
            "model": e.model, "input": "hi", "max_output_tokens": 4, "store": False})
        assert code == 200, v
        code, v = http_json("POST", e.base + "/v1/responses", {
            "model": e.model, "input": "hi", "max_output_tokens": 4})
        assert code == 503, v
        assert v["error"]["code"] == "unavailable" and "unavailable" in v["error"]["message"], v
        code, v = http_json("GET", e.base + "/v1/responses/resp_x")
        assert code == 503, v
        # The reason is on /health, on /metrics and in the log.
        code, h = http_json("GET", e.base + "/health")
        assert h["responses_store"]["available"] is False, h
        assert h["responses_store"]["reason"], h
        metrics = _text(e.base + "/metrics")
        line = next(l for l in metrics.splitlines()
                    if l.startswith("slotlight_engine_responses_store_available{"))
        assert 'backend="unavailable"' in line and 'reason="' in line and line.endswith(" 0"), line
        assert any("Responses.StoreUnavailable" in l for l in e.log)
    finally:
        e.close()


def _store_health(e) -> dict:
    code, h = http_json("GET", e.base + "/health")
    assert code == 200, h
    return h["responses_store"]


def test_a_sqlite_store_locked_by_another_process_is_waited_for_then_given_up(tmp_path):
    """A second process holding the store's write lock: released within the busy timeout,
    the engine waits and opens the store; held past it, the engine serves without it."""
    import sqlite3
    import threading
    require_model()
    db = tmp_path / "responses.db"

    def hold(seconds: float) -> threading.Thread:
        ready = threading.Event()

        def run():
            con = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
            con.execute("BEGIN EXCLUSIVE")
            ready.set()
            time.sleep(seconds)
            con.execute("ROLLBACK")
            con.close()
        t = threading.Thread(target=run, daemon=True)
        t.start()
        assert ready.wait(30)
        return t

    t = hold(1.5)
    e = EngineProcess("--batch", "2", "--responses-db", str(db))
    try:
        assert _store_health(e)["available"] is True
        code, stored, r = _raw_create(e.base, {"model": e.model, "input": "hi",
                                              "max_output_tokens": 4})
        assert (code, stored) == (200, "true"), r
    finally:
        e.close()
        t.join()
    t = hold(12)
    e = EngineProcess("--batch", "2", "--responses-db", str(db))
    try:
        h = _store_health(e)
        assert h["available"] is False and "locked" in h["reason"], h
        code, v = http_json("POST", e.base + "/v1/chat/completions", {
            "model": e.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert code == 200, v
    finally:
        e.close()
        t.join()


def test_a_truncated_sqlite_store_is_found_at_start_and_the_engine_serves(tmp_path):
    require_model()
    db = tmp_path / "responses.db"
    e = EngineProcess("--batch", "2", "--responses-db", str(db))
    try:
        for n in range(6):
            code, _, r = _raw_create(e.base, {"model": e.model, "input": "x " * 400 + str(n),
                                              "max_output_tokens": 4})
            assert code == 200, r
    finally:
        e.close()
    size = db.stat().st_size
    assert size > 8192, size
    with open(db, "r+b") as f:
        f.truncate(size // 2)
    e = EngineProcess("--batch", "2", "--responses-db", str(db))
    try:
        h = _store_health(e)
        assert h["available"] is False and h["reason"], h
        code, v = http_json("POST", e.base + "/v1/chat/completions", {
            "model": e.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert code == 200, v
        code, _, v = _raw_create(e.base, {"model": e.model, "input": "hi", "max_output_tokens": 4})
        assert code == 503 and v["error"]["code"] == "unavailable", v
    finally:
        e.close()


def test_an_engine_killed_while_saving_leaves_a_consistent_store(tmp_path):
    """SIGKILL while responses are being saved, four at a time: the store opens, passes its
    check, and holds every response that was answered before the kill."""
    require_model()
    from concurrent.futures import ThreadPoolExecutor
    db = tmp_path / "responses.db"
    e = EngineProcess("--batch", "4", "--responses-db", str(db))
    answered = []
    try:
        body = {"model": e.model, "max_output_tokens": 6, "temperature": 0}

        def one(n):
            try:
                code, _, r = _raw_create(e.base, {**body, "input": f"Count to {n}."})
            except OSError:
                return None
            return r["id"] if code == 200 else None

        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(one, n) for n in range(40)]
            # Kill once a few are through, with others being saved.
            deadline = time.monotonic() + 120
            while sum(f.done() for f in futures) < 6 and time.monotonic() < deadline:
                time.sleep(0.05)
            e.proc.send_signal(signal.SIGKILL)
            e.proc.wait(timeout=30)
            answered = [f.result() for f in futures]
    finally:
        stop_process(e.proc)
    answered = [a for a in answered if a]
    assert len(answered) >= 6, answered
    e = EngineProcess("--batch", "2", "--responses-db", str(db))
    try:
        assert _store_health(e)["available"] is True
        for rid in answered:
            code, v = http_json("GET", e.base + f"/v1/responses/{rid}")
            assert code == 200 and v["id"] == rid, v
    finally:
        e.close()


def _text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read().decode()


def _raw_create(base: str, body: dict):
    """POST /v1/responses; the status, the `x-slotlight-stored` header and the body."""
    req = urllib.request.Request(base + "/v1/responses", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, r.headers.get("x-slotlight-stored"), json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("x-slotlight-stored"), json.loads(err.read())


def _redis_server() -> str:
    """The `redis-server` binary; skips the calling test when it is missing, or fails it when
    SLOTLIGHT_REQUIRE_TOOLS=1."""
    server = shutil.which("redis-server")
    if server is None:
        if os.environ.get("SLOTLIGHT_REQUIRE_TOOLS") == "1":
            pytest.fail("redis-server is required (Debian package redis-server)")
        pytest.skip("redis-server is not installed")
    return server


def _start_redis(server: str, port: int, folder: Path) -> subprocess.Popen:
    """A redis-server that writes every change to its append-only file before answering, so
    a SIGKILL loses nothing it acknowledged."""
    p = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes",
         "--appendfsync", "always", "--dir", str(folder)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return p
        except OSError:
            if time.monotonic() > deadline:
                stop_process(p)
                raise
            time.sleep(0.1)


def test_a_redis_store_that_goes_away_under_load_loses_no_request_and_is_used_again(tmp_path):
    """redis-server SIGKILLed while responses are being created, then started again on the
    same port: during the outage every request is answered, marked as not stored (the header,
    `store: false`, the counter, the log line); once it is back, responses are stored again
    and a chain begun before the outage continues, without restarting the engine."""
    require_model()
    server = _redis_server()
    port = _free_port()
    redis = _start_redis(server, port, tmp_path)
    e = EngineProcess("--batch", "4", "--responses-db", f"redis://127.0.0.1:{port}/0",
                      "--responses-redis-connect-timeout-ms", "300",
                      "--responses-redis-timeout-ms", "1000")
    try:
        body = {"model": e.model, "instructions": INSTRUCTIONS, "temperature": 0,
                "max_output_tokens": 24}
        code, stored, r1 = _raw_create(e.base, {**body, "input": "Name the capital of France."})
        assert (code, stored, r1["store"]) == (200, "true", True), r1

        # Load: four requests at a time, Redis killed while they run.
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(_raw_create, e.base, {**body, "input": f"Count to {n}."})
                       for n in range(8)]
            time.sleep(0.5)
            redis.kill()
            redis.wait(timeout=30)
            during = [f.result() for f in futures]
        assert all(code == 200 for code, _, _ in during), during
        # Each is answered; those that finished after the kill say they were not stored.
        unstored = [r for code, header, r in during if header == "false"]
        assert all(r["store"] is False for r in unstored)
        assert all(r["status"] in ("completed", "incomplete") for _, _, r in during)
        # With Redis down, every request is still answered, unstored.
        code, stored, r_down = _raw_create(e.base, {**body, "input": "Name the capital of Spain."})
        assert (code, stored, r_down["store"]) == (200, "false", False), r_down
        unstored.append(r_down)
        conn, resp = post_stream(e.base, {**body, "input": "Say hello.", "stream": True},
                                 path="/v1/responses")
        streamed = [json.loads(l[len(b"data: "):]) for l in resp.read().splitlines()
                    if l.startswith(b"data: ")]
        conn.close()
        done = [ev for ev in streamed if ev.get("type") in ("response.completed",
                                                           "response.incomplete")]
        assert done and done[-1]["response"]["store"] is False, streamed[-3:]
        unstored.append(done[-1]["response"])
        # A read needs the store: 503 in OpenAI's shape, not a hang.
        code, v = http_json("GET", e.base + f"/v1/responses/{r1['id']}")
        assert code == 503 and v["error"]["code"] == "unavailable", v

        redis = _start_redis(server, port, tmp_path)
        # Back: stored again, with no restart of the engine (the first call may still see
        # the old connection fail; the manager reconnects).
        deadline = time.monotonic() + 30
        while True:
            code, stored, r2 = _raw_create(e.base, {**body, "input": "And of Italy?",
                                                    "previous_response_id": r1["id"]})
            if stored == "true" or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert (code, stored, r2["store"]) == (200, "true", True), r2
        assert r2["usage"]["input_tokens"] > r1["usage"]["input_tokens"] + r1["usage"]["output_tokens"]
        code, got = http_json("GET", e.base + f"/v1/responses/{r2['id']}")
        assert code == 200 and got["id"] == r2["id"], got
        # What was not stored is a clear 404 to continue from.
        for r in unstored:
            code, v = http_json("POST", e.base + "/v1/responses", {
                **body, "input": "More.", "previous_response_id": r["id"]})
            assert code == 404 and v["error"]["param"] == "previous_response_id", v
        metrics = _text(e.base + "/metrics")
        line = next(l for l in metrics.splitlines()
                    if l.startswith("slotlight_engine_responses_not_stored_total{"))
        assert line == f'slotlight_engine_responses_not_stored_total{{backend="redis"}} {len(unstored)}', line
        assert sum("Responses.NotStored" in l for l in e.log) == len(unstored)
    finally:
        e.close()
        stop_process(redis)
