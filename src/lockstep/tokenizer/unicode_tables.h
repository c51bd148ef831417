// Declarations of the generated Unicode tables (unicode_tables.cpp, made by
// scripts/gen_unicode_tables.py). Only unicode.cpp reads them; everything else
// uses the functions in unicode.h.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lockstep::tokenizer::tables {

struct CccRange {
  uint32_t first, last;  // inclusive code point range
  uint8_t ccc;           // canonical combining class (non-zero)
};
// A code point mapped to pool[offset .. offset+len).
struct MapEntry {
  uint32_t cp;
  uint32_t offset;
  uint32_t len;
};
struct CompositionPair {
  uint32_t first, second, composite;
};

extern const char kUnicodeVersion[];
extern const CccRange kCcc[];  // sorted, disjoint
extern const size_t kCccSize;
extern const uint32_t kNfdPool[];  // full canonical decompositions, Hangul excluded
extern const size_t kNfdPoolSize;
extern const MapEntry kNfd[];  // sorted by cp
extern const size_t kNfdSize;
extern const uint32_t kNfkdPool[];  // full compatibility decompositions, Hangul excluded
extern const size_t kNfkdPoolSize;
extern const MapEntry kNfkd[];
extern const size_t kNfkdSize;
extern const CompositionPair kCompositions[];  // primary composites, sorted by (first, second)
extern const size_t kCompositionsSize;
extern const uint32_t kNfcChanged[];  // sorted: code points NFC rewrites on their own
extern const size_t kNfcChangedSize;
extern const uint32_t kLowerPool[];
extern const size_t kLowerPoolSize;
extern const MapEntry kLower[];  // per-character lowercase (Rust char::to_lowercase)
extern const size_t kLowerSize;

}  // namespace lockstep::tokenizer::tables
