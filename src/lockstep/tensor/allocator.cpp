// The host allocator: aligned, zero-filled host memory.
#include "lockstep/tensor/allocator.h"

#include <cstdlib>
#include <cstring>

#include "lockstep/base/error.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep {

namespace {

class HostAllocator final : public Allocator {
 public:
  const char* name() const override { return "host"; }
  // Host memory is always zero-filled: nothing on the CPU relies on
  // poisoning, and a zeroed page costs nothing until touched.
  void* allocate(size_t bytes, Fill, const char* what) const override {
    if (bytes == 0) return nullptr;
    const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    void* p = std::aligned_alloc(kAlignment, rounded);
    LS_CHECK(p != nullptr) << "out of memory allocating " << bytes << " bytes for " << what;
    std::memset(p, 0, rounded);
    return p;
  }
  void release(void* p) const noexcept override { std::free(p); }
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
};

}  // namespace

// Never destroyed: Buffers with static storage duration release through it
// at exit, in any order.
const Allocator& host_allocator() {
  static const HostAllocator* a = new HostAllocator;
  return *a;
}

}  // namespace lockstep
