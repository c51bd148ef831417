// BPE encoding of one piece: characters -> initial tokens (with byte fallback
// and unk handling as in Hugging Face `tokenizers`), then merges applied lowest
// rank first (leftmost first on ties) with a heap over a linked list of symbols.
#include "lockstep/tokenizer/bpe.h"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <shared_mutex>

#include "lockstep/base/excerpt.h"
#include "lockstep/tokenizer/byte_level.h"
#include "lockstep/tokenizer/scratch.h"
#include "lockstep/tokenizer/unicode.h"

namespace lockstep::tokenizer {

namespace {
// Words longer than this are not cached (they are rare and would bloat the cache).
constexpr size_t kMaxCachedPieceBytes = 256;
// Cache size bound: past it, new pieces are encoded but not remembered.
constexpr size_t kCacheCapacity = 1 << 17;

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}
}  // namespace

// Piece -> ids, filled as pieces are met. Readers share the lock; a writer
// takes it alone (the arena and the id pool may move when they grow).
struct BpeModel::Cache {
  struct Entry {
    uint32_t off, len;  // into `ids`
  };
  std::shared_mutex mu;
  FlatStringMap<Entry> map{1024};
  std::vector<int32_t> ids;
};

BpeModel::BpeModel(BpeModel&&) noexcept = default;
BpeModel& BpeModel::operator=(BpeModel&&) noexcept = default;
BpeModel::~BpeModel() = default;

BpeModel BpeModel::from_json(const Json& j, const std::string& where) {
  if (!j.is_object()) LS_THROW << where << ": expected an object";
  if (auto type = optional_string(j, "type", where); type && *type != "BPE") {
    LS_THROW << field_path(where, "type") << ": model type '" << *type
             << "' is not supported (lockstep supports BPE tokenizers only)";
  }
  if (const Json* d = optional_field(j, "dropout")) {
    if (!d->is_number()) LS_THROW << field_path(where, "dropout") << ": expected a number or null";
    if (d->get<double>() != 0.0)
      LS_THROW << field_path(where, "dropout") << ": BPE dropout is not supported (encoding must be deterministic)";
  }
  BpeModel m;
  m.unk_token_ = optional_string(j, "unk_token", where);
  m.continuing_subword_prefix_ = optional_string(j, "continuing_subword_prefix", where).value_or("");
  m.end_of_word_suffix_ = optional_string(j, "end_of_word_suffix", where).value_or("");
  m.fuse_unk_ = get_bool(j, "fuse_unk", where, false);
  m.byte_fallback_ = get_bool(j, "byte_fallback", where, false);
  m.ignore_merges_ = get_bool(j, "ignore_merges", where, false);

  const Json& vocab = require_field(j, "vocab", where);
  if (!vocab.is_object()) LS_THROW << field_path(where, "vocab") << ": expected an object {token: id}";
  m.vocab_.reserve(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 || it.value().get<int64_t>() > INT32_MAX) {
      LS_THROW << field_path(where, "vocab") << ": id of token '" << it.key() << "' is not a non-negative integer";
    }
    m.vocab_[it.key()] = static_cast<int32_t>(it.value().get<int64_t>());
  }

  std::vector<std::pair<std::string, std::string>> merges;
  const Json& mj = require_array(j, "merges", where);
  merges.reserve(mj.size());
  std::string mwhere = field_path(where, "merges");
  for (size_t i = 0; i < mj.size(); ++i) {
    const Json& e = mj[i];
    if (e.is_string()) {
      // Legacy form "a b": tokens never contain a space in this form.
      const std::string& s = e.get_ref<const std::string&>();
      size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        LS_THROW << index_path(mwhere, i) << ": expected \"left right\", got \"" << s << "\"";
      merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
    } else {
      LS_THROW << index_path(mwhere, i) << ": expected \"left right\" or [\"left\", \"right\"]";
    }
  }
  m.finish_init(merges, where);
  return m;
}

BpeModel BpeModel::from_parts(Vocab vocab, const std::vector<std::pair<std::string, std::string>>& merges,
                              bool ignore_merges, bool byte_fallback, std::optional<std::string> unk_token,
                              bool fuse_unk) {
  BpeModel m;
  m.vocab_ = std::move(vocab);
  m.ignore_merges_ = ignore_merges;
  m.byte_fallback_ = byte_fallback;
  m.unk_token_ = std::move(unk_token);
  m.fuse_unk_ = fuse_unk;
  m.finish_init(merges, "bpe");
  return m;
}

void BpeModel::finish_init(const std::vector<std::pair<std::string, std::string>>& merges, const std::string& where) {
  int32_t max_id = -1;
  for (const auto& [tok, id] : vocab_) max_id = std::max(max_id, id);
  id_to_token_.assign(static_cast<size_t>(max_id + 1), nullptr);
  lookup_ = FlatStringMap<int32_t>(vocab_.size());
  for (const auto& [tok, id] : vocab_) lookup_.set(tok, id);
  for (const auto& [tok, id] : vocab_) id_to_token_[static_cast<size_t>(id)] = &tok;

  merges_ = PairMap(merges.size());
  std::string mwhere = field_path(where, "merges");
  size_t prefix_len = continuing_subword_prefix_.size();
  for (size_t i = 0; i < merges.size(); ++i) {
    const auto& [a, b] = merges[i];
    const int32_t* ia = lookup_.find(a);
    const int32_t* ib = lookup_.find(b);
    if (ia == nullptr)
      LS_THROW << index_path(mwhere, i) << ": token '" << excerpt(a) << "' is not in the vocabulary";
    if (ib == nullptr)
      LS_THROW << index_path(mwhere, i) << ": token '" << excerpt(b) << "' is not in the vocabulary";
    // The merged token drops the right part's continuing-subword prefix ("a" + "##b" -> "ab").
    std::string merged = a + (b.size() >= prefix_len && b.compare(0, prefix_len, continuing_subword_prefix_) == 0
                                  ? b.substr(prefix_len)
                                  : b);
    const int32_t* im = lookup_.find(merged);
    if (im == nullptr)
      LS_THROW << index_path(mwhere, i) << ": merged token '" << excerpt(merged)
               << "' is not in the vocabulary";
    // A repeated merge keeps its last rank, as HF's map construction does.
    merges_.set(pair_key(*ia, *ib), MergeInfo{static_cast<int32_t>(i), *im});
  }

  char_ids_.assign(0x10000, -1);
  if (continuing_subword_prefix_.empty() && end_of_word_suffix_.empty()) {
    for (const auto& [tok, id] : vocab_) {
      if (tok.empty() || tok.size() > 3) continue;
      Utf8Step st = utf8_next(tok, 0);
      if (st.valid && st.len == tok.size() && st.cp < 0x10000) char_ids_[st.cp] = id;
    }
  }
  byte_fallback_ids_.assign(256, -1);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    if (auto it = vocab_.find(std::string_view(name)); it != vocab_.end()) byte_fallback_ids_[static_cast<size_t>(b)] = it->second;
  }
  cache_ = std::make_unique<Cache>();
  raw_cache_ = std::make_unique<Cache>();

  // Raw-byte path: every byte must have its token, and no affixes may apply.
  raw_ok_ = continuing_subword_prefix_.empty() && end_of_word_suffix_.empty();
  for (int b = 0; b < 256 && raw_ok_; ++b) {
    const int32_t* id = lookup_.find(byte_level_alphabet()[static_cast<size_t>(b)]);
    if (id == nullptr) raw_ok_ = false;
    else byte_ids_[static_cast<size_t>(b)] = *id;
  }
  if (raw_ok_) {
    raw_lookup_ = FlatStringMap<int32_t>(vocab_.size());
    std::string raw;
    for (const auto& [tok, id] : vocab_) {
      raw.clear();
      if (byte_level_decode(tok, raw)) raw_lookup_.set(raw, id);
    }
  }
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  const int32_t* id = lookup_.find(token);
  if (id == nullptr) return std::nullopt;
  return *id;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size()) return nullptr;
  return id_to_token_[static_cast<size_t>(id)];
}

const BpeModel::MergeInfo* BpeModel::find_merge(int32_t a, int32_t b) const { return merges_.find(pair_key(a, b)); }

BpeModel::PairMap::PairMap(size_t expected) {
  size_t c = 16;
  while (c < expected * 2) c *= 2;  // load at most 1/2: probes stay short
  slots_.assign(c, Slot{});
}

void BpeModel::PairMap::set(uint64_t key, MergeInfo v) {
  size_t mask = slots_.size() - 1;
  for (size_t i = mix(key) & mask;; i = (i + 1) & mask) {
    if (slots_[i].key == kEmptyKey || slots_[i].key == key) {
      size_ += slots_[i].key == kEmptyKey;
      slots_[i] = Slot{key, v};
      return;
    }
  }
}

const BpeModel::MergeInfo* BpeModel::PairMap::find(uint64_t key) const {
  size_t mask = slots_.size() - 1;
  for (size_t i = mix(key) & mask;; i = (i + 1) & mask) {
    if (slots_[i].key == key) return &slots_[i].value;
    if (slots_[i].key == kEmptyKey) return nullptr;
  }
}

void BpeModel::initial_symbols(std::string_view piece, std::vector<int32_t>& ids) const {
  bool affixes = !continuing_subword_prefix_.empty() || !end_of_word_suffix_.empty();
  int32_t pending_unk = -1;  // an unknown-character token not yet emitted (-1: none)
  std::string key;
  for (size_t i = 0; i < piece.size();) {
    Utf8Step st = utf8_next(piece, i);
    std::string_view ch = piece.substr(i, st.len);
    bool first = i == 0;
    i += st.len;
    bool last = i == piece.size();
    int32_t id = -1;
    std::string_view lookup = ch;
    if (!affixes) {
      if (st.valid && st.cp < 0x10000) {
        id = char_ids_[st.cp];
      } else if (const int32_t* p = lookup_.find(ch)) {
        id = *p;
      }
    } else {
      key.clear();
      if (!first) key += continuing_subword_prefix_;
      key += ch;
      if (last) key += end_of_word_suffix_;
      lookup = key;
      if (const int32_t* p = lookup_.find(lookup)) id = *p;
    }
    if (id >= 0) {
      if (pending_unk >= 0) {
        ids.push_back(pending_unk);
        pending_unk = -1;
      }
      ids.push_back(id);
      continue;
    }
    if (byte_fallback_) {
      // Every byte of the looked-up string must have its <0xXX> token; HF emits
      // these before any pending unk token.
      bool all = true;
      for (char c : lookup) all = all && byte_fallback_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        for (char c : lookup) ids.push_back(byte_fallback_ids_[static_cast<unsigned char>(c)]);
        continue;
      }
    }
    if (unk_token_) {
      auto it = vocab_.find(*unk_token_);
      if (it == vocab_.end())
        LS_THROW << "tokenizer.json: model.unk_token '" << excerpt(*unk_token_)
                 << "' is not in the vocabulary";
      if (pending_unk >= 0 && !fuse_unk_) ids.push_back(pending_unk);
      pending_unk = it->second;
    }
    // Without an unk token the character is dropped, as in HF.
  }
  if (pending_unk >= 0) ids.push_back(pending_unk);
}

void BpeModel::merge(std::vector<int32_t>& ids) const {
  size_t n = ids.size();
  if (n < 2 || merges_.size() == 0) return;
  struct Sym {
    int32_t id, prev, next;
    bool alive;
  };
  struct Cand {
    int32_t rank, pos, new_id;
  };
  // Min-heap on (rank, pos): the lowest rank merges first, the leftmost on ties.
  auto worse = [](const Cand& x, const Cand& y) { return x.rank != y.rank ? x.rank > y.rank : x.pos > y.pos; };
  thread_local std::vector<Sym> syms;
  thread_local std::vector<Cand> heap;
  syms.clear();
  heap.clear();
  for (size_t i = 0; i < n; ++i) {
    syms.push_back(Sym{ids[i], static_cast<int32_t>(i) - 1, i + 1 < n ? static_cast<int32_t>(i + 1) : -1, true});
  }
  for (size_t i = 0; i + 1 < n; ++i) {
    if (const MergeInfo* m = find_merge(ids[i], ids[i + 1])) heap.push_back(Cand{m->rank, static_cast<int32_t>(i), m->new_id});
  }
  std::make_heap(heap.begin(), heap.end(), worse);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), worse);
    Cand c = heap.back();
    heap.pop_back();
    Sym& s = syms[static_cast<size_t>(c.pos)];
    if (!s.alive || s.next < 0) continue;
    Sym& r = syms[static_cast<size_t>(s.next)];
    const MergeInfo* m = find_merge(s.id, r.id);
    if (m == nullptr || m->rank != c.rank || m->new_id != c.new_id) continue;  // stale candidate
    s.id = c.new_id;
    r.alive = false;
    s.next = r.next;
    if (s.next >= 0) syms[static_cast<size_t>(s.next)].prev = c.pos;
    if (s.prev >= 0) {
      if (const MergeInfo* pm = find_merge(syms[static_cast<size_t>(s.prev)].id, s.id)) {
        heap.push_back(Cand{pm->rank, s.prev, pm->new_id});
        std::push_heap(heap.begin(), heap.end(), worse);
      }
    }
    if (s.next >= 0) {
      if (const MergeInfo* nm = find_merge(s.id, syms[static_cast<size_t>(s.next)].id)) {
        heap.push_back(Cand{nm->rank, c.pos, nm->new_id});
        std::push_heap(heap.begin(), heap.end(), worse);
      }
    }
  }
  ids.clear();
  for (int32_t k = 0; k >= 0; k = syms[static_cast<size_t>(k)].next) ids.push_back(syms[static_cast<size_t>(k)].id);
  release_if_large(syms);
  release_if_large(heap);
}

void BpeModel::encode(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  uint64_t h = hash_bytes(piece);
  if (ignore_merges_) {
    if (const int32_t* id = lookup_.find_hashed(piece, h)) {
      out.push_back(*id);
      return;
    }
  }
  bool cacheable = piece.size() <= kMaxCachedPieceBytes;
  if (cacheable) {
    std::shared_lock lock(cache_->mu);
    if (const Cache::Entry* e = cache_->map.find_hashed(piece, h)) {
      const int32_t* p = cache_->ids.data() + e->off;
      out.insert(out.end(), p, p + e->len);
      return;
    }
  }
  thread_local std::vector<int32_t> ids;
  ids.clear();
  initial_symbols(piece, ids);
  merge(ids);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::unique_lock lock(cache_->mu);
    if (cache_->map.size() < kCacheCapacity && cache_->map.find_hashed(piece, h) == nullptr) {
      Cache::Entry e{static_cast<uint32_t>(cache_->ids.size()), static_cast<uint32_t>(ids.size())};
      cache_->ids.insert(cache_->ids.end(), ids.begin(), ids.end());
      cache_->map.set_hashed(piece, h, e);
    }
  }
  release_if_large(ids);
}

void BpeModel::encode_raw(std::string_view bytes, std::vector<int32_t>& out) const {
  if (bytes.empty()) return;
  uint64_t h = hash_bytes(bytes);
  if (ignore_merges_) {
    if (const int32_t* id = raw_lookup_.find_hashed(bytes, h)) {
      out.push_back(*id);
      return;
    }
  }
  bool cacheable = bytes.size() <= kMaxCachedPieceBytes;
  if (cacheable) {
    std::shared_lock lock(raw_cache_->mu);
    if (const Cache::Entry* e = raw_cache_->map.find_hashed(bytes, h)) {
      const int32_t* p = raw_cache_->ids.data() + e->off;
      out.insert(out.end(), p, p + e->len);
      return;
    }
  }
  thread_local std::vector<int32_t> ids;
  ids.clear();
  // One symbol per byte: the byte-level alphabet has one character per byte.
  for (char c : bytes) ids.push_back(byte_ids_[static_cast<unsigned char>(c)]);
  merge(ids);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::unique_lock lock(raw_cache_->mu);
    if (raw_cache_->map.size() < kCacheCapacity && raw_cache_->map.find_hashed(bytes, h) == nullptr) {
      Cache::Entry e{static_cast<uint32_t>(raw_cache_->ids.size()), static_cast<uint32_t>(ids.size())};
      raw_cache_->ids.insert(raw_cache_->ids.end(), ids.begin(), ids.end());
      raw_cache_->map.set_hashed(bytes, h, e);
    }
  }
  release_if_large(ids);
}

void BpeModel::encode_reference(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    if (const int32_t* id = lookup_.find(piece)) {
      out.push_back(*id);
      return;
    }
  }
  std::vector<int32_t> ids;
  initial_symbols(piece, ids);
  // The textbook loop: merge the leftmost pair of lowest rank until none is left.
  for (;;) {
    int32_t best_rank = INT32_MAX, best_pos = -1, best_new = -1;
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      const MergeInfo* m = find_merge(ids[i], ids[i + 1]);
      if (m != nullptr && m->rank < best_rank) {
        best_rank = m->rank;
        best_pos = static_cast<int32_t>(i);
        best_new = m->new_id;
      }
    }
    if (best_pos < 0) break;
    ids[static_cast<size_t>(best_pos)] = best_new;
    ids.erase(ids.begin() + best_pos + 1);
  }
  out.insert(out.end(), ids.begin(), ids.end());
}

}  // namespace lockstep::tokenizer
