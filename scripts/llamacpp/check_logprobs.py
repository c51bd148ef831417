#!/usr/bin/env python3
"""Proves a GGUF from hf_to_gguf.py is the same model as its Hugging Face
directory: the per-token log-probabilities that llama.cpp gives random token
sequences (logprobs, built by setup.sh) against the ones `lockstep score` gives
the same sequences (the trainer's forward, f32 unless --precision says otherwise).

  check_logprobs.py --lockstep BIN --logprobs BIN --model DIR --gguf FILE
                    [--seqs 4] [--len 64] [--seed 1] [--precision f32]
                    [--kv f32|f16] [--fa off|on] [--tol 1e-3] [--threads 2]

Each sequence t_0..t_{n-1} is scored as prompt_ids = [t_0], response_ids =
[t_1..t_{n-1}]: lockstep reports log p(t_i | t_<i) for i >= 1, and so does
logprobs (one llama_decode of the whole sequence, logits at every position).
Prints max and mean |delta logprob| over all n-1 positions of all sequences and
exits 1 when the max exceeds --tol (0 disables the verdict: report only).
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lockstep", required=True)
    ap.add_argument("--logprobs", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--seqs", type=int, default=4)
    ap.add_argument("--len", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--precision", default="f32")
    ap.add_argument("--kv", default="f32")
    ap.add_argument("--fa", default="off")
    ap.add_argument("--tol", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--label", default="")
    a = ap.parse_args()

    vocab = json.load(open(os.path.join(a.model, "config.json")))["vocab_size"]
    rng = random.Random(a.seed)
    seqs = [[rng.randrange(vocab) for _ in range(a.len)] for _ in range(a.seqs)]
    with tempfile.TemporaryDirectory() as tmp:
        inp, out, txt = (os.path.join(tmp, n) for n in ("in.jsonl", "out.jsonl", "in.txt"))
        with open(inp, "w") as f:
            for s in seqs:
                f.write(json.dumps({"prompt_ids": s[:1], "response_ids": s[1:]}) + "\n")
        with open(txt, "w") as f:
            for s in seqs:
                f.write(" ".join(map(str, s)) + "\n")
        subprocess.run([a.lockstep, "score", "--model", a.model, "--input", inp, "--output", out,
                        "--precision", a.precision, "--threads", str(a.threads), "--log-level", "warn"],
                       check=True, stderr=subprocess.DEVNULL)
        ref = [json.loads(line)["logprobs"] for line in open(out)]
        res = subprocess.run([a.logprobs, a.gguf, txt, "--threads", str(a.threads), "--kv", a.kv, "--fa", a.fa],
                             check=True, capture_output=True, text=True)
        got = [[float(x) for x in line.split()] for line in res.stdout.splitlines() if line.strip()]
    if len(got) != len(ref) or any(len(g) != len(r) for g, r in zip(got, ref)):
        sys.exit(f"check_logprobs: shape mismatch: llama.cpp {[len(g) for g in got]}, lockstep {[len(r) for r in ref]}")
    d = [abs(g - r) for gs, rs in zip(got, ref) for g, r in zip(gs, rs)]
    mx, mean = max(d), sum(d) / len(d)
    mean_lp = sum(r for rs in ref for r in rs) / len(d)
    ok = a.tol <= 0 or mx <= a.tol
    verdict = "" if a.tol <= 0 else (" OK" if ok else f" FAIL (> {a.tol:g})")
    print(f"{a.label or os.path.basename(a.gguf)}: lockstep score --precision {a.precision} vs llama.cpp "
          f"(kv {a.kv}, fa {a.fa}): {len(d)} tokens, mean logprob {mean_lp:.3f}, "
          f"max |dlogp| {mx:.3g}, mean |dlogp| {mean:.3g}{verdict}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
