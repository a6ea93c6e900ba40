"""End to end in Arize Phoenix: the engine exports OTLP/HTTP to a real Phoenix server, directly
and through the sidecar's `--forward-otlp`, and Phoenix's REST API
(`GET /v1/projects/default/spans`) shows what a user of Phoenix sees:

- the request span is an LLM span with the model, the token counts and the invocation
  parameters (Phoenix maps the GenAI `gen_ai.*` attributes to OpenInference ones on ingest);
- with `--trace-content` its input messages hold the system prompt and the user's text, and
  its output the reply; a forced tool call shows as a tool call with its function's name;
- without the flag there is no content at all, under any key;
- the child spans come in time order: the queue, then the leg (from admission) with the prefill
  inside it, and the decode windows after the prefill, one after another, inside the leg;
- a refused request is an error span with its `error.type`;
- a three-turn session (one `x-session-id`) is one session of three traces in Phoenix's
  sessions view (`GET /v1/sessions/{session_id}`: its request spans carry `session.id`), with
  the turns' token counts;
- a headless-Chromium screenshot of the trace page is saved with the test output
  ($SLOTLIGHT_TEST_OUTPUT, else pytest's temporary directory; the path is printed).

Phoenix (PyPI `arize-phoenix`, tests/python/requirements.txt) starts once for the module on
loopback ports with its working directory in a temporary folder, and is stopped by its PID.
Without Phoenix (or Chromium, for the screenshot) the tests skip, or fail under
SLOTLIGHT_REQUIRE_TOOLS=1.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from datetime import datetime
from pathlib import Path

import pytest

from procs import EngineProcess, SidecarProcess, require_model, stop_process
from sidecar_support import ATTR, SPAN

REQUIRE_TOOLS = os.environ.get("SLOTLIGHT_REQUIRE_TOOLS") == "1"
# Phoenix runs its database migrations on start: about a minute on a small machine.
START_DEADLINE_S = 300
# Spans reach Phoenix after the engine's export interval and Phoenix's own ingest queue.
SPAN_DEADLINE_S = 60

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 20}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
]


def missing(what: str):
    if REQUIRE_TOOLS:
        pytest.fail(f"{what} (SLOTLIGHT_REQUIRE_TOOLS=1)")
    pytest.skip(what)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Phoenix runs in an environment of its own: it pins the Anthropic SDK below the version the
# Messages API tests use.
PHOENIX_PYTHON = Path(
    os.environ.get("SLOTLIGHT_PHOENIX_PYTHON")
    or Path(__file__).resolve().parents[2] / ".venv-phoenix" / "bin" / "python"
)


class Phoenix:
    """`phoenix serve` on free loopback ports, its working directory in `workdir`."""

    def __init__(self, workdir: Path):
        self.port, grpc = _free_port(), _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "phoenix.log"
        env = dict(
            os.environ,
            PHOENIX_WORKING_DIR=str(workdir),
            PHOENIX_PORT=str(self.port),
            PHOENIX_GRPC_PORT=str(grpc),
            PHOENIX_HOST="127.0.0.1",
            PHOENIX_TELEMETRY_ENABLED="false",
        )
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [str(PHOENIX_PYTHON), "-m", "phoenix.server.main", "serve"],
            cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + START_DEADLINE_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"phoenix exited ({self.proc.returncode}):\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.base + "/healthz", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"phoenix not healthy after {START_DEADLINE_S} s:\n{self.log_tail()}")
            time.sleep(1)

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    @property
    def otlp(self) -> str:
        return self.base

    def get(self, path: str, **query):
        url = self.base + path + ("?" + urllib.parse.urlencode(query, doseq=True) if query else "")
        with urllib.request.urlopen(url, timeout=30) as r:
            return json.loads(r.read())

    def spans(self, **query) -> list[dict]:
        """Every span of the default project matching `query`, all pages."""
        out, cursor = [], None
        while True:
            q = dict(query, limit=1000, **({"cursor": cursor} if cursor else {}))
            page = self.get("/v1/projects/default/spans", **q)
            out += page["data"]
            cursor = page.get("next_cursor")
            if not cursor:
                return out

    def close(self):
        stop_process(self.proc)
        self._log.close()


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory):
    found = PHOENIX_PYTHON.exists() and subprocess.run(
        [str(PHOENIX_PYTHON), "-c", "import phoenix.server.main"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    ).returncode == 0
    if not found:
        missing(
            f"arize-phoenix is not installed in {PHOENIX_PYTHON} "
            "(scripts/test.sh installs tests/python/requirements-phoenix.txt into .venv-phoenix)"
        )
    p = Phoenix(tmp_path_factory.mktemp("phoenix"))
    yield p
    p.close()


def _engine(phoenix: Phoenix, *extra: str) -> EngineProcess:
    return EngineProcess(
        "--batch", "4", "--progress-interval-ms", "50", *extra, otlp=phoenix.otlp, protocol="http/protobuf"
    )


@pytest.fixture(scope="module")
def content_engine(phoenix):
    require_model()
    e = _engine(phoenix, "--trace-content")
    yield e
    e.close()


@pytest.fixture(scope="module")
def plain_engine(phoenix):
    require_model()
    e = _engine(phoenix)
    yield e
    e.close()


@pytest.fixture(scope="module")
def forwarded_engine(phoenix):
    """An engine exporting OTLP/gRPC to a sidecar that forwards everything to Phoenix."""
    require_model()
    s = SidecarProcess("--forward-otlp", phoenix.otlp)
    e = EngineProcess("--batch", "4", "--trace-content", otlp=f"http://{s.grpc}")
    yield e
    e.close()
    s.close()


# --- helpers -------------------------------------------------------------------------------


def chat(engine: EngineProcess, body: dict) -> tuple[str, int, dict]:
    """Posts a chat completion under a fresh session id: (session, status, body)."""
    session = f"phoenix-{uuid.uuid4().hex[:12]}"
    code, r = engine.post("/v1/chat/completions", {"model": engine.model, **body}, headers={"x-session-id": session})
    return session, code, r


def request_trace(phoenix: Phoenix, session: str, want: set[str] = frozenset()) -> tuple[dict, list[dict]]:
    """The request span of `session` and every span of its trace, once the trace holds a span
    of each name in `want` (besides the request span)."""
    key = ATTR["GEN_AI_CONVERSATION_ID"]
    deadline = time.monotonic() + SPAN_DEADLINE_S
    while True:
        roots = [s for s in phoenix.spans(attribute=f"{key}:{session}") if s["parent_id"] is None]
        if roots:
            trace = phoenix.spans(trace_id=roots[0]["context"]["trace_id"])
            if want <= {s["name"] for s in trace}:
                return roots[0], trace
        if time.monotonic() > deadline:
            raise AssertionError(f"Phoenix never showed the trace of session {session} with {sorted(want)}")
        time.sleep(0.5)


def indexed(attrs: dict, prefix: str) -> dict[int, dict[str, object]]:
    """Flattened `prefix.N.rest` keys, grouped by N: {N: {rest: value}}."""
    out: dict[int, dict[str, object]] = {}
    for k, v in attrs.items():
        if k.startswith(prefix + "."):
            n, _, rest = k[len(prefix) + 1:].partition(".")
            if n.isdigit():
                out.setdefault(int(n), {})[rest] = v
    return out


def invocation_parameters(attrs: dict) -> dict:
    """`llm.invocation_parameters`, stored by Phoenix as a JSON text or as flattened keys."""
    raw = attrs.get("llm.invocation_parameters")
    if isinstance(raw, str):
        return json.loads(raw)
    prefix = "llm.invocation_parameters."
    return {k[len(prefix):]: v for k, v in attrs.items() if k.startswith(prefix)}


def t(s: str) -> datetime:
    return datetime.fromisoformat(s.replace("Z", "+00:00"))


# --- tests ---------------------------------------------------------------------------------


def test_the_request_is_an_llm_span_with_model_tokens_and_parameters(phoenix, content_engine):
    session, code, r = chat(content_engine, {
        "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 12, "temperature": 0, "seed": 7,
    })
    assert code == 200, r
    root, _ = request_trace(phoenix, session)
    a = root["attributes"]
    assert root["span_kind"] == "LLM", root
    assert root["status_code"] != "ERROR", root
    assert a["llm.model_name"] == content_engine.model
    assert a["llm.token_count.prompt"] == r["usage"]["prompt_tokens"]
    assert a["llm.token_count.completion"] == r["usage"]["completion_tokens"]
    assert a["llm.token_count.total"] == r["usage"]["total_tokens"]
    params = invocation_parameters(a)
    assert params.get("max_tokens") == 12, params
    assert params.get("temperature") == 0, params
    assert params.get("seed") == 7, params


def test_with_trace_content_phoenix_shows_the_messages_and_the_reply(phoenix, content_engine):
    question = "Name one colour of the sky, in one word."
    session, code, r = chat(content_engine, {
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": question}],
        "max_tokens": 10, "temperature": 0,
    })
    assert code == 200, r
    root, _ = request_trace(phoenix, session)
    inputs = indexed(root["attributes"], "llm.input_messages")
    assert [m.get("message.role") for _, m in sorted(inputs.items())] == ["system", "user"], inputs
    assert inputs[0]["message.content"] == "Be brief."
    assert inputs[1]["message.content"] == question
    outputs = indexed(root["attributes"], "llm.output_messages")
    assert outputs[0]["message.role"] == "assistant", outputs
    assert outputs[0]["message.content"] == r["choices"][0]["message"]["content"], outputs


def test_a_tool_call_shows_as_a_tool_call(phoenix, content_engine):
    session, code, r = chat(content_engine, {
        "messages": [{"role": "user", "content": "What is the weather in Oslo?"}],
        "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "max_tokens": 60, "temperature": 0,
    })
    assert code == 200, r
    call = r["choices"][0]["message"]["tool_calls"][0]
    root, _ = request_trace(phoenix, session)
    a = root["attributes"]
    out = indexed(a, "llm.output_messages")[0]
    assert out["message.role"] == "assistant", out
    calls = indexed({k[len("message."):]: v for k, v in out.items() if k.startswith("message.")}, "tool_calls")
    assert calls, f"no tool call in the output message: {out}"
    assert calls[0]["tool_call.function.name"] == "get_weather", calls
    assert calls[0]["tool_call.id"] == call["id"], calls
    assert json.loads(calls[0]["tool_call.function.arguments"]) == json.loads(call["function"]["arguments"])
    # The definitions show too, as the tools the model was offered.
    tools = indexed(a, "llm.tools")
    assert tools and "get_weather" in json.dumps(tools), a


def test_without_trace_content_there_is_no_content_at_all(phoenix, plain_engine):
    secret = f"zebra-{uuid.uuid4().hex[:8]} says hi"
    session, code, r = chat(plain_engine, {
        "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": secret}],
        "tools": TOOLS, "max_tokens": 8, "temperature": 0,
    })
    assert code == 200, r
    root, trace = request_trace(phoenix, session, {SPAN["LEG"]})
    assert root["span_kind"] == "LLM"
    assert root["attributes"]["llm.model_name"] == plain_engine.model
    reply = r["choices"][0]["message"].get("content") or ""
    # (Phoenix synthesizes `output.value` from the response id and model: no content, so the
    # text checks below cover it.)
    content_keys = ("input_messages", "output_messages", "input.value", "llm.tools",
                    "system_instructions", "tool.definitions", "gen_ai.input", "gen_ai.output")
    for s in trace:
        text = json.dumps(s)
        assert secret not in text and "You are terse." not in text, s["name"]
        assert not (len(reply.strip()) >= 8 and reply.strip() in text), f"the reply is in {s['name']}"
        keys = [k for k in s["attributes"] if any(c in k for c in content_keys)]
        assert not keys, f"{s['name']}: {keys}"


def test_child_spans_are_in_time_order(phoenix, content_engine):
    session, code, r = chat(content_engine, {
        "messages": [{"role": "user", "content": "Count from one to twenty in words."}],
        "max_tokens": 40, "temperature": 0,
    })
    assert code == 200, r
    root, trace = request_trace(phoenix, session, {SPAN["QUEUE"], SPAN["PREFILL"], SPAN["LEG"], SPAN["DECODE"]})
    rid = root["context"]["span_id"]
    children = sorted((s for s in trace if s["parent_id"] == rid), key=lambda s: t(s["start_time"]))
    first = {}
    for c in children:
        first.setdefault(c["name"], c)
    assert {SPAN["QUEUE"], SPAN["PREFILL"], SPAN["LEG"]} <= set(first), [c["name"] for c in children]
    queue, prefill, leg = first[SPAN["QUEUE"]], first[SPAN["PREFILL"]], first[SPAN["LEG"]]
    assert children[0] is queue, [c["name"] for c in children]
    for c in children:
        assert t(root["start_time"]) <= t(c["start_time"]) <= t(c["end_time"]) <= t(root["end_time"]), c["name"]
    # The queue ends at admission, where the leg starts; the prefill runs inside the leg, and
    # the decode windows follow the prefill, one after another, inside the leg.
    assert t(queue["end_time"]) <= t(leg["start_time"]) <= t(prefill["start_time"]), (queue, leg, prefill)
    assert t(prefill["end_time"]) <= t(leg["end_time"]), (prefill, leg)
    windows = sorted(
        (s for s in trace if s["name"] == SPAN["DECODE"] and s["parent_id"] == leg["context"]["span_id"]),
        key=lambda s: t(s["start_time"]),
    )
    assert windows, "no decode window under the leg"
    assert t(prefill["end_time"]) <= t(windows[0]["start_time"]), (prefill, windows[0])
    for w in windows:
        assert t(leg["start_time"]) <= t(w["start_time"]) <= t(w["end_time"]) <= t(leg["end_time"]), w
    for a, b in zip(windows, windows[1:]):
        assert t(a["end_time"]) <= t(b["start_time"]), (a, b)


def test_a_refused_request_is_an_error_span_with_its_error_type(phoenix, content_engine):
    session = f"phoenix-{uuid.uuid4().hex[:12]}"
    code, r = content_engine.post(
        "/v1/chat/completions",
        {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        headers={"x-session-id": session},
    )
    assert code == 404, r
    root, _ = request_trace(phoenix, session)
    assert root["status_code"] == "ERROR", root
    assert root["attributes"][ATTR["ERROR_TYPE"]] == "not_found", root["attributes"]
    assert root["attributes"][ATTR["REQUEST_STATUS"]] == "refused"


def test_through_the_sidecar_forward_otlp(phoenix, forwarded_engine):
    question = "Say yes."
    session, code, r = chat(forwarded_engine, {"messages": [{"role": "user", "content": question}], "max_tokens": 6})
    assert code == 200, r
    root, trace = request_trace(phoenix, session, {SPAN["QUEUE"], SPAN["PREFILL"], SPAN["LEG"]})
    a = root["attributes"]
    assert root["span_kind"] == "LLM"
    assert a["llm.model_name"] == forwarded_engine.model
    assert a["llm.token_count.completion"] == r["usage"]["completion_tokens"]
    assert indexed(a, "llm.input_messages")[0]["message.content"] == question


def test_a_screenshot_of_the_trace_page(phoenix, content_engine, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if not browser:
        missing("chromium is not installed (Debian package `chromium`)")
    session, code, r = chat(content_engine, {
        "messages": [{"role": "system", "content": "Answer in one short sentence."},
                     {"role": "user", "content": "What is a KV cache?"}],
        "max_tokens": 40, "temperature": 0,
    })
    assert code == 200, r
    root, _ = request_trace(phoenix, session, {SPAN["QUEUE"], SPAN["PREFILL"], SPAN["LEG"], SPAN["DECODE"]})
    out_dir = Path(os.environ.get("SLOTLIGHT_TEST_OUTPUT") or tmp_path)
    out_dir.mkdir(parents=True, exist_ok=True)
    png = out_dir / "phoenix-trace.png"
    # Phoenix's UI resolves an OpenTelemetry trace id to its project's trace page.
    url = f"{phoenix.base}/redirects/traces/{root['context']['trace_id']}"
    profile = tmp_path / "chromium-profile"
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
           "--disable-background-networking", "--disable-component-update",
           f"--user-data-dir={profile}", f"--screenshot={png}", "--window-size=1400,900",
           "--virtual-time-budget=20000", url]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0 and png.exists(), p.stderr[-3000:]
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    print(f"\nPhoenix trace page screenshot: {png}")


@pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "keyless"])
def test_a_three_turn_session_is_one_phoenix_session_of_three_traces(phoenix, plain_engine, keyed):
    """With a key, and without one: a client that only resends its history gets a session
    from its first turn on (a provisional id the later turns continue)."""
    session = f"phoenix-session-{uuid.uuid4().hex[:12]}" if keyed else None
    messages = [{"role": "system", "content": f"You are a terse assistant ({uuid.uuid4().hex[:6]})."}]
    answers = []
    for question in ["Name a large ocean.", "Name a small sea.", "Name a river."]:
        messages.append({"role": "user", "content": question})
        code, r = plain_engine.post(
            "/v1/chat/completions",
            {"model": plain_engine.model, "messages": messages, "max_tokens": 8, "temperature": 0},
            headers={"x-session-id": session} if keyed else None,
        )
        assert code == 200, r
        answers.append(r)
        messages.append({"role": "assistant", "content": r["choices"][0]["message"]["content"]})
    deadline = time.monotonic() + SPAN_DEADLINE_S
    while session is None:
        # The first turn's request span names the session it started.
        roots = phoenix.spans(attribute=f"{ATTR['REQUEST_ID']}:{answers[0]['id']}")
        session = next((r["attributes"].get("session.id") for r in roots
                        if r["parent_id"] is None and r["attributes"].get("session.id")), None)
        if session is None:
            assert time.monotonic() < deadline, f"no session on the first turn's span: {roots}"
            time.sleep(0.5)
    assert keyed or session.startswith("found-"), session
    found = None
    while found is None or len(found["traces"]) < 3:
        try:
            found = phoenix.get(f"/v1/sessions/{urllib.parse.quote(session)}")["data"]
        except urllib.error.HTTPError as e:
            assert e.code == 404, e
        if time.monotonic() > deadline:
            raise AssertionError(f"Phoenix never showed session {session} with three traces: {found}")
        if found is None or len(found["traces"]) < 3:
            time.sleep(0.5)
    assert found["session_id"] == session
    assert len(found["traces"]) == 3, found
    # The three traces are the three turns' (their request spans carry the session).
    # (Phoenix may list a trace in its session before the span query returns its root.)
    while True:
        roots = [s for s in phoenix.spans(attribute=f"session.id:{session}") if s["parent_id"] is None]
        if len(roots) >= 3 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert sorted(r["attributes"][ATTR["REQUEST_ID"]] for r in roots) == sorted(a["id"] for a in answers)
    # Phoenix's session totals follow its ingestion: read again until they cover the three.
    prompt = sum(a["usage"]["prompt_tokens"] for a in answers)
    while found["token_count_prompt"] != prompt and time.monotonic() < deadline:
        time.sleep(0.5)
        found = phoenix.get(f"/v1/sessions/{urllib.parse.quote(session)}")["data"]
    assert {t["trace_id"] for t in found["traces"]} == {r["context"]["trace_id"] for r in roots}
    assert found["token_count_prompt"] == prompt
    assert found["token_count_completion"] == sum(a["usage"]["completion_tokens"] for a in answers)
