"""KV-cache events, proven by a mirror: a subscriber rebuilds each replica's prefix cache from
the events alone (through eviction, a preemption, a lost batch replayed and an engine restart)
and predicts, for every new prompt, the `cached_tokens` the engine then reports; the same
prediction comes out of a router-style index that keys blocks by its own hash of the events'
tokens (as llm-d's indexer does) and never computes the engine's."""

from __future__ import annotations

import hashlib
import socket
import threading
import time

import msgpack
import pytest
import zmq

from procs import EngineProcess, require_model

BLOCK = 16
TOPICS = {"a": "kv@a@smollm", "b": "kv@b@smollm"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def chain_hash(parent: int, tokens: list[int]) -> int:
    """docs/api.md: last 8 bytes (big-endian) of SHA-256(parent u64 BE ‖ each token u32 BE)."""
    h = hashlib.sha256(parent.to_bytes(8, "big") + b"".join(t.to_bytes(4, "big") for t in tokens))
    return int.from_bytes(h.digest()[24:], "big")


def router_key(parent: bytes, tokens: list[int]) -> bytes:
    """A key of the router's own, unrelated to the engine's hash (as llm-d's indexer computes
    its own keys from the events' tokens): BLAKE2b of the parent key and the tokens."""
    return hashlib.blake2b(parent + b"".join(t.to_bytes(4, "little") for t in tokens), digest_size=16).digest()


class Replica:
    """One replica's mirrored cache, kept twice from the same events: by the engine's block
    hashes, and as a router that never computes the engine's hash keeps it (llm-d's indexer:
    its own key for each block from the event's tokens, chained through the key it mapped the
    parent's engine hash to; a block whose parent it does not know is dropped)."""

    def __init__(self, replay: str):
        self.replay = replay
        self.last = -1
        self.cleared = 0
        self.replayed = 0
        self.reset()

    def reset(self):
        self.blocks: set[int] = set()
        self.router_of: dict[int, bytes] = {}
        self.router_keys: set[bytes] = set()

    def apply(self, seq: int, payload: bytes):
        ts, events, rank = msgpack.unpackb(payload)
        assert isinstance(ts, float) and rank == 0
        for ev in events:
            kind = ev[0]
            if kind == "BlockStored":
                _, hashes, parent, tokens, block_size, lora_id, medium = ev
                assert block_size == BLOCK and lora_id is None and medium == "GPU"
                assert len(tokens) == BLOCK * len(hashes)
                # Each hash is the documented chain of its parent and its tokens.
                p = parent or 0
                for i, h in enumerate(hashes):
                    assert h == chain_hash(p, tokens[i * BLOCK:(i + 1) * BLOCK])
                    p = h
                self.blocks.update(hashes)
                # The router's view: every parent it is told of, it was told of before.
                assert parent is None or parent in self.router_of, "a BlockStored whose parent is unknown"
                key = b"" if parent is None else self.router_of[parent]
                for i, h in enumerate(hashes):
                    key = router_key(key, tokens[i * BLOCK:(i + 1) * BLOCK])
                    self.router_of[h] = key
                    self.router_keys.add(key)
            elif kind == "BlockRemoved":
                _, hashes, medium = ev
                self.blocks.difference_update(hashes)
                for h in hashes:
                    self.router_keys.discard(self.router_of.pop(h))
            else:
                assert ev == ["AllBlocksCleared"]
                self.reset()
                self.cleared += 1
        self.last = seq

    def predict(self, tokens: list[int]) -> int:
        """The engine's own rule: whole blocks, at least one token left to compute. The router's
        view, keyed by its own hash, must predict the same."""
        parent, n = 0, 0
        for i in range((len(tokens) - 1) // BLOCK):
            h = chain_hash(parent, tokens[i * BLOCK:(i + 1) * BLOCK])
            if h not in self.blocks:
                break
            parent, n = h, n + 1
        key, m = b"", 0
        for i in range((len(tokens) - 1) // BLOCK):
            key = router_key(key, tokens[i * BLOCK:(i + 1) * BLOCK])
            if key not in self.router_keys:
                break
            m += 1
        assert m == n, f"keyed by the engine's hash: {n} blocks; by the router's own: {m}"
        return n * BLOCK


class Mirror:
    def __init__(self):
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.port = free_port()
        self.sub.bind(f"tcp://127.0.0.1:{self.port}")
        self.sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
        self.replicas: dict[str, Replica] = {}
        self.drop_next: set[str] = set()

    def replay(self, topic: str, start: int):
        r = self.replicas[topic]
        d = self.ctx.socket(zmq.DEALER)
        d.connect(r.replay)
        d.send_multipart([b"", start.to_bytes(8, "big")])
        while True:
            assert d.poll(30_000), "no replay answer"
            _, seq_b, payload = d.recv_multipart()
            seq = int.from_bytes(seq_b, "big", signed=True)
            if seq == -1:
                break
            if seq > r.last:
                assert seq == r.last + 1, "replay must be contiguous"
                r.apply(seq, payload)
                r.replayed += 1
        d.close(linger=0)

    def pump(self, timeout_ms: int) -> bool:
        if not self.sub.poll(timeout_ms):
            return False
        topic_b, seq_b, payload = self.sub.recv_multipart()
        topic, seq = topic_b.decode(), int.from_bytes(seq_b, "big")
        r = self.replicas[topic]
        if topic in self.drop_next:
            # A batch lost on the way: the next one shows the gap.
            self.drop_next.discard(topic)
            return True
        if seq <= r.last:
            # The engine restarted: its numbers start again; rebuild from its first batch.
            r.last = -1
            r.reset()
        if seq != r.last + 1:
            self.replay(topic, r.last + 1)
        if seq == r.last + 1:
            r.apply(seq, payload)
        return True

    def sync(self, topic: str, engine: EngineProcess):
        """Reads until the replica's latest handed-over batch is applied."""
        status = engine.get("/health")[1]["kv_events"]
        want = status["sequence"]
        # The step loops time their hand-offs (what publishing costs decode).
        assert status["handoff_seconds"] >= 0 and (want == 0 or status["handoff_seconds"] > 0)
        deadline = time.monotonic() + 60
        r = self.replicas[topic]
        if want < r.last:
            # The numbering went back: a restarted engine whose first batches (sent before
            # this subscription reached it) were missed. Rebuild from its replay ring.
            r.last = -1
            r.reset()
            self.replay(topic, 0)
        while r.last < want:
            if not self.pump(1000) and r.last < want:
                # Nothing more is coming (a lost batch at the very end): ask for it.
                self.replay(topic, r.last + 1)
            assert time.monotonic() < deadline, f"{topic}: stuck at {r.last} < {want}"

    def close(self):
        self.sub.close(linger=0)
        self.ctx.term()


def start_replica(mirror: Mirror, name: str, replay_port: int, *extra: str) -> EngineProcess:
    topic = TOPICS[name]
    mirror.replicas.setdefault(topic, Replica(f"tcp://127.0.0.1:{replay_port}"))
    return EngineProcess(
        "--batch", "2", "--kv-cache-tokens", "512",
        "--kv-events-endpoint", f"tcp://127.0.0.1:{mirror.port}",
        "--kv-events-replay-endpoint", f"tcp://127.0.0.1:{replay_port}",
        "--kv-events-topic", topic, *extra, ctx_size=512,
    )


def tokens_of(engine: EngineProcess, text: str) -> list[int]:
    code, body = engine.post("/tokenize", {"prompt": text})
    assert code == 200, body
    return body["tokens"]


def complete(engine: EngineProcess, text: str, max_tokens: int = 1) -> dict:
    body = {"model": engine.model, "prompt": text, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    code, body = engine.post("/v1/completions", body)
    assert code == 200, body
    return body["usage"]


def check(mirror: Mirror, name: str, engine: EngineProcess, text: str) -> int:
    topic = TOPICS[name]
    mirror.sync(topic, engine)
    toks = tokens_of(engine, text)
    predicted = mirror.replicas[topic].predict(toks)
    usage = complete(engine, text)
    assert usage["prompt_tokens"] == len(toks)
    assert usage["prompt_tokens_details"]["cached_tokens"] == predicted, (name, text[:40])
    return predicted


def doc(i: int, words: int = 60) -> str:
    return " ".join(f"item{i}-{j}" for j in range(words))


@pytest.fixture(scope="module")
def setup():
    require_model()
    mirror = Mirror()
    ports = {"a": free_port(), "b": free_port()}
    engines = {n: start_replica(mirror, n, ports[n]) for n in ("a", "b")}
    yield mirror, engines, ports
    for e in engines.values():
        e.close()
    mirror.close()


def test_mirror_predicts_cached_tokens_through_eviction_preemption_loss_and_restart(setup):
    mirror, engines, ports = setup
    a = engines["a"]
    base = doc(0)
    assert check(mirror, "a", a, base) == 0
    # The same prompt extended: its whole blocks are reused, as the events said.
    hit = check(mirror, "a", a, base + " and then some more words")
    assert hit > 0
    # Eviction: many distinct prompts through a 512-position cache.
    for i in range(1, 8):
        check(mirror, "a", a, doc(i))
    assert check(mirror, "a", a, base + " again") == 0, "the first prompt's blocks were evicted"
    removed_seen = a.get("/health")[1]["groups"][0]["kv_evictions"]
    assert removed_seen > 0
    # A lost batch: the next one shows the gap and the replay socket fills it.
    before = mirror.replicas[TOPICS["a"]].replayed
    mirror.drop_next.add(TOPICS["a"])
    check(mirror, "a", a, doc(20))
    check(mirror, "a", a, doc(20) + " extended")
    assert mirror.replicas[TOPICS["a"]].replayed > before
    # A preemption: two long generations that do not both fit.
    out: list[dict] = []
    ts = [threading.Thread(target=lambda i=i: out.append(complete(a, doc(30 + i, 25), 250))) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    g = a.get("/health")[1]["groups"][0]
    assert g["preemptions"] > 0, (g, out)
    for i in range(2):
        check(mirror, "a", a, doc(30 + i, 25) + " follow-up")
    # A restart: the new engine starts empty (AllBlocksCleared), numbering from 0 again.
    a.close()
    engines["a"] = a = start_replica(mirror, "a", ports["a"])
    cleared = mirror.replicas[TOPICS["a"]].cleared
    assert check(mirror, "a", a, doc(31, 25) + " follow-up") == 0
    assert mirror.replicas[TOPICS["a"]].cleared > cleared
    check(mirror, "a", a, doc(31, 25) + " follow-up twice")


def test_the_replica_predicted_to_have_the_longer_prefix_reports_it(setup):
    mirror, engines, _ = setup
    shared = doc(50, 20)
    check(mirror, "a", engines["a"], shared + " " + doc(51, 20))
    check(mirror, "b", engines["b"], shared)
    probe = shared + " " + doc(51, 20) + " and a question"
    toks = tokens_of(engines["a"], probe)
    for n in ("a", "b"):
        mirror.sync(TOPICS[n], engines[n])
    predicted = {n: mirror.replicas[TOPICS[n]].predict(toks) for n in ("a", "b")}
    assert predicted["a"] > predicted["b"] > 0
    reported = {n: complete(engines[n], probe)["prompt_tokens_details"]["cached_tokens"] for n in ("a", "b")}
    assert reported == predicted
    assert max(reported, key=reported.get) == max(predicted, key=predicted.get) == "a"


def test_a_sessions_next_turn_is_predicted_to_land_where_its_last_turn_left_its_blocks(setup):
    """Past one machine: a router that mirrors every replica's cache from the events (llm-d's
    precise prefix-cache scorer) sends a session's turn k+1 where turn k's blocks are, without
    knowing the session; the replica then reuses what was predicted (`full`), and the last turn's
    partly filled block after it."""
    mirror, engines, _ = setup
    session = {"x-session-id": "mirror-session"}
    msgs = [{"role": "user", "content": "Summarise: " + doc(70, 30)}]
    # Turn k ran on replica b (wherever the gateway sent it first).
    code, v = engines["b"].post("/v1/chat/completions", {"messages": msgs, "max_tokens": 8, "temperature": 0}, session)
    assert code == 200, v
    msgs += [{"role": "assistant", "content": v["choices"][0]["message"]["content"]},
             {"role": "user", "content": "And in one word?"}]
    # Turn k+1's prompt, as the engines render and tokenize it.
    code, tok = engines["b"].post("/tokenize", {"messages": msgs})
    assert code == 200, tok
    for n in ("a", "b"):
        mirror.sync(TOPICS[n], engines[n])
    predicted = {n: mirror.replicas[TOPICS[n]].predict(tok["tokens"]) for n in ("a", "b")}
    chosen = max(predicted, key=predicted.get)
    assert chosen == "b" and predicted["b"] > predicted["a"], predicted
    code, w = engines[chosen].post("/v1/chat/completions", {"messages": msgs, "max_tokens": 4, "temperature": 0}, session)
    assert code == 200, w
    # What was predicted (whole blocks), and the last turn's partly filled block beyond them,
    # which the session continues in (its tail: never in the events).
    cached = w["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert predicted["b"] <= cached < predicted["b"] + BLOCK, (cached, predicted)
    assert w["usage"]["resume"] == "full", w["usage"]
