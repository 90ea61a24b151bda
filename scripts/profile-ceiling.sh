#!/usr/bin/env bash
# Records where the pipeline's CPU goes at the ceiling: one `aptix-bench ceiling` run, a call-stack
# profile of the benchmark process for 10 s inside its pipeline half, and the shares of
# docs/benchmarks.md's table ("Where the pipeline's own CPU goes now") from it.
#
# Usage: scripts/profile-ceiling.sh [OUT_DIR]   (a release aptix-bench in $CARGO_TARGET_DIR or
#        target/, or APTIX_BENCH=path; perf from Debian's linux-perf package; run as root on a
#        quiet machine). Writes OUT_DIR/perf.data, OUT_DIR/perf.txt and prints the shares.
set -euo pipefail
cd "$(dirname "$0")/.."

out=${1:-/tmp/aptix-profile}
bench=${APTIX_BENCH:-${CARGO_TARGET_DIR:-target}/release/aptix-bench}
[ -x "$bench" ] || { echo "no $bench: cargo build --release -p aptix-bench" >&2; exit 1; }
command -v perf >/dev/null || { echo "perf not found: apt-get install linux-perf" >&2; exit 1; }
mkdir -p "$out"

RUST_LOG=warn "$bench" ceiling --runs 1 --json "$out/ceiling.json" >"$out/ceiling.log" 2>&1 &
pid=$!
# The relay side runs first: setup, 3 s of warm-up and 20 s counted; the pipeline's counted
# window starts about 36 s in.
sleep 36
perf record -F 249 --call-graph dwarf,32768 -p "$pid" -o "$out/perf.data" -- sleep 10 \
  >"$out/perf.log" 2>&1
wait "$pid"
# Unwinding the dwarf stacks takes a minute or two.
perf script -i "$out/perf.data" >"$out/perf.txt" 2>/dev/null
python3 scripts/stack-shares.py "$out/perf.txt"
