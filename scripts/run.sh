#!/usr/bin/env bash
# The main job: builds slotlight, fetches the default model when missing, starts the engine and
# the sidecar wired together (the engine exports its spans to the sidecar), waits until both
# answer, and prints where to look. Ctrl-C stops both, the engine first: it gets SIGTERM, drains
# the requests in flight (--drain-timeout-s) and exports their last spans, and only once it has
# exited does the sidecar get SIGTERM, so those spans still find it. The two run in process
# groups of their own, so the terminal's Ctrl-C reaches this script alone, which orders the stop.
#
# Ports (override with environment variables): engine API SLOTLIGHT_PORT (8080); sidecar views
# SIDECAR_PORT (9464), OTLP/gRPC SIDECAR_OTLP_GRPC_PORT (4317), OTLP/HTTP SIDECAR_OTLP_HTTP_PORT
# (4318). Extra engine flags: SLOTLIGHT_ENGINE_ARGS (for example "--batch 4 --device cpu").
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-$(pwd)/target}
port=${SLOTLIGHT_PORT:-8080}
views=${SIDECAR_PORT:-9464}
grpc=${SIDECAR_OTLP_GRPC_PORT:-4317}
http=${SIDECAR_OTLP_HTTP_PORT:-4318}

echo "==> building (release)"
cargo build --release --locked -p slotlight-engine -p slotlight-sidecar

echo "==> default model"
model=$("$target/release/slotlight-engine" fetch-model)

sidecar=
engine=
# Stops one process: SIGTERM, then wait until it has exited.
stop_one() {
  [[ -n $1 ]] || return 0
  kill -TERM "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}
stop() {
  local rc=${1:-0}
  # A second Ctrl-C must not cut the stop short and leave the sidecar running: the engine's
  # drain is bounded by its --drain-timeout-s.
  trap '' INT TERM
  trap - EXIT
  echo
  echo "==> stopping the engine (it drains its requests), then the sidecar"
  stop_one "$engine"
  stop_one "$sidecar"
  exit "$rc"
}
trap stop INT TERM EXIT

# Job control on while starting them: each gets a process group of its own, out of the
# terminal's reach (see the header).
set -m
"$target/release/slotlight-sidecar" \
  --otlp-grpc "127.0.0.1:$grpc" --otlp-http "127.0.0.1:$http" --listen "127.0.0.1:$views" &
sidecar=$!
# shellcheck disable=SC2086
"$target/release/slotlight-engine" serve --port "$port" --model "$model" \
  --otlp-endpoint "http://127.0.0.1:$grpc" ${SLOTLIGHT_ENGINE_ARGS:-} &
engine=$!
set +m
pids=("$sidecar" "$engine")

wait_for() {
  local url=$1 what=$2
  for _ in $(seq 1 600); do
    if python3 -c "import sys,urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" "$url" 2>/dev/null; then
      return 0
    fi
    for p in "${pids[@]}"; do
      kill -0 "$p" 2>/dev/null || { echo "error: $what exited" >&2; stop 1; }
    done
    sleep 0.2
  done
  echo "error: $what did not answer at $url" >&2
  stop 1
}
wait_for "http://127.0.0.1:$port/health" "the engine"
wait_for "http://127.0.0.1:$views/v1/slots" "the sidecar"

model_id=$(python3 -c "import json,sys,urllib.request; print(json.load(urllib.request.urlopen(sys.argv[1]))['data'][0]['id'])" "http://127.0.0.1:$port/v1/models")
cat <<MSG

slotlight is running.
  chat API      http://127.0.0.1:$port/v1/chat/completions   (OpenAI-compatible; model "$model_id")
  live page     http://127.0.0.1:$views/
  metrics       http://127.0.0.1:$views/metrics
  slots, turns  http://127.0.0.1:$views/v1/slots   http://127.0.0.1:$views/v1/turns

Try:
  curl -s http://127.0.0.1:$port/v1/chat/completions -H 'content-type: application/json' \\
    -d '{"messages":[{"role":"user","content":"Name the capital of France."}],"stream":true,"stream_options":{"include_usage":true}}'

Ctrl-C stops both: the engine first, then the sidecar once the engine has exited.
MSG
wait -n "${pids[@]}" || true
echo "error: the engine or the sidecar exited by itself" >&2
stop 1
