"""Sliding-window sessions across the processes (issue 39, items 2 and 8): Gemma 3 270M (local
layers of a 512-position window), two sessions at once whose replies are longer than the
window, then other traffic long enough to recycle every window block not kept apart, then
each session's next turn resending its reply cut short (a client that trimmed it: the text no
longer matches what was generated, so the departure is late in the reply).

With checkpoints of the window inside replies (`--window-checkpoint-every 512`), each next turn
resumes up to its departure (`diverged`, every reachable token cached); with none
(`--window-checkpoint-every 0`), the same turns find the full-attention KV all there and the
window's gone after the prompt's checkpoint (`window`, resumed from the prompt's end only).
The same tokens come back either way (greedy)."""

from __future__ import annotations

import threading

import pytest

from procs import EngineProcess, http_json, require_gemma

REPLY = 900
BLOCK = 16


def _post(e: EngineProcess, path: str, body: dict, session: str | None = None) -> dict:
    """POSTs `body`, checked to be answered 200 (two long replies at once take minutes)."""
    headers = {"x-session-id": session} if session else {}
    status, r = http_json("POST", e.base + path, body, headers, timeout=900)
    assert status == 200, r
    return r


def _turns(extra: list[str]) -> list[dict]:
    gemma = require_gemma()
    e = EngineProcess("--batch", "2", "--session-windows", "4", *extra, ctx_size=8192, model=gemma)
    try:
        firsts: dict[int, dict] = {}

        def first(i: int):
            msgs = [{"role": "user", "content": f"Session {i}: write a long story about a lighthouse keeper."}]
            r = _post(e, "/v1/chat/completions", {
                "messages": msgs, "max_tokens": REPLY, "ignore_eos": True, "temperature": 0,
            }, f"window-{i}")
            firsts[i] = {"messages": msgs, "reply": r}

        threads = [threading.Thread(target=first, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(firsts) == [0, 1], "both first turns answered"
        # Other traffic: 3,000-odd prompt tokens, more than the window pool holds apart from
        # what is kept for the sessions.
        filler = " ".join(f"item{n}" for n in range(1500))
        _post(e, "/v1/completions", {"prompt": filler, "max_tokens": 1})
        out = []
        for i in range(2):
            f = firsts[i]
            text = f["reply"]["choices"][0]["message"]["content"]
            assert f["reply"]["usage"]["completion_tokens"] == REPLY
            cut = text[: len(text) * 9 // 10]
            msgs = f["messages"] + [
                {"role": "assistant", "content": cut},
                {"role": "user", "content": "Go on."},
            ]
            r = _post(e, "/v1/chat/completions", {"messages": msgs, "max_tokens": 8, "temperature": 0},
                      f"window-{i}")
            out.append({"first": f["reply"]["usage"], "next": r})
        return out
    finally:
        e.close()


def test_a_gemma_session_with_replies_longer_than_the_window_resumes_from_a_checkpoint():
    with_checkpoints = _turns(["--window-checkpoint-every", "512"])
    without = _turns(["--window-checkpoint-every", "0"])
    for kept, lost in zip(with_checkpoints, without):
        first_prompt = kept["first"]["prompt_tokens"]
        u = kept["next"]["usage"]
        diverged_at = u["diverged_at"]
        # The cut text departs late in the reply (past its first checkpoint, 512 positions in).
        assert first_prompt + 512 < diverged_at < first_prompt + REPLY, u
        reachable = diverged_at // BLOCK * BLOCK
        # Kept apart: the checkpoint 512 positions into the reply and the reply's last window
        # together cover the window before the departure: everything reachable is resumed.
        assert (u["resume"], u["prompt_tokens_details"]["cached_tokens"]) == ("diverged", reachable), u
        # Without checkpoints the window's blocks past the prompt's end were recycled: `window`,
        # resumed from the prompt's checkpoint at most.
        v = lost["next"]["usage"]
        assert v["diverged_at"] == diverged_at, (u, v)
        assert v["resume"] == "window", v
        assert v["prompt_tokens_details"]["cached_tokens"] <= first_prompt, v
        assert v["evicted_tokens"] == reachable - v["prompt_tokens_details"]["cached_tokens"], v
        assert kept["next"]["choices"][0]["message"]["content"] == lost["next"]["choices"][0]["message"]["content"]


if __name__ == "__main__":
    pytest.main([__file__, "-v"])
