// Tests for the DeepSeek-V4 MoE pieces: sqrt(softplus) router scores and
// weights against a double reference, their backward by finite differences
// (through normalisation and scaling), hash-layer replay, the selection-only
// bias; moe_scale_rows / moe_sum and their backward passes against references
// and finite differences, the identity weight-before-down-projection ==
// weighted combine, batch/thread invariance and the errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "lockstep/base/thread_pool.h"
#include "lockstep/kernels/cpu/moe.h"

namespace lockstep::kernels {
namespace {

using test::expect_bits_equal;
using test::expect_close;
using test::Guarded;
using test::randn;
using test::uniform;

inline size_t sz(int64_t n) { return static_cast<size_t>(n); }

Tensor f32_view(std::vector<float>& v, std::initializer_list<int64_t> shape) { return Tensor(v.data(), DType::F32, shape); }
Tensor i32_view(std::vector<int32_t>& v, std::initializer_list<int64_t> shape) {
  return Tensor(v.data(), DType::I32, shape);
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// DeepSeek-V4-Flash's router: sqrtsoftplus, top-6, normalised, scaled by 1.5.
RouterConfig v4_cfg(int E, int K, bool normalize = true, float scaling = 1.5f) {
  RouterConfig c;
  c.num_experts = E;
  c.top_k = K;
  c.scoring = RouterScoring::SqrtSoftplus;
  c.normalize = normalize;
  c.routed_scaling = scaling;
  return c;
}

std::string cfg_name(const RouterConfig& c) {
  return std::string(c.normalize ? "normalize" : "raw") + " scale=" + std::to_string(c.routed_scaling);
}

// ---------------------------------------------------------------------------
// Double-precision reference router (DeepSeek-V4 inference/model.py Gate).

double ref_softplus(double x) { return x > 20 ? x : std::log1p(std::exp(x)); }
double ref_sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

std::vector<double> ref_scores(const double* z, int E) {
  std::vector<double> p(sz(E));
  for (int e = 0; e < E; ++e) p[sz(e)] = std::sqrt(ref_softplus(z[e]));
  return p;
}

// Top-K of p + bias, larger first, lower index on ties.
std::vector<int32_t> ref_select(const std::vector<double>& p, const float* bias, int K) {
  std::vector<int32_t> order(p.size());
  std::iota(order.begin(), order.end(), 0);
  auto v = [&](int32_t e) { return p[sz(e)] + (bias ? bias[e] : 0.0); };
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return v(a) > v(b); });
  order.resize(sz(K));
  return order;
}

std::vector<double> ref_weights(const std::vector<double>& p, const int32_t* idx, const RouterConfig& cfg) {
  std::vector<double> w(sz(cfg.top_k));
  double sum = 0;
  for (int s = 0; s < cfg.top_k; ++s) sum += w[sz(s)] = p[sz(idx[s])];
  for (auto& x : w) x = (cfg.normalize ? x / (sum + 1e-20) : x) * cfg.routed_scaling;
  return w;
}

// ---------------------------------------------------------------------------
// Kernel runners with sentinel guards on the float outputs.

struct Routed {
  std::vector<int32_t> idx;   // (T, K)
  std::vector<float> w;       // (T, K)
  std::vector<float> scores;  // (T, E)
};

Routed run_route(const Context& ctx, std::vector<float> logits, int64_t T, const std::vector<float>* bias,
                 const std::vector<int32_t>* replay, const RouterConfig& cfg) {
  const int E = cfg.num_experts, K = cfg.top_k;
  std::vector<int32_t> idx(sz(T * K), -7);
  Guarded w(T * K, -3.0f), scores(T * E, -3.0f);
  std::vector<float> b = bias ? *bias : std::vector<float>();
  std::vector<int32_t> rep = replay ? *replay : std::vector<int32_t>();
  moe_route(ctx, i32_view(idx, {T, K}), w.tensor({T, K}), scores.tensor({T, E}), f32_view(logits, {T, E}),
            bias ? f32_view(b, {E}) : Tensor(), replay ? i32_view(rep, {T, K}) : Tensor(), cfg);
  w.check("topk_w");
  scores.check("scores");
  return {idx, w.values(), scores.values()};
}

std::vector<float> run_route_backward(const Context& ctx, const Routed& r, std::vector<float> g, int64_t T,
                                      const RouterConfig& cfg) {
  const int E = cfg.num_experts, K = cfg.top_k;
  Guarded dz(T * E, 99.0f);
  std::vector<float> scores = r.scores;
  std::vector<int32_t> idx = r.idx;
  moe_route_backward(ctx, dz.tensor({T, E}), f32_view(g, {T, K}), f32_view(scores, {T, E}), i32_view(idx, {T, K}),
                     cfg);
  dz.check("dlogits");
  return dz.values();
}

// Distinct random experts per token.
std::vector<int32_t> random_sets(int64_t T, int K, int E, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<int32_t> out, all(sz(E));
  for (int64_t t = 0; t < T; ++t) {
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), g);
    out.insert(out.end(), all.begin(), all.begin() + K);
  }
  return out;
}

// ---------------------------------------------------------------------------
// Router forward.

// The f32 softplus is log1(1 + exp1(x)): rounding 1 + e^x costs up to 2^-24
// absolute in softplus, log1 and exp1 a few ulps relative; the square root
// halves the relative error and divides an absolute one by 2p.
double score_tolerance(double p_ref) {
  const double sp = p_ref * p_ref;
  return (1.2e-7 + 1e-6 * sp) / (2 * p_ref) + 2e-7 * p_ref;
}

TEST(MoeV4Route, SqrtSoftplusScoresAndWeightsMatchDoubleReference) {
  const int64_t T = 37;
  const int E = 64, K = 6;
  Context ctx;
  const auto logits = randn(T * E, 101, 2.5f);
  const auto bias = uniform(E, 102, -0.3f, 0.3f);
  for (bool with_bias : {false, true})
    for (bool normalize : {false, true})
      for (float scaling : {1.0f, 1.5f}) {
        const RouterConfig cfg = v4_cfg(E, K, normalize, scaling);
        SCOPED_TRACE(cfg_name(cfg) + (with_bias ? " +bias" : ""));
        const Routed got = run_route(ctx, logits, T, with_bias ? &bias : nullptr, nullptr, cfg);
        std::vector<double> want_w;
        for (int64_t t = 0; t < T; ++t) {
          const std::vector<double> z(logits.begin() + t * E, logits.begin() + (t + 1) * E);
          const auto p = ref_scores(z.data(), E);
          for (int e = 0; e < E; ++e)
            ASSERT_NEAR(got.scores[sz(t * E + e)], p[sz(e)], score_tolerance(p[sz(e)]))
                << "token " << t << " expert " << e << " logit " << z[sz(e)];
          const auto idx = ref_select(p, with_bias ? bias.data() : nullptr, K);
          ASSERT_EQ(std::vector<int32_t>(got.idx.begin() + t * K, got.idx.begin() + (t + 1) * K), idx)
              << "token " << t;
          const auto w = ref_weights(p, idx.data(), cfg);
          want_w.insert(want_w.end(), w.begin(), w.end());
        }
        expect_close(got.w, want_w, 2e-6, "topk_w");
      }
}

// sqrt(softplus) at the linear switch, far out and far below: finite, >= 0,
// monotone, sqrt(x) exactly past 20, 0 once 1 + e^x rounds to 1.
TEST(MoeV4Route, SqrtSoftplusAtTheExtremes) {
  Context ctx;
  std::vector<float> z;
  for (float x = -120.0f; x <= 120.0f; x += 0.03125f) z.push_back(x);
  for (float x : {-1e30f, -1e6f, 1e6f, 1e30f}) z.push_back(x);
  std::sort(z.begin(), z.end());
  const int E = int(z.size());
  const Routed r = run_route(ctx, z, 1, nullptr, nullptr, v4_cfg(E, 1, false, 1.0f));
  for (int e = 0; e < E; ++e) {
    const float p = r.scores[sz(e)], x = z[sz(e)];
    ASSERT_TRUE(std::isfinite(p) && p >= 0.0f) << "logit " << x << " score " << p;
    if (e > 0) {
      ASSERT_GE(p, r.scores[sz(e - 1)]) << "not monotone at logit " << x;
    }
    if (x > 20.0f) {
      ASSERT_EQ(p, std::sqrt(x)) << "logit " << x;
    }
    if (x < -20.0f) {
      ASSERT_EQ(p, 0.0f) << "logit " << x;
    }
  }
  EXPECT_EQ(r.idx[0], E - 1);
}

// The bias moves experts in and out of the top-k, yet scores and weights are
// those of the unbiased p: replaying the biased choice without the bias gives
// the same weights bit for bit.
TEST(MoeV4Route, BiasIsUsedOnlyForSelection) {
  const int64_t T = 40;
  const int E = 32, K = 6;
  Context ctx;
  const auto logits = randn(T * E, 111, 1.5f);
  const auto bias = uniform(E, 112, -0.4f, 0.4f);
  const RouterConfig cfg = v4_cfg(E, K);
  const Routed plain = run_route(ctx, logits, T, nullptr, nullptr, cfg);
  const Routed biased = run_route(ctx, logits, T, &bias, nullptr, cfg);
  expect_bits_equal(biased.scores.data(), plain.scores.data(), T * E, "scores ignore the bias");
  EXPECT_NE(biased.idx, plain.idx) << "the bias should change some selections";
  const Routed replayed = run_route(ctx, logits, T, nullptr, &biased.idx, cfg);
  EXPECT_EQ(replayed.idx, biased.idx);
  expect_bits_equal(replayed.w.data(), biased.w.data(), T * K, "weights from unbiased p");
  // And the weights are the normalised, scaled unbiased scores of the chosen experts.
  for (int64_t t = 0; t < T; ++t) {
    double sum = 0;
    for (int s = 0; s < K; ++s) sum += biased.scores[sz(t * E + biased.idx[sz(t * K + s)])];
    for (int s = 0; s < K; ++s) {
      const double want = 1.5 * biased.scores[sz(t * E + biased.idx[sz(t * K + s)])] / sum;
      EXPECT_NEAR(biased.w[sz(t * K + s)], want, 1e-6 * want) << "token " << t << " slot " << s;
    }
  }
}

// Hash-routed layers: each token's experts are its row of tid2eid; weights
// come from its own scores, and the router still gets a gradient.
TEST(MoeV4Route, HashReplayWithSqrtSoftplus) {
  const int64_t T = 30, V = 11;
  const int E = 24, K = 6;
  Context ctx;
  const auto tid2eid = random_sets(V, K, E, 121);  // (V, K)
  std::mt19937 rng(122);
  std::vector<int32_t> replay;  // (T, K)
  for (int64_t t = 0; t < T; ++t) {
    const int64_t tok = int64_t(rng() % V);
    replay.insert(replay.end(), tid2eid.begin() + tok * K, tid2eid.begin() + (tok + 1) * K);
  }
  const auto logits = randn(T * E, 123, 1.5f);
  const auto bias = uniform(E, 124, -0.3f, 0.3f);
  const RouterConfig cfg = v4_cfg(E, K);
  const Routed got = run_route(ctx, logits, T, &bias, &replay, cfg);
  EXPECT_EQ(got.idx, replay);
  std::vector<double> want_w;
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<double> z(logits.begin() + t * E, logits.begin() + (t + 1) * E);
    const auto w = ref_weights(ref_scores(z.data(), E), &replay[sz(t * K)], cfg);
    want_w.insert(want_w.end(), w.begin(), w.end());
  }
  expect_close(got.w, want_w, 2e-6, "replayed topk_w");
  const Routed own = run_route(ctx, logits, T, &bias, nullptr, cfg);
  int64_t differ = 0;
  for (int64_t t = 0; t < T; ++t)
    differ += std::set<int32_t>(replay.begin() + t * K, replay.begin() + (t + 1) * K) !=
              std::set<int32_t>(own.idx.begin() + t * K, own.idx.begin() + (t + 1) * K);
  EXPECT_GT(differ, T / 2) << "the hash rows should not be the router's own choice";
  const auto dz = run_route_backward(ctx, got, randn(T * K, 125), T, cfg);
  for (int64_t t = 0; t < T; ++t)
    for (int e = 0; e < E; ++e) {
      const bool chosen = std::count(replay.begin() + t * K, replay.begin() + (t + 1) * K, e) > 0;
      if (chosen) {
        EXPECT_NE(dz[sz(t * E + e)], 0.0f) << "token " << t << " expert " << e;
      } else {
        EXPECT_EQ(dz[sz(t * E + e)], 0.0f) << "token " << t << " expert " << e;
      }
    }
}

// ---------------------------------------------------------------------------
// Router backward.

// L = sum G * w with the kernel's selection fixed; central differences of the
// double reference, through normalisation and scaling.
TEST(MoeV4RouteBackward, MatchesFiniteDifferencesOfTheDoubleReference) {
  const int64_t T = 6;
  const int E = 12, K = 4;
  Context ctx;
  const auto logits = randn(T * E, 131, 2.0f);
  const auto bias = uniform(E, 132, -0.2f, 0.2f);
  const auto G = randn(T * K, 133);
  for (bool normalize : {false, true})
    for (float scaling : {1.0f, 1.5f}) {
      const RouterConfig cfg = v4_cfg(E, K, normalize, scaling);
      SCOPED_TRACE(cfg_name(cfg));
      for (bool hashed : {false, true}) {
        const auto replay = random_sets(T, K, E, 134);
        const Routed r = run_route(ctx, logits, T, &bias, hashed ? &replay : nullptr, cfg);
        const auto dz = run_route_backward(ctx, r, G, T, cfg);
        std::vector<double> want(sz(T * E));
        const double h = 1e-6;
        for (int64_t t = 0; t < T; ++t)
          for (int j = 0; j < E; ++j) {
            auto loss = [&](double step) {
              std::vector<double> z(logits.begin() + t * E, logits.begin() + (t + 1) * E);
              z[sz(j)] += step;
              const auto w = ref_weights(ref_scores(z.data(), E), &r.idx[sz(t * K)], cfg);
              double l = 0;
              for (int s = 0; s < K; ++s) l += G[sz(t * K + s)] * w[sz(s)];
              return l;
            };
            want[sz(t * E + j)] = (loss(h) - loss(-h)) / (2 * h);
          }
        expect_close(dz, want, 2e-5, hashed ? "dlogits (replayed)" : "dlogits", 1e-7);
      }
    }
}

// The float kernel itself, perturbed: logits spaced 0.5 apart so a step of
// 1e-2 never changes the top-k (checked); the loss is accumulated in double.
TEST(MoeV4RouteBackward, MatchesFiniteDifferencesOfTheKernel) {
  const int64_t T = 3;
  const int E = 10, K = 3;
  Context ctx;
  std::mt19937 rng(141);
  std::vector<float> logits;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> row(sz(E));
    for (int e = 0; e < E; ++e) row[sz(e)] = -2.25f + 0.5f * float(e);
    std::shuffle(row.begin(), row.end(), rng);
    logits.insert(logits.end(), row.begin(), row.end());
  }
  const auto G = randn(T * K, 143);
  for (bool normalize : {false, true}) {
    const RouterConfig cfg = v4_cfg(E, K, normalize, 1.5f);
    SCOPED_TRACE(cfg_name(cfg));
    const Routed r = run_route(ctx, logits, T, nullptr, nullptr, cfg);
    const auto dz = run_route_backward(ctx, r, G, T, cfg);
    std::vector<double> want(sz(T * E));
    const float h = 1e-2f;
    for (int64_t i = 0; i < T * E; ++i) {
      auto loss = [&](float step) {
        auto z = logits;
        z[sz(i)] += step;
        const Routed p = run_route(ctx, z, T, nullptr, nullptr, cfg);
        EXPECT_EQ(p.idx, r.idx) << "perturbation changed the selection";
        double l = 0;
        for (int64_t k = 0; k < T * K; ++k) l += double(G[sz(k)]) * p.w[sz(k)];
        return l;
      };
      want[sz(i)] = (loss(h) - loss(-h)) / (2.0 * h);
    }
    expect_close(dz, want, 2e-3, "dlogits", 1e-5);
  }
}

// dp/dlogit alone (K = E, no normalisation, scale 1, G = 1): from the saved
// p it must equal sigmoid(x) / (2p) with sigmoid(x) = -expm1(-p^2) to a few
// ulps, and sigmoid(x) / (2 sqrt(softplus(x))) at the true logit within the
// forward's own error; 0 where p == 0.
TEST(MoeV4RouteBackward, ScoreDerivativeOverTheWholeRange) {
  Context ctx;
  std::vector<float> z;
  for (float x = -40.0f; x <= 40.0f; x += 0.0625f) z.push_back(x);
  for (float x : {-1e30f, 1e30f, 1e-6f, -1e-6f, 0.0f}) z.push_back(x);
  const int E = int(z.size());
  const RouterConfig cfg = v4_cfg(E, E, false, 1.0f);
  const Routed r = run_route(ctx, z, 1, nullptr, nullptr, cfg);
  const auto dz = run_route_backward(ctx, r, std::vector<float>(sz(E), 1.0f), 1, cfg);
  int64_t zero_scores = 0;
  for (int e = 0; e < E; ++e) {
    const double x = z[sz(e)], p = r.scores[sz(e)], got = dz[sz(e)];
    ASSERT_TRUE(std::isfinite(got) && got >= 0) << "logit " << x << " grad " << got;
    if (p == 0) {
      ++zero_scores;
      EXPECT_EQ(got, 0.0) << "logit " << x;
      continue;
    }
    const double from_p = -std::expm1(-p * p) / (2 * p);
    EXPECT_NEAR(got, from_p, 1e-6 * from_p) << "logit " << x << " score " << p;
    const double exact = ref_sigmoid(x) / (2 * std::sqrt(ref_softplus(x)));
    const double sp = ref_softplus(x);
    EXPECT_NEAR(got, exact, (2e-6 + 1.2e-7 / sp) * exact) << "logit " << x;
  }
  EXPECT_GT(zero_scores, 0) << "the range should reach p == 0";
}

// ---------------------------------------------------------------------------
// Batch and thread invariance of the router.

TEST(MoeV4Route, BatchAndThreadInvariance) {
  const int64_t T = 29;
  const int E = 48, K = 6;
  const auto logits = randn(T * E, 151, 2.0f);
  const auto bias = uniform(E, 152, -0.3f, 0.3f);
  const auto G = randn(T * K, 153);
  const RouterConfig cfg = v4_cfg(E, K);
  ThreadPool p1(1), p2(2);
  Context c1{&p1}, c2{&p2};
  const Routed a = run_route(c1, logits, T, &bias, nullptr, cfg), b = run_route(c2, logits, T, &bias, nullptr, cfg);
  EXPECT_EQ(a.idx, b.idx);
  expect_bits_equal(a.w.data(), b.w.data(), T * K, "topk_w, 1 vs 2 threads");
  expect_bits_equal(a.scores.data(), b.scores.data(), T * E, "scores, 1 vs 2 threads");
  const auto da = run_route_backward(c1, a, G, T, cfg), db = run_route_backward(c2, b, G, T, cfg);
  expect_bits_equal(da.data(), db.data(), T * E, "dlogits, 1 vs 2 threads");
  for (int64_t t : {int64_t(0), int64_t(13), T - 1}) {
    const std::vector<float> z(logits.begin() + t * E, logits.begin() + (t + 1) * E);
    const Routed one = run_route(c2, z, 1, &bias, nullptr, cfg);
    EXPECT_EQ(one.idx, std::vector<int32_t>(a.idx.begin() + t * K, a.idx.begin() + (t + 1) * K));
    expect_bits_equal(one.w.data(), a.w.data() + t * K, K, "topk_w, alone vs in a batch");
    const std::vector<float> g(G.begin() + t * K, G.begin() + (t + 1) * K);
    const auto d = run_route_backward(c1, one, g, 1, cfg);
    expect_bits_equal(d.data(), da.data() + t * E, E, "dlogits, alone vs in a batch");
  }
}

TEST(MoeV4Route, ValidateRejectsAnUnknownScoring) {
  RouterConfig c = v4_cfg(8, 2);
  EXPECT_NO_THROW(c.validate());
  c.scoring = static_cast<RouterScoring>(7);
  const std::string m = error_of([&] { c.validate(); });
  EXPECT_NE(m.find("scoring"), std::string::npos) << m;
}

// ---------------------------------------------------------------------------
// moe_scale_rows / moe_sum.

struct Routing {
  int64_t T;
  int K, E;
  std::vector<int32_t> idx;  // (T, K)
  std::vector<float> w;      // (T, K)
  MoeDispatch plan;
};

Routing make_setup(int64_t T, int K, int E, uint32_t seed) {
  Routing s{T, K, E, random_sets(T, K, E, seed), uniform(T * K, seed + 1, 0.05f, 1.5f), {}};
  s.plan = moe_plan(i32_view(s.idx, {T, K}), E);
  return s;
}

std::vector<float> run_scale(const Context& ctx, const Routing& s, std::vector<float> x, int64_t F) {
  const int64_t R = s.T * s.K;
  Guarded y(R * F, 5.0f);
  std::vector<float> w = s.w;
  moe_scale_rows(ctx, y.tensor({R, F}), f32_view(x, {R, F}), f32_view(w, {s.T, s.K}), s.plan);
  y.check("y");
  return y.values();
}

struct ScaleGrads {
  std::vector<float> dx, dw;
};

ScaleGrads run_scale_backward(const Context& ctx, const Routing& s, std::vector<float> dy, std::vector<float> x,
                              int64_t F) {
  const int64_t R = s.T * s.K;
  Guarded dx(R * F, 5.0f), dw(s.T * s.K, 5.0f);
  std::vector<float> w = s.w;
  moe_scale_rows_backward(ctx, dx.tensor({R, F}), dw.tensor({s.T, s.K}), f32_view(dy, {R, F}), f32_view(x, {R, F}),
                          f32_view(w, {s.T, s.K}), s.plan);
  dx.check("dx");
  dw.check("dtopk_w");
  return {dx.values(), dw.values()};
}

std::vector<float> run_sum(const Context& ctx, const Routing& s, std::vector<float> ye, int64_t D) {
  Guarded y(s.T * D, 5.0f);
  moe_sum(ctx, y.tensor({s.T, D}), f32_view(ye, {s.T * s.K, D}), s.plan);
  y.check("y");
  return y.values();
}

std::vector<float> run_sum_backward(const Context& ctx, const Routing& s, std::vector<float> dy, int64_t D) {
  Guarded dye(s.T * s.K * D, 5.0f);
  moe_sum_backward(ctx, dye.tensor({s.T * s.K, D}), f32_view(dy, {s.T, D}), s.plan);
  dye.check("dye");
  return dye.values();
}

// Weight of gathered row r.
float row_weight(const Routing& s, int64_t r) {
  return s.w[sz(s.plan.token[sz(r)] * s.K + s.plan.slot[sz(r)])];
}

TEST(MoeScaleRows, MatchesReferenceAndMayAlias) {
  ThreadPool pool(2);
  Context ctx{&pool};
  for (int64_t F : {1, 17, 130}) {
    const Routing s = make_setup(21, 3, 7, 201);
    const int64_t R = s.T * s.K;
    const auto x = randn(R * F, 202);
    const auto y = run_scale(ctx, s, x, F);
    std::vector<double> want(sz(R * F));
    for (int64_t r = 0; r < R; ++r)
      for (int64_t f = 0; f < F; ++f) {
        want[sz(r * F + f)] = double(row_weight(s, r)) * x[sz(r * F + f)];
        ASSERT_EQ(y[sz(r * F + f)], row_weight(s, r) * x[sz(r * F + f)]) << "one f32 multiply, row " << r;
      }
    expect_close(y, want, 1e-7, "y vs double");
    std::vector<float> inplace = x, w = s.w;
    moe_scale_rows(ctx, f32_view(inplace, {R, F}), f32_view(inplace, {R, F}), f32_view(w, {s.T, s.K}), s.plan);
    expect_bits_equal(inplace.data(), y.data(), R * F, "y in place of x");
  }
}

TEST(MoeScaleRows, BackwardMatchesReferenceAndFiniteDifferences) {
  Context ctx;
  const int64_t F = 24;
  const Routing s = make_setup(9, 4, 6, 211);
  const int64_t R = s.T * s.K;
  const auto x = randn(R * F, 212), G = randn(R * F, 213);
  const ScaleGrads g = run_scale_backward(ctx, s, G, x, F);
  std::vector<double> want_dw(sz(s.T * s.K));
  for (int64_t r = 0; r < R; ++r) {
    double dot = 0;
    for (int64_t f = 0; f < F; ++f) {
      ASSERT_EQ(g.dx[sz(r * F + f)], row_weight(s, r) * G[sz(r * F + f)]) << "dx row " << r;
      dot += double(G[sz(r * F + f)]) * x[sz(r * F + f)];
    }
    want_dw[sz(s.plan.token[sz(r)] * s.K + s.plan.slot[sz(r)])] = dot;
  }
  expect_close(g.dw, want_dw, 1e-6, "dtopk_w vs double");
  // L = sum G * y, y from the kernel, accumulated in double.
  auto loss = [&](const Routing& st, const std::vector<float>& xv) {
    const auto y = run_scale(ctx, st, xv, F);
    double l = 0;
    for (size_t i = 0; i < y.size(); ++i) l += double(G[i]) * y[i];
    return l;
  };
  const float h = 1e-2f;
  std::vector<double> fd_w(sz(s.T * s.K));
  for (int64_t k = 0; k < s.T * s.K; ++k) {
    Routing plus = s, minus = s;
    plus.w[sz(k)] += h;
    minus.w[sz(k)] -= h;
    fd_w[sz(k)] = (loss(plus, x) - loss(minus, x)) / (double(plus.w[sz(k)]) - double(minus.w[sz(k)]));
  }
  expect_close(g.dw, fd_w, 1e-4, "dtopk_w vs finite differences", 1e-5);
  std::vector<double> fd_x(sz(R * F));
  for (int64_t i = 0; i < R * F; ++i) {
    auto xp = x, xm = x;
    xp[sz(i)] += h;
    xm[sz(i)] -= h;
    fd_x[sz(i)] = (loss(s, xp) - loss(s, xm)) / (double(xp[sz(i)]) - double(xm[sz(i)]));
  }
  expect_close(g.dx, fd_x, 1e-4, "dx vs finite differences", 1e-5);
  // dx in place of dy.
  std::vector<float> dy = G, w = s.w, dw(sz(s.T * s.K)), xv = x;
  moe_scale_rows_backward(ctx, f32_view(dy, {R, F}), f32_view(dw, {s.T, s.K}), f32_view(dy, {R, F}),
                          f32_view(xv, {R, F}), f32_view(w, {s.T, s.K}), s.plan);
  expect_bits_equal(dy.data(), g.dx.data(), R * F, "dx in place of dy");
  expect_bits_equal(dw.data(), g.dw.data(), s.T * s.K, "dtopk_w with dx in place of dy");
}

TEST(MoeSum, MatchesReferenceAndBackwardIsACopy) {
  Context ctx;
  const int64_t D = 37;
  const Routing s = make_setup(15, 4, 9, 221);
  const int64_t R = s.T * s.K;
  const auto ye = randn(R * D, 222);
  const auto y = run_sum(ctx, s, ye, D);
  std::vector<double> want(sz(s.T * D));
  for (int64_t t = 0; t < s.T; ++t)
    for (int64_t d = 0; d < D; ++d) {
      float acc = 0.0f;
      double ref = 0;
      for (int k = 0; k < s.K; ++k) {
        const float v = ye[sz(s.plan.row_of[sz(t * s.K + k)] * D + d)];
        acc = acc + v;
        ref += v;
      }
      ASSERT_EQ(y[sz(t * D + d)], acc) << "slot-order adds, token " << t;
      want[sz(t * D + d)] = ref;
    }
  expect_close(y, want, 1e-6, "y vs double");
  const auto G = randn(s.T * D, 223);
  const auto dye = run_sum_backward(ctx, s, G, D);
  for (int64_t r = 0; r < R; ++r)
    expect_bits_equal(dye.data() + r * D, G.data() + s.plan.token[sz(r)] * D, D, "dye row is dy of its token");
  // Finite differences of L = sum G * y over a sample of ye entries.
  auto loss = [&](const std::vector<float>& v) {
    const auto out = run_sum(ctx, s, v, D);
    double l = 0;
    for (size_t i = 0; i < out.size(); ++i) l += double(G[i]) * out[i];
    return l;
  };
  const float h = 1e-2f;
  for (int64_t i = 0; i < R * D; i += 7) {
    auto p = ye, m = ye;
    p[sz(i)] += h;
    m[sz(i)] -= h;
    const double fd = (loss(p) - loss(m)) / (double(p[sz(i)]) - double(m[sz(i)]));
    EXPECT_NEAR(dye[sz(i)], fd, 1e-4 * (1 + std::fabs(fd))) << "ye element " << i;
  }
}

// Per-expert down projection ye[r] = W_e · h[r], f32 with a double accumulator.
std::vector<float> down_project(const Routing& s, const std::vector<float>& h, const std::vector<float>& W, int64_t F,
                                int64_t D) {
  const int64_t R = s.T * s.K;
  std::vector<float> out(sz(R * D));
  for (int64_t r = 0; r < R; ++r) {
    const float* Wm = W.data() + int64_t(s.plan.expert[sz(r)]) * D * F;  // (D, F)
    for (int64_t d = 0; d < D; ++d) {
      double acc = 0;
      for (int64_t f = 0; f < F; ++f) acc += double(Wm[d * F + f]) * h[sz(r * F + f)];
      out[sz(r * D + d)] = float(acc);
    }
  }
  return out;
}

// dh[r] = W_e^T · dye[r].
std::vector<float> down_project_backward(const Routing& s, const std::vector<float>& dye, const std::vector<float>& W,
                                         int64_t F, int64_t D) {
  const int64_t R = s.T * s.K;
  std::vector<float> dh(sz(R * F));
  for (int64_t r = 0; r < R; ++r) {
    const float* Wm = W.data() + int64_t(s.plan.expert[sz(r)]) * D * F;
    for (int64_t f = 0; f < F; ++f) {
      double acc = 0;
      for (int64_t d = 0; d < D; ++d) acc += double(Wm[d * F + f]) * dye[sz(r * D + d)];
      dh[sz(r * F + f)] = float(acc);
    }
  }
  return dh;
}

// Weighting before the (linear) down projection and summing equals weighting
// in the combine, forward and backward, up to rounding.
TEST(MoeScaleRows, ScaleThenDownProjectThenSumEqualsWeightedCombine) {
  Context ctx;
  const int64_t F = 20, D = 12;
  const Routing s = make_setup(13, 3, 5, 231);
  const int64_t R = s.T * s.K;
  const auto h = randn(R * F, 232), W = randn(int64_t(s.E) * D * F, 233, 0.3f), dy = randn(s.T * D, 234);
  std::vector<float> w = s.w;

  // V4: y = sum_k W2 (w_k h_k).
  const auto y_v4 = run_sum(ctx, s, down_project(s, run_scale(ctx, s, h, F), W, F, D), D);
  // Classic: y = sum_k w_k (W2 h_k).
  auto ye = down_project(s, h, W, F, D);
  std::vector<float> y_classic(sz(s.T * D));
  moe_combine(ctx, f32_view(y_classic, {s.T, D}), f32_view(ye, {R, D}), f32_view(w, {s.T, s.K}), s.plan);
  expect_close(y_v4, std::vector<double>(y_classic.begin(), y_classic.end()), 1e-5, "y: V4 vs combine");

  // Backward through the V4 order.
  const auto dye_v4 = run_sum_backward(ctx, s, dy, D);
  const ScaleGrads g_v4 = run_scale_backward(ctx, s, down_project_backward(s, dye_v4, W, F, D), h, F);
  // Backward through the combine.
  std::vector<float> dye(sz(R * D)), dw(sz(s.T * s.K)), dyv = dy;
  moe_combine_backward(ctx, f32_view(dye, {R, D}), f32_view(dw, {s.T, s.K}), f32_view(dyv, {s.T, D}),
                       f32_view(ye, {R, D}), f32_view(w, {s.T, s.K}), s.plan);
  const auto dh = down_project_backward(s, dye, W, F, D);
  expect_close(g_v4.dx, std::vector<double>(dh.begin(), dh.end()), 1e-5, "dh: V4 vs combine");
  expect_close(g_v4.dw, std::vector<double>(dw.begin(), dw.end()), 1e-5, "dtopk_w: V4 vs combine");
}

// A token's rows give the same bits alone or in a batch, with 1 or 2 threads.
TEST(MoeScaleRows, BatchAndThreadInvariance) {
  const int64_t F = 40;
  const Routing s = make_setup(26, 4, 8, 241);
  const int64_t R = s.T * s.K;
  const auto x = randn(R * F, 242), G = randn(R * F, 243), ye = randn(R * F, 244), dy = randn(s.T * F, 245);
  ThreadPool p1(1), p2(2);
  Context c1{&p1}, c2{&p2};
  const auto y1 = run_scale(c1, s, x, F), y2 = run_scale(c2, s, x, F);
  expect_bits_equal(y1.data(), y2.data(), R * F, "scale_rows, 1 vs 2 threads");
  const ScaleGrads g1 = run_scale_backward(c1, s, G, x, F), g2 = run_scale_backward(c2, s, G, x, F);
  expect_bits_equal(g1.dx.data(), g2.dx.data(), R * F, "scale_rows dx, 1 vs 2 threads");
  expect_bits_equal(g1.dw.data(), g2.dw.data(), s.T * s.K, "scale_rows dtopk_w, 1 vs 2 threads");
  const auto s1 = run_sum(c1, s, ye, F), s2 = run_sum(c2, s, ye, F);
  expect_bits_equal(s1.data(), s2.data(), s.T * F, "sum, 1 vs 2 threads");
  const auto b1 = run_sum_backward(c1, s, dy, F), b2 = run_sum_backward(c2, s, dy, F);
  expect_bits_equal(b1.data(), b2.data(), R * F, "sum backward, 1 vs 2 threads");

  for (int64_t t : {int64_t(0), int64_t(11), s.T - 1}) {
    Routing one{1, s.K, s.E, std::vector<int32_t>(s.idx.begin() + t * s.K, s.idx.begin() + (t + 1) * s.K),
              std::vector<float>(s.w.begin() + t * s.K, s.w.begin() + (t + 1) * s.K), {}};
    one.plan = moe_plan(i32_view(one.idx, {1, s.K}), s.E);
    // The token's rows, in its own plan's order.
    auto rows_of = [&](const std::vector<float>& v, int64_t width) {
      std::vector<float> out(sz(s.K * width));
      for (int k = 0; k < s.K; ++k) {
        const int64_t src = s.plan.row_of[sz(t * s.K + k)], dst = one.plan.row_of[sz(k)];
        std::copy_n(v.begin() + src * width, width, out.begin() + dst * width);
      }
      return out;
    };
    const auto xo = rows_of(x, F), Go = rows_of(G, F), yeo = rows_of(ye, F);
    const std::vector<float> dyo(dy.begin() + t * F, dy.begin() + (t + 1) * F);
    expect_bits_equal(run_scale(c2, one, xo, F).data(), rows_of(y1, F).data(), s.K * F, "scale_rows alone");
    const ScaleGrads go = run_scale_backward(c2, one, Go, xo, F);
    expect_bits_equal(go.dx.data(), rows_of(g1.dx, F).data(), s.K * F, "scale_rows dx alone");
    expect_bits_equal(go.dw.data(), g1.dw.data() + t * s.K, s.K, "scale_rows dtopk_w alone");
    expect_bits_equal(run_sum(c2, one, yeo, F).data(), s1.data() + t * F, F, "sum alone");
    expect_bits_equal(run_sum_backward(c2, one, dyo, F).data(), rows_of(b1, F).data(), s.K * F, "sum backward alone");
  }
}

TEST(MoeScaleRows, ErrorsNameTheArgument) {
  Context ctx;
  const Routing s = make_setup(4, 2, 5, 251);
  const int64_t R = 8, F = 6;
  std::vector<float> a(sz(R * F)), b(sz(R * F)), w = s.w, dw(8), y(sz(4 * F));
  std::vector<int32_t> ints(sz(R * F));
  Tensor x = f32_view(a, {R, F}), ok_y = f32_view(b, {R, F}), wt = f32_view(w, {4, 2});
  Tensor short_rows = f32_view(a, {R - 1, F}), narrow = f32_view(b, {R, F - 1}), bad_w = f32_view(w, {4, 1});
  Tensor ix = i32_view(ints, {R, F});
  auto has = [](const std::string& m, const char* what) {
    EXPECT_NE(m.find(what), std::string::npos) << "want \"" << what << "\" in: " << m;
  };
  has(error_of([&] { moe_scale_rows(ctx, ok_y, short_rows, wt, s.plan); }), "moe_scale_rows: x");
  has(error_of([&] { moe_scale_rows(ctx, narrow, x, wt, s.plan); }), "moe_scale_rows: y");
  has(error_of([&] { moe_scale_rows(ctx, ok_y, x, bad_w, s.plan); }), "moe_scale_rows: topk_w");
  has(error_of([&] { moe_scale_rows(ctx, ok_y, ix, wt, s.plan); }), "moe_scale_rows: x");
  Tensor dwt = f32_view(dw, {4, 2}), bad_dw = f32_view(dw, {2, 4});
  has(error_of([&] { moe_scale_rows_backward(ctx, ok_y, bad_dw, ok_y, x, wt, s.plan); }),
      "moe_scale_rows_backward: dtopk_w");
  has(error_of([&] { moe_scale_rows_backward(ctx, narrow, dwt, ok_y, x, wt, s.plan); }), "moe_scale_rows_backward: dx");
  has(error_of([&] { moe_scale_rows_backward(ctx, ok_y, dwt, narrow, x, wt, s.plan); }),
      "moe_scale_rows_backward: dy");
  Tensor yt = f32_view(y, {4, F}), bad_y = f32_view(y, {3, F});
  has(error_of([&] { moe_sum(ctx, bad_y, x, s.plan); }), "moe_sum: y");
  has(error_of([&] { moe_sum(ctx, yt, short_rows, s.plan); }), "moe_sum: ye");
  has(error_of([&] { moe_sum_backward(ctx, short_rows, yt, s.plan); }), "moe_sum_backward: dye");
  has(error_of([&] { moe_sum_backward(ctx, x, bad_y, s.plan); }), "moe_sum_backward: dy");
}

}  // namespace
}  // namespace lockstep::kernels
