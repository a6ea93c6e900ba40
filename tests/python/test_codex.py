"""Codex CLI, as installed from npm, against the engine's Responses API: `codex exec --json`,
then `codex exec resume --last`, on Gemma 3 270M with a 32k context (Codex's prompt does not
fit the default model's). Each turn succeeds, and the second shows the first as cached input in
Codex's own usage; an answer longer than chat completions' default limit (256 tokens)
completes, as Codex sends no `max_output_tokens`.

Gemma 3 270M is a base model whose template has no tool support, and a model never trained
on tools, offered Codex's, calls them until its token limit. The engine runs with
`--generic-tools off` (the tools are left out of its prompt, and listed as skipped), Codex with
its optional tools off and `--output-schema` (its final answer held to a JSON schema), so each
turn ends with an answer: what is tested is the protocol, not the model."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from procs import EngineProcess, agent_cli, require_gemma

MODEL_NAME = "gemma-local"
# The engine's `--api-key`, which Codex sends from the environment variable its provider's
# `env_key` names (the README's block).
API_KEY = "codex-test-key"
# Codex's optional tools, off: what is left is a tool the engine skips for this model.
DISABLED = [
    "shell_tool", "unified_exec", "goals", "multi_agent", "view_image", "apps", "plugins",
    "image_generation", "skill_search", "tool_suggest", "sleep_tool", "browser_use",
    "computer_use", "in_app_browser",
]
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["hello"]}},
    "required": ["answer"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def engine():
    gemma = require_gemma()
    e = EngineProcess(
        "--batch", "2", "--served-model-name", MODEL_NAME, "--generic-tools", "off",
        "--max-tokens-limit", "1024", "--default-max-tokens", "64",
        ctx_size=32768, model=gemma, api_key=API_KEY,
    )
    yield e
    e.close()


def codex(home: Path, work: Path, *args: str) -> list[dict]:
    """Runs `codex exec` with `args` in `work`, with its config in `home`; its JSON events."""
    cmd = [str(agent_cli("codex")), "exec"]
    for f in DISABLED:
        cmd += ["--disable", f]
    cmd += ["-c", 'web_search="disabled"', "--output-schema", str(home / "schema.json"),
            "--json", "--skip-git-repo-check", *args]
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    env.update(CODEX_HOME=str(home), HOME=str(home), SLOTLIGHT_API_KEY=API_KEY)
    p = subprocess.run(cmd, cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                       text=True, timeout=1200)
    events = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert events, f"codex printed no events (rc {p.returncode}):\n{p.stderr[-3000:]}"
    return events


def setup_codex(engine: EngineProcess, tmp_path: Path, schema: dict) -> tuple[Path, Path]:
    """Codex's home (its config: the README's block, and the answer's schema) and a work
    folder."""
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (home / "schema.json").write_text(json.dumps(schema))
    # The README's block: a provider of its own, on the Responses API.
    (home / "config.toml").write_text(
        f'model = "{MODEL_NAME}"\n'
        'model_provider = "slotlight"\n\n'
        "[model_providers.slotlight]\n"
        'name = "slotlight"\n'
        f'base_url = "{engine.base}/v1"\n'
        'wire_api = "responses"\n'
        'env_key = "SLOTLIGHT_API_KEY"\n'
    )
    return home, work


def test_codex_runs_two_turns_and_the_second_reuses_the_first(engine, tmp_path):
    home, work = setup_codex(engine, tmp_path, SCHEMA)
    first = codex(home, work, "Say hello.")
    done = [e for e in first if e["type"] == "turn.completed"]
    assert done, first
    assert not [e for e in first if e["type"] in ("turn.failed", "error")], first
    messages = [e["item"] for e in first
                if e["type"] == "item.completed" and e["item"]["type"] == "agent_message"]
    assert messages and json.loads(messages[-1]["text"]) == {"answer": "hello"}
    u1 = done[-1]["usage"]
    assert u1["input_tokens"] > 2000, u1  # Codex's whole prompt reached the engine

    second = codex(home, work, "resume", "--last", "Say hello again.")
    done2 = [e for e in second if e["type"] == "turn.completed"]
    assert done2 and not [e for e in second if e["type"] in ("turn.failed", "error")], second
    u2 = done2[-1]["usage"]
    # Codex reports the thread's usage so far: the second turn's prompt resent the first
    # turn whole (`store: false`), and the engine served it from the KV cache.
    assert u2["cached_input_tokens"] >= u1["input_tokens"] - 32, (u1, u2)
    assert u2["input_tokens"] > u1["input_tokens"]


def test_codex_long_answers_complete(engine, tmp_path):
    # Codex sends no `max_output_tokens`: its answer may run to the end of the context
    # (bounded by the engine's `--max-tokens-limit`), not to chat completions' default of
    # 256 tokens, at which Codex would end the turn as incomplete. The schema holds the answer
    # to one text of about 400 tokens.
    long = " ".join(f"step {n} done." for n in range(100))
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string", "enum": [long]}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    home, work = setup_codex(engine, tmp_path, schema)
    events = codex(home, work, "Count the steps.")
    assert not [e for e in events if e["type"] in ("turn.failed", "error")], events
    done = [e for e in events if e["type"] == "turn.completed"]
    assert done, events
    messages = [e["item"] for e in events
                if e["type"] == "item.completed" and e["item"]["type"] == "agent_message"]
    assert messages and json.loads(messages[-1]["text"]) == {"answer": long}
    assert done[-1]["usage"]["output_tokens"] > 256, done[-1]["usage"]
