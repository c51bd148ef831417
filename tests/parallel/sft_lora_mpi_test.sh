#!/usr/bin/env bash
# `lockstep sft` with [lora] as a 2-rank data-parallel MPI job, on the tiny
# 4-expert MoE model of rl_mpi_setup.sh, against the same config run as one
# process: the adapters' gradients are summed over the ranks (the base takes
# none), so step 1's loss matches the single process to 1e-9 relative and the
# final adapters agree within the data-parallel tolerance (another summation
# order); the base in the checkpoints is the start model, bit for bit; and
# [lora] with expert_parallel = 2 is refused with the reason.
# usage: sft_lora_mpi_test.sh MPIEXEC LOCKSTEP_BINARY
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
lr = 1e-2
micro_batch_tokens = 32
seed = 1

[lora]
rank = 4
alpha = 8
target_modules = ["all-linear"]
init_seed = 2
TOML

"$BIN" sft --config "$T/sft.toml" --out "$T/single" > "$T/single.log" 2>&1 || { cat "$T/single.log"; fail "single"; }
timeout -k 5 100 "${MPI[@]}" -np 2 "$BIN" sft --config "$T/sft.toml" --out "$T/dp2" > "$T/dp2.log" 2>&1 \
  || { cat "$T/dp2.log"; fail "dp2: the job failed"; }
grep -q "2 data-parallel trainer ranks" "$T/dp2.log" || { cat "$T/dp2.log"; fail "dp2: no role line"; }
if timeout -k 5 100 "${MPI[@]}" -np 2 "$BIN" sft --config "$T/sft.toml" --out "$T/ep2" \
  --set dist.expert_parallel=2 > "$T/ep2.log" 2>&1; then
  fail "[lora] with expert_parallel = 2 was accepted"
fi
grep -q "expert_parallel" "$T/ep2.log" || { cat "$T/ep2.log"; fail "ep2: no reason given"; }

python3 - "$T" <<'PY'
import json, struct, sys
t = sys.argv[1]
def tensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for k, v in header.items():
        assert v["dtype"] == "F32", (k, v["dtype"])
        b = raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]
        out[k] = struct.unpack(f"<{len(b) // 4}f", b)
    return out
def losses(run):
    return [json.loads(l)["train/loss"] for l in open(f"{t}/{run}/metrics.jsonl") if "train/loss" in l]
one, two = losses("single"), losses("dp2")
assert len(one) == len(two) == 4, (one, two)
assert abs(one[0] - two[0]) <= 1e-9 * abs(one[0]), (one[0], two[0])
a = tensors(f"{t}/single/checkpoints/step_4/adapter_model.safetensors")
b = tensors(f"{t}/dp2/checkpoints/step_4/adapter_model.safetensors")
assert a.keys() == b.keys()
worst = max(abs(x - y) for k in a for x, y in zip(a[k], b[k]))
scale = max(abs(x) for k in a for x in a[k])
assert worst <= 1e-3 * scale, (worst, scale)
assert any(x != 0 for k in a if "lora_B" in k for x in a[k]), "B never moved"
w0 = tensors(f"{t}/model/model.safetensors")
for run in ("single", "dp2"):
    w = tensors(f"{t}/{run}/checkpoints/step_4/model.safetensors")
    assert w == w0, f"{run}: the frozen base moved"
print(f"sft lora dp2: step-1 loss {one[0]:.6f}, adapters within {worst:.3g} of one process (max |w| {scale:.3g})")
PY
echo "sft_lora_mpi: OK"
