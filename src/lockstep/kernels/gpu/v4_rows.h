// The GPU forms of DeepSeek-V4's per-element steps (v4_rows.cu,
// kernels/cpu/v4_rows.h) with their launch geometry, for tests that run
// several; the backend table holds the default-geometry forms.
#pragma once

#include <cstdint>

#include "lockstep/base/thread_pool.h"
#include "lockstep/kernels/cpu/moe.h"
#include "lockstep/kernels/gpu/portable.h"
#include "lockstep/kernels/gpu/rows.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::kernels::gpu::LS_GPU_NS {

// RowsLaunch (rows.h): threads per block, one element each; max_blocks > 0
// makes a grid-stride loop over at most that many blocks.
void scale_values(const Context& ctx, Tensor x, float s, const RowsLaunch& cfg);
void moe_row_weights(const Context& ctx, Tensor w_rows, const Tensor& topk_w, const MoeDispatch& plan,
                     const RowsLaunch& cfg);
void moe_row_weights_backward(const Context& ctx, Tensor dtopk_w, const Tensor& dw_rows,
                              const MoeDispatch& plan, const RowsLaunch& cfg);

// DeepSeek-V4's routed-expert steps of kernels/cpu/moe.h.
void moe_scale_rows(const Context& ctx, Tensor y, const Tensor& x, const Tensor& topk_w,
                    const MoeDispatch& plan, const RowsLaunch& cfg);
void moe_scale_rows_backward(const Context& ctx, Tensor dx, Tensor dtopk_w, const Tensor& dy, const Tensor& x,
                             const Tensor& topk_w, const MoeDispatch& plan, const RowsLaunch& cfg);
void moe_sum(const Context& ctx, Tensor y, const Tensor& ye, const MoeDispatch& plan, const RowsLaunch& cfg);
void moe_sum_backward(const Context& ctx, Tensor dye, const Tensor& dy, const MoeDispatch& plan,
                      const RowsLaunch& cfg);

}  // namespace lockstep::kernels::gpu::LS_GPU_NS
