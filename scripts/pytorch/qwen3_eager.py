#!/usr/bin/python3
"""A Hugging Face-style Qwen3 (dense) in PyTorch eager, timed on random tokens.

The baseline lockstep's training and scoring speeds are compared with
(scripts/pytorch/compare.sh): the model of a lockstep [model] TOML (dense
Qwen3: q/k RMSNorm, RoPE, grouped-query attention, SwiGLU, tied or untied
head), written the way transformers' modeling_qwen3 runs with
attn_implementation="eager": the (heads, T, T) attention probabilities are
materialised, as PyTorch 1.13 (Debian 12's python3-torch) has no fused
attention. f32, random weights (speed does not depend on their values).

  qwen3_eager.py train --config M.toml --seq-len T [--seqs N] [--steps S] [--threads K]
  qwen3_eager.py score --config M.toml --seq-len T [--seqs N] [--steps S] [--threads K]
  qwen3_eager.py check --model DIR --input SCORED.jsonl

check: loads a Hugging Face directory lockstep wrote (config.json,
model.safetensors, f32) and prints the largest |logprob - lockstep's| over the
lines of a `lockstep score` output: the baseline is the same model.

train: a full step (forward, mean token cross-entropy, backward, AdamW) on
--seqs sequences of --seq-len tokens; score: the forward with every token's
log-probability (no gradients). One warm-up step, then --steps timed. Prints
one JSON line: tokens/s over wall time and over CPU time, peak RSS. A
MemoryError or an allocation failure prints {"oom": true, ...} and exits 3.
"""
import argparse
import json
import math
import resource
import sys
import time
import tomllib

import torch
import torch.nn.functional as F


def rms_norm(x, w, eps):
    var = x.pow(2).mean(-1, keepdim=True)
    return x * torch.rsqrt(var + eps) * w


def rope_tables(T, dh, theta):
    inv = 1.0 / (theta ** (torch.arange(0, dh, 2, dtype=torch.float32) / dh))
    ang = torch.outer(torch.arange(T, dtype=torch.float32), inv)
    emb = torch.cat([ang, ang], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


class Qwen3(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m
        D, H, Hkv, Dh, Fw, V = (m["hidden_size"], m["num_heads"], m["num_kv_heads"], m["head_dim"],
                                m["intermediate_size"], m["vocab_size"])
        std = 0.02
        p = lambda *s: torch.nn.Parameter(torch.randn(*s) * std)
        ones = lambda n: torch.nn.Parameter(torch.ones(n))
        self.embed = p(V, D)
        self.layers = torch.nn.ModuleList()
        for _ in range(m["num_layers"]):
            layer = torch.nn.Module()
            layer.ln1, layer.ln2 = ones(D), ones(D)
            layer.q, layer.k, layer.v, layer.o = p(H * Dh, D), p(Hkv * Dh, D), p(Hkv * Dh, D), p(D, H * Dh)
            layer.qn, layer.kn = ones(Dh), ones(Dh)
            layer.gate, layer.up, layer.down = p(Fw, D), p(Fw, D), p(D, Fw)
            self.layers.append(layer)
        self.norm = ones(D)
        self.head = None if m.get("tie_word_embeddings", False) else p(V, D)

    def forward(self, ids):
        m = self.m
        B, T = ids.shape
        H, Hkv, Dh, eps = m["num_heads"], m["num_kv_heads"], m["head_dim"], m["rms_norm_eps"]
        cos, sin = rope_tables(T, Dh, m["rope_theta"])
        mask = torch.full((T, T), float("-inf")).triu(1)
        x = F.embedding(ids, self.embed)
        for L in self.layers:
            h = rms_norm(x, L.ln1, eps)
            q = rms_norm(F.linear(h, L.q).view(B, T, H, Dh), L.qn, eps).transpose(1, 2)
            k = rms_norm(F.linear(h, L.k).view(B, T, Hkv, Dh), L.kn, eps).transpose(1, 2)
            v = F.linear(h, L.v).view(B, T, Hkv, Dh).transpose(1, 2)
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
            k = k.repeat_interleave(H // Hkv, dim=1)
            v = v.repeat_interleave(H // Hkv, dim=1)
            w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(Dh) + mask
            a = torch.matmul(torch.softmax(w, dim=-1), v)
            x = x + F.linear(a.transpose(1, 2).reshape(B, T, H * Dh), L.o)
            h = rms_norm(x, L.ln2, eps)
            x = x + F.linear(F.silu(F.linear(h, L.gate)) * F.linear(h, L.up), L.down)
        x = rms_norm(x, self.norm, eps)
        return F.linear(x, self.embed if self.head is None else self.head)


HF_NAMES = {"ln1": "input_layernorm", "ln2": "post_attention_layernorm", "q": "self_attn.q_proj",
            "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj", "qn": "self_attn.q_norm",
            "kn": "self_attn.k_norm", "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}


def read_safetensors(path):
    import numpy as np
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        base = 8 + n
        out = {}
        for name, t in header.items():
            if name == "__metadata__":
                continue
            if t["dtype"] != "F32":
                sys.exit(f"{path}: tensor {name} is {t['dtype']}; check reads f32 checkpoints")
            b, e = t["data_offsets"]
            f.seek(base + b)
            out[name] = torch.from_numpy(np.frombuffer(f.read(e - b), dtype=np.float32).copy()).view(t["shape"])
        return out


def load_hf(model, path):
    w = read_safetensors(path)
    with torch.no_grad():
        model.embed.copy_(w["model.embed_tokens.weight"])
        model.norm.copy_(w["model.norm.weight"])
        if model.head is not None:
            model.head.copy_(w["lm_head.weight"])
        for i, L in enumerate(model.layers):
            for ours, hf in HF_NAMES.items():
                getattr(L, ours).copy_(w[f"model.layers.{i}.{hf}.weight"])


def check(a):
    cfg = json.load(open(f"{a.model}/config.json"))
    m = {"hidden_size": cfg["hidden_size"], "num_heads": cfg["num_attention_heads"],
         "num_kv_heads": cfg["num_key_value_heads"], "head_dim": cfg["head_dim"],
         "intermediate_size": cfg["intermediate_size"], "vocab_size": cfg["vocab_size"],
         "num_layers": cfg["num_hidden_layers"], "rms_norm_eps": cfg["rms_norm_eps"],
         "rope_theta": cfg["rope_theta"], "tie_word_embeddings": cfg.get("tie_word_embeddings", False)}
    model = Qwen3(m)
    load_hf(model, f"{a.model}/model.safetensors")
    worst = 0.0
    with open(a.input) as f:
        for line in f:
            r = json.loads(line)
            ids = torch.tensor([r["prompt_ids"] + r["response_ids"]])
            with torch.no_grad():
                logp = torch.log_softmax(model(ids), dim=-1)[0]
            P = len(r["prompt_ids"])
            ours = logp[P - 1:-1].gather(-1, ids[0, P:, None])[:, 0]
            worst = max(worst, float((ours - torch.tensor(r["logprobs"])).abs().max()))
    print(json.dumps({"max_abs_diff": worst}))


def cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["train", "score", "check"])
    ap.add_argument("--config")
    ap.add_argument("--seq-len", type=int)
    ap.add_argument("--model")
    ap.add_argument("--input")
    ap.add_argument("--seqs", type=int, default=1)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.mode == "check":
        if not a.model or not a.input:
            sys.exit("check needs --model DIR and --input SCORED.jsonl")
        return check(a)
    if not a.config or not a.seq_len:
        sys.exit(f"{a.mode} needs --config and --seq-len")
    with open(a.config, "rb") as f:
        m = tomllib.load(f)["model"]
    if m.get("architecture", "Qwen3ForCausalLM") != "Qwen3ForCausalLM" or not m.get("qk_norm", False):
        sys.exit(f"{a.config}: this baseline models dense Qwen3 (architecture Qwen3ForCausalLM, qk_norm)")
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    out = {"mode": a.mode, "seq_len": a.seq_len, "seqs": a.seqs, "threads": a.threads, "torch": torch.__version__}
    try:
        model = Qwen3(m)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5) if a.mode == "train" else None
        ids = torch.randint(0, m["vocab_size"], (a.seqs, a.seq_len))
        wall = cpu = 0.0
        for step in range(a.steps + 1):  # step 0 warms up
            t0, c0 = time.perf_counter(), cpu_seconds()
            if a.mode == "train":
                logits = model(ids)
                loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
                del logits
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                out["loss"] = float(loss)
            else:
                with torch.no_grad():
                    logp = torch.log_softmax(model(ids), dim=-1)
                    out["logprob_mean"] = float(logp[:, :-1].gather(-1, ids[:, 1:, None]).mean())
                    del logp
            if step > 0:
                wall += time.perf_counter() - t0
                cpu += cpu_seconds() - c0
    except (MemoryError, RuntimeError) as e:
        if isinstance(e, RuntimeError) and "alloc" not in str(e).lower() and "memory" not in str(e).lower():
            raise
        out.update(oom=True, error=str(e).splitlines()[0][:200],
                   peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        print(json.dumps(out))
        sys.exit(3)
    tokens = a.seqs * a.seq_len * a.steps
    out.update(oom=False, tok_s=tokens / wall, tok_per_cpu_s=tokens / cpu * a.threads,
               peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
