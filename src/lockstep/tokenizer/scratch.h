// Per-thread scratch vectors of the tokenizer: they keep their capacity
// between calls (no allocation per word), but not past a bound, so that one
// huge text (a server's 16 MB prompt) does not leave each thread that ever
// encoded one holding that much memory for the rest of the process.
#pragma once

#include <cstddef>
#include <vector>

namespace lockstep::tokenizer {

// Elements a scratch vector may keep between calls: far above any real word
// or text span, small next to a request body.
constexpr size_t kScratchKeep = size_t(1) << 16;

template <class T>
void release_if_large(std::vector<T>& v) {
  if (v.capacity() > kScratchKeep) std::vector<T>().swap(v);
}

// release_if_large on every way out of a scope.
template <class T>
struct ReleaseIfLarge {
  std::vector<T>& v;
  ~ReleaseIfLarge() { release_if_large(v); }
};

}  // namespace lockstep::tokenizer
