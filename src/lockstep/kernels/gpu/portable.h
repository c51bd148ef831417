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
// float operations ls_add / ls_mul / ls_fma / ls_div / ls_sqrt (float_ops.h). A float
// expression written with + or * is a lint error (docs/gpu.md): it may be fused
// or reordered by a device compiler and break the CPU's bits.
#pragma once

#include <cstdint>

#include "lockstep/kernels/gpu/float_ops.h"

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
#define LS_GLOBAL __global__
// T name[n] in the block's shared memory; n must be a constant expression.
#define LS_SHARED(T, name, n) __shared__ T name[n]
// LS_LAUNCH(ctx, kernel, grid, block)(args...): runs kernel on the backend's
// stream and checks the launch (launch.h, included at the end of this file).
#define LS_LAUNCH(ctx, kernel, grid, block) \
  ::lockstep::kernels::gpu::LS_GPU_NS::DeviceLaunch(#kernel, __FILE__, __LINE__, (grid), (block), kernel)
#else
#include "lockstep/kernels/gpu/interp/emu.h"
#define LS_GLOBAL
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

#if defined(LOCKSTEP_GPU_CUDA) || defined(LOCKSTEP_GPU_HIP)
#include "lockstep/kernels/gpu/launch.h"
#endif
