// The stream helpers of DeepSeek-V4's hyper-connections (streams.h): rows
// split across threads, one f32 operation (or copy) per element.
#include "lockstep/kernels/cpu/streams.h"

#include <algorithm>
#include <cstring>

#include "lockstep/base/error.h"
#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::kernels {

namespace {

void check_rows(const Tensor& t, int64_t T, int64_t W, const std::string& what) {
  check_dtype(t, DType::F32, what.c_str());
  check_shape(t, {T, W}, what.c_str());
  if ((W > 1 && t.stride[1] != 1) || (T > 1 && t.stride[0] < W))
    LS_THROW << what << ": rows must have unit column stride and stride[0] >= width, got " << t.shape_str()
             << " with strides (" << t.stride[0] << ", " << t.stride[1] << ")";
}

// Tokens per task: a token touches about n*D values.
int64_t token_grain(int64_t width) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(width, 1));
}

}  // namespace

namespace detail {

StreamsShape check_streams(const Tensor& streams, const Tensor& one, int64_t n, const char* fn,
                           const char* streams_name, const char* one_name) {
  const std::string f = fn;
  if (n < 1) LS_THROW << f << ": n (hc_mult) must be >= 1, got " << n;
  check_dtype(one, DType::F32, (f + ": " + one_name + " (T, D)").c_str());
  check_shape(one, {-1, -1}, (f + ": " + one_name + " (T, D)").c_str());
  const int64_t T = one.shape[0], D = one.shape[1];
  check_rows(one, T, D, f + ": " + one_name + " (T, D)");
  check_rows(streams, T, n * D, f + ": " + streams_name + " (T, n*D)");
  return {T, D};
}

}  // namespace detail

void add_to_streams(const Context& ctx, Tensor x, const Tensor& e, int64_t n) {
  LS_GPU_DISPATCH(ctx, add_to_streams, x, e, n);
  const auto [T, D] = detail::check_streams(x, e, n, "add_to_streams", "x", "e");
  ctx.parallel_for(
      T,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          const float* a = e.f32() + t * e.stride[0];
          for (int64_t i = 0; i < n; ++i) {
            float* o = x.f32() + t * x.stride[0] + i * D;
            for (int64_t d = 0; d < D; ++d) o[d] = o[d] + a[d];
          }
        }
      },
      token_grain(n * D));
}

void repeat_streams(const Context& ctx, Tensor x, const Tensor& e, int64_t n) {
  LS_GPU_DISPATCH(ctx, repeat_streams, x, e, n);
  const auto [T, D] = detail::check_streams(x, e, n, "repeat_streams", "x", "e");
  ctx.parallel_for(
      T,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t)
          for (int64_t i = 0; i < n; ++i)
            std::memcpy(x.f32() + t * x.stride[0] + i * D, e.f32() + t * e.stride[0],
                        size_t(D) * sizeof(float));
      },
      token_grain(n * D));
}

void sum_streams(const Context& ctx, Tensor de, const Tensor& dx, int64_t n) {
  LS_GPU_DISPATCH(ctx, sum_streams, de, dx, n);
  const auto [T, D] = detail::check_streams(dx, de, n, "sum_streams", "dx", "de");
  ctx.parallel_for(
      T,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          float* o = de.f32() + t * de.stride[0];
          const float* g = dx.f32() + t * dx.stride[0];
          for (int64_t d = 0; d < D; ++d) {
            float acc = g[d];
            for (int64_t i = 1; i < n; ++i) acc = acc + g[i * D + d];
            o[d] = acc;
          }
        }
      },
      token_grain(n * D));
}

}  // namespace lockstep::kernels
