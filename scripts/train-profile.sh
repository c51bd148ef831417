#!/usr/bin/env bash
# The breakdown of a training step by kernel family: runs `lockstep bench train`
# on one model under `perf record` and groups the samples of the timed process
# by function into GEMM (forward and the two backward products), attention
# (forward, backward), MoE dispatch and combine copies, norms, elementwise
# activations and exp, log-probs, the optimizer, and the rest.
# Usage: scripts/train-profile.sh [bench train options...] (--threads 1 splits
# every product; on more threads a pool thread's samples name no caller)
#   e.g. scripts/train-profile.sh --config configs/bench/moe-tiny.toml --threads 1
# Environment: LOCKSTEP (default build/release/lockstep), PERF (default perf;
# Debian's linux-perf package), PERF_FREQ (samples per second, default 999).
set -euo pipefail
cd "$(dirname "$0")/.."
LOCKSTEP="${LOCKSTEP:-build/release/lockstep}"
PERF="${PERF:-perf}"
command -v "$PERF" >/dev/null || { echo "train-profile: $PERF not found (apt-get install linux-perf)" >&2; exit 2; }
[ -x "$LOCKSTEP" ] || { echo "train-profile: $LOCKSTEP not built (cmake --build build/release)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PERF" record -q -g -o "$tmp/perf.data" -F "${PERF_FREQ:-999}" -- "$LOCKSTEP" bench train "$@" > "$tmp/bench.txt"
cat "$tmp/bench.txt"
"$PERF" script -i "$tmp/perf.data" -F ip,sym 2>/dev/null | python3 "scripts/train_profile_groups.py"
