// Internals shared by attention.cpp and attention_backward.cpp: paged-cache
// addressing, cost-balanced work splitting, and inlined Highway forms of
// canonical_dot and the fma accumulation that give simd.h's bits.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "lockstep/kernels/cpu/attention.h"
#include "lockstep/kernels/cpu/attention_plan.h"
#include "lockstep/kernels/cpu/simd.h"
#include "lockstep/kernels/cpu/wide.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define LOCKSTEP_ATTN_WIDE 1
#else
#define LOCKSTEP_ATTN_WIDE 0
#endif

namespace lockstep::kernels::attn {

namespace hn = hwy::HWY_NAMESPACE;
using D = hn::ScalableTag<float>;

// Splits items 0..n-1 with costs cost(i) into at most `threads` contiguous
// ranges of about equal total cost; returns the n_ranges + 1 boundaries. Small
// jobs get one range (a thread hand-off costs more than it saves). The bits of
// every output are independent of this split; it only balances causal work.
template <typename CostFn>
std::vector<int64_t> balanced_ranges(int64_t n, int threads, CostFn cost) {
  // In (query, key) visits: ~10 us of work, more than a thread hand-off costs.
  constexpr int64_t kMinCostPerRange = 2048;
  std::vector<int64_t> prefix(static_cast<size_t>(n) + 1, 0);
  for (int64_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + cost(i);
  const int64_t total = prefix[n];
  int64_t ranges = std::min<int64_t>({static_cast<int64_t>(threads), n, total / kMinCostPerRange});
  ranges = std::max<int64_t>(ranges, 1);
  std::vector<int64_t> bounds{0};
  int64_t i = 0;
  for (int64_t r = 1; r < ranges; ++r) {
    const int64_t target = total * r / ranges;
    while (i < n && prefix[i] < target) ++i;
    bounds.push_back(i);
  }
  bounds.push_back(n);
  return bounds;
}

// dst (n) = src (n) bf16 widened to f32: exact (the bits move to the high
// half), vectorized; a call per row to the scalar convert_bf16_to_f32 made a
// bf16 cache slower to read than an f32 one.
HWY_INLINE void widen_bf16(const bf16_t* src, float* dst, int64_t n) {
  const D d;
  const hn::RebindToUnsigned<D> du32;
  const hn::Rebind<uint16_t, D> du16;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + N <= n; i += N)
    hn::StoreU(hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du32, hn::LoadU(du16, src + i)))), d, dst + i);
  for (; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

// Read access to one layer's paged cache.
struct CacheView {
  const void* k = nullptr;
  const void* v = nullptr;
  bool bf16 = false;
  int64_t BS = 0, Hkv = 0, Dh = 0;

  // Element offset of the (Dh) row at slot `slot` of physical block `block`, kv head kvh.
  int64_t offset(int32_t block, int64_t slot, int64_t kvh) const {
    return ((static_cast<int64_t>(block) * BS + slot) * Hkv + kvh) * Dh;
  }
  // Pointers to the f32 K and V rows of positions [p0, p0 + n) of one sequence
  // (block-table row `row`) and kv head kvh. bf16 rows are widened into the
  // scratch tiles kt, vt (n, Dh); f32 rows are read in place, or copied there
  // when `copy` (rows that many queries re-read: one head's rows lie Hkv * Dh
  // apart in the cache, a multiple of 4 KiB that maps them all to the same
  // few L1 sets).
  void gather(const int32_t* row, int64_t p0, int n, int64_t kvh, const float** kp, const float** vp,
              float* kt, float* vt, bool copy = false) const {
    int64_t b = p0 / BS, slot = p0 % BS;
    for (int i = 0; i < n; ++i) {
      const int64_t off = offset(row[b], slot, kvh);
      if (bf16) {
        widen_bf16(static_cast<const bf16_t*>(k) + off, kt + i * Dh, Dh);
        widen_bf16(static_cast<const bf16_t*>(v) + off, vt + i * Dh, Dh);
        kp[i] = kt + i * Dh;
        vp[i] = vt + i * Dh;
      } else if (copy) {
        std::copy_n(static_cast<const float*>(k) + off, Dh, kt + i * Dh);
        std::copy_n(static_cast<const float*>(v) + off, Dh, vt + i * Dh);
        kp[i] = kt + i * Dh;
        vp[i] = vt + i * Dh;
      } else {
        kp[i] = static_cast<const float*>(k) + off;
        vp[i] = static_cast<const float*>(v) + off;
      }
      if (++slot == BS) {
        slot = 0;
        ++b;
      }
    }
  }
  // Asks for the K and V rows of positions [p0, p0 + n) ahead of use: pages of
  // a paged cache are scattered, so the hardware prefetcher loses the stream at
  // every block boundary and decode would wait on memory.
  // Covers kv heads [kv0, kv1), which are adjacent within a position's slot.
  void prefetch(const int32_t* row, int64_t p0, int n, int64_t kv0, int64_t kv1) const {
    const size_t esize = bf16 ? sizeof(bf16_t) : sizeof(float);
    const size_t bytes = static_cast<size_t>((kv1 - kv0) * Dh) * esize;
    int64_t b = p0 / BS, slot = p0 % BS;
    for (int i = 0; i < n; ++i) {
      const size_t off = static_cast<size_t>(offset(row[b], slot, kv0)) * esize;
      for (size_t c = 0; c < bytes; c += 64) {
        hwy::Prefetch(static_cast<const char*>(k) + off + c);
        hwy::Prefetch(static_cast<const char*>(v) + off + c);
      }
      if (++slot == BS) {
        slot = 0;
        ++b;
      }
    }
  }
};

// max_reduce(x, n) for 1 <= n <= kKeyBlock scores, vectorized, same bits. The
// max of ordered values does not depend on the order, except that +0 and -0
// compare equal (max_reduce keeps the first); so a zero max, like a NaN, defers
// to max_reduce itself.
HWY_INLINE float block_max(const float* x, int n) {
  const D d;
  constexpr int N = static_cast<int>(hn::MaxLanes(D()));
  auto m = hn::Set(d, x[0]);
  auto nan = hn::Zero(d);
  int i = 0;
  for (; i + N <= n; i += N) {
    const auto v = hn::LoadU(d, x + i);
    m = hn::Max(m, v);
    nan = hn::Or(nan, hn::VecFromMask(d, hn::IsNaN(v)));
  }
  float r = hn::GetLane(hn::MaxOfLanes(d, m));
  for (; i < n; ++i) {
    if (std::isnan(x[i])) return max_reduce(x, n);
    r = x[i] > r ? x[i] : r;
  }
  if (r == 0.0f || !hn::AllFalse(d, hn::MaskFromVec(nan))) return max_reduce(x, n);
  return r;
}

// canonical_dot(a, b, dh), bit for bit, inlined. On 8-lane vectors (AVX2) the
// 16 lane partials are two vectors (lanes 0-7, 8-15) and the fixed tree
// (j += j+8, +4, +2, +1) is one add and three in-register steps; other widths
// and head widths that are not a multiple of 16 call canonical_dot itself.
// The attention tests check these bits against canonical_dot.
HWY_INLINE float dot(const float* a, const float* b, int64_t dh) {
  const D d;
  if constexpr (hn::MaxLanes(D()) == 8) {
    if (dh % kReduceLanes == 0) {
      auto acc0 = hn::Zero(d), acc1 = hn::Zero(d);
      for (int64_t i = 0; i < dh; i += kReduceLanes) {
        acc0 = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), acc0);
        acc1 = hn::MulAdd(hn::LoadU(d, a + i + 8), hn::LoadU(d, b + i + 8), acc1);
      }
      auto s = hn::Add(acc0, acc1);                   // lane j: j + (j+8)
      s = hn::Add(s, hn::ConcatLowerUpper(d, s, s));  // lane j < 4: j + (j+4)
      s = hn::Add(s, hn::Shuffle1032(s));             // lane j < 2: j + (j+2)
      s = hn::Add(s, hn::Shuffle2301(s));             // lane 0: 0 + 1
      return hn::GetLane(s);
    }
  }
  return canonical_dot(a, b, dh);
}

// The fixed tree of canonical_dot for 8 keys at once (8-lane vectors): part[i]
// is key i's 16 lane partials folded to 8 (lane j: j + (j+8)); the rest of the
// tree (j += j+4, j+2, j+1) runs on all 8 keys together with cross-key
// shuffles, so lane i of the result is key i's dot. The keys are combined in
// the order 0,4 | 2,6 | 1,5 | 3,7 that makes the shuffles land in place.
HWY_INLINE hn::Vec<D> fold8(const hn::Vec<D>* part) {
  const D d;
  const hn::Repartition<double, D> dd;  // 64-bit interleaves, float domain
  // Block 0 gets key a's lanes j + (j+4), block 1 key b's.
  auto fold4 = [&](hn::Vec<D> ra, hn::Vec<D> rb) {
    return hn::Add(hn::ConcatLowerLower(d, rb, ra), hn::ConcatUpperUpper(d, rb, ra));
  };
  // Per block: [x0 + x2, x1 + x3, y0 + y2, y1 + y3].
  auto fold2 = [&](hn::Vec<D> x, hn::Vec<D> y) {
    const auto xd = hn::BitCast(dd, x), yd = hn::BitCast(dd, y);
    return hn::Add(hn::BitCast(d, hn::InterleaveLower(xd, yd)),
                   hn::BitCast(d, hn::InterleaveUpper(dd, xd, yd)));
  };
  const auto y1 = fold2(fold4(part[0], part[4]), fold4(part[2], part[6]));  // [k0 k0 k2 k2 | k4 k4 k6 k6]
  const auto y2 = fold2(fold4(part[1], part[5]), fold4(part[3], part[7]));  // [k1 k1 k3 k3 | k5 k5 k7 k7]
  const auto z1 = hn::Add(y1, hn::Shuffle2301(y1));                         // even lanes: keys 0 2 4 6
  const auto z2 = hn::Add(y2, hn::Shuffle2301(y2));                         // odd lanes: keys 1 3 5 7
  return hn::OddEven(z2, z1);
}

// canonical_dot(q[g], k[i], dh) for kQ queries and 8 keys at once, bit for bit
// (8-lane vectors, dh % 16 == 0): out[g] lane i is query g's dot with key i.
// Each loaded key vector feeds all kQ queries (one key load per kQ FMAs
// instead of one per FMA: scores of one query are load-bound); every pair's
// two partial chains and fold are canonical_dot's. kG = dh / 16 when known at
// compile time (the loop unrolls), 0 otherwise.
template <int kG, int kQ>
HWY_INLINE void dot8_rows(const float* const* q, const float* const* k, int64_t dh, hn::Vec<D>* out) {
  const D d;
  const int64_t len = kG > 0 ? kG * kReduceLanes : dh;
  hn::Vec<D> part[kQ][8];
  for (int i = 0; i < 8; ++i) {
    hn::Vec<D> a0[kQ], a1[kQ];
    for (int g = 0; g < kQ; ++g) a0[g] = a1[g] = hn::Zero(d);
    for (int64_t c = 0; c < len; c += kReduceLanes) {
      const auto k0 = hn::LoadU(d, k[i] + c), k1 = hn::LoadU(d, k[i] + c + 8);
      for (int g = 0; g < kQ; ++g) {
        a0[g] = hn::MulAdd(hn::LoadU(d, q[g] + c), k0, a0[g]);
        a1[g] = hn::MulAdd(hn::LoadU(d, q[g] + c + 8), k1, a1[g]);
      }
    }
    for (int g = 0; g < kQ; ++g) part[g][i] = hn::Add(a0[g], a1[g]);  // lane j: j + (j+8)
  }
  for (int g = 0; g < kQ; ++g) out[g] = fold8(part[g]);
}

// canonical_sum(x, n) for n <= 2 * kReduceLanes, bit for bit: lane j holds
// x[j] (+ x[j+16]), then the fixed tree. Reads x[0, 32); the masked-off lanes
// add +0, a no-op because a lane that starts at +0 is never -0.
HWY_INLINE float block_sum(const float* x, int n) {
  if constexpr (hn::MaxLanes(D()) == 8) {
    const D d;
    auto a0 = hn::Zero(d), a1 = hn::Zero(d);
    for (int i = 0; i < n; i += kReduceLanes) {
      a0 = hn::Add(a0, hn::IfThenElseZero(hn::FirstN(d, static_cast<size_t>(n - i)), hn::LoadU(d, x + i)));
      a1 = hn::Add(a1, hn::IfThenElseZero(hn::FirstN(d, static_cast<size_t>(std::max(0, n - i - 8))),
                                          hn::LoadU(d, x + i + 8)));
    }
    auto s = hn::Add(a0, a1);
    s = hn::Add(s, hn::ConcatLowerUpper(d, s, s));
    s = hn::Add(s, hn::Shuffle1032(s));
    s = hn::Add(s, hn::Shuffle2301(s));
    return hn::GetLane(s);
  }
  return canonical_sum(x, n);
}

#if LOCKSTEP_ATTN_WIDE
// canonical_dot's fixed tree (j += j+8, +4, +2, +1 over 16 lane partials) on
// 16-wide registers, several keys to a register, so each shuffle and add
// serves 2 to 8 keys. Every add has the operands the tree gives it, so the
// sums are the same bits.
//
// Step 1, keys x and y (16 partials each): blocks of 4 lanes
// [x 0-3, x 4-7, y 0-3, y 4-7] of lane j + (j+8).
__attribute__((target("avx512f"))) inline __m512 fold_by_8(__m512 x, __m512 y) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(1, 0, 1, 0)),
                       _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(3, 2, 3, 2)));
}
// Step 2, from fold_by_8 of keys (0, 1) and (2, 3): block i holds key i's
// lanes j + (j+4), j < 4.
__attribute__((target("avx512f"))) inline __m512 fold_by_4(__m512 s01, __m512 s23) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(s01, s23, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(s01, s23, _MM_SHUFFLE(3, 1, 3, 1)));
}
// Step 3, from fold_by_4 of keys 0-3 (a) and 4-7 (b): block i holds key i's
// lanes j + (j+2) in lanes 0-1 and key i+4's in lanes 2-3.
__attribute__((target("avx512f"))) inline __m512 fold_by_2(__m512 a, __m512 b) {
  const __m512d ad = _mm512_castps_pd(a), bd = _mm512_castps_pd(b);
  return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(ad, bd)),
                       _mm512_castpd_ps(_mm512_unpackhi_pd(ad, bd)));
}
// Step 4, from fold_by_2 of two queries: block i holds query 0's dots with
// keys i and i+4, then query 1's.
__attribute__((target("avx512f"))) inline __m512 fold_by_1(__m512 u0, __m512 u1) {
  return _mm512_add_ps(_mm512_shuffle_ps(u0, u1, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_ps(u0, u1, _MM_SHUFFLE(3, 1, 3, 1)));
}

// dot8_rows on 16-wide registers (CPUs with AVX-512F, wide_vectors()): one
// register holds a pair's 16 lane partials, folded by the steps above to the
// same dots (folding each pair's halves to 8 lanes first and running the
// rest on 8-lane vectors took more shuffles than FMAs' time allowed: about a
// third of the port time of the FMAs).
template <int kG, int kQ>
__attribute__((target("avx512f"))) void dot8_rows_wide(const float* const* q, const float* const* k,
                                                       int64_t dh, hn::Vec<D>* out) {
  const int64_t len = kG > 0 ? kG * kReduceLanes : dh;
  // Keys in groups of kK, so each loaded query vector feeds kK keys as each
  // key vector feeds kQ queries: kQ x kK independent chains, (kQ + kK) loads
  // per kQ x kK FMAs.
  constexpr int kK = 4;
  __m512 quad[kQ][2];  // per query: keys 0-3 and 4-7 after steps 1 and 2
  for (int i0 = 0; i0 < 8; i0 += kK) {
    // The second group reloads the query vectors from L1: without this
    // barrier the compiler keeps the first group's 32 in stack slots, a store
    // and a reload each.
    asm volatile("" ::: "memory");
    __m512 a[kQ][kK];
    for (int g = 0; g < kQ; ++g)
      for (int i = 0; i < kK; ++i) a[g][i] = _mm512_setzero_ps();
    for (int64_t c = 0; c < len; c += kReduceLanes) {
      __m512 kv[kK];
      for (int i = 0; i < kK; ++i) kv[i] = _mm512_loadu_ps(k[i0 + i] + c);
      for (int g = 0; g < kQ; ++g) {
        const __m512 qv = _mm512_loadu_ps(q[g] + c);
        for (int i = 0; i < kK; ++i) a[g][i] = _mm512_fmadd_ps(qv, kv[i], a[g][i]);
      }
    }
    for (int g = 0; g < kQ; ++g)
      quad[g][i0 / kK] = fold_by_4(fold_by_8(a[g][0], a[g][1]), fold_by_8(a[g][2], a[g][3]));
  }
  // Lane 4i of fold_by_1 is query 0's key i, 4i+1 its key i+4, 4i+2 and
  // 4i+3 query 1's: gathered to query 0's keys 0-7, then query 1's.
  const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
  for (int g = 0; g < kQ; g += 2) {
    const int g1 = g + 1 < kQ ? g + 1 : g;
    const __m512 u0 = fold_by_2(quad[g][0], quad[g][1]);
    const __m512 u1 = g1 != g ? fold_by_2(quad[g1][0], quad[g1][1]) : u0;
    const __m512 r = _mm512_permutexvar_ps(order, fold_by_1(u0, u1));
    out[g].raw = _mm512_castps512_ps256(r);
    // The masked form with a zero source: the plain one reads an undefined
    // source that g++ 12 reports as uninitialized.
    if (g1 != g)
      out[g1].raw =
          _mm256_castpd_ps(_mm512_mask_extractf64x4_pd(_mm256_setzero_pd(), 0xF, _mm512_castps_pd(r), 1));
  }
}

// scores8 on dot8_rows_wide.
template <int kG, int kQ>
__attribute__((target("avx512f"))) void scores8_wide(const float* const* q, const float* const* k, int n,
                                                     int64_t dh, float scale, float* const* e) {
  const __m256 vs = _mm256_set1_ps(scale);
  hn::Vec<D> r[kQ];
  for (int i = 0; i < n; i += 8) {
    const float* k8[8];
    for (int j = 0; j < 8; ++j) k8[j] = k[std::min(i + j, n - 1)];  // pad with a real row
    dot8_rows_wide<kG, kQ>(q, i + 8 <= n ? k + i : k8, dh, r);
    for (int g = 0; g < kQ; ++g) _mm256_storeu_ps(e[g] + i, _mm256_mul_ps(r[g].raw, vs));
  }
}
#endif

// scores_rows() on 8-lane vectors for dh % 16 == 0 and kQ queries; a last
// partial group of keys is padded with a real row so no lane reads past the
// rows given.
template <int kG, int kQ>
HWY_INLINE void scores8(const float* const* q, const float* const* k, int n, int64_t dh, float scale,
                        float* const* e) {
  const D d;
  const auto vs = hn::Set(d, scale);
  hn::Vec<D> r[kQ];
  for (int i = 0; i < n; i += 8) {
    const float* k8[8];
    for (int j = 0; j < 8; ++j) k8[j] = k[std::min(i + j, n - 1)];  // pad with a real row
    dot8_rows<kG, kQ>(q, i + 8 <= n ? k + i : k8, dh, r);
    for (int g = 0; g < kQ; ++g) hn::StoreU(hn::Mul(r[g], vs), d, e[g] + i);
  }
}

// Groups of up to 4 queries, on 16- or 8-wide registers.
template <int kG, int kQ>
HWY_INLINE void scores8_group(const float* const* q, const float* const* k, int n, int64_t dh, float scale,
                              float* const* e, bool wide) {
#if LOCKSTEP_ATTN_WIDE
  if (wide) return scores8_wide<kG, kQ>(q, k, n, dh, scale, e);
#else
  (void)wide;
#endif
  scores8<kG, kQ>(q, k, n, dh, scale, e);
}

template <int kG>
HWY_INLINE void scores8_rows(const float* const* q, int nq, const float* const* k, int n, int64_t dh,
                             float scale, float* const* e, bool wide) {
  int g = 0;
  for (; g + 4 <= nq; g += 4) scores8_group<kG, 4>(q + g, k, n, dh, scale, e + g, wide);
  switch (nq - g) {
    case 3: return scores8_group<kG, 3>(q + g, k, n, dh, scale, e + g, wide);
    case 2: return scores8_group<kG, 2>(q + g, k, n, dh, scale, e + g, wide);
    case 1: return scores8_group<kG, 1>(q + g, k, n, dh, scale, e + g, wide);
    default: return;
  }
}

// e[g][i] = canonical_dot(q[g], k[i], dh) * scale for g < nq, i < n, bit for
// bit: the scores of several queries (heads of a group, query rows of a tile)
// against the same keys, which are loaded once per group of up to 4 queries.
// May write each e[g] up to the next multiple of 8 past n. `wide`: 16-wide
// registers (wide_vectors(), read once per kernel call), the same bits.
HWY_INLINE void scores_rows(const float* const* q, int nq, const float* const* k, int n, int64_t dh,
                            float scale, float* const* e, bool wide) {
  if (n <= 0) return;
  if constexpr (hn::MaxLanes(D()) == 8) {
    switch (dh) {
      case 16: return scores8_rows<1>(q, nq, k, n, dh, scale, e, wide);
      case 32: return scores8_rows<2>(q, nq, k, n, dh, scale, e, wide);
      case 64: return scores8_rows<4>(q, nq, k, n, dh, scale, e, wide);
      case 128: return scores8_rows<8>(q, nq, k, n, dh, scale, e, wide);
      default:
        if (dh % kReduceLanes == 0) return scores8_rows<0>(q, nq, k, n, dh, scale, e, wide);
    }
  }
  for (int g = 0; g < nq; ++g)
    for (int i = 0; i < n; ++i) e[g][i] = dot(q[g], k[i], dh) * scale;
}

// e[i] = canonical_dot(q, k[i], dh) * scale for i < n, bit for bit. May write
// e up to the next multiple of 8 past n.
HWY_INLINE void scores(const float* q, const float* const* k, int n, int64_t dh, float scale, float* e,
                       bool wide) {
  scores_rows(&q, 1, k, n, dh, scale, &e, wide);
}

// acc[c, c + kW*N) of accumulate_heads for kM heads: kM * kW partial vectors,
// independent fma chains. Each loaded row vector feeds all kM heads.
template <int kM, int kW>
HWY_INLINE void accumulate_chunk(float* const* acc, int64_t c, bool zero, const float* alpha,
                                 const float* const* w, const float* const* rows, int n) {
  const D d;
  constexpr int64_t N = hn::MaxLanes(D());
  hn::Vec<D> a[kM][kW];
  for (int g = 0; g < kM; ++g) {
    const auto va = hn::Set(d, alpha[g]);
    const bool rescale = !zero && alpha[g] != 1.0f;  // x * 1 == x exactly: skipping is bit-identical
    for (int v = 0; v < kW; ++v) {
      a[g][v] = zero ? hn::Zero(d) : hn::LoadU(d, acc[g] + c + v * N);
      if (rescale) a[g][v] = hn::Mul(a[g][v], va);
    }
  }
  for (int i = 0; i < n; ++i) {
    const float* r = rows[i] + c;
    if constexpr (kM == 1) {
      const auto wi = hn::Set(d, w[0][i]);
      for (int v = 0; v < kW; ++v) a[0][v] = hn::MulAdd(wi, hn::LoadU(d, r + v * N), a[0][v]);
    } else {
      hn::Vec<D> rv[kW];
      for (int v = 0; v < kW; ++v) rv[v] = hn::LoadU(d, r + v * N);
      for (int g = 0; g < kM; ++g) {
        const auto wg = hn::Set(d, w[g][i]);
        for (int v = 0; v < kW; ++v) a[g][v] = hn::MulAdd(wg, rv[v], a[g][v]);
      }
    }
  }
  for (int g = 0; g < kM; ++g)
    for (int v = 0; v < kW; ++v) hn::StoreU(a[g][v], d, acc[g] + c + v * N);
}

#if LOCKSTEP_ATTN_WIDE
// accumulate_chunk on 16-wide registers: kW of them per head, the same
// per-element chains.
template <int kM, int kW>
__attribute__((target("avx512f"))) void accumulate_chunk_wide(float* const* acc, int64_t c, bool zero,
                                                              const float* alpha, const float* const* w,
                                                              const float* const* rows, int n) {
  constexpr int64_t N = 16;
  __m512 a[kM][kW];
  for (int g = 0; g < kM; ++g) {
    const __m512 va = _mm512_set1_ps(alpha[g]);
    const bool rescale = !zero && alpha[g] != 1.0f;
    for (int v = 0; v < kW; ++v) {
      a[g][v] = zero ? _mm512_setzero_ps() : _mm512_loadu_ps(acc[g] + c + v * N);
      if (rescale) a[g][v] = _mm512_mul_ps(a[g][v], va);
    }
  }
  for (int i = 0; i < n; ++i) {
    const float* r = rows[i] + c;
    __m512 rv[kW];
    for (int v = 0; v < kW; ++v) rv[v] = _mm512_loadu_ps(r + v * N);
    for (int g = 0; g < kM; ++g) {
      const __m512 wg = _mm512_set1_ps(w[g][i]);
      for (int v = 0; v < kW; ++v) a[g][v] = _mm512_fmadd_ps(wg, rv[v], a[g][v]);
    }
  }
  for (int g = 0; g < kM; ++g)
    for (int v = 0; v < kW; ++v) _mm512_storeu_ps(acc[g] + c + v * N, a[g][v]);
}
#endif

// For kM query heads that share the rows (one kv group): head g's acc[g][d] =
// zero ? 0 : acc[g][d] * alpha[g], then acc[g][d] = fma(w[g][i], rows[i][d],
// acc[g][d]) for i = 0..n-1 in order: one fma chain per element, so the bits
// do not depend on the vector width or on how many heads run together. The
// columns go in chunks wide enough for 8 independent chains (2 FMA ports x 4
// cycles of latency), so the chains do not wait on each other.
template <int kM>
HWY_INLINE void accumulate_heads(float* const* acc, int64_t dh, bool zero, const float* alpha,
                                 const float* const* w, const float* const* rows, int n, bool wide) {
  constexpr int64_t N = hn::MaxLanes(D());
  constexpr int kWide = kM == 1 ? 8 : kM == 2 ? 4 : 2;  // vectors per chunk
  int64_t c = 0;
#if LOCKSTEP_ATTN_WIDE
  if (wide) {
    // 8 to 16 independent chains of 16 lanes where the head width allows (a
    // whole 128-wide row for one or two heads: 32 registers hold 16
    // accumulators besides the row vectors), narrower chunks for the rest,
    // then the 8-wide code for a tail under 16.
    constexpr int kW16 = kM <= 2 ? 8 : 4;
    for (; c + kW16 * 16 <= dh; c += kW16 * 16)
      accumulate_chunk_wide<kM, kW16>(acc, c, zero, alpha, w, rows, n);
    if constexpr (kW16 > 4) {
      for (; c + 64 <= dh; c += 64) accumulate_chunk_wide<kM, 4>(acc, c, zero, alpha, w, rows, n);
    }
    if constexpr (kW16 > 2) {
      for (; c + 32 <= dh; c += 32) accumulate_chunk_wide<kM, 2>(acc, c, zero, alpha, w, rows, n);
    }
    for (; c + 16 <= dh; c += 16) accumulate_chunk_wide<kM, 1>(acc, c, zero, alpha, w, rows, n);
  }
#else
  (void)wide;
#endif
  for (; c + kWide * N <= dh; c += kWide * N) accumulate_chunk<kM, kWide>(acc, c, zero, alpha, w, rows, n);
  if constexpr (kWide > 2) {
    for (; c + 2 * N <= dh; c += 2 * N) accumulate_chunk<kM, 2>(acc, c, zero, alpha, w, rows, n);
  }
  for (; c + N <= dh; c += N) accumulate_chunk<kM, 1>(acc, c, zero, alpha, w, rows, n);
  for (; c < dh; ++c) {
    for (int g = 0; g < kM; ++g) {
      float a = zero ? 0.0f : acc[g][c];
      if (!zero && alpha[g] != 1.0f) a = a * alpha[g];
      for (int i = 0; i < n; ++i) a = std::fma(w[g][i], rows[i][c], a);
      acc[g][c] = a;
    }
  }
}

// acc[d] = acc[d] * alpha (or 0 when `zero`), then acc[d] = fma(w[i], rows[i][d], acc[d])
// for i = 0..n-1 in order: accumulate_heads for one head.
HWY_INLINE void scale_and_accumulate(float* acc, int64_t dh, bool zero, float alpha, const float* w,
                                     const float* const* rows, int n, bool wide) {
  accumulate_heads<1>(&acc, dh, zero, &alpha, &w, rows, n, wide);
}

// y[d] = x[d] * s (or / s when `divide`): the final normalization of a row.
HWY_INLINE void scale_row(float* y, const float* x, float s, bool divide, int64_t dh) {
  const D d;
  constexpr int64_t N = hn::MaxLanes(D());
  const auto vs = hn::Set(d, s);
  int64_t c = 0;
  for (; c + N <= dh; c += N) {
    const auto v = hn::LoadU(d, x + c);
    hn::StoreU(divide ? hn::Div(v, vs) : hn::Mul(v, vs), d, y + c);
  }
  for (; c < dh; ++c) y[c] = divide ? x[c] / s : x[c] * s;
}

}  // namespace lockstep::kernels::attn
