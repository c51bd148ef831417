// Planted for the float lint (scripts/gpu-lint.py --planted): the approximate
// intrinsics, HIP's __fsqrt_rn, which clang 15 maps to the bare 1-ulp
// v_sqrt_f32 (why portable.h's ls_sqrt uses sqrtf on HIP), and AMD's bare
// reciprocal (HIP's __fdividef is the IEEE division, not an approximation).
// Not built into any library.
// LINT-EXPECT(ptx): rsqrt\.approx\.f32
// LINT-EXPECT(ptx): div\.approx\.f32
// LINT-EXPECT(ptx): sin\.approx\.f32
// LINT-EXPECT(gfx90a): v_rsq_f32
// LINT-EXPECT(gfx90a): v_rcp_f32.*\n.*outside the IEEE division
// LINT-EXPECT(gfx90a): v_sin_f32
// LINT-EXPECT(gfx90a): bare v_sqrt_f32
#include "lockstep/kernels/gpu/portable.h"

LS_GLOBAL void planted_approx(float* y, const float* x) {
  const unsigned i = threadIdx.x;
  y[i] = rsqrtf(x[i]);
  y[i + 32] = __fdividef(x[i], x[i + 1]);
  y[i + 64] = __sinf(x[i]);
  y[i + 96] = __fsqrt_rn(x[i]);
#if defined(LOCKSTEP_GPU_HIP)
  y[i + 128] = __builtin_amdgcn_rcpf(x[i]);
#endif
}
