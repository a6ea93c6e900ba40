"""The official `anthropic` SDK against the engine's Messages API, with the default model
(SmolLM2-135M-Instruct, whose template has no tool support, so tools take the generic
format): `messages.create`, `messages.stream` with `get_final_message`, the beta client
(`/v1/messages?beta=true`), a tool loop with `tool_use` and `tool_result`, structured output
with `messages.parse`, `count_tokens` equal to the prompt a reply is given, `thinking` and
`output_config` accepted, the cache diagnostics in the SDK's own types, the API key as
`x-api-key`, and bad input answered in Anthropic's shape naming the field while the engine
stays healthy."""

from __future__ import annotations

import json
from typing import Literal

import anthropic
import pytest
from pydantic import BaseModel

from procs import EngineProcess, http_json, require_model


@pytest.fixture(scope="module")
def client(lone_engine):
    return anthropic.Anthropic(base_url=lone_engine.base, api_key="unused", max_retries=0, timeout=300)


def _user(text: str):
    return [{"role": "user", "content": text}]


def test_create_returns_a_message(client, lone_engine):
    m = client.messages.create(
        model=lone_engine.model,
        max_tokens=24,
        system="You are a helpful assistant. Answer in one sentence.",
        messages=_user("What is the capital of France?"),
    )
    assert isinstance(m, anthropic.types.Message)
    assert m.id.startswith("msg_") and m.role == "assistant" and m.type == "message"
    assert m.model == lone_engine.model
    assert m.stop_reason in ("end_turn", "max_tokens"), m
    assert [b.type for b in m.content] == ["text"], m.content
    assert m.content[0].text
    assert m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) > 0
    assert 0 < m.usage.output_tokens <= 24
    # The id the SDK reads from the `request-id` header is the message's.
    assert m._request_id == m.id


def test_stream_with_get_final_message(client, lone_engine):
    texts = []
    with client.messages.stream(
        model=lone_engine.model,
        max_tokens=24,
        messages=_user("Write one sentence about the sea."),
    ) as stream:
        for text in stream.text_stream:
            texts.append(text)
        final = stream.get_final_message()
    assert final.id.startswith("msg_")
    assert final.content[0].type == "text"
    assert final.content[0].text == "".join(texts)
    assert final.stop_reason in ("end_turn", "max_tokens")
    # The final usage comes with `message_delta`: the SDK took every count it carried.
    assert 0 < final.usage.output_tokens <= 24
    total = final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0)
    count = client.messages.count_tokens(model=lone_engine.model, messages=_user("Write one sentence about the sea."))
    assert count.input_tokens == total


def test_the_beta_client_and_every_field_claude_code_sends(client, lone_engine):
    m = client.beta.messages.create(
        model=lone_engine.model,
        max_tokens=32000,  # more than the engine allows: clamped, not refused
        system=[
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=test;"},
            {"type": "text", "text": "You are an agent.", "cache_control": {"type": "ephemeral"}},
        ],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Say hello.", "cache_control": {"type": "ephemeral"}}]},
        ],
        metadata={"user_id": json.dumps({"device_id": "d", "account_uuid": "", "session_id": "s-beta"})},
        thinking={"type": "adaptive", "display": "omitted"},
        context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        output_config={"effort": "high"},
        betas=["claude-code-20250219", "interleaved-thinking-2025-05-14", "context-management-2025-06-27"],
        extra_headers={"anthropic-version": "2023-06-01", "x-app": "cli"},
    )
    # Clamped to the context: a sampled reply may run to its end, which Anthropic names.
    assert m.stop_reason in ("end_turn", "max_tokens", "model_context_window_exceeded")
    # A turn of the same session resumes its KV: the first turn's tokens are read back. The
    # clamped turn above may fill the context (a sampled reply of up to the whole of it), so
    # the session's turns here are short ones.
    m = client.beta.messages.create(
        model=lone_engine.model,
        max_tokens=16,
        system=[
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=test;"},
            {"type": "text", "text": "You are an agent.", "cache_control": {"type": "ephemeral"}},
        ],
        messages=[{"role": "user", "content": [{"type": "text", "text": "Say hello."}]}],
        metadata={"user_id": json.dumps({"device_id": "d", "account_uuid": "", "session_id": "s-beta-2"})},
    )
    m2 = client.beta.messages.create(
        model=lone_engine.model,
        max_tokens=8,
        system=[
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=test;"},
            {"type": "text", "text": "You are an agent.", "cache_control": {"type": "ephemeral"}},
        ],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Say hello."}]},
            {"role": "assistant", "content": [b.model_dump() for b in m.content] or "Hello."},
            {"role": "user", "content": "Again."},
        ],
        metadata={"user_id": json.dumps({"device_id": "d", "account_uuid": "", "session_id": "s-beta-2"})},
    )
    assert (m2.usage.cache_read_input_tokens or 0) > 0, m2.usage


def test_temperature_top_p_top_k_from_an_older_client(client, lone_engine):
    m = client.messages.create(
        model=lone_engine.model,
        max_tokens=8,
        messages=_user("Count to three."),
        stop_sequences=["\n\n"],
        extra_body={"temperature": 0.2, "top_p": 0.9, "top_k": 20},
    )
    assert m.stop_reason in ("end_turn", "max_tokens", "stop_sequence")
    if m.stop_reason == "stop_sequence":
        assert m.stop_sequence == "\n\n"


WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 30},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}


def test_a_tool_loop_with_tool_use_and_tool_result(client, lone_engine):
    messages = _user("What is the weather in Paris right now?")
    m = client.messages.create(
        model=lone_engine.model,
        max_tokens=160,
        messages=messages,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    assert m.stop_reason == "tool_use", m
    calls = [b for b in m.content if b.type == "tool_use"]
    assert len(calls) == 1, m.content
    call = calls[0]
    assert call.id.startswith("toolu_") and call.name == "get_weather"
    assert set(call.input) == {"city", "unit"} and call.input["unit"] in ("celsius", "fahrenheit")
    assert isinstance(call.input["city"], str) and len(call.input["city"]) <= 30
    # The SDK's own message goes back into the history, with the result of the call.
    messages = messages + [
        m.to_param(),
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": json.dumps({"temperature": 21})}]},
    ]
    m2 = client.messages.create(model=lone_engine.model, max_tokens=60, messages=messages, tools=[WEATHER])
    assert m2.stop_reason in ("end_turn", "max_tokens", "tool_use")
    for b in m2.content:
        if b.type == "tool_use":
            assert b.name == "get_weather" and isinstance(b.input, dict)
    # Streamed, the call arrives whole with its input as JSON; the SDK assembles it.
    with client.messages.stream(
        model=lone_engine.model, max_tokens=160, messages=_user("Weather in Rome?"), tools=[WEATHER],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    ) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    [streamed] = [b for b in final.content if b.type == "tool_use"]
    assert streamed.name == "get_weather" and set(streamed.input) == {"city", "unit"}


class City(BaseModel):
    # The SDK moves numeric and length bounds out of the schema it sends (into descriptions)
    # and checks them itself: a schema of types and enums is what reaches the engine.
    name: str
    country: str
    kind: Literal["capital", "port", "other"]
    coastal: bool


def test_structured_output_with_parse(client, lone_engine):
    m = client.messages.parse(
        model=lone_engine.model,
        max_tokens=200,
        messages=_user("Describe Paris as JSON."),
        output_format=City,
    )
    if m.stop_reason == "end_turn":
        assert isinstance(m.parsed_output, City), m.content
        City.model_validate_json(m.content[0].text)


def test_thinking_and_effort_are_accepted(client, lone_engine):
    for thinking in ({"type": "adaptive"}, {"type": "enabled", "budget_tokens": 1024}, {"type": "disabled"}):
        m = client.messages.create(
            model=lone_engine.model, max_tokens=8, messages=_user("Hi."), thinking=thinking, output_config={"effort": "low"}
        )
        assert m.stop_reason in ("end_turn", "max_tokens")
        # SmolLM2 has no thinking template: no thinking block, whatever was asked.
        assert all(b.type == "text" for b in m.content)


def test_cache_diagnostics_in_the_sdks_types(client, lone_engine):
    system = "You are a careful assistant who answers in one short sentence, always."
    first = client.messages.create(
        model=lone_engine.model, max_tokens=8, system=system, messages=_user("Name a colour."),
        diagnostics={"previous_message_id": None},
    )
    assert first.diagnostics is None
    changed = client.messages.create(
        model=lone_engine.model, max_tokens=8, system="You are terse.", messages=_user("Name a colour."),
        diagnostics={"previous_message_id": first.id},
    )
    reason = changed.diagnostics.cache_miss_reason
    assert isinstance(reason, anthropic.types.CacheMissSystemChanged), changed.diagnostics
    assert reason.cache_missed_input_tokens > 0
    # No more than the first request's prompt could be missed.
    assert reason.cache_missed_input_tokens <= first.usage.input_tokens + (first.usage.cache_read_input_tokens or 0)
    gone = client.messages.create(
        model=lone_engine.model, max_tokens=8, system=system, messages=_user("Name a colour."),
        diagnostics={"previous_message_id": "msg_does_not_exist"},
    )
    assert isinstance(gone.diagnostics.cache_miss_reason, anthropic.types.CacheMissPreviousMessageNotFound)
    # The same request again: the prompt is the first one's, a hit (`diagnostics: null`).
    again = client.messages.create(
        model=lone_engine.model, max_tokens=8, system=system, messages=_user("Name a colour."),
        diagnostics={"previous_message_id": first.id},
    )
    assert again.diagnostics is None


def test_bad_input_is_answered_in_anthropics_shape_and_the_engine_serves_on(client, lone_engine):
    cases = [
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]},
            "messages[0].content[0]",
            "image",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}]}]},
            "messages[0].content[0]",
            "document",
        ),
        ({"messages": _user("x"), "tools": [{"name": "bad name!", "input_schema": {"type": "object"}}]}, "tools[0].name", "name"),
        ({"messages": _user("x"), "thinking": {"type": "enabled"}}, "thinking.budget_tokens", "budget_tokens"),
        ({"messages": _user("x"), "extra_body": {"frequency_penalty": 1}}, "frequency_penalty", "unknown field"),
    ]
    for kwargs, field, word in cases:
        extra = kwargs.pop("extra_body", None)
        with pytest.raises(anthropic.BadRequestError) as e:
            client.messages.create(model=lone_engine.model, max_tokens=8, extra_body=extra, **kwargs)
        body = e.value.body
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
        assert field in body["error"]["message"] and word in body["error"]["message"], body
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="claude-sonnet-4-6", max_tokens=8, messages=_user("x"))
    assert e.value.body["error"]["type"] == "not_found_error"
    assert "claude-sonnet-4-6" in e.value.body["error"]["message"]
    # `max_tokens` is required (the SDK insists too: sent by hand).
    code, body = http_json("POST", lone_engine.base + "/v1/messages", {"model": lone_engine.model, "messages": _user("x")})
    assert code == 400 and body["error"]["type"] == "invalid_request_error" and "max_tokens" in body["error"]["message"], body
    code, body = http_json("POST", lone_engine.base + "/v1/messages?beta=true", {"max_tokens": 8, "messages": "hello"})
    assert code == 400 and "messages" in body["error"]["message"], body
    # Healthy, and serving.
    code, health = lone_engine.get("/health")
    assert code == 200 and health["status"] == "ok"
    m = client.messages.create(model=lone_engine.model, max_tokens=4, messages=_user("Still there?"))
    assert m.stop_reason in ("end_turn", "max_tokens")


def test_the_api_key_as_x_api_key():
    require_model()
    e = EngineProcess("--batch", "2", api_key="k-123")
    try:
        good = anthropic.Anthropic(base_url=e.base, api_key="k-123", max_retries=0, timeout=120)
        m = good.messages.create(model=e.model, max_tokens=4, messages=_user("Hi."))
        assert m.id.startswith("msg_")
        bad = anthropic.Anthropic(base_url=e.base, api_key="wrong", max_retries=0, timeout=120)
        with pytest.raises(anthropic.AuthenticationError) as err:
            bad.messages.create(model=e.model, max_tokens=4, messages=_user("Hi."))
        assert err.value.body["error"]["type"] == "authentication_error"
        # A bearer token (Claude Code's ANTHROPIC_AUTH_TOKEN) works too.
        bearer = anthropic.Anthropic(base_url=e.base, auth_token="k-123", max_retries=0, timeout=120)
        assert bearer.messages.count_tokens(model=e.model, messages=_user("Hi.")).input_tokens > 0
    finally:
        e.close()
