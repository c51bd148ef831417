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

// Writes every tensor of `layout` from `base` into `dir` (see
// write_safetensors_sharded), as F32 or BF16.
void save_params(const std::string& dir, const ParamLayout& layout, const float* base, DType dtype,
                 uint64_t max_shard_bytes = kDefaultMaxShardBytes);

// Fills base[0, layout.numel()) from a checkpoint directory (or one
// .safetensors file), converting F32/BF16/F16 to f32. Errors, each naming the
// file: a missing tensor; a tensor whose shape differs (expected and actual
// shapes); an unexpected extra tensor (it would mean the file and the config
// describe different models), except lm_head.weight when the embeddings are
// tied, rotary_emb.inv_freq buffers, and (for a layout of some experts only,
// expert parallelism) the other experts' tensors; plus every file-level check
// of SafetensorsFile. ctx (may be null) spreads tensors over threads.
void load_params(const std::string& path, const ParamLayout& layout, float* base,
                 const Context* ctx = nullptr);

// Saves config.json and the weights into `dir`. Everything is first written
// to a sibling temporary directory, files of an existing `dir` that this
// save does not produce (tokenizer files, ...) are linked in, and only then
// the new directory replaces the old one (an atomic exchange where the
// filesystem supports it). A failure at any point leaves an existing `dir`
// exactly as it was and removes the temporary directory.
// `layout` must be ParamLayout(config).
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
