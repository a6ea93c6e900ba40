#!/usr/bin/env bash
# Builds the fuzz targets with cargo-fuzz and runs each for a bounded time on its committed
# corpus (new inputs go to a scratch folder; the committed corpus is only read), with an
# rss limit and a per-input timeout. Any crash, leak of the rss limit or hang fails the run;
# its reproducer is left in fuzz/artifacts/<target>/.
#
#   fuzz/run.sh SECONDS [TARGET...]       # CI: fuzz/run.sh 20; by hand: fuzz/run.sh 600
#
# Needs cargo-fuzz (`cargo install cargo-fuzz --locked`). On a stable toolchain the
# sanitizer flags need RUSTC_BOOTSTRAP=1, which this script sets. FUZZ_SANITIZER picks the
# sanitizer (default: address; `none` builds faster). The `prompt` target uses
# $SLOTLIGHT_MODEL when set (the default SmolLM2 GGUF), else a tiny synthetic model.
# FUZZ_MERGE=1 (long runs by hand) merges what a clean run found into the committed corpus,
# minimized by libFuzzer's -merge=1.
set -euo pipefail
cd "$(dirname "$0")"
seconds=${1:?usage: fuzz/run.sh SECONDS [TARGET...]}
shift
targets=("$@")
if ((${#targets[@]} == 0)); then
  targets=(request responses messages prompt gguf otlp_proto otlp_json gzip assembly)
fi
export RUSTC_BOOTSTRAP=1
sanitizer=${FUZZ_SANITIZER:-address}
target_dir=${CARGO_TARGET_DIR:-target}
triple=$(rustc -vV | sed -n 's/^host: //p')
cargo fuzz build -O -s "$sanitizer" --target-dir "$target_dir"
bin_dir="$target_dir/$triple/release"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:allocator_may_return_null=1}
status=0
for t in "${targets[@]}"; do
  scratch=$(mktemp -d)
  mkdir -p "artifacts/$t" "corpus/$t"
  echo "==> fuzz $t for ${seconds}s"
  if ! "$bin_dir/$t" "$scratch" "corpus/$t" \
      -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=2048 -timeout=10 \
      -max_len=65536 -print_final_stats=1 -artifact_prefix="artifacts/$t/" 2>"artifacts/$t/log.txt"; then
    status=1
    echo "!! $t failed; last lines of artifacts/$t/log.txt:"
    tail -40 "artifacts/$t/log.txt"
  else
    grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb|^Done" "artifacts/$t/log.txt" | tr '\n' ' '
    echo
    if [[ ${FUZZ_MERGE:-0} == 1 ]]; then
      "$bin_dir/$t" -merge=1 -rss_limit_mb=2048 -timeout=10 -max_len=65536 "corpus/$t" "$scratch" 2>>"artifacts/$t/log.txt"
    fi
  fi
  rm -rf "$scratch"
done
exit $status
