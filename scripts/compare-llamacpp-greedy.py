#!/usr/bin/env python3
"""Greedy continuations and top log-probabilities of one GGUF file, slotlight against llama-server
(issue 38: a new family checked against llama.cpp on small random-weight files).

    python3 scripts/compare-llamacpp-greedy.py MODEL.gguf SLOTLIGHT_ENGINE LLAMA_SERVER

Both servers run the file on 127.0.0.1 (ports 18411 and 18412) with 2 threads; three prompts of
token ids are continued greedily for 24 tokens (ignoring end-of-generation), and the script prints,
per prompt, how many tokens agree and, over the steps where both agree, the worst difference of the
top-5 log-probabilities above -10. llama-server renders special tokens as empty text and masks
end-of-generation tokens under `ignore_eos` (slotlight samples them): a continuation counts as
equal up to slotlight's first end-of-generation token, and steps whose top 5 hold one are left out
of the log-probability comparison. The tiny `qwen3moe` file comes from
`cargo test -p slotlight-engine --test moe -- --ignored write_the_llamacpp_comparison_file`.
"""
import json
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

def wait(url):
    for _ in range(600):
        try:
            urllib.request.urlopen(url, timeout=2); return
        except Exception:
            time.sleep(0.2)
    raise SystemExit(f"{url} never came up")

ours = subprocess.Popen([engine, "serve", "--model", model, "--host", "127.0.0.1", "--port", "18411", "--threads", "2"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
theirs = subprocess.Popen([server, "-m", model, "--host", "127.0.0.1", "--port", "18412", "-t", "2", "-c", "256", "--no-warmup"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
try:
    wait("http://127.0.0.1:18411/health"); wait("http://127.0.0.1:18412/health")
    same = 0; worst = 0.0
    for p in prompts:
        a = post("http://127.0.0.1:18411/v1/completions", {"prompt": p, "max_tokens": N, "temperature": 0,
                  "ignore_eos": True, "logprobs": 5})
        b = post("http://127.0.0.1:18412/completion", {"prompt": p, "n_predict": N, "temperature": 0, "top_k": 1,
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
