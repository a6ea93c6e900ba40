"""Engine and sidecar as real processes on loopback, for the end-to-end tests.

Binaries come from $SLOTLIGHT_ENGINE_BIN / $SLOTLIGHT_SIDECAR_BIN, else the cargo target
directory's debug builds. Every process is stopped by its own PID when the test is done.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "sidecar" / "tests" / "python"))

from sidecar_support import SidecarProcess, find_row  # noqa: E402,F401


def binary(name: str, env: str) -> Path:
    if os.environ.get(env):
        return Path(os.environ[env])
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    p = target / "debug" / name
    if not p.exists():
        raise FileNotFoundError(f"{name} not found at {p}; run `cargo build --workspace` or set {env}")
    return p


def default_model() -> Path:
    if os.environ.get("SLOTLIGHT_MODEL"):
        return Path(os.environ["SLOTLIGHT_MODEL"])
    base = os.environ.get("SLOTLIGHT_MODEL_DIR")
    if not base:
        cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        base = str(Path(cache) / "slotlight" / "models")
    return Path(base) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def require_model():
    """Skips the calling test when the default model is missing, or fails it when
    SLOTLIGHT_REQUIRE_MODEL=1."""
    import pytest

    if not default_model().exists():
        if os.environ.get("SLOTLIGHT_REQUIRE_MODEL") == "1":
            pytest.fail(f"the default model is required but missing at {default_model()}")
        pytest.skip(f"the default model is not at {default_model()} (run `slotlight-engine fetch-model`)")


def gemma_model() -> Path:
    """Gemma 3 270M (Q4_K_M), where `slotlight-engine fetch-model gemma3-270m` puts it."""
    return default_model().parent / "gemma-3-270m-q4_k_m.gguf"


def require_gemma() -> Path:
    """Gemma 3 270M's path; skips the calling test when it is missing, or fails it when
    SLOTLIGHT_REQUIRE_MODEL=1."""
    import pytest

    p = gemma_model()
    if not p.exists():
        if os.environ.get("SLOTLIGHT_REQUIRE_MODEL") == "1":
            pytest.fail(f"Gemma 3 270M is required but missing at {p}")
        pytest.skip("Gemma 3 270M is not fetched (`slotlight-engine fetch-model gemma3-270m`)")
    return p


def agent_cli(name: str) -> Path:
    """An agent CLI installed from npm into tests/agents (`codex`, `claude`); skips the calling
    test when it is missing, or fails it when SLOTLIGHT_REQUIRE_TOOLS=1."""
    import pytest

    p = REPO / "tests" / "agents" / "node_modules" / ".bin" / name
    if not p.exists():
        if os.environ.get("SLOTLIGHT_REQUIRE_TOOLS") == "1":
            pytest.fail(f"{name} is required but missing at {p} (npm ci --prefix tests/agents)")
        pytest.skip(f"{name} is not installed (npm ci --prefix tests/agents)")
    return p


def http_json(method: str, url: str, body=None, headers=None, timeout=60):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def stop_process(proc: subprocess.Popen, timeout: float = 30):
    """Ends a process this test started: SIGTERM, then SIGKILL after `timeout` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def post_stream(base: str, body: dict, path: str = "/v1/chat/completions"):
    """POSTs `body` to `base + path` for a stream: the open connection (the caller closes it)
    and its response, checked to be 200."""
    u = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    conn.request("POST", path, json.dumps(body), {"content-type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200, r.read()
    return conn, r


class EngineProcess:
    """`slotlight-engine serve` on a free loopback port."""

    def __init__(
        self, *extra: str, otlp: str | None = None, protocol: str = "grpc", ctx_size: int = 2048,
        api_key: str | None = None, env: dict[str, str] | None = None, model: Path | None = None,
    ):
        self.auth = {"authorization": f"Bearer {api_key}"} if api_key else {}
        args = [str(binary("slotlight-engine", "SLOTLIGHT_ENGINE_BIN")), "serve", "--port", "0", "--model", str(model or default_model()), "--ctx-size", str(ctx_size)]
        if otlp:
            args += ["--otlp-endpoint", otlp, "--otlp-protocol", protocol]
        else:
            args += ["--no-telemetry"]
        if api_key:
            args += ["--api-key", api_key]
        if "--responses-db" not in extra:
            # Stored responses stay in the process unless a test gives a file or Redis.
            args += ["--responses-db", ":memory:"]
        args += list(extra)
        env = dict(os.environ, RUST_LOG="info", **(env or {}))
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.log: list[str] = []
        deadline = time.monotonic() + 120
        self.base = None
        while self.base is None:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError("engine exited before listening:\n" + "".join(self.log))
            self.log.append(line)
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                self.base = m.group(1)
            if time.monotonic() > deadline:
                raise RuntimeError("engine did not start")
        threading.Thread(target=self._drain, daemon=True).start()
        self.model = self.get("/v1/models")[1]["data"][0]["id"]

    def _drain(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def get(self, path: str):
        return http_json("GET", self.base + path, headers=self.auth)

    def post(self, path: str, body, headers=None):
        return http_json("POST", self.base + path, body, {**self.auth, **(headers or {})})

    def close(self):
        stop_process(self.proc)


def pinned_sidecar(grpc: str, *extra: str) -> SidecarProcess:
    """A sidecar whose OTLP/gRPC receiver listens on a fixed address (to restart it in place),
    with `extra` flags (`--turns-db FILE` to reopen a store)."""
    real_popen = subprocess.Popen

    def popen(args, *a, **kw):
        out = list(args)
        i = out.index("--otlp-grpc")
        out[i + 1] = grpc
        return real_popen(out, *a, **kw)

    subprocess.Popen = popen
    try:
        return SidecarProcess(*extra)
    finally:
        subprocess.Popen = real_popen
