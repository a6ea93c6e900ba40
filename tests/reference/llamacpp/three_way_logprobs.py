# Usage: three_way_logprobs.py ENGINE LLAMA_SERVER FILE PROMPT "$(f32_reference_logits.py FILE IDS)"
# Top-5 next-token log-probabilities of the float32 reference, slotlight and llama.cpp side by side.
import json, subprocess, sys, time, urllib.request
ENGINE, SERVER, f, prompt, refjson = sys.argv[1:6]
ref = {int(k): v for k, v in json.loads(refjson).items()}
def post(u, b): return json.loads(urllib.request.urlopen(urllib.request.Request(u, json.dumps(b).encode(), {"Content-Type": "application/json"}), timeout=300).read())
def wait(u):
    for _ in range(200):
        try: urllib.request.urlopen(u, timeout=1); return
        except Exception: time.sleep(0.5)
p = subprocess.Popen([ENGINE, "serve", "--model", f, "--port", "18601", "--threads", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
wait("http://127.0.0.1:18601/health")
model = json.loads(urllib.request.urlopen("http://127.0.0.1:18601/v1/models").read())["data"][0]["id"]
names = {i: post("http://127.0.0.1:18601/detokenize", {"tokens": [i]})["prompt"] for i in ref}
ours = post("http://127.0.0.1:18601/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0, "logprobs": 5})["choices"][0]["logprobs"]["top_logprobs"][0]
p.terminate(); p.wait()
q = subprocess.Popen([SERVER, "-m", f, "--port", "18602", "--host", "127.0.0.1", "-t", "2", "-c", "512"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
wait("http://127.0.0.1:18602/health")
j = post("http://127.0.0.1:18602/completion", {"prompt": prompt, "n_predict": 1, "n_probs": 5, "temperature": 0, "cache_prompt": False})
ll = {t["id"]: t["logprob"] for t in j["completion_probabilities"][0]["top_logprobs"]}
q.terminate(); q.wait()
print("token        f32-ref   ours   llama.cpp")
for i, v in ref.items():
    print(f"{names[i]!r:12} {v:7.3f} {ours.get(names[i], float('nan')):7.3f} {ll.get(i, float('nan')):7.3f}")
d_o = max(abs(ours[names[i]] - v) for i, v in ref.items() if names[i] in ours)
d_l = max(abs(ll[i] - v) for i, v in ref.items() if i in ll)
print(f"largest difference from the f32 reference: ours {d_o:.3f}, llama.cpp {d_l:.3f}")
