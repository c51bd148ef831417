// Workspace slots and the reuse of owned tensors across calls.
#include "lockstep/model/workspace.h"

#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::model {

Tensor Workspace::get(size_t slot, DType dtype, std::initializer_list<int64_t> shape) {
  Tensor probe(nullptr, dtype, shape);
  const size_t need = probe.nbytes();
  if (slot >= slots_.size()) slots_.resize(slot + 1);
  if (slots_[slot].size() < need) {
    // 1/8 headroom: batches that grow a little (decode steps gaining
    // sequences) do not reallocate every time.
    slots_[slot] = Buffer(need + need / 8, *memory_, Fill::Undefined, "workspace slot");
  }
  return Tensor(slots_[slot].data(), dtype, shape);
}

size_t Workspace::nbytes() const {
  size_t n = 0;
  for (const auto& b : slots_) n += b.size();
  return n;
}

Tensor reuse(const Context& ctx, OwnedTensor& t, DType dtype, std::initializer_list<int64_t> shape) {
  return reuse(kernels::device_memory(ctx), t, dtype, shape);
}

Tensor reuse(const Allocator& memory, OwnedTensor& t, DType dtype, std::initializer_list<int64_t> shape) {
  const Tensor& v = t.view();
  bool same = v.data != nullptr && &t.memory() == &memory && v.dtype == dtype && v.ndim == int(shape.size());
  int i = 0;
  for (int64_t d : shape) same = same && v.shape[i++] == d;
  if (!same) t = OwnedTensor(dtype, std::vector<int64_t>(shape), memory, Fill::Undefined, "activation");
  return t.view();
}

}  // namespace lockstep::model
