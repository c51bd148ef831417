// An 8 x 8 f32 block transposed in AVX2 registers: moves only, so the values
// are the same. Used to stage weight rows as GEMM panels (gemm_pack.cpp).
#pragma once

#include <cstdint>

#if defined(__AVX2__)
#include <immintrin.h>

namespace lockstep::kernels {

// dst[c * dld + r] = src[r * ld + c] for r, c < 8.
inline void transpose8x8(const float* src, int64_t ld, float* dst, int64_t dld) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * ld);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(dst + i * dld, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(dst + (i + 4) * dld, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}

}  // namespace lockstep::kernels

#endif
