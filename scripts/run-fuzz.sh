#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz, clang) into build/fuzz and fuzzes
# each for FUZZ_SECONDS (default 60), one after the other, on a copy of its
# seed corpus under build/fuzz/corpus (the repository's corpus is never
# written). Prints one line per target: executions, coverage (cov, ft), and
# findings. Exit status 1 if any target found a crash, leak, timeout or OOM;
# the inputs that did are in build/fuzz/findings/<target>/.
# Usage: scripts/run-fuzz.sh [target ...]   (default: every target)
# Environment: FUZZ_SECONDS, FUZZ_JOBS (build parallelism, default 2),
# FUZZ_CXX (default clang++-14), FUZZ_BUILD (default build/fuzz), FUZZ_SEED
# (libFuzzer's -seed; 0, the default, draws one; CI fixes it so that a run
# explores the same inputs each time).
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_TARGET="${FUZZ_SECONDS:-60}"
SEED="${FUZZ_SEED:-0}"
JOBS="${FUZZ_JOBS:-2}"
CXX="${FUZZ_CXX:-clang++-14}"
BUILD="${FUZZ_BUILD:-build/fuzz}"
ALL_TARGETS=(safetensors model_config toml tokenizer chat_template jsonl serve_protocol math countdown rollout_wire)
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=("${ALL_TARGETS[@]}")

command -v "$CXX" >/dev/null || { echo "run-fuzz: $CXX not found (scripts/install-deps.sh installs clang-14)" >&2; exit 2; }
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(cd .. && pwd)}"
cmake -S tests/fuzz -B "$BUILD" -G Ninja -DCMAKE_CXX_COMPILER="$CXX" >/dev/null
cmake --build "$BUILD" -j "$JOBS" >/dev/null

# Inputs of the tokenizer's seeds hold a whole tokenizer.json.
max_len_of() {
  case "$1" in
    tokenizer|safetensors) echo 16384 ;;
    *) echo 8192 ;;
  esac
}

failed=0
printf '%-15s %12s %8s %8s %6s  %s\n' target execs cov ft secs result
for t in "${TARGETS[@]}"; do
  bin="$BUILD/fuzz_$t"
  [ -x "$bin" ] || { echo "run-fuzz: no target $t" >&2; exit 2; }
  work="$BUILD/corpus/$t"
  findings="$BUILD/findings/$t"
  rm -rf "$work" "$findings"
  mkdir -p "$work" "$findings"
  cp -r "tests/fuzz/corpus/$t/." "$work/"
  dict=()
  [ -f "tests/fuzz/dict/$t.dict" ] && dict=(-dict="tests/fuzz/dict/$t.dict")
  log="$BUILD/fuzz_$t.log"
  start=$(date +%s)
  rc=0
  # -timeout: an input taking over a second is a hang; -rss_limit_mb and
  # -malloc_limit_mb: a parser must refuse what would need more memory.
  "$bin" "$work" "${dict[@]}" -seed="$SEED" -max_total_time="$SECONDS_PER_TARGET" -timeout=1 -rss_limit_mb=2048 \
    -malloc_limit_mb=1024 -max_len="$(max_len_of "$t")" -artifact_prefix="$findings/" -print_final_stats=1 \
    >"$log" 2>&1 || rc=$?
  secs=$(( $(date +%s) - start ))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$( (grep -o 'cov: [0-9]*' "$log" || true) | tail -1 | cut -d' ' -f2)
  ft=$( (grep -o 'ft: [0-9]*' "$log" || true) | tail -1 | cut -d' ' -f2)
  found=$(find "$findings" -type f | wc -l)
  if [ "$rc" -ne 0 ] || [ "$found" -ne 0 ]; then
    result="FINDING (exit $rc; $found input(s) in $findings; log $log)"
    failed=1
  else
    result="ok"
  fi
  printf '%-15s %12s %8s %8s %6s  %s\n' "$t" "${execs:-?}" "${cov:-?}" "${ft:-?}" "$secs" "$result"
done
exit "$failed"
