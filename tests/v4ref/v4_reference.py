#!/usr/bin/python3
"""Independent float64 reference of the official DeepSeek-V4 forward, plus a writer of official-layout checkpoints.

Written from the official inference code's formulas (cited as "spec section N", see README.md) with numpy only; it
shares no code with lockstep. The model reads its weights back from the files it is given, so it sees exactly the stored values.

  v4_reference.py write DIR [--preset tiny|small] [--fmt bf16|fp8] [--seed N] [--layers 0,4,128,4] [--set k=json]
  v4_reference.py logprobs DIR --tokens 1,2,3 [--mtp]        # prints {"logprobs": [...]} (and "mtp_logprobs")
"""

import argparse
import json
import math
import os
import sys
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import v4_formats as fmt  # noqa: E402  (sibling module)

# ======================================================================================================================
# Configuration (spec section 1): HF config.json keys

def preset_config(name):
    """The HF config.json of a scaled-down preset (official key names)."""
    base = dict(
        architectures=["DeepseekV4ForCausalLM"], model_type="deepseek_v4", num_key_value_heads=1,
        rope_theta=10000.0, compress_rope_theta=160000.0,
        rope_scaling={"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                      "beta_fast": 32, "beta_slow": 1},
        max_position_embeddings=65536 * 16, n_shared_experts=1, scoring_func="sqrtsoftplus",
        routed_scaling_factor=1.5, norm_topk_prob=True, topk_method="noaux_tc",
        # Far below the official 10.0 so that the clamps of routed and shared experts actually bite at O(1) activations.
        swiglu_limit=1.0,
        hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=1,
        tie_word_embeddings=False, num_nextn_predict_layers=1, torch_dtype="bfloat16")
    if name == "tiny":
        base.update(hidden_size=64, num_hidden_layers=4, compress_ratios=[0, 4, 128, 4, 0], num_attention_heads=4,
                    head_dim=32, qk_rope_head_dim=8, q_lora_rank=32, o_groups=2, o_lora_rank=16, sliding_window=8,
                    index_n_heads=2, index_head_dim=16, index_topk=2, n_routed_experts=4, num_experts_per_tok=2,
                    moe_intermediate_size=32, num_hash_layers=1, hc_mult=2, vocab_size=64)
    elif name == "small":
        base.update(hidden_size=128, num_hidden_layers=6, compress_ratios=[0, 4, 128, 4, 128, 0, 0],
                    num_attention_heads=8, head_dim=64, qk_rope_head_dim=16, q_lora_rank=64, o_groups=4,
                    o_lora_rank=32, sliding_window=16, index_n_heads=4, index_head_dim=32, index_topk=4,
                    n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, num_hash_layers=2,
                    hc_mult=4, vocab_size=256)
    else:
        raise ValueError(f"unknown preset {name!r} (tiny, small)")
    return base


class Dims:
    """The config keys the forward needs, under the spec's letters."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.D = cfg["hidden_size"]
        self.L = cfg["num_hidden_layers"]
        self.H = cfg["num_attention_heads"]
        self.Dh = cfg["head_dim"]
        self.Dr = cfg["qk_rope_head_dim"]
        self.Dn = self.Dh - self.Dr
        self.Rq = cfg["q_lora_rank"]
        self.G = cfg["o_groups"]
        self.Ro = cfg["o_lora_rank"]
        self.W = cfg["sliding_window"]
        self.ratios = list(cfg["compress_ratios"])
        self.HI = cfg["index_n_heads"]
        self.DI = cfg["index_head_dim"]
        self.KI = cfg["index_topk"]
        self.E = cfg["n_routed_experts"]
        self.K = cfg["num_experts_per_tok"]
        self.F = cfg["moe_intermediate_size"]
        self.n_hash = cfg["num_hash_layers"]
        self.route_scale = cfg["routed_scaling_factor"]
        self.limit = cfg["swiglu_limit"]
        self.n = cfg["hc_mult"]
        self.iters = cfg["hc_sinkhorn_iters"]
        self.hc_eps = cfg["hc_eps"]
        self.eps = cfg["rms_norm_eps"]
        self.V = cfg["vocab_size"]
        self.nextn = cfg.get("num_nextn_predict_layers", 0)
        assert cfg.get("num_key_value_heads", 1) == 1 and cfg.get("n_shared_experts", 1) == 1
        assert cfg.get("scoring_func", "sqrtsoftplus") == "sqrtsoftplus", "only sqrtsoftplus is implemented"
        assert self.H % self.G == 0 and self.Dr % 2 == 0 and self.DI >= self.Dr
        assert len(self.ratios) == self.L + self.nextn, "compress_ratios needs one entry per layer and MTP block"
        assert all(c in (0, 4, 128) for c in self.ratios)


# ======================================================================================================================
# Random weights in the official layout (spec section 7) and the checkpoint writer

def _rng(seed, name):
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def _block_tensors(d, prefix, c, hash_layer):
    """(name, shape, init, storage) for one Block (spec sections 3-5, table of section 7).

    storage: 'bf16' | 'f32' | 'fp8' | 'fp4' | 'i64' is the official storage of an fp8 checkpoint; a bf16 checkpoint
    stores 'fp8' and 'fp4' tensors as BF16 too."""
    nD, M = d.n * d.D, 2 * d.n + d.n * d.n
    t = []
    for site in ("attn", "ffn"):
        t += [(f"{prefix}hc_{site}_fn", (M, nD), "hc_fn", "f32"), (f"{prefix}hc_{site}_base", (M,), "hc_base", "f32"),
              (f"{prefix}hc_{site}_scale", (3,), "hc_scale", "f32")]
    a = prefix + "attn."
    t += [(prefix + "attn_norm.weight", (d.D,), "norm", "bf16"),
          (a + "attn_sink", (d.H,), "sink", "f32"),
          (a + "wq_a.weight", (d.Rq, d.D), "matrix", "fp8"),
          (a + "q_norm.weight", (d.Rq,), "norm", "bf16"),
          (a + "wq_b.weight", (d.H * d.Dh, d.Rq), "matrix", "fp8"),
          (a + "wkv.weight", (d.Dh, d.D), "matrix", "fp8"),
          (a + "kv_norm.weight", (d.Dh,), "norm", "bf16"),
          (a + "wo_a.weight", (d.G * d.Ro, d.H * d.Dh // d.G), "matrix", "fp8"),
          (a + "wo_b.weight", (d.D, d.G * d.Ro), "matrix", "fp8")]
    if c > 0:
        kappa = 2 if c == 4 else 1
        t += [(a + "compressor.wkv.weight", (kappa * d.Dh, d.D), "matrix", "bf16"),
              (a + "compressor.wgate.weight", (kappa * d.Dh, d.D), "matrix", "bf16"),
              (a + "compressor.ape", (c, kappa * d.Dh), "ape", "f32"),
              (a + "compressor.norm.weight", (d.Dh,), "norm", "bf16")]
    if c == 4:
        t += [(a + "indexer.wq_b.weight", (d.HI * d.DI, d.Rq), "matrix", "fp8"),
              (a + "indexer.weights_proj.weight", (d.HI, d.D), "matrix", "bf16"),
              (a + "indexer.compressor.wkv.weight", (2 * d.DI, d.D), "matrix", "bf16"),
              (a + "indexer.compressor.wgate.weight", (2 * d.DI, d.D), "matrix", "bf16"),
              (a + "indexer.compressor.ape", (4, 2 * d.DI), "ape", "f32"),
              (a + "indexer.compressor.norm.weight", (d.DI,), "norm", "bf16")]
    f = prefix + "ffn."
    t += [(prefix + "ffn_norm.weight", (d.D,), "norm", "bf16"),
          (f + "gate.weight", (d.E, d.D), "matrix", "bf16")]
    t += [(f + "gate.tid2eid", (d.V, d.K), "tid2eid", "i64")] if hash_layer else \
         [(f + "gate.bias", (d.E,), "bias", "f32")]
    for e in range(d.E):
        t += [(f"{f}experts.{e}.w1.weight", (d.F, d.D), "matrix", "fp4"),
              (f"{f}experts.{e}.w2.weight", (d.D, d.F), "matrix", "fp4"),
              (f"{f}experts.{e}.w3.weight", (d.F, d.D), "matrix", "fp4")]
    t += [(f + "shared_experts.w1.weight", (d.F, d.D), "matrix", "fp8"),
          (f + "shared_experts.w2.weight", (d.D, d.F), "matrix", "fp8"),
          (f + "shared_experts.w3.weight", (d.F, d.D), "matrix", "fp8")]
    return t


def checkpoint_tensors(d):
    """Every official tensor of the model (no `model.` prefix), as (name, shape, init, storage)."""
    nD = d.n * d.D
    t = [("embed.weight", (d.V, d.D), "embed", "bf16")]
    for i in range(d.L):
        t += _block_tensors(d, f"layers.{i}.", d.ratios[i], i < d.n_hash)
    t += [("norm.weight", (d.D,), "norm", "bf16"),
          ("hc_head_fn", (d.n, nD), "hc_fn", "f32"), ("hc_head_base", (d.n,), "hc_base", "f32"),
          ("hc_head_scale", (1,), "hc_scale", "f32"),
          ("head.weight", (d.V, d.D), "head", "bf16")]
    for j in range(d.nextn):
        p = f"mtp.{j}."
        t += [(p + "e_proj.weight", (d.D, d.D), "matrix", "fp8"), (p + "h_proj.weight", (d.D, d.D), "matrix", "fp8"),
              (p + "enorm.weight", (d.D,), "norm", "bf16"), (p + "hnorm.weight", (d.D,), "norm", "bf16")]
        t += _block_tensors(d, p, d.ratios[d.L + j], False)
        t += [(p + "norm.weight", (d.D,), "norm", "bf16"),
              (p + "hc_head_fn", (d.n, nD), "hc_fn", "f32"), (p + "hc_head_base", (d.n,), "hc_base", "f32"),
              (p + "hc_head_scale", (1,), "hc_scale", "f32")]
    return t


def _init(d, name, shape, kind, seed):
    """Random master values, scaled so that activations stay O(1)."""
    r = _rng(seed, name)
    if kind == "matrix":                 # unit-variance outputs for unit-RMS inputs
        return r.normal(0.0, 0.8 / math.sqrt(shape[1]), shape)
    if kind == "embed":
        return r.normal(0.0, 1.0, shape)
    if kind == "head":                   # logits of std ~1.5 for a unit-RMS final norm
        return r.normal(0.0, 1.5 / math.sqrt(shape[1]), shape)
    if kind == "norm":
        return 1.0 + r.normal(0.0, 0.1, shape)
    if kind == "hc_fn":                  # m = r·(φ x̂) of std ~0.5
        return r.normal(0.0, 0.5 / math.sqrt(shape[1]), shape)
    if kind == "hc_base":
        return r.normal(0.0, 0.5, shape)
    if kind == "hc_scale":
        return r.uniform(0.5, 1.5, shape)
    if kind == "sink":
        return r.normal(0.0, 1.0, shape)
    if kind == "ape":
        return r.normal(0.0, 0.5, shape)
    if kind == "bias":
        return r.normal(0.0, 0.1, shape)
    if kind == "tid2eid":                # K distinct experts per token
        return np.stack([r.permutation(d.E)[:d.K] for _ in range(shape[0])]).astype(np.int64)
    raise ValueError(kind)


def _store(name, values, storage, ckpt_fmt):
    """-> list of (name, Stored) for one tensor in the requested checkpoint format."""
    if storage == "f32":
        return [(name, fmt.Stored("F32", values.astype(np.float32)))]
    if storage == "i64":
        return [(name, fmt.Stored("I64", values))]
    if storage == "bf16" or ckpt_fmt == "bf16":
        return [(name, fmt.Stored("BF16", fmt.bf16_encode(values)))]
    scale_name = name[:-len("weight")] + "scale"
    if storage == "fp8":
        codes, scales = fmt.fp8_block_quantize(values)
        return [(name, fmt.Stored("F8_E4M3", codes)), (scale_name, fmt.Stored("F8_E8M0", scales))]
    if storage == "fp4":
        packed, scales = fmt.mxfp4_quantize(values)
        return [(name, fmt.Stored("I8", packed)), (scale_name, fmt.Stored("F8_E8M0", scales))]
    raise ValueError(storage)


def write_checkpoint(directory, cfg, seed, ckpt_fmt="bf16", n_shards=2):
    """Write config.json, model-0000k-of-0000N.safetensors and model.safetensors.index.json (spec sections 1, 7).

    ckpt_fmt 'bf16': float tensors BF16 except the F32 ones (hc_*, attn_sink, ape, gate.bias); tid2eid I64.
    ckpt_fmt 'fp8': the official storage: FP8 e4m3 + E8M0 128x128 `.scale` where the official stores FP8, routed
    experts MXFP4 (I8 + E8M0 1x32 `.scale`). The same seed gives the same master values in both formats."""
    assert ckpt_fmt in ("bf16", "fp8")
    d = Dims(cfg)
    os.makedirs(directory, exist_ok=True)
    tensors = {}
    for name, shape, kind, storage in checkpoint_tensors(d):
        for key, st in _store(name, _init(d, name, shape, kind, seed), storage, ckpt_fmt):
            tensors[key] = st
    out_cfg = dict(cfg)
    if ckpt_fmt == "fp8":
        out_cfg["expert_dtype"] = "fp4"
        out_cfg["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                          "scale_fmt": "ue8m0", "weight_block_size": [128, 128]}
    else:
        out_cfg.pop("expert_dtype", None)
        out_cfg.pop("quantization_config", None)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(out_cfg, f, indent=2)
    fmt.write_sharded(directory, tensors, n_shards)


# ======================================================================================================================
# Numeric building blocks

def linear(x, w):
    """y = x·wᵀ over the last axis of x. Each output is numpy's pairwise sum over the input axis of one row, so a
    row's value never depends on how many other rows there are (this keeps the causal check exact)."""
    x2 = x.reshape(-1, x.shape[-1])
    out = np.empty((x2.shape[0], w.shape[0]))
    step = max(1, (1 << 20) // w.size)
    for i in range(0, x2.shape[0], step):
        out[i:i + step] = (x2[i:i + step, None, :] * w[None, :, :]).sum(axis=-1)
    return out.reshape(x.shape[:-1] + (w.shape[0],))


def rms_norm(x, w, eps):
    """RMSNorm_w over the last axis (spec notation); w=None for the unweighted form."""
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if w is None else y * w


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softmax(x, axis):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


# ----------------------------------------------------------------------------------------------------------------------
# RoPE (spec section 4, "RoPE")

def yarn_range(Dr, theta, L0, beta_fast, beta_slow):
    """(lo, hi) of the YaRN ramp as the official `find_correction_range`: floor/ceil of Dr·ln(L0/(β·2π))/(2 ln θ),
    clamped to [0, Dr-1] (the official clamp uses the full rope width, not Dr/2-1)."""
    def corr(beta):
        return Dr * math.log(L0 / (beta * 2 * math.pi)) / (2 * math.log(theta))
    return max(math.floor(corr(beta_fast)), 0), min(math.ceil(corr(beta_slow)), Dr - 1)


def rope_frequencies(d, c):
    """ω_j, j < Dr/2, of a layer with compress ratio c: θ=rope_theta without YaRN where c=0; compress_rope_theta with
    YaRN where c>0: ω_j ← ω_j·(1 − γ_j·(1 − 1/factor)), γ_j = clamp((j − lo)/(hi − lo), 0, 1)."""
    cfg = d.cfg
    theta = cfg["compress_rope_theta"] if c > 0 else cfg["rope_theta"]
    j = np.arange(d.Dr // 2, dtype=np.float64)
    omega = theta ** (-2.0 * j / d.Dr)
    ys = cfg.get("rope_scaling")
    if c > 0 and ys and ys.get("original_max_position_embeddings", 0) > 0:
        lo, hi = yarn_range(d.Dr, theta, ys["original_max_position_embeddings"], ys["beta_fast"], ys["beta_slow"])
        if lo == hi:
            hi += 0.001                  # as the official linear_ramp_factor
        gamma = np.clip((j - lo) / (hi - lo), 0.0, 1.0)
        omega = omega * (1.0 - gamma * (1.0 - 1.0 / ys["factor"]))
    return omega


def apply_rope(x, pos, omega, inverse=False):
    """Interleaved pairs (x_2j, x_2j+1) of the last axis, as complex numbers, times e^{±i·pos·ω_j}.
    x [S, ..., Dr]; pos [S] (one position per leading row)."""
    pos = np.asarray(pos, dtype=np.float64).reshape((-1,) + (1,) * (x.ndim - 1))
    ang = pos * omega
    if inverse:
        ang = -ang
    cos, sin = np.cos(ang), np.sin(ang)
    re, im = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = re * cos - im * sin
    out[..., 1::2] = re * sin + im * cos
    return out


def rope_tail(x, pos, omega, Dr, inverse=False):
    """RoPE on the last Dr dims of x [S, ..., Dh]; the first Dh-Dr dims pass through."""
    out = x.copy()
    out[..., -Dr:] = apply_rope(x[..., -Dr:], pos, omega, inverse)
    return out


# ----------------------------------------------------------------------------------------------------------------------
# mHC (spec section 3)

def sinkhorn(logits, iters, eps):
    """Row softmax, +eps, column normalize, then (iters-1)×(row, column). logits [..., n(a), n(c)]."""
    m = softmax(logits, axis=-1) + eps
    m = m / (m.sum(axis=-2, keepdims=True) + eps)
    for _ in range(iters - 1):
        m = m / (m.sum(axis=-1, keepdims=True) + eps)
        m = m / (m.sum(axis=-2, keepdims=True) + eps)
    return m


def hc_mixes(X, fn, eps):
    """m = r·(φ x̂): x̂ = concat of the n streams, r = 1/sqrt(mean(x̂²) + eps) with no norm weight. X [S, n, D]."""
    xf = X.reshape(X.shape[0], -1)
    r = 1.0 / np.sqrt(np.mean(xf * xf, axis=-1) + eps)
    return linear(xf, fn) * r[:, None]


def hc_pre(X, fn, scale, base, d):
    """-> (u [S, D], post [S, n], comb [S, n, n]): steps 1-5 of spec section 3."""
    n = d.n
    m = hc_mixes(X, fn, d.eps)
    pre = sigmoid(scale[0] * m[:, :n] + base[:n]) + d.hc_eps
    post = 2.0 * sigmoid(scale[1] * m[:, n:2 * n] + base[n:2 * n])
    logits = (scale[2] * m[:, 2 * n:] + base[2 * n:]).reshape(-1, n, n)   # row-major [a, c]
    comb = sinkhorn(logits, d.iters, d.hc_eps)
    u = np.sum(pre[:, :, None] * X, axis=1)
    return u, post, comb


def hc_post(f, X, post, comb):
    """X'_c = post_c·f + Σ_a M[a,c]·X_a (the TRANSPOSED comb; a = source stream, c = destination). Spec 3 step 6."""
    out = post[:, :, None] * f[:, None, :]
    for a in range(X.shape[1]):
        out = out + comb[:, a, :, None] * X[:, a, None, :]
    return out


def hc_head(X, fn, scale, base, d):
    """w_i = σ(α·m_i + b_i) + eps; h = Σ_i w_i X_i (spec section 3 step 7)."""
    m = hc_mixes(X, fn, d.eps)
    w = sigmoid(scale[0] * m + base) + d.hc_eps
    return np.sum(w[:, :, None] * X, axis=1)


# ======================================================================================================================
# Attention (spec section 4)

def compress(a, P, prefix, c, width, omega, d):
    """KV compressor -> entries [⌊S/c⌋, width], entry t = RMSNorm(C̄_t) with RoPE on the tail at position t·c.

    HCA (c != 4): per-channel softmax over the block's c tokens of Z + ape. CSA (c == 4, overlap): 2c slots, the
    previous block's tokens on channels [0:width] then this block's on [width:2·width]; block 0's previous half
    is masked (Z=-inf, C=0). ape is added per in-block position before the regrouping."""
    S = a.shape[0]
    n_blocks = S // c
    if n_blocks == 0:
        return np.zeros((0, width))
    C = linear(a[:n_blocks * c], P[prefix + "wkv.weight"])
    Z = linear(a[:n_blocks * c], P[prefix + "wgate.weight"])
    ape = P[prefix + "ape"]
    pooled = np.empty((n_blocks, width))
    for t in range(n_blocks):
        cb, zb = C[t * c:(t + 1) * c], Z[t * c:(t + 1) * c] + ape
        if c == 4:
            if t > 0:
                prev_c = C[(t - 1) * c:t * c, :width]
                prev_z = Z[(t - 1) * c:t * c, :width] + ape[:, :width]
            else:
                prev_c, prev_z = np.zeros((c, width)), np.full((c, width), -np.inf)
            cs = np.concatenate([prev_c, cb[:, width:]])
            zs = np.concatenate([prev_z, zb[:, width:]])
        else:
            cs, zs = cb, zb
        pooled[t] = np.sum(softmax(zs, axis=0) * cs, axis=0)
    k = rms_norm(pooled, P[prefix + "norm.weight"], d.eps)
    return rope_tail(k, np.arange(n_blocks) * c, omega, d.Dr)


def indexer_select(a, q_r, P, prefix, omega, d):
    """Lightning indexer (c = 4): per query s the selected compressed entries, ascending.

    I_{s,t} = Σ_h w_{s,h}·ReLU(q^I_{s,h}·k^I_t), w = (a·W_wᵀ)·DI^-1/2·HI^-1/2, over the visible t < ⌊(s+1)/4⌋;
    top-min(KI, visible), ties to the lower index. No Hadamard: it is orthogonal and changes no score."""
    S, c = a.shape[0], 4
    q = linear(q_r, P[prefix + "wq_b.weight"]).reshape(S, d.HI, d.DI)
    q = rope_tail(q, np.arange(S), omega, d.Dr)
    k = compress(a, P, prefix + "compressor.", c, d.DI, omega, d)
    w = linear(a, P[prefix + "weights_proj.weight"]) * (d.DI ** -0.5) * (d.HI ** -0.5)
    picks = []
    for s in range(S):
        visible = (s + 1) // c
        if visible == 0:
            picks.append(np.zeros(0, dtype=np.int64))
            continue
        dots = np.sum(k[None, :visible, :] * q[s][:, None, :], axis=-1)          # [HI, visible]
        score = np.sum(np.maximum(dots, 0.0).T * w[s][None, :], axis=-1)         # [visible]
        order = np.argsort(-score, kind="stable")[:min(d.KI, visible)]           # stable: ties -> lower t
        picks.append(np.sort(order))
    return picks


def sparse_attend(q, cand, sink):
    """One query over explicit candidate rows (K = V): z = q·kv/√Dh, p = e^z / (e^sink + Σ e^z), o = Σ p·kv.
    q [H, Dh], cand [m, Dh], sink [H] -> o [H, Dh]."""
    z = np.sum(q[:, None, :] * cand[None, :, :], axis=-1) / math.sqrt(q.shape[-1])   # [H, m]
    mx = np.maximum(z.max(axis=-1, initial=-np.inf), sink)
    e = np.exp(z - mx[:, None])
    p = e / (np.exp(sink - mx) + e.sum(axis=-1))[:, None]                    # the sink joins only the denominator
    return np.sum(p[:, :, None] * cand[None, :, :], axis=1)


def attention(a, P, prefix, c, d, trace=None):
    """MQA with sliding window, compressed entries and sink (spec section 4). a [S, D] is attn_norm(u).
    trace: optional dict; trace[prefix] receives the compress ratio, the number of compressed entries and the picks."""
    S = a.shape[0]
    omega = rope_frequencies(d, c)
    pos = np.arange(S)
    q_r = rms_norm(linear(a, P[prefix + "wq_a.weight"]), P[prefix + "q_norm.weight"], d.eps)
    q = linear(q_r, P[prefix + "wq_b.weight"]).reshape(S, d.H, d.Dh)
    q = rope_tail(rms_norm(q, None, d.eps), pos, omega, d.Dr)                     # per-head unweighted RMS
    kv = rms_norm(linear(a, P[prefix + "wkv.weight"]), P[prefix + "kv_norm.weight"], d.eps)
    kv = rope_tail(kv, pos, omega, d.Dr)
    comp, picks = None, None
    if c > 0:
        comp = compress(a, P, prefix + "compressor.", c, d.Dh, omega, d)
    if c == 4:
        picks = indexer_select(a, q_r, P, prefix + "indexer.", omega, d)
    if trace is not None:
        trace[prefix] = {"c": c, "n_compressed": 0 if comp is None else len(comp), "picks": picks}
    sink = P[prefix + "attn_sink"]
    o = np.empty((S, d.H, d.Dh))
    for s in range(S):
        rows = [kv[max(0, s - d.W + 1):s + 1]]                                   # window, query included
        if c == 128:
            rows.append(comp[:(s + 1) // c])                                     # every visible entry
        elif c == 4:
            rows.append(comp[picks[s]])
        o[s] = sparse_attend(q[s], np.concatenate(rows), sink)
    o = rope_tail(o, pos, omega, d.Dr, inverse=True)                             # de-rotate at the query position
    og = o.reshape(S, d.G, d.H * d.Dh // d.G)
    wo_a = P[prefix + "wo_a.weight"].reshape(d.G, d.Ro, -1)
    y = np.stack([linear(og[:, g], wo_a[g]) for g in range(d.G)], axis=1)        # [S, G, Ro]
    return linear(y.reshape(S, d.G * d.Ro), P[prefix + "wo_b.weight"])


# ======================================================================================================================
# MoE (spec section 5)

def route(z, ids, P, prefix, hash_layer, d):
    """-> (indices [S, K], weights [S, K]). s = sqrt(softplus(z·W_gᵀ)); hash layers take tid2eid[token id], the others
    top-K of s + bias (bias only selects; ties to the lower expert); w = s_I / Σ s_I · routed_scaling_factor."""
    s = np.sqrt(np.logaddexp(0.0, linear(z, P[prefix + "gate.weight"])))
    if hash_layer:
        idx = P[prefix + "gate.tid2eid"][np.asarray(ids)]
    else:
        biased = s + P[prefix + "gate.bias"]
        idx = np.stack([np.argsort(-row, kind="stable")[:d.K] for row in biased])
    w = np.take_along_axis(s, idx, axis=1)
    return idx, w / w.sum(axis=1, keepdims=True) * d.route_scale


def expert(z, P, prefix, d, weight=None):
    """Clamped SwiGLU: gate ≤ limit, up ∈ [-limit, limit], h = silu(gate)·up, h·w before W2. z [T, D]."""
    gate = np.minimum(linear(z, P[prefix + "w1.weight"]), d.limit)
    up = np.clip(linear(z, P[prefix + "w3.weight"]), -d.limit, d.limit)
    h = gate * sigmoid(gate) * up
    if weight is not None:
        h = h * weight[:, None]
    return linear(h, P[prefix + "w2.weight"])


def moe(z, ids, P, prefix, hash_layer, d):
    """Σ_k expert_{I_k}(z)·w_k plus the shared expert (clamped too, weight 1). Experts are summed in ascending id."""
    idx, w = route(z, ids, P, prefix, hash_layer, d)
    y = np.zeros_like(z)
    for e in range(d.E):
        tok, slot = np.nonzero(idx == e)
        if len(tok):
            y[tok] += expert(z[tok], P, f"{prefix}experts.{e}.", d, w[tok, slot])
    return y + expert(z, P, prefix + "shared_experts.", d)


# ======================================================================================================================
# Blocks, head, MTP (spec sections 2 and 6)

def block(X, ids, P, prefix, c, hash_layer, d, trace=None):
    """One Block: hc_pre → attn_norm → attention → hc_post, then hc_pre → ffn_norm → MoE → hc_post."""
    u, post, comb = hc_pre(X, P[prefix + "hc_attn_fn"], P[prefix + "hc_attn_scale"], P[prefix + "hc_attn_base"], d)
    f = attention(rms_norm(u, P[prefix + "attn_norm.weight"], d.eps), P, prefix + "attn.", c, d, trace)
    X = hc_post(f, X, post, comb)
    u, post, comb = hc_pre(X, P[prefix + "hc_ffn_fn"], P[prefix + "hc_ffn_scale"], P[prefix + "hc_ffn_base"], d)
    f = moe(rms_norm(u, P[prefix + "ffn_norm.weight"], d.eps), ids, P, prefix + "ffn.", hash_layer, d)
    return hc_post(f, X, post, comb)


def log_softmax(logits):
    m = logits.max(axis=-1, keepdims=True)
    return logits - m - np.log(np.sum(np.exp(logits - m), axis=-1, keepdims=True))


class Reference:
    """The model of one checkpoint directory, weights decoded to float64 once."""

    def __init__(self, directory):
        with open(os.path.join(directory, "config.json")) as f:
            self.cfg = json.load(f)
        self.d = Dims(self.cfg)
        self.P = fmt.decode_weights(fmt.read_sharded(directory))

    def streams(self, tokens, trace=None):
        """The n-stream state after the last main block, before hc_head: [S, n, D]."""
        d, P = self.d, self.P
        ids = np.asarray(tokens, dtype=np.int64)
        X = np.repeat(P["embed.weight"][ids][:, None, :], d.n, axis=1)           # the n copies start identical
        for i in range(d.L):
            X = block(X, ids, P, f"layers.{i}.", d.ratios[i], i < d.n_hash, d, trace)
        return X

    def head_logits(self, X, prefix=""):
        """logits = head(RMSNorm(hc_head(X))), with the hc_head and norm of `prefix` ('' or 'mtp.j.')."""
        P = self.P
        h = hc_head(X, P[prefix + "hc_head_fn"], P[prefix + "hc_head_scale"], P[prefix + "hc_head_base"], self.d)
        return linear(rms_norm(h, P[prefix + "norm.weight"], self.d.eps), P["head.weight"])

    def logits(self, tokens, trace=None):
        return self.head_logits(self.streams(tokens, trace))

    def logprobs(self, tokens):
        """log p(tokens[i+1] | tokens[:i+1]) for i = 0..n-2."""
        lp = log_softmax(self.logits(tokens))
        return [float(lp[i, tokens[i + 1]]) for i in range(len(tokens) - 1)]

    def mtp_logprobs(self, tokens, depth=0):
        """MTP block `depth` (spec section 6): position s (state X^L_s and the embedding of token s+1) predicts token
        s+2. Returns log p(tokens[s+2]) for s = 0..n-3. The embedding and head are shared with the main model."""
        d, P, p = self.d, self.P, f"mtp.{depth}."
        assert depth < d.nextn, "the checkpoint has no such MTP block"
        X = self.streams(tokens)[:-1]                                            # positions 0..n-2
        nxt = np.asarray(tokens[1:], dtype=np.int64)
        e = rms_norm(P["embed.weight"][nxt], P[p + "enorm.weight"], d.eps)
        x = rms_norm(X, P[p + "hnorm.weight"], d.eps)
        X0 = linear(e, P[p + "e_proj.weight"])[:, None, :] + linear(x, P[p + "h_proj.weight"])
        X1 = block(X0, nxt, P, p, d.ratios[d.L + depth], False, d)
        lp = log_softmax(self.head_logits(X1, p))
        return [float(lp[s, tokens[s + 2]]) for s in range(len(tokens) - 2)]


_CACHE = {}


def load(directory):
    """A Reference for the directory, cached by path and file modification times."""
    key = os.path.realpath(directory)
    stamp = tuple(sorted((f, os.path.getmtime(os.path.join(key, f))) for f in os.listdir(key)))
    if key not in _CACHE or _CACHE[key][0] != stamp:
        _CACHE[key] = (stamp, Reference(key))
    return _CACHE[key][1]


def logprobs(directory, tokens):
    """Float64 forward of the full sequence: log p(tokens[i+1] | tokens[:i+1]), i = 0..n-2. No MTP."""
    return load(directory).logprobs(list(tokens))


def mtp_logprobs(directory, tokens):
    """The first MTP block's log p(tokens[s+2] | tokens[:s+2]), s = 0..n-3."""
    return load(directory).mtp_logprobs(list(tokens))


# ======================================================================================================================
# CLI

def _parse_ints(text):
    return [int(v) for v in text.replace(" ", "").split(",") if v != ""]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="write a random checkpoint in the official layout")
    w.add_argument("dir")
    w.add_argument("--preset", default="tiny", choices=["tiny", "small"])
    w.add_argument("--fmt", default="bf16", choices=["bf16", "fp8"])
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--layers", help="compress ratio per main layer, e.g. 0,4,128,4 (sets num_hidden_layers)")
    w.add_argument("--nextn", type=int, help="num_nextn_predict_layers (MTP blocks, compress ratio 0)")
    w.add_argument("--shards", type=int, default=2)
    w.add_argument("--set", action="append", default=[], metavar="KEY=JSON", help="override a config.json key")
    lp = sub.add_parser("logprobs", help="print the reference logprobs of a token sequence")
    lp.add_argument("dir")
    lp.add_argument("--tokens", required=True, help="comma-separated token ids")
    lp.add_argument("--mtp", action="store_true", help="also print the MTP block's logprobs (s predicts s+2)")
    args = ap.parse_args(argv)

    if args.cmd == "write":
        cfg = preset_config(args.preset)
        for item in args.set:
            key, _, value = item.partition("=")
            cfg[key] = json.loads(value)
        nextn = cfg["num_nextn_predict_layers"] if args.nextn is None else args.nextn
        layers = _parse_ints(args.layers) if args.layers else cfg["compress_ratios"][:cfg["num_hidden_layers"]]
        cfg.update(num_hidden_layers=len(layers), num_nextn_predict_layers=nextn,
                   compress_ratios=layers + [0] * nextn, num_hash_layers=min(cfg["num_hash_layers"], len(layers)))
        write_checkpoint(args.dir, cfg, args.seed, args.fmt, args.shards)
        print(json.dumps({"dir": args.dir, "fmt": args.fmt, "seed": args.seed, "compress_ratios": cfg["compress_ratios"]}))
        return 0
    tokens = _parse_ints(args.tokens)
    ref = load(args.dir)
    out = {"logprobs": ref.logprobs(tokens)}
    if args.mtp:
        out["mtp_logprobs"] = ref.mtp_logprobs(tokens)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
