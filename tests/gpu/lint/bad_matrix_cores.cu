// Planted for the float lint (scripts/gpu-lint.py --planted): tensor cores
// (NVIDIA wmma, AMD MFMA) accumulate in their own order and rounding, so the
// canonical kernels may not use them. Not built into any library.
// LINT-EXPECT(ptx): wmma\.mma
// LINT-EXPECT(gfx90a): v_mfma_f32_32x32x2f32
#include "lockstep/kernels/gpu/portable.h"

#if defined(LOCKSTEP_GPU_CUDA)
#include <mma.h>

// One 16x16x16 half-precision tile product: y = a * b.
LS_GLOBAL void planted_mma(float* y, const __half* a, const __half* b) {
  namespace w = nvcuda::wmma;
  w::fragment<w::matrix_a, 16, 16, 16, __half, w::row_major> fa;
  w::fragment<w::matrix_b, 16, 16, 16, __half, w::col_major> fb;
  w::fragment<w::accumulator, 16, 16, 16, float> fc;
  w::fill_fragment(fc, 0.0f);
  w::load_matrix_sync(fa, a, 16);
  w::load_matrix_sync(fb, b, 16);
  w::mma_sync(fc, fa, fb, fc);
  w::store_matrix_sync(y, fc, 16, w::mem_row_major);
}
#elif defined(LOCKSTEP_GPU_HIP)
typedef float f32x16 __attribute__((ext_vector_type(16)));

// One 32x32x2 f32 MFMA step per wave: y = a * b + y.
LS_GLOBAL void planted_mma(float* y, const float* a, const float* b) {
  f32x16 acc;
  for (int j = 0; j < 16; ++j) acc[j] = y[threadIdx.x * 16 + j];
  acc = __builtin_amdgcn_mfma_f32_32x32x2f32(a[threadIdx.x], b[threadIdx.x], acc, 0, 0, 0);
  for (int j = 0; j < 16; ++j) y[threadIdx.x * 16 + j] = acc[j];
}
#endif
