// The BPE model of tokenizer.json ("model" with type "BPE"): vocabulary, merge
// ranks, and the encoding of one pre-tokenized piece into token ids.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "lockstep/tokenizer/flat_map.h"
#include "lockstep/tokenizer/json_fields.h"

namespace lockstep::tokenizer {

// Hash for heterogeneous lookup of std::string keys by std::string_view. Not
// declared noexcept on purpose: libstdc++ then stores each key's hash in its
// node, so a lookup does not rehash every key in the bucket it walks.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using Vocab = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  // Reads a "model" object of type BPE. `where` names it in errors.
  static BpeModel from_json(const Json& model, const std::string& where);
  // Builds a model directly (tests). Merges are (left, right) token pairs in rank order.
  static BpeModel from_parts(Vocab vocab, const std::vector<std::pair<std::string, std::string>>& merges,
                             bool ignore_merges = false, bool byte_fallback = false,
                             std::optional<std::string> unk_token = std::nullopt, bool fuse_unk = false);

  BpeModel(BpeModel&&) noexcept;
  BpeModel& operator=(BpeModel&&) noexcept;
  ~BpeModel();

  // Appends the ids of one piece (as produced by the pre-tokenizer) to `out`.
  // Results are cached per piece; safe to call from several threads.
  void encode(std::string_view piece, std::vector<int32_t>& out) const;
  // The same for a piece given as raw bytes that encode() would receive in the
  // byte-level alphabet (the mapping is implied). Requires supports_raw_bytes().
  void encode_raw(std::string_view bytes, std::vector<int32_t>& out) const;
  // True for byte-level vocabularies without affixes where all 256 byte tokens exist.
  bool supports_raw_bytes() const { return raw_ok_; }
  // The same without the cache and with the simple quadratic merge loop: the
  // slow reference the tests compare against.
  void encode_reference(std::string_view piece, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(int32_t id) const;  // nullptr for unknown ids
  // Number of vocabulary entries (what HF calls the model's vocab size; it
  // decides the ids of added tokens that are not in the vocabulary).
  size_t vocab_entries() const { return vocab_.size(); }
  int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }
  const Vocab& vocab() const { return vocab_; }

 private:
  BpeModel() = default;
  void finish_init(const std::vector<std::pair<std::string, std::string>>& merges, const std::string& where);
  // Initial symbols of a piece (one per character, with byte fallback / unk).
  void initial_symbols(std::string_view piece, std::vector<int32_t>& ids) const;
  void merge(std::vector<int32_t>& ids) const;
  struct MergeInfo {
    int32_t rank;
    int32_t new_id;
  };
  const MergeInfo* find_merge(int32_t a, int32_t b) const;
  // (left id, right id) -> merge, open addressing (the hottest lookup of encoding).
  class PairMap {
   public:
    explicit PairMap(size_t expected = 0);
    void set(uint64_t key, MergeInfo v);
    const MergeInfo* find(uint64_t key) const;
    size_t size() const { return size_; }

   private:
    static constexpr uint64_t kEmptyKey = ~0ull;  // ids are non-negative, so never a real key
    static uint64_t mix(uint64_t k) {
      k ^= k >> 33;
      k *= 0xff51afd7ed558ccdull;
      k ^= k >> 33;
      return k;
    }
    struct Slot {
      uint64_t key = kEmptyKey;
      MergeInfo value{};
    };
    std::vector<Slot> slots_;
    size_t size_ = 0;
  };

  Vocab vocab_;
  FlatStringMap<int32_t> lookup_;                // the same map, for the hot path
  std::vector<const std::string*> id_to_token_;  // (max id + 1), nullptr for holes
  PairMap merges_;
  std::vector<int32_t> char_ids_;  // code point < 0x10000 -> id of the single-character token, -1 if none
  std::optional<std::string> unk_token_;
  std::string continuing_subword_prefix_, end_of_word_suffix_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::vector<int32_t> byte_fallback_ids_;  // 256 entries, -1 when <0xXX> is missing
  // Raw-byte twins of lookup_ and the cache (see encode_raw).
  bool raw_ok_ = false;
  FlatStringMap<int32_t> raw_lookup_;  // byte-decoded token -> id
  std::array<int32_t, 256> byte_ids_{};  // id of the token of each single byte
  struct Cache;
  std::unique_ptr<Cache> cache_;
  std::unique_ptr<Cache> raw_cache_;
};

}  // namespace lockstep::tokenizer
