#!/usr/bin/env bash
# bench_gemm_cublas --quick (label gpu): on a CUDA device every shape's bits
# equal the CPU kernel's (the program exits 1 otherwise) and each shape gives
# one table line; without a device it must exit 77 with the no-device message
# naming the driver's error, and this test then skips (exit 77).
set -uo pipefail
BIN=$1
fail() {
  echo "FAIL: $*"
  exit 1
}
out=$("$BIN" --quick --trials 2 2>&1)
rc=$?
echo "$out"
if [ "$rc" -eq 77 ]; then
  grep -q "bench_gemm_cublas: cuda: no CUDA device found (cudaGetDeviceCount" <<<"$out" ||
    fail "exit 77 without the no-device message"
  echo "no CUDA device: skipped"
  exit 77
fi
[ "$rc" -eq 0 ] || fail "bench_gemm_cublas --quick exited $rc"
rows=$(grep -cE '^(q|down|ragged) +[0-9]+ +[0-9]+ +[0-9]+ ' <<<"$out")
[ "$rows" -eq 4 ] || fail "expected 4 table lines, got $rows"
[ "$(grep -cE '^(q|down|ragged) .*  ok  ' <<<"$out")" -eq 4 ] || fail "a line's bits vs CPU is not ok"
echo "ok: 4 shapes, every checked bit equal to the CPU kernel's"
