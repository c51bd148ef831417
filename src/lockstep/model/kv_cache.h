// KvCache: the paged key/value storage of every layer. Which physical block
// holds which positions of which sequence is decided by the caller (the
// rollout engine's block manager, or the trainer's trivial one) and passed in
// each batch's block table; this class only owns the memory.
#pragma once

#include <cstdint>
#include <vector>

#include "lockstep/model/config.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::model {

class KvCache {
 public:
  KvCache() = default;
  KvCache(const ModelConfig& config, int64_t num_blocks, int block_size);

  // (num_blocks, block_size, Hkv, Dh) f32 views of layer `layer`.
  Tensor k(int64_t layer) const { return k_[static_cast<size_t>(layer)].view(); }
  Tensor v(int64_t layer) const { return v_[static_cast<size_t>(layer)].view(); }
  int block_size() const { return block_size_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t num_layers() const { return static_cast<int64_t>(k_.size()); }
  size_t nbytes() const;

 private:
  std::vector<OwnedTensor> k_, v_;
  int block_size_ = 0;
  int64_t num_blocks_ = 0;
};

}  // namespace lockstep::model
