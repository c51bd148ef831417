#!/usr/bin/env bash
# `lockstep rl` with [lora] as an MPI job of one trainer rank and one rollout
# rank (docs/rl.md, "LoRA"), on the tiny MoE model of rl_mpi_setup.sh: every
# weight sync carries only the adapters (perf/weight_sync_* says how many bytes
# moved), the gap stays exactly 0 at every step,
# and the run ends with the adapters and metrics of the same config run as one
# process (the same samples, the same updates), bit for bit; so does the same
# job with both ranks on the interpreted GPU (model.device = "interpret").
# usage: rl_lora_mpi_test.sh MPIEXEC LOCKSTEP_BINARY
source "$(dirname "$0")/mpi_test_lib.sh"

source "$(dirname "$0")/rl_mpi_setup.sh"
lora=(--set lora.rank=4 --set lora.alpha=8 --set 'lora.target_modules=["all-linear"]' --set lora.init_seed=2
      --set train.lr=1e-2 --set eval.interval=0 --set train.save_interval=3)
"$BIN" rl --config "$T/rl.toml" --out "$T/one" "${lora[@]}" > "$T/one.log" 2>&1 || { cat "$T/one.log"; fail "one process"; }
timeout -k 5 120 "${MPI[@]}" -np 2 "$BIN" rl --config "$T/rl.toml" --out "$T/two" "${lora[@]}" \
  --set dist.rollout_ranks=1 > "$T/two.log" 2>&1 || { cat "$T/two.log"; fail "the 2-rank job failed"; }
grep -q "1 rollout rank" "$T/two.log" || { cat "$T/two.log"; fail "no role line"; }
# Both ranks on the interpreted GPU (strict): the rollout rank copies the
# adapters it receives into its engine's device memory.
timeout -k 5 120 "${MPI[@]}" -np 2 "$BIN" rl --config "$T/rl.toml" --out "$T/twodev" "${lora[@]}" \
  --set dist.rollout_ranks=1 --set model.device=interpret > "$T/twodev.log" 2>&1 ||
  { cat "$T/twodev.log"; fail "the 2-rank job on the interpreted GPU failed"; }
if timeout -k 5 60 "${MPI[@]}" -np 2 "$BIN" rl --config "$T/rl.toml" --out "$T/dp" "${lora[@]}" > "$T/dp.log" 2>&1; then
  fail "[lora] with two trainer ranks was accepted"
fi
grep -q "one trainer rank" "$T/dp.log" || { cat "$T/dp.log"; fail "two trainer ranks: no reason given"; }

python3 - "$T" <<'PY'
import json, sys
t = sys.argv[1]
def metrics(run):
    out = []
    for l in open(f"{t}/{run}/metrics.jsonl"):
        m = json.loads(l)
        out.append({k: v for k, v in m.items() if not k.startswith("perf/") and not k.endswith("time_s")
                    and k != "time" and "sync" not in k and not k.endswith("tokens_per_s")})
    return out
one, two = metrics("one"), metrics("two")
trained = [m for m in two if "train/train_rollout_logprob_abs_diff_max" in m]
assert trained, two
for m in trained:
    assert m["train/train_rollout_logprob_abs_diff_max"] == 0, m
for p, q in zip(one, two):
    diff = {k: (p.get(k), q.get(k)) for k in set(p) | set(q) if p.get(k) != q.get(k)}
    assert not diff, diff
a = open(f"{t}/one/checkpoints/latest").read().strip()
b = open(f"{t}/two/checkpoints/latest").read().strip()
assert a == b, (a, b)
x = open(f"{t}/one/checkpoints/{a}/adapter_model.safetensors", "rb").read()
y = open(f"{t}/two/checkpoints/{b}/adapter_model.safetensors", "rb").read()
assert x == y, "rollout ranks with LoRA ended with other adapters than one process"
z = open(f"{t}/twodev/checkpoints/{b}/adapter_model.safetensors", "rb").read()
assert z == y, "rollout ranks with LoRA on the interpreted GPU ended with other adapters than on the CPU"
assert metrics("twodev") == two, "rollout ranks with LoRA on the interpreted GPU: other metrics than on the CPU"
# What a sync moved: the adapters' floats, not the model's.
import struct
n = struct.unpack("<Q", y[:8])[0]
header = json.loads(y[8:8 + n])
header.pop("__metadata__", None)
adapter_bytes = sum(v["data_offsets"][1] - v["data_offsets"][0] for v in header.values())
for l in open(f"{t}/two/metrics.jsonl"):
    m = json.loads(l)
    if m.get("perf/weight_sync_s", 0) > 0:
        moved = m["perf/weight_sync_gb_per_s"] * 1e9 * m["perf/weight_sync_s"]
        assert abs(moved - adapter_bytes) <= 0.01 * adapter_bytes, (moved, adapter_bytes)
PY
echo "rl_lora_mpi: OK"
