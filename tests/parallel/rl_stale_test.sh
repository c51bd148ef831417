#!/usr/bin/env bash
# `lockstep rl` with the rollout one step ahead of training ([dist]
# max_weight_staleness = 1, docs/distributed.md), 1 trainer + 1 rollout rank,
# on the tiny MoE model of rl_mpi_setup.sh:
#  1. 4 steps: every metrics line parses; rollout/weight_staleness is 0 on
#     step 1 and 1 after it, where the on-policy shortcut is off (old
#     logprobs recomputed) and the off-policy gap shows; the checkpoint of
#     step 2 (step 3 in flight) saves a prompt cursor before step 3's prompts;
#     the final checkpoint loads (`lockstep eval` on it);
#  2. a second identical run ends with a byte-identical model.safetensors;
#     2 trainers + 1 rollout rank run one step ahead too;
#  3. SIGKILL of the trainer root mid-run, then --resume under mpirun: every
#     step appears once, the first resumed step regenerates on the
#     checkpoint's weights (staleness 0);
#  4. one process with max_weight_staleness = 1 (the engine on a thread of
#     its own) ends with the weights, optimizer state and metrics of run 1;
#     two colocated trainers with it are refused, naming the key.
# usage: rl_stale_test.sh MPIEXEC LOCKSTEP_BINARY
source "$(dirname "$0")/mpi_test_lib.sh"

source "$(dirname "$0")/rl_mpi_setup.sh"
STALE=(--set dist.rollout_ranks=1 --set dist.max_weight_staleness=1)

run_stale() {  # run_stale NAME --set ...
  local name=$1
  shift
  timeout -k 5 100 "${MPI[@]}" -np 2 "$BIN" rl --config "$T/rl.toml" --out "$T/$name" "${STALE[@]}" "$@" \
    > "$T/$name.log" 2>&1 || { cat "$T/$name.log"; fail "$name: the job failed"; }
}

run_stale s1 --set train.steps=4 --set train.save_interval=2
run_stale s2 --set train.steps=4 --set train.save_interval=2
# 2 data-parallel trainers: the second trainer receives each batch from the root.
timeout -k 5 100 "${MPI[@]}" -np 3 "$BIN" rl --config "$T/rl.toml" --out "$T/s21" "${STALE[@]}" > "$T/s21.log" 2>&1 \
  || { cat "$T/s21.log"; fail "s21: the job failed"; }
grep -q "rollout one step ahead of training (max_weight_staleness = 1)" "$T/s1.log" || fail "s1: no role line"
grep -q "rollout 0/1: served" "$T/s1.log" || fail "s1: the rollout rank did not stop cleanly"
cmp -s "$T/s1/checkpoints/step_4/model.safetensors" "$T/s2/checkpoints/step_4/model.safetensors" \
  || fail "two identical stale runs end with different weights"
"$BIN" eval --model "$T/s1/checkpoints/step_4" --data "$T/test.jsonl" --n 1 --max-new-tokens 4 --no-chat-template \
  --threads 1 --output "$T/s1-eval.jsonl" > "$T/s1-eval.log" 2>&1 || { cat "$T/s1-eval.log"; fail "final checkpoint"; }

python3 - "$T" <<'PY'
import json, sys
t = sys.argv[1]
ms = [json.loads(line) for line in open(f"{t}/s1/metrics.jsonl")]  # every line must parse
assert [m["step"] for m in ms] == [0, 1, 2, 3, 4], [m["step"] for m in ms]
for m in ms[1:]:
    s, stale = m["step"], m["rollout/weight_staleness"]
    assert stale == (0 if s == 1 else 1), (s, stale)
    assert m["train/on_policy_shortcut"] == (1 if s == 1 else 0), (s, m["train/on_policy_shortcut"])
    if s > 1:  # generated one update behind the weights that score them
        assert m["train/train_rollout_logprob_abs_diff"] > 0, (s, m)
    assert m["perf/rollout_wait_time_s"] >= 0 and m["perf/step_time_s"] > 0, (s, m)
    # Weights go out after the collect at the start of a step; none on step 1
    # (the rollout holds them) or step 3 (step 2's eval sent them already).
    assert (m["perf/weight_sync_s"] > 0) == (s in (2, 4)), (s, m["perf/weight_sync_s"])
s21 = [json.loads(line) for line in open(f"{t}/s21/metrics.jsonl")]
assert [m["rollout/weight_staleness"] for m in s21[1:]] == [0, 1, 1], s21
for step, cursor in ((2, 8), (4, 16)):  # 4 prompts a step; step 3's (8..11) were in flight at step 2
    state = json.load(open(f"{t}/s1/checkpoints/step_{step}/trainer_state.json"))
    assert state["prompt_cursor"] == cursor, (step, state)
print("stale run: staleness", [m["rollout/weight_staleness"] for m in ms[1:]],
      "rollout wait s", [round(m["perf/rollout_wait_time_s"], 3) for m in ms[1:]])
PY

# SIGKILL the trainer root while the rollout rank generates ahead; resume the
# job from the last checkpoint.
run="$T/killed"
timeout -k 5 60 "${MPI[@]}" -np 2 "$BIN" rl --config "$T/rl.toml" --out "$run" "${STALE[@]}" \
  --set train.steps=100000 --set train.save_interval=2 --set eval.interval=0 > "$T/killed.log" 2>&1 &
launcher=$!
kill_rank_after_checkpoint "$launcher" 0 "$run" "$T/killed.log"
rc=0
wait "$launcher" || rc=$?
[ "$rc" -ne 0 ] || fail "the job returned 0 after its trainer root was killed"
last=$(cat "$run/checkpoints/latest")
step=${last#step_}
run_stale killed --resume --set train.steps=$((step + 2)) --set eval.interval=0
grep -q "resumed from" "$T/killed.log" || fail "did not resume"
python3 - "$run" "$step" <<'PY'
import json, sys
run, step = sys.argv[1], int(sys.argv[2])
ms = [json.loads(line) for line in open(f"{run}/metrics.jsonl")]
steps = [m["step"] for m in ms]
assert steps == list(range(0, step + 3)), steps  # step 0: the eval before the first step
# The resumed run regenerates the prompts that were in flight on the
# checkpoint's weights (on-policy), then runs one step ahead again.
stale = [m["rollout/weight_staleness"] for m in ms[1:]]
assert stale == [0] + [1] * (step - 1) + [0, 1], stale
print(f"killed after the checkpoint of step {step}, resumed: steps 0..{step + 2} once each")
PY

# One process, max_weight_staleness = 1 (no rollout ranks): the engine
# generates ahead on a thread of its own, with the semantics of a rollout
# rank, so the run ends with s1's weights and metrics bit for bit.
"$BIN" rl --config "$T/rl.toml" --out "$T/one" --set dist.max_weight_staleness=1 --set dist.rollout_threads=1 \
  --set train.steps=4 --set train.save_interval=2 > "$T/one.log" 2>&1 || { cat "$T/one.log"; fail "one: failed"; }
grep -q "rollout one step ahead of training on 1 thread of its own" "$T/one.log" \
  || { cat "$T/one.log"; fail "one: no rollout-ahead line"; }
cmp -s "$T/s1/checkpoints/step_4/model.safetensors" "$T/one/checkpoints/step_4/model.safetensors" \
  || fail "one process ahead and one rollout rank ahead end with different weights"
cmp -s "$T/s1/checkpoints/step_4/optimizer.bin" "$T/one/checkpoints/step_4/optimizer.bin" \
  || fail "one process ahead and one rollout rank ahead end with different optimizer states"
python3 - "$T" <<'PY'
import json, sys
t = sys.argv[1]
a = [json.loads(line) for line in open(f"{t}/s1/metrics.jsonl")]
b = [json.loads(line) for line in open(f"{t}/one/metrics.jsonl")]
assert len(a) == len(b) == 5, (len(a), len(b))
compared = 0
for x, y in zip(a, b):
    keys = [k for k in x if k in y and not k.startswith("perf/") and not k.endswith("_s") and k != "time"]
    for k in keys:
        assert x[k] == y[k], (x["step"], k, x[k], y[k])
    compared += len(keys)
for k in ("rollout/reward_mean", "train/pg_loss", "train/grad_norm", "rollout/weight_staleness",
          "train/train_rollout_logprob_abs_diff"):
    assert all(k in m for m in b[1:]), k
assert all(m["perf/rollout_wait_time_s"] >= 0 for m in b[1:])
print(f"one process ahead == one rollout rank ahead: {compared} metric values equal")
PY

# Refused: several colocated trainers generate shares themselves.
if "${MPI[@]}" -np 2 "$BIN" rl --config "$T/rl.toml" --out "$T/bad" --set dist.max_weight_staleness=1 \
  --set dist.trainer_ranks=2 > "$T/bad.log" 2>&1; then
  fail "max_weight_staleness = 1 with two colocated trainers was accepted"
fi
grep -q "max_weight_staleness = 1 with several colocated trainers" "$T/bad.log" \
  || { cat "$T/bad.log"; fail "bad: wrong error"; }
[ ! -e "$T/bad/metrics.jsonl" ] || fail "bad: the refused run wrote metrics"
echo PASS
