// The GPU backend's AdamW entry (adamw.cu) with its launch geometry exposed,
// so tests can run several block shapes; the backend table uses the defaults.
// Every element gets the CPU's bits (kernels/cpu/adamw.h) whatever the geometry.
#pragma once

#include "lockstep/kernels/cpu/adamw.h"
#include "lockstep/kernels/gpu/portable.h"

namespace lockstep::kernels::gpu::LS_GPU_NS {

// `threads` per block, each thread updating `per_thread` elements spaced
// blockDim apart (so a warp's accesses stay contiguous).
struct AdamWLaunch {
  int threads = 256;
  int per_thread = 4;
};

// kernels::adamw_step on device buffers; throws as the CPU entry does, and for
// a launch with threads < 1 or per_thread < 1.
void adamw_step(const Context& ctx, float* param, const float* grad, float* m, float* v, int64_t n,
                const AdamWParams& hp, const AdamWLaunch& launch);

}  // namespace lockstep::kernels::gpu::LS_GPU_NS
