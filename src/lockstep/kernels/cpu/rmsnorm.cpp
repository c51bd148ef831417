// RMSNorm kernels: one row function shared by the plain and the fused
// residual forms; the weight gradient is reduced over tokens in token order.
#include "lockstep/kernels/cpu/rmsnorm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "lockstep/kernels/cpu/simd.h"
#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::kernels {

namespace {

void check_rows(const Tensor& t, const char* what) {
  if (t.stride[1] != 1 || (t.shape[0] > 1 && t.stride[0] < t.shape[1]))
    LS_THROW << what << ": rows must have unit column stride and stride[0] >= width, got " << t.shape_str()
             << " with strides (" << t.stride[0] << ", " << t.stride[1] << ")";
}

// A (n,) f32 operand, contiguous.
void check_vec(const Tensor& t, int64_t n, const char* what) {
  check_dtype(t, DType::F32, what);
  check_shape(t, {n}, what);
  if (n > 1 && t.stride[0] != 1) LS_THROW << what << ": must be contiguous, got " << t.shape_str();
}

void check_mat(const Tensor& t, int64_t T, int64_t D, const char* what) {
  check_dtype(t, DType::F32, what);
  check_shape(t, {T, D}, what);
  check_rows(t, what);
}

// Rows per task: a row of D floats is cheap, so batch rows until a task
// touches roughly 16K elements.
int64_t row_grain(int64_t D) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(D, 1));
}

// The one definition of a normalized row; returns rstd. y may alias x.
float norm_row(float* y, const float* x, const float* w, int64_t D, float eps) {
  const float ss = canonical_sum_sq(x, D);
  const float r = 1.0f / std::sqrt(ss / static_cast<float>(D) + eps);
  for (int64_t i = 0; i < D; ++i) y[i] = (x[i] * r) * w[i];
  return r;
}

}  // namespace

namespace detail {

RmsnormShape check_rmsnorm_forward(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& w) {
  check_dtype(x, DType::F32, "rmsnorm_forward: x (T, D)");
  check_shape(x, {-1, -1}, "rmsnorm_forward: x (T, D)");
  check_rows(x, "rmsnorm_forward: x (T, D)");
  const int64_t T = x.shape[0], D = x.shape[1];
  check_mat(y, T, D, "rmsnorm_forward: y (T, D)");
  check_vec(w, D, "rmsnorm_forward: w (D,)");
  if (rstd.ndim != 0) check_vec(rstd, T, "rmsnorm_forward: rstd (T,)");
  return {T, D};
}

RmsnormShape check_add_rmsnorm_forward(const Tensor& y, const Tensor& h_out, const Tensor& rstd,
                                       const Tensor& x, const Tensor& r, const Tensor& w) {
  check_dtype(x, DType::F32, "add_rmsnorm_forward: x (T, D)");
  check_shape(x, {-1, -1}, "add_rmsnorm_forward: x (T, D)");
  check_rows(x, "add_rmsnorm_forward: x (T, D)");
  const int64_t T = x.shape[0], D = x.shape[1];
  check_mat(r, T, D, "add_rmsnorm_forward: r (T, D)");
  check_mat(h_out, T, D, "add_rmsnorm_forward: h_out (T, D)");
  check_mat(y, T, D, "add_rmsnorm_forward: y (T, D)");
  check_vec(w, D, "add_rmsnorm_forward: w (D,)");
  if (rstd.ndim != 0) check_vec(rstd, T, "add_rmsnorm_forward: rstd (T,)");
  return {T, D};
}

RmsnormShape check_rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                                    const Tensor& w, const Tensor& rstd) {
  check_dtype(x, DType::F32, "rmsnorm_backward: x (T, D)");
  check_shape(x, {-1, -1}, "rmsnorm_backward: x (T, D)");
  check_rows(x, "rmsnorm_backward: x (T, D)");
  const int64_t T = x.shape[0], D = x.shape[1];
  check_mat(dy, T, D, "rmsnorm_backward: dy (T, D)");
  check_mat(dx, T, D, "rmsnorm_backward: dx (T, D)");
  check_vec(w, D, "rmsnorm_backward: w (D,)");
  check_vec(dw, D, "rmsnorm_backward: dw (D,)");
  check_vec(rstd, T, "rmsnorm_backward: rstd (T,)");
  return {T, D};
}

}  // namespace detail

void rmsnorm_forward(const Context& ctx, Tensor y, Tensor rstd, const Tensor& x, const Tensor& w, float eps) {
  LS_GPU_DISPATCH(ctx, rmsnorm_forward, y, rstd, x, w, eps);
  const auto [T, D] = detail::check_rmsnorm_forward(y, rstd, x, w);
  const bool keep = rstd.ndim != 0;
  const float* xp = x.f32();
  const float* wp = w.f32();
  float* yp = y.f32();
  float* rp = keep ? rstd.f32() : nullptr;
  ctx.parallel_for(
      T,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          const float r = norm_row(yp + t * y.stride[0], xp + t * x.stride[0], wp, D, eps);
          if (rp) rp[t] = r;
        }
      },
      row_grain(D));
}

void add_rmsnorm_forward(const Context& ctx, Tensor y, Tensor h_out, Tensor rstd, const Tensor& x,
                         const Tensor& r, const Tensor& w, float eps) {
  LS_GPU_DISPATCH(ctx, add_rmsnorm_forward, y, h_out, rstd, x, r, w, eps);
  const auto [T, D] = detail::check_add_rmsnorm_forward(y, h_out, rstd, x, r, w);
  const bool keep = rstd.ndim != 0;
  const float* xp = x.f32();
  const float* ap = r.f32();
  const float* wp = w.f32();
  float* hp = h_out.f32();
  float* yp = y.f32();
  float* rp = keep ? rstd.f32() : nullptr;
  ctx.parallel_for(
      T,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          const float* xr = xp + t * x.stride[0];
          const float* ar = ap + t * r.stride[0];
          float* hr = hp + t * h_out.stride[0];
          for (int64_t i = 0; i < D; ++i) hr[i] = xr[i] + ar[i];
          const float rs = norm_row(yp + t * y.stride[0], hr, wp, D, eps);
          if (rp) rp[t] = rs;
        }
      },
      row_grain(D));
}

void rmsnorm_backward(const Context& ctx, Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x,
                      const Tensor& w, const Tensor& rstd) {
  LS_GPU_DISPATCH(ctx, rmsnorm_backward, dx, dw, dy, x, w, rstd);
  const auto [T, D] = detail::check_rmsnorm_backward(dx, dw, dy, x, w, rstd);
  const float* xp = x.f32();
  const float* gp = dy.f32();
  const float* wp = w.f32();
  const float* rp = rstd.f32();
  float* dxp = dx.f32();
  float* dwp = dw.f32();

  // dw first: it reads dy, which dx may overwrite. Columns split, tokens in order.
  ctx.parallel_for(
      D,
      [&](int64_t c0, int64_t c1) {
        for (int64_t t = 0; t < T; ++t) {
          const float* g = gp + t * dy.stride[0];
          const float* xr = xp + t * x.stride[0];
          const float rs = rp[t];
          for (int64_t c = c0; c < c1; ++c) dwp[c] = dwp[c] + (g[c] * xr[c]) * rs;
        }
      },
      256);

  ctx.parallel_for(
      T,
      [&](int64_t t0, int64_t t1) {
        std::vector<float> gw(static_cast<size_t>(D));  // (D) dy * w of one row
        for (int64_t t = t0; t < t1; ++t) {
          const float* g = gp + t * dy.stride[0];
          const float* xr = xp + t * x.stride[0];
          float* out = dxp + t * dx.stride[0];
          const float rs = rp[t];
          for (int64_t i = 0; i < D; ++i) gw[size_t(i)] = g[i] * wp[i];
          const float c = ((canonical_dot(gw.data(), xr, D) / static_cast<float>(D)) * rs) * rs * rs;
          for (int64_t i = 0; i < D; ++i) out[i] = gw[size_t(i)] * rs - c * xr[i];
        }
      },
      row_grain(D));
}

}  // namespace lockstep::kernels
