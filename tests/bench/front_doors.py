#!/usr/bin/env python3
"""The same streaming load through each front door of one engine: chat completions, Responses
and Messages. Standard library only.

    front_doors.py BASE_URL [--clients 16] [--seconds 30] [--rounds 3] [--max-tokens 96]

Each client streams requests one after another until the round's time is up: the same
prompts, greedy, the same token limit, so every API generates the same tokens (one request
path; only the wire format differs). The APIs take turns, round after round, so a drift of the
machine falls on all of them. Prints a table of completion tokens per second of wall time per
API and round, each API's median, and its ratio to chat completions'; `--json` prints one JSON
line instead. Serve with `--batch 8` for the issue's load (16 clients, batch 8).
"""
import argparse
import http.client
import json
import statistics
import threading
import time
import urllib.parse
import urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("base")
ap.add_argument("--clients", type=int, default=16)
ap.add_argument("--seconds", type=float, default=30)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--max-tokens", type=int, default=96)
ap.add_argument("--json", action="store_true")
a = ap.parse_args()
u = urllib.parse.urlparse(a.base)
model = json.load(urllib.request.urlopen(a.base + "/v1/models"))["data"][0]["id"]


def prompt(k, i):
    return f"Write a short story about lighthouse keeper {k}.{i}."


def chat(k, i):
    body = {"model": model, "max_tokens": a.max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": prompt(k, i)}]}
    return "/v1/chat/completions", body


def responses(k, i):
    body = {"model": model, "max_output_tokens": a.max_tokens, "temperature": 0, "stream": True,
            "store": False, "input": prompt(k, i)}
    return "/v1/responses", body


def messages(k, i):
    body = {"model": model, "max_tokens": a.max_tokens, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": prompt(k, i)}]}
    return "/v1/messages", body


def tokens_of(path, line, n):
    """The completion tokens an SSE data line reports, else `n`."""
    if not line.startswith("data: ") or line == "data: [DONE]":
        return n
    ev = json.loads(line[6:])
    if path == "/v1/chat/completions" and ev.get("usage"):
        return ev["usage"]["completion_tokens"]
    if path == "/v1/responses" and ev.get("type") in ("response.completed", "response.incomplete"):
        return ev["response"]["usage"]["output_tokens"]
    if path == "/v1/messages" and ev.get("type") == "message_delta":
        return ev["usage"]["output_tokens"]
    return n


def run(make):
    stop = time.time() + a.seconds
    done, errors, lock = [], [], threading.Lock()

    def client(k):
        i = 0
        while time.time() < stop:
            i += 1
            path, body = make(k, i)
            n = 0
            try:
                c = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
                c.request("POST", path, json.dumps(body), {"content-type": "application/json"})
                r = c.getresponse()
                if r.status != 200:
                    r.read()
                    errors.append(r.status)
                    time.sleep(0.2)
                    continue
                for raw in r:
                    n = tokens_of(path, raw.decode().strip(), n)
                c.close()
            except Exception as e:  # noqa: BLE001 - every failure is counted
                errors.append(type(e).__name__)
                continue
            with lock:
                done.append(n)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(a.clients)]
    t = time.time()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return sum(done) / (time.time() - t), len(done), len(errors)


apis = {"chat.completions": chat, "responses": responses, "messages": messages}
rates = {name: [] for name in apis}
errors = {name: 0 for name in apis}
for _ in range(a.rounds):
    for name, make in apis.items():
        rate, _, err = run(make)
        rates[name].append(rate)
        errors[name] += err
medians = {name: statistics.median(v) for name, v in rates.items()}
base = medians["chat.completions"] or 1
if a.json:
    print(json.dumps({"clients": a.clients, "seconds": a.seconds, "rounds": a.rounds,
                      "tokens_per_s": {k: [round(x, 1) for x in v] for k, v in rates.items()},
                      "median": {k: round(v, 1) for k, v in medians.items()},
                      "ratio_to_chat": {k: round(v / base, 4) for k, v in medians.items()},
                      "errors": errors}))
else:
    print(f"{'api':<18} " + " ".join(f"round {r + 1:>2}" for r in range(a.rounds))
          + "   median  vs chat  errors")
    for name in apis:
        cells = " ".join(f"{x:>8.1f}" for x in rates[name])
        print(f"{name:<18} {cells} {medians[name]:>8.1f}  {medians[name] / base:>6.3f}  {errors[name]:>6}")
