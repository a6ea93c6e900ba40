"""The official `openai` SDK, used as agent frameworks, extraction code and eval harnesses use
it, against the engine with the default model (SmolLM2-135M-Instruct, whose template has no
tool support, so tools take the generic format): `parse` with a pydantic model, a tool loop
with `tool_choice="required"`, logprobs, `n=3`, Predicted Outputs (`prediction`), every refused
field, `/tokenize`, and the sidecar's turn record of a request of three choices."""

from __future__ import annotations

import json
from typing import Literal

import openai
import pytest
from pydantic import BaseModel, Field

from procs import http_json


@pytest.fixture(scope="module")
def client(lone_engine):
    return openai.OpenAI(base_url=lone_engine.base + "/v1", api_key="unused", max_retries=0, timeout=300)


class Address(BaseModel):
    city: str = Field(max_length=20)
    country: str = Field(max_length=20)


class Person(BaseModel):
    name: str = Field(max_length=24)
    age: int = Field(ge=0, le=130)
    role: Literal["engineer", "teacher", "doctor", "artist"]
    address: Address


def _parse(client):
    # `chat.completions.parse` in current SDKs; `beta.chat.completions.parse` in older ones.
    completions = client.chat.completions
    return completions.parse if hasattr(completions, "parse") else client.beta.chat.completions.parse


def test_parse_with_a_pydantic_model_always_validates(client, lone_engine):
    parse = _parse(client)
    for seed in range(4):
        r = parse(
            model=lone_engine.model,
            messages=[
                {"role": "system", "content": "Extract the person as JSON."},
                {"role": "user", "content": "Ada Lovelace, 36, engineer, lives in London, England."},
            ],
            response_format=Person,
            max_tokens=160,
            temperature=0.8,
            seed=seed,
        )
        choice = r.choices[0]
        assert choice.finish_reason == "stop", choice
        person = choice.message.parsed
        assert isinstance(person, Person), choice.message.content
        assert 0 <= person.age <= 130
        # The SDK's own validation passed; check the text once more by hand.
        Person.model_validate_json(choice.message.content)


def test_json_object_mode_replies_parse(client, lone_engine):
    r = client.chat.completions.create(
        model=lone_engine.model,
        messages=[{"role": "user", "content": "Give me a JSON object describing a cat."}],
        response_format={"type": "json_object"},
        max_tokens=120,
        temperature=0,
    )
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 30},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Current local time in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 30}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    },
]


def _check_call(call):
    assert call.type == "function"
    assert call.id.startswith("call")
    args = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert set(args) == {"city", "unit"} and args["unit"] in ("celsius", "fahrenheit")
    else:
        assert call.function.name == "get_time" and set(args) == {"city"}
    assert isinstance(args["city"], str) and len(args["city"]) <= 30
    return args


def test_a_tool_loop_with_tool_choice_required(client, lone_engine):
    messages = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    r = client.chat.completions.create(
        model=lone_engine.model, messages=messages, tools=TOOLS, tool_choice="required", max_tokens=160, temperature=0
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls, choice.message
    for call in choice.message.tool_calls:
        _check_call(call)
    # The SDK's own message object goes back into the history, with one result per call.
    messages.append(choice.message)
    for call in choice.message.tool_calls:
        messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21, "sky": "clear"})})
    r2 = client.chat.completions.create(model=lone_engine.model, messages=messages, tools=TOOLS, max_tokens=120, temperature=0)
    c2 = r2.choices[0]
    assert c2.finish_reason in ("stop", "length", "tool_calls")
    if c2.finish_reason == "tool_calls":
        for call in c2.message.tool_calls:
            _check_call(call)
    else:
        assert isinstance(c2.message.content, str)
    # A named function, streamed: the call arrives in `delta.tool_calls`.
    stream = client.chat.completions.create(
        model=lone_engine.model,
        messages=[{"role": "user", "content": "Time in Tokyo?"}],
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        max_tokens=120,
        stream=True,
    )
    calls, reasons = [], []
    for chunk in stream:
        for c in chunk.choices:
            calls += c.delta.tool_calls or []
            if c.finish_reason:
                reasons.append(c.finish_reason)
    assert reasons == ["tool_calls"]
    assert calls and all(c.function.name == "get_time" for c in calls)
    for c in calls:
        _check_call(c)


def test_logprobs(client, lone_engine):
    r = client.chat.completions.create(
        model=lone_engine.model,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=12,
        temperature=0,
        logprobs=True,
        top_logprobs=5,
    )
    lp = r.choices[0].logprobs.content
    assert len(lp) == r.usage.completion_tokens
    for t in lp:
        assert t.logprob <= 0
        assert len(t.top_logprobs) == 5
        assert t.top_logprobs[0].token == t.token  # greedy takes the most likely token
        assert [a.logprob for a in t.top_logprobs] == sorted((a.logprob for a in t.top_logprobs), reverse=True)
    text = b"".join(bytes(t.bytes) for t in lp if not t.token.startswith("<|")).decode()
    assert text == r.choices[0].message.content
    c = client.completions.create(model=lone_engine.model, prompt="The sky is", max_tokens=6, temperature=0, logprobs=3)
    legacy = c.choices[0].logprobs
    assert len(legacy.tokens) == len(legacy.token_logprobs) == len(legacy.text_offset) == 6
    assert all(len(d) <= 3 for d in legacy.top_logprobs)


def test_n_three_choices(client, lone_engine):
    r = client.chat.completions.create(
        model=lone_engine.model,
        messages=[{"role": "user", "content": "Name a color."}],
        max_tokens=8,
        temperature=1.0,
        seed=7,
        n=3,
        extra_body={"ignore_eos": True},
    )
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert r.usage.completion_tokens == 24
    one = client.chat.completions.create(
        model=lone_engine.model,
        messages=[{"role": "user", "content": "Name a color."}],
        max_tokens=8,
        temperature=1.0,
        seed=7,
        extra_body={"ignore_eos": True},
    )
    assert one.choices[0].message.content == r.choices[0].message.content
    assert one.usage.prompt_tokens == r.usage.prompt_tokens


def test_a_prediction_is_verified_and_reported_in_openai_usage(client, lone_engine):
    """Predicted Outputs through the SDK: a prediction of a reply that copies its prompt gives
    the same reply as without one (drafts are verified exactly), with OpenAI's
    `accepted_prediction_tokens` and `rejected_prediction_tokens` and slotlight's counts."""
    code = "def area(width, height):\n    return width * height\n\n\nprint(area(3, 4))\n"
    messages = [
        {"role": "user", "content": "Repeat this Python code exactly, and nothing else:\n\n" + code},
    ]
    plain = client.chat.completions.create(
        model=lone_engine.model, messages=messages, max_tokens=64, temperature=0
    )
    reply = plain.choices[0].message.content
    r = client.chat.completions.create(
        model=lone_engine.model,
        messages=messages,
        max_tokens=64,
        temperature=0,
        prediction={"type": "content", "content": reply},
    )
    assert r.choices[0].message.content == reply
    details = r.usage.completion_tokens_details
    assert details is not None, r.usage
    assert details.accepted_prediction_tokens > 0, r.usage
    assert details.rejected_prediction_tokens >= 0
    extra = r.usage.model_extra
    assert extra["accepted_tokens"] == details.accepted_prediction_tokens
    assert extra["drafted_tokens"] == details.accepted_prediction_tokens + details.rejected_prediction_tokens
    # A prediction that departs from the reply: its tokens are rejected, the reply unchanged.
    half = len(reply) // 2
    wrong = client.chat.completions.create(
        model=lone_engine.model,
        messages=messages,
        max_tokens=64,
        temperature=0,
        prediction={"type": "content", "content": [{"type": "text", "text": reply[:half] + " zzzz qqqq" + reply[half:]}]},
    )
    assert wrong.choices[0].message.content == reply
    assert wrong.usage.completion_tokens_details.rejected_prediction_tokens > 0, wrong.usage


REFUSED = {
    "audio": {"voice": "alloy", "format": "wav"},
    "modalities": ["text", "audio"],
    "functions": [{"name": "f", "parameters": {}}],
    "function_call": "auto",
    "reasoning_effort": "low",
    "verbosity": "low",
    "web_search_options": {},
    "metadata": {"k": "v"},
    "store": True,
    "service_tier": "flex",
}


@pytest.mark.parametrize("field", sorted(REFUSED))
def test_each_refused_field_is_a_400_naming_it(client, lone_engine, field):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=lone_engine.model,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=2,
            **{field: REFUSED[field]},
        )
    assert e.value.status_code == 400
    assert e.value.body["param"] == field, e.value.body


def test_unknown_fields_and_bad_grammars_are_400s(client, lone_engine):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=lone_engine.model, messages=[{"role": "user", "content": "hi"}], extra_body={"mirostat": 2}
        )
    assert e.value.body["param"] == "mirostat"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=lone_engine.model,
            messages=[{"role": "user", "content": "hi"}],
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer", "minimum": 5, "maximum": 1}}},
        )
    assert e.value.body["param"] == "response_format"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=lone_engine.model, prompt="x", extra_body={"structured_outputs": {"regex": "(("}})
    assert e.value.body["param"] == "structured_outputs"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=lone_engine.model,
            messages=[{"role": "user", "content": "hi"}],
            tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "frobnicate"}}}}}],
        )
    assert e.value.body["param"] == "tools"
    # The engine is unaffected.
    r = client.chat.completions.create(model=lone_engine.model, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert r.usage.completion_tokens >= 1


def test_tokenize_counts_what_chat_prompts_hold(client, lone_engine):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    code, t = http_json("POST", lone_engine.base + "/tokenize", {"messages": messages})
    assert code == 200, t
    r = client.chat.completions.create(model=lone_engine.model, messages=messages, max_tokens=1)
    assert t["count"] == r.usage.prompt_tokens == len(t["tokens"])
    assert t["max_model_len"] == 2048
    code, d = http_json("POST", lone_engine.base + "/detokenize", {"tokens": t["tokens"]})
    assert code == 200 and "capital of France" in d["prompt"] and d["content"] == d["prompt"]
    code, p = http_json("POST", lone_engine.base + "/tokenize", {"content": "Hello world", "with_pieces": True})
    assert "".join(x["piece"] for x in p["tokens"]) == "Hello world"


def test_the_sidecar_records_each_choices_legs(engine, sidecar):
    c = openai.OpenAI(base_url=engine.base + "/v1", api_key="unused", max_retries=0, timeout=300)
    r = c.chat.completions.create(
        model=engine.model,
        messages=[{"role": "user", "content": "Tell me about owls."}],
        max_tokens=6,
        n=3,
        extra_body={"ignore_eos": True},
    )
    turn = sidecar.wait_turn(r.id)
    assert sorted({leg["choice"] for leg in turn["legs"]}) == [0, 1, 2]
    assert turn["completion_tokens"] == r.usage.completion_tokens == 18
    assert turn["legs_complete"]
