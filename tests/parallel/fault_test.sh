#!/usr/bin/env bash
# A rank that dies (exit, SIGKILL) or hangs must end the whole job with a
# non-zero status and a message, within a time limit, not leave it hanging.
# usage: fault_test.sh MPIEXEC FAULT_BINARY
set -u
MPIEXEC=$1
BIN=$2
LIMIT=30
fail() { echo "FAIL: $*"; exit 1; }

run() {  # run MODE -> sets rc, elapsed_ms, out
  local start=$(date +%s%N)
  out=$(timeout -k 5 $((LIMIT + 30)) "$MPIEXEC" --allow-run-as-root --oversubscribe -np 3 "$BIN" "$1" 2>&1)
  rc=$?
  elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
  printf '%s: rc=%d after %d.%03d s\n' "$1" "$rc" $((elapsed_ms / 1000)) $((elapsed_ms % 1000))
}

run ok
[ "$rc" -eq 0 ] || fail "the fault-free job failed: $out"
echo "$out" | grep -q "all ranks finished" || fail "no completion line: $out"

for mode in exit kill hang; do
  run $mode
  [ "$rc" -ne 0 ] || fail "$mode: job returned 0"
  # (mpirun itself returns 137 = 128 + SIGKILL for a killed rank, so the
  # outer `timeout` is told apart by the elapsed time, not the status.)
  [ "$elapsed_ms" -lt $((LIMIT * 1000)) ] || fail "$mode: job took ${elapsed_ms} ms (limit ${LIMIT} s): it hung"
  echo "$out" | grep -q "all ranks finished" && fail "$mode: job claims to have finished"
  case $mode in
    exit) echo "$out" | grep -qi "exit code: *9\|exited on signal\|non-zero status" || fail "exit: no launcher message: $out" ;;
    kill) echo "$out" | grep -qi "signal 9\|killed\|non-zero status" || fail "kill: no launcher message: $out" ;;
    hang) echo "$out" | grep -q "did not complete within 3 s" || fail "hang: no watchdog message: $out" ;;
  esac
  echo "$out" | grep -v '^\s*$' | head -4 | sed 's/^/    /'
done
echo "PASS"
