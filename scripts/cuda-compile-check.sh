#!/usr/bin/env bash
# Compiles every CUDA kernel with NVRTC for sm_90 and assembles it with ptxas -v, printing
# registers, shared memory and spills per kernel. Needs no GPU: NVRTC and ptxas come from the
# CUDA 13.0 wheels (nvidia-cuda-nvrtc, nvidia-cuda-nvcc), installed into the project venv.
#
#   scripts/cuda-compile-check.sh            # uses .venv at the repo root (created if missing)
#   VENV=/some/venv scripts/cuda-compile-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PIN='13.0.*'
PY="$VENV/bin/python"
[ -x "$PY" ] || python3 -m venv "$VENV"

have_13_0() {
    "$PY" - <<'PY' 2>/dev/null
import importlib.metadata as m, sys
ok = all(m.version(p).startswith("13.0.") for p in ("nvidia-cuda-nvrtc", "nvidia-cuda-nvcc"))
sys.exit(0 if ok else 1)
PY
}
if ! have_13_0; then
    echo "installing NVRTC and ptxas (CUDA 13.0 wheels) into $VENV" >&2
    # nvidia-cuda-nvcc pulls crt/nvvm/runtime: pin them to the same line.
    "$PY" -m pip install --quiet \
        "nvidia-cuda-nvrtc==$PIN" "nvidia-cuda-nvcc==$PIN" \
        "nvidia-cuda-crt==$PIN" "nvidia-nvvm==$PIN" "nvidia-cuda-runtime==$PIN"
fi

SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
NVRTC=$(find "$SITE/nvidia" -name 'libnvrtc.so.13' -print -quit)
PTXAS=$(find "$SITE/nvidia" -name ptxas -type f -print -quit)
if [ -z "$NVRTC" ] || [ -z "$PTXAS" ]; then
    echo "libnvrtc.so.13 or ptxas not found under $SITE/nvidia" >&2
    exit 1
fi
chmod +x "$PTXAS" 2>/dev/null || true
echo "NVRTC: $NVRTC" >&2
echo "ptxas: $("$PTXAS" --version | tail -1)" >&2

export SLOTLIGHT_NVRTC_LIB_DIR
SLOTLIGHT_NVRTC_LIB_DIR=$(dirname "$NVRTC")
export SLOTLIGHT_PTXAS="$PTXAS"
# cudarc opens libnvrtc.so.13 with dlopen, which searches LD_LIBRARY_PATH.
export LD_LIBRARY_PATH="$SLOTLIGHT_NVRTC_LIB_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

exec cargo test -p slotlight-engine --features cuda --test cuda_compile -- --nocapture
