"""The official `openai` SDK against a running engine: chat, streaming with usage, completions,
and errors in OpenAI's format."""

from __future__ import annotations

import openai
import pytest

TIMING_FIELDS = ["queue_ms", "prefill_ms", "ttft_ms", "decode_ms", "generation_ms", "decode_tps", "e2e_ms"]


@pytest.fixture(scope="module")
def client(lone_engine):
    return openai.OpenAI(base_url=lone_engine.base + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_chat(client, lone_engine):
    r = client.chat.completions.create(
        model=lone_engine.model,
        # A question the default model answers the same way with 8-bit activations as in
        # float32 ("What is the capital of France?" sits on a near tie at its first token:
        # this engine and llama.cpp both answer it with "L'Étoile, ...").
        messages=[{"role": "user", "content": "Name the capital of France."}],
        max_tokens=20,
        temperature=0,
    )
    assert "Paris" in r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")
    u = r.usage
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    extra = u.model_extra
    for f in TIMING_FIELDS:
        assert f in extra, f
    assert extra["ttft_ms"] <= extra["e2e_ms"]


def test_stream_with_usage(client, lone_engine):
    stream = client.chat.completions.create(
        model=lone_engine.model,
        messages=[{"role": "user", "content": "Count from one to five."}],
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None and last.usage.completion_tokens > 0
    extra = last.usage.model_extra
    for f in TIMING_FIELDS:
        assert f in extra, f
    assert extra["decode_ms"] > 0
    assert abs(extra["decode_tps"] - (last.usage.completion_tokens - 1) / (extra["decode_ms"] / 1000)) < 1e-6 * extra["decode_tps"]


def test_completion(client, lone_engine):
    r = client.completions.create(model=lone_engine.model, prompt="The sky is", max_tokens=8, temperature=0)
    assert isinstance(r.choices[0].text, str) and r.choices[0].text
    assert r.usage.completion_tokens >= 1
    assert "ttft_ms" in r.usage.model_extra


def test_errors(client, lone_engine):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=lone_engine.model, messages=[], max_tokens=5)
    assert e.value.status_code == 400
    assert "messages" in str(e.value)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=lone_engine.model, messages=[{"role": "user", "content": "x"}], max_tokens=1_000_000
        )
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=lone_engine.model, messages=[{"role": "user", "content": "x"}], n=99)
    assert e.value.body["param"] == "n"
    # The server is still fine.
    r = client.chat.completions.create(model=lone_engine.model, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert r.usage.completion_tokens >= 1


def test_binds_loopback_by_default_and_says_so(lone_engine):
    line = next(l for l in lone_engine.log if "listening on" in l)
    assert "listening on http://127.0.0.1:" in line, line
    assert "(loopback only)" in line, line
