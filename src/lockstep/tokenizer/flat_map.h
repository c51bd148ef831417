// A flat open-addressing hash map from strings to small values, for the BPE
// hot path: keys live in one arena and slots in one array, so a lookup costs
// about one cache miss (std::unordered_map chases a node pointer per probe).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace lockstep::tokenizer {

inline uint64_t hash_bytes(std::string_view s) {
  // FNV-1a over 8-byte words, then a splitmix64 finalizer so that linear
  // probing sees well-spread bits even for short, similar keys.
  uint64_t h = 0xcbf29ce484222325ull ^ s.size();
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0x100000001b3ull;
  }
  if (i < s.size()) {
    uint64_t w = 0;
    std::memcpy(&w, s.data() + i, s.size() - i);
    h = (h ^ w) * 0x100000001b3ull;
  }
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h;
}

template <typename V>
class FlatStringMap {
 public:
  explicit FlatStringMap(size_t expected = 16) { rehash(capacity_for(expected)); }

  size_t size() const { return size_; }

  const V* find(std::string_view key) const { return find_hashed(key, hash_bytes(key)); }
  const V* find_hashed(std::string_view key, uint64_t h) const {
    size_t mask = slots_.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (s.len == kEmpty) return nullptr;
      if (s.hash == h && s.len == key.size() && std::memcmp(arena_.data() + s.off, key.data(), key.size()) == 0)
        return &s.value;
    }
  }

  // Inserts or overwrites.
  void set(std::string_view key, const V& value) { set_hashed(key, hash_bytes(key), value); }
  void set_hashed(std::string_view key, uint64_t h, const V& value) {
    if ((size_ + 1) * 4 > slots_.size() * 3) rehash(slots_.size() * 2);  // keep the load below 3/4
    size_t mask = slots_.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
      Slot& s = slots_[i];
      if (s.len == kEmpty) {
        s.hash = h;
        s.off = static_cast<uint32_t>(arena_.size());
        s.len = static_cast<uint32_t>(key.size());
        s.value = value;
        arena_.append(key);
        ++size_;
        return;
      }
      if (s.hash == h && s.len == key.size() && std::memcmp(arena_.data() + s.off, key.data(), key.size()) == 0) {
        s.value = value;
        return;
      }
    }
  }

 private:
  static constexpr uint32_t kEmpty = UINT32_MAX;
  struct Slot {
    uint64_t hash = 0;
    uint32_t off = 0;
    uint32_t len = kEmpty;
    V value{};
  };
  static size_t capacity_for(size_t n) {
    size_t c = 16;
    while (c * 3 < n * 4 + 4) c *= 2;
    return c;
  }
  void rehash(size_t capacity) {
    std::vector<Slot> old;
    old.swap(slots_);
    slots_.assign(capacity, Slot{});
    size_t mask = capacity - 1;
    for (const Slot& s : old) {
      if (s.len == kEmpty) continue;
      size_t i = s.hash & mask;
      while (slots_[i].len != kEmpty) i = (i + 1) & mask;
      slots_[i] = s;
    }
  }

  std::vector<Slot> slots_;
  std::string arena_;
  size_t size_ = 0;
};

}  // namespace lockstep::tokenizer
