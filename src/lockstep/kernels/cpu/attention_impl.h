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
  // scratch tiles kt, vt (n, Dh); f32 rows are read in place.
  void gather(const int32_t* row, int64_t p0, int n, int64_t kvh, const float** kp, const float** vp,
              float* kt, float* vt) const {
    int64_t b = p0 / BS, slot = p0 % BS;
    for (int i = 0; i < n; ++i) {
      const int64_t off = offset(row[b], slot, kvh);
      if (bf16) {
        widen_bf16(static_cast<const bf16_t*>(k) + off, kt + i * Dh, Dh);
        widen_bf16(static_cast<const bf16_t*>(v) + off, vt + i * Dh, Dh);
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

// canonical_dot(q, k[i], dh) for 8 keys at once, bit for bit (8-lane vectors,
// dh % 16 == 0). Each key's 16 lane partials fold to 8 (one add); the rest of
// the fixed tree (j += j+4, j+2, j+1) runs on all 8 keys together with
// cross-key shuffles, so lane i of the result is key i's dot. The keys are fed
// in the order 0,4 | 2,6 | 1,5 | 3,7 that makes the shuffles land in place.
// kG = dh / 16 when known at compile time (the loop unrolls), 0 otherwise.
template <int kG>
HWY_INLINE hn::Vec<D> dot8(const float* q, const float* const* k, int64_t dh) {
  const D d;
  const hn::Repartition<double, D> dd;  // 64-bit interleaves, float domain
  const int64_t len = kG > 0 ? kG * kReduceLanes : dh;
  auto key = [&](int i) {
    auto a0 = hn::Zero(d), a1 = hn::Zero(d);
    for (int64_t c = 0; c < len; c += kReduceLanes) {
      a0 = hn::MulAdd(hn::LoadU(d, q + c), hn::LoadU(d, k[i] + c), a0);
      a1 = hn::MulAdd(hn::LoadU(d, q + c + 8), hn::LoadU(d, k[i] + c + 8), a1);
    }
    return hn::Add(a0, a1);  // lane j: j + (j+8)
  };
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
  // Folded as soon as computed, to keep few vectors live.
  const auto x04 = fold4(key(0), key(4));
  const auto x26 = fold4(key(2), key(6));
  const auto y1 = fold2(x04, x26);  // [k0 k0 k2 k2 | k4 k4 k6 k6]
  const auto x15 = fold4(key(1), key(5));
  const auto x37 = fold4(key(3), key(7));
  const auto y2 = fold2(x15, x37);                   // [k1 k1 k3 k3 | k5 k5 k7 k7]
  const auto z1 = hn::Add(y1, hn::Shuffle2301(y1));  // even lanes: keys 0 2 4 6
  const auto z2 = hn::Add(y2, hn::Shuffle2301(y2));  // odd lanes: keys 1 3 5 7
  return hn::OddEven(z2, z1);
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

// scores() on 8-lane vectors for dh % 16 == 0; a last partial group of keys is
// padded with a real row so no lane reads past the rows given.
template <int kG>
HWY_INLINE void scores8(const float* q, const float* const* k, int n, int64_t dh, float scale, float* e) {
  const D d;
  const auto vs = hn::Set(d, scale);
  int i = 0;
  for (; i + 8 <= n; i += 8) hn::StoreU(hn::Mul(dot8<kG>(q, k + i, dh), vs), d, e + i);
  if (i < n) {
    const float* k8[8];
    for (int j = 0; j < 8; ++j) k8[j] = k[std::min(i + j, n - 1)];  // pad with a real row
    hn::StoreU(hn::Mul(dot8<kG>(q, k8, dh), vs), d, e + i);
  }
}

// e[i] = canonical_dot(q, k[i], dh) * scale for i < n, bit for bit. May write
// e up to the next multiple of 8 past n.
HWY_INLINE void scores(const float* q, const float* const* k, int n, int64_t dh, float scale, float* e) {
  if constexpr (hn::MaxLanes(D()) == 8) {
    switch (dh) {
      case 16: return scores8<1>(q, k, n, dh, scale, e);
      case 32: return scores8<2>(q, k, n, dh, scale, e);
      case 64: return scores8<4>(q, k, n, dh, scale, e);
      case 128: return scores8<8>(q, k, n, dh, scale, e);
      default:
        if (dh % kReduceLanes == 0) return scores8<0>(q, k, n, dh, scale, e);
    }
  }
  for (int i = 0; i < n; ++i) e[i] = dot(q, k[i], dh) * scale;
}

// acc[d] = acc[d] * alpha (or 0 when `zero`), then acc[d] = fma(w[i], rows[i][d], acc[d])
// for i = 0..n-1 in order: one fma chain per element, so the bits do not depend
// on the vector width. Rows are walked in chunks of 4 vectors so the partial
// sums stay in registers across the n rows.
HWY_INLINE void scale_and_accumulate(float* acc, int64_t dh, bool zero, float alpha, const float* w,
                                     const float* const* rows, int n) {
  const D d;
  constexpr int64_t N = hn::MaxLanes(D());
  const bool rescale = !zero && alpha != 1.0f;  // x * 1 == x exactly: skipping is bit-identical
  const auto va = hn::Set(d, alpha);
  int64_t c = 0;
  for (; c + 4 * N <= dh; c += 4 * N) {
    auto a0 = zero ? hn::Zero(d) : hn::LoadU(d, acc + c);
    auto a1 = zero ? hn::Zero(d) : hn::LoadU(d, acc + c + N);
    auto a2 = zero ? hn::Zero(d) : hn::LoadU(d, acc + c + 2 * N);
    auto a3 = zero ? hn::Zero(d) : hn::LoadU(d, acc + c + 3 * N);
    if (rescale) {
      a0 = hn::Mul(a0, va);
      a1 = hn::Mul(a1, va);
      a2 = hn::Mul(a2, va);
      a3 = hn::Mul(a3, va);
    }
    for (int i = 0; i < n; ++i) {
      const auto wi = hn::Set(d, w[i]);
      const float* r = rows[i] + c;
      a0 = hn::MulAdd(wi, hn::LoadU(d, r), a0);
      a1 = hn::MulAdd(wi, hn::LoadU(d, r + N), a1);
      a2 = hn::MulAdd(wi, hn::LoadU(d, r + 2 * N), a2);
      a3 = hn::MulAdd(wi, hn::LoadU(d, r + 3 * N), a3);
    }
    hn::StoreU(a0, d, acc + c);
    hn::StoreU(a1, d, acc + c + N);
    hn::StoreU(a2, d, acc + c + 2 * N);
    hn::StoreU(a3, d, acc + c + 3 * N);
  }
  for (; c + N <= dh; c += N) {
    auto a0 = zero ? hn::Zero(d) : hn::LoadU(d, acc + c);
    if (rescale) a0 = hn::Mul(a0, va);
    for (int i = 0; i < n; ++i) a0 = hn::MulAdd(hn::Set(d, w[i]), hn::LoadU(d, rows[i] + c), a0);
    hn::StoreU(a0, d, acc + c);
  }
  for (; c < dh; ++c) {
    float a = zero ? 0.0f : acc[c];
    if (rescale) a = a * alpha;
    for (int i = 0; i < n; ++i) a = std::fma(w[i], rows[i][c], a);
    acc[c] = a;
  }
}

// The same for kM query heads that share the rows (one kv group): head g's
// acc[g][d] = zero ? 0 : acc[g][d] * alpha[g], then fma(w[g][i], rows[i][d], .)
// for i in order. Each loaded row feeds all kM heads, and the kM * 2 partial
// vectors give independent fma chains to hide the fma latency; the bits of
// every element are those of scale_and_accumulate for that head alone.
template <int kM>
HWY_INLINE void accumulate_heads(float* const* acc, int64_t dh, bool zero, const float* alpha,
                                 const float* const* w, const float* const* rows, int n) {
  const D d;
  constexpr int64_t N = hn::MaxLanes(D());
  int64_t c = 0;
  for (; c + 2 * N <= dh; c += 2 * N) {
    hn::Vec<D> a0[kM], a1[kM];
    for (int g = 0; g < kM; ++g) {
      const auto va = hn::Set(d, alpha[g]);
      a0[g] = zero ? hn::Zero(d) : hn::Mul(hn::LoadU(d, acc[g] + c), va);
      a1[g] = zero ? hn::Zero(d) : hn::Mul(hn::LoadU(d, acc[g] + c + N), va);
    }
    for (int i = 0; i < n; ++i) {
      const auto v0 = hn::LoadU(d, rows[i] + c);
      const auto v1 = hn::LoadU(d, rows[i] + c + N);
      for (int g = 0; g < kM; ++g) {
        const auto wg = hn::Set(d, w[g][i]);
        a0[g] = hn::MulAdd(wg, v0, a0[g]);
        a1[g] = hn::MulAdd(wg, v1, a1[g]);
      }
    }
    for (int g = 0; g < kM; ++g) {
      hn::StoreU(a0[g], d, acc[g] + c);
      hn::StoreU(a1[g], d, acc[g] + c + N);
    }
  }
  for (; c + N <= dh; c += N) {
    hn::Vec<D> a0[kM];
    for (int g = 0; g < kM; ++g)
      a0[g] = zero ? hn::Zero(d) : hn::Mul(hn::LoadU(d, acc[g] + c), hn::Set(d, alpha[g]));
    for (int i = 0; i < n; ++i) {
      const auto v0 = hn::LoadU(d, rows[i] + c);
      for (int g = 0; g < kM; ++g) a0[g] = hn::MulAdd(hn::Set(d, w[g][i]), v0, a0[g]);
    }
    for (int g = 0; g < kM; ++g) hn::StoreU(a0[g], d, acc[g] + c);
  }
  for (; c < dh; ++c) {
    for (int g = 0; g < kM; ++g) {
      float a = zero ? 0.0f : acc[g][c] * alpha[g];
      for (int i = 0; i < n; ++i) a = std::fma(w[g][i], rows[i][c], a);
      acc[g][c] = a;
    }
  }
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
