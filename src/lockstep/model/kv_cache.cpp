// KvCache allocation.
#include "lockstep/model/kv_cache.h"

#include "lockstep/base/error.h"

namespace lockstep::model {

KvCache::KvCache(const ModelConfig& c, int64_t num_blocks, int block_size)
    : block_size_(block_size), num_blocks_(num_blocks) {
  LS_CHECK(num_blocks >= 1 && block_size >= 1) << "num_blocks=" << num_blocks << " block_size=" << block_size;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    k_.emplace_back(DType::F32, std::vector<int64_t>{num_blocks, block_size, c.num_kv_heads, c.head_dim});
    v_.emplace_back(DType::F32, std::vector<int64_t>{num_blocks, block_size, c.num_kv_heads, c.head_dim});
  }
}

size_t KvCache::nbytes() const {
  size_t n = 0;
  for (const auto& t : k_) n += t.view().nbytes();
  for (const auto& t : v_) n += t.view().nbytes();
  return n;
}

}  // namespace lockstep::model
