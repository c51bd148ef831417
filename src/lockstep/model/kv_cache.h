// KvCache: the paged key/value storage of every layer. Which physical block
// holds which positions of which sequence is decided by the caller (the
// rollout engine's block manager, or the trainer's trivial one) and passed in
// each batch's block table; this class only owns the memory. The scratch
// memory of forward() and backward() is a Workspace of its own (workspace.h).
#pragma once

#include <cstdint>
#include <vector>

#include "lockstep/model/config.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::model {

class KvCache {
 public:
  KvCache() = default;
  // dtype: F32 (aligned mode and the trainer) or BF16 (fast-mode rollout: the
  // attention kernel rounds new K/V to bf16 on write and widens them exactly
  // on read, so the cache is half the memory and half the bytes per decode).
  KvCache(const ModelConfig& config, int64_t num_blocks, int block_size, DType dtype = DType::F32);

  // (num_blocks, block_size, Hkv, Dh) views of layer `layer`, in dtype().
  Tensor k(int64_t layer) const { return k_[static_cast<size_t>(layer)].view(); }
  Tensor v(int64_t layer) const { return v_[static_cast<size_t>(layer)].view(); }
  DType dtype() const { return dtype_; }
  // Copies block `src` of every layer's K and V into block `dst` (copy on write).
  void copy_block(int64_t dst, int64_t src);
  int block_size() const { return block_size_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t num_layers() const { return static_cast<int64_t>(k_.size()); }
  size_t nbytes() const;  // the K/V memory

 private:
  std::vector<OwnedTensor> k_, v_;
  int block_size_ = 0;
  int64_t num_blocks_ = 0;
  DType dtype_ = DType::F32;
};

}  // namespace lockstep::model
