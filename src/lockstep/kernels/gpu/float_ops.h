// Explicitly rounded float operations and the __host__ __device__ markers,
// shared by the GPU kernel sources (through portable.h) and by the scalar
// numerics the CPU kernels use too (kernels/numerics.h). Includes nothing of
// the emulator, so CPU code can include it.
#pragma once

#include <cstdint>

#if defined(__CUDACC__) || defined(__HIPCC__)
#if defined(__HIPCC__)
#include <hip/hip_runtime.h>
#else
#include <cuda_runtime.h>
#endif
#define LS_DEVICE __device__
#define LS_HD __host__ __device__
#define LS_INLINE __forceinline__
#else
#define LS_DEVICE
#define LS_HD
#define LS_INLINE inline
#endif

namespace lockstep::gpu {

// Explicitly rounded float operations: one IEEE round-to-nearest-even each,
// never fused, never flushed. The host forms are plain C++ under
// -ffp-contract=off, which the build sets for every compiler. So are HIP's
// __fadd_rn / __fmul_rn (clang headers): on AMD only -ffp-contract=off keeps
// them unfused, and the gfx90a lint checks the IR for it (docs/gpu.md).
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
LS_HD LS_INLINE float ls_add(float a, float b) { return __fadd_rn(a, b); }
LS_HD LS_INLINE float ls_sub(float a, float b) { return __fsub_rn(a, b); }
LS_HD LS_INLINE float ls_mul(float a, float b) { return __fmul_rn(a, b); }
LS_HD LS_INLINE float ls_fma(float a, float b, float c) { return __fmaf_rn(a, b, c); }
LS_HD LS_INLINE float ls_div(float a, float b) { return __fdiv_rn(a, b); }
#if defined(__HIP_DEVICE_COMPILE__)
// clang 15's HIP __fsqrt_rn is ocml's native sqrt (a bare v_sqrt_f32, 1 ulp);
// sqrtf is ocml's correctly rounded one (-fhip-fp32-correctly-rounded-divide-sqrt).
LS_HD LS_INLINE float ls_sqrt(float a) { return sqrtf(a); }
#else
LS_HD LS_INLINE float ls_sqrt(float a) { return __fsqrt_rn(a); }
#endif
#else
// Host side of every build (and interpret mode).
LS_HD inline float ls_add(float a, float b) { return a + b; }
LS_HD inline float ls_sub(float a, float b) { return a - b; }
LS_HD inline float ls_mul(float a, float b) { return a * b; }
LS_HD inline float ls_fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
LS_HD inline float ls_div(float a, float b) { return a / b; }
LS_HD inline float ls_sqrt(float a) { return __builtin_sqrtf(a); }
#endif

// Blocks of a 1-D launch that cover n items with `per_block` each.
LS_HD inline unsigned blocks_for(int64_t n, int64_t per_block) {
  return static_cast<unsigned>((n + per_block - 1) / per_block);
}

}  // namespace lockstep::gpu
