#!/usr/bin/env python3
"""The throughput table of scripts/gpu-check.sh from the logs of its bench steps.

usage: gpu-throughput.py LOG...   (bench-rollout-DEVICE.log, bench-train-DEVICE.log,
                                   gemm-cublas.log; the device is the name's last part)

Prints one markdown table, a column per device: decode tok/s at each batch of
`lockstep bench rollout`, training tok/s of `lockstep bench train`, then the
table of bench_gemm_cublas (lockstep's GEMM against cuBLAS on the same shapes,
one row per shape) as a markdown table with its own columns. A log that is
missing or holds no table gives no figures; the
script fails only when no log gives any.
"""
import os
import re
import sys


def tables(text):
    """Every table of the bench output: a header line, a line of dashes, rows."""
    lines = text.splitlines()
    out = []
    for i in range(1, len(lines)):
        if re.fullmatch(r"-{10,}", lines[i].strip()) and lines[i - 1].strip():
            head = re.split(r"\s{2,}", lines[i - 1].strip())
            rows = []
            for line in lines[i + 1:]:
                cells = re.split(r"\s{2,}", line.strip())
                if not line.strip() or len(cells) != len(head):
                    break
                rows.append(dict(zip(head, cells)))
            out.append(rows)
    return out


def main(paths):
    figures = {}  # (row label) -> {device: value}
    devices = []
    gemm = []
    for path in paths:
        if not os.path.exists(path):
            continue
        name = os.path.basename(path).rsplit(".", 1)[0]
        text = open(path, errors="replace").read()
        if name.startswith("gemm"):
            gemm += [r for rows in tables(text) for r in rows if "lockstep ms" in r and "cuBLAS ms" in r]
            continue
        device = name.rsplit("-", 1)[-1]
        for rows in tables(text):
            for r in rows:
                if "decode tok/s" in r and "batch" in r:
                    figures.setdefault(f"decode tok/s, batch {r['batch']}", {})[device] = r["decode tok/s"]
                elif "tokens/s" in r and "tokens/step" in r:
                    figures.setdefault(f"training tok/s ({r['tokens/step']} tokens/step)", {})[device] = r["tokens/s"]
        if device not in devices and any(device in v for v in figures.values()):
            devices.append(device)
    if not figures and not gemm:
        print("no bench figures in: " + " ".join(paths))
        return 1
    if figures:
        print("| workload | " + " | ".join(devices) + " |")
        print("|---|" + "---|" * len(devices))
        for label, by_device in figures.items():
            print(f"| {label} | " + " | ".join(by_device.get(d, "") for d in devices) + " |")
    if gemm:
        print("\nGEMM, lockstep against cuBLAS (same shapes):")
        head = list(gemm[0].keys())
        cell = lambda c: c.replace("|", "\\|")  # max|Δ|: a literal bar in markdown
        print("| " + " | ".join(cell(h) for h in head) + " |")
        print("|---|" + "---|" * (len(head) - 1))
        for r in gemm:
            print("| " + " | ".join(cell(r.get(h, "")) for h in head) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
