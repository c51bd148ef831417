// GpuBackend's coverage lists (backend.h).
#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::kernels {

Tensor host_readable(const Tensor& t, std::vector<unsigned char>& keep) {
  const Allocator& memory = *interpret_backend().memory;
  if (t.data == nullptr || t.numel() == 0 || memory.host_visible() || !memory.holds(t.data)) return t;
  int64_t last = 0;  // the offset of the last element, in elements
  for (int d = 0; d < t.ndim; ++d) last += (t.shape[d] - 1) * t.stride[d];
  keep.resize(static_cast<size_t>(last + 1) * dtype_size(t.dtype));
  memory.copy_out(keep.data(), t.data, keep.size());
  Tensor h = t;
  h.data = keep.data();
  return h;
}

namespace {

// Every entry of the table with its name, in declaration order.
template <typename Fn>
void for_each_entry(const GpuBackend& b, Fn&& fn) {
#define LS_ENTRY(e) fn(#e, b.e != nullptr)
  LS_ENTRY(gemm_xwt_packed);
  LS_ENTRY(gemm_xwt);
  LS_ENTRY(gemm_dyw);
  LS_ENTRY(gemm_dytx);
  LS_ENTRY(embedding_forward);
  LS_ENTRY(embedding_backward);
  LS_ENTRY(rmsnorm_forward);
  LS_ENTRY(add_rmsnorm_forward);
  LS_ENTRY(rmsnorm_backward);
  LS_ENTRY(rope_forward);
  LS_ENTRY(rope_backward);
  LS_ENTRY(swiglu_forward);
  LS_ENTRY(swiglu_backward);
  LS_ENTRY(token_logprob_forward);
  LS_ENTRY(token_logprob_backward);
  LS_ENTRY(kv_cache_write);
  LS_ENTRY(attention_forward);
  LS_ENTRY(attention_backward);
  LS_ENTRY(moe_route);
  LS_ENTRY(moe_gather);
  LS_ENTRY(moe_combine);
  LS_ENTRY(moe_route_backward);
  LS_ENTRY(moe_gather_backward);
  LS_ENTRY(moe_combine_backward);
  LS_ENTRY(adamw_step);
  LS_ENTRY(sample_rows);
#undef LS_ENTRY
}

}  // namespace

std::vector<std::string> GpuBackend::missing() const {
  std::vector<std::string> out;
  for_each_entry(*this, [&](const char* name, bool set) {
    if (!set) out.emplace_back(name);
  });
  return out;
}

std::vector<std::string> GpuBackend::covered() const {
  std::vector<std::string> out;
  for_each_entry(*this, [&](const char* name, bool set) {
    if (set) out.emplace_back(name);
  });
  return out;
}

}  // namespace lockstep::kernels
