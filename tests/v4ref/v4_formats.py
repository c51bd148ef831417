"""Storage formats of the official DeepSeek-V4 checkpoint, written from the checkpoint
formats of the official release (spec section 7; see README.md).

BF16, FP8 e4m3fn with 128x128 E8M0 block scales, MXFP4 (e2m1, two per byte, 1x32 E8M0 scales), and a minimal
sharded safetensors reader/writer. Everything is numpy only and independent of lockstep's C++ code.
"""

import json
import os

import numpy as np

# ----------------------------------------------------------------------------------------------------------------------
# BF16

def bf16_encode(x):
    """float array -> uint16 bf16 bit patterns, round to nearest even (via f32; NaN is not expected here)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return bits.astype(np.uint16)


def bf16_decode(u16):
    """uint16 bf16 bit patterns -> float64."""
    return (np.asarray(u16, dtype=np.uint32) << 16).view(np.float32).astype(np.float64)


# ----------------------------------------------------------------------------------------------------------------------
# FP8 e4m3fn (1 sign, 4 exponent bits with bias 7, 3 mantissa bits; no infinities; S.1111.111 is NaN; max 448)

def _fp8_table():
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp = (codes >> 3) & 0xF
    man = (codes & 7).astype(np.float64)
    mag = np.where(exp == 0, man / 8.0 * 2.0 ** -6, (1.0 + man / 8.0) * 2.0 ** (exp.astype(np.float64) - 7))
    val = sign * mag
    val[(exp == 15) & ((codes & 7) == 7)] = np.nan
    return val


FP8_VALUES = _fp8_table()            # (256,) value of every code
FP8_MAX = 448.0
# The positive finite codes 0..126 are monotonic in value, which lets the encoder search them.
_FP8_POS = FP8_VALUES[:127]

# e2m1: nibble -> value (spec section 7); the low 3 bits are the magnitude code, bit 3 the sign.
FP4_VALUES = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float64)
FP4_MAX = 6.0
_FP4_POS = FP4_VALUES[:8]


def _nearest_code(mag, table):
    """Index of the nearest entry of the ascending table to each magnitude; ties go to the even index
    (round half to even on the mantissa); magnitudes beyond the table saturate to the last entry."""
    mag = np.minimum(mag, table[-1])
    hi = np.clip(np.searchsorted(table, mag, side="left"), 1, len(table) - 1)
    lo = hi - 1
    d_lo = mag - table[lo]
    d_hi = table[hi] - mag
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    return np.where(pick_hi, hi, lo)


def fp8_encode_scaled(y):
    """Values already divided by their block scale (|y| <= 448) -> uint8 e4m3fn codes."""
    y = np.asarray(y, dtype=np.float64)
    code = _nearest_code(np.abs(y), _FP8_POS).astype(np.uint8)
    neg = (y < 0) & (code != 0)
    return np.where(neg, code | 0x80, code).astype(np.uint8)


def e8m0_decode(u8):
    """E8M0 byte -> 2^(e-127) (255 is NaN)."""
    e = np.asarray(u8, dtype=np.float64)
    out = np.exp2(e - 127.0)
    return np.where(e == 255, np.nan, out)


def _pow2_scale_exponent(amax, qmax):
    """Smallest power of two s with amax / s <= qmax, as the E8M0 exponent (s = 2^exponent)."""
    amax = np.maximum(amax, 1e-30)
    e = np.ceil(np.log2(amax / qmax))
    # log2 can be off by one ulp at exact powers of two: step down while the smaller scale still fits.
    e = np.where(amax / np.exp2(e - 1) <= qmax, e - 1, e)
    e = np.where(amax / np.exp2(e) > qmax, e + 1, e)
    return e.astype(np.int64)


def fp8_block_quantize(w, block=128):
    """W (out, in) -> (e4m3 codes uint8 (out, in), E8M0 scales uint8 (ceil(out/128), ceil(in/128))).

    One power-of-two scale per 128x128 block (partial edge blocks allowed), chosen so the block's amax fits 448."""
    w = np.asarray(w, dtype=np.float64)
    out_dim, in_dim = w.shape
    nb_o, nb_i = -(-out_dim // block), -(-in_dim // block)
    scale_e = np.zeros((nb_o, nb_i), dtype=np.int64)
    for bo in range(nb_o):
        for bi in range(nb_i):
            blk = w[bo * block:(bo + 1) * block, bi * block:(bi + 1) * block]
            scale_e[bo, bi] = _pow2_scale_exponent(np.abs(blk).max(), FP8_MAX)
    full = np.repeat(np.repeat(scale_e, block, axis=0), block, axis=1)[:out_dim, :in_dim]
    codes = fp8_encode_scaled(w / np.exp2(full))
    return codes, (scale_e + 127).astype(np.uint8)


def fp8_block_dequantize(codes, scales, block=128):
    """(e4m3 codes (out, in), E8M0 scales) -> float64 W: W[i,j] = fp8(code) * 2^(e-127) of block (i/128, j/128)."""
    out_dim, in_dim = codes.shape
    s = e8m0_decode(scales)
    full = np.repeat(np.repeat(s, block, axis=0), block, axis=1)[:out_dim, :in_dim]
    return FP8_VALUES[codes] * full


def fp4_encode_scaled(y):
    """Values already divided by their scale (|y| <= 6) -> e2m1 nibbles (uint8 0..15)."""
    y = np.asarray(y, dtype=np.float64)
    code = _nearest_code(np.abs(y), _FP4_POS).astype(np.uint8)
    neg = (y < 0) & (code != 0)
    return np.where(neg, code | 8, code).astype(np.uint8)


def fp4_pack(nibbles):
    """(out, in) nibbles -> (out, in/2) bytes: low nibble = element 2k, high nibble = element 2k+1."""
    nib = np.asarray(nibbles, dtype=np.uint8)
    assert nib.shape[1] % 2 == 0, "MXFP4 needs an even input width"
    return (nib[:, 0::2] | (nib[:, 1::2] << 4)).astype(np.uint8)


def fp4_unpack(packed):
    """(out, in/2) bytes -> (out, in) nibbles."""
    p = np.asarray(packed).view(np.uint8)
    out = np.empty((p.shape[0], p.shape[1] * 2), dtype=np.uint8)
    out[:, 0::2] = p & 0xF
    out[:, 1::2] = p >> 4
    return out


def mxfp4_quantize(w, block=32):
    """W (out, in) -> (packed int8 (out, in/2), E8M0 scales uint8 (out, ceil(in/32))), one scale per 1x32 run."""
    w = np.asarray(w, dtype=np.float64)
    out_dim, in_dim = w.shape
    nb = -(-in_dim // block)
    scale_e = np.zeros((out_dim, nb), dtype=np.int64)
    for b in range(nb):
        scale_e[:, b] = _pow2_scale_exponent(np.abs(w[:, b * block:(b + 1) * block]).max(axis=1), FP4_MAX)
    full = np.repeat(scale_e, block, axis=1)[:, :in_dim]
    nib = fp4_encode_scaled(w / np.exp2(full))
    return fp4_pack(nib).view(np.int8), (scale_e + 127).astype(np.uint8)


def mxfp4_dequantize(packed, scales, block=32):
    """(packed int8 (out, in/2), E8M0 (out, ceil(in/32))) -> float64 W."""
    nib = fp4_unpack(packed)
    s = np.repeat(e8m0_decode(scales), block, axis=1)[:, :nib.shape[1]]
    return FP4_VALUES[nib] * s


# ----------------------------------------------------------------------------------------------------------------------
# safetensors: 8-byte little-endian header length, JSON header (padded with spaces to a multiple of 8), raw data.
# Tensors are stored back to back; data_offsets are relative to the end of the header.

_ST_DTYPES = {  # safetensors dtype -> (numpy storage dtype, bytes per element)
    "BF16": np.dtype("<u2"), "F32": np.dtype("<f4"), "F8_E4M3": np.dtype("u1"), "F8_E8M0": np.dtype("u1"),
    "I8": np.dtype("i1"), "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "F64": np.dtype("<f8"),
}


class Stored:
    """A tensor as it lies in the file: safetensors dtype name plus the raw numpy array of that storage type."""

    def __init__(self, dtype, array):
        assert dtype in _ST_DTYPES, dtype
        self.dtype = dtype
        self.array = np.ascontiguousarray(array, dtype=_ST_DTYPES[dtype])


def write_safetensors(path, tensors):
    """tensors: ordered dict name -> Stored. Returns the number of data bytes written."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        raw = t.array.tobytes()
        header[name] = {"dtype": t.dtype, "shape": list(t.array.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for raw in blobs:
            f.write(raw)
    return offset


def read_safetensors(path):
    """-> dict name -> Stored (copies of the data)."""
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        dt = _ST_DTYPES[info["dtype"]]
        arr = np.frombuffer(data[base + b:base + e], dtype=dt).reshape(info["shape"]).copy()
        out[name] = Stored(info["dtype"], arr)
    return out


def write_sharded(directory, tensors, n_shards):
    """Split the ordered tensors into n_shards files of about equal size plus model.safetensors.index.json."""
    names = list(tensors)
    sizes = [tensors[k].array.nbytes for k in names]
    total = sum(sizes)
    groups, acc, cur = [[] for _ in range(n_shards)], 0, 0
    for name, size in zip(names, sizes):
        # Move to the next shard once this one holds its share (every shard gets at least one tensor).
        if cur < n_shards - 1 and groups[cur] and acc >= total * (cur + 1) / n_shards:
            cur += 1
        groups[cur].append(name)
        acc += size
    weight_map = {}
    for i, group in enumerate(groups):
        fname = f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors"
        write_safetensors(os.path.join(directory, fname), {k: tensors[k] for k in group})
        for k in group:
            weight_map[k] = fname
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)


def read_sharded(directory):
    """-> dict name -> Stored, from model.safetensors.index.json and its shards (or a lone model.safetensors)."""
    if not os.path.exists(os.path.join(directory, "model.safetensors.index.json")):
        return read_safetensors(os.path.join(directory, "model.safetensors"))
    with open(os.path.join(directory, "model.safetensors.index.json")) as f:
        index = json.load(f)
    out = {}
    for fname in sorted(set(index["weight_map"].values())):
        out.update(read_safetensors(os.path.join(directory, fname)))
    missing = set(index["weight_map"]) - set(out)
    assert not missing, f"index names tensors missing from the shards: {sorted(missing)[:5]}"
    return out


def decode_weights(stored):
    """Stored tensors -> dict name -> float64 (or int64 for integer tables) arrays, dequantizing FP8 and MXFP4
    weights with their `.scale` companions. The `.scale` tensors themselves are consumed, not returned."""
    out = {}
    for name, t in stored.items():
        if name.endswith(".scale"):
            continue
        if t.dtype == "BF16":
            out[name] = bf16_decode(t.array)
        elif t.dtype in ("F32", "F64"):
            out[name] = t.array.astype(np.float64)
        elif t.dtype in ("I64", "I32"):
            out[name] = t.array.astype(np.int64)
        elif t.dtype == "F8_E4M3":
            out[name] = fp8_block_dequantize(t.array, stored[name[:-len("weight")] + "scale"].array)
        elif t.dtype == "I8":
            out[name] = mxfp4_dequantize(t.array, stored[name[:-len("weight")] + "scale"].array)
        else:
            raise ValueError(f"{name}: unexpected dtype {t.dtype}")
    return out
