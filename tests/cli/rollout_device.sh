#!/usr/bin/env bash
# [rollout] device: one RL run with the rollout engine on the interpreted GPU
# kernels and the trainer on the CPU kernels (the weight sync copies the
# trainer's master into device memory). The demo's SFT warm-up and GRPO
# steps with evaluation, `--set rollout.device=interpret`, against the same
# run all on the CPU: every metric equal (rewards, lengths, evaluation, the
# rollout-trainer logprob gap 0 at every step) and the checkpoints, optimizer
# state included, byte for byte. The same with [lora] adapters (their copy on
# the engine's device refreshed at every sync). Then the errors: an unknown device names the
# key; a rollout on the CPU beside a trainer on a device is refused.
# Strict interpret mode: host code touching device memory stops the run.
set -euo pipefail
unset LOCKSTEP_INTERPRET_HOST_ACCESS
BIN=$1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
short=(--sft-steps 2 --rl-steps 2 --threads 2 --set eval.interval=2 --set rollout.batch_size=4 --set eval.n=1
  --force)

"$BIN" demo --out "$T/cpu" "${short[@]}" --device cpu >"$T/cpu.log" 2>&1 || { tail -30 "$T/cpu.log"; exit 1; }
"$BIN" demo --out "$T/mix" "${short[@]}" --device cpu --set rollout.device=interpret >"$T/mix.log" 2>&1 ||
  { tail -30 "$T/mix.log"; exit 1; }
grep -q "rollout: the engine on interpret, the trainer on the CPU" "$T/mix.log" ||
  { echo "the mixed run did not put the rollout engine on the interpret backend"; exit 1; }
grep -q "rollout: the engine on" "$T/cpu.log" && { echo "the CPU run's engine left the CPU"; exit 1; }

/usr/bin/python3 - "$T/cpu" "$T/mix" <<'PY'
import json, sys
def load(path):
    return [{k: v for k, v in json.loads(l).items()
             if not k.startswith("perf/") and "time" not in k and not k.endswith("per_s")} for l in open(path)]
a, b = load(f"{sys.argv[1]}/metrics.jsonl"), load(f"{sys.argv[2]}/metrics.jsonl")
assert len(a) > 0 and a == b, "the mixed run's metrics differ from the CPU run's"
gaps = [l["train/train_rollout_logprob_abs_diff"] for l in b if "train/train_rollout_logprob_abs_diff" in l]
maxes = [l["train/train_rollout_logprob_abs_diff_max"] for l in b if "train/train_rollout_logprob_abs_diff_max" in l]
assert len(gaps) == 2 and len(maxes) == 2, f"expected 2 RL steps with a logprob gap, got {gaps} {maxes}"
assert all(g == 0 for g in gaps + maxes), f"rollout-trainer logprob gap not 0: {gaps} {maxes}"
assert any(k.startswith("eval/") for l in b for k in l), "no evaluation in the run"
print("rollout device: metrics equal, gap 0 at", len(gaps), "steps")
PY
n=0
while IFS= read -r f; do
  cmp "$T/cpu/$f" "$T/mix/$f" || { echo "$f differs with the rollout on interpret"; exit 1; }
  n=$((n + 1))
done < <(cd "$T/cpu" && find checkpoints -type f -name '*.safetensors' -o -type f -name 'optimizer.bin' | sort)
[ "$n" -ge 2 ] || { echo "expected an RL checkpoint's weights and optimizer state, found $n files"; exit 1; }
echo "rollout device: $n checkpoint files bitwise equal"

# With [lora]: the engine on interpret reads a copy of the trainer's adapters
# in its memory, refreshed at every sync; the adapters and metrics of the
# run all on the CPU.
lora=(--set lora.rank=4 --set lora.alpha=8 --set 'lora.target_modules=["all-linear"]' --set lora.init_seed=3
      --set train.steps=2 --set train.lr=1e-2 --set eval.interval=0 --set rollout.batch_size=2 --threads 2)
for dev in cpu interpret; do
  "$BIN" rl --config "$T/cpu/config.toml" --out "$T/lora_$dev" "${lora[@]}" --set "rollout.device=\"$dev\"" \
    > "$T/lora_$dev.log" 2>&1 || { tail -30 "$T/lora_$dev.log"; exit 1; }
done
grep -q "rollout: the engine on interpret" "$T/lora_interpret.log" ||
  { echo "the LoRA run did not put the rollout engine on the interpret backend"; exit 1; }
cmp "$T/lora_cpu/checkpoints/step_2/adapter_model.safetensors" \
  "$T/lora_interpret/checkpoints/step_2/adapter_model.safetensors" ||
  { echo "LoRA with the rollout on interpret: other adapters than on the CPU"; exit 1; }
/usr/bin/python3 - "$T/lora_cpu" "$T/lora_interpret" <<'PY'
import json, sys
def load(path):
    return [{k: v for k, v in json.loads(l).items()
             if not k.startswith("perf/") and "time" not in k and not k.endswith("per_s")} for l in open(path)]
a, b = load(f"{sys.argv[1]}/metrics.jsonl"), load(f"{sys.argv[2]}/metrics.jsonl")
assert len(a) > 0 and a == b, "LoRA with the rollout on interpret: metrics differ from the CPU run's"
assert all(l["train/train_rollout_logprob_abs_diff_max"] == 0 for l in b if "train/train_rollout_logprob_abs_diff_max" in l)
PY

# An unknown device names the key and the choices.
if "$BIN" demo --out "$T/bad" "${short[@]}" --set rollout.device=tpu >"$T/bad.log" 2>&1; then
  echo "rollout.device=tpu was accepted"; exit 1
fi
grep -q "\[rollout\] device.*'tpu' is not one of: cpu, interpret, cuda, hip" "$T/bad.log" ||
  { cat "$T/bad.log"; echo "no clear error for rollout.device=tpu"; exit 1; }
# The engine packs from the trainer's master, which must be in host memory.
if "$BIN" demo --out "$T/rev" "${short[@]}" --device interpret --set rollout.device=cpu >"$T/rev.log" 2>&1; then
  echo "a CPU rollout beside a trainer on interpret was accepted"; exit 1
fi
grep -q "needs the trainer on the CPU" "$T/rev.log" || { cat "$T/rev.log"; echo "no clear error for the reverse"; exit 1; }
echo "rollout device: OK"
