#!/usr/bin/env bash
# GPU check of slotlight's CUDA backend, in one go (about 5 minutes on an H200, build included):
#   1. build slotlight-engine in release with --features cuda (or use prebuilt binaries),
#   2. nvidia-smi and the CUDA libraries found,
#   3. the parity tests (engine/tests/cuda_parity.rs) on the GPU,
#   4. benchmarks: prefill at 512 tokens, decode at batch 1 (graphs off and on), aggregate decode
#      at 8, 32 and 64 concurrent requests,
#   5. the same model in PyTorch (transformers loading the GGUF) for a side-by-side ratio,
#   6. a short table, printed last and written to $OUT/gpu-check.md.
#
# On a GPU machine, from the repo root:
#   scripts/gpu-check.sh
# On a machine without a GPU (or without Rust on the GPU machine), first:
#   scripts/gpu-check.sh --prepare
# which builds the binaries into .gpu/bin, splits the default model into .gpu/model-*/ parts small
# enough to carry, and downloads the gguf wheel into .gpu/whl (docs/gpu.md, "GPU run").
#
# Environment: SLOTLIGHT_MODEL (the GGUF; default: the engine's cache, else .gpu/model-*/ parts),
# OUT (where logs and the table go; default .gpu/out), CHECK_SECONDS (overall budget, 560).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
GPU=.gpu
START=$(date +%s)
BUDGET=${CHECK_SECONDS:-560}
left() { echo $((BUDGET - ($(date +%s) - START))); }
say() { printf '\n== %s (%ss left)\n' "$*" "$(left)"; }

model_default() {
    if [ -n "${SLOTLIGHT_MODEL:-}" ]; then echo "$SLOTLIGHT_MODEL"; return; fi
    local c="${SLOTLIGHT_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/slotlight/models}/SmolLM2-135M-Instruct.Q4_1.gguf"
    echo "$c"
}

# ---------------------------------------------------------------------------------------------
if [ "${1:-}" = "--prepare" ]; then
    set -e
    grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
    mkdir -p "$GPU/bin" "$GPU/whl"
    export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
    cargo build --release -p slotlight-engine --features cuda
    cp "$CARGO_TARGET_DIR/release/slotlight-engine" "$GPU/bin/"
    exe=$(cargo test --release -p slotlight-engine --features cuda --test cuda_parity --no-run \
        --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "cuda_parity":
        print(m["executable"])')
    cp "$exe" "$GPU/bin/cuda_parity"
    strip "$GPU/bin/"* 2>/dev/null || true
    m=$(model_default)
    [ -f "$m" ] || m=$(cargo run --release -q -p slotlight-engine --features cuda -- fetch-model)
    rm -rf "$GPU"/model-*
    # Three parts: each fits one carried folder (64 MiB per call with the working tree).
    size=$(stat -c %s "$m")
    part=$(( (size + 2) / 3 + 1 ))
    tmp=$(mktemp -d)
    split -b "$part" -d -a 1 "$m" "$tmp/part-"
    for i in 0 1 2; do mkdir -p "$GPU/model-$i"; mv "$tmp/part-$i" "$GPU/model-$i/"; done
    sha256sum "$m" | cut -d' ' -f1 > "$GPU/model-2/sha256"
    rmdir "$tmp"
    python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$GPU/whl" 'gguf==0.19.0' \
        || echo "could not download the gguf wheel: the PyTorch column will be skipped" >&2
    du -sh "$GPU"/* >&2
    # The engine and a model part together stay under one call's 64 MiB, and so do the parity
    # binary, the last part and the wheel: each binary travels with a part of its own.
    echo "prepared: carry .gpu/model-0 .gpu/bin/slotlight-engine, then .gpu/model-1, then .gpu/model-2 .gpu/bin/cuda_parity .gpu/whl (docs/gpu.md)" >&2
    exit 0
fi

# ---------------------------------------------------------------------------------------------
OUTDIR=${OUT:-$GPU/out}
mkdir -p "$OUTDIR"
exec > >(tee "$OUTDIR/gpu-check.log") 2>&1

say "GPU and CUDA libraries"
nvidia-smi || echo "nvidia-smi failed"
# CUDA 13 user-space libraries: the toolkit, else the wheels PyTorch ships with.
libdirs=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/nvidia/lib64; do
    [ -d "$d" ] && libdirs="$libdirs:$d"
done
if command -v python3 >/dev/null; then
    for lib in libnvrtc.so.13 libcublas.so.13; do
        f=$(python3 - "$lib" <<'PY' 2>/dev/null
import sys, site, glob, os
for s in site.getsitepackages() + [site.getusersitepackages()]:
    for p in glob.glob(os.path.join(s, "nvidia", "**", sys.argv[1]), recursive=True):
        print(os.path.dirname(p)); sys.exit(0)
PY
)
        [ -n "$f" ] && libdirs="$libdirs:$f"
    done
fi
export LD_LIBRARY_PATH="${libdirs#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
for lib in libcuda.so.1 libnvrtc.so.13 libcublas.so.13 libcublasLt.so.13; do
    found=no
    for d in ${LD_LIBRARY_PATH//:/ } /usr/lib/x86_64-linux-gnu /usr/lib64; do
        [ -e "$d/$lib" ] && { found="$d/$lib"; break; }
    done
    echo "$lib: $found"
done

say "Build"
BIN=""; PARITY=""
if [ -x "$GPU/bin/slotlight-engine" ] && [ -x "$GPU/bin/cuda_parity" ]; then
    BIN="$GPU/bin/slotlight-engine"; PARITY="$GPU/bin/cuda_parity"
    echo "using prebuilt binaries in $GPU/bin"
elif command -v cargo >/dev/null; then
    export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
    timeout $(( $(left) / 2 )) cargo build --release -p slotlight-engine --features cuda \
        && BIN="$CARGO_TARGET_DIR/release/slotlight-engine"
    PARITY=cargo
else
    echo "no cargo and no prebuilt binaries: run scripts/gpu-check.sh --prepare on a build machine"
fi

MODEL=$(model_default)
if [ ! -f "$MODEL" ] && ls "$GPU"/model-*/part-* >/dev/null 2>&1; then
    MODEL=/tmp/slotlight-model/SmolLM2-135M-Instruct.Q4_1.gguf
    mkdir -p "$(dirname "$MODEL")"
    cat "$GPU"/model-0/part-* "$GPU"/model-1/part-* "$GPU"/model-2/part-* > "$MODEL"
    want=$(cat "$GPU/model-2/sha256" 2>/dev/null || true)
    got=$(sha256sum "$MODEL" | cut -d' ' -f1)
    [ -z "$want" ] || [ "$want" = "$got" ] || { echo "model parts do not match (sha256)"; rm -f "$MODEL"; }
fi
[ -f "$MODEL" ] && echo "model: $MODEL" || { echo "model: missing ($MODEL)"; MODEL=""; }
export SLOTLIGHT_MODEL="$MODEL" SLOTLIGHT_ENGINE_DIR="$ROOT/engine" SLOTLIGHT_REQUIRE_GPU=1
[ -n "$MODEL" ] && export SLOTLIGHT_REQUIRE_MODEL=1

say "Parity tests (GPU against the CPU backend)"
PARITY_RESULT=skipped
if [ "$PARITY" = cargo ]; then
    timeout $(( $(left) / 3 )) cargo test --release -p slotlight-engine --features cuda \
        --test cuda_parity -- --nocapture --test-threads 1 && PARITY_RESULT=passed || PARITY_RESULT=FAILED
elif [ -n "$PARITY" ]; then
    timeout 240 "$PARITY" --nocapture --test-threads 1 && PARITY_RESULT=passed || PARITY_RESULT=FAILED
fi

say "slotlight benchmarks"
if [ -n "$BIN" ] && [ -n "$MODEL" ]; then
    timeout 200 "$BIN" bench --device cuda --model "$MODEL" --prompt-tokens 512 --gen-tokens 128 \
        --reps 3 --concurrency 8,32,64 --json > "$OUTDIR/bench.json" \
        || echo "bench failed"
    cat "$OUTDIR/bench.json" 2>/dev/null
    SLOTLIGHT_CUDA_GRAPHS=1 timeout 60 "$BIN" bench --device cuda --model "$MODEL" \
        --prompt-tokens 16 --gen-tokens 256 --reps 3 --json > "$OUTDIR/bench-graphs.json" \
        || echo "bench with graphs failed"
    cat "$OUTDIR/bench-graphs.json" 2>/dev/null
    "$BIN" bench --device cuda --model "$MODEL" --prompt-tokens 16 --gen-tokens 4 --reps 1 2>&1 \
        | head -1
fi

say "PyTorch (transformers on the same GGUF)"
if [ -n "$MODEL" ] && [ "$(left)" -gt 60 ] && command -v python3 >/dev/null; then
    if ! python3 -c 'import gguf' 2>/dev/null && ls "$GPU"/whl/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/slotlight-site \
            "$GPU"/whl/*.whl && export PYTHONPATH=/tmp/slotlight-site${PYTHONPATH:+:$PYTHONPATH}
    fi
    PYTHONUNBUFFERED=1 timeout $(( $(left) - 20 )) python3 - "$MODEL" "$OUTDIR/torch.json" <<'PY' \
        || echo "PyTorch run failed or timed out"
import json, os, sys, time
import torch
from transformers import AutoModelForCausalLM

path, out = sys.argv[1], sys.argv[2]
model = AutoModelForCausalLM.from_pretrained(
    os.path.dirname(path), gguf_file=os.path.basename(path), torch_dtype=torch.bfloat16
).cuda().eval()
res = {"dtype": "bfloat16", "torch": torch.__version__}
sync = torch.cuda.synchronize

@torch.inference_mode()
def prefill(n):
    ids = torch.randint(100, 20000, (1, n), device="cuda")
    model(ids); sync()
    times = []
    for _ in range(3):
        t = time.perf_counter(); model(ids); sync(); times.append(time.perf_counter() - t)
    return n / sorted(times)[1]

@torch.inference_mode()
def decode(batch, steps):
    ids = torch.randint(100, 20000, (batch, 32), device="cuda")
    o = model(ids, use_cache=True)
    past, nxt = o.past_key_values, o.logits[:, -1:].argmax(-1)
    sync(); t = time.perf_counter()
    for _ in range(steps):
        o = model(nxt, past_key_values=past, use_cache=True)
        past, nxt = o.past_key_values, o.logits[:, -1:].argmax(-1)
    sync()
    return batch * steps / (time.perf_counter() - t)

res["prefill_512"] = prefill(512)
decode(1, 8)
res["decode_1"] = decode(1, 128)
for b in (8, 32, 64):
    res[f"decode_{b}"] = decode(b, 64)
json.dump(res, open(out, "w"))
print(json.dumps(res))
PY
else
    echo "skipped"
fi

say "Summary"
python3 - "$OUTDIR" "$PARITY_RESULT" <<'PY' | tee "$OUTDIR/gpu-check.md"
import json, os, sys
d, parity = sys.argv[1], sys.argv[2]
def load(n):
    try:
        return json.load(open(os.path.join(d, n)))
    except Exception:
        return {}
b, g, t = load("bench.json"), load("bench-graphs.json"), load("torch.json")
def med(x):
    return x.get("median") if isinstance(x, dict) else None
ours = {}
for p in b.get("prefill_tps", []):
    if p.get("prompt_tokens") == 512:
        ours["prefill_512"] = med(p.get("tps"))
ours["decode_1"] = med(b.get("decode_tps"))
ours["decode_1_graphs"] = med(g.get("decode_tps"))
for c in b.get("concurrency", []):
    ours[f"decode_{c['concurrency']}"] = med(c.get("aggregate_tps"))
rows = [
    ("prefill 512 tokens (tok/s)", "prefill_512", 50000),
    ("decode batch 1 (tok/s)", "decode_1", 1000),
    ("decode batch 1, CUDA graphs (tok/s)", "decode_1_graphs", 1000),
    ("aggregate decode, 8 concurrent (tok/s)", "decode_8", None),
    ("aggregate decode, 32 concurrent (tok/s)", "decode_32", None),
    ("aggregate decode, 64 concurrent (tok/s)", "decode_64", 20000),
]
f = lambda v: "-" if v is None else f"{v:,.0f}"
print(f"parity tests: {parity}")
print("| measure | slotlight | PyTorch bf16 | ratio | target |")
print("|---|---:|---:|---:|---:|")
for label, key, target in rows:
    o, p = ours.get(key), t.get(key.replace("_graphs", ""))
    r = f"{o / p:.1f}x" if o and p else "-"
    ok = "" if target is None or o is None else (" ok" if o >= target else " MISSED")
    print(f"| {label} | {f(o)} | {f(p)} | {r} | {f(target)}{ok} |")
PY
echo "total: $(( $(date +%s) - START )) s"
