// checksum64 and Xxh64: XXH64 (Yann Collet's public algorithm), written from
// its specification; the one-shot call is the streaming state fed once.
#include "lockstep/comm/checksum.h"

#include <cstring>

namespace lockstep::comm {

namespace {
constexpr uint64_t kP1 = 0x9E3779B185EBCA87ull, kP2 = 0xC2B2AE3D27D4EB4Full, kP3 = 0x165667B19E3779F9ull,
                   kP4 = 0x85EBCA77C2B2AE63ull, kP5 = 0x27D4EB2F165667C5ull;

inline uint64_t rotl(uint64_t x, int r) {
  return (x << r) | (x >> (64 - r));
}
inline uint64_t read64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;  // little-endian hosts only (x86-64, AArch64)
}
inline uint32_t read32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint64_t round(uint64_t acc, uint64_t input) {
  acc += input * kP2;
  acc = rotl(acc, 31);
  acc *= kP1;
  // Keeps the lane in a general register: otherwise GCC may vectorize the four
  // lanes with AVX2, which has no 64-bit multiply and runs at half the speed.
  __asm__("" : "+r"(acc));
  return acc;
}
inline uint64_t merge(uint64_t acc, uint64_t v) {
  acc ^= round(0, v);
  return acc * kP1 + kP4;
}

// The 32-byte stripes of [p, end) into the four lanes; returns where they stop.
const unsigned char* consume_stripes(uint64_t* v, const unsigned char* p, const unsigned char* end) {
  if (end - p < 32) return p;
  uint64_t v1 = v[0], v2 = v[1], v3 = v[2], v4 = v[3];
  const unsigned char* limit = end - 32;
  do {
    v1 = round(v1, read64(p));
    v2 = round(v2, read64(p + 8));
    v3 = round(v3, read64(p + 16));
    v4 = round(v4, read64(p + 24));
    p += 32;
  } while (p <= limit);
  v[0] = v1, v[1] = v2, v[2] = v3, v[3] = v4;
  return p;
}
}  // namespace

Xxh64::Xxh64(uint64_t seed) : v_{seed + kP1 + kP2, seed + kP2, seed, seed - kP1}, seed_(seed), buf_{} {}

void Xxh64::update(const void* data, size_t bytes) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  const unsigned char* end = p + bytes;
  total_ += bytes;
  if (buffered_ + bytes < 32) {
    if (bytes > 0) std::memcpy(buf_ + buffered_, p, bytes);
    buffered_ += bytes;
    return;
  }
  if (buffered_ > 0) {  // complete the pending stripe first
    const size_t fill = 32 - buffered_;
    std::memcpy(buf_ + buffered_, p, fill);
    consume_stripes(v_, buf_, buf_ + 32);
    p += fill;
    buffered_ = 0;
  }
  p = consume_stripes(v_, p, end);
  buffered_ = size_t(end - p);
  if (buffered_ > 0) std::memcpy(buf_, p, buffered_);
}

uint64_t Xxh64::digest() const {
  uint64_t h;
  if (total_ >= 32) {
    h = rotl(v_[0], 1) + rotl(v_[1], 7) + rotl(v_[2], 12) + rotl(v_[3], 18);
    for (uint64_t v : v_) h = merge(h, v);
  } else {
    h = seed_ + kP5;
  }
  h += total_;
  const unsigned char* p = buf_;
  const unsigned char* end = buf_ + buffered_;
  while (p + 8 <= end) {
    h ^= round(0, read64(p));
    h = rotl(h, 27) * kP1 + kP4;
    p += 8;
  }
  if (p + 4 <= end) {
    h ^= uint64_t(read32(p)) * kP1;
    h = rotl(h, 23) * kP2 + kP3;
    p += 4;
  }
  while (p < end) {
    h ^= uint64_t(*p) * kP5;
    h = rotl(h, 11) * kP1;
    ++p;
  }
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

uint64_t checksum64(const void* data, size_t bytes, uint64_t seed) {
  Xxh64 x(seed);
  x.update(data, bytes);
  return x.digest();
}

std::string checksum_hex(uint64_t h) {
  constexpr char kDigits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, h >>= 4) s[size_t(i)] = kDigits[h & 15];
  return s;
}

bool parse_checksum_hex(const std::string& s, uint64_t* h) {
  if (s.size() != 16) return false;
  uint64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (c >= 'a' && c <= 'f')
      d = c - 'a' + 10;
    else
      return false;
    v = (v << 4) | uint64_t(d);
  }
  *h = v;
  return true;
}

}  // namespace lockstep::comm
