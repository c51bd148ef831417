// UTF-8 reading and repair, and the Unicode operations the tokenizer's
// normalizers need (NFC/NFD/NFKC/NFKD, lowercase, White_Space), backed by the
// generated tables in unicode_tables.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace lockstep::tokenizer {

constexpr uint32_t kReplacementChar = 0xFFFD;

// One step of reading UTF-8 at some offset.
struct Utf8Step {
  uint32_t cp = 0;         // the code point when valid, else kReplacementChar
  uint32_t len = 0;        // bytes consumed: the character, or the maximal invalid subpart (>= 1)
  bool valid = false;      // a complete, well-formed character
  bool truncated = false;  // invalid only because the input ended inside a well-formed prefix
};

// Reads the character at s[i] (i < s.size()). An ill-formed sequence is reported
// as its "maximal subpart" (Unicode 3.9, the policy of Python's errors="replace"
// and Rust's from_utf8_lossy), so that each such subpart becomes one U+FFFD.
Utf8Step utf8_next(std::string_view s, size_t i);

bool utf8_is_valid(std::string_view s);
// Replaces every maximal ill-formed subpart by U+FFFD; valid input is returned unchanged.
std::string utf8_sanitize(std::string_view s);
void utf8_append(std::string& out, uint32_t cp);
// Code points of valid UTF-8 (ill-formed parts read as U+FFFD).
std::vector<uint32_t> utf8_decode(std::string_view s);
std::string utf8_encode(const std::vector<uint32_t>& cps);
// Number of characters (ill-formed subparts count as one).
size_t utf8_length(std::string_view s);

// Unicode White_Space, which is Rust's char::is_whitespace and regex \s.
bool is_white_space(uint32_t cp);
uint8_t combining_class(uint32_t cp);

enum class NormalForm { NFC, NFD, NFKC, NFKD };
// Normalizes valid UTF-8 text. Text that is already normalized is returned unchanged
// (a quick check avoids the full algorithm for ASCII and most NFC text).
std::string normalize(std::string_view s, NormalForm form);
// Character-by-character lowercase mapping (Rust char::to_lowercase, no context rules),
// what the Hugging Face `Lowercase` normalizer does.
std::string to_lowercase(std::string_view s);

// Version of the Unicode database the tables were generated from.
const char* unicode_tables_version();

}  // namespace lockstep::tokenizer
