// The host allocator: aligned, zero-filled host memory.
#include "lockstep/tensor/allocator.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "lockstep/base/error.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep {

namespace {

class HostAllocator final : public Allocator {
 public:
  const char* name() const override { return "host"; }
  // Host memory is always zero-filled, by calloc: it hands out pages fresh
  // from the kernel without writing them, so a page of a large buffer takes
  // no memory until it is written (a snapshot's mirror, a KV cache). The
  // header before the aligned pointer keeps calloc's own pointer.
  void* allocate(size_t bytes, Fill, const char* what) const override {
    if (bytes == 0) return nullptr;
    const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    void* raw = std::calloc(1, rounded + kAlignment + sizeof(void*));
    LS_CHECK(raw != nullptr) << "out of memory allocating " << bytes << " bytes for " << what;
    void* first = static_cast<char*>(raw) + sizeof(void*);
    size_t space = rounded + kAlignment;
    void** aligned = static_cast<void**>(std::align(kAlignment, rounded, first, space));
    aligned[-1] = raw;
    return aligned;
  }
  void release(void* p) const noexcept override {
    if (p != nullptr) std::free(static_cast<void**>(p)[-1]);
  }
  bool host_visible() const override { return true; }
  bool holds(const void*) const override { return true; }
  void copy_in(void* dst, const void* src, size_t bytes) const override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void copy_out(void* dst, const void* src, size_t bytes) const override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void copy(void* dst, const void* src, size_t bytes) const override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void fill(void* dst, unsigned char byte, size_t bytes) const override {
    if (bytes) std::memset(dst, byte, bytes);
  }
};

}  // namespace

void Allocator::copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes,
                        size_t rows) const {
  for (size_t r = 0; r < rows; ++r)
    copy(static_cast<char*>(dst) + r * dst_pitch, static_cast<const char*>(src) + r * src_pitch, row_bytes);
}

void Allocator::fill(void* dst, unsigned char byte, size_t bytes) const {
  // 1 MiB: a bounded host block, whatever the size of the memory filled.
  constexpr size_t kBlock = size_t{1} << 20;
  const std::vector<unsigned char> block(std::min(bytes, kBlock), byte);
  for (size_t at = 0; at < bytes; at += kBlock)
    copy_in(static_cast<char*>(dst) + at, block.data(), std::min(kBlock, bytes - at));
}

// Never destroyed: Buffers with static storage duration release through it
// at exit, in any order.
const Allocator& host_allocator() {
  static const HostAllocator* a = new HostAllocator;
  return *a;
}

}  // namespace lockstep
