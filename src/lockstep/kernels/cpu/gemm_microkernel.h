// Register-blocked GEMM micro-kernels shared by the three products (internal to
// gemm*.cpp). A tile computes C[r, c] = sum_t A(r, t) * B[t, c] for MR rows and
// NP panels of 16 columns; each C element is one FMA chain over t = 0..T-1.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "lockstep/tensor/dtype.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define LOCKSTEP_GEMM_AVX2 1
#else
#define LOCKSTEP_GEMM_AVX2 0
#endif

namespace lockstep::kernels::gemm_detail {

constexpr int kPanel = 16;  // columns per panel (two 8-float vectors)

// fp8 e4m3fn widening used by every path: the byte q, sign-extended to 32 bits
// and shifted left by 20, has the e4m3 sign at bit 31 and exponent/mantissa at
// bits 26..20 once bits 30..27 are cleared. As an f32 that is exactly
// fp8_to_f32(q) * 2^-120 (e4m3 subnormals land on f32 subnormals, also exact),
// so one multiply by (scale * 2^120) gives fp8_to_f32(q) * scale rounded once.
// e4m3 NaN (0x7f/0xff) is never stored: packing rejects non-finite weights.
constexpr float kFp8Rebias = 1.329227995784916e36f;  // 2^120
constexpr uint32_t kFp8KeepMask = 0x87FFFFFFu;

inline float fp8_widen1(fp8_t q, float scale120) {
  const int32_t s = static_cast<int8_t>(q);
  const uint32_t bits = (static_cast<uint32_t>(s) << 20) & kFp8KeepMask;
  return bits_f32(bits) * scale120;
}

// MXFP4 nibbles: an e2m1 code (bit 3 the sign) as the e4m3 byte of the same
// value (every e2m1 value is an e4m3 one), so the fp8 widening above applies.
constexpr uint8_t kE2M1AsE4M3[16] = {0x00, 0x30, 0x38, 0x3C, 0x40, 0x44, 0x48, 0x4C,
                                     0x80, 0xB0, 0xB8, 0xBC, 0xC0, 0xC4, 0xC8, 0xCC};

// B operand kinds. Packed rows are 16 elements per t, panels `bps` elements
// apart. FP4: a row is 8 bytes, byte i holding column i in its low nibble and
// column i + 8 in its high nibble (MXFP4 packing, PackedWeight).
enum class BKind { F32, BF16, FP8, FP4 };

// Kinds whose values are codes times per-column, per-k-block scales.
constexpr bool has_scales(BKind k) {
  return k == BKind::FP8 || k == BKind::FP4;
}

// Element offset n of a packed B as a byte offset for FP4, else unchanged.
template <BKind kB>
constexpr int64_t elem_step(int64_t n) {
  return kB == BKind::FP4 ? n / 2 : n;
}

// How A is laid out: element (r, t) at a[r * ars + t] (X or dY rows: xwt, dyw)
// or at a[r + t * ats] (dY read transposed: dytx).
enum class ALayout { RowsAlongT, RowsContiguous };

struct TileArgs {
  const float* a = nullptr;
  int64_t as = 0;  // ars for RowsAlongT, ats for RowsContiguous
  const void* b = nullptr;  // first panel of the group, at t = 0
  int64_t bps = 0;          // elements between consecutive panels
  int64_t t_count = 0;      // T (chain length)
  float* c = nullptr;
  int64_t ldc = 0;
  int64_t ncols = 0;  // valid columns from the group's first panel (may be < 16 * NP)
  bool accumulate = false;
  // fp8 only: (KB, 16) scales (times 2^120) of the first panel, panels `sps` apart.
  const float* scales = nullptr;
  int64_t sps = 0;
  int64_t block_k = 0;  // t per scale block
  // Lines to prefetch per t: pf + t * pf_step + p * pf_ps bytes for each of the
  // tile's NP panels p (the next block of panels while the last row tile
  // re-reads this one, or the next panel group of a lone row tile), so DRAM
  // keeps streaming. pf_ps = 0 prefetches one line per t; pf_step = pf_ps = 0
  // one harmless line.
  const char* pf = nullptr;
  int64_t pf_step = 0;
  int64_t pf_ps = 0;
  // Wide f32 tiles only, for products cut along t (k-blocking): the chains
  // start from `carry` (row r, panel p at carry[r * cld + 16 p]) instead of
  // 0 when carry_in, and end there instead of in c when carry_out. A chain
  // cut where its partial sums pass through memory is the same chain, so
  // the bits do not change.
  float* carry = nullptr;
  int64_t cld = 0;
  bool carry_in = false;
  bool carry_out = false;
};

// Stores one finished 16-column row: c = acc or c = c + acc, only the first
// `cols` columns (the rest are padding).
inline void store_row16(float* c, const float* acc16, int64_t cols, bool accumulate) {
  if (accumulate) {
    for (int64_t j = 0; j < cols; ++j) c[j] = c[j] + acc16[j];
  } else {
    for (int64_t j = 0; j < cols; ++j) c[j] = acc16[j];
  }
}

#if LOCKSTEP_GEMM_AVX2

template <BKind kB>
inline void load_b(const void* b, int64_t off, __m256 s_lo, __m256 s_hi, __m256& lo, __m256& hi) {
  if constexpr (kB == BKind::F32) {
    const float* p = static_cast<const float*>(b) + off;
    lo = _mm256_load_ps(p);
    hi = _mm256_load_ps(p + 8);
    (void)s_lo;
    (void)s_hi;
  } else if constexpr (kB == BKind::BF16) {
    // Word j holds column j (low half) and column j+8 (high half).
    const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(static_cast<const bf16_t*>(b) + off));
    lo = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    hi = _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
    (void)s_lo;
    (void)s_hi;
  } else if constexpr (kB == BKind::FP8) {
    const fp8_t* p = static_cast<const fp8_t*>(b) + off;
    const __m256i keep = _mm256_set1_epi32(static_cast<int>(kFp8KeepMask));
    const __m256i q0 = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m256i q1 = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8)));
    lo = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(q0, 20), keep)), s_lo);
    hi = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(q1, 20), keep)), s_hi);
  } else {
    // 8 bytes: low nibbles are columns 0-7, high nibbles 8-15; each becomes
    // its e4m3 byte by a table lookup, then widens as fp8 does.
    const uint8_t* p = static_cast<const uint8_t*>(b) + off / 2;
    const __m128i nib = _mm_set1_epi8(0x0F);
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    const __m128i codes =
        _mm_unpacklo_epi64(_mm_and_si128(bytes, nib), _mm_and_si128(_mm_srli_epi16(bytes, 4), nib));
    const __m128i e4m3 =
        _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kE2M1AsE4M3)), codes);
    const __m256i keep = _mm256_set1_epi32(static_cast<int>(kFp8KeepMask));
    const __m256i q0 = _mm256_cvtepi8_epi32(e4m3);
    const __m256i q1 = _mm256_cvtepi8_epi32(_mm_srli_si128(e4m3, 8));
    lo = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(q0, 20), keep)), s_lo);
    hi = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(q1, 20), keep)), s_hi);
  }
}

template <BKind kB>
using BElem =
    std::conditional_t<kB == BKind::F32, float, std::conditional_t<kB == BKind::BF16, bf16_t, uint8_t>>;

template <BKind kB, ALayout kA, int MR, int NP>
void micro_tile(const TileArgs& g) {
  constexpr int NV = 2 * NP;
  using E = BElem<kB>;
  __m256 acc[MR][NV];
#pragma GCC unroll 32
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_setzero_ps();

  const int64_t T = g.t_count;
  // One scale segment for f32/bf16; fp8 and fp4 reload their per-column scales per k-block.
  const int64_t seg = (has_scales(kB) && g.block_k > 0) ? g.block_k : (T > 0 ? T : 1);
  __m256 s_lo[NP], s_hi[NP];
#pragma GCC unroll 4
  for (int p = 0; p < NP; ++p) s_lo[p] = s_hi[p] = _mm256_setzero_ps();
  // Pointers walked along t: B panels (one per panel) and A (one per row when
  // rows run along t, else one for all rows, stepping a whole A row per t).
  const E* bp[NP];
#pragma GCC unroll 4
  for (int p = 0; p < NP; ++p) bp[p] = static_cast<const E*>(g.b) + elem_step<kB>(p * g.bps);
  const float* ap[MR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) ap[r] = kA == ALayout::RowsAlongT ? g.a + r * g.as : g.a + r;
  int64_t kb = 0;
  for (int64_t t0 = 0; t0 < T; t0 += seg, ++kb) {
    const int64_t t1 = (T - t0 < seg) ? T : t0 + seg;
    if constexpr (has_scales(kB)) {
#pragma GCC unroll 4
      for (int p = 0; p < NP; ++p) {
        s_lo[p] = _mm256_loadu_ps(g.scales + p * g.sps + kb * kPanel);
        s_hi[p] = _mm256_loadu_ps(g.scales + p * g.sps + kb * kPanel + 8);
      }
    }
    if constexpr (kA == ALayout::RowsAlongT) {
      const char* pf = g.pf + t0 * g.pf_step;
      const int pf_lines = g.pf_ps != 0 ? NP : 1;  // pf_ps = 0: one line, not NP of the same
#pragma GCC unroll 2
      for (int64_t t = t0; t < t1; ++t, pf += g.pf_step) {
#pragma GCC unroll 4
        for (int p = 0; p < pf_lines; ++p) _mm_prefetch(pf + p * g.pf_ps, _MM_HINT_T0);
        __m256 bv[NV];
#pragma GCC unroll 4
        for (int p = 0; p < NP; ++p) load_b<kB>(bp[p], t * kPanel, s_lo[p], s_hi[p], bv[2 * p], bv[2 * p + 1]);
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
          const __m256 x = _mm256_broadcast_ss(ap[r] + t);
#pragma GCC unroll 8
          for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_fmadd_ps(x, bv[v], acc[r][v]);
        }
      }
    } else {
      const float* at = ap[0] + t0 * g.as;
      const char* pf = g.pf + t0 * g.pf_step;
#pragma GCC unroll 2
      for (int64_t t = t0; t < t1; ++t, at += g.as, pf += g.pf_step) {
        _mm_prefetch(pf, _MM_HINT_T0);
        __m256 bv[NV];
#pragma GCC unroll 4
        for (int p = 0; p < NP; ++p) load_b<kB>(bp[p], t * kPanel, s_lo[p], s_hi[p], bv[2 * p], bv[2 * p + 1]);
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
          const __m256 x = _mm256_broadcast_ss(at + r);
#pragma GCC unroll 8
          for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_fmadd_ps(x, bv[v], acc[r][v]);
        }
      }
    }
  }

#pragma GCC unroll 4
  for (int p = 0; p < NP; ++p) {
    const int64_t cols = g.ncols - p * kPanel;
    if (cols <= 0) break;
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      float* c = g.c + r * g.ldc + p * kPanel;
      if (cols >= kPanel) {
        __m256 lo = acc[r][2 * p], hi = acc[r][2 * p + 1];
        if (g.accumulate) {
          lo = _mm256_add_ps(_mm256_loadu_ps(c), lo);
          hi = _mm256_add_ps(_mm256_loadu_ps(c + 8), hi);
        }
        _mm256_storeu_ps(c, lo);
        _mm256_storeu_ps(c + 8, hi);
      } else {
        alignas(32) float tmp[kPanel];
        _mm256_store_ps(tmp, acc[r][2 * p]);
        _mm256_store_ps(tmp + 8, acc[r][2 * p + 1]);
        store_row16(c, tmp, cols, g.accumulate);
      }
    }
  }
}

// f32 tiles on 16-wide vectors, for CPUs with AVX-512 (compiled for it here,
// called only where the CPU reports it; see wide_vectors()): a 16-column
// panel row is one zmm register, so MR x NP accumulators hold MR x 16 NP
// outputs. Each output is the same FMA chain over t as in micro_tile (the
// vector width only decides how many chains run side by side), so the bits
// are the same. B is f32, or bf16 panels (packed weights, rows along t only)
// widened exactly to f32 as they are loaded, as load_b does.
template <BKind kB>
__attribute__((target("avx512f"))) inline __m512 load_b_wide(const void* b, int64_t off) {
  if constexpr (kB == BKind::BF16) {
    // Word j holds column j (low half) and column j + 8 (high half): the 8
    // words in both halves of the register, the low one's shifted up, then
    // each lane's low 16 bits cleared.
    const __m256i h =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const bf16_t*>(b) + off));
    const __m512i shift = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 16, 16, 16, 16, 16, 16, 16, 16);
    // (The zero-masked forms: GCC 12 warns on the plain ones' undefined source.)
    const __m512i w = _mm512_maskz_sllv_epi32(0xFFFF, _mm512_maskz_broadcast_i64x4(0xFF, h), shift);
    return _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
  } else {
    return _mm512_loadu_ps(static_cast<const float*>(b) + off);
  }
}

// The t loop of micro_tile_wide with A rows along t, prefetching kPfLines
// lines a t (TileArgs::pf). Row r is read at base[r / 4] + (r % 4) * as, the
// bases stepping along t: three pointers and two strides, where twelve row
// pointers spilled to the stack and were reloaded every t (a 12 x 2 tile in
// L1 ran at 76% of the FMA peak, a plain loop over packed rows at 82%).
template <BKind kB, int MR, int NP, int kPfLines>
__attribute__((target("avx512f"), always_inline)) inline void wide_rows_along_t(const TileArgs& g,
                                                                                __m512 (&acc_io)[MR][NP]) {
  static_assert(MR <= 12, "rows are read from three bases of four");
  // Accumulators in a local array: writes through acc_io could alias the
  // loads, which kept every FMA's result going back to memory.
  __m512 acc[MR][NP];
#pragma GCC unroll 32
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int p = 0; p < NP; ++p) acc[r][p] = acc_io[r][p];
  using E = BElem<kB>;
  const E* bp[NP];
#pragma GCC unroll 4
  for (int p = 0; p < NP; ++p) bp[p] = static_cast<const E*>(g.b) + p * g.bps;
  const int64_t as = g.as, as3 = 3 * g.as;
  const float* base[3] = {g.a, g.a + 4 * as, g.a + 8 * as};
  const char* pf = g.pf;
  const int64_t T = g.t_count;
#pragma GCC unroll 2
  for (int64_t t = 0; t < T; ++t) {
    if constexpr (kPfLines > 0) {
#pragma GCC unroll 4
      for (int p = 0; p < kPfLines; ++p) _mm_prefetch(pf + p * g.pf_ps, _MM_HINT_T1);
      pf += g.pf_step;
    }
    __m512 bv[NP];
#pragma GCC unroll 4
    for (int p = 0; p < NP; ++p) bv[p] = load_b_wide<kB>(bp[p], t * kPanel);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const float* row = base[r / 4] + t;
      const int q = r % 4;
      const __m512 x = _mm512_set1_ps(q == 0 ? row[0] : q == 1 ? row[as] : q == 2 ? row[2 * as] : row[as3]);
#pragma GCC unroll 4
      for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_fmadd_ps(x, bv[p], acc[r][p]);
    }
  }
#pragma GCC unroll 32
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int p = 0; p < NP; ++p) acc_io[r][p] = acc[r][p];
}

template <BKind kB, ALayout kA, int MR, int NP>
__attribute__((target("avx512f"))) void micro_tile_wide(const TileArgs& g) {
  static_assert(kB == BKind::F32 || (kB == BKind::BF16 && kA == ALayout::RowsAlongT));
  __m512 acc[MR][NP];
#pragma GCC unroll 32
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int p = 0; p < NP; ++p)
      acc[r][p] = g.carry_in ? _mm512_loadu_ps(g.carry + r * g.cld + p * kPanel) : _mm512_setzero_ps();
  if constexpr (kA == ALayout::RowsAlongT) {
    // Into L2: the lines are read a group or a block later (decode of 16 rows
    // over the 0.6B shape's weights: 152 ms against 158-164 with the L1 hint).
    // A staged operand (pf_step = 0) has nothing to prefetch.
    if (g.pf_step == 0)
      wide_rows_along_t<kB, MR, NP, 0>(g, acc);
    else if (g.pf_ps == 0)
      wide_rows_along_t<kB, MR, NP, 1>(g, acc);
    else
      wide_rows_along_t<kB, MR, NP, NP>(g, acc);
  } else {
    const int64_t T = g.t_count;
    using E = BElem<kB>;
    const E* bp[NP];
#pragma GCC unroll 4
    for (int p = 0; p < NP; ++p) bp[p] = static_cast<const E*>(g.b) + p * g.bps;
    const float* at = g.a;
    const char* pf = g.pf;
#pragma GCC unroll 2
    for (int64_t t = 0; t < T; ++t, at += g.as, pf += g.pf_step) {
      _mm_prefetch(pf, _MM_HINT_T0);
      __m512 bv[NP];
#pragma GCC unroll 4
      for (int p = 0; p < NP; ++p) bv[p] = load_b_wide<kB>(bp[p], t * kPanel);
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        const __m512 x = _mm512_set1_ps(at[r]);
#pragma GCC unroll 4
        for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_fmadd_ps(x, bv[p], acc[r][p]);
      }
    }
  }
  if (g.carry_out) {
#pragma GCC unroll 32
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
      for (int p = 0; p < NP; ++p) _mm512_storeu_ps(g.carry + r * g.cld + p * kPanel, acc[r][p]);
    return;
  }
#pragma GCC unroll 4
  for (int p = 0; p < NP; ++p) {
    const int64_t cols = g.ncols - p * kPanel;
    if (cols <= 0) break;
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      float* c = g.c + r * g.ldc + p * kPanel;
      if (cols >= kPanel) {
        __m512 v = acc[r][p];
        if (g.accumulate) v = _mm512_add_ps(_mm512_loadu_ps(c), v);  // c + chain, as store_row16
        _mm512_storeu_ps(c, v);
      } else {  // the valid columns only, element by element (no access past them)
        alignas(64) float tmp[kPanel];
        _mm512_store_ps(tmp, acc[r][p]);
        store_row16(c, tmp, cols, g.accumulate);
      }
    }
  }
}

#else  // portable fallback: the same chains with std::fma

template <BKind kB>
inline float load_b1(const void* b, int64_t off, int j, const float* scale120) {
  if constexpr (kB == BKind::F32) {
    (void)scale120;
    return static_cast<const float*>(b)[off + j];
  } else if constexpr (kB == BKind::BF16) {
    (void)scale120;
    const bf16_t* h = static_cast<const bf16_t*>(b) + off;
    return bf16_to_f32(j < 8 ? h[2 * j] : h[2 * (j - 8) + 1]);
  } else if constexpr (kB == BKind::FP8) {
    return fp8_widen1(static_cast<const fp8_t*>(b)[off + j], scale120[j]);
  } else {
    const uint8_t byte = static_cast<const uint8_t*>(b)[off / 2 + (j & 7)];
    return fp8_widen1(kE2M1AsE4M3[j < 8 ? byte & 0x0F : byte >> 4], scale120[j]);
  }
}

template <BKind kB, ALayout kA, int MR, int NP>
void micro_tile(const TileArgs& g) {
  constexpr int NC = kPanel * NP;
  float acc[MR][NC] = {};
  const int64_t T = g.t_count;
  const int64_t seg = (has_scales(kB) && g.block_k > 0) ? g.block_k : (T > 0 ? T : 1);
  int64_t kb = 0;
  for (int64_t t0 = 0; t0 < T; t0 += seg, ++kb) {
    const int64_t t1 = (T - t0 < seg) ? T : t0 + seg;
    for (int64_t t = t0; t < t1; ++t) {
      float bv[NC];
      for (int p = 0; p < NP; ++p)
        for (int j = 0; j < kPanel; ++j)
          bv[p * kPanel + j] = load_b1<kB>(g.b, p * g.bps + t * kPanel, j,
                                           has_scales(kB) ? g.scales + p * g.sps + kb * kPanel : nullptr);
      for (int r = 0; r < MR; ++r) {
        const float x = (kA == ALayout::RowsAlongT) ? g.a[r * g.as + t] : g.a[t * g.as + r];
        for (int v = 0; v < NC; ++v) acc[r][v] = std::fma(x, bv[v], acc[r][v]);
      }
    }
  }
  for (int p = 0; p < NP; ++p) {
    const int64_t cols = g.ncols - p * kPanel;
    if (cols <= 0) break;
    for (int r = 0; r < MR; ++r)
      store_row16(g.c + r * g.ldc + p * kPanel, acc[r] + p * kPanel, cols < kPanel ? cols : kPanel, g.accumulate);
  }
}

#endif

using TileFn = void (*)(const TileArgs&);

}  // namespace lockstep::kernels::gemm_detail

namespace lockstep::kernels::gemm_detail {

// dst (T, 16) f32 = the exact widened values of one packed panel (T rows of 16).
// fp8 and fp4: scales (KB, 16) of this panel, times 2^120; block_k t per scale block.
void widen_panel(BKind kind, const void* src, const float* scales, int64_t block_k, int64_t t_count, float* dst);

// dst (n_panels, T, 16) f32 = columns [col0, col0 + 16 * n_panels) of a plain
// (T, *) f32 or bf16 matrix with row stride ld; columns at or past `cols` are zero.
void pack_plain_panels(const void* src, bool is_bf16, int64_t ld, int64_t t_count, int64_t col0, int64_t n_panels,
                       int64_t cols, float* dst);
// Stages panels [col0 / 16, col0 / 16 + n_panels) of an in-place weight W
// (cols rows of t_count, row stride ld; PackedWeight::rows) as the f32 panels
// the kernels read: dst[(q * t_count + t) * 16 + j] = W[col0 + 16q + j, t],
// zero past `cols`.
void stage_row_panels(const float* rows, int64_t ld, int64_t t_count, int64_t col0, int64_t n_panels,
                      int64_t cols, float* dst);

}  // namespace lockstep::kernels::gemm_detail
