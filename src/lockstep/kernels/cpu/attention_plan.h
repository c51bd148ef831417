// Argument checking for paged-cache attention, shared by the CPU kernels and
// the GPU entries (kernels/gpu/attention.cu) so both reject the same inputs
// with the same errors. No SIMD here: device compilers include it too.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "lockstep/kernels/cpu/attention.h"

namespace lockstep::kernels::attn {

// What a validated batch looks like to the kernels.
struct BatchPlan {
  int64_t S = 0, T = 0, max_blocks = 0, BS = 0, NB = 0, Hkv = 0, Dh = 0;
  const int32_t* n_ctx = nullptr;  // (S)
  const int32_t* n_new = nullptr;  // (S)
  const int32_t* table = nullptr;  // (S, max_blocks), row stride table_stride
  int64_t table_stride = 0;
  std::vector<int32_t> seq;    // (T) sequence of each new token
  std::vector<int32_t> pos;    // (T) absolute position of each new token
  std::vector<int64_t> first;  // (S + 1) first token row of each sequence
};

// Checks the caches (same shape, f32 or bf16, contiguous, dim 1 == block_size)
// and every batch entry against them for T new tokens: counts >= 0, Σ n_new == T,
// n_ctx + n_new within the block table's capacity, every block index that a
// position below n_ctx + n_new uses within [0, NB). `fn` names the kernel.
BatchPlan plan_batch(const char* fn, const AttentionBatch& batch, int64_t T, const Tensor& k_cache,
                     const Tensor& v_cache);

// Checks a (T, heads, Dh) f32 token tensor with contiguous rows (row stride may be larger).
void check_rows(const char* fn, const Tensor& t, int64_t T, int64_t heads, int64_t Dh, const char* what);

// Every check of kv_cache_write. `slots` receives (slot, token) for each new
// token, sorted by slot, where slot = physical block * BS + offset; two tokens
// on one slot throw.
BatchPlan plan_kv_cache_write(const Tensor& k_cache, const Tensor& v_cache, const Tensor& k_new,
                              const Tensor& v_new, const AttentionBatch& batch,
                              std::vector<std::pair<int64_t, int64_t>>* slots);

// Every check of attention_forward (q heads a multiple of the kv heads; q, out
// (T, H, Dh) rows; lse (T, H) when given: lse.data != nullptr || lse.ndim != 0).
BatchPlan plan_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k_cache,
                                 const Tensor& v_cache, const AttentionBatch& batch);

// Every check of attention_backward (the forward's, every n_ctx == 0, and the
// gradient tensors).
BatchPlan plan_attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                                  const Tensor& out, const Tensor& lse, const Tensor& q,
                                  const Tensor& k_cache, const Tensor& v_cache, const AttentionBatch& batch);

}  // namespace lockstep::kernels::attn
