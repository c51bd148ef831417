// The AdamW update (kernels/cpu/adamw.h) as a GPU kernel: one thread per
// element, the same f32 operations in the same order as the CPU loop, with
// the per-step scalars rounded on the host by the CPU's own adamw_scalars.
#include "lockstep/kernels/gpu/adamw.h"

#include "lockstep/kernels/gpu/registry.h"

namespace lockstep::kernels::gpu::LS_GPU_NS {

using ::lockstep::gpu::blocks_for;
using ::lockstep::gpu::ls_add;
using ::lockstep::gpu::ls_div;
using ::lockstep::gpu::ls_mul;
using ::lockstep::gpu::ls_sqrt;
using ::lockstep::gpu::ls_sub;

namespace {

// param, grad, m, v: (n). The CPU's loop body, one rounding per operation,
// no FMA (the CPU source is compiled with -ffp-contract=off).
LS_GLOBAL void adamw_kernel(float* param, const float* grad, float* m, float* v, int64_t n, AdamWScalars s,
                            int per_thread) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x * per_thread + threadIdx.x;
  for (int j = 0; j < per_thread; ++j) {
    const int64_t i = base + static_cast<int64_t>(j) * blockDim.x;
    if (i >= n) return;
    const float g = grad[i];
    const float mi = ls_add(ls_mul(s.b1, m[i]), ls_mul(s.c1, g));
    const float vi = ls_add(ls_mul(s.b2, v[i]), ls_mul(s.c2, ls_mul(g, g)));
    m[i] = mi;
    v[i] = vi;
    const float denom = ls_add(ls_div(ls_sqrt(vi), s.bc2_sqrt), s.eps);
    param[i] = ls_sub(ls_mul(param[i], s.decay), ls_mul(s.step_size, ls_div(mi, denom)));
  }
}

}  // namespace

void adamw_step(const Context& ctx, float* param, const float* grad, float* m, float* v, int64_t n,
                const AdamWParams& hp, const AdamWLaunch& launch) {
  const AdamWScalars s = adamw_scalars(hp, n);
  LS_CHECK(launch.threads >= 1 && launch.per_thread >= 1)
      << "adamw_step: bad launch (" << launch.threads << " threads, " << launch.per_thread << " per thread)";
  if (n == 0) return;
  const dim3 grid(blocks_for(n, static_cast<int64_t>(launch.threads) * launch.per_thread));
  LS_LAUNCH(ctx, adamw_kernel, grid, dim3(static_cast<unsigned>(launch.threads)))
  (param, grad, m, v, n, s, launch.per_thread);
}

namespace {

void adamw_step_entry(const Context& ctx, float* param, const float* grad, float* m, float* v, int64_t n,
                      const AdamWParams& hp) {
  adamw_step(ctx, param, grad, m, v, n, hp, AdamWLaunch{});
}

}  // namespace

void register_adamw(GpuBackend& b) { b.adamw_step = adamw_step_entry; }

}  // namespace lockstep::kernels::gpu::LS_GPU_NS
