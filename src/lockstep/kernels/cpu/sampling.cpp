// The CPU sampling kernel: the definition of kernels/cpu/sampling.h computed
// serially per row (cum_j for every candidate), rows in parallel.
#include "lockstep/kernels/cpu/sampling.h"

#include <algorithm>
#include <numeric>

#include "lockstep/base/error.h"
#include "lockstep/kernels/cpu/simd.h"
#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::kernels {

namespace {

using namespace sampling;

int32_t greedy(const float* z, int64_t V) {
  int64_t best = 0;
  float bv = rank_value(z[0]);
  for (int64_t i = 1; i < V; ++i) {
    const float v = rank_value(z[i]);
    if (beats(v, i, bv, best)) {
      bv = v;
      best = i;
    }
  }
  return int32_t(best);
}

// The first K ids in the order (v desc, id asc).
std::vector<int32_t> sorted_prefix(const float* z, int64_t V, int64_t K) {
  std::vector<uint64_t> key(static_cast<size_t>(V));  // (V)
  for (int64_t i = 0; i < V; ++i) key[size_t(i)] = order_key(rank_value(z[i]), uint32_t(i));
  std::partial_sort(key.begin(), key.begin() + K, key.end());
  std::vector<int32_t> ids(static_cast<size_t>(K));
  for (int64_t j = 0; j < K; ++j) ids[size_t(j)] = int32_t(order_id(key[size_t(j)]));
  return ids;
}

// w[j] = weight_of(x_j, m) for the K candidates (ids, or 0..V-1 when empty),
// x = scaled(rank_value(z), T) and m the largest x over the whole row, in
// array form: one pass of ranks, m from their max, then the vector exp.
// Bits: the scalar definition's. Division by T > 0 is monotone, so the max of
// the x is the max rank divided by T; vexp is num::exp element for element; a
// max of -0 where the definition's running max kept +0 (or the reverse)
// changes neither x == m nor x - m.
void candidate_weights(const float* z, int64_t V, const std::vector<int32_t>& ids, float T, float* w) {
  const int64_t K = ids.empty() ? V : int64_t(ids.size());
  std::vector<float> x(static_cast<size_t>(std::max(V, K)));  // (V) ranks, then (K) scaled
  for (int64_t i = 0; i < V; ++i) x[size_t(i)] = rank_value(z[i]);
  const float m = scaled(max_reduce(x.data(), V), T);
  if (!ids.empty()) {
    for (int64_t j = 0; j < K; ++j) x[size_t(j)] = rank_value(z[ids[size_t(j)]]);
  }
  for (int64_t j = 0; j < K; ++j) x[size_t(j)] = scaled(x[size_t(j)], T);
  for (int64_t j = 0; j < K; ++j) w[j] = gpu::ls_sub(x[size_t(j)], m);
  vexp(w, w, K);
  for (int64_t j = 0; j < K; ++j)
    if (x[size_t(j)] == m) w[j] = 1.0f;
}

// The first j < n with t < cum[j] (the caller guarantees cum[n-1] > t).
int64_t first_above(const std::vector<double>& cum, int64_t n, double t) {
  int64_t j = 0;
  while (j < n - 1 && !(t < cum[size_t(j)])) ++j;
  return j;
}

}  // namespace

int32_t sample_row(const float* z, int64_t V, const SampleSpec& s, double u) {
  LS_CHECK(V >= 1) << "sample_row: empty vocabulary";
  const int mode = mode_of(s, V);
  if (mode == kGreedy) return greedy(z, V);
  const float T = s.temperature;
  int64_t K = V;
  std::vector<int32_t> ids;  // (K) the candidates; empty: ids in order
  if (mode == kSorted) {
    K = kept_by_k(s, V);
    ids = sorted_prefix(z, V, K);
  }
  std::vector<float> w(static_cast<size_t>(K));  // (K) weights
  candidate_weights(z, V, ids, T, w.data());
  std::vector<double> cum(static_cast<size_t>(K));  // (K) blocked cumulative sums
  double P = 0, q = 0;
  for (int64_t j = 0; j < K; ++j) {
    if (j > 0 && j % kChunk == 0) {
      P = dadd(P, q);
      q = 0;
    }
    q = dadd(q, double(w[size_t(j)]));
    cum[size_t(j)] = dadd(P, q);
  }
  int64_t keep = K;
  if (s.min_p > 0.0f) {
    keep = 1;
    while (keep < K && !(w[size_t(keep)] < s.min_p)) ++keep;
  }
  if (s.top_p < 1.0f) {
    const double thr = dmul(double(s.top_p), cum[size_t(keep - 1)]);
    int64_t k = 0;
    while (k < keep - 1 && !(cum[size_t(k)] >= thr)) ++k;
    keep = k + 1;
  }
  const double t = target_of(u, cum[size_t(keep - 1)]);
  const int64_t j = first_above(cum, keep, t);
  return int32_t(ids.empty() ? j : int64_t(ids[size_t(j)]));
}

namespace detail {

int64_t check_sample_rows(const Tensor& tokens_out, const Tensor& logits, const std::vector<SampleSpec>& rows) {
  const int64_t R = int64_t(rows.size());
  LS_CHECK(logits.ndim == 2 && logits.dtype == DType::F32)
      << "sample_rows: logits must be (N, V) f32, got " << logits.shape_str();
  const int64_t N = logits.dim(0), V = logits.dim(1);
  LS_CHECK(V >= 1) << "sample_rows: empty vocabulary";
  LS_CHECK(V <= int64_t(INT32_MAX)) << "sample_rows: V " << V << " does not fit token ids";
  LS_CHECK(logits.stride[1] == 1 && logits.stride[0] >= V)
      << "sample_rows: logits rows must be contiguous, got " << logits.shape_str();
  LS_CHECK(tokens_out.ndim == 1 && tokens_out.dtype == DType::I32 && tokens_out.dim(0) == R &&
           (R <= 1 || tokens_out.stride[0] == 1))
      << "sample_rows: tokens_out must be (" << R << ") i32 contiguous, got " << tokens_out.shape_str();
  for (int64_t i = 0; i < R; ++i) {
    const SampleSpec& s = rows[size_t(i)];
    LS_CHECK(s.logit_row >= 0 && s.logit_row < N)
        << "sample_rows: draw " << i << " reads logits row " << s.logit_row << " of " << N;
    LS_CHECK(s.temperature >= 0.0f && s.temperature <= 3.4e38f)
        << "sample_rows: draw " << i << " temperature must be finite and >= 0, got " << s.temperature;
    LS_CHECK(s.top_p > 0.0f && s.top_p <= 1.0f)
        << "sample_rows: draw " << i << " top_p must be in (0, 1], got " << s.top_p;
    LS_CHECK(s.min_p >= 0.0f && s.min_p <= 1.0f)
        << "sample_rows: draw " << i << " min_p must be in [0, 1], got " << s.min_p;
  }
  return V;
}

}  // namespace detail

void sample_rows(const Context& ctx, Tensor tokens_out, const Tensor& logits, const std::vector<SampleSpec>& rows) {
  LS_GPU_DISPATCH(ctx, sample_rows, tokens_out, logits, rows);
  const int64_t V = detail::check_sample_rows(tokens_out, logits, rows);
  int32_t* out = tokens_out.i32();
  ctx.parallel_for(int64_t(rows.size()), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const SampleSpec& s = rows[size_t(r)];
      out[r] = sample_row(logits.f32() + s.logit_row * logits.stride[0], V, s, draw(s));
    }
  });
}

}  // namespace lockstep::kernels
