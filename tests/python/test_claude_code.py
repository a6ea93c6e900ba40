"""Claude Code (the npm release pinned in tests/agents, installed by `npm ci --prefix
tests/agents`) against the engine's Messages API, two turns of one session: `claude -p ...
--output-format json`, then `--resume <session_id>`. Its prompt (a system prompt of text blocks,
12 tools, a `system` message inside `messages`) is about 13k tokens, so the engine serves
Gemma 3 270M with a 32k context; Claude Code asks `max_tokens: 32000`, which the engine clamps
to `--max-tokens-limit 64` (said on the span) so a base model's reply stays bounded.

Judged by the protocol, not by the base model's answers: every request Claude Code sends is
accepted and served (no refusal, every request `ok`), each turn ends as Claude Code's own
`success` with its JSON result, and the second turn reads the first turn's tokens back from the
cache (Claude Code's own `usage.cache_read_input_tokens`, and the engine's `resume`: every
request after the first that extends the conversation, its tool turns included, is `full`,
the replies it resends being prompted as the engine's own tokens). A base
model cut at 64 tokens rarely ends its turn: Claude Code then reports the cut
(`api_error: max_output_tokens`) after its own retries, which is the protocol working as
Anthropic's API documents `stop_reason: "max_tokens"`. Claude Code samples, so the run is
bounded rather than seeded: at most `MAX_TURNS` agent-loop turns per `claude -p`, and no
sub-agents (`--disallowedTools Agent`: each would be a cold conversation of its own)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from procs import EngineProcess, agent_cli, require_gemma

# A fresh 13k-token prompt prefills in minutes on two CPU cores.
TURN_TIMEOUT = 1800
# The most agent-loop turns of one `claude -p` (each one request to the engine).
MAX_TURNS = 4


@pytest.fixture(scope="module")
def gemma_engine():
    agent_cli("claude")
    gemma = require_gemma()
    e = EngineProcess(
        "--batch", "2", "--max-tokens-limit", "64", "--default-max-tokens", "64",
        ctx_size=32768, model=gemma,
    )
    yield e
    e.close()


def _claude(engine: EngineProcess, home: Path, work: Path, *args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_"))}
    env.update(
        HOME=str(home),
        ANTHROPIC_BASE_URL=engine.base,
        ANTHROPIC_AUTH_TOKEN="none",
        ANTHROPIC_MODEL=engine.model,
        ANTHROPIC_DEFAULT_HAIKU_MODEL=engine.model,
        DISABLE_TELEMETRY="1",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
    )
    # A sampled base model may call Claude Code's tools turn after turn until the context is
    # full; its agent loop is bounded here (Claude Code's own `--max-turns`), and it may not
    # start sub-agents (the `Agent` tool): each is a conversation of its own, a cold prompt of
    # 9k to 16k tokens that two cores prefill in about a minute, so a sampled run that starts
    # several outlasts the test's budget. The session under test is the main conversation.
    r = subprocess.run(
        [str(agent_cli("claude")), *args, "--max-turns", str(MAX_TURNS),
         "--disallowedTools", "Agent", "--output-format", "json"],
        cwd=work, env=env, capture_output=True, text=True, timeout=TURN_TIMEOUT, stdin=subprocess.DEVNULL,
    )
    context = f"exit {r.returncode}\nstdout: {r.stdout[-2000:]}\nstderr: {r.stderr[-2000:]}"
    out = json.loads(r.stdout)
    assert out["type"] == "result" and out["subtype"] in ("success", "error_max_turns"), context
    if out["subtype"] == "error_max_turns":
        # The loop reached its bound: every request of it was still served (asserted by the
        # caller from the engine's log).
        return out
    if out.get("is_error"):
        # The only error a base model cut at 64 tokens may cause: Claude Code's own report of
        # `stop_reason: "max_tokens"` after its retries (it then exits 1). An API failure
        # (a refusal, a malformed response or stream) would read otherwise.
        assert out.get("api_error") == "max_output_tokens" and out.get("api_error_status") is None, context
        assert r.returncode == 1, context
    else:
        assert r.returncode == 0, context
    return out


def _finished(engine: EngineProcess) -> list[dict]:
    """The engine's `Request.Finished` lines, as dicts of their fields."""
    rows = []
    for line in list(engine.log):
        if "Request.Finished" not in line:
            continue
        fields = dict(re.findall(r'(\w+)=("[^"]*"|\S+)', line.split("Request.Finished", 1)[1]))
        rows.append({k: v.strip('"') for k, v in fields.items()})
    return rows


def test_two_turns_of_claude_code(gemma_engine, tmp_path):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    first = _claude(gemma_engine, home, work, "-p", "Say hello in one word.")
    session = first["session_id"]
    served_first = _finished(gemma_engine)
    assert served_first, "Claude Code's first turn reached the engine"
    second = _claude(gemma_engine, home, work, "-p", "Now say goodbye in one word.", "--resume", session)
    assert second["session_id"] == session
    # Claude Code's own usage: the second turn read the first turn's tokens from the cache.
    assert second["usage"]["cache_read_input_tokens"] > 0, second["usage"]
    served = _finished(gemma_engine)
    assert not any("Request.Refused" in line for line in gemma_engine.log), [
        line for line in gemma_engine.log if "Request.Refused" in line
    ]
    assert all(r["api"] == "messages" and r["status"] == "ok" for r in served), served
    # Every request of the session (Claude Code's `metadata.user_id`) is the session's turn.
    assert {r.get("session_id") for r in served} == {session}, served
    # The second turn's first request resumed the first turn's KV: the first turn's prompt,
    # and more, read back rather than computed.
    opening = served_first[0]
    resumed = served[len(served_first)]
    assert int(resumed["cached_tokens"]) >= int(opening["prompt_tokens"]), (opening, resumed)
    # Every later request of the main conversation (its tool turns, and the resumed
    # session's first) resends the replies the engine generated, `tool_use` blocks included:
    # they are prompted as the generated ids, so each resumes `full` (issue 39, item 1).
    main = [r for r in served[1:] if r.get("side_call") != "true"]
    assert main, served
    assert all(r["resume"] == "full" for r in main), [
        {k: r.get(k) for k in ("request_id", "resume", "prompt_tokens", "cached_tokens", "diverged_at")}
        for r in served
    ]
