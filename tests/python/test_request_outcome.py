"""One request, one outcome, across processes: a request of two choices where one choice ends
and the client leaves before the other does is `cancelled` with `error.type` `cancelled` in the
engine's `Request.Finished` log line, in its request span (as the sidecar receives and forwards
it), in the engine's metrics and in the sidecar's turn record (the rule is in docs/api.md)."""

from __future__ import annotations

import json
import time

from metrics_text import Samples, scrape
from otlp_receiver import OtlpReceiver, attrs
from procs import EngineProcess, SidecarProcess, post_stream, require_model
from sidecar_support import ATTR, ENGINE_METRIC, METRIC

FINISHED = ENGINE_METRIC["REQUESTS_FINISHED"]
DURATION = METRIC["REQUEST_DURATION"]
# Bounded tries: the scenario needs the client's close to arrive before the second choice ends.
TRIES = 4


def _leave_after_first_finish(base: str, body: dict) -> tuple[str, list[tuple[int, str]]]:
    """Streams `body` and closes the connection as soon as one choice's finish_reason arrives:
    (the response id, the (index, finish_reason) pairs seen before leaving)."""
    conn, r = post_stream(base, body)
    try:
        rid, finished = None, []
        while not finished:
            line = r.fp.readline()
            assert line, "the stream ended before any choice finished"
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[len(b"data: "):])
            rid = chunk["id"]
            finished = [(c["index"], c["finish_reason"]) for c in chunk["choices"] if c.get("finish_reason")]
        return rid, finished
    finally:
        conn.close()  # the client leaves


def _wait(pred, what: str, tries: int = 1500):
    for _ in range(tries):
        v = pred()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError(f"never saw {what}")


def _log_line(engine: EngineProcess, rid: str) -> dict:
    def find():
        lines = [json.loads(l) for l in list(engine.log) if rid in l and l.lstrip().startswith("{")]
        return [l for l in lines if "Request.Finished" in json.dumps(l)]

    found = _wait(find, f"the Request.Finished line of {rid}")
    assert len(found) == 1, found
    return found[0]


def test_n2_one_choice_ends_and_the_client_leaves_is_cancelled_everywhere():
    require_model()
    receiver = OtlpReceiver()
    sidecar = SidecarProcess("--forward-otlp", receiver.base)
    # One batch slot: choice 1 waits for choice 0 to end before it runs, so choice 0's finish
    # always comes first and choice 1 still has its whole reply to write when the client leaves.
    engine = EngineProcess("--batch", "1", "--log-format", "json", otlp=f"http://{sidecar.grpc}")
    try:
        body = {
            "model": engine.model,
            "messages": [{"role": "user", "content": "Count from one to twenty in words."}],
            "n": 2,
            "stream": True,
            "temperature": 0,
            "max_tokens": 48,
        }
        reached, lines = None, []
        for _ in range(TRIES):
            rid, first = _leave_after_first_finish(engine.base, body)
            rec = _log_line(engine, rid)
            lines.append(rec)
            reasons = rec["finish_reason"].split(",")
            if "cancelled" in reasons and any(r in ("stop", "length") for r in reasons):
                reached = (rid, first, rec)
                break
        assert reached, f"in {TRIES} tries no request ended one choice and cancelled the other"
        rid, first, rec = reached
        print("tries:", len(lines), "first finish:", first, "log line:", {k: rec[k] for k in ("status", "error_type", "finish_reason")})
        assert len(first) == 1 and first[0][1] in ("stop", "length"), first
        ended = first[0][0]
        assert rec["choices"] == 2
        assert rec["finish_reason"].split(",")[ended] == first[0][1], rec
        assert rec["finish_reason"].split(",")[1 - ended] == "cancelled", rec

        # 1. The log line.
        assert (rec["status"], rec["error_type"]) == ("cancelled", "cancelled"), rec

        # 2. The request span, as the sidecar forwarded it.
        def request_span():
            for s in receiver.spans():
                a = attrs(s)
                if a.get(ATTR["REQUEST_ID"]) == rid and ATTR["REQUEST_STATUS"] in a:
                    return s
            return None

        span = _wait(request_span, f"the request span of {rid}")
        a = attrs(span)
        assert (a[ATTR["REQUEST_STATUS"]], a.get(ATTR["ERROR_TYPE"])) == ("cancelled", "cancelled"), a

        # 3. The engine's metrics, counted over every try (each try's log line says how it
        # ended): each request's duration under its own error_type, none for `ok`, and its
        # choices one by one, a cancelled choice with error_type `cancelled`.
        _, _, text = scrape(engine.base)
        m = Samples(text)
        count = DURATION + "_count"
        by_status = {s: sum(1 for l in lines if l["status"] == s) for s in ("ok", "cancelled")}
        assert by_status["ok"] + by_status["cancelled"] == len(lines), lines
        assert m.total(count, error_type="cancelled") == by_status["cancelled"], text
        assert sum(v for n, l, v in m.samples if n == count and "error_type" not in l) == by_status["ok"], text
        assert sum(v for n, l, v in m.samples if n == count) == len(lines), text
        per_choice = [r for l in lines for r in l["finish_reason"].split(",")]
        assert m.total(FINISHED, finish_reason="cancelled", error_type="cancelled") == per_choice.count("cancelled"), text
        assert m.total(FINISHED, finish_reason="cancelled") == per_choice.count("cancelled"), text
        assert m.total(FINISHED, finish_reason=first[0][1]) == per_choice.count(first[0][1]), text

        # 4. The sidecar's turn record.
        turn = sidecar.wait_turn(rid)
        assert (turn["status"], turn["error_type"]) == ("cancelled", "cancelled"), turn
    finally:
        engine.close()
        sidecar.close()
        receiver.close()
