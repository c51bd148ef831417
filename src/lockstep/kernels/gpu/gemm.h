// The GPU backend's GEMM entries (gemm.cu) with their launch geometry exposed,
// so tests can run several block shapes; the backend table uses the defaults.
// Each output is the CPU's chain (kernels/cpu/gemm.h), whatever the geometry.
#pragma once

#include "lockstep/kernels/cpu/gemm.h"
#include "lockstep/kernels/gpu/portable.h"

namespace lockstep::kernels::gpu::LS_GPU_NS {

// One block computes a (tile_m, tile_n) tile of outputs with
// (tile_m / thread_m) * (tile_n / thread_n) threads, each thread a
// (thread_m, thread_n) set of outputs strided over the tile. The reduction is
// staged through shared memory tile_k steps at a time; every output keeps one
// accumulator over all of it (never split).
struct GemmLaunch {
  int tile_m = 64;
  int tile_n = 64;
  int tile_k = 16;
  int thread_m = 4;
  int thread_n = 4;

  int threads() const { return (tile_m / thread_m) * (tile_n / thread_n); }
};

// Shared-memory capacity of one block, in floats per operand tile (2 x 16 KiB:
// a 64 x 64 tile over 64 reduction steps, within CUDA's 48 KiB default).
constexpr int kGemmSharedFloats = 4096;
// Accumulators one thread keeps (thread_m * thread_n at most).
constexpr int kGemmMaxThreadOutputs = 16;

// Throws Error when `cfg` does not fit the limits above or a block's threads.
void check_gemm_launch(const GemmLaunch& cfg);

void gemm_xwt(const Context& ctx, Tensor y, const Tensor& x, const PackedWeight& w, bool accumulate,
              const GemmLaunch& cfg);
void gemm_xwt(const Context& ctx, Tensor y, const Tensor& x, const Tensor& w, bool accumulate,
              const GemmLaunch& cfg);
void gemm_dyw(const Context& ctx, Tensor dx, const Tensor& dy, const Tensor& w, bool accumulate,
              const GemmLaunch& cfg);
void gemm_dytx(const Context& ctx, Tensor dw, const Tensor& dy, const Tensor& x, bool accumulate,
               const GemmLaunch& cfg);
// The values the products with pw multiply by, as kernels::unpack_weight (w_out (N, K) f32).
void unpack_weight(const Context& ctx, Tensor w_out, const PackedWeight& pw);

}  // namespace lockstep::kernels::gpu::LS_GPU_NS
