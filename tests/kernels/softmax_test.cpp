// Tests for softmax, log-softmax and token logprob/entropy (forward and
// backward): double references, temperature, extreme and masked logits, V = 1,
// bit-exact batch/thread invariance, finite differences, guards, bad input.
#include "lockstep/kernels/cpu/softmax.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "common/test_util.h"

namespace lockstep::kernels {
namespace {

using test::expect_bits_equal;
using test::expect_close;
using test::Guarded;

inline size_t sz(int64_t n) {
  return static_cast<size_t>(n);
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::vector<int32_t> random_targets(int64_t T, int64_t V, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int32_t> d(0, int32_t(V - 1));
  std::vector<int32_t> y(sz(T));
  for (auto& v : y) v = d(g);
  return y;
}

// Double reference of one row: log-probabilities and entropy of softmax(x / tau).
struct RefRow {
  std::vector<double> logp;
  double entropy = 0, lse = 0;
};
RefRow ref_row(const double* x, int64_t V, double tau) {
  RefRow r;
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < V; ++i) m = std::max(m, x[i] / tau);
  double s = 0;
  for (int64_t i = 0; i < V; ++i) s += std::exp(x[i] / tau - m);
  r.lse = m + std::log(s);
  r.logp.resize(sz(V));
  for (int64_t i = 0; i < V; ++i) {
    r.logp[sz(i)] = x[i] / tau - r.lse;
    const double p = std::exp(r.logp[sz(i)]);
    if (p > 0) r.entropy -= p * r.logp[sz(i)];
  }
  return r;
}

Tensor strided(float* p, int64_t T, int64_t V, int64_t ld) {
  Tensor t(p, DType::F32, {T, V});
  t.stride[0] = ld;
  return t;
}

// Runs all three forwards on a padded (T, V) block and checks them against the reference.
void check_forward(const Context& ctx, const std::vector<float>& logits, int64_t T, int64_t V, float tau,
                   const std::string& what) {
  const int64_t ld = V + 3;
  std::vector<float> xs(sz(T * ld), 0.0f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < V; ++i) xs[sz(t * ld + i)] = logits[sz(t * V + i)];
  auto y = random_targets(T, V, uint32_t(T * 131 + V));
  Guarded probs(T * ld, 3.0f), logp(T * ld, 3.0f), lp(T), ent(T), lse(T);
  const Tensor x = strided(xs.data(), T, V, ld);
  softmax_forward(ctx, strided(probs.data(), T, V, ld), x, tau);
  log_softmax_forward(ctx, strided(logp.data(), T, V, ld), x, tau);
  token_logprob_forward(ctx, lp.tensor({T}), ent.tensor({T}), lse.tensor({T}), x,
                        Tensor(y.data(), DType::I32, {T}), tau);
  probs.check("probs");
  logp.check("logp");
  lp.check("token logp");
  ent.check("entropy");
  lse.check("lse");
  std::vector<double> wp, wl, wlp, went, wlse;
  std::vector<float> gp, gl;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> xd(logits.begin() + t * V, logits.begin() + (t + 1) * V);
    RefRow r = ref_row(xd.data(), V, tau);
    for (int64_t i = 0; i < V; ++i) {
      wl.push_back(r.logp[sz(i)]);
      wp.push_back(std::exp(r.logp[sz(i)]));
      gp.push_back(probs[t * ld + i]);
      gl.push_back(logp[t * ld + i]);
    }
    for (int64_t i = V; i < ld; ++i) {
      ASSERT_EQ(probs[t * ld + i], 3.0f) << "padding written";
      ASSERT_EQ(logp[t * ld + i], 3.0f) << "padding written";
    }
    wlp.push_back(r.logp[sz(y[sz(t)])]);
    went.push_back(r.entropy);
    wlse.push_back(r.lse);
    // THE logprob equals the log-softmax entry bit for bit.
    ASSERT_EQ(lp[t], logp[t * ld + y[sz(t)]]) << what << " row " << t;
    ASSERT_GE(ent[t], 0.0f) << what;
  }
  // Rounding z = x / tau to f32 already moves z by up to half an ulp of
  // max |z|, so every logp may be off by about an ulp of max |z|; beyond that,
  // a few ulp of |z - m| plus the error of log(sum).
  double zmax = 0;
  for (float v : logits) zmax = std::max(zmax, std::fabs(double(v) / tau));
  const double zq = 4 * 0x1p-24 * zmax;
  expect_close(gl, wl, 2e-7, ("logp " + what).c_str(), 2e-6 + zq);
  expect_close(lp.values(), wlp, 2e-7, ("token logp " + what).c_str(), 2e-6 + zq);
  expect_close(gp, wp, 1e-5 + zq, ("probs " + what).c_str(), 1e-7);
  expect_close(ent.values(), went, 1e-5 + zq, ("entropy " + what).c_str(), 1e-6);
  expect_close(lse.values(), wlse, 1e-6, ("lse " + what).c_str(), 1e-6);
}

TEST(Softmax, ForwardMatchesDoubleReference) {
  ThreadPool pool(2);
  Context ctx{&pool};
  uint32_t seed = 1;
  for (int64_t V : {1, 2, 15, 16, 17, 100, 1000, 5003}) {
    for (int64_t T : {1, 3, 10}) {
      for (float tau : {1.0f, 0.7f, 1.3f}) {
        const std::string what =
            "V=" + std::to_string(V) + " T=" + std::to_string(T) + " tau=" + std::to_string(tau);
        check_forward(ctx, test::randn(T * V, seed++, 3.0f), T, V, tau, what);
      }
    }
  }
  // A real vocabulary size (Qwen): sums over 150K terms.
  check_forward(ctx, test::randn(2 * 151936, seed++, 3.0f), 2, 151936, 1.0f, "V=151936");
  check_forward(ctx, test::uniform(2 * 151936, seed++, -0.5f, 0.5f), 2, 151936, 0.7f,
                "V=151936 near-uniform");
}

TEST(Softmax, ExtremeLogits) {
  Context ctx;
  const int64_t V = 777, T = 4;
  for (float tau : {1.0f, 0.6f}) {
    // Row 0: uniform spread over [-80, 80]; row 1: one logit at +80, the rest at -80;
    // row 2: everything near -1e4 (large offsets); row 3: near +1e4 with tiny differences.
    auto lg = test::uniform(T * V, 5, -80.0f, 80.0f);
    for (int64_t i = 0; i < V; ++i) lg[sz(V + i)] = -80.0f;
    lg[sz(V + 123)] = 80.0f;
    auto small = test::uniform(V, 6, -1.0f, 1.0f);
    for (int64_t i = 0; i < V; ++i) lg[sz(2 * V + i)] = -1e4f + small[sz(i)];
    for (int64_t i = 0; i < V; ++i) lg[sz(3 * V + i)] = 1e4f + small[sz(i)];
    check_forward(ctx, lg, T, V, tau, "extreme tau=" + std::to_string(tau));
  }
  // Exact values in the one-hot limit: logp(argmax) = -0 or tiny, entropy ~ 0.
  std::vector<float> row(64, -80.0f), lp(1), ent(1);
  row[7] = 80.0f;
  std::vector<int32_t> y = {7};
  token_logprob_forward(ctx, Tensor(lp.data(), DType::F32, {1}), Tensor(ent.data(), DType::F32, {1}),
                        Tensor(), Tensor(row.data(), DType::F32, {1, 64}), Tensor(y.data(), DType::I32, {1}),
                        1.0f);
  EXPECT_EQ(lp[0], 0.0f);
  EXPECT_EQ(ent[0], 0.0f);  // the other probabilities underflow to exactly 0
}

TEST(Softmax, VocabularyOfOne) {
  Context ctx;
  const int64_t T = 5;
  auto lg = test::randn(T, 7, 50.0f);
  std::vector<int32_t> y(sz(T), 0);
  std::vector<float> p(sz(T)), l(sz(T)), lp(sz(T)), ent(sz(T)), lse(sz(T)), dl(sz(T));
  std::vector<float> gl(sz(T), 1.0f), ge(sz(T), 1.0f);
  Tensor x(lg.data(), DType::F32, {T, 1}), yt(y.data(), DType::I32, {T});
  softmax_forward(ctx, Tensor(p.data(), DType::F32, {T, 1}), x, 0.5f);
  log_softmax_forward(ctx, Tensor(l.data(), DType::F32, {T, 1}), x, 0.5f);
  token_logprob_forward(ctx, Tensor(lp.data(), DType::F32, {T}), Tensor(ent.data(), DType::F32, {T}),
                        Tensor(lse.data(), DType::F32, {T}), x, yt, 0.5f);
  token_logprob_backward(ctx, Tensor(dl.data(), DType::F32, {T, 1}), Tensor(gl.data(), DType::F32, {T}),
                         Tensor(ge.data(), DType::F32, {T}), x, yt, 0.5f);
  for (int64_t t = 0; t < T; ++t) {
    EXPECT_EQ(p[sz(t)], 1.0f);
    EXPECT_EQ(l[sz(t)], 0.0f);
    EXPECT_EQ(lp[sz(t)], 0.0f);
    EXPECT_EQ(ent[sz(t)], 0.0f);
    EXPECT_EQ(lse[sz(t)], lg[sz(t)] / 0.5f);
    EXPECT_EQ(dl[sz(t)], 0.0f);
  }
}

TEST(Softmax, MaskedMinusInfinityLogits) {
  Context ctx;
  const int64_t V = 50;
  auto lg = test::randn(V, 8, 2.0f);
  std::vector<float> unmasked;
  for (int64_t i = 0; i < V; ++i) {
    if (i % 3 == 0) {
      lg[sz(i)] = -std::numeric_limits<float>::infinity();
    } else {
      unmasked.push_back(lg[sz(i)]);
    }
  }
  Tensor x(lg.data(), DType::F32, {1, V});
  std::vector<float> p(sz(V)), l(sz(V)), lp(1), ent(1), dl(sz(V));
  std::vector<int32_t> y = {1};
  softmax_forward(ctx, Tensor(p.data(), DType::F32, {1, V}), x, 1.0f);
  log_softmax_forward(ctx, Tensor(l.data(), DType::F32, {1, V}), x, 1.0f);
  token_logprob_forward(ctx, Tensor(lp.data(), DType::F32, {1}), Tensor(ent.data(), DType::F32, {1}),
                        Tensor(), x, Tensor(y.data(), DType::I32, {1}), 1.0f);
  std::vector<double> ud(unmasked.begin(), unmasked.end());
  RefRow r = ref_row(ud.data(), int64_t(ud.size()), 1.0);
  EXPECT_NEAR(ent[0], r.entropy, 1e-5);
  EXPECT_NEAR(lp[0], r.logp[0], 1e-6);
  for (int64_t i = 0; i < V; i += 3) {
    EXPECT_EQ(p[sz(i)], 0.0f);
    EXPECT_EQ(l[sz(i)], -std::numeric_limits<float>::infinity());
  }
  std::vector<float> gl = {1.0f}, ge = {-2.0f};
  token_logprob_backward(ctx, Tensor(dl.data(), DType::F32, {1, V}), Tensor(gl.data(), DType::F32, {1}),
                         Tensor(ge.data(), DType::F32, {1}), x, Tensor(y.data(), DType::I32, {1}), 1.0f);
  for (int64_t i = 0; i < V; ++i) {
    ASSERT_TRUE(std::isfinite(dl[sz(i)])) << i;
    if (i % 3 == 0) {
      ASSERT_EQ(dl[sz(i)], 0.0f) << i;
    }
  }
}

// A NaN logit must reach the loss (so the trainer can skip the step), not vanish.
TEST(Softmax, NanLogitPropagates) {
  Context ctx;
  const int64_t V = 40;
  auto lg = test::randn(V, 17);
  lg[9] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> lp(1), ent(1), dl(sz(V)), gl = {1.0f};
  std::vector<int32_t> y = {3};
  Tensor x(lg.data(), DType::F32, {1, V}), yt(y.data(), DType::I32, {1});
  token_logprob_forward(ctx, Tensor(lp.data(), DType::F32, {1}), Tensor(ent.data(), DType::F32, {1}),
                        Tensor(), x, yt, 1.0f);
  EXPECT_TRUE(std::isnan(lp[0]));
  EXPECT_TRUE(std::isnan(ent[0]));
  token_logprob_backward(ctx, Tensor(dl.data(), DType::F32, {1, V}), Tensor(gl.data(), DType::F32, {1}),
                         Tensor(), x, yt, 1.0f);
  EXPECT_TRUE(std::isnan(dl[3]));
}

// Central differences of L = sum_t a_t logp_t + b_t H_t, computed on the
// double reference, against the f32 analytic gradient.
TEST(Softmax, BackwardMatchesFiniteDifferences) {
  uint32_t seed = 40;
  for (int64_t V : {1, 2, 7, 40}) {
    for (float tau : {1.0f, 0.7f, 2.5f}) {
      for (int mode = 0; mode < 3; ++mode) {  // 0: both, 1: dlogp only, 2: dentropy only
        const int64_t T = 3;
        auto lg = test::randn(T * V, seed++, 2.0f), a = test::randn(T, seed++), b = test::randn(T, seed++);
        auto y = random_targets(T, V, seed++);
        if (mode == 1) b.assign(sz(T), 0.0f);
        if (mode == 2) a.assign(sz(T), 0.0f);
        std::vector<double> xd(lg.begin(), lg.end());
        auto loss = [&](const std::vector<double>& x) {
          double l = 0;
          for (int64_t t = 0; t < T; ++t) {
            RefRow r = ref_row(x.data() + t * V, V, tau);
            l += a[sz(t)] * r.logp[sz(y[sz(t)])] + b[sz(t)] * r.entropy;
          }
          return l;
        };
        std::vector<double> fd(sz(T * V));
        const double h = 1e-5;
        for (size_t k = 0; k < fd.size(); ++k) {
          auto p = xd, m = xd;
          p[k] += h;
          m[k] -= h;
          fd[k] = (loss(p) - loss(m)) / (2 * h);
        }
        Context ctx;
        Guarded dl(T * V, 9.0f);
        token_logprob_backward(ctx, dl.tensor({T, V}),
                               mode == 2 ? Tensor() : Tensor(a.data(), DType::F32, {T}),
                               mode == 1 ? Tensor() : Tensor(b.data(), DType::F32, {T}),
                               Tensor(lg.data(), DType::F32, {T, V}), Tensor(y.data(), DType::I32, {T}), tau);
        dl.check("dlogits");
        const std::string what =
            "V=" + std::to_string(V) + " tau=" + std::to_string(tau) + " mode=" + std::to_string(mode);
        expect_close(dl.values(), fd, 1e-4, what.c_str(), 1e-6);
        // In place over the logits gives the same bits.
        std::vector<float> inplace = lg;
        token_logprob_backward(ctx, Tensor(inplace.data(), DType::F32, {T, V}),
                               mode == 2 ? Tensor() : Tensor(a.data(), DType::F32, {T}),
                               mode == 1 ? Tensor() : Tensor(b.data(), DType::F32, {T}),
                               Tensor(inplace.data(), DType::F32, {T, V}), Tensor(y.data(), DType::I32, {T}),
                               tau);
        expect_bits_equal(inplace.data(), dl.data(), T * V, "in place");
      }
    }
  }
}

// Each row alone == that row inside batches of 1..64, with 1 and 2 threads,
// for every function (this is what makes rollout and trainer logprobs agree).
TEST(Softmax, BatchAndThreadInvariance) {
  const int64_t N = 64, V = 1000;  // 16 rows per task: two threads split batches >= 32
  auto lg = test::randn(N * V, 11, 4.0f), gl = test::randn(N, 12), ge = test::randn(N, 13);
  auto y = random_targets(N, V, 14);
  const float tau = 0.8f;
  struct Out {
    std::vector<float> p, l, lp, ent, lse, dl;
  };
  auto run = [&](ThreadPool* pool, int64_t r0, int64_t b) {
    Context ctx{pool};
    Out o;
    o.p.resize(sz(b * V));
    o.l.resize(sz(b * V));
    o.dl.resize(sz(b * V));
    o.lp.resize(sz(b));
    o.ent.resize(sz(b));
    o.lse.resize(sz(b));
    Tensor x = Tensor(lg.data(), DType::F32, {N, V}).slice_rows(r0, r0 + b);
    Tensor yt(y.data() + r0, DType::I32, {b});
    softmax_forward(ctx, Tensor(o.p.data(), DType::F32, {b, V}), x, tau);
    log_softmax_forward(ctx, Tensor(o.l.data(), DType::F32, {b, V}), x, tau);
    token_logprob_forward(ctx, Tensor(o.lp.data(), DType::F32, {b}), Tensor(o.ent.data(), DType::F32, {b}),
                          Tensor(o.lse.data(), DType::F32, {b}), x, yt, tau);
    token_logprob_backward(ctx, Tensor(o.dl.data(), DType::F32, {b, V}),
                           Tensor(gl.data() + r0, DType::F32, {b}), Tensor(ge.data() + r0, DType::F32, {b}),
                           x, yt, tau);
    return o;
  };
  std::vector<Out> alone;
  for (int64_t r = 0; r < N; ++r) alone.push_back(run(nullptr, r, 1));
  ThreadPool p1(1), p2(2);
  for (ThreadPool* p : {&p1, &p2}) {
    for (int64_t b = 1; b <= N; ++b) {
      const int64_t r0 = (b * 3) % (N - b + 1);
      Out o = run(p, r0, b);
      for (int64_t i = 0; i < b; ++i) {
        const Out& a = alone[sz(r0 + i)];
        expect_bits_equal(o.p.data() + i * V, a.p.data(), V, "probs");
        expect_bits_equal(o.l.data() + i * V, a.l.data(), V, "logp");
        expect_bits_equal(o.dl.data() + i * V, a.dl.data(), V, "dlogits");
        expect_bits_equal(o.lp.data() + i, a.lp.data(), 1, "token logp");
        expect_bits_equal(o.ent.data() + i, a.ent.data(), 1, "entropy");
        expect_bits_equal(o.lse.data() + i, a.lse.data(), 1, "lse");
      }
    }
  }
}

// The column-block backward (the trainer's chunked LM head): every column
// block of every width, from the full rows' stats, gives the full-row
// kernel's dlogits bit for bit, with and without the entropy gradient, with
// a temperature, masked (-inf) logits, in place, on 1 and 2 threads; the
// stats' (m, s, ls) give back the forward's lse, their H its entropy.
TEST(Softmax, ColumnBlocksOfTheBackwardHaveTheFullRowsBits) {
  const int64_t T = 40, V = 211;
  auto lg = test::randn(T * V, 21, 5.0f), gl = test::randn(T, 22), ge = test::randn(T, 23);
  for (int64_t i = 0; i < T * V; i += 17) lg[sz(i)] = -std::numeric_limits<float>::infinity();
  auto y = random_targets(T, V, 24);
  const Tensor x(lg.data(), DType::F32, {T, V}), yt(y.data(), DType::I32, {T});
  const float tau = 0.7f;
  ThreadPool p2(2);
  for (bool entropy : {false, true}) {
    for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &p2}) {
      const Context ctx{pool};
      const Tensor dent = entropy ? Tensor(ge.data(), DType::F32, {T}) : Tensor();
      std::vector<float> full(sz(T * V)), stats(sz(T * 4)), lp(sz(T)), ent(sz(T)), lse(sz(T));
      token_logprob_backward(ctx, Tensor(full.data(), DType::F32, {T, V}), Tensor(gl.data(), DType::F32, {T}),
                             dent, x, yt, tau);
      token_logprob_stats(ctx, Tensor(stats.data(), DType::F32, {T, 4}), x, tau, entropy);
      token_logprob_forward(ctx, Tensor(lp.data(), DType::F32, {T}), Tensor(ent.data(), DType::F32, {T}),
                            Tensor(lse.data(), DType::F32, {T}), x, yt, tau);
      for (int64_t t = 0; t < T; ++t) {
        const float* st = stats.data() + t * 4;
        ASSERT_EQ(st[0] + st[2], lse[sz(t)]) << "row " << t;
        ASSERT_EQ(st[3], entropy ? ent[sz(t)] : 0.0f) << "row " << t;
      }
      for (int64_t w : {int64_t(1), int64_t(5), int64_t(16), int64_t(100), V}) {
        std::vector<float> cols(sz(T * V));
        for (int64_t v0 = 0; v0 < V; v0 += w) {
          const int64_t v1 = std::min(V, v0 + w);
          // In place: the block's logits copied into the output, then overwritten.
          std::vector<float> blk(sz(T * (v1 - v0)));
          for (int64_t t = 0; t < T; ++t)
            for (int64_t j = v0; j < v1; ++j) blk[sz(t * (v1 - v0) + j - v0)] = lg[sz(t * V + j)];
          const Tensor b(blk.data(), DType::F32, {T, v1 - v0});
          token_logprob_backward_cols(ctx, b, Tensor(gl.data(), DType::F32, {T}), dent, b, yt,
                                      Tensor(stats.data(), DType::F32, {T, 4}), v0, tau);
          for (int64_t t = 0; t < T; ++t)
            for (int64_t j = v0; j < v1; ++j) cols[sz(t * V + j)] = blk[sz(t * (v1 - v0) + j - v0)];
        }
        expect_bits_equal(cols.data(), full.data(), T * V,
                          ("column blocks of " + std::to_string(w) + (entropy ? ", entropy" : "")).c_str());
      }
    }
  }
}

TEST(Softmax, OptionalOutputsDoNotChangeTheLogprob) {
  Context ctx;
  const int64_t T = 6, V = 333;
  auto lg = test::randn(T * V, 15, 3.0f);
  auto y = random_targets(T, V, 16);
  Tensor x(lg.data(), DType::F32, {T, V}), yt(y.data(), DType::I32, {T});
  std::vector<float> a(sz(T)), b(sz(T)), ent(sz(T)), lse(sz(T));
  token_logprob_forward(ctx, Tensor(a.data(), DType::F32, {T}), Tensor(), Tensor(), x, yt, 1.0f);
  token_logprob_forward(ctx, Tensor(b.data(), DType::F32, {T}), Tensor(ent.data(), DType::F32, {T}),
                        Tensor(lse.data(), DType::F32, {T}), x, yt, 1.0f);
  expect_bits_equal(a.data(), b.data(), T, "logp with and without entropy");
}

TEST(Softmax, BadInputsAreErrors) {
  Context ctx;
  std::vector<float> buf(1000);
  std::vector<int32_t> y = {0, 1, 2, 3};
  Tensor x(buf.data(), DType::F32, {4, 8}), yt(y.data(), DType::I32, {4}),
      lp(buf.data() + 100, DType::F32, {4});
  std::string msg = error_of([&] { softmax_forward(ctx, Tensor(buf.data(), DType::F32, {4, 9}), x, 1.0f); });
  EXPECT_NE(msg.find("(4, 9)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(4, 8)"), std::string::npos) << msg;
  msg = error_of([&] { log_softmax_forward(ctx, Tensor(buf.data(), DType::F32, {3, 8}), x, 1.0f); });
  EXPECT_NE(msg.find("(3, 8)"), std::string::npos) << msg;
  msg = error_of([&] {
    token_logprob_forward(ctx, Tensor(buf.data(), DType::F32, {5}), Tensor(), Tensor(), x, yt, 1.0f);
  });
  EXPECT_NE(msg.find("(5,)"), std::string::npos) << msg;
  msg = error_of([&] {
    token_logprob_forward(ctx, lp, Tensor(), Tensor(), x, Tensor(y.data(), DType::I32, {3}), 1.0f);
  });
  EXPECT_NE(msg.find("(3,)"), std::string::npos) << msg;
  msg = error_of([&] {
    token_logprob_backward(ctx, Tensor(buf.data(), DType::F32, {4, 7}), lp, Tensor(), x, yt, 1.0f);
  });
  EXPECT_NE(msg.find("(4, 7)"), std::string::npos) << msg;
  y[2] = 8;
  msg = error_of([&] { token_logprob_forward(ctx, lp, Tensor(), Tensor(), x, yt, 1.0f); });
  EXPECT_NE(msg.find("target id 8 in row 2"), std::string::npos) << msg;
  msg = error_of([&] { token_logprob_backward(ctx, x, lp, Tensor(), x, yt, 1.0f); });
  EXPECT_NE(msg.find("target id 8 in row 2"), std::string::npos) << msg;
  y[2] = 2;
  for (float bad :
       {0.0f, -1.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    msg = error_of([&] { softmax_forward(ctx, x, x, bad); });
    EXPECT_NE(msg.find("temperature"), std::string::npos) << msg;
  }
  msg = error_of([&] { softmax_forward(ctx, x, Tensor(buf.data(), DType::F32, {4, 0}), 1.0f); });
  EXPECT_NE(msg.find("V >= 1"), std::string::npos) << msg;
}

}  // namespace
}  // namespace lockstep::kernels
