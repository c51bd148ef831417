// GpuBackend's coverage lists (backend.h).
#include "lockstep/kernels/gpu/backend.h"

#include <algorithm>
#include <mutex>
#include <vector>

namespace lockstep::kernels {

namespace {

// The device allocators whose memory the host cannot read: interpret mode's
// (strict by default) and those of the device backends opened so far.
std::vector<const Allocator*>& device_memories() {
  static std::vector<const Allocator*> list{interpret_backend().memory};
  return list;
}
std::mutex& device_memories_mutex() {
  static std::mutex m;
  return m;
}

}  // namespace

void note_device_memory(const Allocator* memory) {
  std::lock_guard<std::mutex> lock(device_memories_mutex());
  auto& list = device_memories();
  if (memory != nullptr && std::find(list.begin(), list.end(), memory) == list.end()) list.push_back(memory);
}

Tensor host_readable(const Tensor& t, std::vector<unsigned char>& keep) {
  if (t.data == nullptr || t.numel() == 0) return t;
  const Allocator* memory = nullptr;
  {
    std::lock_guard<std::mutex> lock(device_memories_mutex());
    for (const Allocator* m : device_memories())
      if (!m->host_visible() && m->holds(t.data)) memory = m;
  }
  if (memory == nullptr) return t;
  int64_t last = 0;  // the offset of the last element, in elements
  for (int d = 0; d < t.ndim; ++d) last += (t.shape[d] - 1) * t.stride[d];
  keep.resize(static_cast<size_t>(last + 1) * dtype_size(t.dtype));
  memory->copy_out(keep.data(), t.data, keep.size());
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
  LS_ENTRY(unpack_weight);
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
  LS_ENTRY(rope_interleaved_forward);
  LS_ENTRY(rope_interleaved_inverse);
  LS_ENTRY(swiglu_forward);
  LS_ENTRY(swiglu_backward);
  LS_ENTRY(add_row_bias);
  LS_ENTRY(add_rows);
  LS_ENTRY(add_scaled_rows);
  LS_ENTRY(sigmoid_forward);
  LS_ENTRY(fp8_quantize_rows);
  LS_ENTRY(scale_values);
  LS_ENTRY(moe_row_weights);
  LS_ENTRY(moe_row_weights_backward);
  LS_ENTRY(moe_scale_rows);
  LS_ENTRY(moe_scale_rows_backward);
  LS_ENTRY(moe_sum);
  LS_ENTRY(moe_sum_backward);
  LS_ENTRY(token_logprob_forward);
  LS_ENTRY(token_logprob_backward);
  LS_ENTRY(token_logprob_stats);
  LS_ENTRY(token_logprob_backward_cols);
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
  // mhc.h, streams.h, swiglu.h's clamped forms
  LS_ENTRY(mhc_mix_forward);
  LS_ENTRY(mhc_mix_backward);
  LS_ENTRY(mhc_pre_apply);
  LS_ENTRY(mhc_pre_apply_backward);
  LS_ENTRY(mhc_post);
  LS_ENTRY(mhc_post_backward);
  LS_ENTRY(mhc_head_forward);
  LS_ENTRY(mhc_head_backward);
  LS_ENTRY(add_to_streams);
  LS_ENTRY(repeat_streams);
  LS_ENTRY(sum_streams);
  LS_ENTRY(swiglu_clamped_forward);
  LS_ENTRY(swiglu_clamped_backward);
  // kv_compress.h, sparse_attention.h
  LS_ENTRY(compress_forward);
  LS_ENTRY(compress_backward);
  LS_ENTRY(indexer_select);
  LS_ENTRY(sparse_attention_forward);
  LS_ENTRY(sparse_attention_backward);
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
