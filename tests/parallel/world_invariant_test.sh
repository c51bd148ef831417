#!/usr/bin/env bash
# [dist] world_invariant = true (docs/distributed.md): `lockstep sft` or
# `lockstep rl` (colocated trainers, and 2 trainers + 1 rollout rank) on 1, 2,
# 3 and 4 data-parallel trainer ranks ends with byte-identical checkpoint files (weights, optimizer state,
# trainer state) and identical metrics.jsonl rows, timing fields (perf/*,
# eval/*/time_s, eval/*/tokens_per_s) excepted; a 2-rank run stopped after step 2 and resumed on 1 and on 4 ranks
# ends byte-identical to the uninterrupted 2-rank run; 2 ranks with
# model.device = "interpret" (EP: expert_parallel = 2 on it) end as the CPU
# does. The same runs with
# world_invariant = false differ (the negative control).
# sft-v4 and rl-v4 run the same on the micro DeepSeek-V4 model.
# sft-ep and rl-ep (sft-v4-ep, rl-v4-ep: on DeepSeek-V4): expert parallelism. EP = 2 and 4, EP = 2 x DP = 2 (and for
# rl EP = 2 fed by a rollout rank) end as one process does; an EP = 2 run
# stopped after step 2 and resumed on 1 process and on EP = 4 too; without
# world_invariant EP = 2 and 1 process differ.
# usage: world_invariant_test.sh MPIEXEC LOCKSTEP_BINARY sft|rl|sft-v4|rl-v4|sft-ep|rl-ep|sft-v4-ep|rl-v4-ep
source "$(dirname "$0")/mpi_test_lib.sh"
KIND=$3
export MODEL_ARCH=moe
EP=0
case "$KIND" in *-ep) EP=1; KIND=${KIND%-ep} ;; esac
case "$KIND" in *-v4) MODEL_ARCH=v4; KIND=${KIND%-v4} ;; esac
source "$(dirname "$0")/rl_mpi_setup.sh"

if [ "$KIND" = sft ]; then
  python3 - "$T" <<'PY'
import json, sys
t = sys.argv[1]
with open(f"{t}/sft.jsonl", "w") as f:
    for a in range(60):
        b = (a * 7) % 13
        f.write(json.dumps({"prompt": f"{a}+{b}=", "response": f"{a + b}"}) + "\n")
PY
  cat > "$T/run.toml" <<TOML
[model]
path = "$T/model"

[data]
train_file = "$T/sft.jsonl"
apply_chat_template = false

[train]
steps = 4
batch_size = 12
lr = 1e-3
micro_batch_tokens = 16
save_interval = 2
seed = 1
TOML
  STEPS=4
else
  # rl.toml of rl_mpi_setup.sh (3 steps, 2 updates per batch, eval every 2
  # steps), with micro-batches small enough to give every rank some.
  sed -e 's/^micro_batch_tokens = 64/micro_batch_tokens = 24/' -e 's/^steps = 3/steps = 3\nsave_interval = 2/' \
    "$T/rl.toml" > "$T/run.toml"
  grep -q "micro_batch_tokens = 24" "$T/run.toml" || fail "run.toml: micro_batch_tokens not set"
  STEPS=3
fi

run() {  # run NAME NP [--set ...]: NP = 1 runs one plain process
  local name=$1 np=$2
  shift 2
  local cmd=("$BIN" "$KIND" --config "$T/run.toml" --out "$T/$name" --set dist.world_invariant=true "$@")
  if [ "$np" = 1 ]; then
    timeout -k 5 100 "${cmd[@]}" > "$T/$name.log" 2>&1 || { cat "$T/$name.log"; fail "$name: the run failed"; }
  else
    timeout -k 5 100 "${MPI[@]}" -np "$np" "${cmd[@]}" > "$T/$name.log" 2>&1 \
      || { cat "$T/$name.log"; fail "$name: the job failed"; }
  fi
}

same_checkpoint() {  # same_checkpoint A B: every file of the last checkpoint, byte for byte
  local a="$T/$1/checkpoints/step_$STEPS" b="$T/$2/checkpoints/step_$STEPS" f
  [ -f "$a/model.safetensors" ] && [ -f "$a/optimizer.bin" ] || fail "$1: no checkpoint step_$STEPS"
  for f in $(cd "$a" && ls); do
    cmp -s "$a/$f" "$b/$f" || fail "$2 differs from $1 in checkpoints/step_$STEPS/$f"
  done
}

run r1 1
if [ "$EP" = 1 ]; then
  run e2 2 --set dist.expert_parallel=2
  run e4 4 --set dist.expert_parallel=4
  run e22 4 --set dist.expert_parallel=2
  # On the interpreted GPU (strict): the expert exchanges, the per-source
  # folds and the gathered checkpoint through copies.
  run e2dev 2 --set dist.expert_parallel=2 --set model.device=interpret
  COMPARED=(e2 e4 e22 e2dev cut1 cut4)
  if [ "$KIND" = rl ]; then  # EP = 2 trainers fed by a rollout rank
    run d21 3 --set dist.rollout_ranks=1 --set dist.expert_parallel=2
    COMPARED+=(d21)
  fi
  run cut 2 --set train.steps=2 --set dist.expert_parallel=2
  cp -r "$T/cut" "$T/cut1"
  cp -r "$T/cut" "$T/cut4"
  run cut1 1 --resume
  run cut4 4 --resume --set dist.expert_parallel=4
else
  run r2 2
  run r3 3
  run r4 4
  # The trainers on the interpreted GPU (strict: gradients, exact sums and
  # norms reach the host only through copies): the CPU's bytes.
  run r2dev 2 --set model.device=interpret
  COMPARED=(r2 r3 r4 r2dev cut1 cut4)
  if [ "$KIND" = rl ]; then  # 2 trainers fed by a rollout rank: the same samples, the same result
    run d21 3 --set dist.rollout_ranks=1
    COMPARED+=(d21)
  fi
  run cut 2 --set train.steps=2
  cp -r "$T/cut" "$T/cut1"
  cp -r "$T/cut" "$T/cut4"
  run cut1 1 --resume
  run cut4 4 --resume
fi
for r in "${COMPARED[@]}"; do same_checkpoint r1 $r; done
[ "$(cat "$T/cut/checkpoints/latest")" = step_2 ] || fail "cut: the 2-step run did not end at step_2"
for r in cut1 cut4; do
  if grep -q "no checkpoint" "$T/$r.log"; then cat "$T/$r.log"; fail "$r: did not resume"; fi
done

# The negative control: without world_invariant, 1 process and 3 ranks (EP:
# 2 expert-parallel ranks) differ.
if [ "$EP" = 1 ]; then PLAIN=(-np 2 "$BIN" "$KIND" --set dist.expert_parallel=2); else PLAIN=(-np 3 "$BIN" "$KIND"); fi
timeout -k 5 100 "$BIN" "$KIND" --config "$T/run.toml" --out "$T/plain1" > "$T/plain1.log" 2>&1 \
  || { cat "$T/plain1.log"; fail "plain1"; }
timeout -k 5 100 "${MPI[@]}" "${PLAIN[@]}" --config "$T/run.toml" --out "$T/plainN" > "$T/plainN.log" 2>&1 \
  || { cat "$T/plainN.log"; fail "plainN"; }
if cmp -s "$T/plain1/checkpoints/step_$STEPS/model.safetensors" "$T/plainN/checkpoints/step_$STEPS/model.safetensors"; then
  fail "without world_invariant 1 process and ${PLAIN[*]:0:2} ranks gave the same weights: the test shows nothing"
fi

python3 - "$T" "$STEPS" "${COMPARED[@]}" <<'PY'
import sys
import run_files
t, steps = sys.argv[1], int(sys.argv[2])

def timing(k):
    # Seconds and rates measure the machine, not the run: perf/*, eval's
    # eval/NAME/time_s and eval/NAME/tokens_per_s, and each line's wall-clock time.
    return k.startswith("perf/") or k.endswith("/time_s") or k.endswith("_per_s") or k == "time"

def rows(run):
    return [{k: v for k, v in m.items() if not timing(k)} for m in run_files.metrics(f"{t}/{run}")]

ref = rows("r1")
assert ref[-1]["step"] == steps, ref[-1]
assert any(k.startswith("train/") for k in ref[-1]), ref[-1]
for run in sys.argv[3:]:
    got = rows(run)
    assert len(got) == len(ref), (run, len(got), len(ref))
    for a, b in zip(ref, got):
        assert a == b, (run, a["step"], {k: (a.get(k), b.get(k)) for k in set(a) | set(b) if a.get(k) != b.get(k)})
print("fields compared:", sorted(set().union(*ref)))
print("timing fields left out:", sorted({k for m in run_files.metrics(f"{t}/r1") for k in m if timing(k)}))
# Not vacuous: the runs trained on a real gradient.
assert any(m.get("train/grad_norm", 0) > 0 for m in ref), ref
print(f"{len(ref)} metrics rows of 1 process identical in", ", ".join(sys.argv[3:]))
PY

echo PASS
