#!/usr/bin/python3
"""Checks of the DeepSeek-V4 float64 reference against itself and against hand-made cases.

Run: /usr/bin/python3 tests/v4ref/self_test.py   (exits nonzero if any check fails; about 20 s)
"""

import copy
import json
import math
import os
import sys
import tempfile
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import v4_formats as fmt  # noqa: E402
import v4_reference as ref  # noqa: E402

CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def expect(cond, msg):
    if not cond:
        raise AssertionError(msg)


_DIRS = {}


def checkpoint(preset, ckpt_fmt, seed):
    """A checkpoint written once per (preset, fmt, seed) into a temporary directory."""
    key = (preset, ckpt_fmt, seed)
    if key not in _DIRS:
        path = os.path.join(TMP, f"{preset}_{ckpt_fmt}_{seed}")
        ref.write_checkpoint(path, ref.preset_config(preset), seed, ckpt_fmt)
        _DIRS[key] = path
    return _DIRS[key]


def tokens(n, vocab, seed=7):
    return [int(t) for t in np.random.default_rng(seed).integers(0, vocab, n)]


# ----------------------------------------------------------------------------------------------------------------------
# Storage formats

@check
def bf16_round_trip_and_ties():
    codes = np.arange(0, 65536, 7, dtype=np.uint16)
    x = fmt.bf16_decode(codes[(codes & 0x7F80) != 0x7F80])          # skip the inf/NaN exponent
    expect(np.array_equal(fmt.bf16_decode(fmt.bf16_encode(x)), x), "bf16 values must round-trip")
    ties = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8)])
    expect(np.array_equal(fmt.bf16_decode(fmt.bf16_encode(ties)), [1.0, 1 + 2 ** -6, -1.0]), "bf16 ties to even")


@check
def fp8_codes_round_trip():
    finite = [c for c in range(256) if np.isfinite(fmt.FP8_VALUES[c]) and c != 0x80]     # -0 encodes as +0
    vals = fmt.FP8_VALUES[finite]
    expect(np.array_equal(fmt.fp8_encode_scaled(vals), np.array(finite, dtype=np.uint8)), "every e4m3 code round-trips")
    expect(fmt.FP8_VALUES[0x7E] == 448 and np.isnan(fmt.FP8_VALUES[0x7F]) and fmt.FP8_VALUES[1] == 2 ** -9,
           "e4m3fn max 448, S.1111.111 NaN, smallest subnormal 2^-9")
    # Halfway between 1 (0x38) and 1.125 (0x39) rounds to the even code; just above rounds up.
    expect(list(fmt.fp8_encode_scaled([1.0625, 1.0626, 1.1875])) == [0x38, 0x39, 0x3A], "e4m3 rounds half to even")


@check
def fp8_block_quantize_partial_blocks():
    w = np.random.default_rng(0).normal(0, 0.05, (200, 70))
    w[130:, :] *= 40.0                                   # second row block gets a different scale
    codes, scales = fmt.fp8_block_quantize(w)
    expect(codes.shape == (200, 70) and scales.shape == (2, 1), f"scale shape {scales.shape} != ceil(out/128, in/128)")
    s = fmt.e8m0_decode(scales)
    expect(np.all(np.log2(s) == np.round(np.log2(s))), "scales are powers of two")
    expect(s[1, 0] > s[0, 0], "blocks are scaled separately")
    for bo in range(2):
        amax = np.abs(w[bo * 128:(bo + 1) * 128]).max()
        expect(224 < amax / s[bo, 0] <= 448, "the smallest power of two that fits the block amax")
    deq = fmt.fp8_block_dequantize(codes, scales)
    full = np.repeat(s, 128, axis=0)[:200]
    expect(np.all(np.abs(deq - w) <= np.maximum(2 ** -4 * np.abs(w), 2 ** -10 * full)), "fp8 error within half ulp")


@check
def fp4_nibble_order_and_round_trip():
    row = np.array([[1.0, -2.0, 0.5, 6.0] + [0.0] * 28])
    packed, scales = fmt.mxfp4_quantize(row)
    expect(packed.dtype == np.int8 and packed.shape == (1, 16) and scales.shape == (1, 1), "MXFP4 shapes")
    expect(scales[0, 0] == 127, "amax 6 needs scale 2^0")
    b = packed.view(np.uint8)[0]
    expect(b[0] == (2 | (12 << 4)) and b[1] == (1 | (7 << 4)), f"low nibble = element 2k: got {b[:2]}")
    nib = np.arange(16, dtype=np.uint8).reshape(1, 16)
    expect(np.array_equal(fmt.fp4_unpack(fmt.fp4_pack(nib)), nib), "pack/unpack round trip")
    # Values on the e2m1 grid times a per-32 power of two come back exactly.
    rng = np.random.default_rng(1)
    grid = fmt.FP4_VALUES[rng.integers(0, 16, (8, 96))]
    grid[:, ::32] = 6.0                                   # pin every block's amax to 6
    scale = np.exp2(rng.integers(-8, 3, (8, 3)))
    w = grid * np.repeat(scale, 32, axis=1)
    packed, scales = fmt.mxfp4_quantize(w)
    expect(np.array_equal(fmt.mxfp4_dequantize(packed, scales), w), "exact MXFP4 values round-trip")
    expect(np.array_equal(fmt.e8m0_decode(scales), scale), "E8M0 scales per 1x32")


@check
def safetensors_layout():
    path = checkpoint("tiny", "fp8", 1)
    with open(os.path.join(path, "model.safetensors.index.json")) as f:
        index = json.load(f)
    shards = sorted(set(index["weight_map"].values()))
    expect(len(shards) >= 2, "at least two shards")
    total = 0
    for shard in shards:
        with open(os.path.join(path, shard), "rb") as f:
            data = f.read()
        n = int.from_bytes(data[:8], "little")
        expect(n % 8 == 0, "header length is a multiple of 8")
        header = json.loads(data[8:8 + n])
        end = 0
        for name, info in sorted(((k, v) for k, v in header.items() if k != "__metadata__"),
                                 key=lambda kv: kv[1]["data_offsets"][0]):
            expect(info["data_offsets"][0] == end, f"{name}: tensors are back to back")
            end = info["data_offsets"][1]
            expect(index["weight_map"][name] == shard, f"{name}: weight_map names its shard")
        expect(8 + n + end == len(data), "no trailing bytes")
        total += end
    expect(index["metadata"]["total_size"] == total, "total_size")


@check
def checkpoint_names_dtypes_shapes():
    st = fmt.read_sharded(checkpoint("tiny", "fp8", 1))
    want = {   # name: (dtype, shape) from spec section 7 at the tiny sizes
        "embed.weight": ("BF16", [64, 64]), "head.weight": ("BF16", [64, 64]), "norm.weight": ("BF16", [64]),
        "hc_head_fn": ("F32", [2, 128]), "hc_head_base": ("F32", [2]), "hc_head_scale": ("F32", [1]),
        "layers.0.hc_attn_fn": ("F32", [8, 128]), "layers.0.hc_ffn_scale": ("F32", [3]),
        "layers.0.attn.attn_sink": ("F32", [4]),
        "layers.0.attn.wq_a.weight": ("F8_E4M3", [32, 64]), "layers.0.attn.wq_a.scale": ("F8_E8M0", [1, 1]),
        "layers.0.attn.wq_b.weight": ("F8_E4M3", [128, 32]), "layers.0.attn.wkv.weight": ("F8_E4M3", [32, 64]),
        "layers.0.attn.wo_a.weight": ("F8_E4M3", [32, 64]), "layers.0.attn.wo_b.weight": ("F8_E4M3", [64, 32]),
        "layers.0.attn.q_norm.weight": ("BF16", [32]), "layers.0.attn.kv_norm.weight": ("BF16", [32]),
        "layers.0.ffn.gate.tid2eid": ("I64", [64, 2]), "layers.0.ffn.gate.weight": ("BF16", [4, 64]),
        "layers.1.ffn.gate.bias": ("F32", [4]),
        "layers.1.attn.compressor.wkv.weight": ("BF16", [64, 64]), "layers.1.attn.compressor.ape": ("F32", [4, 64]),
        "layers.1.attn.compressor.norm.weight": ("BF16", [32]),
        "layers.1.attn.indexer.wq_b.weight": ("F8_E4M3", [32, 32]),
        "layers.1.attn.indexer.weights_proj.weight": ("BF16", [2, 64]),
        "layers.1.attn.indexer.compressor.wgate.weight": ("BF16", [32, 64]),
        "layers.1.attn.indexer.compressor.ape": ("F32", [4, 32]),
        "layers.1.attn.indexer.compressor.norm.weight": ("BF16", [16]),
        "layers.2.attn.compressor.wgate.weight": ("BF16", [32, 64]), "layers.2.attn.compressor.ape": ("F32", [128, 32]),
        "layers.3.ffn.experts.3.w1.weight": ("I8", [32, 32]), "layers.3.ffn.experts.3.w1.scale": ("F8_E8M0", [32, 2]),
        "layers.3.ffn.experts.0.w2.weight": ("I8", [64, 16]), "layers.3.ffn.experts.0.w2.scale": ("F8_E8M0", [64, 1]),
        "layers.3.ffn.shared_experts.w2.weight": ("F8_E4M3", [64, 32]),
        "mtp.0.e_proj.weight": ("F8_E4M3", [64, 64]), "mtp.0.h_proj.scale": ("F8_E8M0", [1, 1]),
        "mtp.0.enorm.weight": ("BF16", [64]), "mtp.0.hnorm.weight": ("BF16", [64]), "mtp.0.norm.weight": ("BF16", [64]),
        "mtp.0.hc_head_fn": ("F32", [2, 128]), "mtp.0.ffn.gate.bias": ("F32", [4]),
        "mtp.0.attn.wq_a.weight": ("F8_E4M3", [32, 64]),
    }
    for name, (dtype, shape) in want.items():
        expect(name in st, f"missing {name}")
        expect((st[name].dtype, list(st[name].array.shape)) == (dtype, shape),
               f"{name}: {st[name].dtype} {list(st[name].array.shape)} != {dtype} {shape}")
    absent = ["layers.0.ffn.gate.bias", "layers.1.ffn.gate.tid2eid", "layers.0.attn.compressor.ape",
              "layers.2.attn.indexer.wq_b.weight", "mtp.0.ffn.gate.tid2eid", "mtp.0.embed.weight", "mtp.0.head.weight",
              "mtp.0.attn.compressor.ape"]
    for name in absent:
        expect(name not in st, f"{name} must not exist")
    expect(not any(k.startswith("model.") for k in st), "no model. prefix")
    tid = st["layers.0.ffn.gate.tid2eid"].array
    expect(all(len(set(r)) == 2 for r in tid) and tid.min() >= 0 and tid.max() < 4, "K distinct experts per token")
    bf = fmt.read_sharded(checkpoint("tiny", "bf16", 1))
    expect(not any(k.endswith(".scale") for k in bf), "bf16 checkpoint has no .scale tensors")
    expect(bf["layers.3.ffn.experts.0.w2.weight"].dtype == "BF16" and bf["layers.0.hc_attn_fn"].dtype == "F32", "bf16")
    with open(os.path.join(checkpoint("tiny", "fp8", 1), "config.json")) as f:
        cfg = json.load(f)
    expect(cfg["expert_dtype"] == "fp4" and cfg["quantization_config"]["weight_block_size"] == [128, 128], "fp8 cfg")
    expect(len(cfg["compress_ratios"]) == cfg["num_hidden_layers"] + cfg["num_nextn_predict_layers"], "ratios")


# ----------------------------------------------------------------------------------------------------------------------
# Formulas on hand-made cases

@check
def sinkhorn_columns_sum_to_one():
    logits = np.random.default_rng(2).normal(0, 3.0, (50, 4, 4))
    m = ref.sinkhorn(logits, 20, 1e-6)
    expect(np.all(m > 0), "positive")
    expect(np.abs(m.sum(axis=-2) - 1).max() < 1e-5, "columns sum to 1 (the last step normalizes columns)")
    mild = ref.sinkhorn(logits / 3.0, 20, 1e-6)
    expect(np.abs(mild.sum(axis=-1) - 1).max() < 1e-3, "rows close to 1 after 20 iterations (mild logits)")
    # iters=1: a row softmax, +eps, one column normalization.
    sm = np.exp(logits[0]) / np.exp(logits[0]).sum(axis=1, keepdims=True) + 1e-6
    expect(np.allclose(ref.sinkhorn(logits[:1], 1, 1e-6)[0], sm / (sm.sum(axis=0) + 1e-6), rtol=0, atol=1e-15),
           "first step is a row softmax")


@check
def hc_post_uses_transposed_comb():
    X = np.array([[[1.0, 0, 0], [0, 1.0, 0]]])           # [S=1, n=2, D=3]: stream 0 = e0, stream 1 = e1
    f = np.array([[0, 0, 1.0]])
    post = np.array([[0.5, 2.0]])
    comb = np.array([[[0.1, 0.9], [0.3, 0.7]]])          # M[a, c]: a = source, c = destination
    out = ref.hc_post(f, X, post, comb)[0]
    expect(np.allclose(out, [[0.1, 0.3, 0.5], [0.9, 0.7, 2.0]], rtol=0, atol=1e-15),
           f"X'_c = post_c f + sum_a M[a,c] X_a, got {out.tolist()}")


@check
def hc_pre_split_layout():
    d = ref.Dims(ref.preset_config("tiny"))              # n = 2, M = 8
    X = np.random.default_rng(3).normal(0, 1, (3, 2, 64))
    fn = np.zeros((8, 128))
    base = np.array([0.0, 1.0, -1.0, 2.0] + [0.0] * 4)   # pre | post | comb (row-major)
    base[4 + 1] = 50.0                                   # comb[0,1] large -> M[0,1] ~ 1 (row 0 goes to column 1)
    base[4 + 2] = 50.0                                   # comb[1,0] large -> M[1,0] ~ 1
    u, post, comb = ref.hc_pre(X, fn, np.ones(3), base, d)
    sig = 1 / (1 + np.exp(-np.array([0.0, 1.0, -1.0, 2.0])))
    expect(np.allclose(u, sig[0] * X[:, 0] + sig[1] * X[:, 1] + 2e-6 * X.sum(axis=1) / 2, rtol=0, atol=1e-12),
           "pre = sigmoid(.) + eps weights the streams")
    expect(np.allclose(post, 2 * sig[2:4], rtol=0, atol=1e-15), "post = 2 sigmoid(.)")
    expect(comb[0, 0, 1] > 0.99 and comb[0, 1, 0] > 0.99, "comb logits are read row-major [a, c]")


@check
def clamped_swiglu():
    d = ref.Dims(ref.preset_config("tiny"))              # swiglu_limit = 1
    eye = np.eye(2)
    P = {"e.w1.weight": eye, "e.w3.weight": eye, "e.w2.weight": eye}
    y = ref.expert(np.array([[3.0, -3.0]]), P, "e.", d, np.array([0.5]))[0]
    silu = lambda g: g / (1 + math.exp(-g))              # noqa: E731
    expect(np.allclose(y, [0.5 * silu(1.0) * 1.0, 0.5 * silu(-3.0) * -1.0], rtol=0, atol=1e-15),
           "gate <= limit (upper only), up in [-limit, limit], weight before W2")


@check
def sparse_attention_sink():
    q = np.array([[1.0, 2.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])           # H = 2, Dh = 4
    cand = np.array([[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 3.0]])        # m = 2 rows, K = V
    sink = np.array([0.3, -1.0])
    z = np.array([[0.5, 1.0], [0.0, 0.0]])                               # q·kv / sqrt(4)
    p = np.exp(z) / (np.exp(sink) + np.exp(z).sum(axis=1))[:, None]
    o = ref.sparse_attend(q, cand, sink)
    expect(np.allclose(o, p @ cand, rtol=0, atol=1e-15), "sink only in the denominator; o = sum p kv")


class _D:
    """The two Dims fields the compressor reads."""
    Dr, eps = 2, 1e-6


@check
def compressor_csa_and_hca():
    rng = np.random.default_rng(5)
    a = rng.normal(0, 1, (9, 3))                         # S = 9: two complete blocks of 4, one token left over
    width, omega = 2, np.zeros(1)                        # omega 0: the RoPE step is the identity here
    P = {"c.wkv.weight": rng.normal(0, 1, (4, 3)), "c.wgate.weight": rng.normal(0, 1, (4, 3)),
         "c.ape": rng.normal(0, 1, (4, 4)), "c.norm.weight": np.ones(2)}
    got = ref.compress(a, P, "c.", 4, width, omega, _D)
    expect(got.shape == (2, 2), "floor(S/c) entries")
    C, Z = a @ P["c.wkv.weight"].T, a @ P["c.wgate.weight"].T + np.tile(P["c.ape"], (3, 1))[:9]
    for t in range(2):
        pooled = []
        for ch in range(2):                              # per channel: previous block on [0:w], this block on [w:2w]
            cs = [C[4 * (t - 1) + p, ch] for p in range(4)] * (t > 0) + [C[4 * t + p, width + ch] for p in range(4)]
            zs = [Z[4 * (t - 1) + p, ch] for p in range(4)] * (t > 0) + [Z[4 * t + p, width + ch] for p in range(4)]
            w = np.exp(np.array(zs) - max(zs))
            pooled.append(float(np.dot(w / w.sum(), cs)))
        pooled = np.array(pooled)
        want = pooled / np.sqrt(np.mean(pooled ** 2) + 1e-6)
        expect(np.allclose(got[t], want, rtol=1e-12, atol=1e-12), f"CSA entry {t}")
    # HCA (any c != 4): per channel over the block's own c tokens.
    P2 = {"c.wkv.weight": P["c.wkv.weight"][:2], "c.wgate.weight": P["c.wgate.weight"][:2],
          "c.ape": P["c.ape"][:3, :2], "c.norm.weight": np.array([1.0, 2.0])}
    got = ref.compress(a, P2, "c.", 3, width, omega, _D)
    C2, Z2 = a @ P2["c.wkv.weight"].T, a @ P2["c.wgate.weight"].T + np.tile(P2["c.ape"], (3, 1))
    for t in range(3):
        w = np.exp(Z2[3 * t:3 * t + 3] - Z2[3 * t:3 * t + 3].max(axis=0))
        pooled = (w / w.sum(axis=0) * C2[3 * t:3 * t + 3]).sum(axis=0)
        want = pooled / np.sqrt(np.mean(pooled ** 2) + 1e-6) * [1.0, 2.0]
        expect(np.allclose(got[t], want, rtol=1e-12, atol=1e-12), f"HCA entry {t}")


@check
def yarn_table_of_v4_flash():
    lo, hi = ref.yarn_range(64, 160000.0, 65536, 32, 1)
    expect((lo, hi) == (15, 25), f"V4-Flash YaRN range is (15, 25), got {(lo, hi)}")
    # The official find_correction_range clamps hi to rope_head_dim - 1, not Dr/2 - 1: with Dr = 8 (tiny preset)
    # ceil(3.09) = 4 survives, so gamma_j = (j - 1)/3 for j = 0..3 (a Dr/2 - 1 clamp would give (j - 1)/2).
    expect(ref.yarn_range(8, 160000.0, 65536, 32, 1) == (1, 4), "tiny YaRN range (1, 4), clamp at Dr - 1")
    cfg = ref.preset_config("tiny")
    cfg.update(qk_rope_head_dim=64, head_dim=128, index_head_dim=64)
    d = ref.Dims(cfg)
    plain = 160000.0 ** (-np.arange(32) * 2 / 64)
    om = ref.rope_frequencies(d, 4)
    expect(np.allclose(om[:16], plain[:16], rtol=1e-15) and np.allclose(om[25:], plain[25:] / 16, rtol=1e-15),
           "j <= 15 unscaled, j >= 25 divided by 16")
    expect(np.allclose(ref.rope_frequencies(d, 0), 10000.0 ** (-np.arange(32) * 2 / 64), rtol=1e-15), "c=0 plain")
    # Interleaved pairs: (x0, x1) rotates as x0 + i x1.
    r = ref.apply_rope(np.array([[1.0, 0.0, 0.0, 1.0]]), [2], np.array([0.25, 0.5]))
    expect(np.allclose(r, [[math.cos(.5), math.sin(.5), -math.sin(1.), math.cos(1.)]], rtol=0, atol=1e-15), "pairs")


# ----------------------------------------------------------------------------------------------------------------------
# Whole-model properties

@check
def hash_routing_uses_token_id():
    model = ref.load(checkpoint("tiny", "bf16", 1))
    d, P = model.d, model.P
    tid = P["layers.0.ffn.gate.tid2eid"]
    a, b = next((i, j) for i in range(d.V) for j in range(d.V) if set(tid[i]) != set(tid[j]))
    z = np.repeat(np.random.default_rng(4).normal(0, 1, (1, d.D)), 2, axis=0)   # same input, two token ids
    idx, w = ref.route(z, [a, b], P, "layers.0.ffn.", True, d)
    expect(np.array_equal(idx, tid[[a, b]]), "hash layers select tid2eid[token id]")
    expect(np.allclose(w.sum(axis=1), d.route_scale, rtol=1e-14), "weights normalized then scaled")
    idx2, _ = ref.route(z, [a, b], P, "layers.1.ffn.", False, d)
    expect(np.array_equal(idx2[0], idx2[1]), "other layers ignore the token id")
    # End to end: the hash table changes the output; the unused gate.bias would not exist there.
    toks = [a, b, a, b, 3, 5]
    base = model.logprobs(toks)
    P2 = dict(P)
    P2["layers.0.ffn.gate.tid2eid"] = tid[::-1].copy()
    model2 = copy.copy(model)
    model2.P = P2
    expect(model2.logprobs(toks) != base, "tid2eid matters end to end")


def _with_weight(model, name, value):
    m2 = copy.copy(model)
    m2.P = dict(model.P)
    m2.P[name] = value
    return m2


@check
def causal_prefix_tiny():
    model = ref.load(checkpoint("tiny", "bf16", 1))
    seq = tokens(150, model.d.V)
    full = model.logprobs(seq)
    for n in (140, 129, 128, 100, 17, 5, 2):
        expect(model.logprobs(seq[:n]) == full[:n - 1], f"prefix {n}: logprobs must equal exactly (float64)")
    mtp = model.mtp_logprobs(seq)
    expect(model.mtp_logprobs(seq[:100]) == mtp[:98], "MTP logprobs are causal too")


@check
def compressed_entries_visible_only_when_complete():
    model = ref.load(checkpoint("tiny", "bf16", 1))
    seq = tokens(150, model.d.V, seed=8)
    trace = {}
    lp = log_softmax_rows(model.logits(seq, trace))
    expect(trace["layers.2.attn."]["n_compressed"] == 1 and trace["layers.1.attn."]["n_compressed"] == 37, "counts")
    picks = trace["layers.1.attn."]["picks"]
    expect(all(len(p) == min(2, (s + 1) // 4) and (len(p) == 0 or p.max() < (s + 1) // 4)
               for s, p in enumerate(picks)), "indexer picks min(KI, visible) visible entries")
    for name, first in (("layers.2.attn.compressor.ape", 127), ("layers.1.attn.compressor.ape", 3),
                        ("layers.3.attn.indexer.compressor.ape", 3)):
        ape = model.P[name]
        lp2 = log_softmax_rows(_with_weight(model, name, ape + 1.5 * np.sign(ape)).logits(seq))
        diff = np.abs(lp2 - lp).max(axis=1)
        expect(np.all(diff[:first] == 0), f"{name}: no position before {first} may see its entries")
        expect(diff[first:].max() > 1e-6, f"{name}: the entries are used from position {first} on")
    # All-zero indexer weights: every score ties, so the lowest visible entries win.
    m0 = _with_weight(model, "layers.1.attn.indexer.weights_proj.weight",
                      np.zeros_like(model.P["layers.1.attn.indexer.weights_proj.weight"]))
    trace0 = {}
    m0.logits(seq[:40], trace0)
    expect(all(np.array_equal(p, np.arange(min(2, (s + 1) // 4))) for s, p in enumerate(trace0["layers.1.attn."]["picks"])),
           "ties go to the lower index")


def log_softmax_rows(logits):
    return ref.log_softmax(logits)


@check
def small_preset_300_tokens():
    model = ref.load(checkpoint("small", "bf16", 3))
    seq = tokens(300, model.d.V, seed=9)
    trace = {}
    full = log_softmax_rows(model.logits(seq, trace))
    for layer in ("layers.2.attn.", "layers.4.attn."):
        expect(trace[layer]["c"] == 128 and trace[layer]["n_compressed"] == 2, f"{layer}: 300 tokens -> 2 entries")
    expect(trace["layers.1.attn."]["n_compressed"] == 75, "c=4: 75 entries")
    lp = [float(full[i, seq[i + 1]]) for i in range(299)]
    expect(model.logprobs(seq[:270]) == lp[:269], "small: prefix 270 equals exactly")
    expect(all(np.isfinite(lp)) and -12 < np.mean(lp) < -2, f"O(1) activations give sane logprobs ({np.mean(lp)})")


@check
def bf16_and_fp8_differ_but_close():
    seq = tokens(40, 64, seed=10)
    a = np.array(ref.logprobs(checkpoint("tiny", "bf16", 1), seq))
    b = np.array(ref.logprobs(checkpoint("tiny", "fp8", 1), seq))
    diff = np.abs(a - b)
    expect(diff.max() > 1e-3, "FP8/MXFP4 storage must change the logprobs")
    expect(diff.mean() < 0.25 and diff.max() < 1.5, f"but stay close: mean {diff.mean():.3f} max {diff.max():.3f}")
    expect(np.corrcoef(a, b)[0, 1] > 0.95, "and correlated")
    c = np.array(ref.logprobs(checkpoint("tiny", "bf16", 2), seq))
    expect(np.abs(a - c).mean() > diff.mean(), "another seed is further away than the other format")


@check
def cli_round_trip():
    path = os.path.join(TMP, "cli")
    rc = ref.main(["write", path, "--preset", "tiny", "--fmt", "fp8", "--seed", "5", "--layers", "0,128,4"])
    expect(rc == 0, "write")
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    expect(cfg["compress_ratios"] == [0, 128, 4, 0] and cfg["num_hidden_layers"] == 3, "--layers")
    lp = ref.logprobs(path, [1, 2, 3, 4, 5])
    expect(len(lp) == 4 and all(np.isfinite(lp)), "logprobs of a CLI checkpoint")


def main():
    global TMP
    failed = 0
    with tempfile.TemporaryDirectory(prefix="v4ref_") as TMP:
        for fn in CHECKS:
            t = time.time()
            try:
                fn()
                print(f"ok    {fn.__name__}  ({time.time() - t:.1f}s)")
            except Exception:
                failed += 1
                print(f"FAIL  {fn.__name__}")
                traceback.print_exc()
    print(f"{len(CHECKS) - failed}/{len(CHECKS)} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
