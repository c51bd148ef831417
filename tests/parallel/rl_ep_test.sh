#!/usr/bin/env bash
# `lockstep rl` with expert parallelism ([dist] expert_parallel = 2,
# docs/distributed.md), on the tiny 4-expert MoE model of rl_mpi_setup.sh,
# against the same trainer count without it:
#  1. 2 trainers (one EP group) + 1 rollout rank, and 2 colocated EP trainers:
#     every step's metrics, a zero trainer/rollout gap at every step (the
#     trainers' logprobs keep their bits with experts spread out), the same
#     samples and rewards as the EP = 1 run, and final weights within the
#     stated tolerance of it; the two EP layouts agree bit for bit;
#  2. 4 trainers as 2 EP groups of 2 (DP x EP) + 0 rollout ranks: completes with
#     a zero gap;
#  3. checkpoints hold the whole model and optimizer state: an EP run stopped
#     after step 2 and resumed with EP ends bit-identical to the uninterrupted
#     run; the same checkpoint resumes without expert parallelism too;
#  4. refused: expert_parallel that does not divide the model's experts;
#  5. SIGKILL of the second trainer (a member of the root's expert group, in
#     the middle of all-to-alls) ends the job within 30 s; the last
#     checkpoint is whole and a single-process --resume finishes from it.
# usage: rl_ep_test.sh MPIEXEC LOCKSTEP_BINARY
source "$(dirname "$0")/mpi_test_lib.sh"

source "$(dirname "$0")/rl_mpi_setup.sh"

run_mpi() {  # run_mpi NAME NP --set ...
  local name=$1 np=$2
  shift 2
  timeout -k 5 150 "${MPI[@]}" -np "$np" "$BIN" rl --config "$T/rl.toml" --out "$T/$name" "$@" > "$T/$name.log" 2>&1 \
    || { cat "$T/$name.log"; fail "$name: the job failed"; }
}

run_mpi dp21 3 --set dist.rollout_ranks=1
run_mpi ep21 3 --set dist.rollout_ranks=1 --set dist.expert_parallel=2
run_mpi ep20 2 --set dist.trainer_ranks=2 --set dist.expert_parallel=2
run_mpi ep40 4 --set dist.trainer_ranks=4 --set dist.expert_parallel=2
# Stop after step 2, resume to step 3: with EP, and without it from the same checkpoint.
run_mpi cut 3 --set dist.rollout_ranks=1 --set dist.expert_parallel=2 --set train.steps=2
cp -r "$T/cut" "$T/cut1"
run_mpi cut 3 --set dist.rollout_ranks=1 --set dist.expert_parallel=2 --resume
run_mpi cut1 3 --set dist.rollout_ranks=1 --resume
grep -q "resumed from" "$T/cut.log" || { cat "$T/cut.log"; fail "cut: did not resume"; }
cmp "$T/cut/checkpoints/step_3/model.safetensors" "$T/ep21/checkpoints/step_3/model.safetensors" \
  || fail "EP run resumed after step 2 differs from the uninterrupted EP run"
cmp "$T/cut/checkpoints/step_3/optimizer.bin" "$T/ep21/checkpoints/step_3/optimizer.bin" \
  || fail "EP optimizer state after resume differs"
grep -q "2 trainers (data parallel) as 1 expert-parallel groups of 2, 1 rollout rank" "$T/ep21.log" \
  || { cat "$T/ep21.log"; fail "ep21: no role line"; }
grep -q "4 trainers (data parallel) as 2 expert-parallel groups of 2" "$T/ep40.log" \
  || { cat "$T/ep40.log"; fail "ep40: no role line"; }

python3 - "$T" <<'PY'
import sys
import run_files
t = sys.argv[1]

def metrics(run):
    return run_files.metrics(f"{t}/{run}")

def weights(run):
    return run_files.weights(f"{t}/{run}", 3)

dp = metrics("dp21")
assert any(m.get("train/advantage_std", 0) > 0 for m in dp[1:]), "no reward signal: the test would be vacuous"
for run in ("ep21", "ep20", "ep40"):
    ms = metrics(run)
    assert [m["step"] for m in ms] == [0, 1, 2, 3], (run, [m["step"] for m in ms])
    for m in ms[1:]:
        assert m["train/train_rollout_logprob_abs_diff_max"] == 0, (run, m["step"], m)
        assert m["train/train_rollout_logprob_bitwise_equal_frac"] == 1, (run, m["step"])
    if run == "ep40":
        continue
    # The first step samples from the same weights: identical rollouts.
    for k in ("rollout/reward_mean", "rollout/response_len_mean", "train/samples"):
        assert dp[1][k] == ms[1][k], (run, k, dp[1][k], ms[1][k])

# Expert gradients are summed in another order than without EP (docs:
# relative L2 <= 1e-6 per gradient); after 6 AdamW updates at lr 1e-3 the
# weights stay within the data-parallel tolerance of rl_mpi_test.sh.
lr, updates = 1e-3, 6
ref, ep = weights("dp21"), weights("ep21")
assert weights("ep20") == ep, "the two 2-trainer EP layouts differ"
n = sum(len(v) for v in ref.values())
d = run_files.assert_close(ref, ep, lr, updates, "EP=2 vs EP=1")
print(f"EP=2 vs EP=1 (2 trainers): max |dw| {d:.3g} over {n} weights; gap 0 at every step")
# The EP checkpoint of step 2 resumed without EP: close to the EP run.
cut1 = weights("cut1")
d = run_files.assert_close(ep, cut1, lr, updates, "EP checkpoint resumed with EP=1")
print(f"EP checkpoint resumed with EP=1: max |dw| {d:.3g} vs the EP run")
PY

# 4 experts do not split over 3 ranks: refused on every rank, naming the key.
if timeout -k 5 60 "${MPI[@]}" -np 3 "$BIN" rl --config "$T/rl.toml" --out "$T/bad" --set dist.trainer_ranks=3 \
    --set dist.expert_parallel=3 > "$T/bad.log" 2>&1; then fail "expert_parallel = 3 with 4 experts was accepted"; fi
grep -q "\[dist\] expert_parallel = 3 needs a MoE model whose experts it divides; the model has 4 experts" "$T/bad.log" \
  || { cat "$T/bad.log"; fail "bad: no clear error"; }

kill_midrun_and_resume "expert-parallel trainer" 3 1 --set dist.rollout_ranks=1 --set dist.expert_parallel=2
echo PASS
