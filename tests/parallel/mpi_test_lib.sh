# Sourced first by the shell tests of `lockstep` under mpirun (rl_*_test.sh,
# sft_mpi_test.sh) with the caller's arguments MPIEXEC LOCKSTEP_BINARY:
# MPIEXEC, BIN, a temporary directory T removed at exit, single-threaded
# ranks, the mpirun command line MPI, fail, and kill_rank_after_checkpoint.
# Python checks read runs with tests/parallel/run_files.py (PYTHONPATH is set).
set -euo pipefail
MPIEXEC=$1
BIN=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export LOCKSTEP_THREADS=1
export PYTHONPATH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)${PYTHONPATH:+:$PYTHONPATH}"
MPI=("$MPIEXEC" --allow-run-as-root --oversubscribe -x LOCKSTEP_THREADS=1)
fail() { echo "FAIL: $*"; exit 1; }

# kill_rank_after_checkpoint LAUNCHER_PID WORLD_RANK RUN_DIR LOG: waits (up to
# 30 s) until RUN_DIR/checkpoints/latest names a checkpoint after step_2, then
# SIGKILLs the process of that world rank among the launcher's descendants.
kill_rank_after_checkpoint() {
  local launcher=$1 rank=$2 run=$3 log=$4 victim="" p
  for _ in $(seq 1 300); do
    if [ -z "$victim" ]; then
      for p in $(pgrep -P "$launcher" 2>/dev/null; for c in $(pgrep -P "$launcher" 2>/dev/null); do pgrep -P "$c"; done); do
        if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$rank"; then victim=$p; fi
      done
    fi
    if [ -n "$victim" ] && [ -f "$run/checkpoints/latest" ] && [ "$(cat "$run/checkpoints/latest")" != "step_2" ]; then
      break
    fi
    sleep 0.1
  done
  [ -n "$victim" ] || { kill "$launcher" 2>/dev/null; cat "$log"; fail "the process of rank $rank was not found"; }
  [ -f "$run/checkpoints/latest" ] || { kill "$launcher" 2>/dev/null; cat "$log"; fail "no checkpoint"; }
  kill -9 "$victim"
}

# kill_midrun_and_resume WHAT NP RANK [--set ...]: runs `lockstep rl` on
# $T/rl.toml as an NP-rank job with the given settings (a checkpoint every 2
# steps, no eval), SIGKILLs world rank RANK once a checkpoint after step_2
# exists, checks that the job ends with a non-zero code within 30 s, and
# that one process resumes from the last checkpoint for one more step.
kill_midrun_and_resume() {
  local what=$1 np=$2 rank=$3
  shift 3
  local run="$T/killed-$np-$rank" launcher kill_time rc=0 elapsed last step
  timeout -k 5 60 "${MPI[@]}" -np "$np" "$BIN" rl --config "$T/rl.toml" --out "$run" "$@" \
    --set train.steps=100000 --set train.save_interval=2 --set eval.interval=0 > "$run.log" 2>&1 &
  launcher=$!
  kill_rank_after_checkpoint "$launcher" "$rank" "$run" "$run.log"
  kill_time=$(date +%s)
  wait "$launcher" || rc=$?
  elapsed=$(( $(date +%s) - kill_time ))
  [ "$rc" -ne 0 ] || fail "the job returned 0 after its $what was killed"
  [ "$elapsed" -lt 30 ] || fail "the job took ${elapsed} s to end after the $what was killed"
  last=$(cat "$run/checkpoints/latest")
  step=${last#step_}
  "$BIN" rl --config "$T/rl.toml" --out "$run" --resume --set train.steps=$((step + 1)) --set eval.interval=0 \
    --set dist.timeout_s=0 > "$run.resume.log" 2>&1 || { cat "$run.resume.log"; fail "resume from $last"; }
  grep -q "resumed from" "$run.resume.log" || fail "did not resume from $last"
  echo "killed $what: job ended (rc $rc) ${elapsed} s after the kill; one process resumed from $last"
}
