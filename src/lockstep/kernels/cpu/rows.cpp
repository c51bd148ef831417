// Row-wise adds and the elementwise sigmoid (rows.h): rows split across
// threads, one f32 operation per element in a fixed form, so neither the
// thread count nor the batch can change a bit.
#include "lockstep/kernels/cpu/rows.h"

#include <algorithm>
#include <string>

#include "lockstep/base/error.h"
#include "lockstep/kernels/cpu/simd.h"
#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::kernels {

namespace {

// Rows per thread task for a pass over rows of `width` floats: a task should
// move at least ~256 KB, else waking a second thread (tens of microseconds)
// costs more than it saves (decode batches are a few rows).
int64_t row_grain(int64_t width) {
  return std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, width));
}

void check_mat(const Tensor& t, int64_t T, int64_t N, const std::string& what) {
  check_dtype(t, DType::F32, what.c_str());
  check_shape(t, {T, N}, what.c_str());
  if (N > 1 && t.stride[1] != 1)
    LS_THROW << what << ": rows must have unit column stride, got " << t.shape_str() << " with strides ("
             << t.stride[0] << ", " << t.stride[1] << ")";
}

int64_t rows_of(const Tensor& t, const char* what) {
  if (t.ndim != 2) LS_THROW << what << ": expected a 2-D tensor, got " << t.shape_str();
  return t.shape[0];
}

}  // namespace

namespace detail {

RowsShape check_add_row_bias(const Tensor& y, const Tensor& b) {
  const int64_t T = rows_of(y, "add_row_bias: y (T, N)"), N = y.shape[1];
  check_mat(y, T, N, "add_row_bias: y (T, N)");
  check_dtype(b, DType::F32, "add_row_bias: bias (N)");
  check_shape(b, {N}, "add_row_bias: bias (N)");
  if (N > 1 && b.stride[0] != 1) LS_THROW << "add_row_bias: bias (N) must be contiguous";
  return {T, N};
}

RowsShape check_add_rows(const Tensor& out, const Tensor& a, const Tensor& b) {
  const int64_t T = rows_of(out, "add_rows: out (T, N)"), N = out.shape[1];
  check_mat(out, T, N, "add_rows: out (T, N)");
  check_mat(a, T, N, "add_rows: a (T, N)");
  check_mat(b, T, N, "add_rows: b (T, N)");
  return {T, N};
}

RowsShape check_add_scaled_rows(const Tensor& y, const Tensor& x, const Tensor& s) {
  const int64_t T = rows_of(y, "add_scaled_rows: y (T, N)"), N = y.shape[1];
  check_mat(y, T, N, "add_scaled_rows: y (T, N)");
  check_mat(x, T, N, "add_scaled_rows: x (T, N)");
  if (s.data != nullptr) {
    check_dtype(s, DType::F32, "add_scaled_rows: s (T)");
    if (s.numel() != T || !s.is_contiguous())
      LS_THROW << "add_scaled_rows: s must hold T = " << T << " contiguous scales, got " << s.shape_str();
  }
  return {T, N};
}

int64_t check_sigmoid(const Tensor& y, const Tensor& x) {
  check_dtype(x, DType::F32, "sigmoid_forward: x");
  check_dtype(y, DType::F32, "sigmoid_forward: y");
  if (!x.is_contiguous() || !y.is_contiguous() || x.numel() != y.numel())
    LS_THROW << "sigmoid_forward: x and y must be contiguous with the same size, got " << x.shape_str()
             << " and " << y.shape_str();
  return x.numel();
}

}  // namespace detail

void add_row_bias(const Context& ctx, Tensor y, const Tensor& b) {
  LS_GPU_DISPATCH(ctx, add_row_bias, y, b);
  const auto [T, N] = detail::check_add_row_bias(y, b);
  const float* bp = b.f32();
  float* yp = y.f32();
  const int64_t ys = y.stride[0];
  ctx.parallel_for(
      T,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t)
          for (int64_t n = 0; n < N; ++n) yp[t * ys + n] = yp[t * ys + n] + bp[n];
      },
      row_grain(N));
}

void add_rows(const Context& ctx, Tensor out, const Tensor& a, const Tensor& b) {
  LS_GPU_DISPATCH(ctx, add_rows, out, a, b);
  const auto [T, N] = detail::check_add_rows(out, a, b);
  float* o = out.f32();
  const float *ap = a.f32(), *bp = b.f32();
  ctx.parallel_for(
      T,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t)
          for (int64_t n = 0; n < N; ++n)
            o[t * out.stride[0] + n] = ap[t * a.stride[0] + n] + bp[t * b.stride[0] + n];
      },
      row_grain(N));
}

void add_scaled_rows(const Context& ctx, Tensor y, const Tensor& x, const Tensor& s) {
  LS_GPU_DISPATCH(ctx, add_scaled_rows, y, x, s);
  const auto [T, N] = detail::check_add_scaled_rows(y, x, s);
  float* yp = y.f32();
  const float* xp = x.f32();
  const float* g = s.data != nullptr ? s.f32() : nullptr;
  ctx.parallel_for(
      T,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          float* yr = yp + t * y.stride[0];
          const float* xr = xp + t * x.stride[0];
          for (int64_t n = 0; n < N; ++n) yr[n] = yr[n] + (g ? xr[n] * g[t] : xr[n]);
        }
      },
      row_grain(N));
}

void sigmoid_forward(const Context& ctx, Tensor y, const Tensor& x) {
  LS_GPU_DISPATCH(ctx, sigmoid_forward, y, x);
  const int64_t n = detail::check_sigmoid(y, x);
  if (n > 0) vsigmoid(x.f32(), y.f32(), n);
}

}  // namespace lockstep::kernels
