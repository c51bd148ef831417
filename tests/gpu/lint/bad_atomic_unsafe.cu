// Planted for the float lint (scripts/gpu-lint.py --planted): bad_atomic.cu
// built for gfx90a with -munsafe-fp-atomics, where the global float atomicAdd
// is the hardware global_atomic_add_f32 (no IR atomicrmw: HIP's unsafe-atomics
// header calls the intrinsics).
// Not built into any library.
// LINT-DROP-FLAG(gfx90a): -mno-unsafe-fp-atomics
// LINT-ADD-FLAG(gfx90a): -munsafe-fp-atomics
// LINT-EXPECT(gfx90a): global_atomic_add_f32
// LINT-EXPECT(gfx90a): ds_add(_rtn)?_f32
#include "lockstep/kernels/gpu/portable.h"

LS_GLOBAL void planted_atomic(float* y, const float* x) {
  LS_SHARED(float, total, 1);
  if (threadIdx.x == 0) total[0] = 0.0f;
  __syncthreads();
  atomicAdd(&total[0], x[threadIdx.x]);
  atomicAdd(&y[1], x[threadIdx.x]);
  __syncthreads();
  if (threadIdx.x == 0) y[0] = total[0];
}
