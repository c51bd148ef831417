// The portability layer every GPU kernel source (kernels/gpu/*.cu) is written
// against. One file compiles three ways:
//   nvcc           CUDA (LOCKSTEP_GPU_CUDA), namespace gpu::cuda
//   hipcc          HIP for AMD (LOCKSTEP_GPU_HIP), namespace gpu::hip
//   host compiler  interpret mode (neither): blocks run on the CPU, each thread
//                  a fiber of the emulator in kernels/gpu/interp/emu.h,
//                  namespace gpu::interp
// Kernels use only what this header names: LS_GLOBAL / LS_DEVICE / LS_HD,
// threadIdx / blockIdx / blockDim / gridDim, __syncthreads(), LS_SHARED for
// per-block shared arrays, LS_LAUNCH for launches, and the explicitly rounded
// float operations ls_add / ls_mul / ls_fma / ls_div / ls_sqrt. A float
// expression written with + or * is a lint error (docs/gpu.md): it may be fused
// or reordered by a device compiler and break the CPU's bits.
#pragma once

#include <cstdint>

#if defined(__HIPCC__)
#define LOCKSTEP_GPU_HIP 1
#include <hip/hip_runtime.h>
#define LS_GPU_NS hip
#elif defined(__CUDACC__)
#define LOCKSTEP_GPU_CUDA 1
#include <cuda_runtime.h>
#define LS_GPU_NS cuda
#else
#define LOCKSTEP_GPU_INTERP 1
#define LS_GPU_NS interp
#endif

#if defined(LOCKSTEP_GPU_CUDA) || defined(LOCKSTEP_GPU_HIP)
#define LS_DEVICE __device__
#define LS_HD __host__ __device__
#define LS_GLOBAL __global__
#define LS_INLINE __forceinline__
// T name[n] in the block's shared memory; n must be a constant expression.
#define LS_SHARED(T, name, n) __shared__ T name[n]
// LS_LAUNCH(ctx, kernel, grid, block)(args...): runs kernel on the default stream.
#define LS_LAUNCH(ctx, kernel, grid, block) kernel<<<(grid), (block)>>>
#else
#include "lockstep/kernels/gpu/interp/emu.h"
#define LS_DEVICE
#define LS_HD
#define LS_GLOBAL
#define LS_INLINE inline
#define threadIdx (::lockstep::gpu::emu::thread_idx())
#define blockIdx (::lockstep::gpu::emu::block_idx())
#define blockDim (::lockstep::gpu::emu::block_dim())
#define gridDim (::lockstep::gpu::emu::grid_dim())
#define __syncthreads() ::lockstep::gpu::emu::sync_threads(__FILE__, __LINE__)
// A pointer to n T in the block's shared memory, NaN-poisoned (floats) or
// 0xFF-filled (other types) when the block starts; every thread gets the same
// array. Declare shared arrays unconditionally, in the same order in every
// thread, at the top of the kernel.
#define LS_SHARED(T, name, n) T* const name = ::lockstep::gpu::emu::shared_array<T>((n), #name, __FILE__, __LINE__)
#define LS_LAUNCH(ctx, kernel, grid, block) \
  ::lockstep::gpu::emu::Launch((ctx), #kernel, __FILE__, __LINE__, (grid), (block), kernel)
#endif

namespace lockstep::gpu {

// Explicitly rounded float operations: one IEEE round-to-nearest-even each,
// never fused, never flushed. The host forms are plain C++ under
// -ffp-contract=off, which the build sets for every compiler. So are HIP's
// __fadd_rn / __fmul_rn (clang headers): on AMD only -ffp-contract=off keeps
// them unfused, and the gfx90a lint checks the IR for it (docs/gpu.md).
#if defined(LOCKSTEP_GPU_CUDA) || defined(LOCKSTEP_GPU_HIP)
LS_DEVICE LS_INLINE float ls_add(float a, float b) { return __fadd_rn(a, b); }
LS_DEVICE LS_INLINE float ls_sub(float a, float b) { return __fsub_rn(a, b); }
LS_DEVICE LS_INLINE float ls_mul(float a, float b) { return __fmul_rn(a, b); }
LS_DEVICE LS_INLINE float ls_fma(float a, float b, float c) { return __fmaf_rn(a, b, c); }
LS_DEVICE LS_INLINE float ls_div(float a, float b) { return __fdiv_rn(a, b); }
#if defined(LOCKSTEP_GPU_HIP)
// clang 15's HIP __fsqrt_rn is ocml's native sqrt (a bare v_sqrt_f32, 1 ulp);
// sqrtf is ocml's correctly rounded one (-fhip-fp32-correctly-rounded-divide-sqrt).
LS_DEVICE LS_INLINE float ls_sqrt(float a) { return sqrtf(a); }
#else
LS_DEVICE LS_INLINE float ls_sqrt(float a) { return __fsqrt_rn(a); }
#endif
#else
inline float ls_add(float a, float b) { return a + b; }
inline float ls_sub(float a, float b) { return a - b; }
inline float ls_mul(float a, float b) { return a * b; }
inline float ls_fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
inline float ls_div(float a, float b) { return a / b; }
inline float ls_sqrt(float a) { return __builtin_sqrtf(a); }
#endif

// Blocks of a 1-D launch that cover n items with `per_block` each.
LS_HD inline unsigned blocks_for(int64_t n, int64_t per_block) {
  return static_cast<unsigned>((n + per_block - 1) / per_block);
}

}  // namespace lockstep::gpu
