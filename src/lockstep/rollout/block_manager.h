// KV block bookkeeping: reference counts (the n samples of a prompt share
// its blocks; a partly filled shared block is copied on write) and a prefix
// cache of full blocks keyed by a hash of all tokens up to the block's end,
// with LRU eviction of unreferenced cached blocks.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>
#include <vector>

namespace lockstep::rollout {

class BlockManager {
 public:
  BlockManager(int64_t num_blocks, int block_size);

  int block_size() const { return block_size_; }
  int64_t num_blocks() const { return int64_t(ref_.size()); }
  // Blocks obtainable now: free plus cached-but-unreferenced (evictable).
  int64_t available() const { return int64_t(free_.size() + lru_.size()); }
  int64_t cached_blocks() const { return int64_t(by_hash_.size()); }

  // A block with refcount 1, evicting the least recently used cached block
  // when no free one is left; nullopt when every block is referenced.
  std::optional<int32_t> allocate();
  void retain(int32_t block);
  void release(int32_t block);
  int refcount(int32_t block) const { return ref_[size_t(block)]; }

  // Prefix cache. The key of a full block is chain_hash(parent key, its tokens).
  static uint64_t chain_hash(uint64_t parent, const int32_t* tokens, int n);
  // The cached block with this key and tokens (retained), if any.
  std::optional<int32_t> lookup(uint64_t key, uint64_t parent, const int32_t* tokens);
  // Publishes a full block (refcount > 0) under `key`; no-op if the key exists.
  void insert(int32_t block, uint64_t key, uint64_t parent, const int32_t* tokens);
  // Forgets every cached entry (after a weight update).
  void flush();

 private:
  struct Entry {
    uint64_t key = 0, parent = 0;
    std::vector<int32_t> tokens;
  };
  int block_size_;
  std::vector<int> ref_;
  std::vector<int32_t> free_;
  std::list<int32_t> lru_;  // cached blocks with refcount 0, least recent first
  std::vector<std::list<int32_t>::iterator> lru_pos_;
  std::vector<bool> in_lru_;
  std::vector<std::optional<Entry>> entry_;  // per block
  std::unordered_map<uint64_t, int32_t> by_hash_;
};

}  // namespace lockstep::rollout
