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
  // The blocks come from `memory` (kernels::device_memory of the engine's
  // context); their contents are undefined until written.
  // with_mtp: DeepSeek-V4's MTP blocks get their cache layers (the trainer's
  // forward runs them; the rollout engine never does and leaves them out).
  KvCache(const ModelConfig& config, int64_t num_blocks, int block_size, DType dtype = DType::F32,
          const Allocator& memory = host_allocator(), bool with_mtp = true);

  // Scratch for a forward in which every token is new (n_ctx == 0) and
  // nothing reads a layer's keys and values after that layer has run (scoring,
  // no backward; or training with recompute, whose backward writes each
  // layer's keys again before reading them): dense and MoE models get one f32 K/V array that every layer
  // writes and reads in turn (a forward writes a layer's new keys before its
  // attention reads any), 1/L of a full cache; DeepSeek-V4 the full cache.
  static KvCache scoring_scratch(const ModelConfig& config, int64_t num_blocks, int block_size,
                                 const Allocator& memory = host_allocator());

  // (num_blocks, block_size, Hkv, Dh) views of layer `layer`, in dtype().
  // Empty for DeepSeek-V4, whose layers use the stores below.
  Tensor k(int64_t layer) const { return k_[shared_layers_ ? 0 : static_cast<size_t>(layer)].view(); }
  Tensor v(int64_t layer) const { return v_[shared_layers_ ? 0 : static_cast<size_t>(layer)].view(); }
  // Whether every layer shares one K/V array (scoring_scratch).
  bool shared_layers() const { return shared_layers_; }

  // DeepSeek-V4 (docs/deepseek-v4.md, "Cache"). Every store has rows per token
  // slot, slot = block * block_size + offset, so the block table that places a
  // sequence's positions places all of them, and copy_block copies all:
  //   kv_store     (slots * 2, Dh) f32: row 2*slot is the token's window key
  //                (= value); row 2*slot + 1 the compressed entry whose block
  //                ends at this position (ratio > 0)
  //   cz_store     (slots, 2*kappa*Dh): the token's compressor inputs [C | Z]
  //   index_cz     (slots, 4*DI): the indexer compressor's inputs (ratio 4)
  //   index_keys   (slots, DI): the indexer key of the entry ending here (ratio 4)
  // An entry depends only on positions up to its slot's, so blocks shared by
  // a common prefix hold the same entries for every sequence sharing them.
  // Empty views where the layer has no such store.
  Tensor kv_store(int64_t layer) const { return flat(v4_[static_cast<size_t>(layer)].kv); }
  Tensor cz_store(int64_t layer) const { return flat(v4_[static_cast<size_t>(layer)].cz); }
  Tensor index_cz(int64_t layer) const { return flat(v4_[static_cast<size_t>(layer)].index_cz); }
  Tensor index_keys(int64_t layer) const { return flat(v4_[static_cast<size_t>(layer)].index_keys); }
  DType dtype() const { return dtype_; }
  // Copies block `src` of every layer's K and V into block `dst` (copy on write).
  void copy_block(int64_t dst, int64_t src);
  int block_size() const { return block_size_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t num_layers() const { return num_layers_; }
  size_t nbytes() const;  // the K/V memory

 private:
  struct V4Stores {
    OwnedTensor kv, cz, index_cz, index_keys;  // (num_blocks, block_size, ...) each
  };
  // (num_blocks, block_size, ...) as (slots * rows per slot, width).
  static Tensor flat(const OwnedTensor& t);
  void add_v4_layer(const ModelConfig& c, int64_t layer);
  std::vector<const OwnedTensor*> arrays() const;  // every allocated array

  std::vector<OwnedTensor> k_, v_;
  std::vector<V4Stores> v4_;
  int block_size_ = 0;
  int64_t num_blocks_ = 0;
  int64_t num_layers_ = 0;
  bool shared_layers_ = false;  // k_ and v_ hold one array for every layer
  DType dtype_ = DType::F32;
  const Allocator* memory_ = &host_allocator();
};

}  // namespace lockstep::model
