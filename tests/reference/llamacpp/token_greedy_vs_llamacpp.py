#!/usr/bin/env python3
"""Greedy continuations and top log-probabilities of one GGUF file, slotlight against llama-server,
from prompts of token ids (issue 38: a new family checked against llama.cpp on small random-weight
files, whose text is noise; greedy_vs_llamacpp.py beside this compares text prompts on real models).

    python3 tests/reference/llamacpp/token_greedy_vs_llamacpp.py MODEL.gguf SLOTLIGHT_ENGINE LLAMA_SERVER

Both servers run the file on 127.0.0.1 (free ports) with 2 threads; three prompts of
token ids are continued greedily for 24 tokens (ignoring end-of-generation), and the script prints,
per prompt, how many tokens agree and, over the steps where both agree, the worst difference of the
top-5 log-probabilities above -10. llama-server renders special tokens as empty text and masks
end-of-generation tokens under `ignore_eos` (slotlight samples them): a continuation counts as
equal up to slotlight's first end-of-generation token, and steps whose top 5 hold one are left out
of the log-probability comparison. The tiny `qwen3moe` file comes from
`cargo test -p slotlight-engine --test moe -- --ignored write_the_llamacpp_comparison_file`.
"""
import json
import socket
import subprocess
import sys
import time
import urllib.request

model, engine, server = sys.argv[1], sys.argv[2], sys.argv[3]
prompts = [[1, 20, 30, 40, 50, 60], [1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41], [1, 70, 3, 88]]
N = 24

def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(url):
    for _ in range(600):
        try:
            urllib.request.urlopen(url, timeout=2); return
        except Exception:
            time.sleep(0.2)
    raise SystemExit(f"{url} never came up")

op, tp = free_port(), free_port()
OURS, THEIRS = f"http://127.0.0.1:{op}", f"http://127.0.0.1:{tp}"
ours = subprocess.Popen([engine, "serve", "--model", model, "--host", "127.0.0.1", "--port", str(op), "--threads", "2"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
theirs = subprocess.Popen([server, "-m", model, "--host", "127.0.0.1", "--port", str(tp), "-t", "2", "-c", "256", "--no-warmup"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
try:
    wait(f"{OURS}/health"); wait(f"{THEIRS}/health")
    same = 0; worst = 0.0
    for p in prompts:
        a = post(f"{OURS}/v1/completions", {"prompt": p, "max_tokens": N, "temperature": 0,
                  "ignore_eos": True, "logprobs": 5})
        b = post(f"{THEIRS}/completion", {"prompt": p, "n_predict": N, "temperature": 0, "top_k": 1,
                  "ignore_eos": True, "n_probs": 5, "post_sampling_probs": False, "cache_prompt": False})
        ta = a["choices"][0]["logprobs"]["tokens"]
        tb = [c["token"] for c in b["completion_probabilities"]]
        n = 0
        # llama-server renders special tokens (<|im_start|>, ...) as empty text.
        eq = lambda x, y: x == y or (y == "" and x.startswith("<|") and x.endswith("|>"))
        while n < min(len(ta), len(tb)) and eq(ta[n], tb[n]):
            n += 1
        # Under ignore_eos llama.cpp masks end-of-generation tokens; slotlight samples them:
        # the continuations agree up to the first one.
        eog = n < len(ta) and ta[n] in ("<|endoftext|>", "<|im_end|>")
        same += n == N or eog
        # Log-probabilities of the top tokens at each step where the prefixes agree.
        for i in range(n):
            la = a["choices"][0]["logprobs"]["top_logprobs"][i]
            if any(t in ("<|endoftext|>", "<|im_end|>") for t in la):
                continue  # llama.cpp's masked end-of-generation tokens shift every log-probability
            lb = {t["token"]: t["logprob"] for t in b["completion_probabilities"][i]["top_logprobs"]}
            for tok, lp in la.items():
                if tok.startswith("<|"):
                    tok = ""
                if tok in lb and lp > -10:
                    worst = max(worst, abs(lp - lb[tok]))
        print(f"prompt {p}: {n}/{N} greedy tokens equal{' (then our end-of-generation token)' if eog else ''}; ours {''.join(ta)!r} theirs {''.join(tb)!r}")
    print(f"{same}/{len(prompts)} continuations equal; worst difference of the top-5 log-probabilities above -10 {worst:.2e}")
finally:
    ours.terminate(); theirs.terminate(); ours.wait(); theirs.wait()
