// Planted for the float lint (scripts/gpu-lint.py --planted): float operators
// written as + and *, compiled without the flag that keeps them apart
// (--fmad=false for nvcc, -ffp-contract=off for hipcc). nvcc fuses a*b+c into
// one fma and leaves the lone add unrounded; clang marks them contractable.
// Not built into any library.
// LINT-DROP-FLAG(ptx): --fmad=false
// LINT-EXPECT(ptx): bad_plain_ops\.cu:\d+: .*fma\.rn\.f32.*\n.*change with --fmad
// LINT-EXPECT(ptx): add\.f32 .*\n.*without \.rn
// LINT-DROP-FLAG(gfx90a): -ffp-contract=off
// LINT-EXPECT(gfx90a): fast-math flags 'contract'
#include "lockstep/kernels/gpu/portable.h"

LS_GLOBAL void planted_plain(float* y, const float* a, const float* b, const float* c) {
  const unsigned i = threadIdx.x;
  y[i] = a[i] * b[i] + c[i];
  y[i + 32] = a[i] + c[i];
}
