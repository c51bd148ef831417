// KvCache allocation and copy on write.
#include "lockstep/model/kv_cache.h"

#include <cstring>

#include "lockstep/base/error.h"

namespace lockstep::model {

KvCache::KvCache(const ModelConfig& c, int64_t num_blocks, int block_size, DType dtype)
    : block_size_(block_size), num_blocks_(num_blocks), dtype_(dtype) {
  LS_CHECK(num_blocks >= 1 && block_size >= 1) << "num_blocks=" << num_blocks << " block_size=" << block_size;
  LS_CHECK(dtype == DType::F32 || dtype == DType::BF16)
      << "KV cache dtype must be f32 or bf16, got " << dtype_name(dtype);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    k_.emplace_back(dtype, std::vector<int64_t>{num_blocks, block_size, c.num_kv_heads, c.head_dim});
    v_.emplace_back(dtype, std::vector<int64_t>{num_blocks, block_size, c.num_kv_heads, c.head_dim});
  }
}

void KvCache::copy_block(int64_t dst, int64_t src) {
  LS_CHECK(dst >= 0 && dst < num_blocks_ && src >= 0 && src < num_blocks_)
      << "copy_block " << src << " -> " << dst << " outside [0, " << num_blocks_ << ")";
  for (const std::vector<OwnedTensor>* side : {&k_, &v_})
    for (const OwnedTensor& t : *side) {
      const Tensor x = t.view();
      const size_t block_bytes = size_t(x.stride[0]) * dtype_size(x.dtype);
      char* base = static_cast<char*>(x.data);
      std::memcpy(base + size_t(dst) * block_bytes, base + size_t(src) * block_bytes, block_bytes);
    }
}

size_t KvCache::nbytes() const {
  size_t n = 0;
  for (const auto& t : k_) n += t.view().nbytes();
  for (const auto& t : v_) n += t.view().nbytes();
  return n;
}

}  // namespace lockstep::model
