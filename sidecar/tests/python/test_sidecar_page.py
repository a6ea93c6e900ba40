"""The live page in headless Chromium: it loads empty, then a slot's tile appears over SSE
when the engine's spans arrive (driven through the DevTools protocol on a pipe).

Skips, saying why, only when Chromium is not installed (Debian package `chromium`)."""

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request

import pytest

from sidecar_support import ATTR, ENGINE_SERVICE, OP_CHAT, PATH_SLOT, RESUME_DIVERGED, SPAN

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


class DevTools:
    """Chromium with --remote-debugging-pipe: NUL-terminated JSON on fds 3 (in) and 4 (out)."""

    def __init__(self, profile_dir):
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        def wire_fds():
            # Move both ends above 4 first, so neither dup2 below clobbers the other.
            r = os.dup(to_chrome_r) if to_chrome_r <= 4 else to_chrome_r
            w = os.dup(from_chrome_w) if from_chrome_w <= 4 else from_chrome_w
            r = os.dup(r) if r <= 4 else r
            w = os.dup(w) if w <= 4 else w
            os.dup2(r, 3)
            os.dup2(w, 4)

        self.proc = subprocess.Popen(
            [
                CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run", "--disable-dev-shm-usage", f"--user-data-dir={profile_dir}",
                "--remote-debugging-pipe", "about:blank",
            ],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=wire_fds, pass_fds=(3, 4), start_new_session=True,
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._next = 0

    def call(self, method, params=None, session=None):
        self._next += 1
        msg = {"id": self._next, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        while True:
            while b"\0" not in self._buf:
                chunk = os.read(self._from_chrome, 1 << 16)
                if not chunk:
                    raise RuntimeError("chromium closed the DevTools pipe")
                self._buf += chunk
            raw, self._buf = self._buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def close(self):
        try:
            self.call("Browser.close")
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # the process we started, by its own handle
            self.proc.wait()
        # Helpers Chromium forked stay in the session we created for it (its group id is the
        # PID we started); end any that outlive the browser.
        try:
            os.killpg(self.proc.pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
        for fd in (self._to_chrome, self._from_chrome):
            try:
                os.close(fd)
            except OSError:
                pass


def kv(k, v):
    if isinstance(v, bool):
        return {"key": k, "value": {"boolValue": v}}
    if isinstance(v, str):
        return {"key": k, "value": {"stringValue": v}}
    if isinstance(v, float):
        return {"key": k, "value": {"doubleValue": v}}
    return {"key": k, "value": {"intValue": str(v)}}


def post_span(sidecar, instance, span):
    """One engine span as hand-written OTLP/JSON."""
    body = {"resourceSpans": [{
        "resource": {"attributes": [kv(ATTR["SERVICE_NAME"], ENGINE_SERVICE), kv(ATTR["SERVICE_INSTANCE_ID"], instance)]},
        "scopeSpans": [{"spans": [{"traceId": "0af7651916cd43dd8448eb211c80319c", **span}]}],
    }]}
    req = urllib.request.Request(
        f"http://{sidecar.http}/v1/traces", data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200


def post_decode_window(sidecar, instance, request_id, slot, tokens, drafts=None):
    """One decode window; `drafts` = (drafted, accepted) when speculative decoding drafted."""
    t0 = time.time_ns() - 2_000_000_000
    t1 = t0 + 1_000_000_000
    post_span(sidecar, instance, {
        "spanId": "b7ad6b7169203331", "name": SPAN["DECODE"], "kind": 1,
        "startTimeUnixNano": str(t0), "endTimeUnixNano": str(t1),
        "attributes": [
            kv(ATTR["REQUEST_ID"], request_id), kv(ATTR["LEG_PATH"], PATH_SLOT), kv(ATTR["SLOT_INDEX"], slot),
            kv(ATTR["SLOT_GROUP"], 0), kv(ATTR["LEG_INDEX"], 0), kv(ATTR["LEG_START_TIME"], t0),
            kv(ATTR["DECODE_TOKENS_GENERATED"], tokens), kv(ATTR["DECODE_WINDOW_TOKENS"], tokens),
            kv(ATTR["DECODE_LAST_TOKEN_TIME"], t1), kv(ATTR["REQUEST_START_TIME"], t0),
            kv(ATTR["REQUEST_FIRST_TOKEN_TIME"], t0 + 100_000_000),
            *([kv(ATTR["DECODE_DRAFTED_TOKENS"], drafts[0]), kv(ATTR["DECODE_ACCEPTED_TOKENS"], drafts[1])]
              if drafts else []),
        ],
    })


def post_request_span(sidecar, instance, request_id, attrs):
    """The request (root) span of a finished request with no legs, and `attrs`."""
    t0 = time.time_ns() - 1_000_000_000
    post_span(sidecar, instance, {
        "spanId": "c7ad6b7169203332", "name": f"{OP_CHAT} page-model", "kind": 2,
        "startTimeUnixNano": str(t0), "endTimeUnixNano": str(t0 + 500_000_000),
        "attributes": [kv(ATTR["REQUEST_ID"], request_id), kv(ATTR["REQUEST_LEGS"], 0),
                       *(kv(ATTR[k], v) for k, v in attrs.items())],
    })
def post_sampled_request(sidecar, instance, request_id, ratio):
    """A finished request span stating the engine's sampling ratio, as hand-written OTLP/JSON."""
    t1 = time.time_ns()
    t0 = t1 - 1_000_000_000
    body = {"resourceSpans": [{
        "resource": {"attributes": [
            {"key": ATTR["SERVICE_NAME"], "value": {"stringValue": ENGINE_SERVICE}},
            {"key": ATTR["SERVICE_INSTANCE_ID"], "value": {"stringValue": instance}},
        ]},
        "scopeSpans": [{"spans": [{
            "traceId": "1af7651916cd43dd8448eb211c80319c", "spanId": "c7ad6b7169203331",
            "name": f"{OP_CHAT} m", "kind": 2,
            "startTimeUnixNano": str(t0), "endTimeUnixNano": str(t1),
            "attributes": [
                {"key": ATTR["REQUEST_ID"], "value": {"stringValue": request_id}},
                {"key": ATTR["TRACE_SAMPLING_RATIO"], "value": {"doubleValue": ratio}},
            ],
        }]}],
    }]}
    req = urllib.request.Request(
        f"http://{sidecar.http}/v1/traces", data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200


def test_page_shows_a_slot_tile_over_sse(sidecar):
    if CHROMIUM is None:
        # Fail, never skip, where the tools are required (CI installs chromium).
        if os.environ.get("SLOTLIGHT_REQUIRE_TOOLS") == "1":
            pytest.fail("chromium is required (Debian package `chromium`; SLOTLIGHT_REQUIRE_TOOLS=1)")
        pytest.skip("chromium is not installed (Debian package `chromium`); CI installs it")
    with tempfile.TemporaryDirectory() as profile:
        chrome = DevTools(profile)
        try:
            target = chrome.call("Target.createTarget", {"url": sidecar.url("/")})["targetId"]
            session = chrome.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]

            def evaluate(expr):
                r = chrome.call("Runtime.evaluate", {"expression": expr, "returnByValue": True}, session)
                return r.get("result", {}).get("value")

            def wait_until(expr, what):
                for _ in range(1000):
                    v = evaluate(expr)
                    if v:
                        return v
                    time.sleep(0.01)
                raise AssertionError(f"the page never showed {what}; DOM: "
                                     + str(evaluate("document.body.innerHTML"))[:3000])

            # The page is up and its slot stream connected (empty view).
            wait_until("document.getElementById('conn').className === 'ok'", "a live stream")
            assert evaluate("document.querySelectorAll('.tile').length") == 0

            post_decode_window(sidecar, "page-engine", "req-page", 2, 42, drafts=(32, 24))
            tile = wait_until(
                "(() => { const t = document.querySelector('.tile[data-request-id=\"req-page\"]');"
                " return t && {slot: t.dataset.slot, state: t.dataset.state, instance: t.dataset.instance,"
                " text: t.textContent}; })()",
                "the slot's tile",
            )
            assert tile["slot"] == "slot 2"
            assert tile["state"] == "decoding"
            assert tile["instance"] == "page-engine"
            assert "42" in tile["text"]
            # Speculative decoding: the tile says the share of draft tokens taken, taken/verified.
            drafts = evaluate(
                "(() => { const d = document.querySelector('.tile[data-request-id=\"req-page\"] .drafts');"
                " return d && {acceptance: d.dataset.acceptance, text: d.textContent}; })()")
            assert drafts == {"acceptance": "0.75", "text": "drafts 75% · 24/32"}, drafts
            # A finished turn's row says how it resumed: outcome, where it diverged, cached/reusable.
            post_request_span(sidecar, "page-engine", "req-turn", {
                "RESUME": RESUME_DIVERGED, "RESUME_DIVERGED_AT": 37, "RESUME_REUSABLE_TOKENS": 40,
                "GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS": 32,
                "USAGE_DRAFTED_TOKENS": 40, "USAGE_ACCEPTED_TOKENS": 10})
            resume = wait_until(
                "(() => { const c = document.querySelector('#turns tr[data-request-id=\"req-turn\"] td.resume');"
                " return c && c.textContent; })()",
                "the turn's resume cell",
            )
            assert resume == f"{RESUME_DIVERGED} @37 · 32/40", resume
            taken = evaluate("document.querySelector('#turns tr[data-request-id=\"req-turn\"] td.drafts').textContent")
            assert taken == "25% · 10/40", taken
            # An engine that samples its traces: the page says its counts are of sampled requests.
            post_sampled_request(sidecar, "page-engine", "req-sampled", 0.25)
            note = wait_until(
                "(() => { const n = document.querySelector('section[data-instance=\"page-engine\"] .sampling');"
                " return n && {ratio: n.dataset.samplingRatio, text: n.textContent}; })()",
                "the sampling note",
            )
            assert note["ratio"] == "0.25"
            assert "25%" in note["text"] and "sampled" in note["text"]
            # A session's row, live, with a bar of where its time went: 100 ms queue, 100 ms
            # prefill, 300 ms decode, no client time yet (one turn).
            post_request_span(sidecar, "page-engine", "req-session", {
                "GEN_AI_CONVERSATION_ID": "page-session", "SESSION_ID": "page-session",
                "SESSION_SOURCE": "header", "SESSION_TURN": 0, "SESSION_KV_TTL_MS": 600_000.0,
                "USAGE_QUEUE_MS": 100.0, "USAGE_TTFT_MS": 200.0, "USAGE_E2E_MS": 500.0})
            row = wait_until(
                "(() => { const r = document.querySelector('#sessions tr[data-session-id=\"page-session\"]');"
                " return r && {live: r.dataset.live, first: document.querySelector('#sessions tbody tr').dataset.sessionId,"
                " parts: [...r.querySelectorAll('.timebar span')].map(s => [s.dataset.part, s.style.width])}; })()",
                "the session's row",
            )
            assert row["live"] == "true" and row["first"] == "page-session", row
            widths = {p: float(w.rstrip("%")) for p, w in row["parts"]}
            assert set(widths) == {"queue", "prefill", "decode", "client"}, row
            assert abs(widths["queue"] - 20) < 0.01 and abs(widths["decode"] - 60) < 0.01, row
            assert widths["client"] == 0, row
            # A side call under the session's key: counted apart in the session's row.
            post_request_span(sidecar, "page-engine", "req-side-call", {
                "GEN_AI_CONVERSATION_ID": "page-session", "SESSION_ID": "page-session",
                "SESSION_SOURCE": "header", "SESSION_TURN": 1, "SESSION_BRANCH": 1,
                "SESSION_SIDE_CALL": True, "SESSION_KV_TTL_MS": 600_000.0})
            side_calls = wait_until(
                "(() => { const c = document.querySelector('#sessions tr[data-session-id=\"page-session\"] td.side-calls');"
                " return c && c.textContent === '1' && c.textContent; })()",
                "the session's side calls",
            )
            assert side_calls == "1", side_calls
            # Self-contained: nothing but same-origin resources.
            urls = evaluate("performance.getEntriesByType('resource').map(e => e.name)")
            assert all(u.startswith(sidecar.url("")) for u in urls), urls
        finally:
            chrome.close()
