// The small per-element steps of DeepSeek-V4's model code that run between
// its kernels: the indexer's head-weight scale and, with expert parallelism,
// each gathered row's routing weight and its gradient. One f32 multiply or a
// plain copy per element, so neither the thread count nor the batch can
// change a bit; each entry dispatches to the GPU backend.
#pragma once

#include <cstdint>

#include "lockstep/base/thread_pool.h"
#include "lockstep/kernels/cpu/moe.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::kernels {

// x = x * s elementwise over a contiguous f32 tensor (one rounded multiply
// per element; -0 and NaN kept as the multiply gives them).
void scale_values(const Context& ctx, Tensor x, float s);

// w_rows (R, 1) f32: the routing weight of each gathered row of `plan`,
// w_rows[row_of(t, s)] = topk_w[t, s] (topk_w (T, K) f32, R = T*K).
void moe_row_weights(const Context& ctx, Tensor w_rows, const Tensor& topk_w, const MoeDispatch& plan);
// Its backward (a permutation): dtopk_w[t, s] = dw_rows[row_of(t, s)],
// written; dtopk_w (T, K), dw_rows (R, 1).
void moe_row_weights_backward(const Context& ctx, Tensor dtopk_w, const Tensor& dw_rows,
                              const MoeDispatch& plan);

namespace detail {
// The checks the CPU and GPU entries share (same messages).
int64_t check_scale_values(const Tensor& x);
void check_moe_row_weights(const Tensor& rows, const Tensor& topk, const MoeDispatch& plan, const char* what);
}  // namespace detail

}  // namespace lockstep::kernels
