// UTF-8 repair and Unicode normalization for the tokenizer. Normalization is the
// textbook algorithm (UAX #15): full decomposition, canonical ordering, then
// canonical composition, with Hangul syllables handled arithmetically.
#include "lockstep/tokenizer/unicode.h"

#include <algorithm>
#include <bitset>
#include <cstring>

#include "lockstep/tokenizer/unicode_tables.h"

namespace lockstep::tokenizer {
namespace {

// Hangul syllable arithmetic (Unicode 3.12).
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr uint32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

bool is_hangul_syllable(uint32_t cp) { return cp >= kSBase && cp < kSBase + kSCount; }

template <typename T>
const T* find_entry(const T* table, size_t n, uint32_t cp) {
  const T* end = table + n;
  const T* it = std::lower_bound(table, end, cp, [](const T& e, uint32_t c) { return e.cp < c; });
  return (it != end && it->cp == cp) ? it : nullptr;
}

bool in_sorted(const uint32_t* table, size_t n, uint32_t cp) { return std::binary_search(table, table + n, cp); }

uint32_t compose_pair(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (is_hangul_syllable(a) && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  const auto* end = tables::kCompositions + tables::kCompositionsSize;
  const auto* it = std::lower_bound(tables::kCompositions, end, std::pair<uint32_t, uint32_t>{a, b},
                                    [](const tables::CompositionPair& p, const std::pair<uint32_t, uint32_t>& k) {
                                      return p.first != k.first ? p.first < k.first : p.second < k.second;
                                    });
  if (it != end && it->first == a && it->second == b) return it->composite;
  return 0;
}

// Per-BMP-code-point flags for the NFC quick check: bit set when the character
// may change under NFC (NFC_Quick_Check No/Maybe) or has a non-zero combining class.
struct NfcFlags {
  std::bitset<0x10000> maybe_changes;  // No or Maybe: needs the full algorithm
  std::bitset<0x10000> has_ccc;
  NfcFlags() {
    for (size_t i = 0; i < tables::kNfcChangedSize; ++i)
      if (tables::kNfcChanged[i] < 0x10000) maybe_changes.set(tables::kNfcChanged[i]);
    for (size_t i = 0; i < tables::kCompositionsSize; ++i)
      if (tables::kCompositions[i].second < 0x10000) maybe_changes.set(tables::kCompositions[i].second);
    for (uint32_t cp = kVBase; cp < kVBase + kVCount; ++cp) maybe_changes.set(cp);
    for (uint32_t cp = kTBase + 1; cp < kTBase + kTCount; ++cp) maybe_changes.set(cp);
    for (size_t i = 0; i < tables::kCccSize; ++i)
      for (uint32_t cp = tables::kCcc[i].first; cp <= tables::kCcc[i].last && cp < 0x10000; ++cp) has_ccc.set(cp);
  }
};

const NfcFlags& nfc_flags() {
  static const NfcFlags flags;  // immutable after first use; C++ guarantees thread-safe init
  return flags;
}

bool is_composition_second(uint32_t cp) {
  if (cp < 0x10000) return nfc_flags().maybe_changes.test(cp) && !in_sorted(tables::kNfcChanged, tables::kNfcChangedSize, cp);
  for (size_t i = 0; i < tables::kCompositionsSize; ++i)
    if (tables::kCompositions[i].second == cp) return true;
  return false;
}

// True when `s` is certainly already in NFC (the Unicode quick-check algorithm).
bool nfc_quick_check(std::string_view s) {
  const NfcFlags& f = nfc_flags();
  uint8_t last_ccc = 0;
  size_t i = 0;
  while (i < s.size()) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c < 0xCC) {  // every code point below U+0300 is a starter that NFC keeps
      last_ccc = 0;
      i += c < 0x80 ? 1 : 2;
      continue;
    }
    Utf8Step st = utf8_next(s, i);
    i += st.len;
    uint32_t cp = st.cp;
    if (cp < 0x10000) {
      if (f.maybe_changes.test(cp)) return false;
      if (!f.has_ccc.test(cp)) {
        last_ccc = 0;
        continue;
      }
    } else if (in_sorted(tables::kNfcChanged, tables::kNfcChangedSize, cp) || is_composition_second(cp)) {
      return false;
    }
    uint8_t ccc = combining_class(cp);
    if (ccc != 0 && last_ccc > ccc) return false;
    last_ccc = ccc;
  }
  return true;
}

void decompose_into(uint32_t cp, bool compat, std::vector<uint32_t>& out) {
  if (is_hangul_syllable(cp)) {
    uint32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  const tables::MapEntry* e = compat ? find_entry(tables::kNfkd, tables::kNfkdSize, cp)
                                     : find_entry(tables::kNfd, tables::kNfdSize, cp);
  if (e == nullptr) {
    out.push_back(cp);
    return;
  }
  const uint32_t* pool = compat ? tables::kNfkdPool : tables::kNfdPool;
  out.insert(out.end(), pool + e->offset, pool + e->offset + e->len);
}

// Stable sort of each run of non-starters by combining class (canonical ordering).
void canonical_order(std::vector<uint32_t>& cps) {
  size_t n = cps.size();
  size_t i = 0;
  while (i < n) {
    if (combining_class(cps[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < n && combining_class(cps[j]) != 0) ++j;
    std::stable_sort(cps.begin() + static_cast<std::ptrdiff_t>(i), cps.begin() + static_cast<std::ptrdiff_t>(j),
                     [](uint32_t a, uint32_t b) { return combining_class(a) < combining_class(b); });
    i = j;
  }
}

void compose(std::vector<uint32_t>& cps) {
  if (cps.empty()) return;
  // `starter` is the last starter kept; `last_ccc` the class of the last character
  // kept after it (0: none, so nothing blocks). A leading non-starter has no starter.
  bool have_starter = combining_class(cps[0]) == 0;
  size_t starter = 0;
  int last_ccc = have_starter ? 0 : 256;
  size_t out = 1;
  for (size_t i = 1; i < cps.size(); ++i) {
    uint32_t ch = cps[i];
    int ccc = combining_class(ch);
    if (have_starter && (last_ccc < ccc || last_ccc == 0)) {
      if (uint32_t c = compose_pair(cps[starter], ch); c != 0) {
        cps[starter] = c;
        continue;
      }
    }
    if (ccc == 0) {
      have_starter = true;
      starter = out;
    }
    last_ccc = ccc;
    cps[out++] = ch;
  }
  cps.resize(out);
}

}  // namespace

Utf8Step utf8_next(std::string_view s, size_t i) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  Utf8Step r;
  unsigned char c = b(i);
  if (c < 0x80) return {c, 1, true, false};
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the first continuation byte
  uint32_t cp;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
    cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    cp = c & 0x0F;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    cp = c & 0x07;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return {kReplacementChar, 1, false, false};
  }
  size_t k = 1;
  for (; k <= need; ++k) {
    if (i + k >= s.size()) return {kReplacementChar, static_cast<uint32_t>(k), false, true};
    unsigned char x = b(i + k);
    unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (x < l || x > h) return {kReplacementChar, static_cast<uint32_t>(k), false, false};
    cp = (cp << 6) | (x & 0x3F);
  }
  r.cp = cp;
  r.len = static_cast<uint32_t>(need + 1);
  r.valid = true;
  return r;
}

bool utf8_is_valid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    // ASCII runs are the common case: skip 8 bytes at a time.
    while (i + 8 <= s.size()) {
      uint64_t w;
      std::memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= s.size()) break;
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    Utf8Step st = utf8_next(s, i);
    if (!st.valid) return false;
    i += st.len;
  }
  return true;
}

std::string utf8_sanitize(std::string_view s) {
  if (utf8_is_valid(s)) return std::string(s);
  std::string out;
  out.reserve(s.size() + 8);
  size_t i = 0;
  while (i < s.size()) {
    Utf8Step st = utf8_next(s, i);
    if (st.valid) {
      out.append(s.data() + i, st.len);
    } else {
      utf8_append(out, kReplacementChar);
    }
    i += st.len;
  }
  return out;
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::vector<uint32_t> utf8_decode(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    Utf8Step st = utf8_next(s, i);
    out.push_back(st.cp);
    i += st.len;
  }
  return out;
}

std::string utf8_encode(const std::vector<uint32_t>& cps) {
  std::string out;
  out.reserve(cps.size());
  for (uint32_t cp : cps) utf8_append(out, cp);
  return out;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); ++n) i += utf8_next(s, i).len;
  return n;
}

bool is_white_space(uint32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  if (cp < 0x85) return false;
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

uint8_t combining_class(uint32_t cp) {
  if (cp < 0x300) return 0;
  const auto* end = tables::kCcc + tables::kCccSize;
  const auto* it =
      std::upper_bound(tables::kCcc, end, cp, [](uint32_t c, const tables::CccRange& r) { return c < r.first; });
  if (it == tables::kCcc) return 0;
  --it;
  return cp <= it->last ? it->ccc : 0;
}

std::string normalize(std::string_view s, NormalForm form) {
  bool ascii = true;
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) {
      ascii = false;
      break;
    }
  }
  if (ascii) return std::string(s);  // ASCII is invariant under every form
  if (form == NormalForm::NFC && nfc_quick_check(s)) return std::string(s);
  bool compat = form == NormalForm::NFKC || form == NormalForm::NFKD;
  std::vector<uint32_t> cps;
  cps.reserve(s.size() + 8);
  for (size_t i = 0; i < s.size();) {
    Utf8Step st = utf8_next(s, i);
    decompose_into(st.cp, compat, cps);
    i += st.len;
  }
  canonical_order(cps);
  if (form == NormalForm::NFC || form == NormalForm::NFKC) compose(cps);
  return utf8_encode(cps);
}

std::string to_lowercase(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      out.push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c));
      ++i;
      continue;
    }
    Utf8Step st = utf8_next(s, i);
    const tables::MapEntry* e = find_entry(tables::kLower, tables::kLowerSize, st.cp);
    if (e == nullptr) {
      utf8_append(out, st.cp);
    } else {
      for (uint32_t k = 0; k < e->len; ++k) utf8_append(out, tables::kLowerPool[e->offset + k]);
    }
    i += st.len;
  }
  return out;
}

const char* unicode_tables_version() { return tables::kUnicodeVersion; }

}  // namespace lockstep::tokenizer
