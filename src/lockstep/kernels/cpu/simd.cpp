// Highway implementations of the canonical reductions and elementwise math.
// Compiled for the static target chosen by -march (AVX2+FMA by default).
#include "lockstep/kernels/cpu/simd.h"

#include <cmath>
#include <cstring>

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "lockstep/kernels/cpu/wide.h"
#include "lockstep/kernels/numerics.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define LOCKSTEP_EXP_WIDE 1
#else
#define LOCKSTEP_EXP_WIDE 0
#endif

namespace lockstep::kernels {
namespace hn = hwy::HWY_NAMESPACE;

namespace {

using D = hn::ScalableTag<float>;

enum class Op { Sum, Dot, SumSq };

template <Op kOp>
float reduce16(const float* a, const float* b, int64_t n) {
  const D d;
  constexpr int64_t kMaxVec = kReduceLanes;  // supports vectors of up to 16 floats
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  static_assert(kReduceLanes % 4 == 0 && kReduceLanes == num::kLanes);
  const int64_t nvec = kReduceLanes / N;  // vectors per 16-lane group: 4, 2 or 1
  hn::Vec<D> acc[kMaxVec];
  for (int64_t j = 0; j < nvec; ++j) acc[j] = hn::Zero(d);
  const int64_t full = n / kReduceLanes * kReduceLanes;
  for (int64_t i = 0; i < full; i += kReduceLanes) {
    for (int64_t j = 0; j < nvec; ++j) {
      const auto x = hn::LoadU(d, a + i + j * N);
      if constexpr (kOp == Op::Sum) {
        acc[j] = hn::Add(acc[j], x);
      } else if constexpr (kOp == Op::Dot) {
        acc[j] = hn::MulAdd(x, hn::LoadU(d, b + i + j * N), acc[j]);
      } else {
        acc[j] = hn::MulAdd(x, x, acc[j]);
      }
    }
  }
  HWY_ALIGN float lanes[kReduceLanes];
  for (int64_t j = 0; j < nvec; ++j) hn::Store(acc[j], d, lanes + j * N);
  for (int64_t i = full; i < n; ++i) {
    float& l = lanes[i - full];
    if constexpr (kOp == Op::Sum) {
      l = l + a[i];
    } else if constexpr (kOp == Op::Dot) {
      l = std::fma(a[i], b[i], l);
    } else {
      l = std::fma(a[i], a[i], l);
    }
  }
  return num::tree16(lanes);  // the fixed tree, shared with the GPU kernels
}

enum class Fn { Exp, Log, Sigmoid, Silu };

// Highway's Exp is only valid up to about +88 (above ~176 it returns garbage,
// e.g. exp(200) = 0); clamping at 89 yields +inf there, the correct f32 result.
inline hn::Vec<D> exp_clamped(D d, hn::Vec<D> x) { return hn::Exp(d, hn::Min(x, hn::Set(d, 89.0f))); }

template <Fn kFn>
inline hn::Vec<D> apply(D d, hn::Vec<D> x) {
  if constexpr (kFn == Fn::Exp) {
    return exp_clamped(d, x);
  } else if constexpr (kFn == Fn::Log) {
    return hn::Log(d, x);
  } else if constexpr (kFn == Fn::Sigmoid) {
    const auto one = hn::Set(d, 1.0f);
    return hn::Div(one, hn::Add(one, exp_clamped(d, hn::Neg(x))));
  } else {
    const auto one = hn::Set(d, 1.0f);
    return hn::Div(x, hn::Add(one, exp_clamped(d, hn::Neg(x))));
  }
}

// Highway's polynomials map NaN to finite values (exp(NaN) = 0); a NaN must
// reach the loss so the step can be skipped and reported, so pass it through.
template <Fn kFn>
inline hn::Vec<D> apply_nan(D d, hn::Vec<D> x) {
  return hn::IfThenElse(hn::Eq(x, x), apply<kFn>(d, x), x);
}

template <Fn kFn>
void map(const float* x, float* y, int64_t n) {
  const D d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(apply_nan<kFn>(d, hn::LoadU(d, x + i)), d, y + i);
  if (i < n) {
    // Tail through the same vector code so every element gets identical bits.
    HWY_ALIGN float buf[kReduceLanes] = {0};
    std::memcpy(buf, x + i, static_cast<size_t>(n - i) * sizeof(float));
    hn::Store(apply_nan<kFn>(d, hn::Load(d, buf)), d, buf);
    std::memcpy(y + i, buf, static_cast<size_t>(n - i) * sizeof(float));
  }
}

#if LOCKSTEP_EXP_WIDE
// apply_nan<Fn::Exp> on 16-wide registers (wide_vectors()): Highway's Exp of
// min(x, 89) spelled out operation for operation (num::exp in numerics.h
// walks the same steps), each lane the same bits as on 8 lanes; NaN passes
// through. The exhaustive test (tests/gpu/numerics_slow.cpp) checks every
// f32 input against num::exp.
__attribute__((target("avx512f"))) inline __m512 splat16(float v) {
  return _mm512_set1_ps(v);
}
__attribute__((target("avx512f"))) inline __m512 exp16(__m512 x) {
  const __m512 xc = _mm512_min_ps(x, splat16(89.0f));  // vminps: 89 where x is NaN, as hn::Min
  // q = trunc(x / ln2 + copysign(0.5, x))
  const __m512i sign =
      _mm512_and_si512(_mm512_castps_si512(xc), _mm512_set1_epi32(static_cast<int>(0x80000000u)));
  const __m512 half = _mm512_castsi512_ps(_mm512_or_si512(sign, _mm512_set1_epi32(0x3f000000)));
  const __m512i q = _mm512_cvttps_epi32(_mm512_fmadd_ps(xc, splat16(+1.442695040888963407359924681f), half));
  const __m512 qf = _mm512_cvtepi32_ps(q);
  __m512 r = _mm512_fmadd_ps(qf, splat16(-0.693145751953125f), xc);
  r = _mm512_fmadd_ps(qf, splat16(-1.428606765330187045e-6f), r);
  // ExpPoly: Estrin's scheme, then r + r^2 * p.
  const __m512 r2 = _mm512_mul_ps(r, r);
  const __m512 r4 = _mm512_mul_ps(r2, r2);
  const __m512 est = _mm512_fmadd_ps(
      r4,
      _mm512_fmadd_ps(splat16(+0.000198527617612853646278381f), r, splat16(+0.00139304355252534151077271f)),
      _mm512_fmadd_ps(
          r2,
          _mm512_fmadd_ps(splat16(+0.00833336077630519866943359f), r, splat16(+0.0416664853692054748535156f)),
          _mm512_fmadd_ps(splat16(+0.166666671633720397949219f), r, splat16(+0.5f))));
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(est, _mm512_mul_ps(r, r), r), splat16(1.0f));
  // LoadExpShortRange: y * 2^(q >> 1) * 2^(q - (q >> 1)).
  const __m512i h = _mm512_srai_epi32(q, 1);
  const __m512i bias = _mm512_set1_epi32(0x7f);
  const __m512 p0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(h, bias), 23));
  const __m512 p1 =
      _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_sub_epi32(q, h), bias), 23));
  const __m512 e = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(xc, splat16(-104.0f), _CMP_GE_OQ),
                                       _mm512_mul_ps(_mm512_mul_ps(y, p0), p1));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_EQ_OQ), x, e);
}

// The whole 16-float groups of exp's map on 16-wide registers; returns how
// many it did.
__attribute__((target("avx512f"))) int64_t exp_wide(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, exp16(_mm512_loadu_ps(x + i)));
  return i;
}
#endif

}  // namespace

float canonical_sum(const float* x, int64_t n) { return reduce16<Op::Sum>(x, nullptr, n); }
float canonical_dot(const float* a, const float* b, int64_t n) { return reduce16<Op::Dot>(a, b, n); }
float canonical_sum_sq(const float* x, int64_t n) { return reduce16<Op::SumSq>(x, nullptr, n); }

namespace {
float max_reduce_scalar(const float* x, int64_t n) {
  float m = x[0];
  for (int64_t i = 1; i < n; ++i) m = (x[i] > m || std::isnan(x[i])) ? x[i] : m;
  return m;
}
}  // namespace

// The bits of the scalar definition above, vectorized where the order cannot
// matter: a nonzero, non-NaN maximum has a single bit pattern, whichever lane
// finds it. A zero maximum (+0 and -0 compare equal; the first one wins) or a
// NaN anywhere (the last one wins) defers to the scalar loop.
float max_reduce(const float* x, int64_t n) {
  const D d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  if (n < 2 * N) return max_reduce_scalar(x, n);
  auto m = hn::LoadU(d, x);
  auto nan = hn::VecFromMask(d, hn::IsNaN(m));
  int64_t i = N;
  for (; i + N <= n; i += N) {
    const auto v = hn::LoadU(d, x + i);
    m = hn::Max(m, v);
    nan = hn::Or(nan, hn::VecFromMask(d, hn::IsNaN(v)));
  }
  if (!hn::AllFalse(d, hn::MaskFromVec(nan))) return max_reduce_scalar(x, n);
  float r = hn::GetLane(hn::MaxOfLanes(d, m));
  for (; i < n; ++i) {
    if (std::isnan(x[i])) return max_reduce_scalar(x, n);
    r = x[i] > r ? x[i] : r;
  }
  return r == 0.0f ? max_reduce_scalar(x, n) : r;
}

void vexp(const float* x, float* y, int64_t n) {
#if LOCKSTEP_EXP_WIDE
  if (n >= 16 && wide_vectors()) {
    const int64_t done = exp_wide(x, y, n);
    x += done;
    y += done;
    n -= done;
  }
#endif
  map<Fn::Exp>(x, y, n);
}
void vlog(const float* x, float* y, int64_t n) { map<Fn::Log>(x, y, n); }
void vsigmoid(const float* x, float* y, int64_t n) { map<Fn::Sigmoid>(x, y, n); }
void vsilu(const float* x, float* y, int64_t n) { map<Fn::Silu>(x, y, n); }
// The scalar forms are numerics.h's ports of the vector code above (the same
// bits for every input: tests/gpu/numerics_slow.cpp checks all 2^32).
float exp1(float x) { return num::exp(x); }
float log1(float x) { return num::log(x); }
float sigmoid1(float x) { return num::sigmoid(x); }
float silu1(float x) { return num::silu(x); }

}  // namespace lockstep::kernels

namespace lockstep::kernels {
const char* simd_target_name() { return hwy::TargetName(HWY_STATIC_TARGET); }
}  // namespace lockstep::kernels
