// 64-bit checksum of a byte range (the XXH64 algorithm, seed 0): fast enough
// (several GB/s) to verify every bucket of a weight broadcast on receipt, and
// every tensor and file of a checkpoint. Xxh64 takes the bytes in pieces (a
// tensor converted chunk by chunk) and gives the same value as one call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace lockstep::comm {

uint64_t checksum64(const void* data, size_t bytes, uint64_t seed = 0);

class Xxh64 {
 public:
  explicit Xxh64(uint64_t seed = 0);
  void update(const void* data, size_t bytes);
  uint64_t digest() const;  // of everything given so far; update may go on

 private:
  uint64_t v_[4];
  uint64_t seed_;
  uint64_t total_ = 0;
  unsigned char buf_[32];
  size_t buffered_ = 0;
};

// 16 lowercase hex digits, and back (false for anything else).
std::string checksum_hex(uint64_t h);
bool parse_checksum_hex(const std::string& s, uint64_t* h);

}  // namespace lockstep::comm
