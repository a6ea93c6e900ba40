#!/usr/bin/env bash
# Speculative decoding side by side: slotlight-engine serve with drafts (`--speculative ngram`)
# and without (`off`), and llama.cpp's llama-server without drafts and with each of its n-gram
# types, on the same GGUF file, threads and prompts (prompts.json), one server at a time, each
# driven by serve_bench.py (completion tokens per second, end to end, greedy). Prints one table
# per model; the figures go in docs/performance.md ("Speculative decoding").
#
# Usage: compare.sh LLAMA_SERVER MODEL.gguf [MODEL.gguf ...]
#   LLAMA_SERVER  a llama-server binary with --spec-type ngram-* (an October 2026 build or newer)
#   ROUNDS=3 THREADS=$(nproc) SLOTLIGHT_ENGINE=target/release/slotlight-engine PORT=18431
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
llama=${1:?usage: compare.sh LLAMA_SERVER MODEL.gguf [...]}
shift
engine=${SLOTLIGHT_ENGINE:-$root/target/release/slotlight-engine}
rounds=${ROUNDS:-3}
threads=${THREADS:-$(nproc)}
port=${PORT:-18431}
py=${PYTHON:-python3}
out=$(mktemp -d)
pid=""
stop() { [[ -n $pid ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; pid=""; }
trap 'stop; rm -rf "$out"' EXIT

wait_up() {
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && return 0
    kill -0 "$pid" 2>/dev/null || { echo "server exited:"; tail -20 "$out/server.log"; return 1; }
    sleep 0.5
  done
  echo "server never answered"; return 1
}

run() { # label, then the server's command line
  local label=$1; shift
  "$@" >"$out/server.log" 2>&1 &
  pid=$!
  wait_up
  "$py" "$here/serve_bench.py" "http://127.0.0.1:$port" --rounds "$rounds" --label "$label" \
    --json "$out/$label.json"
  stop
}

echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); threads $threads;" \
  "flags: $(grep -m1 -o -w -E 'avx512_vnni|avx_vnni' /proc/cpuinfo | sort -u | xargs || true) $(grep -m1 -o -w avx2 /proc/cpuinfo | head -1)"
for model in "$@"; do
  name=$(basename "$model" .gguf)
  echo "== $name"
  run "slotlight-ngram" "$engine" serve --model "$model" --host 127.0.0.1 --port "$port" \
    --threads "$threads" --ctx-size 4096 --speculative ngram --responses-db :memory:
  run "slotlight-off" "$engine" serve --model "$model" --host 127.0.0.1 --port "$port" \
    --threads "$threads" --ctx-size 4096 --speculative off --responses-db :memory:
  run "llama-none" "$llama" -m "$model" --host 127.0.0.1 --port "$port" -t "$threads" -c 4096 -np 1
  for t in ngram-simple ngram-map-k ngram-map-k4v ngram-mod ngram-cache; do
    run "llama-$t" "$llama" -m "$model" --host 127.0.0.1 --port "$port" -t "$threads" -c 4096 \
      -np 1 --spec-type "$t"
  done
  "$py" - "$out" <<'PY'
import json, sys, pathlib
d = pathlib.Path(sys.argv[1])
runs = {p.stem: {r["name"]: r for r in json.loads(p.read_text())["rows"]} for p in d.glob("*.json")}
names = list(runs["slotlight-ngram"])
best = {}
for n in names:
    spec = {k: v[n]["tps"] for k, v in runs.items() if k.startswith("llama-ngram")}
    best[n] = max(spec.items(), key=lambda kv: kv[1])
print(f"{'prompt':<11}{'sl ngram':>10}{'sl off':>9}{'ll none':>9}{'ll best':>9} {'(type)':<16}"
      f"{'vs ll best':>11}{'vs own off':>11}  same reply  accepted")
for n in names:
    s, o, l = runs["slotlight-ngram"][n], runs["slotlight-off"][n], runs["llama-none"][n]
    bt, bv = best[n]
    print(f"{n:<11}{s['tps']:>10.1f}{o['tps']:>9.1f}{l['tps']:>9.1f}{bv:>9.1f} {bt[6:]:<16}"
          f"{s['tps'] / bv:>10.2f}x{s['tps'] / o['tps']:>10.2f}x  {str(s['reply'] == o['reply']):<10}  "
          f"{s['accepted']}/{s['drafted']}")
for p in d.glob("*.json"):
    p.unlink()
PY
done
