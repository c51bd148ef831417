// The definition of token sampling, as host/device code shared by the CPU
// kernel (kernels/cpu/sampling.cpp) and the GPU kernel (kernels/gpu/sampling.cu):
// the per-row parameters, the ranking, the weights and the rounded sums.
#pragma once

#include <cstdint>

#include "lockstep/base/philox.h"
#include "lockstep/kernels/numerics.h"

namespace lockstep::kernels {

// One draw: which logits row it reads, how it is truncated, and its random
// number, u = Philox(seed) at (stream, counter) as Philox::uniform_double (53
// bits). Plain data: copied to device memory as it is.
struct SampleSpec {
  int64_t logit_row = 0;     // row of the logits (several draws may share one)
  float temperature = 1.0f;  // 0: greedy
  int64_t top_k = 0;         // <= 0 or >= V: off; 1: greedy
  float top_p = 1.0f;        // in (0, 1]; 1: off
  float min_p = 0.0f;        // in [0, 1]; 0: off
  uint64_t seed = 0;         // Philox key
  uint64_t stream = 0;       // high 64 bits of the Philox counter
  uint64_t counter = 0;      // low 64 bits (the rollout engine: the token's position)
};

namespace sampling {

// Weights are summed in chunks of this many candidates (the definition, not a
// launch parameter): sequentially inside a chunk, then the chunk sums in order.
constexpr int64_t kChunk = 256;

enum Mode : int { kGreedy = 0, kInOrder = 1, kSorted = 2 };

LS_HD inline int mode_of(const SampleSpec& s, int64_t V) {
  if (s.temperature == 0.0f || s.top_k == 1) return kGreedy;
  const bool by_k = s.top_k > 0 && s.top_k < V;
  return (by_k || s.top_p < 1.0f || s.min_p > 0.0f) ? kSorted : kInOrder;
}

// Candidates top-k keeps (before min-p and top-p).
LS_HD inline int64_t kept_by_k(const SampleSpec& s, int64_t V) {
  return (s.top_k > 0 && s.top_k < V) ? s.top_k : V;
}

// Explicitly rounded double operations (one IEEE round-to-nearest-even each);
// the CPU kernel sums in double at the same points.
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
LS_HD LS_INLINE double dadd(double a, double b) { return __dadd_rn(a, b); }
LS_HD LS_INLINE double dmul(double a, double b) { return __dmul_rn(a, b); }
LS_HD LS_INLINE double double_below(double s) {
  return __longlong_as_double(__double_as_longlong(s) - 1);
}
#else
LS_HD inline double dadd(double a, double b) { return a + b; }
LS_HD inline double dmul(double a, double b) { return a * b; }
LS_HD inline double double_below(double s) {
  return __builtin_bit_cast(double, __builtin_bit_cast(uint64_t, s) - 1);
}
#endif

// The value a logit is ranked and weighted by: NaN counts as -inf, -0 as +0.
LS_HD inline float rank_value(float z) {
  if (num::is_nan(z)) return num::from_bits(0xff800000u);
  return z == 0.0f ? 0.0f : z;
}

// Ascending order of these keys is (rank value descending, id ascending): the
// order-preserving map of the float bits, complemented, above the id.
LS_HD inline uint64_t order_key(float v, uint32_t id) {
  const uint32_t b = num::bits(v);
  const uint32_t asc = (b & 0x80000000u) != 0 ? ~b : (b | 0x80000000u);
  return (static_cast<uint64_t>(~asc) << 32) | id;
}
LS_HD inline int64_t order_id(uint64_t key) { return static_cast<int64_t>(static_cast<uint32_t>(key)); }

// Greedy's rule: a beats b when its rank value is larger, or equal with a lower id.
LS_HD inline bool beats(float va, int64_t ia, float vb, int64_t ib) {
  return va > vb || (va == vb && ia < ib);
}

// x = v / T, one f32 division.
LS_HD inline float scaled(float v, float temperature) { return gpu::ls_div(v, temperature); }

// w = exp(x - m) in f32 (num::exp: the CPU's vexp bits), m the row's largest
// x. x == m gives 1 also when m is infinite (a row of -inf logits is then
// uniform; a +inf logit takes all the mass).
LS_HD inline float weight_of(float x, float m) { return x == m ? 1.0f : num::exp(gpu::ls_sub(x, m)); }

// u in [0, 1): Philox::uniform_double's bits (an exact 53-bit integer times 2^-53).
LS_HD inline double draw(const SampleSpec& s) {
  return dmul(static_cast<double>(philox::bits53(s.seed, s.stream, s.counter)), 1.0 / 9007199254740992.0);
}

// The target u * S, rounded, kept below S (>= 1 here) so that it falls in the
// interval of a candidate of positive weight.
LS_HD inline double target_of(double u, double S) {
  const double t = dmul(u, S);
  return t < S ? t : double_below(S);
}

}  // namespace sampling
}  // namespace lockstep::kernels
