// GPU stream helpers of DeepSeek-V4's hyper-connections (kernels/cpu/streams.h):
// one thread per element, the CPU's one f32 add per element (sums in stream
// order), copies as 32-bit words so every bit pattern (NaN payloads
// included) is kept.
#include "lockstep/kernels/cpu/streams.h"
#include "lockstep/kernels/gpu/mhc.h"
#include "lockstep/kernels/gpu/registry.h"

namespace lockstep::kernels::gpu::LS_GPU_NS {

namespace {

using ::lockstep::gpu::blocks_for;
using ::lockstep::gpu::ls_add;

// x[t, i*D + d] = x[t, i*D + d] + e[t, d] over the (t, i, d) elements.
LS_GLOBAL void add_to_streams_kernel(float* x, int64_t ldx, const float* e, int64_t lde, int64_t T, int64_t n,
                                     int64_t D) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= T * n * D) return;
  const int64_t t = k / (n * D), j = k % (n * D);
  x[t * ldx + j] = ls_add(x[t * ldx + j], e[t * lde + j % D]);
}

LS_GLOBAL void repeat_streams_kernel(uint32_t* x, int64_t ldx, const uint32_t* e, int64_t lde, int64_t T,
                                     int64_t n, int64_t D) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= T * n * D) return;
  const int64_t t = k / (n * D), j = k % (n * D);
  x[t * ldx + j] = e[t * lde + j % D];
}

// de[t, d] = ((dx_0 + dx_1) + dx_2) ... over the (t, d) elements; every input
// of an element is read before it is written (de may alias the first stream).
LS_GLOBAL void sum_streams_kernel(float* de, int64_t lde, const float* dx, int64_t ldx, int64_t T, int64_t n,
                                  int64_t D) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= T * D) return;
  const int64_t t = k / D, d = k % D;
  const float* g = dx + t * ldx;
  float acc = g[d];
  for (int64_t i = 1; i < n; ++i) acc = ls_add(acc, g[i * D + d]);
  de[t * lde + d] = acc;
}

dim3 grid_over(int64_t n, const MhcLaunch& launch) {
  return dim3(blocks_for(n, launch.threads));
}
dim3 block_of(const MhcLaunch& launch) {
  return dim3(static_cast<unsigned>(launch.threads));
}

}  // namespace

void add_to_streams(const Context& ctx, Tensor x, const Tensor& e, int64_t n, const MhcLaunch& launch) {
  const auto [T, D] = kernels::detail::check_streams(x, e, n, "add_to_streams", "x", "e");
  check_mhc_launch(launch);
  if (T * D == 0) return;
  LS_LAUNCH(ctx, add_to_streams_kernel, grid_over(T * n * D, launch), block_of(launch))
  (x.f32(), x.stride[0], e.f32(), e.stride[0], T, n, D);
}

void repeat_streams(const Context& ctx, Tensor x, const Tensor& e, int64_t n, const MhcLaunch& launch) {
  const auto [T, D] = kernels::detail::check_streams(x, e, n, "repeat_streams", "x", "e");
  check_mhc_launch(launch);
  if (T * D == 0) return;
  LS_LAUNCH(ctx, repeat_streams_kernel, grid_over(T * n * D, launch), block_of(launch))
  (static_cast<uint32_t*>(x.data), x.stride[0], static_cast<const uint32_t*>(e.data), e.stride[0], T, n, D);
}

void sum_streams(const Context& ctx, Tensor de, const Tensor& dx, int64_t n, const MhcLaunch& launch) {
  const auto [T, D] = kernels::detail::check_streams(dx, de, n, "sum_streams", "dx", "de");
  check_mhc_launch(launch);
  if (T * D == 0) return;
  LS_LAUNCH(ctx, sum_streams_kernel, grid_over(T * D, launch), block_of(launch))
  (de.f32(), de.stride[0], dx.f32(), dx.stride[0], T, n, D);
}

}  // namespace lockstep::kernels::gpu::LS_GPU_NS
