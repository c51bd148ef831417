// The float lint's positive control (scripts/gpu-lint.py): every explicitly
// rounded op of portable.h, int64 index arithmetic (its division expands to a
// float reciprocal on AMD), shared memory and a 16-lane tree. Must lint clean.
// Not built into any library.
#include "lockstep/kernels/gpu/portable.h"

namespace lockstep::gpu::lint {

// y[block] = the 16-lane sum of sqrt(a*b + c) / (a - b) + a*b; i over rows x cols.
LS_GLOBAL void all_ops(float* y, const float* a, const float* b, const float* c, int64_t rows, int64_t cols) {
  LS_SHARED(float, lanes, 16);
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t r = i / cols, k = i % cols;  // integer division: allowed
  // A divisor whose high word is known zero: LLVM keeps 2^32 in a register.
  const int64_t q = i / static_cast<int64_t>(static_cast<uint32_t>(rows));
  float v = 0.0f;
  if (r < rows) {
    const float p = ls_mul(a[i], b[i]);
    v = ls_add(ls_div(ls_sqrt(ls_fma(a[i], b[i], c[k])), ls_sub(a[i], b[i])), p);
  }
  if (threadIdx.x < 16) lanes[threadIdx.x] = v;
  __syncthreads();
  for (unsigned s = 8; s > 0; s /= 2) {
    if (threadIdx.x < s) lanes[threadIdx.x] = ls_add(lanes[threadIdx.x], lanes[threadIdx.x + s]);
    __syncthreads();
  }
  if (threadIdx.x == 0) y[blockIdx.x] = lanes[0];
  if (threadIdx.x == 1) y[gridDim.x + q] = lanes[1];
}

}  // namespace lockstep::gpu::lint
