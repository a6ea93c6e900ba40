"""Helpers for the sidecar's Python tests.

Names come from otel/CONTRACT.md (rendered from the slotlight-otel crate), so these tests
spell no span name, attribute key or metric name themselves.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
CONTRACT_MD = REPO / "otel" / "CONTRACT.md"


def contract():
    """otel/CONTRACT.md read back: each section's table (constant name → value), the attribute
    values (meaning → value) and the metric labels."""
    sections: dict[str, dict[str, str]] = {}
    values: dict[str, str] = {}
    labels: set[str] = set()
    section = None
    row = re.compile(r"^\|\s*`([^`]+)`\s*\|.*\|\s*`([A-Z0-9_]+)`\s*\|\s*$")
    value_row = re.compile(r"^\|\s*`([^`]+)`\s*\|\s*(.+?)\s*\|\s*$")
    for line in CONTRACT_MD.read_text().splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
            continue
        if section == "Metric labels" and (m := re.match(r"^-\s*`([^`]+)`", line)):
            labels.add(m.group(1))
            continue
        m = row.match(line)
        if m and section:
            sections.setdefault(section, {})[m.group(2)] = m.group(1)
            continue
        m = value_row.match(line)
        if m and section == "Attribute values":
            values[m.group(2)] = m.group(1)
    return sections, values, labels


_SECTIONS, _VALUES, METRIC_LABELS = contract()
SPAN = _SECTIONS["Spans"]
ATTR = _SECTIONS["Attributes"]
METRIC = _SECTIONS["Metrics"]
ENGINE_METRIC = _SECTIONS["Engine metrics"]
VLLM_METRIC = _SECTIONS["vLLM-compatible metrics"]
ENGINE_SERVICE = next(v for k, v in _VALUES.items() if k.startswith("`service.name`"))
PATH_SOLO = next(v for k, v in _VALUES.items() if "solo path" in k)
PATH_SLOT = next(v for k, v in _VALUES.items() if "a batch slot" in k)
OP_CHAT = next(v for k, v in _VALUES.items() if k.startswith("`gen_ai.operation.name` of chat"))
RESUME_DIVERGED = next(v for k, v in _VALUES.items() if k.startswith("`slotlight.resume`: the history changed"))


def sidecar_binary() -> Path:
    """The sidecar binary: $SLOTLIGHT_SIDECAR_BIN, else the cargo target directory's debug build."""
    env = os.environ.get("SLOTLIGHT_SIDECAR_BIN")
    if env:
        return Path(env)
    candidates = []
    if os.environ.get("CARGO_TARGET_DIR"):
        candidates.append(Path(os.environ["CARGO_TARGET_DIR"]) / "debug" / "slotlight-sidecar")
    candidates.append(REPO / "target" / "debug" / "slotlight-sidecar")
    for c in candidates:
        if c.exists():
            return c
    raise FileNotFoundError(
        "slotlight-sidecar binary not found; run `cargo build -p slotlight-sidecar` or set "
        "SLOTLIGHT_SIDECAR_BIN (looked in: " + ", ".join(map(str, candidates)) + ")"
    )


class SidecarProcess:
    """A sidecar child process on loopback port 0; stopped (by its own PID) on close()."""

    def __init__(self, *extra: str):
        # The turn store goes to a scratch directory unless the test names one: never the
        # user's state directory.
        self._scratch = None
        store = []
        if "--turns-db" not in extra:
            self._scratch = tempfile.TemporaryDirectory(prefix="slotlight-sidecar-")
            store = ["--turns-db", str(Path(self._scratch.name) / "turns.db")]
        args = [
            str(sidecar_binary()),
            "--otlp-grpc", "127.0.0.1:0",
            "--otlp-http", "127.0.0.1:0",
            "--listen", "127.0.0.1:0",
            "--publish-interval-ms", "20",
            *store,
            *extra,
        ]
        self.proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.stdout_lines: list[str] = []
        self.stderr_lines: list[str] = []
        self.startup_line = None
        deadline = time.monotonic() + 30
        while self.startup_line is None:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError("sidecar exited before listening: " + "".join(self.stderr_lines))
            if "listening otlp_grpc=" in line:
                self.startup_line = line.strip()
            else:
                self.stderr_lines.append(line)
            if time.monotonic() > deadline:
                raise RuntimeError("sidecar did not start")
        addr = dict(re.findall(r"(\w+)=(\S+)", self.startup_line))
        self.grpc = addr["otlp_grpc"]
        self.http = addr["otlp_http"]
        self.views = addr["views"]
        threading.Thread(target=self._drain, args=(self.proc.stdout, self.stdout_lines), daemon=True).start()
        threading.Thread(target=self._drain, args=(self.proc.stderr, self.stderr_lines), daemon=True).start()

    @staticmethod
    def _drain(stream, sink):
        for line in stream:
            sink.append(line)

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None

    def url(self, path: str) -> str:
        return f"http://{self.views}{path}"

    def get(self, path: str):
        with urllib.request.urlopen(self.url(path), timeout=10) as r:
            body = r.read()
            ctype = r.headers.get("content-type", "")
        return json.loads(body) if "json" in ctype else body.decode()

    def wait_for(self, path: str, pred, what: str = ""):
        """Polls a JSON view until pred(value) holds (bounded: correctness, not speed)."""
        last = None
        for _ in range(1000):
            last = self.get(path)
            if pred(last):
                return last
            time.sleep(0.01)
        raise AssertionError(f"{path} never showed {what}: {json.dumps(last)[:2000]}")

    def wait_row(self, instance: str, path: str, index, pred=lambda r: True):
        def find(v):
            return find_row(v, instance, path, index)

        v = self.wait_for("/v1/slots", lambda v: (r := find(v)) is not None and pred(r), f"{instance} {path} {index}")
        return find(v)

    def wait_turn(self, request_id: str):
        v = self.wait_for(f"/v1/turns?request_id={request_id}", lambda v: v["count"] == 1, request_id)
        return v["turns"][0]


def find_row(view, instance, path, index):
    for inst in view["instances"]:
        if inst["instance"] != instance:
            continue
        for r in inst["slots"]:
            if r["path"] == path and r["index"] == index:
                return r
    return None
