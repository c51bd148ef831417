#!/usr/bin/env python3
"""Converts a Qwen3-MoE model in Hugging Face layout (as `lockstep init` or
`lockstep export --dtype f32|bf16` writes it: config.json, model.safetensors or
sharded *.safetensors, tokenizer.json) into a GGUF file of llama.cpp's
`qwen3moe` architecture.

  hf_to_gguf.py MODEL_DIR OUT.gguf [--dtype f32|f16|bf16]

Needs numpy and llama.cpp's gguf-py (pure Python; setup.sh's clone has it:
PYTHONPATH=$LLAMACPP_CACHE/llama.cpp/gguf-py). No torch, no safetensors
package: the safetensors files are read with numpy (8-byte little-endian header
length, a JSON header, then the raw tensors).

What it writes (the keys and names of llama.cpp's convert_hf_to_gguf.py for
Qwen3MoeForCausalLM, conversion/qwen.py, and of src/models/qwen3moe.cpp):
  - qwen3moe.{context_length, embedding_length, feed_forward_length,
    block_count, attention.head_count, attention.head_count_kv,
    attention.key_length, attention.value_length, attention.layer_norm_rms_epsilon,
    rope.freq_base, expert_count, expert_used_count, expert_feed_forward_length,
    expert_gating_func = softmax}, general.file_type;
  - token_embd, output_norm, output (untied head; omitted when tied: llama.cpp
    then reuses token_embd), and per layer attn_norm, attn_q/k/v, attn_output,
    attn_q_norm, attn_k_norm, ffn_norm, ffn_gate_inp (the router) and the
    experts stacked into 3-D ffn_gate_exps / ffn_up_exps [E, Fe, D] and
    ffn_down_exps [E, D, Fe] (numpy order; GGUF reverses it).
  - No permutation of q/k: Hugging Face Qwen3 rotates the two halves of each
    head (rotate_half, "neox"), and llama.cpp's qwen3moe uses LLAMA_ROPE_TYPE_NEOX
    (llama_model_rope_type in src/llama-model.cpp); the permute() of
    convert_hf_to_gguf.py is for LLaMA's interleaved (GPT-J) pairs only.
  - --dtype: f32 keeps every tensor f32. f16/bf16 store the matrices (the
    projections, experts, lm_head and the embedding) in that type and keep 1-D
    tensors (norms) and the router in f32, as convert_hf_to_gguf.py does.
  - A vocabulary of exactly vocab_size tokens (llama.cpp sizes token_embd by it):
    tokenizer.json's BPE vocab and added tokens, padded with [PAD<id>] tokens
    (type UNUSED), tokenizer.ggml.model = gpt2. The comparison feeds token ids,
    so the tokenizer only has to load; without tokenizer.json a vocab of
    [PAD<id>] tokens is written.
Refuses what qwen3moe cannot express (shared experts, biases on q/k/v,
norm_topk_prob = false, non-softmax routers, rope scaling).
"""
import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

try:
    import gguf
except ImportError:
    sys.exit("hf_to_gguf.py: cannot import gguf; put llama.cpp's gguf-py on PYTHONPATH "
             "(PYTHONPATH=$LLAMACPP_CACHE/llama.cpp/gguf-py, see setup.sh)")


def read_safetensors(path):
    """name -> numpy array (float32) of every tensor in one .safetensors file."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    base = 8 + n
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        buf = raw[base + b:base + e]
        shape = tuple(info["shape"])
        dt = info["dtype"]
        if dt == "F32":
            a = buf.view("<f4")
        elif dt == "F16":
            a = buf.view("<f2").astype(np.float32)
        elif dt == "BF16":
            a = (buf.view("<u2").astype(np.uint32) << 16).view(np.float32)
        elif dt == "F64":
            a = buf.view("<f8").astype(np.float32)
        else:
            raise SystemExit(f"{path}: tensor {name} has dtype {dt}; convert f32/f16/bf16 checkpoints only "
                             "(lockstep export --dtype f32 or bf16)")
        out[name] = a.reshape(shape)
    return out


def load_tensors(model_dir):
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise SystemExit(f"{model_dir}: no .safetensors file")
    t = {}
    for f in files:
        t.update(read_safetensors(f))
    return t


def to_bf16(a):
    """float32 -> bfloat16 bits (uint16), round to nearest even (NaN kept NaN)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(a)
    if nan.any():
        r[nan] = 0x7FC0
    return r


def build_vocab(model_dir, vocab_size):
    """(tokens, token types, merges, special ids) for vocab_size ids."""
    tokens = [None] * vocab_size
    types = [gguf.TokenType.NORMAL] * vocab_size
    merges = []
    special = {}
    tj = Path(model_dir) / "tokenizer.json"
    if tj.exists():
        tok = json.loads(tj.read_text(encoding="utf-8"))
        model = tok.get("model", {})
        if model.get("type", "BPE") != "BPE":
            raise SystemExit(f"{tj}: model type {model.get('type')} (only byte-level BPE is converted)")
        for text, i in model.get("vocab", {}).items():
            if i >= vocab_size:
                raise SystemExit(f"{tj}: token id {i} >= vocab_size {vocab_size}")
            tokens[i] = text
        for m in model.get("merges", []):
            merges.append(m if isinstance(m, str) else " ".join(m))
        for at in tok.get("added_tokens", []):
            i = at["id"]
            if i >= vocab_size:
                raise SystemExit(f"{tj}: added token id {i} >= vocab_size {vocab_size}")
            tokens[i] = at["content"]
            types[i] = gguf.TokenType.CONTROL if at.get("special") else gguf.TokenType.USER_DEFINED
    seen = set()
    for i in range(vocab_size):
        if tokens[i] is None or tokens[i] in seen:  # llama.cpp wants every token text unique
            tokens[i] = f"[PAD{i}]"
            types[i] = gguf.TokenType.UNUSED
        seen.add(tokens[i])
    if not merges:
        # tokenizer.ggml.merges must exist for a gpt2 vocab, and GGUF forbids empty arrays:
        # one merge of two pad tokens, which no byte-level text can ever produce.
        merges = [f"{tokens[-2]} {tokens[-1]}"] if types[-1] == gguf.TokenType.UNUSED else ["[PAD] [PAD]"]
    for name in ("config.json", "generation_config.json"):
        p = Path(model_dir) / name
        if p.exists():
            c = json.loads(p.read_text())
            for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
                v = c.get(k)
                if isinstance(v, list):
                    v = v[0] if v else None
                if isinstance(v, int) and 0 <= v < vocab_size:
                    special.setdefault(k, v)
    return tokens, types, merges, special


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("out")
    ap.add_argument("--dtype", choices=["f32", "f16", "bf16"], default="f32")
    args = ap.parse_args()

    cfg = json.loads((Path(args.model_dir) / "config.json").read_text())
    arch = (cfg.get("architectures") or ["?"])[0]
    if arch != "Qwen3MoeForCausalLM":
        raise SystemExit(f"{args.model_dir}: architecture {arch}, expected Qwen3MoeForCausalLM")
    V, D, L = cfg["vocab_size"], cfg["hidden_size"], cfg["num_hidden_layers"]
    H = cfg["num_attention_heads"]
    Hkv = cfg.get("num_key_value_heads", H)
    Dh = cfg.get("head_dim") or D // H
    E, K, Fe = cfg["num_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]
    if not cfg.get("norm_topk_prob", False):
        raise SystemExit("norm_topk_prob = false: llama.cpp's qwen3moe always renormalizes the top-k weights")
    if cfg.get("shared_expert_intermediate_size") or cfg.get("attention_bias"):
        raise SystemExit("shared experts / attention biases are not part of qwen3moe")
    if cfg.get("rope_scaling") not in (None, {}) and (cfg["rope_scaling"] or {}).get("rope_type", "default") != "default":
        raise SystemExit(f"rope_scaling {cfg['rope_scaling']} is not converted")
    if cfg.get("decoder_sparse_step", 1) != 1 or cfg.get("mlp_only_layers"):
        raise SystemExit("dense layers (decoder_sparse_step / mlp_only_layers) are not converted")
    rope_theta = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    tied = cfg.get("tie_word_embeddings", False)

    t = load_tensors(args.model_dir)
    half = {"f32": None, "f16": np.float16, "bf16": "bf16"}[args.dtype]
    ftype = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
             "bf16": gguf.LlamaFileType.MOSTLY_BF16}[args.dtype]

    w = gguf.GGUFWriter(args.out, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.QWEN3MOE])
    w.add_name(Path(args.model_dir).name)
    w.add_context_length(cfg.get("max_position_embeddings", 4096))
    w.add_embedding_length(D)
    w.add_feed_forward_length(cfg.get("intermediate_size") or Fe * K)
    w.add_block_count(L)
    w.add_head_count(H)
    w.add_head_count_kv(Hkv)
    w.add_key_length(Dh)
    w.add_value_length(Dh)
    w.add_rope_freq_base(float(rope_theta))
    w.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-6)))
    w.add_expert_count(E)
    w.add_expert_used_count(K)
    w.add_expert_feed_forward_length(Fe)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SOFTMAX)
    w.add_file_type(ftype)

    tokens, types, merges, special = build_vocab(args.model_dir, V)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    if "bos_token_id" in special:
        w.add_bos_token_id(special["bos_token_id"])
    if "eos_token_id" in special:
        w.add_eos_token_id(special["eos_token_id"])
    if "pad_token_id" in special:
        w.add_pad_token_id(special["pad_token_id"])
    w.add_add_bos_token(False)

    used = set()

    def take(name):
        if name not in t:
            raise SystemExit(f"{args.model_dir}: tensor {name} is missing")
        used.add(name)
        return t[name]

    def add(gname, a, keep_f32=False):
        a = np.ascontiguousarray(a, dtype=np.float32)
        if half is None or keep_f32 or a.ndim <= 1:
            w.add_tensor(gname, a)
        elif half == "bf16":
            w.add_tensor(gname, to_bf16(a), raw_shape=a.shape, raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            w.add_tensor(gname, a.astype(np.float16))

    def expect(a, shape, name):
        if tuple(a.shape) != tuple(shape):
            raise SystemExit(f"{name}: shape {tuple(a.shape)}, expected {tuple(shape)}")
        return a

    add("token_embd.weight", expect(take("model.embed_tokens.weight"), (V, D), "embed_tokens"))
    for i in range(L):
        p = f"model.layers.{i}."
        add(f"blk.{i}.attn_norm.weight", take(p + "input_layernorm.weight"))
        add(f"blk.{i}.attn_q.weight", expect(take(p + "self_attn.q_proj.weight"), (H * Dh, D), "q_proj"))
        add(f"blk.{i}.attn_k.weight", expect(take(p + "self_attn.k_proj.weight"), (Hkv * Dh, D), "k_proj"))
        add(f"blk.{i}.attn_v.weight", expect(take(p + "self_attn.v_proj.weight"), (Hkv * Dh, D), "v_proj"))
        add(f"blk.{i}.attn_output.weight", expect(take(p + "self_attn.o_proj.weight"), (D, H * Dh), "o_proj"))
        add(f"blk.{i}.attn_q_norm.weight", expect(take(p + "self_attn.q_norm.weight"), (Dh,), "q_norm"))
        add(f"blk.{i}.attn_k_norm.weight", expect(take(p + "self_attn.k_norm.weight"), (Dh,), "k_norm"))
        add(f"blk.{i}.ffn_norm.weight", take(p + "post_attention_layernorm.weight"))
        add(f"blk.{i}.ffn_gate_inp.weight", expect(take(p + "mlp.gate.weight"), (E, D), "router"), keep_f32=True)
        for hf, gg, shape in (("gate_proj", "ffn_gate_exps", (Fe, D)), ("up_proj", "ffn_up_exps", (Fe, D)),
                              ("down_proj", "ffn_down_exps", (D, Fe))):
            stacked = np.stack([expect(take(f"{p}mlp.experts.{e}.{hf}.weight"), shape, hf) for e in range(E)])
            add(f"blk.{i}.{gg}.weight", stacked)
    add("output_norm.weight", take("model.norm.weight"))
    if not tied:
        add("output.weight", expect(take("lm_head.weight"), (V, D), "lm_head"))
    left = sorted(set(t) - used)
    if left:
        raise SystemExit(f"{args.model_dir}: tensors not converted: {', '.join(left[:8])}"
                         + (" ..." if len(left) > 8 else ""))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{args.out}: qwen3moe, {args.dtype}, V={V} D={D} L={L} H={H}/{Hkv}x{Dh} E={E} K={K} Fe={Fe}, "
          f"{os.path.getsize(args.out) / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
