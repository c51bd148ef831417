// DeepSeek-V4's per-element steps (v4_rows.h): elements split across
// threads, each written by one f32 multiply or one copy.
#include "lockstep/kernels/cpu/v4_rows.h"

#include <algorithm>
#include <string>

#include "lockstep/base/error.h"
#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::kernels {

namespace detail {

int64_t check_scale_values(const Tensor& x) {
  check_dtype(x, DType::F32, "scale_values: x");
  if (!x.is_contiguous()) LS_THROW << "scale_values: x must be contiguous, got " << x.shape_str();
  return x.numel();
}

void check_moe_row_weights(const Tensor& rows, const Tensor& topk, const MoeDispatch& plan,
                           const char* what) {
  const int64_t T = plan.num_tokens, K = plan.top_k;
  const std::string r = std::string(what) + ": row weights (T*K, 1)", t = std::string(what) + ": topk (T, K)";
  check_dtype(rows, DType::F32, r.c_str());
  check_shape(rows, {T * K, 1}, r.c_str());
  check_dtype(topk, DType::F32, t.c_str());
  check_shape(topk, {T, K}, t.c_str());
  if (K > 1 && topk.stride[1] != 1) LS_THROW << t << " must have unit column stride";
  if (int64_t(plan.row_of.size()) != T * K)
    LS_THROW << what << ": the plan has " << plan.row_of.size() << " rows for T*K = " << T * K;
}

}  // namespace detail

void scale_values(const Context& ctx, Tensor x, float s) {
  LS_GPU_DISPATCH(ctx, scale_values, x, s);
  const int64_t n = detail::check_scale_values(x);
  float* p = x.f32();
  ctx.parallel_for(
      n,
      [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) p[i] = p[i] * s;
      },
      int64_t{1} << 16);
}

void moe_row_weights(const Context& ctx, Tensor w_rows, const Tensor& topk_w, const MoeDispatch& plan) {
  LS_GPU_DISPATCH(ctx, moe_row_weights, w_rows, topk_w, plan);
  detail::check_moe_row_weights(w_rows, topk_w, plan, "moe_row_weights");
  const int64_t K = plan.top_k;
  for (int64_t q = 0; q < plan.num_rows(); ++q)
    w_rows.f32()[plan.row_of[size_t(q)] * w_rows.stride[0]] =
        topk_w.f32()[(q / K) * topk_w.stride[0] + q % K];
}

void moe_row_weights_backward(const Context& ctx, Tensor dtopk_w, const Tensor& dw_rows,
                              const MoeDispatch& plan) {
  LS_GPU_DISPATCH(ctx, moe_row_weights_backward, dtopk_w, dw_rows, plan);
  detail::check_moe_row_weights(dw_rows, dtopk_w, plan, "moe_row_weights_backward");
  const int64_t K = plan.top_k;
  for (int64_t q = 0; q < plan.num_rows(); ++q)
    dtopk_w.f32()[(q / K) * dtopk_w.stride[0] + q % K] =
        dw_rows.f32()[plan.row_of[size_t(q)] * dw_rows.stride[0]];
}

}  // namespace lockstep::kernels
