"""Sessions across the processes, with the real model: the engine exports to the sidecar, which
forwards the same spans to an OTLP receiver standing in for a collector.

- a key found each way the chat and completions doors take one (the `x-session-id` header,
  `prompt_cache_key`, `user`), and a session found without any key (a client that resends its
  history): the same session id, key source and turn index on the request span (`session.id`
  beside `gen_ai.conversation.id`), in the sidecar's turn records and in `/v1/sessions`;
- a found session's first turn, sent without a key, is filed under the session as its turn 0;
- a side call under a session's key (its own prompt) takes a branch of its own, counted apart
  (`side_calls`), and the next real turn still resumes `full`;
- the gaps between turns are measured: each turn's `gap_before_s` is its arrival less the
  previous turn's end, and `client_s` their sum;
- a sidecar restarted mid-session (its turn store kept) answers `/v1/sessions` exactly as
  before, and the session's next turn joins it.

Issue 32 ("An agent's session, seen whole and kept warm"), item 7; issue 39, item 3.
"""

from __future__ import annotations

import tempfile
import time
import urllib.error
import uuid
from pathlib import Path

import pytest

from otlp_receiver import OtlpReceiver
from procs import EngineProcess, SidecarProcess, pinned_sidecar, require_model
from sidecar_support import ATTR


def span_attrs(span) -> dict:
    out = {}
    for a in span.attributes:
        v = a.value
        out[a.key] = getattr(v, v.WhichOneof("value"))
    return out


class Setup:
    def __init__(self):
        self.receiver = OtlpReceiver()
        self.sidecar = SidecarProcess("--forward-otlp", self.receiver.base)
        self.engine = EngineProcess("--batch", "4", otlp=f"http://{self.sidecar.grpc}")

    def close(self):
        self.engine.close()
        self.sidecar.close()
        self.receiver.close()

    def request_span(self, request_id: str) -> dict:
        """The request span of `request_id`, as the collector received it."""
        found = []

        def has(r):
            found[:] = [s for s in r.spans() if span_attrs(s).get(ATTR["REQUEST_ID"]) == request_id
                        and ATTR["GEN_AI_OPERATION_NAME"] in span_attrs(s)]
            return bool(found)

        self.receiver.wait(has, f"the request span of {request_id}")
        return span_attrs(found[0])


@pytest.fixture(scope="module")
def setup():
    require_model()
    s = Setup()
    yield s
    s.close()


def wait_session(side, sid: str, turns: int) -> dict:
    """`/v1/sessions/{sid}` once it lists `turns` turn records (404 until its first arrives)."""
    last = None
    for _ in range(1000):
        try:
            last = side.get(f"/v1/sessions/{sid}")
            if len(last["turn_records"]) == turns:
                return last
        except urllib.error.HTTPError as err:
            assert err.code == 404, err
        time.sleep(0.02)
    raise AssertionError(f"session {sid} never had {turns} turns: {last}")


def chat(engine, messages, headers=None, **extra):
    body = {"messages": messages, "max_tokens": 8, "temperature": 0, **extra}
    code, v = engine.post("/v1/chat/completions", body, headers=headers)
    assert code == 200, v
    return v


def reply(v):
    return {"role": "assistant", "content": v["choices"][0]["message"]["content"]}


def conversation(engine, questions, headers=None, **extra):
    """A chat of one turn per question, each resending the whole history; the responses."""
    msgs = [{"role": "system", "content": "You are a terse assistant."}]
    out = []
    for q in questions:
        msgs.append({"role": "user", "content": q})
        v = chat(engine, msgs, headers, **extra)
        out.append(v)
        msgs.append(reply(v))
    return out


def check_turn(setup, response_id, session, source, turn):
    """The same session on the request span and in the turn record; the record, returned."""
    span = setup.request_span(response_id)
    assert span[ATTR["SESSION_ID"]] == session, span
    assert span[ATTR["GEN_AI_CONVERSATION_ID"]] == session
    assert span[ATTR["SESSION_SOURCE"]] == source
    assert span[ATTR["SESSION_TURN"]] == turn
    rec = setup.sidecar.wait_turn(response_id)
    assert (rec["session_id"], rec["session_source"], rec["session_turn"]) == (session, source, turn), rec
    return rec


def test_each_key_and_a_found_session_are_the_same_on_spans_turn_records_and_sessions(setup):
    e, side = setup.engine, setup.sidecar
    tag = uuid.uuid4().hex[:8]
    # The header, over two turns.
    h = f"hdr-{tag}"
    hdr = conversation(e, ["Name a large ocean.", "Name a small sea."], headers={"x-session-id": h},
                       user="ignored-when-the-header-is-there")
    for i, v in enumerate(hdr):
        check_turn(setup, v["id"], h, "header", i)
    assert hdr[1]["usage"]["resume"] == "full"
    # prompt_cache_key (Codex's conversation id) and user (chat and completions).
    p = chat(e, [{"role": "user", "content": "Hello."}], prompt_cache_key=f"pck-{tag}", user=f"u-{tag}")
    check_turn(setup, p["id"], f"pck-{tag}", "prompt_cache_key", 0)
    code, c = e.post("/v1/completions", {"prompt": "The sky is", "max_tokens": 4, "user": f"c-{tag}"})
    assert code == 200, c
    rec = check_turn(setup, c["id"], f"c-{tag}", "user", 0)
    assert rec["api"] == "completions"
    # No key at all: the second turn extends the first (prompt and reply), the third the second.
    # The first turn carries its (provisional) session id from its arrival on.
    found = conversation(e, ["Name a river.", "Name a mountain.", "Name a lake."])
    first = setup.request_span(found[0]["id"])
    fid = first[ATTR["SESSION_ID"]]
    assert fid.startswith("found-"), first
    second = setup.request_span(found[1]["id"])
    assert second[ATTR["SESSION_ID"]] == fid, second
    assert second[ATTR["SESSION_EXTENDS"]] == found[0]["id"]
    check_turn(setup, found[0]["id"], fid, "found", 0)
    check_turn(setup, found[1]["id"], fid, "found", 1)
    check_turn(setup, found[2]["id"], fid, "found", 2)
    assert [v["usage"]["resume"] for v in found[1:]] == ["full", "full"], [v["usage"] for v in found]
    # The sessions view: every session with its turns; the found one with its turn 0.
    want = {h: 2, f"pck-{tag}": 1, f"c-{tag}": 1, fid: 3}
    listed = side.wait_for(
        "/v1/sessions?limit=1000&min_turns=1",
        lambda v: all(any(s["session_id"] == k and s["turns"] == n for s in v["sessions"]) for k, n in want.items()),
        "every session",
    )
    # By default, sessions of one turn are left out.
    default = {s["session_id"] for s in side.get("/v1/sessions?limit=1000")["sessions"]}
    assert h in default and fid in default and f"pck-{tag}" not in default
    by_id = {s["session_id"]: s for s in listed["sessions"]}
    assert by_id[h]["source"] == "header" and by_id[fid]["source"] == "found"
    assert by_id[h]["apis"] == ["chat.completions"] and by_id[f"c-{tag}"]["apis"] == ["completions"]
    assert by_id[fid]["resume"].get("full") == 2, by_id[fid]
    detail = wait_session(side, fid, 3)
    ids = [t["request_id"] for t in detail["turn_records"]]
    assert ids == [v["id"] for v in found]
    assert [t["session_turn"] for t in detail["turn_records"]] == [0, 1, 2]
    assert all(t["session_id"] == fid for t in detail["turn_records"])
    # Two conversations that share only the system prompt stay apart: a new one finds none
    # and starts its own.
    apart = conversation(e, ["Name a desert."])
    own = setup.request_span(apart[0]["id"])[ATTR["SESSION_ID"]]
    assert own.startswith("found-") and own != fid


def test_the_agent_doors_keys_are_the_same_on_spans_turn_records_and_sessions(setup):
    """The Responses door's `conversation` and stored chain, and Claude Code's session inside
    the Messages door's `metadata.user_id`."""
    e, side = setup.engine, setup.sidecar
    tag = uuid.uuid4().hex[:8]

    def respond(**body):
        code, v = e.post("/v1/responses", {"max_output_tokens": 8, "temperature": 0, **body})
        assert code == 200, v
        return v

    conv = f"conv-{tag}"
    c1 = respond(input="Name a bird.", conversation=conv)
    c2 = respond(input="Name a fish.", conversation=conv)
    check_turn(setup, c1["id"], conv, "conversation", 0)
    check_turn(setup, c2["id"], conv, "conversation", 1)
    assert c2["usage"]["resume"] == "full", c2["usage"]
    # A stored response with no key starts a chain; its continuation is the chain's session.
    r1 = respond(input="Name a tree.")
    r2 = respond(input="Another.", previous_response_id=r1["id"])
    check_turn(setup, r1["id"], r1["id"], "response_chain", 0)
    check_turn(setup, r2["id"], r1["id"], "response_chain", 1)
    # Claude Code's metadata: a JSON object holding its session id.
    cc = f"cc-{tag}"
    meta = {"user_id": '{"device_id":"d","account_uuid":"","session_id":"%s"}' % cc}
    msgs = [{"role": "user", "content": "Name a planet."}]
    code, m1 = e.post("/v1/messages", {"max_tokens": 8, "temperature": 0, "messages": msgs, "metadata": meta})
    assert code == 200, m1
    # A side call under the same session (Claude Code's titles and topics): its own prompt.
    code, side_call = e.post("/v1/messages", {
        "max_tokens": 8, "temperature": 0, "metadata": meta,
        "system": "Write a title of three words for the conversation.",
        "messages": [{"role": "user", "content": "Name a planet."}],
    })
    assert code == 200, side_call
    msgs += [{"role": "assistant", "content": m1["content"][0]["text"]}, {"role": "user", "content": "Another."}]
    code, m2 = e.post("/v1/messages", {"max_tokens": 8, "temperature": 0, "messages": msgs, "metadata": meta})
    assert code == 200, m2
    check_turn(setup, m1["id"], cc, "metadata", 0)
    side_rec = check_turn(setup, side_call["id"], cc, "metadata", 1)
    rec = check_turn(setup, m2["id"], cc, "metadata", 2)
    assert rec["api"] == "messages"
    # The side call took a branch of its own; the next real turn still resumed the first.
    side_span = setup.request_span(side_call["id"])
    assert side_span[ATTR["SESSION_SIDE_CALL"]] is True and side_span[ATTR["SESSION_BRANCH"]] == 1, side_span
    assert (side_rec["session_side_call"], side_rec["session_branch"]) == (True, 1), side_rec
    assert (rec["session_side_call"], rec["session_branch"]) == (False, 0), rec
    assert m2["usage"]["resume"] == "full", m2["usage"]
    want = {conv: 2, r1["id"]: 2, cc: 3}
    listed = side.wait_for(
        "/v1/sessions?limit=1000",
        lambda v: all(any(s["session_id"] == k and s["turns"] == n for s in v["sessions"]) for k, n in want.items()),
        "the agent doors' sessions",
    )
    by_id = {s["session_id"]: s for s in listed["sessions"]}
    assert by_id[conv]["apis"] == ["responses"] and by_id[cc]["apis"] == ["messages"]
    assert by_id[conv]["source"] == "conversation" and by_id[cc]["source"] == "metadata"
    assert by_id[r1["id"]]["source"] == "response_chain"
    assert (by_id[cc]["side_calls"], by_id[conv]["side_calls"]) == (1, 0), by_id[cc]


def test_the_gaps_between_turns_are_the_clients_time(setup):
    e, side = setup.engine, setup.sidecar
    sid = f"gaps-{uuid.uuid4().hex[:8]}"
    turns = conversation(e, ["Say one.", "Say two.", "Say three."], headers={"x-session-id": sid})
    detail = wait_session(side, sid, 3)
    recs = detail["turn_records"]
    assert [t["request_id"] for t in recs] == [v["id"] for v in turns]
    assert recs[0]["gap_before_s"] is None
    gaps = []
    for prev, cur in zip(recs, recs[1:]):
        want = (cur["start_time_unix_nano"] - prev["end_time_unix_nano"]) / 1e9
        assert cur["gap_before_s"] == pytest.approx(want, abs=1e-9), (prev, cur)
        assert cur["gap_before_s"] >= 0
        gaps.append(cur["gap_before_s"])
    assert detail["client_s"] == pytest.approx(sum(gaps), abs=1e-9)
    model = sum(t["e2e_ms"] for t in recs) / 1e3
    assert detail["model_s"] == pytest.approx(model, rel=1e-9)
    parts = detail["queue_s"] + detail["prefill_s"] + detail["decode_s"]
    assert parts == pytest.approx(detail["model_s"], rel=1e-9)
    assert detail["prompt_tokens"] == sum(t["prompt_tokens"] for t in recs)
    assert detail["cached_tokens"] == sum(t["cached_tokens"] for t in recs)
    assert detail["cache_hit_ratio"] == pytest.approx(detail["cached_tokens"] / detail["prompt_tokens"])
    assert detail["live"] is True
    assert detail["first_turn_at"] == recs[0]["start_time_unix_nano"]
    assert detail["last_turn_at"] == recs[-1]["end_time_unix_nano"]


def test_a_sidecar_restarted_mid_session_answers_exactly_and_the_session_goes_on():
    require_model()
    with tempfile.TemporaryDirectory(prefix="slotlight-sessions-") as d:
        db = str(Path(d) / "turns.db")
        side = SidecarProcess("--turns-db", db)
        grpc = side.grpc
        e = EngineProcess("--batch", "2", otlp=f"http://{grpc}")
        try:
            sid = f"restart-{uuid.uuid4().hex[:8]}"
            msgs = [{"role": "user", "content": "Name a colour."}]
            v1 = chat(e, msgs, {"x-session-id": sid})
            msgs += [reply(v1), {"role": "user", "content": "Another."}]
            v2 = chat(e, msgs, {"x-session-id": sid})
            before = wait_session(side, sid, 2)
            listed = side.get("/v1/sessions?limit=1000")["sessions"]
            side.close()
            # The same address, the same store: the engine's exporter reaches the new one.
            side = pinned_sidecar(grpc, "--turns-db", db)
            after = side.get(f"/v1/sessions/{sid}")
            assert after == before, (before, after)
            assert side.get("/v1/sessions?limit=1000")["sessions"] == listed
            msgs += [reply(v2), {"role": "user", "content": "And one more."}]
            v3 = chat(e, msgs, {"x-session-id": sid})
            assert v3["usage"]["resume"] == "full"
            third = wait_session(side, sid, 3)
            assert [t["request_id"] for t in third["turn_records"]] == [v1["id"], v2["id"], v3["id"]]
            assert [t["session_turn"] for t in third["turn_records"]] == [0, 1, 2]
            assert third["prompt_tokens"] == before["prompt_tokens"] + v3["usage"]["prompt_tokens"]
            assert third["turn_records"][2]["gap_before_s"] > 0
        finally:
            e.close()
            side.close()
