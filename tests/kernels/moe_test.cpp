// Tests for the MoE router, dispatch and combine: double-precision references,
// tie-breaking, routing replay, finite-difference gradients, bit-exact batch
// invariance, sentinel guards, error messages, and a tiny end-to-end MoE FFN.
#include "lockstep/kernels/cpu/moe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "lockstep/base/thread_pool.h"

namespace lockstep::kernels {
namespace {

using test::expect_bits_equal;
using test::expect_close;
using test::Guarded;
using test::randn;
using test::uniform;

// An i32 buffer followed by sentinel values, like test::Guarded for floats.
class GuardedIdx {
 public:
  static constexpr int kGuard = 16;
  static constexpr int32_t kSentinel = 0x5eadbeef;
  explicit GuardedIdx(int64_t n, int32_t fill = -7) : n_(n), v_(static_cast<size_t>(n + kGuard), kSentinel) {
    std::fill(v_.begin(), v_.begin() + n, fill);
  }
  Tensor tensor(std::initializer_list<int64_t> shape) { return Tensor(v_.data(), DType::I32, shape); }
  std::vector<int32_t> values() const { return std::vector<int32_t>(v_.begin(), v_.begin() + n_); }
  void check(const char* what) const {
    for (int i = 0; i < kGuard; ++i) ASSERT_EQ(v_[static_cast<size_t>(n_ + i)], kSentinel) << what << ": wrote past the end";
  }

 private:
  int64_t n_;
  std::vector<int32_t> v_;
};

Tensor f32_view(std::vector<float>& v, std::initializer_list<int64_t> shape) { return Tensor(v.data(), DType::F32, shape); }
Tensor i32_view(std::vector<int32_t>& v, std::initializer_list<int64_t> shape) {
  return Tensor(v.data(), DType::I32, shape);
}

RouterConfig make_cfg(int E, int K, RouterScoring sc, bool normalize, float scaling) {
  RouterConfig c;
  c.num_experts = E;
  c.top_k = K;
  c.scoring = sc;
  c.normalize = normalize;
  c.routed_scaling = scaling;
  return c;
}

std::string cfg_name(const RouterConfig& c, bool bias) {
  return std::string(c.scoring == RouterScoring::Softmax ? "softmax" : "sigmoid") + (bias ? "+bias" : "") +
         (c.normalize ? " normalize" : "") + " scale=" + std::to_string(c.routed_scaling) + " E=" +
         std::to_string(c.num_experts) + " K=" + std::to_string(c.top_k) + " groups=" + std::to_string(c.n_group) +
         "/" + std::to_string(c.topk_group);
}

// ---------------------------------------------------------------------------
// Double-precision reference router, written from the Hugging Face code.

std::vector<double> ref_scores(const double* z, int E, RouterScoring sc) {
  std::vector<double> p(static_cast<size_t>(E));
  if (sc == RouterScoring::Sigmoid) {
    for (int e = 0; e < E; ++e) p[e] = 1.0 / (1.0 + std::exp(-z[e]));
    return p;
  }
  double m = z[0], s = 0;
  for (int e = 1; e < E; ++e) m = std::max(m, z[e]);
  for (int e = 0; e < E; ++e) s += p[e] = std::exp(z[e] - m);
  for (auto& v : p) v /= s;
  return p;
}

std::vector<int32_t> ref_select(const std::vector<double>& p, const float* bias, const RouterConfig& cfg) {
  const int E = cfg.num_experts;
  std::vector<double> v(static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) v[e] = p[e] + (bias ? bias[e] : 0.0);
  auto by_value = [](const std::vector<double>& val) {
    return [&val](int a, int b) { return val[a] > val[b] || (val[a] == val[b] && a < b); };
  };
  std::vector<int32_t> cand;
  if (cfg.n_group > 1) {
    const int G = cfg.n_group, size = E / G;
    std::vector<double> gs(static_cast<size_t>(G));
    for (int g = 0; g < G; ++g) {
      std::vector<int> m(static_cast<size_t>(size));
      std::iota(m.begin(), m.end(), g * size);
      std::sort(m.begin(), m.end(), by_value(v));
      gs[g] = v[m[0]] + (size > 1 ? v[m[1]] : 0.0);
    }
    std::vector<int> order(static_cast<size_t>(G));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), by_value(gs));
    std::vector<bool> ok(static_cast<size_t>(G), false);
    for (int i = 0; i < cfg.topk_group; ++i) ok[order[i]] = true;
    for (int e = 0; e < E; ++e)
      if (ok[e / size]) cand.push_back(e);
  } else {
    cand.resize(static_cast<size_t>(E));
    std::iota(cand.begin(), cand.end(), 0);
  }
  std::sort(cand.begin(), cand.end(), by_value(v));
  cand.resize(static_cast<size_t>(cfg.top_k));
  return cand;
}

std::vector<double> ref_weights(const std::vector<double>& p, const int32_t* idx, const RouterConfig& cfg) {
  std::vector<double> w(static_cast<size_t>(cfg.top_k));
  double sum = 0;
  for (int s = 0; s < cfg.top_k; ++s) sum += w[s] = p[idx[s]];
  for (auto& x : w) x = (cfg.normalize ? x / (sum + 1e-20) : x) * cfg.routed_scaling;
  return w;
}

struct RefRoute {
  std::vector<double> scores;  // (T, E)
  std::vector<int32_t> idx;    // (T, K)
  std::vector<double> w;       // (T, K)
};

RefRoute ref_route(const std::vector<float>& logits, int64_t T, const float* bias, const int32_t* replay,
                   const RouterConfig& cfg) {
  const int E = cfg.num_experts, K = cfg.top_k;
  RefRoute r;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> z(logits.begin() + t * E, logits.begin() + (t + 1) * E);
    auto p = ref_scores(z.data(), E, cfg.scoring);
    auto idx = replay ? std::vector<int32_t>(replay + t * K, replay + (t + 1) * K) : ref_select(p, bias, cfg);
    auto w = ref_weights(p, idx.data(), cfg);
    r.scores.insert(r.scores.end(), p.begin(), p.end());
    r.idx.insert(r.idx.end(), idx.begin(), idx.end());
    r.w.insert(r.w.end(), w.begin(), w.end());
  }
  return r;
}

// ---------------------------------------------------------------------------
// Kernel runners with sentinel guards on every output.

struct Routed {
  std::vector<int32_t> idx;   // (T, K)
  std::vector<float> w;       // (T, K)
  std::vector<float> scores;  // (T, E)
};

Routed run_route(const Context& ctx, std::vector<float> logits, int64_t T, const std::vector<float>* bias,
                 const std::vector<int32_t>* replay, const RouterConfig& cfg) {
  const int E = cfg.num_experts, K = cfg.top_k;
  GuardedIdx idx(T * K);
  Guarded w(T * K, -3.0f), scores(T * E, -3.0f);
  std::vector<float> b = bias ? *bias : std::vector<float>();
  std::vector<int32_t> rep = replay ? *replay : std::vector<int32_t>();
  moe_route(ctx, idx.tensor({T, K}), w.tensor({T, K}), scores.tensor({T, E}), f32_view(logits, {T, E}),
            bias ? f32_view(b, {E}) : Tensor(), replay ? i32_view(rep, {T, K}) : Tensor(), cfg);
  idx.check("topk_idx");
  w.check("topk_w");
  scores.check("scores");
  return {idx.values(), w.values(), scores.values()};
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

std::vector<float> run_combine(const MoeDispatch& plan, std::vector<float> ye, std::vector<float> w, int64_t D) {
  const int64_t T = plan.num_tokens, K = plan.top_k;
  Guarded y(T * D, 7.0f);
  Context ctx;
  moe_combine(ctx, y.tensor({T, D}), f32_view(ye, {T * K, D}), f32_view(w, {T, K}), plan);
  y.check("y");
  return y.values();
}

MoeDispatch plan_of(std::vector<int32_t> idx, int64_t T, int K, int E) { return moe_plan(i32_view(idx, {T, K}), E); }

// A per-row "expert": ye = xe * a_e + b_e elementwise (no contraction), so each
// row depends only on its own token and expert.
std::vector<float> toy_experts(const MoeDispatch& plan, const std::vector<float>& xe, int64_t D) {
  std::vector<float> ye(xe.size());
  for (int64_t r = 0; r < plan.num_rows(); ++r) {
    const int e = plan.expert[static_cast<size_t>(r)];
    for (int64_t d = 0; d < D; ++d) {
      const float a = 0.5f + 0.125f * static_cast<float>(e) - 0.01f * static_cast<float>(d);
      const float prod = xe[r * D + d] * a;
      ye[r * D + d] = prod + 0.03125f * static_cast<float>(e + 1);
    }
  }
  return ye;
}

// Distinct random experts per token.
std::vector<int32_t> random_sets(int64_t T, int K, int E, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<int32_t> out;
  std::vector<int32_t> all(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), g);
    out.insert(out.end(), all.begin(), all.begin() + K);
  }
  return out;
}

// ---------------------------------------------------------------------------
// Router forward.

TEST(MoeRoute, MatchesDoubleReference) {
  const int64_t T = 37;
  Context ctx;
  for (int E : {16, 64}) {
    const int K = E == 16 ? 4 : 8;
    const auto logits = randn(T * E, 11 + E, 1.5f);
    for (RouterScoring sc : {RouterScoring::Softmax, RouterScoring::Sigmoid}) {
      // Bias the size of the score spread so it actually changes some choices.
      const float bscale = sc == RouterScoring::Softmax ? 0.03f : 0.3f;
      const auto bias = uniform(E, 5 + E, -bscale, bscale);
      for (bool with_bias : {false, true})
        for (bool normalize : {false, true})
          for (float scaling : {1.0f, 2.5f}) {
            const RouterConfig cfg = make_cfg(E, K, sc, normalize, scaling);
            SCOPED_TRACE(cfg_name(cfg, with_bias));
            const Routed got = run_route(ctx, logits, T, with_bias ? &bias : nullptr, nullptr, cfg);
            const RefRoute want = ref_route(logits, T, with_bias ? bias.data() : nullptr, nullptr, cfg);
            expect_close(got.scores, want.scores, 2e-6, "scores");
            ASSERT_EQ(got.idx, want.idx);
            expect_close(got.w, want.w, 2e-6, "topk_w");
            if (with_bias) {
              const RefRoute unbiased = ref_route(logits, T, nullptr, nullptr, cfg);
              EXPECT_NE(unbiased.idx, want.idx) << "the bias should change at least one selection";
            }
          }
    }
  }
}

TEST(MoeRoute, GroupLimitedRoutingMatchesReference) {
  const int64_t T = 41;
  const int E = 16;
  Context ctx;
  const auto logits = randn(T * E, 21, 1.5f);
  const auto bias = uniform(E, 22, -0.2f, 0.2f);
  for (RouterScoring sc : {RouterScoring::Sigmoid, RouterScoring::Softmax}) {
    RouterConfig cfg = make_cfg(E, 4, sc, true, 2.5f);
    cfg.n_group = 4;
    cfg.topk_group = 2;
    SCOPED_TRACE(cfg_name(cfg, true));
    const Routed got = run_route(ctx, logits, T, &bias, nullptr, cfg);
    const RefRoute want = ref_route(logits, T, bias.data(), nullptr, cfg);
    ASSERT_EQ(got.idx, want.idx);
    expect_close(got.w, want.w, 2e-6, "topk_w");
    for (int64_t t = 0; t < T; ++t) {
      std::vector<bool> used(4, false);
      for (int s = 0; s < 4; ++s) used[got.idx[t * 4 + s] / 4] = true;
      EXPECT_LE(std::count(used.begin(), used.end(), true), 2) << "token " << t << " uses more than topk_group groups";
    }
    RouterConfig flat = cfg;
    flat.n_group = flat.topk_group = 1;
    EXPECT_NE(ref_route(logits, T, bias.data(), nullptr, flat).idx, want.idx) << "groups should matter here";
  }
}

TEST(MoeRoute, TiesBreakToTheLowerIndexAndSlotsAreInDescendingOrder) {
  Context ctx;
  for (RouterScoring sc : {RouterScoring::Softmax, RouterScoring::Sigmoid}) {
    const RouterConfig cfg = make_cfg(8, 2, sc, true, 1.0f);
    const Routed r = run_route(ctx, std::vector<float>(8, 0.0f), 1, nullptr, nullptr, cfg);
    EXPECT_EQ(r.idx, (std::vector<int32_t>{0, 1}));
    EXPECT_EQ(r.w, (std::vector<float>{0.5f, 0.5f}));
  }
  const std::vector<float> z = {0, 2, 1, 2, 2, -1};
  EXPECT_EQ(run_route(ctx, z, 1, nullptr, nullptr, make_cfg(6, 3, RouterScoring::Softmax, false, 1)).idx,
            (std::vector<int32_t>{1, 3, 4}));
  EXPECT_EQ(run_route(ctx, z, 1, nullptr, nullptr, make_cfg(6, 5, RouterScoring::Sigmoid, false, 1)).idx,
            (std::vector<int32_t>{1, 3, 4, 2, 0}));
  // The bias creates the ties: sigmoid(0) + 0.5 for experts 1 and 3.
  const std::vector<float> bias = {0, 0.5f, 0, 0.5f};
  EXPECT_EQ(run_route(ctx, std::vector<float>(4, 0.0f), 1, &bias, nullptr, make_cfg(4, 3, RouterScoring::Sigmoid, 0, 1))
                .idx,
            (std::vector<int32_t>{1, 3, 0}));
  // NaN ranks last, so indices stay valid and distinct.
  const float nan = std::nanf("");
  // (NaN enters through the bias here: vsigmoid maps a NaN logit to 1, not NaN.)
  const std::vector<float> nan_bias = {nan, 0, nan, 0};
  EXPECT_EQ(run_route(ctx, {0, 1, 0, 2}, 1, &nan_bias, nullptr, make_cfg(4, 3, RouterScoring::Sigmoid, 0, 1)).idx,
            (std::vector<int32_t>{3, 1, 0}));
  EXPECT_EQ(run_route(ctx, {nan, 1, nan, 2}, 1, nullptr, nullptr, make_cfg(4, 3, RouterScoring::Softmax, 0, 1)).idx,
            (std::vector<int32_t>{0, 1, 2}));
}

TEST(MoeRoute, ReplayUsesTheGivenExpertsAndRecomputesWeights) {
  const int64_t T = 23;
  const int E = 12, K = 3;
  Context ctx;
  const auto logits = randn(T * E, 31);
  const auto bias = uniform(E, 32, -0.2f, 0.2f);
  for (RouterScoring sc : {RouterScoring::Softmax, RouterScoring::Sigmoid}) {
    const RouterConfig cfg = make_cfg(E, K, sc, true, 2.5f);
    const auto replay = random_sets(T, K, E, 33);
    const Routed got = run_route(ctx, logits, T, &bias, &replay, cfg);
    EXPECT_EQ(got.idx, replay);
    expect_close(got.w, ref_route(logits, T, nullptr, replay.data(), cfg).w, 2e-6, "replayed topk_w");
    // The random sets are not the router's own: else the checks above would
    // pass with the replay ignored.
    const Routed own = run_route(ctx, logits, T, &bias, nullptr, cfg);
    int64_t differ = 0;
    for (int64_t t = 0; t < T; ++t)
      differ += std::set<int32_t>(replay.begin() + t * K, replay.begin() + (t + 1) * K) !=
                std::set<int32_t>(own.idx.begin() + t * K, own.idx.begin() + (t + 1) * K);
    EXPECT_GT(differ, T / 2);
    // Replaying the router's own choice reproduces its weights bit for bit.
    const Routed again = run_route(ctx, logits, T, nullptr, &own.idx, cfg);
    EXPECT_EQ(again.idx, own.idx);
    expect_bits_equal(again.w.data(), own.w.data(), T * K, "replayed own choice");
  }
}

TEST(MoeRoute, ReplayErrorsNameTheTokenAndTheIndex) {
  const int64_t T = 4;
  const int E = 8, K = 2;
  Context ctx;
  const auto logits = randn(T * E, 41);
  const RouterConfig cfg = make_cfg(E, K, RouterScoring::Softmax, true, 1);
  auto message = [&](std::vector<int32_t> replay) {
    try {
      run_route(ctx, logits, T, nullptr, &replay, cfg);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string m = message({0, 1, 2, 3, 4, 9, 6, 7});
  EXPECT_NE(m.find("token 2"), std::string::npos) << m;
  EXPECT_NE(m.find("expert index 9"), std::string::npos) << m;
  m = message({0, 1, 2, 3, 4, 5, -1, 7});
  EXPECT_NE(m.find("token 3"), std::string::npos) << m;
  EXPECT_NE(m.find("-1"), std::string::npos) << m;
  m = message({0, 1, 5, 5, 4, 2, 6, 7});
  EXPECT_NE(m.find("token 1"), std::string::npos) << m;
  EXPECT_NE(m.find("twice"), std::string::npos) << m;
}

TEST(MoeRoute, HonoursRowStrides) {
  const int64_t T = 9;
  const int E = 10, K = 3;
  Context ctx;
  const auto logits = randn(T * E, 51);
  const auto bias = uniform(E, 52, -0.1f, 0.1f);
  const RouterConfig cfg = make_cfg(E, K, RouterScoring::Sigmoid, true, 2.5f);
  const Routed dense = run_route(ctx, logits, T, &bias, nullptr, cfg);
  // Padded rows: logits stride E+3, scores E+2, idx and w K+1.
  std::vector<float> zl(static_cast<size_t>(T * (E + 3)), 123.0f), sc(static_cast<size_t>(T * (E + 2)), 5.0f);
  std::vector<float> w(static_cast<size_t>(T * (K + 1)), 5.0f);
  std::vector<int32_t> idx(static_cast<size_t>(T * (K + 1)), -5);
  for (int64_t t = 0; t < T; ++t) std::copy_n(logits.begin() + t * E, E, zl.begin() + t * (E + 3));
  auto padded = [](Tensor v, int64_t stride) {
    v.stride[0] = stride;
    return v;
  };
  std::vector<float> b = bias;
  moe_route(ctx, padded(i32_view(idx, {T, K}), K + 1), padded(f32_view(w, {T, K}), K + 1),
            padded(f32_view(sc, {T, E}), E + 2), padded(f32_view(zl, {T, E}), E + 3), f32_view(b, {E}), Tensor(), cfg);
  for (int64_t t = 0; t < T; ++t) {
    for (int s = 0; s < K; ++s) {
      EXPECT_EQ(idx[t * (K + 1) + s], dense.idx[t * K + s]);
      EXPECT_EQ(w[t * (K + 1) + s], dense.w[t * K + s]);
    }
    EXPECT_EQ(idx[t * (K + 1) + K], -5) << "padding written";
    EXPECT_EQ(sc[t * (E + 2) + E], 5.0f) << "padding written";
    expect_bits_equal(&sc[t * (E + 2)], &dense.scores[t * E], E, "strided scores");
  }
}

// ---------------------------------------------------------------------------
// Router backward.

// L = sum_{t,s} G[t,s] * w[t,s]; the reference keeps the kernel's selection
// fixed and differentiates the double-precision weights by central differences.
TEST(MoeRouteBackward, MatchesFiniteDifferencesOfTheDoubleReference) {
  const int64_t T = 6;
  const int E = 10, K = 3;
  Context ctx;
  const auto logits = randn(T * E, 61, 1.5f);
  const auto bias = uniform(E, 62, -0.2f, 0.2f);
  const auto G = randn(T * K, 63);
  for (RouterScoring sc : {RouterScoring::Softmax, RouterScoring::Sigmoid})
    for (bool normalize : {false, true})
      for (float scaling : {1.0f, 2.5f}) {
        const RouterConfig cfg = make_cfg(E, K, sc, normalize, scaling);
        SCOPED_TRACE(cfg_name(cfg, true));
        const Routed r = run_route(ctx, logits, T, &bias, nullptr, cfg);
        const auto dz = run_route_backward(ctx, r, G, T, cfg);
        std::vector<double> want(static_cast<size_t>(T * E));
        const double h = 1e-6;
        for (int64_t t = 0; t < T; ++t)
          for (int j = 0; j < E; ++j) {
            auto loss = [&](double dzj) {
              std::vector<double> z(logits.begin() + t * E, logits.begin() + (t + 1) * E);
              z[j] += dzj;
              const auto w = ref_weights(ref_scores(z.data(), E, sc), &r.idx[t * K], cfg);
              double l = 0;
              for (int s = 0; s < K; ++s) l += G[t * K + s] * w[s];
              return l;
            };
            want[t * E + j] = (loss(h) - loss(-h)) / (2 * h);
          }
        expect_close(dz, want, 2e-5, "dlogits", 1e-7);
      }
}

// The float kernel itself, perturbed: logits are spaced 0.5 apart so a step of
// 1e-2 never changes the top-k (checked), and the loss is accumulated in double.
TEST(MoeRouteBackward, MatchesFiniteDifferencesOfTheKernel) {
  const int64_t T = 3;
  const int E = 10, K = 3;
  Context ctx;
  std::mt19937 rng(71);
  std::vector<float> logits;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> row(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) row[e] = -2.25f + 0.5f * static_cast<float>(e);
    std::shuffle(row.begin(), row.end(), rng);
    logits.insert(logits.end(), row.begin(), row.end());
  }
  const auto bias = uniform(E, 72, -0.005f, 0.005f);
  const auto G = randn(T * K, 73);
  for (RouterScoring sc : {RouterScoring::Softmax, RouterScoring::Sigmoid})
    for (bool normalize : {false, true}) {
      const RouterConfig cfg = make_cfg(E, K, sc, normalize, 2.5f);
      SCOPED_TRACE(cfg_name(cfg, true));
      const Routed r = run_route(ctx, logits, T, &bias, nullptr, cfg);
      const auto dz = run_route_backward(ctx, r, G, T, cfg);
      std::vector<double> want(static_cast<size_t>(T * E));
      const float h = 1e-2f;
      for (int64_t i = 0; i < T * E; ++i) {
        auto loss = [&](float step) {
          auto z = logits;
          z[i] += step;
          const Routed p = run_route(ctx, z, T, &bias, nullptr, cfg);
          EXPECT_EQ(p.idx, r.idx) << "perturbation changed the selection";
          double l = 0;
          for (int64_t k = 0; k < T * K; ++k) l += double(G[k]) * p.w[k];
          return l;
        };
        want[i] = (loss(h) - loss(-h)) / (2.0 * h);
      }
      expect_close(dz, want, 2e-3, "dlogits", 1e-5);
    }
}

// ---------------------------------------------------------------------------
// Dispatch handle.

TEST(MoePlan, GroupsRowsByExpertInTokenOrder) {
  const int64_t T = 50;
  const int K = 3, E = 9;
  // Experts 7 and 8 get no tokens; tokens 10..12 list an expert twice.
  auto idx = random_sets(T, K, 7, 81);
  idx[10 * K + 1] = idx[10 * K + 2];
  idx[12 * K + 0] = idx[12 * K + 2];
  const MoeDispatch plan = plan_of(idx, T, K, E);
  ASSERT_EQ(plan.offsets.size(), static_cast<size_t>(E + 1));
  EXPECT_EQ(plan.offsets[0], 0);
  EXPECT_EQ(plan.offsets[E], T * K);
  for (int e = 0; e < E; ++e) {
    EXPECT_EQ(plan.expert_rows(e), std::count(idx.begin(), idx.end(), e)) << "expert " << e;
    for (int64_t r = plan.offsets[e]; r < plan.offsets[e + 1]; ++r) {
      EXPECT_EQ(plan.expert[r], e);
      EXPECT_EQ(idx[plan.token[r] * K + plan.slot[r]], e) << "row " << r;
      if (r > plan.offsets[e]) {
        const bool ordered = plan.token[r - 1] < plan.token[r] ||
                             (plan.token[r - 1] == plan.token[r] && plan.slot[r - 1] < plan.slot[r]);
        EXPECT_TRUE(ordered) << "expert " << e << " row " << r << " out of token order";
      }
    }
  }
  std::vector<int> seen(static_cast<size_t>(T * K), 0);
  for (int64_t t = 0; t < T; ++t)
    for (int s = 0; s < K; ++s) {
      const int32_t r = plan.row_of[t * K + s];
      ASSERT_TRUE(r >= 0 && r < T * K);
      EXPECT_EQ(plan.token[r], t);
      EXPECT_EQ(plan.slot[r], s);
      ++seen[r];
    }
  EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));

  const MoeDispatch empty = plan_of({}, 0, K, E);
  EXPECT_EQ(empty.offsets, std::vector<int64_t>(E + 1, 0));
}

TEST(MoePlan, OutOfRangeIndexNamesTheTokenAndTheIndex) {
  try {
    plan_of({0, 1, 2, 3, 12, 5}, 3, 2, 8);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("token 2"), std::string::npos) << m;
    EXPECT_NE(m.find("expert index 12"), std::string::npos) << m;
  }
}

// ---------------------------------------------------------------------------
// Gather and combine.

TEST(MoeGatherCombine, RoundTripMatchesDirectPerTokenReference) {
  const int64_t T = 19, D = 21;
  const int K = 3, E = 6;
  const auto idx = random_sets(T, K, E, 91);
  const MoeDispatch plan = plan_of(idx, T, K, E);
  // x with padded rows (stride D+3) to exercise strides.
  const int64_t xs = D + 3;
  auto xv = randn(T * xs, 92);
  Tensor x = Tensor(xv.data(), DType::F32, {T, D});
  x.stride[0] = xs;
  Guarded xe(T * K * D, 4.0f);
  ThreadPool pool(2);
  Context ctx{&pool};
  moe_gather(ctx, xe.tensor({T * K, D}), x, plan);
  xe.check("xe");
  for (int64_t t = 0; t < T; ++t)
    for (int s = 0; s < K; ++s) expect_bits_equal(&xe[plan.row_of[t * K + s] * D], &xv[t * xs], D, "gathered row");

  const auto ye = toy_experts(plan, xe.values(), D);
  const auto w = uniform(T * K, 93, -1.0f, 1.5f);
  const auto y = run_combine(plan, ye, w, D);
  std::vector<float> contract(static_cast<size_t>(T * D));
  std::vector<double> direct(static_cast<size_t>(T * D));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t d = 0; d < D; ++d) {
      float acc = 0.0f;  // the documented order: slot order, one fma each, from 0
      double ref = 0;
      for (int s = 0; s < K; ++s) {
        const float ys = ye[plan.row_of[t * K + s] * D + d];
        acc = std::fma(w[t * K + s], ys, acc);
        // Direct: the token's expert applied to its own row, no dispatch.
        const int e = idx[t * K + s];
        const float a = 0.5f + 0.125f * static_cast<float>(e) - 0.01f * static_cast<float>(d);
        ref += double(w[t * K + s]) * (double(xv[t * xs + d]) * a + 0.03125 * (e + 1));
      }
      contract[t * D + d] = acc;
      direct[t * D + d] = ref;
    }
  expect_bits_equal(y.data(), contract.data(), T * D, "combine vs the written contract");
  expect_close(y, direct, 1e-6, "combine vs direct reference");

  // bf16 rows are gathered bit for bit too.
  std::vector<bf16_t> xb(static_cast<size_t>(T * D)), xeb(static_cast<size_t>(T * K * D));
  for (size_t i = 0; i < xb.size(); ++i) xb[i] = f32_to_bf16(xv[i]);
  moe_gather(ctx, Tensor(xeb.data(), DType::BF16, {T * K, D}), Tensor(xb.data(), DType::BF16, {T, D}), plan);
  for (int64_t r = 0; r < T * K; ++r)
    ASSERT_EQ(0, std::memcmp(&xeb[r * D], &xb[plan.token[r] * D], D * sizeof(bf16_t))) << "row " << r;
}

// L = sum dy . y with y = combine(ye, w): linear in each, so central
// differences are exact up to rounding.
TEST(MoeCombineBackward, MatchesFiniteDifferences) {
  const int64_t T = 7, D = 9;
  const int K = 3, E = 5;
  const MoeDispatch plan = plan_of(random_sets(T, K, E, 101), T, K, E);
  const auto ye = randn(T * K * D, 102);
  const auto w = uniform(T * K, 103, -1.0f, 1.0f);
  const auto dy = randn(T * D, 104);
  Guarded dye(T * K * D, 8.0f), dw(T * K, 8.0f);
  std::vector<float> yev = ye, wv = w, dyv = dy;
  Context ctx;
  moe_combine_backward(ctx, dye.tensor({T * K, D}), dw.tensor({T, K}), f32_view(dyv, {T, D}),
                       f32_view(yev, {T * K, D}), f32_view(wv, {T, K}), plan);
  dye.check("dye");
  dw.check("dtopk_w");
  auto loss = [&](const std::vector<float>& yv, const std::vector<float>& wt) {
    const auto y = run_combine(plan, yv, wt, D);
    double l = 0;
    for (int64_t i = 0; i < T * D; ++i) l += double(dy[i]) * y[i];
    return l;
  };
  const float h = 1e-2f;
  std::vector<double> want_dye(static_cast<size_t>(T * K * D)), want_dw(static_cast<size_t>(T * K));
  for (int64_t i = 0; i < T * K * D; ++i) {
    auto p = ye, m = ye;
    p[i] += h;
    m[i] -= h;
    want_dye[i] = (loss(p, w) - loss(m, w)) / (double(p[i]) - m[i]);
  }
  for (int64_t i = 0; i < T * K; ++i) {
    auto p = w, m = w;
    p[i] += h;
    m[i] -= h;
    want_dw[i] = (loss(ye, p) - loss(ye, m)) / (double(p[i]) - m[i]);
  }
  expect_close(dye.values(), want_dye, 1e-4, "dye");
  expect_close(dw.values(), want_dw, 1e-4, "dtopk_w");
  // The contract: dye is one multiply w * dy.
  for (int64_t t = 0; t < T; ++t)
    for (int s = 0; s < K; ++s)
      for (int64_t d = 0; d < D; ++d)
        ASSERT_EQ(dye[plan.row_of[t * K + s] * D + d], w[t * K + s] * dy[t * D + d]);
}

TEST(MoeGatherBackward, AccumulatesAndMatchesFiniteDifferences) {
  const int64_t T = 8, D = 11;
  const int K = 3, E = 4;
  const MoeDispatch plan = plan_of(random_sets(T, K, E, 111), T, K, E);
  const auto x = randn(T * D, 112);
  const auto G = randn(T * K * D, 113);  // L = sum G . xe
  const auto dx0 = randn(T * D, 114);
  Guarded dx(T * D);
  for (int64_t i = 0; i < T * D; ++i) dx[i] = dx0[i];
  std::vector<float> gv = G;
  Context ctx;
  moe_gather_backward(ctx, dx.tensor({T, D}), f32_view(gv, {T * K, D}), plan);
  dx.check("dx");
  auto loss = [&](const std::vector<float>& xv) {
    std::vector<float> in = xv, xe(static_cast<size_t>(T * K * D));
    moe_gather(ctx, f32_view(xe, {T * K, D}), f32_view(in, {T, D}), plan);
    double l = 0;
    for (size_t i = 0; i < xe.size(); ++i) l += double(G[i]) * xe[i];
    return l;
  };
  std::vector<double> want(static_cast<size_t>(T * D));
  for (int64_t i = 0; i < T * D; ++i) {
    auto p = x, m = x;
    p[i] += 1e-2f;
    m[i] -= 1e-2f;
    want[i] = dx0[i] + (loss(p) - loss(m)) / (double(p[i]) - m[i]);
  }
  expect_close(dx.values(), want, 1e-4, "dx");
  // The contract: the slots summed first from 0 in slot order, then added once.
  for (int64_t t = 0; t < T; ++t)
    for (int64_t d = 0; d < D; ++d) {
      float acc = 0.0f;
      for (int s = 0; s < K; ++s) acc = acc + G[plan.row_of[t * K + s] * D + d];
      ASSERT_EQ(dx[t * D + d], dx0[t * D + d] + acc);
    }
}

// ---------------------------------------------------------------------------
// Batch invariance: every per-token output of the whole pipeline (route, plan,
// gather, experts, combine, and all backward passes) is bit-identical whether
// the token is alone or in a batch of 1..64, with 1 or 2 threads.

struct PipelineOut {
  std::vector<int32_t> idx;
  std::vector<float> w, y, dlogits, dx;
};

PipelineOut run_pipeline(const Context& ctx, const float* logits, const float* x, const float* dy, int64_t T,
                         int64_t D, const std::vector<float>* bias, const RouterConfig& cfg) {
  const int E = cfg.num_experts, K = cfg.top_k;
  const Routed r = run_route(ctx, std::vector<float>(logits, logits + T * E), T, bias, nullptr, cfg);
  const MoeDispatch plan = plan_of(r.idx, T, K, E);
  std::vector<float> xv(x, x + T * D), xe(static_cast<size_t>(T * K * D));
  moe_gather(ctx, f32_view(xe, {T * K, D}), f32_view(xv, {T, D}), plan);
  std::vector<float> ye = toy_experts(plan, xe, D), w = r.w;
  Guarded y(T * D);
  moe_combine(ctx, y.tensor({T, D}), f32_view(ye, {T * K, D}), f32_view(w, {T, K}), plan);
  y.check("y");
  std::vector<float> dyv(dy, dy + T * D), dye(static_cast<size_t>(T * K * D)), dw(static_cast<size_t>(T * K));
  moe_combine_backward(ctx, f32_view(dye, {T * K, D}), f32_view(dw, {T, K}), f32_view(dyv, {T, D}),
                       f32_view(ye, {T * K, D}), f32_view(w, {T, K}), plan);
  PipelineOut out{r.idx, r.w, y.values(), run_route_backward(ctx, r, dw, T, cfg), {}};
  std::vector<float> dx(static_cast<size_t>(T * D), 0.25f);
  moe_gather_backward(ctx, f32_view(dx, {T, D}), f32_view(dye, {T * K, D}), plan);
  out.dx = dx;
  return out;
}

TEST(MoeBatchInvariance, TokenResultsDoNotDependOnTheBatchOrThreads) {
  const int64_t N = 64, D = 24;
  const int E = 16, K = 4;
  const auto logits = randn(N * E, 121, 1.5f);
  const auto x = randn(N * D, 122);
  const auto dy = randn(N * D, 123);
  const auto bias = uniform(E, 124, -0.2f, 0.2f);
  ThreadPool one(1), two(2);
  for (RouterScoring sc : {RouterScoring::Softmax, RouterScoring::Sigmoid}) {
    RouterConfig cfg = make_cfg(E, K, sc, sc == RouterScoring::Sigmoid, sc == RouterScoring::Sigmoid ? 2.5f : 1.0f);
    if (sc == RouterScoring::Sigmoid) {
      cfg.n_group = 4;
      cfg.topk_group = 2;
    }
    const std::vector<float>* b = sc == RouterScoring::Sigmoid ? &bias : nullptr;
    SCOPED_TRACE(cfg_name(cfg, b != nullptr));
    std::vector<PipelineOut> alone;
    for (int64_t t = 0; t < N; ++t)
      alone.push_back(run_pipeline(Context{&one}, &logits[t * E], &x[t * D], &dy[t * D], 1, D, b, cfg));
    for (ThreadPool* pool : {&one, &two})
      for (int64_t B : {1, 2, 3, 7, 16, 33, 64}) {
        SCOPED_TRACE("batch " + std::to_string(B) + " threads " + std::to_string(pool->size()));
        for (int64_t t0 = 0; t0 < N; t0 += B) {
          const int64_t n = std::min(B, N - t0);
          const PipelineOut got =
              run_pipeline(Context{pool}, &logits[t0 * E], &x[t0 * D], &dy[t0 * D], n, D, b, cfg);
          for (int64_t i = 0; i < n; ++i) {
            const PipelineOut& a = alone[t0 + i];
            ASSERT_TRUE(std::equal(a.idx.begin(), a.idx.end(), got.idx.begin() + i * K)) << "token " << t0 + i;
            expect_bits_equal(&got.w[i * K], a.w.data(), K, "topk_w");
            expect_bits_equal(&got.y[i * D], a.y.data(), D, "y");
            expect_bits_equal(&got.dlogits[i * E], a.dlogits.data(), E, "dlogits");
            expect_bits_equal(&got.dx[i * D], a.dx.data(), D, "dx");
          }
        }
      }
  }
}

// ---------------------------------------------------------------------------
// End to end: a tiny MoE FFN (route, gather, y_e = x W_e per expert block,
// combine) against a dense reference that loops over tokens in double.

TEST(MoeEndToEnd, TinyMoeFfnMatchesDenseReference) {
  const int64_t T = 20, D = 8, F = 5;
  const int E = 6, K = 2;
  const auto x = randn(T * D, 131);
  const auto wr = randn(D * E, 132, 0.7f);     // (D, E) router weight
  const auto we = randn(E * D * F, 133, 0.4f);  // (E, D, F) expert weights
  for (RouterScoring sc : {RouterScoring::Softmax, RouterScoring::Sigmoid}) {
    const RouterConfig cfg = make_cfg(E, K, sc, true, 1.5f);
    SCOPED_TRACE(cfg_name(cfg, false));
    // Router logits (the GEMM done elsewhere), rounded to f32 once.
    std::vector<float> logits(static_cast<size_t>(T * E));
    for (int64_t t = 0; t < T; ++t)
      for (int e = 0; e < E; ++e) {
        double z = 0;
        for (int64_t d = 0; d < D; ++d) z += double(x[t * D + d]) * wr[d * E + e];
        logits[t * E + e] = static_cast<float>(z);
      }
    Context ctx;
    const Routed r = run_route(ctx, logits, T, nullptr, nullptr, cfg);
    const MoeDispatch plan = plan_of(r.idx, T, K, E);
    std::vector<float> xv = x, xe(static_cast<size_t>(T * K * D)), ye(static_cast<size_t>(T * K * F));
    moe_gather(ctx, f32_view(xe, {T * K, D}), f32_view(xv, {T, D}), plan);
    for (int e = 0; e < E; ++e)  // each expert's rows are one contiguous block
      for (int64_t row = plan.offsets[e]; row < plan.offsets[e + 1]; ++row)
        for (int64_t f = 0; f < F; ++f) {
          float acc = 0.0f;
          for (int64_t d = 0; d < D; ++d) acc = std::fma(xe[row * D + d], we[(e * D + d) * F + f], acc);
          ye[row * F + f] = acc;
        }
    const auto y = run_combine(plan, ye, r.w, F);

    const RefRoute ref = ref_route(logits, T, nullptr, nullptr, cfg);
    std::vector<double> want(static_cast<size_t>(T * F), 0.0);
    for (int64_t t = 0; t < T; ++t)
      for (int s = 0; s < K; ++s) {
        const int e = ref.idx[t * K + s];
        for (int64_t f = 0; f < F; ++f) {
          double h = 0;
          for (int64_t d = 0; d < D; ++d) h += double(x[t * D + d]) * we[(e * D + d) * F + f];
          want[t * F + f] += ref.w[t * K + s] * h;
        }
      }
    expect_close(y, want, 1e-5, "moe ffn");
  }
}

// ---------------------------------------------------------------------------
// Errors and the disagreement metric.

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(MoeErrors, ShapeErrorsNameTheShapes) {
  const int64_t T = 5;
  const int E = 6, K = 2;
  std::vector<float> z(T * E), sc(T * E), w(T * (K + 1));
  std::vector<int32_t> idx(T * K);
  const RouterConfig cfg = make_cfg(E, K, RouterScoring::Softmax, false, 1);
  Context ctx;
  std::string m = error_of([&] {
    moe_route(ctx, i32_view(idx, {T, K}), f32_view(w, {T, K + 1}), f32_view(sc, {T, E}), f32_view(z, {T, E}), Tensor(),
              Tensor(), cfg);
  });
  EXPECT_NE(m.find("topk_w"), std::string::npos) << m;
  EXPECT_NE(m.find("(5, 2)"), std::string::npos) << m;
  EXPECT_NE(m.find("(5, 3) f32"), std::string::npos) << m;
  m = error_of([&] {
    moe_route(ctx, i32_view(idx, {T, K}), f32_view(w, {T, K}), f32_view(sc, {T, E}), f32_view(z, {T, E}),
              f32_view(w, {E + 1}), Tensor(), cfg);
  });
  EXPECT_NE(m.find("bias"), std::string::npos) << m;
  EXPECT_NE(m.find("(7,) f32"), std::string::npos) << m;
  m = error_of([&] {
    moe_route(ctx, Tensor(idx.data(), DType::F32, {T, K}), f32_view(w, {T, K}), f32_view(sc, {T, E}),
              f32_view(z, {T, E}), Tensor(), Tensor(), cfg);
  });
  EXPECT_NE(m.find("topk_idx: expected dtype i32"), std::string::npos) << m;

  const MoeDispatch plan = plan_of(random_sets(T, K, E, 141), T, K, E);
  std::vector<float> ye(T * K * 4), y(T * 3), wk(T * K);
  m = error_of([&] { moe_combine(ctx, f32_view(y, {T, 3}), f32_view(ye, {T * K, 4}), f32_view(wk, {T, K}), plan); });
  EXPECT_NE(m.find("moe_combine: y"), std::string::npos) << m;
  EXPECT_NE(m.find("(5, 4)"), std::string::npos) << m;
  EXPECT_NE(m.find("(5, 3) f32"), std::string::npos) << m;
  m = error_of([&] { moe_gather(ctx, f32_view(ye, {T * K - 1, 4}), f32_view(y, {T, 4}), plan); });
  EXPECT_NE(m.find("moe_gather: xe"), std::string::npos) << m;
  EXPECT_NE(m.find("(10, 4)"), std::string::npos) << m;
}

TEST(MoeErrors, ConfigValidationNamesTheField) {
  auto msg = [](RouterConfig c) { return error_of([&] { c.validate(); }); };
  EXPECT_NE(msg(make_cfg(0, 1, RouterScoring::Softmax, 0, 1)).find("num_experts"), std::string::npos);
  EXPECT_NE(msg(make_cfg(4, 5, RouterScoring::Softmax, 0, 1)).find("top_k"), std::string::npos);
  RouterConfig c = make_cfg(8, 4, RouterScoring::Sigmoid, 1, 1);
  c.n_group = 3;
  EXPECT_NE(msg(c).find("n_group"), std::string::npos);
  c.n_group = 4;
  c.topk_group = 5;
  EXPECT_NE(msg(c).find("topk_group"), std::string::npos);
  c.topk_group = 1;  // one group of 2 experts cannot hold 4
  EXPECT_NE(msg(c).find("fewer than top_k"), std::string::npos);
  c.topk_group = 2;
  EXPECT_EQ(msg(c), "no error");
}

TEST(MoeMetrics, TopkDisagreementComparesSets) {
  std::vector<int32_t> a = {0, 1, 2, 3, 4, 5, 6, 7}, b = {1, 0, 2, 3, 4, 6, 7, 6};
  // token 0: same set reordered; 1: same; 2: {4,5} vs {4,6}; 3: {6,7} vs {7,6}.
  EXPECT_DOUBLE_EQ(topk_disagreement(i32_view(a, {4, 2}), i32_view(b, {4, 2})), 0.25);
  EXPECT_DOUBLE_EQ(topk_disagreement(i32_view(a, {4, 2}), i32_view(a, {4, 2})), 0.0);
  EXPECT_DOUBLE_EQ(topk_disagreement(i32_view(a, {0, 2}), i32_view(b, {0, 2})), 0.0);
  const std::string m = error_of([&] { topk_disagreement(i32_view(a, {4, 2}), i32_view(b, {2, 4})); });
  EXPECT_NE(m.find("(2, 4) i32"), std::string::npos) << m;
}

}  // namespace
}  // namespace lockstep::kernels
