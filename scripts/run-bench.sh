#!/usr/bin/env bash
# Runs every benchmark binary of a build folder and keeps the JSON next to it.
# usage: scripts/run-bench.sh BUILD_DIR [extra google-benchmark flags]
set -euo pipefail
build=${1:-build/release}
shift || true
mkdir -p "$build/bench-results"
found=0
for b in "$build"/bench/bench_*; do
  [ -x "$b" ] || continue
  found=1
  name=$(basename "$b")
  echo "== $name"
  "$b" --benchmark_out="$build/bench-results/$name.json" --benchmark_out_format=json "$@"
done
[ $found -eq 1 ] || { echo "no benchmarks built in $build/bench" >&2; exit 1; }
