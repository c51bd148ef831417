#!/usr/bin/env bash
# `lockstep sft` as an MPI job (docs/distributed.md), on the tiny 4-expert
# MoE model of rl_mpi_setup.sh, against the same config run as one process:
#  1. 2 data-parallel ranks: one metrics.jsonl with every step once, losses
#     equal to the single process to 1e-9 relative on step 1 (same weights)
#     and close later, final weights within the data-parallel tolerance;
#  2. 2 ranks with expert_parallel = 2, and 4 ranks as 2 x 2 (DP x EP): close
#     to the 2-rank data-parallel run;
#  3. a 2-rank run stopped after step 2 and resumed ends bit-identical to the
#     uninterrupted one;
#  4. refused: [dist] rollout_ranks in an sft config;
#  5. 2 data-parallel ranks, and 2 expert-parallel ranks, on the interpreted
#     GPU (model.device = "interpret", strict) write the CPU runs' checkpoint
#     bytes.
# usage: sft_mpi_test.sh MPIEXEC LOCKSTEP_BINARY
source "$(dirname "$0")/mpi_test_lib.sh"

source "$(dirname "$0")/rl_mpi_setup.sh"
python3 - "$T" <<'PY'
import json, sys
t = sys.argv[1]
with open(f"{t}/sft.jsonl", "w") as f:
    for a in range(40):
        b = (a * 7) % 10
        f.write(json.dumps({"prompt": f"{a}+{b}=", "response": f"{a + b}"}) + "\n")
PY
cat > "$T/sft.toml" <<TOML
[model]
path = "$T/model"

[data]
train_file = "$T/sft.jsonl"
apply_chat_template = false

[train]
steps = 4
batch_size = 8
lr = 1e-3
micro_batch_tokens = 32
seed = 1
TOML

run_mpi() {  # run_mpi NAME NP --set ...
  local name=$1 np=$2
  shift 2
  timeout -k 5 100 "${MPI[@]}" -np "$np" "$BIN" sft --config "$T/sft.toml" --out "$T/$name" "$@" > "$T/$name.log" 2>&1 \
    || { cat "$T/$name.log"; fail "$name: the job failed"; }
}

"$BIN" sft --config "$T/sft.toml" --out "$T/single" > "$T/single.log" 2>&1 || { cat "$T/single.log"; fail "single"; }
run_mpi dp2 2
run_mpi ep2 2 --set dist.expert_parallel=2
run_mpi dp2dev 2 --set model.device=interpret
run_mpi ep2dev 2 --set dist.expert_parallel=2 --set model.device=interpret
run_mpi ep4 4 --set dist.expert_parallel=2
run_mpi cut 2 --set train.steps=2
run_mpi cut 2 --resume
grep -q "2 data-parallel trainer ranks; each step" "$T/dp2.log" || { cat "$T/dp2.log"; fail "dp2: no role line"; }
grep -q "as 2 expert-parallel groups of 2" "$T/ep4.log" || { cat "$T/ep4.log"; fail "ep4: no role line"; }
cmp "$T/cut/checkpoints/step_4/model.safetensors" "$T/dp2/checkpoints/step_4/model.safetensors" \
  || fail "2-rank sft resumed after step 2 differs from the uninterrupted run"
for f in model.safetensors optimizer.bin; do
  cmp "$T/dp2dev/checkpoints/step_4/$f" "$T/dp2/checkpoints/step_4/$f" \
    || fail "2-rank sft on the interpreted GPU: $f differs from the CPU run's"
done
for f in model.safetensors optimizer.bin; do
  cmp "$T/ep2dev/checkpoints/step_4/$f" "$T/ep2/checkpoints/step_4/$f" \
    || fail "2-rank expert-parallel sft on the interpreted GPU: $f differs from the CPU run's"
done

python3 - "$T" <<'PY'
import sys
import run_files
t = sys.argv[1]

def metrics(run):
    return run_files.metrics(f"{t}/{run}")

def weights(run):
    return run_files.weights(f"{t}/{run}", 4)

single = metrics("single")
for run in ("dp2", "ep2", "ep4", "cut"):
    ms = metrics(run)
    assert [m["step"] for m in ms] == [1, 2, 3, 4], (run, [m["step"] for m in ms])
    a, b = ms[0]["train/loss"], single[0]["train/loss"]
    assert abs(a - b) <= 1e-9 * abs(b), (run, a, b)
    for x, y in zip(ms, single):
        assert abs(x["train/loss"] - y["train/loss"]) <= 1e-4 * abs(y["train/loss"]), (run, x, y)
        assert x["train/tokens"] == y["train/tokens"], (run, x["train/tokens"], y["train/tokens"])
lr, updates = 1e-3, 4
ref = weights("single")
n = sum(len(v) for v in ref.values())
for run in ("dp2", "ep2", "ep4"):
    w = weights(run)
    d = run_files.assert_close(ref, w, lr, updates, run)
    print(f"{run}: max |dw| {d:.3g} vs one process over {n} weights")
PY

if timeout -k 5 60 "${MPI[@]}" -np 2 "$BIN" sft --config "$T/sft.toml" --out "$T/bad" --set dist.rollout_ranks=1 \
    > "$T/bad.log" 2>&1; then fail "rollout_ranks in sft was accepted"; fi
grep -q "\[dist\] rollout_ranks = 1: sft generates nothing" "$T/bad.log" || { cat "$T/bad.log"; fail "bad: no clear error"; }
echo PASS
