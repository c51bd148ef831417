// Workspace: the per-worker scratch memory of forward() and backward(), kept
// from call to call so a warm decode or training step allocates nothing. It
// holds no state between calls (unlike the KvCache, which holds sequences'
// keys and values), so one worker keeps one Workspace for every batch it runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "lockstep/base/thread_pool.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::model {

// Numbered scratch buffers that keep the largest allocation each has needed.
// get() returns a contiguous view whose contents are undefined (whatever the
// last user left): every user writes a buffer before reading it. A view stays
// valid until the next get() of the same slot. Not for two calls at once.
class Workspace {
 public:
  // Slots come from `memory`: the device memory of the context whose
  // forward() uses this workspace (kernels::device_memory(ctx)).
  explicit Workspace(const Allocator& memory = host_allocator()) : memory_(&memory) {}
  Tensor get(size_t slot, DType dtype, std::initializer_list<int64_t> shape);
  size_t nbytes() const;  // memory held by all slots
  const Allocator& memory() const { return *memory_; }

 private:
  const Allocator* memory_;
  std::vector<Buffer> slots_;
};

// t itself, reallocated only when its dtype or shape differs or it is not in
// ctx's device memory (kernels::device_memory): a caller that keeps an
// Activations or ForwardResult from call to call then allocates nothing.
// Contents are undefined (the callers overwrite them).
Tensor reuse(const Context& ctx, OwnedTensor& t, DType dtype, std::initializer_list<int64_t> shape);
// The same in `memory`.
Tensor reuse(const Allocator& memory, OwnedTensor& t, DType dtype, std::initializer_list<int64_t> shape);
// Releases t's memory (a saved field this layer does not use).
inline void drop(OwnedTensor& t) { t = OwnedTensor(); }

}  // namespace lockstep::model
