// BlockManager implementation.
#include "lockstep/rollout/block_manager.h"

#include "lockstep/base/error.h"
#include "lockstep/base/rng.h"

namespace lockstep::rollout {

BlockManager::BlockManager(int64_t num_blocks, int block_size)
    : block_size_(block_size),
      ref_(size_t(num_blocks), 0),
      lru_pos_(size_t(num_blocks)),
      in_lru_(size_t(num_blocks), false),
      entry_(size_t(num_blocks)) {
  LS_CHECK(num_blocks >= 1 && block_size >= 1) << "num_blocks=" << num_blocks << " block_size=" << block_size;
  // Hand out low block ids first.
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(int32_t(b));
}

std::optional<int32_t> BlockManager::allocate() {
  int32_t b;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else if (!lru_.empty()) {
    b = lru_.front();
    lru_.pop_front();
    in_lru_[size_t(b)] = false;
    by_hash_.erase(entry_[size_t(b)]->key);
    entry_[size_t(b)].reset();
  } else {
    return std::nullopt;
  }
  ref_[size_t(b)] = 1;
  return b;
}

void BlockManager::retain(int32_t b) {
  LS_CHECK(b >= 0 && b < num_blocks()) << "block " << b;
  if (ref_[size_t(b)] == 0 && in_lru_[size_t(b)]) {
    lru_.erase(lru_pos_[size_t(b)]);
    in_lru_[size_t(b)] = false;
  }
  ++ref_[size_t(b)];
}

void BlockManager::release(int32_t b) {
  LS_CHECK(b >= 0 && b < num_blocks() && ref_[size_t(b)] > 0) << "release of unreferenced block " << b;
  if (--ref_[size_t(b)] > 0) return;
  if (entry_[size_t(b)]) {
    lru_.push_back(b);
    lru_pos_[size_t(b)] = std::prev(lru_.end());
    in_lru_[size_t(b)] = true;
  } else {
    free_.push_back(b);
  }
}

uint64_t BlockManager::chain_hash(uint64_t parent, const int32_t* tokens, int n) {
  uint64_t h = mix_seed(parent, 0x6b76626c6f636bull);  // "kvblock"
  for (int i = 0; i < n; ++i) h = mix_seed(h, uint64_t(uint32_t(tokens[i])));
  return h;
}

std::optional<int32_t> BlockManager::lookup(uint64_t key, uint64_t parent, const int32_t* tokens) {
  auto it = by_hash_.find(key);
  if (it == by_hash_.end()) return std::nullopt;
  const Entry& e = *entry_[size_t(it->second)];
  if (e.parent != parent) return std::nullopt;
  for (int i = 0; i < block_size_; ++i)
    if (e.tokens[size_t(i)] != tokens[i]) return std::nullopt;
  retain(it->second);
  return it->second;
}

void BlockManager::insert(int32_t b, uint64_t key, uint64_t parent, const int32_t* tokens) {
  if (by_hash_.count(key) || entry_[size_t(b)]) return;
  entry_[size_t(b)] = Entry{key, parent, std::vector<int32_t>(tokens, tokens + block_size_)};
  by_hash_[key] = b;
}

void BlockManager::flush() {
  for (auto& [key, b] : by_hash_) {
    entry_[size_t(b)].reset();
    if (in_lru_[size_t(b)]) {
      lru_.erase(lru_pos_[size_t(b)]);
      in_lru_[size_t(b)] = false;
      free_.push_back(b);
    }
  }
  by_hash_.clear();
}

}  // namespace lockstep::rollout
