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
#  3. refused configs: max_weight_staleness > 0, too few ranks;
#  4. SIGKILL of the rollout rank mid-run ends the job within 30 s, and the
#     last checkpoint is whole: a single-process --resume finishes from it.
# usage: rl_mpi_test.sh MPIEXEC LOCKSTEP_BINARY
set -euo pipefail
MPIEXEC=$1
BIN=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export LOCKSTEP_THREADS=1
MPI=("$MPIEXEC" --allow-run-as-root --oversubscribe -x LOCKSTEP_THREADS=1)
fail() { echo "FAIL: $*"; exit 1; }

cat > "$T/model.toml" <<'TOML'
[model]
architecture = "Qwen3MoeForCausalLM"
vocab_size = 272
hidden_size = 32
num_layers = 2
num_heads = 4
num_kv_heads = 2
head_dim = 8
qk_norm = true
num_experts = 4
num_experts_per_tok = 2
moe_intermediate_size = 32
norm_topk_prob = true
max_position_embeddings = 256
init_seed = 5
init_std = 0.5
TOML
"$BIN" init --config "$T/model.toml" --out "$T/model" --threads 1 > "$T/init.log" 2>&1 || { cat "$T/init.log"; exit 1; }
# Any single digit is a correct answer: a random model finds one now and then,
# so the groups' rewards differ and the policy gradient is not zero.
python3 - "$T" <<'PY'
import json, sys
t = sys.argv[1]
with open(f"{t}/train.jsonl", "w") as f:
    for a in range(1, 9):
        f.write(json.dumps({"prompt": f"{a}+{a % 3}=", "label": [str(d) for d in range(10)]}) + "\n")
with open(f"{t}/test.jsonl", "w") as f:
    for a in range(1, 4):
        f.write(json.dumps({"prompt": f"{a}+1=", "label": str(a + 1)}) + "\n")
PY
cat > "$T/rl.toml" <<TOML
[model]
path = "$T/model"

[data]
train_file = "$T/train.jsonl"
eval_file = "$T/test.jsonl"
apply_chat_template = false

[rollout]
batch_size = 4
n = 8
temperature = 1.0
max_new_tokens = 8
precision = "f32"

[train]
steps = 3
lr = 1e-3
micro_batch_tokens = 64
seed = 3

[algo]
advantage = "grpo"
loss_agg = "token-mean"
num_steps_per_rollout = 2

[reward]
type = "math"
extractors = ["last_number"]
format_reward = 0.5

[eval]
name = "test"
n = 2
max_new_tokens = 8
interval = 2

[log]
progress = false

[dist]
timeout_s = 60
TOML

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
grep -q "1 trainer, 1 rollout rank" "$T/d11.log" || fail "d11: no role line"
grep -q "rollout 0/1: served" "$T/d11.log" || fail "d11: the rollout rank did not stop cleanly"
grep -q "2 trainers (data parallel), colocated" "$T/d20.log" || fail "d20: no role line"

python3 - "$T" <<'PY'
import array, json, struct, sys
t = sys.argv[1]

def metrics(run):
    return [json.loads(line) for line in open(f"{t}/{run}/metrics.jsonl")]

def weights(run):
    b = open(f"{t}/{run}/checkpoints/step_3/model.safetensors", "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    header, data = json.loads(b[8:8 + n]), b[8 + n:]
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        assert v["dtype"] == "F32", (k, v["dtype"])
        s, e = v["data_offsets"]
        a = array.array("f")
        a.frombytes(data[s:e])
        out[k] = a
    return out

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
diffs = [abs(x - y) for k in ref for x, y in zip(ref[k], dp[k])]
assert max(diffs) <= lr * 2 * updates, max(diffs)
assert sum(d > 1e-6 for d in diffs) <= n / 1000, sum(d > 1e-6 for d in diffs)
print(f"1+1 bitwise equal; 2 trainers: max |dw| {max(diffs):.3g} over {n} weights")
PY

# Refused configs: every rank says why, the job ends.
if timeout -k 5 60 "${MPI[@]}" -np 2 "$BIN" rl --config "$T/rl.toml" --out "$T/bad1" --set dist.rollout_ranks=1 \
    --set dist.max_weight_staleness=1 > "$T/bad1.log" 2>&1; then fail "max_weight_staleness = 1 was accepted"; fi
grep -q "max_weight_staleness = 1: generating with weights older" "$T/bad1.log" || { cat "$T/bad1.log"; fail "bad1"; }
if timeout -k 5 60 "${MPI[@]}" -np 2 "$BIN" rl --config "$T/rl.toml" --out "$T/bad2" --set dist.rollout_ranks=2 \
    > "$T/bad2.log" 2>&1; then fail "rollout_ranks = 2 of 2 ranks was accepted"; fi
grep -q "rollout_ranks = 2 leaves no trainer rank" "$T/bad2.log" || { cat "$T/bad2.log"; fail "bad2"; }

# SIGKILL the rollout rank mid-run: the launcher ends the job, the last
# checkpoint stays whole.
run="$T/killed"
start=$(date +%s)
timeout -k 5 60 "${MPI[@]}" -np 2 "$BIN" rl --config "$T/rl.toml" --out "$run" --set dist.rollout_ranks=1 \
  --set train.steps=100000 --set train.save_interval=2 --set eval.interval=0 > "$T/killed.log" 2>&1 &
launcher=$!
victim=""
for _ in $(seq 1 300); do
  if [ -z "$victim" ]; then
    for p in $(pgrep -P "$launcher" 2>/dev/null; for c in $(pgrep -P "$launcher" 2>/dev/null); do pgrep -P "$c"; done); do
      if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1"; then victim=$p; fi
    done
  fi
  if [ -n "$victim" ] && [ -f "$run/checkpoints/latest" ] && [ "$(cat "$run/checkpoints/latest")" != "step_2" ]; then
    break
  fi
  sleep 0.1
done
[ -n "$victim" ] || { kill "$launcher" 2>/dev/null; cat "$T/killed.log"; fail "rollout rank process not found"; }
[ -f "$run/checkpoints/latest" ] || { kill "$launcher" 2>/dev/null; cat "$T/killed.log"; fail "no checkpoint"; }
kill -9 "$victim"
kill_time=$(date +%s)
rc=0
wait "$launcher" || rc=$?
elapsed=$(( $(date +%s) - kill_time ))
[ "$rc" -ne 0 ] || fail "the job returned 0 after its rollout rank was killed"
[ "$elapsed" -lt 30 ] || fail "the job took ${elapsed} s to end after the kill"
last=$(cat "$run/checkpoints/latest")
step=${last#step_}
"$BIN" rl --config "$T/rl.toml" --out "$run" --resume --set train.steps=$((step + 1)) --set eval.interval=0 \
  --set dist.timeout_s=0 > "$T/resume.log" 2>&1 || { cat "$T/resume.log"; fail "resume from $last"; }
grep -q "resumed from" "$T/resume.log" || fail "did not resume"
echo "killed rollout rank: job ended (rc $rc) ${elapsed} s after the kill, resumed from $last"
echo "PASS ($(( $(date +%s) - start )) s for the fault part)"
