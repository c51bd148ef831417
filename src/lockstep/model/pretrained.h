// Hugging Face checkpoint directories: flat parameter buffers to and from
// safetensors by name, and save_pretrained / load_pretrained (config.json +
// safetensors). Tokenizer files are written by other code.
#pragma once

#include <cstdint>
#include <string>

#include "lockstep/base/thread_pool.h"
#include "lockstep/model/config.h"
#include "lockstep/model/params.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep {

// Hugging Face's default shard limit ("5GB").
constexpr uint64_t kDefaultMaxShardBytes = 5'000'000'000ull;

// How save_params stores the float tensors of a layout. Whatever the format,
// Index tensors (DeepSeek-V4's tid2eid, int32 bit patterns in the buffer) are
// written as I64 and keep_f32 tensors as F32; a layout without either (every
// architecture but DeepSeek-V4) is written entirely in the format's dtype.
enum class SaveFormat {
  F32,
  BF16,  // round to nearest even
  // DeepSeek-V4: the official checkpoint's storage: every tensor the
  // release stores as FP8 (fp8_checkpoint_tensor) as F8_E4M3 "X.weight" plus
  // an F8_E8M0 "X.scale" with one power-of-two scale per 128 x 128 block;
  // routed experts as MXFP4 (I8 "X.weight" (out, in/2) + F8_E8M0 "X.scale"
  // (out, in/32)) when config.expert_dtype is "fp4", else as FP8 blocks; the
  // other tensors as in BF16 (hf_quant.h gives the exact rules).
  // Every other architecture: DeepSeek-V3's layout, which vLLM and SGLang
  // read: every projection that lockstep packs in fp8 (the attention, MLP,
  // expert and shared-expert *_proj weights) as F8_E4M3 "X.weight" plus F32
  // "X.weight_scale_inv" (ceil(out/128), ceil(in/128)), the very bytes and
  // scales of ModelWeights' fp8 packing at block 128; an untied lm_head as
  // F32 holding its fp8 values (serving engines keep it unquantized; lockstep
  // packs it in fp8, and packing these values again gives the same bits); all
  // other tensors F32. Loading it and packing at fp8 reproduces every packed
  // byte, so the logprobs are bitwise those of the source at fp8.
  FP8,
};
const char* save_format_name(SaveFormat f);  // "f32" | "bf16" | "fp8"

// Whether DeepSeek-V4's official checkpoint stores `name` (a layout tensor
// name) as FP8 blocks: attn.{wq_a,wq_b,wkv,wo_a,wo_b}, attn.indexer.wq_b and
// ffn.shared_experts.{w1,w2,w3} weights of every layer and MTP block, and the
// MTP blocks' e_proj and h_proj. Routed experts are not included (see SaveFormat).
bool fp8_checkpoint_tensor(const std::string& name);

// Writes every tensor of `layout` from `base` into `dir` (see
// write_safetensors_sharded). dtype F32 or BF16 is SaveFormat F32 or BF16.
// FP8 of a tensor that cannot be quantized (non-finite values; MXFP4 needs
// in % 32 == 0) is an Error naming it. Quantized bytes are held in memory until written (about one
// byte per parameter); ctx (may be null) spreads the quantization over threads.
void save_params(const std::string& dir, const ParamLayout& layout, const float* base, SaveFormat format,
                 uint64_t max_shard_bytes = kDefaultMaxShardBytes, const Context* ctx = nullptr);
void save_params(const std::string& dir, const ParamLayout& layout, const float* base, DType dtype,
                 uint64_t max_shard_bytes = kDefaultMaxShardBytes);

// Fills base[0, layout.numel()) from a checkpoint directory (or one
// .safetensors file). A float tensor may be stored as
//   - F32, BF16 or F16;
//   - a 2-D "X.weight" as F8_E4M3 with a scale tensor "X.scale" or
//     "X.weight_scale_inv" (F8_E8M0, or F32 / BF16) of shape (ceil(out/128),
//     ceil(in/128)), dequantized per 128 x 128 block (fp8_block_dequantize;
//     exact for power-of-two scales);
//   - a routed expert's weight (out, in) as MXFP4: I8 "X.weight" (out, in/2)
//     with "X.scale" (out, in/32) (mxfp4_dequantize).
// An Index tensor must be I64 or I32 of the layout's shape (V, K), each value
// in [0, E) and each row's K values distinct; it is stored as int32 bit
// patterns, never through a float. Errors, each naming the file: a missing
// tensor; a tensor whose shape differs (expected and actual shapes); a
// missing scale, a scale of the wrong shape or dtype, a packed shape that does
// not match the layout's; an Index tensor of another dtype, or a bad value
// (naming the row); an unexpected extra tensor (it would mean the file and the
// config describe different models), except lm_head.weight when the
// embeddings are tied, rotary_emb.inv_freq buffers, the scales of quantized
// weights, and (for a layout of some experts only, expert parallelism) the
// other experts' tensors; plus every file-level check of SafetensorsFile.
// ctx (may be null) spreads tensors over threads.
void load_params(const std::string& path, const ParamLayout& layout, float* base,
                 const Context* ctx = nullptr);

// Saves config.json and the weights into `dir`. Everything is first written
// to a sibling temporary directory, files of an existing `dir` that this
// save does not produce (tokenizer files, ...) are linked in, and only then
// the new directory replaces the old one (an atomic exchange where the
// filesystem supports it). A failure at any point leaves an existing `dir`
// exactly as it was and removes the temporary directory.
// `layout` must be ParamLayout(config). config.json's torch_dtype is the
// float dtype (bfloat16 for FP8); an FP8 save adds the official
// "quantization_config" {"quant_method": "fp8", "fmt": "e4m3",
// "weight_block_size": [128, 128], "activation_scheme": "dynamic"}, with
// "scale_fmt": "ue8m0" for DeepSeek-V4; other saves write none. torch_dtype
// is float32 for an FP8 save of another architecture (its plain tensors are F32).
void save_pretrained(const std::string& dir, const ModelConfig& config, const ParamLayout& layout,
                     const float* base, SaveFormat format, uint64_t max_shard_bytes = kDefaultMaxShardBytes);
void save_pretrained(const std::string& dir, const ModelConfig& config, const ParamLayout& layout,
                     const float* base, DType dtype = DType::F32,
                     uint64_t max_shard_bytes = kDefaultMaxShardBytes);

struct PretrainedModel {
  ModelConfig config;
  ParamLayout layout;
  Buffer params;  // layout.nbytes(), f32
};

// Reads dir/config.json and the safetensors of `dir`.
PretrainedModel load_pretrained(const std::string& dir, const Context* ctx = nullptr);

}  // namespace lockstep
