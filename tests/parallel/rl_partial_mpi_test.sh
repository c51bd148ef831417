#!/usr/bin/env bash
# `lockstep rl` with partial rollouts ([rollout] partial) as an MPI job, on the
# tiny MoE model of rl_mpi_setup.sh, against the same config run as one
# process:
#  1. 1 trainer + 1 rollout rank: samples paused at a step's budget resume on
#     the rollout rank with the weights broadcast to it; the same samples,
#     metrics and final weights (bit for bit) as the single process;
#  2. 2 colocated trainers: every rank keeps the same groups in flight; the
#     run completes with a zero gap on every token (partial_gap = "all").
# usage: rl_partial_mpi_test.sh MPIEXEC LOCKSTEP_BINARY
source "$(dirname "$0")/mpi_test_lib.sh"

source "$(dirname "$0")/rl_mpi_setup.sh"

# 4 prompts x 8 samples of up to 8 tokens on a budget of 160 tokens a step:
# 5 tokens a sample, so the samples (this random model's run to 8 tokens)
# finish in the step after the one that drew them. (Samples of several
# versions need responses of varied lengths: tests/rl/partial_rollout_test.cpp.)
PARTIAL=(--set train.steps=4 --set eval.interval=0 --set rollout.partial=true
         --set rollout.partial_token_budget=160 --set rollout.partial_max_staleness=4
         --set algo.rollout_is='"token"')
"$BIN" rl --config "$T/rl.toml" --out "$T/single" "${PARTIAL[@]}" > "$T/single.log" 2>&1 \
  || { cat "$T/single.log"; fail "single"; }
for run in "d11 2 --set dist.rollout_ranks=1" "d20 2 --set dist.trainer_ranks=2"; do
  set -- $run
  name=$1 np=$2
  shift 2
  timeout -k 5 100 "${MPI[@]}" -np "$np" "$BIN" rl --config "$T/rl.toml" --out "$T/$name" "${PARTIAL[@]}" "$@" \
    > "$T/$name.log" 2>&1 || { cat "$T/$name.log"; fail "$name: the job failed"; }
done
grep -q "1 trainer, 1 rollout rank" "$T/d11.log" || fail "d11: no role line"
grep -q "2 trainers (data parallel), colocated" "$T/d20.log" || fail "d20: no role line"

python3 - "$T" <<'PY'
import sys
import run_files
t = sys.argv[1]
single = run_files.metrics(f"{t}/single")
steps = [m for m in single if m["step"] > 0]
assert [m["step"] for m in steps] == [1, 2, 3, 4], [m["step"] for m in single]
assert sum(m["rollout/partial_paused"] for m in steps) > 0, "nothing paused: the test would be vacuous"
assert sum(m["rollout/partial_resumed_tokens"] for m in steps) > 0, "nothing resumed"
assert sum("train/pg_loss" in m for m in steps) >= 2, "fewer than two steps trained"
for run in ("single", "d11", "d20"):
    ms = [m for m in run_files.metrics(f"{t}/{run}") if m["step"] > 0]
    assert [m["step"] for m in ms] == [1, 2, 3, 4], (run, [m["step"] for m in ms])
    for m in ms:
        if "train/pg_loss" in m:
            assert m["train/train_rollout_logprob_abs_diff_max"] == 0, (run, m["step"], m)
d11 = [m for m in run_files.metrics(f"{t}/d11") if m["step"] > 0]
for a, b in zip(steps, d11):
    for k in ("rollout/partial_paused", "rollout/partial_resumed_tokens", "rollout/partial_finished_groups",
              "rollout/response_len_mean", "train/partial_gap_left_out_tokens",
              "train/partial_gap_rescored_tokens"):
        assert a.get(k) == b.get(k), ("d11", a["step"], k, a.get(k), b.get(k))
assert run_files.weights(f"{t}/d11", 4) == run_files.weights(f"{t}/single", 4), \
    "1 trainer + 1 rollout rank: final weights differ from the single-process run"
print("partial rollouts: 1+1 bitwise equal to one process; 2 colocated trainers complete with a zero gap")
PY
echo PASS
