#!/usr/bin/env python3
"""The throughput table of scripts/gpu-check.sh from the logs of its bench steps.

usage: gpu-throughput.py LOG...   (bench-rollout-DEVICE.log, bench-train-DEVICE.log,
                                   gemm-cublas.log; the device is the name's last part)

Prints one markdown table, a column per device: decode tok/s at each batch of
`lockstep bench rollout`, training tok/s of `lockstep bench train`, then the
GEMM benchmark's lines (lockstep's GEMM against cuBLAS on the same shapes) as
they are. A log that is missing or holds no table gives no figures; the
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
            gemm += [l for l in text.splitlines() if re.match(r"^\S+/\S+\s+\d", l)]
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
    print("| workload | " + " | ".join(devices) + " |")
    print("|---|" + "---|" * len(devices))
    for label, by_device in figures.items():
        print(f"| {label} | " + " | ".join(by_device.get(d, "") for d in devices) + " |")
    if gemm:
        print("\nGEMM, lockstep against cuBLAS (same shapes):")
        print("\n".join(gemm))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
