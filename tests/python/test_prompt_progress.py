"""Prefill progress (llama.cpp's `return_progress`): a streamed request that asks for it gets one
`prompt_progress {total, cache, processed, time_ms}` chunk per prefill chunk before its first
token, with no choices (so OpenAI's own client still reads the stream); without the flag no such
chunk is sent; a non-boolean `return_progress` is a 400 in the API's error format."""

from __future__ import annotations

import json

import pytest

from procs import EngineProcess, post_stream, require_model

CHUNK = 32


@pytest.fixture(scope="module")
def chunked_engine():
    require_model()
    e = EngineProcess("--batch", "2", "--prefill-chunk", str(CHUNK))
    yield e
    e.close()


def _stream(base: str, body: dict) -> list[dict]:
    conn, r = post_stream(base, body)
    try:
        chunks = []
        for line in r.read().decode().splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[len("data: "):]))
        return chunks
    finally:
        conn.close()


def _body(words: int, tag: str = "word", **extra) -> dict:
    # Each test its own `tag`: a prompt another test sent is in the prefix cache, and its
    # prefill computes only the last chunk.
    text = " ".join(f"{tag}{i}" for i in range(words))
    return {"stream": True, "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "user", "content": f"Repeat: {text}"}], **extra}


def test_a_long_prefill_streams_one_progress_chunk_per_prefill_chunk(chunked_engine):
    chunks = _stream(chunked_engine.base, _body(60, return_progress=True,
                                                stream_options={"include_usage": True}))
    progress = [c for c in chunks if c.get("prompt_progress")]
    usage = next(c["usage"] for c in chunks if c.get("usage"))
    assert len(progress) >= 2, "a prompt of several chunks"
    for c in progress:
        assert c["choices"] == [], "progress chunks carry no choice"
        assert set(c["prompt_progress"]) == {"total", "cache", "processed", "time_ms"}
    p = [c["prompt_progress"] for c in progress]
    total = p[0]["total"]
    assert all(x["total"] == total for x in p)
    assert total >= usage["prompt_tokens"]
    done = [x["processed"] for x in p]
    assert done == sorted(done) and len(set(done)) == len(done), done
    assert done[-1] == total
    # Each chunk computes at most CHUNK positions.
    steps = [b - a for a, b in zip([p[0]["cache"], *done], done)]
    assert all(0 < s <= CHUNK for s in steps), steps
    times = [x["time_ms"] for x in p]
    assert times == sorted(times)
    # The progress comes before the first token.
    first_token = next(i for i, c in enumerate(chunks) if any(ch.get("delta", {}).get("content") for ch in c.get("choices", [])))
    assert max(i for i, c in enumerate(chunks) if c.get("prompt_progress")) < first_token


def test_without_the_flag_no_progress_chunk_is_sent(chunked_engine):
    chunks = _stream(chunked_engine.base, _body(60, "plain"))
    assert chunks and not any(c.get("prompt_progress") for c in chunks)


def test_a_non_boolean_return_progress_is_a_400(chunked_engine):
    status, body = chunked_engine.post("/v1/chat/completions", _body(3, return_progress="yes"))
    assert status == 400, body
    assert body["error"]["message"], body


def test_the_openai_client_reads_a_stream_with_progress(chunked_engine):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=chunked_engine.base + "/v1", api_key="x")
    stream = client.chat.completions.create(
        model=chunked_engine.model, stream=True, max_tokens=4, temperature=0,
        messages=_body(60, "client")["messages"], extra_body={"return_progress": True})
    text, progress = "", 0
    for chunk in stream:
        progress += bool(getattr(chunk, "prompt_progress", None) or (chunk.model_extra or {}).get("prompt_progress"))
        for ch in chunk.choices:
            text += ch.delta.content or ""
    assert progress >= 2 and text
