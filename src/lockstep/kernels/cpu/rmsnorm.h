// RMSNorm (Llama/Qwen convention) forward, fused residual-add + RMSNorm, and
// backward. Each row is normalized on its own with the canonical sum of
// squares, so a row's bits do not depend on the batch or the thread count.
#pragma once

#include "lockstep/base/thread_pool.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::kernels {

// Per row t (all f32, evaluated in exactly this order, no FMA):
//   ss      = canonical_sum_sq(x[t, :], D)
//   rstd[t] = 1 / sqrt(ss / D + eps)          (IEEE division and sqrt)
//   y[t, i] = (x[t, i] * rstd[t]) * w[i]      (as Hugging Face: weight * (x * rsqrt(var + eps)))
// Shapes: x, y (T, D), rows may be strided; w (D,); rstd (T,) contiguous, or an
// empty Tensor() when the caller does not keep it. y may alias x.
// For Qwen3's per-head q/k norm pass (T*H, Dh) views.
void rmsnorm_forward(const Context& ctx, Tensor y, Tensor rstd, const Tensor& x, const Tensor& w, float eps);

// Fused residual add: h_out = x + r (one f32 add per element), then
// y = rmsnorm(h_out) with the very same row function, so the bits equal an
// add followed by rmsnorm_forward. h_out may alias x or r (the usual in-place
// residual stream); y must not alias h_out. Shapes as rmsnorm_forward, with
// r and h_out (T, D).
void add_rmsnorm_forward(const Context& ctx, Tensor y, Tensor h_out, Tensor rstd, const Tensor& x,
                         const Tensor& r, const Tensor& w, float eps);

// Backward of y = x * rstd * w with rstd as saved by the forward:
//   g_i     = dy_i * w_i
//   c       = ((canonical_dot(g, x, D) / D) * rstd) * rstd * rstd
//   dx_i    = g_i * rstd - c * x_i                         (written, =)
//   dw_i   += (dy[t, i] * x[t, i]) * rstd[t]  for t = 0..T-1 in token order (accumulated)
// Threads split rows for dx and columns for dw. dx may alias dy.
// Shapes: dx, dy, x (T, D) (strided rows allowed); w, dw (D,); rstd (T,).
void rmsnorm_backward(const Context& ctx, Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x,
                      const Tensor& w, const Tensor& rstd);

namespace detail {
// The argument checks of the entries above (dtypes, shapes, strides), shared
// with the GPU backend so both raise the same errors. Each returns (T, D).
struct RmsnormShape {
  int64_t T, D;
};
RmsnormShape check_rmsnorm_forward(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& w);
RmsnormShape check_add_rmsnorm_forward(const Tensor& y, const Tensor& h_out, const Tensor& rstd,
                                       const Tensor& x, const Tensor& r, const Tensor& w);
RmsnormShape check_rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                                    const Tensor& w, const Tensor& rstd);
}  // namespace detail

}  // namespace lockstep::kernels
