// Planted for the float lint (scripts/gpu-lint.py --planted): the same rounded
// multiply built with subnormals flushed to zero (--ftz=true for nvcc,
// -fgpu-flush-denormals-to-zero for hipcc). clang 15 keeps IEEE denormals
// whenever -fno-fast-math is on the line, wherever the flush flag stands, so
// that goes too. Not built into any library.
// LINT-DROP-FLAG(ptx): --ftz=false
// LINT-ADD-FLAG(ptx): --ftz=true
// LINT-EXPECT(ptx): mul\.rn\.ftz\.f32.*\n.*flushes subnormals
// LINT-DROP-FLAG(gfx90a): -fno-gpu-flush-denormals-to-zero
// LINT-DROP-FLAG(gfx90a): -fno-fast-math
// LINT-ADD-FLAG(gfx90a): -fgpu-flush-denormals-to-zero
// LINT-EXPECT(gfx90a): \.amdhsa_float_denorm_mode_32 0
#include "lockstep/kernels/gpu/portable.h"

LS_GLOBAL void planted_ftz(float* y, const float* a, const float* b) {
  y[threadIdx.x] = lockstep::gpu::ls_mul(a[threadIdx.x], b[threadIdx.x]);
}
