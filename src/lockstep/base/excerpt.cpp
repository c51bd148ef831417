// excerpt(): a bounded, printable quote of untrusted text.
#include "lockstep/base/excerpt.h"

#include <cstdint>

namespace lockstep {
namespace {

// Length of the well-formed UTF-8 sequence at s[i] (1 to 4), or 0 if none
// starts there (RFC 3629: no overlongs, no surrogates, nothing past U+10FFFF).
size_t utf8_sequence_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[i + k]); };
  const uint8_t c = b(0);
  size_t n = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > s.size() || b(1) < lo || b(1) > hi) return 0;
  for (size_t k = 2; k < n; ++k)
    if (b(k) < 0x80 || b(k) > 0xBF) return 0;
  return n;
}

}  // namespace

std::string excerpt(std::string_view s, size_t max_bytes) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<uint8_t>(s[i]);
    size_t n = 1;
    bool escape = c < 0x20 || c == 0x7F;
    if (c >= 0x80) {
      n = utf8_sequence_length(s, i);
      escape = n == 0;
      if (escape) n = 1;
    }
    if (i + n > max_bytes) break;
    if (escape) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out.append(s.substr(i, n));
    }
    i += n;
  }
  if (i < s.size()) out += "... (" + std::to_string(s.size()) + " bytes)";
  return out;
}

}  // namespace lockstep
