#!/usr/bin/env python3
"""The table of compare.sh from the logs of one run directory.

  summarize.py RUN_DIR [--models "moe-tiny moe-small"] [--batches 1,16,64] [--half "f16 bf16"]

Reads lockstep.MODEL.PRECISION.rK.txt (the decode table of `lockstep bench
rollout`: its "decode tok/s" column) and llama.MODEL.DTYPE.cI.rK.jsonl
(llama-batched-bench --output-format jsonl: "speed_tg" = S_TG t/s per "pl"),
takes the median over the rounds K of every figure, and for llama.cpp the best
config I (by median) per cell; each --half GGUF type has a column of its own. Prints the comparison table (ratio = lockstep /
llama.cpp, > 1 means lockstep is faster), then every llama.cpp config's medians.
"""
import argparse
import glob
import json
import os
import re
import statistics


def lockstep_decode(path):
    """{batch: decode tok/s} from a `lockstep bench rollout` log."""
    out = {}
    cols = None
    for line in open(path, errors="replace"):
        line = line.rstrip("\n")
        if cols is None:
            if "decode tok/s" in line:
                cols = re.split(r"\s{2,}", line.strip())
            continue
        if set(line.strip()) <= {"-"} and line.strip():
            continue
        if not line.strip():
            break
        f = re.split(r"\s{2,}", line.strip())
        if len(f) != len(cols):
            break
        row = dict(zip(cols, f))
        out[int(row["batch"])] = float(row["decode tok/s"])
    return out


def llama_tg(path):
    out = {}
    for line in open(path, errors="replace"):
        line = line.strip()
        if line.startswith("{"):
            j = json.loads(line)
            out[int(j["pl"])] = float(j["speed_tg"])
    return out


def med(xs):
    return statistics.median(xs) if xs else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("--models", default="moe-tiny moe-small")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--half", default="f16 bf16")
    a = ap.parse_args()
    models = a.models.split()
    batches = [int(b) for b in a.batches.split(",")]
    configs = {}
    for p in sorted(glob.glob(os.path.join(a.run, "llama.config.c*"))):
        configs[p.rsplit(".", 1)[1]] = open(p).read().strip()

    spread = []

    def lock(m, prec):
        runs = [lockstep_decode(p) for p in sorted(glob.glob(os.path.join(a.run, f"lockstep.{m}.{prec}.r*.txt")))]
        spread.append(f"| {m} | {prec} | " + " | ".join(
            ", ".join(f"{r[b]:.0f}" for r in runs if b in r) or "n/a" for b in batches) + " |")
        return {b: med([r[b] for r in runs if b in r]) for b in batches}, len(runs)

    def llama(m, dts):
        """({(dtype, config): {batch: median}}, {batch: (best, label)}) over dtypes x configs."""
        per = {}
        for dt in dts:
            for c in configs:
                runs = [llama_tg(p) for p in sorted(glob.glob(os.path.join(a.run, f"llama.{m}.{dt}.{c}.r*.jsonl")))]
                per[(dt, c)] = {b: med([r[b] for r in runs if b in r]) for b in batches}
        best = {}
        for b in batches:
            cand = [(v[b], (f"{dt}, " if len(dts) > 1 else "") + configs[c]) for (dt, c), v in per.items()
                    if v[b] is not None]
            best[b] = max(cand) if cand else (None, None)
        return per, best

    def f(x):
        return "n/a" if x is None else f"{x:.0f}"

    def ratio(x, y):
        return "n/a" if x is None or y is None or y == 0 else f"{x / y:.2f}"

    halves = a.half.split()
    print("Decode tok/s, median of the rounds (ratio = lockstep / llama.cpp); llama.cpp: the best config "
          "per cell, named; one column per half-precision weight type\n")
    head = "| model | batch | lockstep f32 | llama.cpp f32 weights | ratio | lockstep bf16 |"
    rule = "|---|---|---|---|---|---|"
    for dt in halves:
        head += f" llama.cpp {dt} weights | ratio |"
        rule += "---|---|"
    print(head)
    print(rule)
    detail = []
    for m in models:
        l32, n32 = lock(m, "f32")
        l16, n16 = lock(m, "bf16")
        p32, b32 = llama(m, ["f32"])
        per_half = [llama(m, [dt]) for dt in halves]
        for b in batches:
            c32 = f" ({b32[b][1]})" if b32[b][1] else ""
            line = (f"| {m} | {b} | {f(l32[b])} | {f(b32[b][0])}{c32} | {ratio(l32[b], b32[b][0])} | "
                    f"{f(l16[b])} |")
            for _, bh in per_half:
                ch = f" ({bh[b][1]})" if bh[b][1] else ""
                line += f" {f(bh[b][0])}{ch} | {ratio(l16[b], bh[b][0])} |"
            print(line)
        for per in [p32] + [ph for ph, _ in per_half]:
            for (dt, c), v in per.items():
                detail.append(f"| {m} | {dt} | {c}: {configs[c]} | " + " | ".join(f(v[b]) for b in batches) + " |")
    print("\nllama.cpp S_TG t/s per config (median of the rounds):\n")
    print("| model | weights | config | " + " | ".join(f"B={b}" for b in batches) + " |")
    print("|---|---|---|" + "---|" * len(batches))
    print("\n".join(detail))
    print("\nlockstep decode tok/s, every round:\n")
    print("| model | precision | " + " | ".join(f"B={b}" for b in batches) + " |")
    print("|---|---|" + "---|" * len(batches))
    print("\n".join(spread))


if __name__ == "__main__":
    main()
