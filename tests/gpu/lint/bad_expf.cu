// Planted for the float lint (scripts/gpu-lint.py --planted): libm's expf is
// the hardware exp2 on both vendors. Not built into any library.
// LINT-EXPECT(ptx): ex2\.approx
// LINT-EXPECT(ptx): bad_expf\.cu:\d+
// LINT-EXPECT(gfx90a): v_exp_f32
// LINT-EXPECT(gfx90a): planted_exp\(float\*, float const\*\)
#include "lockstep/kernels/gpu/portable.h"

LS_GLOBAL void planted_exp(float* y, const float* x) { y[threadIdx.x] = expf(x[threadIdx.x]); }
