"""First-token top-5 log-probabilities: slotlight-engine serve (/v1/completions, logprobs=5)
against llama-server (/completion, n_probs=5) on the same GGUF files, for several prompts.
Prints the largest difference of a shared top-5 token's log-probability and whether the top-1
agrees (or is a near-tie: llama.cpp's own top-2 gap below 0.1 nats)."""
import json, subprocess, sys, time, urllib.request, os, socket

ENGINE, SERVER, files = sys.argv[1], sys.argv[2], sys.argv[3:]
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, there was a",
           "1, 2, 3, 4, 5,", "The three primary colors are", "In 1492, Columbus",
           "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"]

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

def wait(url):
    for _ in range(240):
        try:
            urllib.request.urlopen(url, timeout=1); return
        except Exception:
            time.sleep(0.5)
    raise SystemExit(f"no answer from {url}")

def post(url, body):
    r = urllib.request.urlopen(urllib.request.Request(url, json.dumps(body).encode(),
                                                      {"Content-Type": "application/json"}), timeout=300)
    return json.loads(r.read())

def run(cmd, health):
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait(health)
    return p

worst_all = 0.0
for f in files:
    lp, sp = free_port(), free_port()
    ll = run([SERVER, "-m", f, "--port", str(lp), "--host", "127.0.0.1", "-t", "2", "-c", "1024", "-np", "1"],
             f"http://127.0.0.1:{lp}/health")
    ref = {}
    try:
        for p in PROMPTS:
            j = post(f"http://127.0.0.1:{lp}/completion", {"prompt": p, "n_predict": 1, "n_probs": 5,
                     "temperature": 0, "cache_prompt": False, "post_sampling_probs": False})
            ref[p] = {t["token"]: t["logprob"] for t in j["completion_probabilities"][0]["top_logprobs"]}
    finally:
        ll.terminate(); ll.wait()
    sl = run([ENGINE, "serve", "--model", f, "--port", str(sp), "--threads", "2"], f"http://127.0.0.1:{sp}/health")
    try:
        worst, agree, ties = 0.0, 0, 0
        model = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{sp}/v1/models").read())["data"][0]["id"]
        for p in PROMPTS:
            j = post(f"http://127.0.0.1:{sp}/v1/completions", {"model": model, "prompt": p, "max_tokens": 1,
                     "temperature": 0, "logprobs": 5})
            ours = j["choices"][0]["logprobs"]["top_logprobs"][0]
            want = ref[p]
            shared = set(ours) & set(want)
            d = max((abs(ours[t] - want[t]) for t in shared), default=float("nan"))
            worst = max(worst, d)
            top_w = max(want, key=want.get); top_o = max(ours, key=ours.get)
            srt = sorted(want.values(), reverse=True)
            if top_w == top_o:
                agree += 1
            elif srt[0] - srt[1] < 0.1:
                ties += 1
            else:
                print(f"  {os.path.basename(f)} {p!r}: top-1 {top_o!r} vs llama.cpp {top_w!r} (gap {srt[0]-srt[1]:.3f})")
        worst_all = max(worst_all, worst)
        print(f"{os.path.basename(f)}: top-1 equal {agree}/{len(PROMPTS)} (+{ties} near-ties), "
              f"largest top-5 log-prob difference {worst:.3f}", flush=True)
    finally:
        sl.terminate(); sl.wait()
print(f"worst {worst_all:.3f}")
