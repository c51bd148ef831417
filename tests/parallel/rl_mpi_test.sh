#!/usr/bin/env bash
# `lockstep rl` as an MPI job (docs/distributed.md), on a tiny MoE model made
# here, against the same config run as one process:
#  1. 1 trainer + 1 rollout rank: every step's metrics, a zero trainer/rollout
#     gap (aligned f32 across processes), advancing weight versions, a
#     measured weight broadcast, and final weights equal to the single-process
#     run's bit for bit (same samples, same updates);
#  2. 2 trainers + 1 rollout rank, 2 trainers + 2 rollout ranks and 2
#     colocated trainers: complete with a zero gap; weights bit-identical to
#     each other (same data-parallel size) and within the data-parallel
#     tolerance of docs/distributed.md of the single-process run;
#  3. 1 trainer + 1 rollout rank, both on the interpreted GPU (model.device
#     = "interpret", strict): the CPU run's final weights;
#  4. a refused config: too few ranks;
#  5. SIGKILL of the rollout rank mid-run ends the job within 30 s, and the
#     last checkpoint is whole: a single-process --resume finishes from it.
# The model, data and config are made by rl_mpi_setup.sh.
# usage: rl_mpi_test.sh MPIEXEC LOCKSTEP_BINARY
source "$(dirname "$0")/mpi_test_lib.sh"

source "$(dirname "$0")/rl_mpi_setup.sh"

run_mpi() {  # run_mpi NAME NP --set ...
  local name=$1 np=$2
  shift 2
  timeout -k 5 100 "${MPI[@]}" -np "$np" "$BIN" rl --config "$T/rl.toml" --out "$T/$name" "$@" > "$T/$name.log" 2>&1 \
    || { cat "$T/$name.log"; fail "$name: the job failed"; }
}

# The reference: one process, no MPI ([dist] holds only timeout_s, which a
# world of one rank does not use).
"$BIN" rl --config "$T/rl.toml" --out "$T/single" > "$T/single.log" 2>&1 || { cat "$T/single.log"; fail "single"; }
run_mpi d11 2 --set dist.rollout_ranks=1
run_mpi d21 3 --set dist.rollout_ranks=1
run_mpi d22 4 --set dist.rollout_ranks=2
run_mpi d20 2 --set dist.trainer_ranks=2
run_mpi d11dev 2 --set dist.rollout_ranks=1 --set model.device=interpret
cmp "$T/d11dev/checkpoints/step_3/model.safetensors" "$T/d11/checkpoints/step_3/model.safetensors" \
  || fail "d11 on the interpreted GPU: the weights differ from the CPU run's"
grep -q "1 trainer, 1 rollout rank" "$T/d11.log" || fail "d11: no role line"
grep -q "rollout 0/1: served" "$T/d11.log" || fail "d11: the rollout rank did not stop cleanly"
grep -q "2 trainers (data parallel), colocated" "$T/d20.log" || fail "d20: no role line"

python3 - "$T" <<'PY'
import sys
import run_files
t = sys.argv[1]

def metrics(run):
    return run_files.metrics(f"{t}/{run}")

def weights(run):
    return run_files.weights(f"{t}/{run}", 3)

single = metrics("single")
assert [m["step"] for m in single] == [0, 1, 2, 3], [m["step"] for m in single]
assert any(m.get("train/advantage_std", 0) > 0 for m in single[1:]), "no reward signal: the test would be vacuous"
for run in ("d11", "d21", "d22", "d20"):
    ms = metrics(run)
    assert [m["step"] for m in ms] == [0, 1, 2, 3], (run, [m["step"] for m in ms])
    versions = [m["weight_version"] for m in ms[1:]]
    assert versions == sorted(set(versions)) and versions[0] > 0, (run, versions)
    for m in ms[1:]:
        assert m["train/train_rollout_logprob_abs_diff_max"] == 0, (run, m["step"], m)
        assert m["train/train_rollout_logprob_bitwise_equal_frac"] == 1, (run, m["step"])
        assert m["train/on_policy_shortcut"] == 1, (run, m["step"])
        assert m["rollout/weight_staleness"] == 0, (run, m["step"])  # rollout and training alternate
        if run != "d20":  # weights crossed the network
            assert m["perf/weight_sync_s"] > 0 and m["perf/weight_sync_gb_per_s"] > 0, (run, m)
    # Same samples as one process: the rollout metrics agree exactly.
    for a, b in zip(single[1:], ms[1:]):
        for k in ("rollout/reward_mean", "rollout/accuracy", "rollout/response_len_mean", "train/samples"):
            assert a[k] == b[k], (run, a["step"], k, a[k], b[k])

ref = weights("single")
d11 = weights("d11")
assert d11 == ref, "1 trainer + 1 rollout rank: final weights differ from the single-process run"
# Data parallelism over 2 trainers: docs/distributed.md's tolerance (at most
# lr * 2 * updates for any weight, at most 0.1 % of the weights off by more
# than 1e-6); the three 2-trainer layouts agree bit for bit.
lr, updates = 1e-3, 6
dp = weights("d21")
assert weights("d22") == dp and weights("d20") == dp, "2-trainer runs differ with the rollout layout"
n = sum(len(v) for v in ref.values())
d = run_files.assert_close(ref, dp, lr, updates, "2 trainers vs one process")
print(f"1+1 bitwise equal; 2 trainers: max |dw| {d:.3g} over {n} weights")
PY

# A refused config: every rank says why, the job ends. (Rollout ahead of
# training, max_weight_staleness, is tested by rl_stale_test.sh.)
if timeout -k 5 60 "${MPI[@]}" -np 2 "$BIN" rl --config "$T/rl.toml" --out "$T/bad2" --set dist.rollout_ranks=2 \
    > "$T/bad2.log" 2>&1; then fail "rollout_ranks = 2 of 2 ranks was accepted"; fi
grep -q "rollout_ranks = 2 leaves no trainer rank" "$T/bad2.log" || { cat "$T/bad2.log"; fail "bad2"; }

# SIGKILL the rollout rank mid-run: the launcher ends the job, the last
# checkpoint stays whole.
kill_midrun_and_resume "rollout rank" 2 1 --set dist.rollout_ranks=1
echo PASS
