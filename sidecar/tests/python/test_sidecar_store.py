"""The turn store survives `kill -9`: every turn `/v1/turns` returned before the kill is there
after a restart on the same file, none is doubled (not even when the same spans are sent
again), and the file passes `PRAGMA integrity_check`."""

import json
import sqlite3
import threading
import time
import urllib.request

from sidecar_support import ATTR, ENGINE_SERVICE, OP_CHAT, SidecarProcess

INSTANCE = "store-test"
BATCHES = 40
PER_BATCH = 25


def kv(k, v):
    if isinstance(v, str):
        return {"key": k, "value": {"stringValue": v}}
    return {"key": k, "value": {"intValue": str(v)}}


def batch_body(b):
    """Export request `b`: PER_BATCH finished requests (request spans without legs)."""
    now = time.time_ns()
    spans = []
    for i in range(PER_BATCH):
        n = b * PER_BATCH + i
        t0 = now - 1_000_000_000 + n
        spans.append({
            "traceId": f"{n + 1:032x}", "spanId": f"{n + 1:016x}",
            "name": f"{OP_CHAT} store-model", "kind": 2,
            "startTimeUnixNano": str(t0), "endTimeUnixNano": str(t0 + 500_000_000),
            "attributes": [kv(ATTR["REQUEST_ID"], f"req-{n}"), kv(ATTR["REQUEST_LEGS"], 0),
                           kv(ATTR["GEN_AI_CONVERSATION_ID"], f"s{n % 7}")],
        })
    return json.dumps({"resourceSpans": [{
        "resource": {"attributes": [kv(ATTR["SERVICE_NAME"], ENGINE_SERVICE),
                                    kv(ATTR["SERVICE_INSTANCE_ID"], INSTANCE)]},
        "scopeSpans": [{"spans": spans}],
    }]}).encode()


def post(sc, body):
    req = urllib.request.Request(f"http://{sc.http}/v1/traces", data=body,
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200


def all_turns(sc, query=""):
    """Every page of /v1/turns, following next_cursor."""
    out, cursor = [], None
    for _ in range(10_000):  # bounded: there are at most BATCHES * PER_BATCH turns
        q = f"limit=100{query}" + (f"&cursor={cursor}" if cursor else "")
        page = sc.get(f"/v1/turns?{q}")
        assert page["count"] == len(page["turns"]) <= 100
        out.extend(page["turns"])
        cursor = page["next_cursor"]
        if cursor is None:
            return out
    raise AssertionError("paging did not end")


def keys(turns):
    return [(t["trace_id"], t["request_id"]) for t in turns]


def integrity(path):
    c = sqlite3.connect(path)
    try:
        return c.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        c.close()


def test_turns_survive_kill_9_once_each(tmp_path):
    db = tmp_path / "turns.db"
    sc = SidecarProcess("--turns-db", str(db), "--no-turn-log")
    stop = threading.Event()
    sent = []

    def load():
        for b in range(BATCHES):
            if stop.is_set():
                return
            try:
                post(sc, batch_body(b))
            except OSError:
                return  # the sidecar was killed mid-load
            sent.append(b)
            time.sleep(0.01)

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    try:
        # Wait until some turns are stored, then read everything the store answered.
        sc.wait_for("/v1/turns?limit=1", lambda v: v["count"] == 1, "a stored turn")
        while len(sent) < BATCHES // 2 and loader.is_alive():
            time.sleep(0.01)
        before = all_turns(sc)
        assert len(before) >= PER_BATCH
        assert len(set(keys(before))) == len(before), "a listing never repeats a turn"
        sc.proc.kill()  # SIGKILL, by its own PID, while the load goes on
        sc.proc.wait(timeout=10)
    finally:
        stop.set()
        loader.join(timeout=30)
        sc.close()
    assert integrity(db) == "ok"

    again = SidecarProcess("--turns-db", str(db), "--no-turn-log")
    try:
        after = all_turns(again)
        missing = set(keys(before)) - set(keys(after))
        assert not missing, f"{len(missing)} turns returned before the kill are gone"
        assert len(set(keys(after))) == len(after), "no turn is stored twice"
        # The same spans again (an exporter retrying after the restart): still once each.
        for b in range(3):
            post(again, batch_body(b))
        # A marker batch sent last shows the repeats have been through the writer: every one
        # of its turns (the writer may store a batch's turns in more than one transaction).
        post(again, batch_body(BATCHES))
        for n in range(BATCHES * PER_BATCH, (BATCHES + 1) * PER_BATCH):
            again.wait_for(f"/v1/turns?request_id=req-{n}", lambda v: v["count"] == 1, "the marker turns")
        final = all_turns(again)
        assert len(set(keys(final))) == len(final)
        ids = [t["request_id"] for t in final]
        for n in range(3 * PER_BATCH):
            assert ids.count(f"req-{n}") == 1, n
        # Filters and paging by session agree with the whole listing.
        by_session = all_turns(again, "&session_id=s3")
        assert sorted(keys(by_session)) == sorted(k for k, t in zip(keys(final), final)
                                                  if t["session_id"] == "s3")
        one_page = again.get("/v1/turns?session_id=s3&limit=1000")
        starts = [t["start_time_unix_nano"] for t in one_page["turns"]]
        assert one_page["next_cursor"] is None and len(starts) == len(by_session)
        assert starts == sorted(starts), "a session lists oldest first"
        ok = all_turns(again, "&status=ok")
        assert len(ok) == len(final)
        assert all_turns(again, "&status=error") == []
    finally:
        again.close()
    assert integrity(db) == "ok"
