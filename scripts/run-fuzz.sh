#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz, clang) into build/fuzz and fuzzes
# each for FUZZ_SECONDS (default 60), one after the other, on a copy of its
# seed corpus under build/fuzz/corpus (the repository's corpus is never
# written). Prints one line per target: executions, coverage (cov, ft), and
# findings. Exit status 1 if any target found a crash, leak, timeout or OOM;
# the inputs that did are in build/fuzz/findings/<target>/.
# Usage: scripts/run-fuzz.sh [target ...]   (default: every target)
# Environment: FUZZ_SECONDS, FUZZ_CPU_SECONDS (instead of wall seconds: fuzz
# each target until it has used this much CPU time, so that a run at low
# priority on a busy machine still gets its budget), FUZZ_JOBS (build
# parallelism, default 2), FUZZ_TMPDIR (where targets write their input
# files; default /dev/shm), FUZZ_CXX (default clang++-14), FUZZ_BUILD (default
# build/fuzz), FUZZ_SEED (libFuzzer's -seed; 0, the default, draws one; CI
# fixes it so that a run explores the same inputs each time).
set -euo pipefail
# All in one function, parsed whole before it runs: a long run is not thrown
# off by an edit of this file while it runs (bash reads scripts as it goes).
main() {
cd "$(dirname "$0")/.."

SECONDS_PER_TARGET="${FUZZ_SECONDS:-60}"
CPU_SECONDS="${FUZZ_CPU_SECONDS:-0}"
# libFuzzer's per-input limit is wall-clock. A run under a CPU budget is meant
# to run at low priority, where a starved input can take seconds of wall time
# and no CPU (12 s for 60 ms of CPU was seen at nice 19 beside a test run);
# it gets 120 s (and libFuzzer's slow-unit report, 10 s by default, as much),
# and its corpus is replayed afterwards with the 1-s limit, an input then
# counting as a hang only if it also takes over 1 s of CPU.
TIMEOUT=1
[ "$CPU_SECONDS" -gt 0 ] && TIMEOUT=120
SEED="${FUZZ_SEED:-0}"
JOBS="${FUZZ_JOBS:-2}"
CXX="${FUZZ_CXX:-clang++-14}"
BUILD="${FUZZ_BUILD:-build/fuzz}"
ALL_TARGETS=(safetensors model_config toml tokenizer chat_template jsonl parquet serve_protocol math countdown rollout_wire)
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=("${ALL_TARGETS[@]}")

command -v "$CXX" >/dev/null || { echo "run-fuzz: $CXX not found (scripts/install-deps.sh installs clang-14)" >&2; exit 2; }
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(cd .. && pwd)}"
# Targets that read from a path write each input to a file under TMPDIR:
# in memory, not to disk, when /dev/shm is there.
if [ -z "${FUZZ_TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then FUZZ_TMPDIR=/dev/shm; fi
[ -n "${FUZZ_TMPDIR:-}" ] && export TMPDIR="$FUZZ_TMPDIR"
cmake -S tests/fuzz -B "$BUILD" -G Ninja -DCMAKE_CXX_COMPILER="$CXX" >/dev/null
cmake --build "$BUILD" -j "$JOBS" >/dev/null

# Inputs of the tokenizer's seeds hold a whole tokenizer.json.
max_len_of() {
  case "$1" in
    tokenizer|safetensors) echo 16384 ;;
    *) echo 8192 ;;
  esac
}

# User plus system CPU seconds of a running process, from /proc.
TICKS=$(getconf CLK_TCK)
cpu_seconds_of() {
  local fields
  fields=$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null) || { echo 0; return; }
  awk -v t="$TICKS" '{ printf "%d\n", ($12 + $13) / t }' <<<"$fields"
}

# CPU seconds all finished children of this shell have used (bash's times,
# run in this shell: in a command substitution it would count the subshell's).
TIMES_FILE="$(mktemp)"
trap 'rm -f "$TIMES_FILE" "$TIMES_FILE.before" "$TIMES_FILE.after"' EXIT
children_cpu_seconds() {
  times >"$TIMES_FILE"
  tail -1 "$TIMES_FILE" | awk '{
    s = 0
    for (i = 1; i <= 2; i++) { split($i, p, /[ms]/); s += p[1] * 60 + p[2] }
    printf "%d\n", s }'
}

# Runs every input of corpus dir $2 through target $1 once with the 1-s limit;
# an input that exceeds it there is timed alone and, if it uses more than 1 s
# of CPU, copied to findings dir $3. Other failures are findings too. Prints
# the number of slow-but-starved inputs it let pass; returns 1 on a finding.
replay_corpus() {
  local bin=$1 work=$2 findings=$3 log="$BUILD/$(basename "$1").replay.log" files i=0 starved=0 last cpu rc
  mapfile -t files < <(find "$work" -type f | sort)
  while [ "$i" -lt "${#files[@]}" ]; do
    rc=0
    "$bin" -timeout=1 -rss_limit_mb=2048 -malloc_limit_mb=1024 "${files[@]:i:400}" >"$log" 2>&1 || rc=$?
    if [ "$rc" -eq 0 ]; then
      i=$((i + 400))
      continue
    fi
    last=$(sed -n 's/^Running: //p' "$log" | tail -1)
    if [ "$rc" -ne 70 ] || [ -z "$last" ]; then
      cp "$log" "$findings/replay-failure.log"
      [ -n "$last" ] && cp "$last" "$findings/"
      echo "$starved"
      return 1
    fi
    cpu=$( { TIMEFORMAT='%U %S'; time "$bin" "$last" >/dev/null 2>&1; } 2>&1 | awk '{ print ($1 + $2 > 1) }')
    if [ "$cpu" = 1 ]; then
      cp "$last" "$findings/"
      echo "$starved"
      return 1
    fi
    starved=$((starved + 1))
    # Go on after that input.
    while [ "$i" -lt "${#files[@]}" ] && [ "${files[$i]}" != "$last" ]; do i=$((i + 1)); done
    i=$((i + 1))
  done
  echo "$starved"
}

failed=0
printf '%-15s %12s %8s %8s %6s %6s  %s\n' target execs cov ft secs cpu result
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
  children_cpu_seconds >"$TIMES_FILE.before"
  cpu_before=$(cat "$TIMES_FILE.before")
  rc=0
  wall_limit="$SECONDS_PER_TARGET"
  [ "$CPU_SECONDS" -gt 0 ] && wall_limit=0
  # -timeout: an input taking over a second is a hang; -rss_limit_mb and
  # -malloc_limit_mb: a parser must refuse what would need more memory.
  "$bin" "$work" "${dict[@]}" -seed="$SEED" -max_total_time="$wall_limit" -timeout="$TIMEOUT" -rss_limit_mb=2048 \
    -malloc_limit_mb=1024 -max_len="$(max_len_of "$t")" -artifact_prefix="$findings/" -print_final_stats=1 \
    -report_slow_units="$TIMEOUT" >"$log" 2>&1 &
  pid=$!
  interrupted=0
  if [ "$CPU_SECONDS" -gt 0 ]; then
    while kill -0 "$pid" 2>/dev/null; do
      sleep 5
      if [ "$(cpu_seconds_of "$pid")" -ge "$CPU_SECONDS" ]; then
        interrupted=1
        kill -INT "$pid" 2>/dev/null || true
        break
      fi
    done
  fi
  wait "$pid" || rc=$?
  # SIGINT makes libFuzzer print its final statistics and exit with 72.
  [ "$interrupted" -eq 1 ] && [ "$rc" -eq 72 ] && rc=0
  secs=$(( $(date +%s) - start ))
  children_cpu_seconds >"$TIMES_FILE.after"
  cpu_used=$(( $(cat "$TIMES_FILE.after") - cpu_before ))
  note=""
  if [ "$CPU_SECONDS" -gt 0 ] && [ "$rc" -eq 0 ]; then
    starved=$(replay_corpus "$bin" "$work" "$findings") || rc=1
    [ "$starved" -gt 0 ] && note=" ($starved starved input(s) over 1 s of wall time, under 1 s of CPU)"
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$( (grep -o 'cov: [0-9]*' "$log" || true) | tail -1 | cut -d' ' -f2)
  ft=$( (grep -o 'ft: [0-9]*' "$log" || true) | tail -1 | cut -d' ' -f2)
  found=$(find "$findings" -type f | wc -l)
  if [ "$rc" -ne 0 ] || [ "$found" -ne 0 ]; then
    result="FINDING (exit $rc; $found input(s) in $findings; log $log)"
    failed=1
  else
    result="ok$note"
  fi
  printf '%-15s %12s %8s %8s %6s %6s  %s\n' "$t" "${execs:-?}" "${cov:-?}" "${ft:-?}" "$secs" "$cpu_used" "$result"
done
exit "$failed"
}

main "$@"
