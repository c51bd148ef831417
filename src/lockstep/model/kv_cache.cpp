// KvCache allocation and copy on write.
#include "lockstep/model/kv_cache.h"

#include <vector>

#include "lockstep/base/error.h"

namespace lockstep::model {

KvCache::KvCache(const ModelConfig& c, int64_t num_blocks, int block_size, DType dtype,
                 const Allocator& memory, bool with_mtp)
    : block_size_(block_size),
      num_blocks_(num_blocks),
      num_layers_(c.num_layers),
      dtype_(dtype),
      memory_(&memory) {
  LS_CHECK(num_blocks >= 1 && block_size >= 1) << "num_blocks=" << num_blocks << " block_size=" << block_size;
  LS_CHECK(dtype == DType::F32 || dtype == DType::BF16)
      << "KV cache dtype must be f32 or bf16, got " << dtype_name(dtype);
  if (c.is_v4()) {
    LS_CHECK(dtype == DType::F32) << "DeepSeek-V4's cache is f32 (a bf16 cache is not implemented for it)";
    k_.resize(size_t(c.num_layers));
    v_.resize(size_t(c.num_layers));
    const int64_t layers = c.num_layers + (with_mtp ? c.num_nextn_predict_layers : 0);
    for (int64_t l = 0; l < layers; ++l) add_v4_layer(c, l);
    return;
  }
  for (int64_t l = 0; l < c.num_layers; ++l) {
    k_.emplace_back(dtype, std::vector<int64_t>{num_blocks, block_size, c.num_kv_heads, c.head_dim}, memory,
                    Fill::Undefined, "KV cache keys");
    v_.emplace_back(dtype, std::vector<int64_t>{num_blocks, block_size, c.num_kv_heads, c.head_dim}, memory,
                    Fill::Undefined, "KV cache values");
  }
}

KvCache KvCache::scoring_scratch(const ModelConfig& c, int64_t num_blocks, int block_size,
                                 const Allocator& memory) {
  if (c.is_v4() || c.num_layers <= 1) return KvCache(c, num_blocks, block_size, DType::F32, memory);
  ModelConfig one = c;
  one.num_layers = 1;
  KvCache kv(one, num_blocks, block_size, DType::F32, memory);
  kv.num_layers_ = c.num_layers;
  kv.shared_layers_ = true;
  return kv;
}

void KvCache::add_v4_layer(const ModelConfig& c, int64_t l) {
  const int64_t ratio = c.compress_ratio(l), kappa = ratio == 4 ? 2 : 1, Dh = c.head_dim, DI = c.index_head_dim;
  const int64_t NB = num_blocks_, BS = block_size_;
  V4Stores s;
  const Allocator& m = *memory_;
  s.kv = OwnedTensor(DType::F32, {NB, BS, 2, Dh}, m, Fill::Undefined, "KV cache");
  if (ratio > 0) s.cz = OwnedTensor(DType::F32, {NB, BS, 2 * kappa * Dh}, m, Fill::Undefined, "compressor inputs");
  if (ratio == 4) {
    s.index_cz = OwnedTensor(DType::F32, {NB, BS, 4 * DI}, m, Fill::Undefined, "indexer compressor inputs");
    s.index_keys = OwnedTensor(DType::F32, {NB, BS, DI}, m, Fill::Undefined, "indexer keys");
  }
  v4_.push_back(std::move(s));
}

Tensor KvCache::flat(const OwnedTensor& t) {
  const Tensor& v = t.view();
  if (v.data == nullptr) return Tensor();
  int64_t rows = 1;
  for (int i = 0; i + 1 < v.ndim; ++i) rows *= v.shape[i];
  return Tensor(v.data, v.dtype, {rows, v.shape[v.ndim - 1]});
}

std::vector<const OwnedTensor*> KvCache::arrays() const {
  std::vector<const OwnedTensor*> all;
  for (const auto* side : {&k_, &v_})
    for (const OwnedTensor& t : *side) all.push_back(&t);
  for (const V4Stores& s : v4_)
    for (const OwnedTensor* t : {&s.kv, &s.cz, &s.index_cz, &s.index_keys}) all.push_back(t);
  std::erase_if(all, [](const OwnedTensor* t) { return t->view().data == nullptr; });
  return all;
}

void KvCache::copy_block(int64_t dst, int64_t src) {
  LS_CHECK(dst >= 0 && dst < num_blocks_ && src >= 0 && src < num_blocks_)
      << "copy_block " << src << " -> " << dst << " outside [0, " << num_blocks_ << ")";
  for (const OwnedTensor* t : arrays()) {
    const Tensor x = t->view();
    const size_t block_bytes = size_t(x.stride[0]) * dtype_size(x.dtype);
    char* base = static_cast<char*>(x.data);
    memory_->copy(base + size_t(dst) * block_bytes, base + size_t(src) * block_bytes, block_bytes);
  }
}

size_t KvCache::nbytes() const {
  size_t n = 0;
  for (const OwnedTensor* t : arrays()) n += t->view().nbytes();
  return n;
}

}  // namespace lockstep::model
