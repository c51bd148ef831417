#!/usr/bin/env bash
# The one script to run on the lent GPU machine (docs/gpu.md, "The device
# check"): unpacks the carried .debs into a prefix, configures and builds
# lockstep with -DLOCKSTEP_MPI=OFF -DLOCKSTEP_CUDA=ON, runs nvidia-smi, the
# gpu-interp tests, then the device steps (the gpu tests, scripts/gpu-parity.sh's
# checks of the GPU against the CPU, `lockstep bench` on both and a throughput
# table), each step under its own timeout, going on past failures, and writes
# every step's command, exit code, duration and output tail to ONE results file.
#
#   scripts/gpu-check.sh                       on the device machine, from the repo root
#   GPU_CHECK_NO_DEVICE=1 scripts/gpu-check.sh anywhere: lists the steps that need a GPU
#                                              as "would run: COMMAND" instead of running them
#                                              (and configures with -DLOCKSTEP_CUDA=OFF
#                                              unless GPU_CHECK_CUDA=ON: nvcc needs no GPU)
# Settings (environment): DEBDIR (third_party/debs), PREFIX (/tmp/lockstep-prefix),
# BUILD (build/gpu-check), JOBS (nproc), GPU_CHECK_BUDGET_S (540: the whole run),
# GPU_CHECK_BUILD_TIMEOUT_S (360: the build step), GPU_CHECK_WERROR (0 on the
# device: g++ warnings do not stop the build, they are counted; 1 in no-device mode),
# GPU_CHECK_TARGETS (default: lockstep and every gpu/cuda/cublas executable target),
# GPU_CHECK_CMAKE_ARGS (more configure arguments), GPU_CHECK_BENCH (more
# commands, one per line, run last with ./lockstep replaced by the built binary).
# Results: $OUT/gpu-check-results.txt if OUT is set, else ./gpu-check-results.txt.
set -uo pipefail

cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)
DEBDIR=${DEBDIR:-third_party/debs}
PREFIX=${PREFIX:-/tmp/lockstep-prefix}
BUILD=${BUILD:-build/gpu-check}
JOBS=${JOBS:-$(nproc)}
BUDGET_S=${GPU_CHECK_BUDGET_S:-540}
NO_DEVICE=${GPU_CHECK_NO_DEVICE:-0}
RESULTS=${OUT:+$OUT/gpu-check-results.txt}
RESULTS=${RESULTS:-$ROOT/gpu-check-results.txt}
TAIL_LINES=60        # output kept per step
FAIL_TAIL_LINES=200  # ... per failed step (the first error is often far up)
CUDA=ON
[ "$NO_DEVICE" = 1 ] && CUDA=OFF
CUDA=${GPU_CHECK_CUDA:-$CUDA}
WERROR=${GPU_CHECK_WERROR:-$NO_DEVICE}
# More commands to run after the device steps (one per line, ./lockstep replaced
# by the built binary), e.g. a longer benchmark.
BENCH=${GPU_CHECK_BENCH:-}

START=$(date +%s)
LOGDIR=$(mktemp -d)
SUMMARY=()
mkdir -p "$(dirname "$RESULTS")"
{
  echo "# lockstep device check (scripts/gpu-check.sh), $(date -u '+%F %T') UTC"
  echo "# host $(hostname), $JOBS jobs, budget ${BUDGET_S}s, LOCKSTEP_CUDA=$CUDA, no-device mode: $NO_DEVICE"
} >"$RESULTS"

# step NAME TIMEOUT_S COMMAND: runs COMMAND (bash -c) under a timeout cut to
# what is left of the budget; appends command, exit code, duration and tail.
step() {
  local name=$1 limit=$2 cmd=$3
  local left=$((BUDGET_S - ($(date +%s) - START)))
  if [ "$left" -lt 15 ]; then
    record "$name" "$cmd" skipped 0 "(skipped: ${left}s of the budget left)"
    return 1
  fi
  [ "$limit" -gt $((left - 5)) ] && limit=$((left - 5))
  local log=$LOGDIR/$name.log t0 t1 rc
  t0=$(date +%s.%N)
  timeout -k 10 "$limit" bash -c "$cmd" >"$log" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  local n keep=$TAIL_LINES
  n=$(wc -l <"$log")
  [ "$rc" -ne 0 ] && keep=$FAIL_TAIL_LINES
  record "$name" "$cmd" "$rc" "$(awk "BEGIN { printf \"%.1f\", $t1 - $t0 }")" "$(tail -n "$keep" "$log")" "$n" "$keep" "$limit"
  return "$rc"
}

record() {  # record NAME CMD RC SECONDS OUTPUT [LINES KEPT LIMIT]
  local note=""
  [ "$3" = 124 ] || [ "$3" = 137 ] && note=" (timed out)"
  [ "$3" = 77 ] && note=" (no device)"  # bench_gemm_cublas: the runtime sees no GPU
  {
    echo
    echo "=== $1"
    echo "command: $2"
    echo "exit: $3$note   duration: ${4}s${8:+   timeout: ${8}s}"
    [ -n "${6:-}" ] && echo "--- output: last $((${6} < ${7} ? ${6} : ${7})) of ${6} lines"
    echo "$5"
  } >>"$RESULTS"
  SUMMARY+=("$(printf '%-20s exit %-8s %8ss' "$1" "$3" "$4")")
  sync
}

skip() { record "$1" "$2" skipped 0 "(skipped: $3)"; }

# shellcheck disable=SC2016  # expanded by the step's bash
step env 30 'uname -a; cat /etc/os-release 2>/dev/null | head -2; nproc; free -g | head -2; df -h . | tail -1
  for c in g++ cmake ninja nvcc pkg-config; do echo "$c: $(command -v $c || echo missing)"; done
  g++ --version | head -1; cmake --version | head -1; ninja --version; nvcc --version 2>/dev/null | tail -2
  git rev-parse HEAD 2>/dev/null || echo "(no git)"; ls '"$DEBDIR"' 2>&1 | wc -l'

if [ "$NO_DEVICE" = 1 ]; then
  skip nvidia-smi "nvidia-smi" "GPU_CHECK_NO_DEVICE=1"
else
  step nvidia-smi 30 'nvidia-smi; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv'
fi

step prefix 180 "rm -rf '$PREFIX' && bash scripts/gpu-prefix.sh '$DEBDIR' '$PREFIX'"

# The device's g++ may be newer than Debian 12's GCC 12 and warn where it does
# not; the device check is about the GPU code, so there a warning does not
# stop the build (-Wno-error after the project's -Werror) and is counted below.
LAUNCHER=""
if [ "$WERROR" != 1 ]; then
  mkdir -p "$PREFIX/bin"
  printf '#!/bin/sh\n# compiler launcher (scripts/gpu-check.sh): warnings are not errors\nexec "$@" -Wno-error\n' \
    >"$PREFIX/bin/warnings-not-fatal"
  chmod +x "$PREFIX/bin/warnings-not-fatal"
  LAUNCHER="-DCMAKE_CXX_COMPILER_LAUNCHER=$PREFIX/bin/warnings-not-fatal"
fi
configure() {  # configure DIR CUDA
  step "configure-cuda-$2" 180 "cmake -C '$PREFIX/lockstep-deps.cmake' -S . -B '$1' -G Ninja -DLOCKSTEP_MPI=OFF \
    -DLOCKSTEP_CUDA=$2 -DLOCKSTEP_HIP=OFF -DCMAKE_BUILD_TYPE=Release '-DCMAKE_CXX_FLAGS_RELEASE=-O3 -DNDEBUG' \
    $LAUNCHER ${GPU_CHECK_CMAKE_ARGS:-}"
}
# Without CUDA the interpret-mode tests still say something: configure once
# more without it when the CUDA configure fails.
if ! configure "$BUILD" "$CUDA" && [ "$CUDA" = ON ]; then
  BUILD=$BUILD-nocuda
  configure "$BUILD" OFF
fi

step found 20 "grep -E '^[A-Za-z_]+_DIR:PATH=|^pkgcfg_lib_|^PKG_CONFIG_EXECUTABLE|^LOCKSTEP_|^CMAKE_CUDA_COMPILER:|^CMAKE_CUDA_ARCHITECTURES' '$BUILD/CMakeCache.txt'"

if [ -z "${GPU_CHECK_TARGETS:-}" ]; then
  # Every executable and library has a link rule named after it
  # (CXX_EXECUTABLE_LINKER__NAME_Release, CUDA_STATIC_LIBRARY_LINKER__NAME_Release).
  GPU_CHECK_TARGETS="lockstep $(ninja -C "$BUILD" -t targets all 2>/dev/null |
    sed -n 's/.*: [A-Z]*_\(EXECUTABLE\|STATIC_LIBRARY\)_LINKER__\(.*\)_[A-Za-z]*$/\2/p' |
    grep -iE 'gpu|cuda|cublas' | sort -u | tr '\n' ' ')"
fi
# -k 0: a target that fails to build does not stop the others.
step build "${GPU_CHECK_BUILD_TIMEOUT_S:-360}" "cmake --build '$BUILD' -j $JOBS --target $GPU_CHECK_TARGETS -- -k 0"
step warnings 10 "grep -m 40 'warning:' '$LOGDIR/build.log'; echo \"\$(grep -c 'warning:' '$LOGDIR/build.log') compiler warnings\""

step ctest-gpu-interp 240 "ctest --test-dir '$BUILD' -L '^gpu-interp\$' -j $JOBS --output-on-failure --timeout 120"

# ---- the device steps: each needs the GPU; with GPU_CHECK_NO_DEVICE=1 it is
# listed as "would run" with its command, so the dry run shows every one.
WOULD_RUN=()
device_step() {  # device_step NAME TIMEOUT_S COMMAND
  if [ "$NO_DEVICE" = 1 ]; then
    record "$1" "$3" would-run 0 "(would run on the device)"
    WOULD_RUN+=("$1: $3")
    return 0
  fi
  step "$@"
}
LS=$BUILD/lockstep
PARITY="THREADS=$JOBS bash scripts/gpu-parity.sh '$LS' cuda /tmp/lockstep-gpu-parity"
MOE_TINY="--config configs/bench/moe-tiny.toml --threads $JOBS"
ROLLOUT="bench rollout $MOE_TINY --batches 1,16,64 --new-tokens 16 --prefill-prompts 4 --prefill-len 64 \
  --grpo-prompts 8 --grpo-samples 2"
TRAIN="bench train $MOE_TINY --seqs 8 --steps 1"

# The binary has the CUDA backend and sees the GPU.
device_step device-info 20 "'$LS' info && '$LS' info | grep -qE 'cuda \(built, [1-9][0-9]* found'"
# The kernel parity and strict-mode tests on the device (label gpu).
device_step ctest-gpu 180 "ctest --test-dir '$BUILD' -L '^gpu\$' --no-tests=error -j 1 --output-on-failure --timeout 120"
# The demo model's 3 RL steps on the GPU: the CPU run's checkpoint bytes; then
# score / generate on the GPU vs the CPU, and GPU rollout vs CPU trainer.
device_step parity-rl 240 "$PARITY rl"
device_step parity-score 90 "$PARITY score"
device_step parity-align 90 "$PARITY align"

# The throughput table: decode at batch 1/16/64 and training, CPU then GPU,
# and the GEMM against cuBLAS on the same shapes.
BENCH_LOGS=()
if [ -x "$LS" ]; then
  step bench-rollout-cpu 120 "'$LS' $ROLLOUT --device cpu"
  BENCH_LOGS+=("$LOGDIR/bench-rollout-cpu.log")
  device_step bench-rollout-cuda 90 "'$LS' $ROLLOUT --device cuda"
  step bench-train-cpu 90 "'$LS' $TRAIN --device cpu"
  BENCH_LOGS+=("$LOGDIR/bench-train-cpu.log")
  device_step bench-train-cuda 60 "'$LS' $TRAIN --device cuda"
  [ "$NO_DEVICE" = 1 ] || BENCH_LOGS+=("$LOGDIR/bench-rollout-cuda.log" "$LOGDIR/bench-train-cuda.log")
else
  skip bench "lockstep bench" "no $LS"
fi
# lockstep's GEMM against cuBLAS (bench/gpu/gemm_cublas.cpp): one table line
# per shape; exit 1 when a bit differs from the CPU kernel, 77 without a device.
device_step gemm-cublas 90 "test -x '$BUILD/bench_gemm_cublas' || { echo 'no cuBLAS GEMM benchmark (bench_gemm_cublas) in this build'; exit 1; }
  '$BUILD/bench_gemm_cublas'"
[ "$NO_DEVICE" = 1 ] || BENCH_LOGS+=("$LOGDIR/gemm-cublas.log")
step throughput 10 "python3 scripts/gpu-throughput.py ${BENCH_LOGS[*]}"

if [ -n "$BENCH" ] && [ -x "$LS" ]; then
  i=0
  while IFS= read -r b; do
    [ -n "$b" ] || continue
    i=$((i + 1))
    step "bench-$i" 90 "${b/.\/lockstep/$LS}"
  done <<<"$BENCH"
fi

if [ "${#WOULD_RUN[@]}" -gt 0 ]; then
  {
    echo
    echo "=== device steps (GPU_CHECK_NO_DEVICE=1: not run; on the device each would run)"
    for w in "${WOULD_RUN[@]}"; do echo "would run: $w"; done
  } >>"$RESULTS"
fi

{
  echo
  echo "=== summary ($(($(date +%s) - START))s of ${BUDGET_S}s)"
  printf '%s\n' "${SUMMARY[@]}"
} >>"$RESULTS"
rm -rf "$LOGDIR"
echo "gpu-check: results in $RESULTS"
