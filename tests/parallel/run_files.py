"""Readers of a lockstep run directory for the MPI shell tests."""
import array
import json
import struct


def metrics(run_dir):
    """Every line of RUN/metrics.jsonl, parsed."""
    with open(f"{run_dir}/metrics.jsonl") as f:
        return [json.loads(line) for line in f]


def weights(run_dir, step):
    """{tensor name: array of f32} of RUN/checkpoints/step_STEP/model.safetensors."""
    with open(f"{run_dir}/checkpoints/step_{step}/model.safetensors", "rb") as f:
        b = f.read()
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


def assert_close(a, b, lr, updates, what):
    """The data-parallel tolerance of docs/distributed.md between two sets of
    weights after `updates` AdamW steps at `lr`: every weight within
    2 * lr * updates, at most 0.1 % of them off by more than 1e-6. Returns the
    largest difference."""
    diffs = [abs(x - y) for k in a for x, y in zip(a[k], b[k])]
    assert len(diffs) == sum(len(v) for v in a.values()), (what, "tensors differ")
    assert max(diffs) <= lr * 2 * updates, (what, max(diffs))
    loose = sum(d > 1e-6 for d in diffs)
    assert loose <= len(diffs) / 1000, (what, loose, len(diffs))
    return max(diffs)
