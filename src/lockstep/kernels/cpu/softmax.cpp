// Softmax family: one row pass (scale by temperature, max, exp, canonical sum,
// log) shared by every entry point, so all of them see the same m, s and ls.
#include "lockstep/kernels/cpu/softmax.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/kernels/cpu/simd.h"
#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::kernels {

namespace {

void check_mat(const Tensor& t, int64_t T, int64_t V, const char* what) {
  check_dtype(t, DType::F32, what);
  check_shape(t, {T, V}, what);
  if (t.stride[1] != 1 || (t.shape[0] > 1 && t.stride[0] < t.shape[1]))
    LS_THROW << what << ": rows must have unit column stride and stride[0] >= width, got " << t.shape_str()
             << " with strides (" << t.stride[0] << ", " << t.stride[1] << ")";
}

void check_vec(const Tensor& t, int64_t n, DType dtype, const char* what) {
  check_dtype(t, dtype, what);
  check_shape(t, {n}, what);
  if (n > 1 && t.stride[0] != 1) LS_THROW << what << ": must be contiguous, got " << t.shape_str();
}

// Checks logits (T, V) and the temperature; returns (T, V).
std::pair<int64_t, int64_t> check_logits(const Tensor& logits, float temperature, const char* fn) {
  const std::string what = std::string(fn) + ": logits (T, V)";
  check_dtype(logits, DType::F32, what.c_str());
  check_shape(logits, {-1, -1}, what.c_str());
  check_mat(logits, logits.shape[0], logits.shape[1], what.c_str());
  if (logits.shape[1] < 1) LS_THROW << what << ": needs V >= 1, got " << logits.shape_str();
  if (!(temperature > 0.0f) || !std::isfinite(temperature))
    LS_THROW << fn << ": temperature must be positive and finite, got " << temperature;
  return {logits.shape[0], logits.shape[1]};
}

void check_targets(const Tensor& targets, int64_t T, int64_t V, const char* fn) {
  const std::string what = std::string(fn) + ": targets (T,)";
  check_vec(targets, T, DType::I32, what.c_str());
  std::vector<unsigned char> keep;
  const int32_t* y = host_readable(targets, keep).i32();
  for (int64_t t = 0; t < T; ++t)
    if (y[t] < 0 || y[t] >= V)
      LS_THROW << fn << ": target id " << y[t] << " in row " << t << " is outside [0, " << V << ")";
}

// Rows per task: about 16K elements of work, at least one row.
int64_t row_grain(int64_t V) {
  return std::max<int64_t>(1, 16384 / V);
}

// Lower clamp of z - m: below -104 the f32 exp is exactly 0, so clamping at
// -128 changes no probability, yet keeps d finite for -inf logits (so 0 * d
// is 0, not NaN, in the entropy and its gradient) and small enough that
// dentropy * d cannot overflow.
constexpr float kMinShift = -128.0f;

struct RowStats {
  float m;   // max of z
  float s;   // canonical_sum of e
  float ls;  // log1(s)
};

// The one row pass (see softmax.h). d (V) gets clamped z - m, e (V) gets exp(d).
RowStats row_pass(const float* logits, int64_t V, float temperature, float* d, float* e) {
  for (int64_t i = 0; i < V; ++i) d[i] = logits[i] / temperature;
  const float m = max_reduce(d, V);
  // std::max(x, lo) returns x when x is NaN, so NaN still propagates.
  for (int64_t i = 0; i < V; ++i) d[i] = std::max(d[i] - m, kMinShift);
  vexp(d, e, V);
  const float s = canonical_sum(e, V);
  return {m, s, log1(s)};
}

// z_i - m without the clamp: what logp uses, so -inf logits give -inf.
inline float shifted(const float* logits, int64_t i, float temperature, float m) {
  return logits[i] / temperature - m;
}

}  // namespace

namespace detail {

LogitsShape check_token_logprob_forward(const Tensor& logp, const Tensor& entropy, const Tensor& lse,
                                        const Tensor& logits, const Tensor& targets, float temperature) {
  const auto [T, V] = check_logits(logits, temperature, "token_logprob_forward");
  check_vec(logp, T, DType::F32, "token_logprob_forward: logp (T,)");
  if (entropy.ndim != 0) check_vec(entropy, T, DType::F32, "token_logprob_forward: entropy (T,)");
  if (lse.ndim != 0) check_vec(lse, T, DType::F32, "token_logprob_forward: lse (T,)");
  check_targets(targets, T, V, "token_logprob_forward");
  return {T, V};
}

LogitsShape check_token_logprob_backward(const Tensor& dlogits, const Tensor& dlogp, const Tensor& dentropy,
                                         const Tensor& logits, const Tensor& targets, float temperature) {
  const auto [T, V] = check_logits(logits, temperature, "token_logprob_backward");
  check_mat(dlogits, T, V, "token_logprob_backward: dlogits (T, V)");
  if (dlogp.ndim != 0) check_vec(dlogp, T, DType::F32, "token_logprob_backward: dlogp (T,)");
  if (dentropy.ndim != 0) check_vec(dentropy, T, DType::F32, "token_logprob_backward: dentropy (T,)");
  check_targets(targets, T, V, "token_logprob_backward");
  return {T, V};
}

LogitsShape check_token_logprob_stats(const Tensor& stats, const Tensor& logits, float temperature) {
  const auto [T, V] = check_logits(logits, temperature, "token_logprob_stats");
  check_mat(stats, T, 4, "token_logprob_stats: stats (T, 4)");
  return {T, V};
}

LogitsShape check_token_logprob_backward_cols(const Tensor& dlogits, const Tensor& dlogp,
                                              const Tensor& dentropy, const Tensor& logits,
                                              const Tensor& targets, const Tensor& stats, int64_t col0,
                                              float temperature) {
  const auto [T, W] = check_logits(logits, temperature, "token_logprob_backward_cols");
  check_mat(dlogits, T, W, "token_logprob_backward_cols: dlogits (T, W)");
  check_mat(stats, T, 4, "token_logprob_backward_cols: stats (T, 4)");
  if (dlogp.ndim != 0) check_vec(dlogp, T, DType::F32, "token_logprob_backward_cols: dlogp (T,)");
  if (dentropy.ndim != 0) check_vec(dentropy, T, DType::F32, "token_logprob_backward_cols: dentropy (T,)");
  check_vec(targets, T, DType::I32, "token_logprob_backward_cols: targets (T,)");
  LS_CHECK(col0 >= 0) << "token_logprob_backward_cols: col0 " << col0 << " < 0";
  return {T, W};
}

}  // namespace detail

void softmax_forward(const Context& ctx, Tensor probs, const Tensor& logits, float temperature) {
  const auto [T, V] = check_logits(logits, temperature, "softmax_forward");
  check_mat(probs, T, V, "softmax_forward: probs (T, V)");
  ctx.parallel_for(
      T,
      [&](int64_t t0, int64_t t1) {
        std::vector<float> d(static_cast<size_t>(V));  // (V) clamped z - m
        for (int64_t t = t0; t < t1; ++t) {
          float* p = probs.f32() + t * probs.stride[0];
          const RowStats st = row_pass(logits.f32() + t * logits.stride[0], V, temperature, d.data(), p);
          for (int64_t i = 0; i < V; ++i) p[i] = p[i] / st.s;
        }
      },
      row_grain(V));
}

void log_softmax_forward(const Context& ctx, Tensor logp, const Tensor& logits, float temperature) {
  const auto [T, V] = check_logits(logits, temperature, "log_softmax_forward");
  check_mat(logp, T, V, "log_softmax_forward: logp (T, V)");
  ctx.parallel_for(
      T,
      [&](int64_t t0, int64_t t1) {
        std::vector<float> d(static_cast<size_t>(V)), e(static_cast<size_t>(V));  // (V) each
        for (int64_t t = t0; t < t1; ++t) {
          const float* z = logits.f32() + t * logits.stride[0];
          float* out = logp.f32() + t * logp.stride[0];
          const RowStats st = row_pass(z, V, temperature, d.data(), e.data());
          for (int64_t i = 0; i < V; ++i) out[i] = shifted(z, i, temperature, st.m) - st.ls;
        }
      },
      row_grain(V));
}

void token_logprob_forward(const Context& ctx, Tensor logp, Tensor entropy, Tensor lse, const Tensor& logits,
                           const Tensor& targets, float temperature) {
  LS_GPU_DISPATCH(ctx, token_logprob_forward, logp, entropy, lse, logits, targets, temperature);
  const auto [T, V] = detail::check_token_logprob_forward(logp, entropy, lse, logits, targets, temperature);
  const bool want_h = entropy.ndim != 0, want_lse = lse.ndim != 0;
  const int32_t* y = targets.i32();
  ctx.parallel_for(
      T,
      [&](int64_t t0, int64_t t1) {
        std::vector<float> d(static_cast<size_t>(V)), e(static_cast<size_t>(V));  // (V) each
        for (int64_t t = t0; t < t1; ++t) {
          const float* z = logits.f32() + t * logits.stride[0];
          const RowStats st = row_pass(z, V, temperature, d.data(), e.data());
          logp.f32()[t] = shifted(z, y[t], temperature, st.m) - st.ls;
          if (want_h) entropy.f32()[t] = st.ls - canonical_dot(e.data(), d.data(), V) / st.s;
          if (want_lse) lse.f32()[t] = st.m + st.ls;
        }
      },
      row_grain(V));
}

void token_logprob_backward(const Context& ctx, Tensor dlogits, const Tensor& dlogp, const Tensor& dentropy,
                            const Tensor& logits, const Tensor& targets, float temperature) {
  LS_GPU_DISPATCH(ctx, token_logprob_backward, dlogits, dlogp, dentropy, logits, targets, temperature);
  const auto [T, V] =
      detail::check_token_logprob_backward(dlogits, dlogp, dentropy, logits, targets, temperature);
  const bool have_gl = dlogp.ndim != 0, have_ge = dentropy.ndim != 0;
  const int32_t* y = targets.i32();
  ctx.parallel_for(
      T,
      [&](int64_t t0, int64_t t1) {
        std::vector<float> d(static_cast<size_t>(V)), e(static_cast<size_t>(V));  // (V) each
        for (int64_t t = t0; t < t1; ++t) {
          // The row pass reads all of z before anything is written, so dlogits may alias logits.
          const RowStats st =
              row_pass(logits.f32() + t * logits.stride[0], V, temperature, d.data(), e.data());
          const float gl = have_gl ? dlogp.f32()[t] : 0.0f;
          const float ge = have_ge ? dentropy.f32()[t] : 0.0f;
          // Without an entropy gradient H is not needed: ge * (...) is then exactly 0.
          const float H = have_ge ? st.ls - canonical_dot(e.data(), d.data(), V) / st.s : 0.0f;
          float* out = dlogits.f32() + t * dlogits.stride[0];
          const int64_t yt = y[t];
          float gy = 0.0f;
          for (int64_t j = 0; j < V; ++j) {
            const float p = e[size_t(j)] / st.s;
            const float g = -(p * (gl + ge * ((d[size_t(j)] - st.ls) + H)));
            if (j == yt) gy = g;
            out[j] = g / temperature;
          }
          out[yt] = (gy + gl) / temperature;
        }
      },
      row_grain(V));
}

void token_logprob_stats(const Context& ctx, Tensor stats, const Tensor& logits, float temperature,
                         bool entropy) {
  LS_GPU_DISPATCH(ctx, token_logprob_stats, stats, logits, temperature, entropy);
  const auto [T, V] = detail::check_token_logprob_stats(stats, logits, temperature);
  ctx.parallel_for(
      T,
      [&](int64_t t0, int64_t t1) {
        std::vector<float> d(static_cast<size_t>(V)), e(static_cast<size_t>(V));  // (V) each
        for (int64_t t = t0; t < t1; ++t) {
          const RowStats st =
              row_pass(logits.f32() + t * logits.stride[0], V, temperature, d.data(), e.data());
          float* out = stats.f32() + t * stats.stride[0];
          out[0] = st.m;
          out[1] = st.s;
          out[2] = st.ls;
          out[3] = entropy ? st.ls - canonical_dot(e.data(), d.data(), V) / st.s : 0.0f;
        }
      },
      row_grain(V));
}

void token_logprob_backward_cols(const Context& ctx, Tensor dlogits, const Tensor& dlogp,
                                 const Tensor& dentropy, const Tensor& logits, const Tensor& targets,
                                 const Tensor& stats, int64_t col0, float temperature) {
  LS_GPU_DISPATCH(ctx, token_logprob_backward_cols, dlogits, dlogp, dentropy, logits, targets, stats, col0,
                  temperature);
  const auto [T, W] = detail::check_token_logprob_backward_cols(dlogits, dlogp, dentropy, logits, targets,
                                                                stats, col0, temperature);
  const bool have_gl = dlogp.ndim != 0, have_ge = dentropy.ndim != 0;
  const int32_t* y = targets.i32();
  ctx.parallel_for(
      T,
      [&](int64_t t0, int64_t t1) {
        std::vector<float> d(static_cast<size_t>(W)), e(static_cast<size_t>(W));  // (W) each
        for (int64_t t = t0; t < t1; ++t) {
          const float* z = logits.f32() + t * logits.stride[0];
          const float* st = stats.f32() + t * stats.stride[0];
          const float m = st[0], s = st[1], ls = st[2];
          // The row pass's d and e for these columns: elementwise, so the bits of the full row's.
          for (int64_t i = 0; i < W; ++i) d[size_t(i)] = std::max(z[i] / temperature - m, kMinShift);
          vexp(d.data(), e.data(), W);
          const float gl = have_gl ? dlogp.f32()[t] : 0.0f;
          const float ge = have_ge ? dentropy.f32()[t] : 0.0f;
          const float H = have_ge ? st[3] : 0.0f;
          float* out = dlogits.f32() + t * dlogits.stride[0];
          // The target's element as token_logprob_backward writes it (g kept,
          // then (g + gl) / temperature after the loop): in that form the
          // compiler keeps the negation, so a NaN row has the full kernel's
          // sign bits too (folded into one expression it became gl - p * (...)).
          const int64_t yt = y[t] - col0;
          float gy = 0.0f;
          for (int64_t j = 0; j < W; ++j) {
            const float p = e[size_t(j)] / s;
            const float g = -(p * (gl + ge * ((d[size_t(j)] - ls) + H)));
            if (j == yt) gy = g;
            out[j] = g / temperature;
          }
          if (yt >= 0 && yt < W) out[yt] = (gy + gl) / temperature;
        }
      },
      row_grain(W));
}
}  // namespace lockstep::kernels
