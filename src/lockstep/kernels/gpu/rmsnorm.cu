// GPU RMSNorm (kernels/cpu/rmsnorm.h): forward, fused residual add + forward,
// backward. A row is reduced by 16 threads, thread l owning the CPU's canonical
// lane l (elements l, l + 16, ... in index order), then the fixed tree.
#include "lockstep/kernels/cpu/rmsnorm.h"
#include "lockstep/kernels/gpu/registry.h"
#include "lockstep/kernels/gpu/row_lanes.h"
#include "lockstep/kernels/gpu/rmsnorm.h"
#include "lockstep/kernels/numerics.h"

namespace lockstep::kernels::gpu::LS_GPU_NS {

namespace {

using ::lockstep::gpu::blocks_for;
using ::lockstep::gpu::ls_add;
using ::lockstep::gpu::ls_div;
using ::lockstep::gpu::ls_fma;
using ::lockstep::gpu::ls_mul;
using ::lockstep::gpu::ls_sqrt;
using ::lockstep::gpu::ls_sub;


// rstd = 1 / sqrt(ss / D + eps), as norm_row (IEEE division and sqrt).
LS_DEVICE inline float rstd_of(float ss, int64_t D, float eps) {
  return ls_div(1.0f, ls_sqrt(ls_add(ls_div(ss, static_cast<float>(D)), eps)));
}

// Block (16, R) over R rows: threadIdx.x is the lane, threadIdx.y the row in
// the block. Rows past T still reach the barrier. y may alias x: every thread
// writes only its own elements, after the barrier that ends all reads of x.
LS_GLOBAL void rmsnorm_forward_kernel(float* y, int64_t ldy, float* rstd, const float* x, int64_t ldx,
                                      const float* w, int64_t T, int64_t D, float eps) {
  LS_SHARED(float, part, kSlots);  // (R, 16) lane partials of the block's rows
  const int lane = static_cast<int>(threadIdx.x), r = static_cast<int>(threadIdx.y);
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.y + r;
  const bool live = t < T;
  float acc = 0.0f;
  if (live) {
    const float* xr = x + t * ldx;
    for (int64_t i = lane; i < D; i += kLanes) acc = ls_fma(xr[i], xr[i], acc);
  }
  part[r * kLanes + lane] = acc;
  __syncthreads();
  if (!live) return;
  const float rs = rstd_of(tree_of(part + r * kLanes), D, eps);
  const float* xr = x + t * ldx;
  float* yr = y + t * ldy;
  for (int64_t i = lane; i < D; i += kLanes) yr[i] = ls_mul(ls_mul(xr[i], rs), w[i]);
  if (rstd != nullptr && lane == 0) rstd[t] = rs;
}

// h = x + res, then the forward on h. h may alias x or res (each element is
// read and written by one thread, in that order); y must not alias h.
LS_GLOBAL void add_rmsnorm_forward_kernel(float* y, int64_t ldy, float* h, int64_t ldh, float* rstd,
                                          const float* x, int64_t ldx, const float* res, int64_t ldr,
                                          const float* w, int64_t T, int64_t D, float eps) {
  LS_SHARED(float, part, kSlots);  // (R, 16) lane partials of the block's rows
  const int lane = static_cast<int>(threadIdx.x), r = static_cast<int>(threadIdx.y);
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.y + r;
  const bool live = t < T;
  float acc = 0.0f;
  if (live) {
    const float* xr = x + t * ldx;
    const float* rr = res + t * ldr;
    float* hr = h + t * ldh;
    for (int64_t i = lane; i < D; i += kLanes) {
      const float v = ls_add(xr[i], rr[i]);
      hr[i] = v;
      acc = ls_fma(v, v, acc);
    }
  }
  part[r * kLanes + lane] = acc;
  __syncthreads();
  if (!live) return;
  const float rs = rstd_of(tree_of(part + r * kLanes), D, eps);
  const float* hr = h + t * ldh;
  float* yr = y + t * ldy;
  for (int64_t i = lane; i < D; i += kLanes) yr[i] = ls_mul(ls_mul(hr[i], rs), w[i]);
  if (rstd != nullptr && lane == 0) rstd[t] = rs;
}

// dx of one row per 16 threads: c = ((dot(dy * w, x) / D) * rstd) * rstd * rstd,
// dx = (dy * w) * rstd - c * x. dx may alias dy, as in the forward's y and x.
LS_GLOBAL void rmsnorm_dx_kernel(float* dx, int64_t lddx, const float* dy, int64_t lddy, const float* x,
                                 int64_t ldx, const float* w, const float* rstd, int64_t T, int64_t D) {
  LS_SHARED(float, part, kSlots);  // (R, 16) lane partials of the block's rows
  const int lane = static_cast<int>(threadIdx.x), r = static_cast<int>(threadIdx.y);
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.y + r;
  const bool live = t < T;
  float acc = 0.0f;
  if (live) {
    const float* g = dy + t * lddy;
    const float* xr = x + t * ldx;
    for (int64_t i = lane; i < D; i += kLanes) acc = ls_fma(ls_mul(g[i], w[i]), xr[i], acc);
  }
  part[r * kLanes + lane] = acc;
  __syncthreads();
  if (!live) return;
  const float rs = rstd[t];
  const float c =
      ls_mul(ls_mul(ls_mul(ls_div(tree_of(part + r * kLanes), static_cast<float>(D)), rs), rs), rs);
  const float* g = dy + t * lddy;
  const float* xr = x + t * ldx;
  float* out = dx + t * lddx;
  for (int64_t i = lane; i < D; i += kLanes)
    out[i] = ls_sub(ls_mul(ls_mul(g[i], w[i]), rs), ls_mul(c, xr[i]));
}

// dw[c] += (dy[t, c] * x[t, c]) * rstd[t] for t = 0..T-1 in token order: one
// thread per column keeps the CPU's order (no split over tokens, no atomics).
LS_GLOBAL void rmsnorm_dw_kernel(float* dw, const float* dy, int64_t lddy, const float* x, int64_t ldx,
                                 const float* rstd, int64_t T, int64_t D) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= D) return;
  float acc = dw[c];
  for (int64_t t = 0; t < T; ++t)
    acc = ls_add(acc, ls_mul(ls_mul(dy[t * lddy + c], x[t * ldx + c]), rstd[t]));
  dw[c] = acc;
}

void check_launch(const RmsnormLaunch& cfg) {
  LS_CHECK(cfg.rows_per_block >= 1 && cfg.rows_per_block <= kMaxRows)
      << "RmsnormLaunch: rows_per_block must be in [1, " << kMaxRows << "], got " << cfg.rows_per_block;
  LS_CHECK(cfg.dw_threads >= 1 && cfg.dw_threads <= 1024)
      << "RmsnormLaunch: dw_threads must be in [1, 1024], got " << cfg.dw_threads;
}

dim3 row_grid(int64_t T, const RmsnormLaunch& cfg) {
  return dim3(blocks_for(T, cfg.rows_per_block));
}
dim3 row_block(const RmsnormLaunch& cfg) {
  return dim3(kLanes, static_cast<unsigned>(cfg.rows_per_block));
}

}  // namespace

void rmsnorm_forward(const Context& ctx, Tensor y, Tensor rstd, const Tensor& x, const Tensor& w, float eps,
                     const RmsnormLaunch& cfg) {
  const auto [T, D] = kernels::detail::check_rmsnorm_forward(y, rstd, x, w);
  check_launch(cfg);
  if (T == 0) return;
  LS_LAUNCH(ctx, rmsnorm_forward_kernel, row_grid(T, cfg), row_block(cfg))
  (y.f32(), y.stride[0], rstd.ndim != 0 ? rstd.f32() : nullptr, x.f32(), x.stride[0], w.f32(), T, D, eps);
}

void add_rmsnorm_forward(const Context& ctx, Tensor y, Tensor h_out, Tensor rstd, const Tensor& x,
                         const Tensor& r, const Tensor& w, float eps, const RmsnormLaunch& cfg) {
  const auto [T, D] = kernels::detail::check_add_rmsnorm_forward(y, h_out, rstd, x, r, w);
  check_launch(cfg);
  if (T == 0) return;
  LS_LAUNCH(ctx, add_rmsnorm_forward_kernel, row_grid(T, cfg), row_block(cfg))
  (y.f32(), y.stride[0], h_out.f32(), h_out.stride[0], rstd.ndim != 0 ? rstd.f32() : nullptr, x.f32(),
   x.stride[0], r.f32(), r.stride[0], w.f32(), T, D, eps);
}

void rmsnorm_backward(const Context& ctx, Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x,
                      const Tensor& w, const Tensor& rstd, const RmsnormLaunch& cfg) {
  const auto [T, D] = kernels::detail::check_rmsnorm_backward(dx, dw, dy, x, w, rstd);
  check_launch(cfg);
  if (T == 0 || D == 0) return;
  // dw first: it reads dy, which dx may overwrite (launches run in order).
  LS_LAUNCH(ctx, rmsnorm_dw_kernel, dim3(blocks_for(D, cfg.dw_threads)),
            dim3(static_cast<unsigned>(cfg.dw_threads)))
  (dw.f32(), dy.f32(), dy.stride[0], x.f32(), x.stride[0], rstd.f32(), T, D);
  LS_LAUNCH(ctx, rmsnorm_dx_kernel, row_grid(T, cfg), row_block(cfg))
  (dx.f32(), dx.stride[0], dy.f32(), dy.stride[0], x.f32(), x.stride[0], w.f32(), rstd.f32(), T, D);
}

void rmsnorm_forward(const Context& ctx, Tensor y, Tensor rstd, const Tensor& x, const Tensor& w, float eps) {
  rmsnorm_forward(ctx, y, rstd, x, w, eps, RmsnormLaunch{});
}
void add_rmsnorm_forward(const Context& ctx, Tensor y, Tensor h_out, Tensor rstd, const Tensor& x,
                         const Tensor& r, const Tensor& w, float eps) {
  add_rmsnorm_forward(ctx, y, h_out, rstd, x, r, w, eps, RmsnormLaunch{});
}
void rmsnorm_backward(const Context& ctx, Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x,
                      const Tensor& w, const Tensor& rstd) {
  rmsnorm_backward(ctx, dx, dw, dy, x, w, rstd, RmsnormLaunch{});
}

void register_rmsnorm(GpuBackend& b) {
  b.rmsnorm_forward = rmsnorm_forward;
  b.add_rmsnorm_forward = add_rmsnorm_forward;
  b.rmsnorm_backward = rmsnorm_backward;
}

}  // namespace lockstep::kernels::gpu::LS_GPU_NS
