// GPU row-wise adds and sigmoid (kernels/cpu/rows.h): one thread per element,
// the CPU's one f32 operation per element through float_ops.h (a product is
// rounded before its add, as the CPU's unfused code does), sigmoid from
// kernels/numerics.h (vsigmoid's bits).
#include "lockstep/kernels/cpu/rows.h"
#include "lockstep/kernels/gpu/registry.h"
#include "lockstep/kernels/gpu/rows.h"
#include "lockstep/kernels/numerics.h"

namespace lockstep::kernels::gpu::LS_GPU_NS {

namespace {

using ::lockstep::gpu::blocks_for;
using ::lockstep::gpu::ls_add;
using ::lockstep::gpu::ls_mul;

// A (T, N) operand: base pointer and row stride (unit column stride).
struct Rows {
  float* p;
  int64_t ld;
};
struct ConstRows {
  const float* p;
  int64_t ld;
};

LS_GLOBAL void add_row_bias_kernel(Rows y, const float* b, int64_t T, int64_t N) {
  const int64_t n = T * N;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += step) {
    const int64_t t = k / N, j = k % N;
    y.p[t * y.ld + j] = ls_add(y.p[t * y.ld + j], b[j]);
  }
}

// out may alias a or b element for element: each thread reads its element's
// inputs before writing it.
LS_GLOBAL void add_rows_kernel(Rows out, ConstRows a, ConstRows b, int64_t T, int64_t N) {
  const int64_t n = T * N;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += step) {
    const int64_t t = k / N, j = k % N;
    out.p[t * out.ld + j] = ls_add(a.p[t * a.ld + j], b.p[t * b.ld + j]);
  }
}

// y += x * s[t] (the product rounded first), or y += x when s is null.
LS_GLOBAL void add_scaled_rows_kernel(Rows y, ConstRows x, const float* s, int64_t T, int64_t N) {
  const int64_t n = T * N;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += step) {
    const int64_t t = k / N, j = k % N;
    const float xv = x.p[t * x.ld + j];
    y.p[t * y.ld + j] = ls_add(y.p[t * y.ld + j], s != nullptr ? ls_mul(xv, s[t]) : xv);
  }
}

LS_GLOBAL void sigmoid_kernel(float* y, const float* x, int64_t n) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += step)
    y[k] = num::sigmoid(x[k]);
}

Rows rows(const Tensor& t) {
  return {t.f32(), t.stride[0]};
}
ConstRows const_rows(const Tensor& t) {
  return {t.f32(), t.stride[0]};
}
dim3 block_of(const RowsLaunch& cfg) {
  return dim3(static_cast<unsigned>(cfg.threads));
}

}  // namespace

void check_rows_launch(const RowsLaunch& cfg) {
  LS_CHECK(cfg.threads >= 1 && cfg.threads <= 1024)
      << "RowsLaunch: threads must be in [1, 1024], got " << cfg.threads;
  LS_CHECK(cfg.max_blocks >= 0) << "RowsLaunch: max_blocks must be >= 0, got " << cfg.max_blocks;
}

unsigned rows_grid(int64_t n, const RowsLaunch& cfg) {
  const unsigned blocks = blocks_for(n, cfg.threads);
  return cfg.max_blocks > 0 && blocks > static_cast<unsigned>(cfg.max_blocks)
             ? static_cast<unsigned>(cfg.max_blocks)
             : blocks;
}

void add_row_bias(const Context& ctx, Tensor y, const Tensor& b, const RowsLaunch& cfg) {
  const auto [T, N] = kernels::detail::check_add_row_bias(y, b);
  check_rows_launch(cfg);
  if (T * N == 0) return;
  LS_LAUNCH(ctx, add_row_bias_kernel, dim3(rows_grid(T * N, cfg)), block_of(cfg))(rows(y), b.f32(), T, N);
}

void add_rows(const Context& ctx, Tensor out, const Tensor& a, const Tensor& b, const RowsLaunch& cfg) {
  const auto [T, N] = kernels::detail::check_add_rows(out, a, b);
  check_rows_launch(cfg);
  if (T * N == 0) return;
  LS_LAUNCH(ctx, add_rows_kernel, dim3(rows_grid(T * N, cfg)), block_of(cfg))
  (rows(out), const_rows(a), const_rows(b), T, N);
}

void add_scaled_rows(const Context& ctx, Tensor y, const Tensor& x, const Tensor& s, const RowsLaunch& cfg) {
  const auto [T, N] = kernels::detail::check_add_scaled_rows(y, x, s);
  check_rows_launch(cfg);
  if (T * N == 0) return;
  const float* sp = s.data != nullptr ? s.f32() : nullptr;
  LS_LAUNCH(ctx, add_scaled_rows_kernel, dim3(rows_grid(T * N, cfg)), block_of(cfg))
  (rows(y), const_rows(x), sp, T, N);
}

void sigmoid_forward(const Context& ctx, Tensor y, const Tensor& x, const RowsLaunch& cfg) {
  const int64_t n = kernels::detail::check_sigmoid(y, x);
  check_rows_launch(cfg);
  if (n == 0) return;
  LS_LAUNCH(ctx, sigmoid_kernel, dim3(rows_grid(n, cfg)), block_of(cfg))(y.f32(), x.f32(), n);
}

void add_row_bias(const Context& ctx, Tensor y, const Tensor& b) {
  add_row_bias(ctx, y, b, RowsLaunch{});
}
void add_rows(const Context& ctx, Tensor out, const Tensor& a, const Tensor& b) {
  add_rows(ctx, out, a, b, RowsLaunch{});
}
void add_scaled_rows(const Context& ctx, Tensor y, const Tensor& x, const Tensor& s) {
  add_scaled_rows(ctx, y, x, s, RowsLaunch{});
}
void sigmoid_forward(const Context& ctx, Tensor y, const Tensor& x) {
  sigmoid_forward(ctx, y, x, RowsLaunch{});
}

void register_rows(GpuBackend& b) {
  b.add_row_bias = add_row_bias;
  b.add_rows = add_rows;
  b.add_scaled_rows = add_scaled_rows;
  b.sigmoid_forward = sigmoid_forward;
  b.fp8_quantize_rows = fp8_quantize_rows;
}

}  // namespace lockstep::kernels::gpu::LS_GPU_NS
