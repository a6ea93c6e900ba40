"""The engine's Responses and Messages answers read against the official SDKs' own types
(the pinned `openai` and `anthropic` packages), validated strictly: a value the SDK does not
know (a status, a stop reason, an `incomplete_details.reason`, an event type) fails here, where
the SDKs' clients would pass it through unchecked. Whole answers and every stream event, on
the default model: plain replies, replies cut at their token limit, tool calls, and a reply
that fills the context."""

from __future__ import annotations

import http.client
import json
import urllib.parse

import pydantic
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from openai.types.responses import Response, ResponseStreamEvent

from procs import EngineProcess, http_json, require_model

RESPONSE_EVENT = pydantic.TypeAdapter(ResponseStreamEvent)
MESSAGE_EVENT = pydantic.TypeAdapter(RawMessageStreamEvent)

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]},
}


@pytest.fixture(scope="module")
def engine():
    require_model()
    e = EngineProcess("--batch", "2", ctx_size=512)
    yield e
    e.close()


def sse(base: str, path: str, body: dict) -> list[dict]:
    """The data of every event of a stream."""
    u = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
    try:
        conn.request("POST", path, json.dumps({**body, "stream": True}),
                     {"content-type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200, r.read()
        return [json.loads(line[len(b"data: "):]) for line in r.read().splitlines()
                if line.startswith(b"data: ") and line != b"data: [DONE]"]
    finally:
        conn.close()


def responses_cases(e) -> list[dict]:
    base = {"model": e.model, "temperature": 0}
    return [
        {**base, "input": "Name the capital of France.", "max_output_tokens": 40},
        # Cut at its limit: `incomplete`, reason `max_output_tokens`.
        {**base, "input": "Write a long story about a dragon.", "max_output_tokens": 8},
        {**base, "input": "What is the weather in Paris? Use the tool.",
         "tools": [{"type": "function", **WEATHER}], "tool_choice": "required",
         "max_output_tokens": 60},
        # No limit: runs to the end of the context (512 positions), OpenAI's meaning.
        {**base, "input": "Count from one to one thousand in words. " * 20},
    ]


def messages_cases(e) -> list[dict]:
    base = {"model": e.model, "temperature": 0}
    return [
        {**base, "max_tokens": 40, "messages": [{"role": "user", "content": "Name a colour."}]},
        {**base, "max_tokens": 8,
         "messages": [{"role": "user", "content": "Write a long story about a dragon."}]},
        {**base, "max_tokens": 60, "tools": [{"name": WEATHER["name"],
                                              "description": WEATHER["description"],
                                              "input_schema": WEATHER["parameters"]}],
         "tool_choice": {"type": "any"},
         "messages": [{"role": "user", "content": "What is the weather in Paris?"}]},
        {**base, "max_tokens": 4000, "messages": [
            {"role": "user", "content": "Count from one to one thousand in words. " * 20}]},
    ]


def test_responses_whole_and_streamed_are_the_sdks_types(engine):
    seen = set()
    for body in responses_cases(engine):
        code, v = http_json("POST", engine.base + "/v1/responses", body, timeout=300)
        assert code == 200, v
        r = Response.model_validate(v)
        seen.add((r.status, r.incomplete_details.reason if r.incomplete_details else None))
        events = sse(engine.base, "/v1/responses", body)
        for ev in events:
            RESPONSE_EVENT.validate_python(ev)
        final = events[-1]
        assert final["type"] in ("response.completed", "response.incomplete"), final
        Response.model_validate(final["response"])
    assert ("incomplete", "max_output_tokens") in seen, seen
    assert any(status == "completed" for status, _ in seen), seen


def test_messages_whole_and_streamed_are_the_sdks_types(engine):
    reasons = set()
    for body in messages_cases(engine):
        code, v = http_json("POST", engine.base + "/v1/messages", body, timeout=300)
        assert code == 200, v
        m = Message.model_validate(v)
        reasons.add(m.stop_reason)
        events = sse(engine.base, "/v1/messages", body)
        for ev in events:
            if ev == {"type": "ping"}:
                continue  # documented by Anthropic; the SDK's union of events leaves it out
            MESSAGE_EVENT.validate_python(ev)
        assert events[0]["type"] == "message_start", events[0]
        delta = next(ev for ev in events if ev["type"] == "message_delta")
        # `message_start` already carries the final input counts.
        start = events[0]["message"]["usage"]
        for k in ("input_tokens", "cache_read_input_tokens"):
            assert start[k] == delta["usage"][k], (start, delta)
    assert {"max_tokens", "tool_use", "model_context_window_exceeded"} <= reasons, reasons
