"""Greedy continuations: slotlight-engine generate --json against llama-server /completion on the
same GGUF files. Prints, per file and prompt, whether the generated text is equal, and where it
first differs."""
import json, subprocess, sys, time, urllib.request, os, socket

ENGINE = sys.argv[1]
SERVER = sys.argv[2]
files = sys.argv[3:]
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, there was a",
           "1, 2, 3, 4, 5,", "The three primary colors are"]
N = 32

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

def llama(path):
    port = free_port()
    proc = subprocess.Popen([SERVER, "-m", path, "--port", str(port), "--host", "127.0.0.1", "-t", "2",
                             "-c", "2048", "-np", "1", "--no-warmup"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = {}
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1); break
            except Exception:
                time.sleep(0.5)
        for p in PROMPTS:
            body = json.dumps({"prompt": p, "n_predict": N, "temperature": 0, "top_k": 1, "cache_prompt": False,
                               "return_tokens": True, "n_probs": 2}).encode()
            r = urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/completion", body,
                                                              {"Content-Type": "application/json"}), timeout=120)
            j = json.loads(r.read())
            out[p] = (j["content"], j.get("tokens"), j.get("completion_probabilities"))
    finally:
        proc.terminate(); proc.wait()
    return out

def ours(path, p):
    r = subprocess.run([ENGINE, "generate", "--model", path, "--prompt", p, "--max-tokens", str(N), "--json",
                        "--ignore-eos", "--threads", "2"], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        return None, r.stderr.strip().splitlines()[-1:]
    j = json.loads(r.stdout)
    return j.get("text", j.get("content")), j

total = same = 0
for f in files:
    ref = llama(f)
    for p in PROMPTS:
        text, j = ours(f, p)
        want, toks, probs = ref[p]
        total += 1
        if text is None:
            print(f"{os.path.basename(f)} | {p!r}: ENGINE FAILED {j}"); continue
        if text.startswith(want) or want.startswith(text) and len(text) >= len(want):
            same += 1; print(f"{os.path.basename(f)} | {p!r}: equal ({len(want)} chars)")
        else:
            i = next((k for k in range(min(len(text), len(want))) if text[k] != want[k]), min(len(text), len(want)))
            # near-tie at the first differing token?
            gap = None
            if probs:
                acc = ""
                for tp in probs:
                    if len(acc) + len(tp.get("token", "")) > i:
                        top = tp.get("top_logprobs") or tp.get("top_probs") or tp.get("probs") or []
                        if len(top) >= 2:
                            key = "logprob" if "logprob" in top[0] else "prob"
                            gap = round(top[0][key] - top[1][key], 3)
                            gap = (gap, top[0].get("token"), top[1].get("token"))
                        break
                    acc += tp.get("token", "")
            print(f"{os.path.basename(f)} | {p!r}: DIFFER at char {i}, llama.cpp top-2 prob gap there {gap}\n   ours:  {text[:i+30]!r}\n   llama: {want[:i+30]!r}")
print(f"{same}/{total} equal")
