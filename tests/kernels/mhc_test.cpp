// Tests for the mHC kernels: double references for the mixing values, the
// pre-mix, the post-mix (transposed comb) and the head mix; central
// differences on the double references for every backward, alone and chained;
// bit-exact batch and thread invariance; shape errors naming the argument.
#include "lockstep/kernels/cpu/mhc.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/test_util.h"

namespace lockstep::kernels {
namespace {

using test::expect_bits_equal;
using test::expect_close;
using test::Guarded;
using vd = std::vector<double>;
using vf = std::vector<float>;

size_t sz(int64_t n) {
  return static_cast<size_t>(n);
}

vd to_double(const vf& v) {
  return vd(v.begin(), v.end());
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

Tensor view(vf& v, std::initializer_list<int64_t> shape) {
  return Tensor(v.data(), DType::F32, shape);
}

// ---- problems -------------------------------------------------------------------

struct Case {
  int n;
  int64_t D;
  int iters;
};

std::vector<Case> all_cases() {
  std::vector<Case> cs;
  for (int n : {1, 2, 4})
    for (int64_t D : {1, 16, 33})
      for (int iters : {1, 3, 20}) cs.push_back({n, D, iters});
  return cs;
}

std::string case_name(const Case& c) {
  return "n=" + std::to_string(c.n) + " D=" + std::to_string(c.D) + " iters=" + std::to_string(c.iters);
}

// Inputs of one site (K = M mixing values, 3 scales) or of the head (K = n, 1 scale).
struct Problem {
  Case c;
  int64_t T, K, W;  // W = n*D
  vf x, fn, base, scale;
  MhcConfig cfg;
};

Problem make_problem(const Case& c, int64_t T, bool head, uint32_t seed) {
  Problem p;
  p.c = c;
  p.T = T;
  p.K = head ? c.n : 2 * c.n + c.n * c.n;
  p.W = c.n * c.D;
  p.x = test::randn(T * p.W, seed, 1.0f);
  // r * x̂ has unit RMS, so this makes m about N(0, 1.5²): the sigmoids and
  // the Sinkhorn see logits of order one.
  p.fn = test::randn(p.K * p.W, seed + 1, 1.5f / std::sqrt(static_cast<float>(p.W)));
  p.base = test::randn(p.K, seed + 2, 0.5f);
  p.scale = test::uniform(head ? 1 : 3, seed + 3, 0.5f, 1.5f);
  p.cfg.n = c.n;
  p.cfg.sinkhorn_iters = c.iters;
  return p;
}

// ---- double references ------------------------------------------------------------

// m (n*n) holds L on entry, the Sinkhorn result on exit.
void ref_sinkhorn(double* m, int n, int iters, double eps) {
  for (int a = 0; a < n; ++a) {
    double mx = m[a * n];
    for (int c = 1; c < n; ++c) mx = std::max(mx, m[a * n + c]);
    double s = 0;
    for (int c = 0; c < n; ++c) s += std::exp(m[a * n + c] - mx);
    for (int c = 0; c < n; ++c) m[a * n + c] = std::exp(m[a * n + c] - mx) / s + eps;
  }
  auto columns = [&] {
    for (int c = 0; c < n; ++c) {
      double s = 0;
      for (int a = 0; a < n; ++a) s += m[a * n + c];
      for (int a = 0; a < n; ++a) m[a * n + c] /= s + eps;
    }
  };
  auto rows = [&] {
    for (int a = 0; a < n; ++a) {
      double s = 0;
      for (int c = 0; c < n; ++c) s += m[a * n + c];
      for (int c = 0; c < n; ++c) m[a * n + c] /= s + eps;
    }
  };
  columns();
  for (int i = 1; i < iters; ++i) {
    rows();
    columns();
  }
}

struct RefMix {
  vd raw, rstd, pre, post, comb;
};

// raw and rstd of every token: m = r * (fn · x̂), r over the n*D values.
void ref_raw(const vd& x, const vd& fn, int64_t T, int64_t K, int64_t W, double norm_eps, vd* raw, vd* rstd) {
  raw->assign(sz(T * K), 0.0);
  rstd->assign(sz(T), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    const double* xr = x.data() + t * W;
    double ss = 0;
    for (int64_t j = 0; j < W; ++j) ss += xr[j] * xr[j];
    const double r = 1.0 / std::sqrt(ss / double(W) + norm_eps);
    (*rstd)[sz(t)] = r;
    for (int64_t k = 0; k < K; ++k) {
      double p = 0;
      for (int64_t j = 0; j < W; ++j) p += fn[sz(k * W + j)] * xr[j];
      (*raw)[sz(t * K + k)] = r * p;
    }
  }
}

double sigmoid(double v) {
  return 1.0 / (1.0 + std::exp(-v));
}

RefMix ref_mix(const vd& x, const vd& fn, const vd& base, const vd& scale, const Problem& p) {
  const int n = p.c.n;
  const double eps = p.cfg.eps;
  RefMix r;
  ref_raw(x, fn, p.T, p.K, p.W, p.cfg.norm_eps, &r.raw, &r.rstd);
  r.pre.assign(sz(p.T * n), 0.0);
  r.post.assign(sz(p.T * n), 0.0);
  r.comb.assign(sz(p.T * n * n), 0.0);
  for (int64_t t = 0; t < p.T; ++t) {
    const double* m = r.raw.data() + t * p.K;
    for (int i = 0; i < n; ++i) {
      r.pre[sz(t * n + i)] = sigmoid(scale[0] * m[i] + base[sz(i)]) + eps;
      r.post[sz(t * n + i)] = 2.0 * sigmoid(scale[1] * m[n + i] + base[sz(n + i)]);
    }
    double* cm = r.comb.data() + t * n * n;
    for (int k = 0; k < n * n; ++k) cm[k] = scale[2] * m[2 * n + k] + base[sz(2 * n + k)];
    ref_sinkhorn(cm, n, p.c.iters, eps);
  }
  return r;
}

// u = sum_i w_i X_i per token.
vd ref_weighted(const vd& x, const vd& w, int64_t T, int n, int64_t D) {
  vd u(sz(T * D), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int i = 0; i < n; ++i)
      for (int64_t d = 0; d < D; ++d) u[sz(t * D + d)] += w[sz(t * n + i)] * x[sz((t * n + i) * D + d)];
  return u;
}

// y_c = post_c f + sum_a comb[a][c] X_a.
vd ref_post(const vd& f, const vd& x, const vd& post, const vd& comb, int64_t T, int n, int64_t D) {
  vd y(sz(T * n * D), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int c = 0; c < n; ++c)
      for (int64_t d = 0; d < D; ++d) {
        double acc = post[sz(t * n + c)] * f[sz(t * D + d)];
        for (int a = 0; a < n; ++a) acc += comb[sz(t * n * n + a * n + c)] * x[sz((t * n + a) * D + d)];
        y[sz((t * n + c) * D + d)] = acc;
      }
  return y;
}

struct RefHead {
  vd h, w, raw, rstd;
};

RefHead ref_head(const vd& x, const vd& fn, const vd& base, const vd& scale, const Problem& p) {
  const int n = p.c.n;
  RefHead r;
  ref_raw(x, fn, p.T, n, p.W, p.cfg.norm_eps, &r.raw, &r.rstd);
  r.w.assign(sz(p.T * n), 0.0);
  for (int64_t t = 0; t < p.T; ++t)
    for (int i = 0; i < n; ++i)
      r.w[sz(t * n + i)] = sigmoid(scale[0] * r.raw[sz(t * n + i)] + base[sz(i)]) + double(p.cfg.eps);
  r.h = ref_weighted(x, r.w, p.T, n, p.c.D);
  return r;
}

double dot(const vd& a, const vd& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Central differences of loss() with respect to every element of v.
vd fd_grad(vd& v, const std::function<double()>& loss) {
  constexpr double kStep = 1e-5;  // truncation ~1e-10, rounding ~1e-11 for O(1) losses
  vd g(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const double keep = v[i];
    v[i] = keep + kStep;
    const double lp = loss();
    v[i] = keep - kStep;
    const double lm = loss();
    v[i] = keep;
    g[i] = (lp - lm) / (2 * kStep);
  }
  return g;
}

// want = prefill + gradient (the kernels accumulate into their gradients).
vd plus(const vf& prefill, const vd& g) {
  vd out(g.size());
  for (size_t i = 0; i < g.size(); ++i) out[i] = double(prefill[i]) + g[i];
  return out;
}

// ---- running the kernels ---------------------------------------------------------

struct MixOut {
  vf raw, rstd, pre, post, comb;
  MixOut(int64_t T, int n)
      : raw(sz(T * (2 * n + n * n)), -7.0f),
        rstd(sz(T), -7.0f),
        pre(sz(T * n), -7.0f),
        post(sz(T * n), -7.0f),
        comb(sz(T * n * n), -7.0f) {}
  MhcMix view(int64_t T, int n) {
    const int64_t M = 2 * n + n * n;
    return MhcMix{Tensor(raw.data(), DType::F32, {T, M}), Tensor(rstd.data(), DType::F32, {T}),
                  Tensor(pre.data(), DType::F32, {T, n}), Tensor(post.data(), DType::F32, {T, n}),
                  Tensor(comb.data(), DType::F32, {T, n, n})};
  }
};

MixOut run_mix(const Context& ctx, Problem& p) {
  MixOut out(p.T, p.c.n);
  mhc_mix_forward(ctx, out.view(p.T, p.c.n), view(p.x, {p.T, p.W}), view(p.fn, {p.K, p.W}),
                  view(p.base, {p.K}), view(p.scale, {3}), p.cfg);
  return out;
}

// Gradients of the site parameters and x, prefilled with small values.
struct MixGrads {
  vf dx, dfn, dbase, dscale;
  MixGrads(const Problem& p, uint32_t seed)
      : dx(test::randn(p.T * p.W, seed, 0.1f)),
        dfn(test::randn(p.K * p.W, seed + 1, 0.1f)),
        dbase(test::randn(p.K, seed + 2, 0.1f)),
        dscale(test::randn(int64_t(p.scale.size()), seed + 3, 0.1f)) {}
};

void run_mix_backward(const Context& ctx, Problem& p, MixOut& out, MixGrads& g, vf* dpre, vf* dpost,
                      vf* dcomb) {
  const int64_t n = p.c.n;
  mhc_mix_backward(ctx, view(g.dx, {p.T, p.W}), view(g.dfn, {p.K, p.W}), view(g.dbase, {p.K}),
                   view(g.dscale, {3}), view(*dpre, {p.T, n}), dpost ? view(*dpost, {p.T, n}) : Tensor(),
                   dcomb ? view(*dcomb, {p.T, n, n}) : Tensor(), view(p.x, {p.T, p.W}), out.view(p.T, p.c.n),
                   view(p.fn, {p.K, p.W}), view(p.base, {p.K}), view(p.scale, {3}), p.cfg);
}

// ---- mixing values: forward ---------------------------------------------------------

TEST(Mhc, MixForwardMatchesDoubleReference) {
  ThreadPool pool(2);
  Context ctx{&pool};
  uint32_t seed = 100;
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(case_name(c));
    Problem p = make_problem(c, 3, false, seed += 10);
    MixOut out = run_mix(ctx, p);
    RefMix want = ref_mix(to_double(p.x), to_double(p.fn), to_double(p.base), to_double(p.scale), p);
    expect_close(out.raw, want.raw, 1e-5, "raw");
    expect_close(out.rstd, want.rstd, 1e-6, "rstd");
    expect_close(out.pre, want.pre, 1e-6, "pre");
    expect_close(out.post, want.post, 1e-6, "post");
    expect_close(out.comb, want.comb, 1e-5, "comb");
    // The last Sinkhorn step normalises columns: each sums to 1 up to eps.
    for (int64_t t = 0; t < p.T; ++t)
      for (int col = 0; col < c.n; ++col) {
        double s = 0;
        for (int a = 0; a < c.n; ++a) s += out.comb[sz(t * c.n * c.n + a * c.n + col)];
        EXPECT_NEAR(s, 1.0, 1e-5) << "token " << t << " column " << col;
      }
  }
}

TEST(Mhc, ZeroFnAndBaseGiveTheInitialMix) {
  Context ctx;
  for (int n : {1, 2, 4}) {
    for (int iters : {1, 20}) {
      Problem p = make_problem({n, 16, iters}, 2, false, 7);
      std::fill(p.fn.begin(), p.fn.end(), 0.0f);
      std::fill(p.base.begin(), p.base.end(), 0.0f);
      MixOut out = run_mix(ctx, p);
      for (float v : out.raw) EXPECT_EQ(v, 0.0f);
      for (float v : out.pre) EXPECT_FLOAT_EQ(v, 0.5f + p.cfg.eps);
      for (float v : out.post) EXPECT_FLOAT_EQ(v, 1.0f);
      for (float v : out.comb) EXPECT_NEAR(v, 1.0 / n, 1e-5);
    }
  }
}

// ---- mixing values: backward ----------------------------------------------------------

// loss = <gpre, pre> + <gpost, post> + <gcomb, comb> (gpost, gcomb may be absent).
void check_mix_backward(const Case& c, uint32_t seed, bool with_post, bool with_comb) {
  Context ctx;
  Problem p = make_problem(c, 2, false, seed);
  const int64_t n = c.n;
  vf gpre = test::randn(p.T * n, seed + 5), gpost = test::randn(p.T * n, seed + 6),
     gcomb = test::randn(p.T * n * n, seed + 7);
  MixOut out = run_mix(ctx, p);
  MixGrads g(p, seed + 8);
  const MixGrads g0 = g;
  run_mix_backward(ctx, p, out, g, &gpre, with_post ? &gpost : nullptr, with_comb ? &gcomb : nullptr);

  vd x = to_double(p.x), fn = to_double(p.fn), base = to_double(p.base), scale = to_double(p.scale);
  const vd up_pre = to_double(gpre), up_post = to_double(gpost), up_comb = to_double(gcomb);
  auto loss = [&] {
    RefMix r = ref_mix(x, fn, base, scale, p);
    double l = dot(up_pre, r.pre);
    if (with_post) l += dot(up_post, r.post);
    if (with_comb) l += dot(up_comb, r.comb);
    return l;
  };
  constexpr double kTol = 1e-5;
  expect_close(g.dx, plus(g0.dx, fd_grad(x, loss)), kTol, "dx");
  expect_close(g.dfn, plus(g0.dfn, fd_grad(fn, loss)), kTol, "dfn");
  expect_close(g.dbase, plus(g0.dbase, fd_grad(base, loss)), kTol, "dbase");
  expect_close(g.dscale, plus(g0.dscale, fd_grad(scale, loss)), kTol, "dscale");
}

TEST(Mhc, MixBackwardMatchesFiniteDifferences) {
  uint32_t seed = 300;
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(case_name(c));
    check_mix_backward(c, seed += 20, true, true);
  }
}

TEST(Mhc, MixBackwardTreatsEmptyGradientsAsZero) {
  uint32_t seed = 900;
  for (const Case& c : {Case{2, 16, 3}, Case{4, 33, 20}}) {
    SCOPED_TRACE(case_name(c));
    check_mix_backward(c, seed += 20, false, false);
    check_mix_backward(c, seed += 20, true, false);
    check_mix_backward(c, seed += 20, false, true);
  }
}

// ---- pre-mix ------------------------------------------------------------------------

TEST(Mhc, PreApplyMatchesReferenceAndFiniteDifferences) {
  ThreadPool pool(2);
  Context ctx{&pool};
  uint32_t seed = 1200;
  for (int n : {1, 2, 4}) {
    for (int64_t D : {1, 16, 33}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " D=" + std::to_string(D));
      const int64_t T = 3;
      vf x = test::randn(T * n * D, seed++), pre = test::uniform(T * n, seed++, 0.1f, 1.0f);
      Guarded u(T * D, -7.0f);
      mhc_pre_apply(ctx, u.tensor({T, D}), view(x, {T, n * D}), view(pre, {T, n}), n);
      u.check("u");
      vd xd = to_double(x), pd = to_double(pre);
      expect_close(u.values(), ref_weighted(xd, pd, T, n, D), 1e-6, "u");

      vf du = test::randn(T * D, seed++);
      vf dx = test::randn(T * n * D, seed++, 0.1f);
      const vf dx0 = dx;
      vf dpre(sz(T * n), -7.0f);
      mhc_pre_apply_backward(ctx, view(dx, {T, n * D}), view(dpre, {T, n}), view(du, {T, D}),
                             view(x, {T, n * D}), view(pre, {T, n}), n);
      const vd up = to_double(du);
      auto loss = [&] { return dot(up, ref_weighted(xd, pd, T, n, D)); };
      expect_close(dx, plus(dx0, fd_grad(xd, loss)), 1e-5, "dx");
      expect_close(dpre, fd_grad(pd, loss), 1e-5, "dpre");
    }
  }
}

// ---- post-mix -------------------------------------------------------------------------

TEST(Mhc, PostMatchesReferenceAndFiniteDifferences) {
  ThreadPool pool(2);
  Context ctx{&pool};
  uint32_t seed = 1500;
  for (int n : {1, 2, 4}) {
    for (int64_t D : {1, 16, 33}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " D=" + std::to_string(D));
      const int64_t T = 3, W = n * D;
      vf f = test::randn(T * D, seed++), x = test::randn(T * W, seed++);
      vf post = test::uniform(T * n, seed++, 0.0f, 2.0f), comb = test::uniform(T * n * n, seed++, 0.0f, 1.0f);
      Guarded y(T * W, -7.0f);
      mhc_post(ctx, y.tensor({T, W}), view(f, {T, D}), view(x, {T, W}), view(post, {T, n}),
               view(comb, {T, n, n}), n);
      y.check("y");
      vd fd = to_double(f), xd = to_double(x), pd = to_double(post), cd = to_double(comb);
      expect_close(y.values(), ref_post(fd, xd, pd, cd, T, n, D), 1e-6, "y");

      vf dy = test::randn(T * W, seed++);
      vf dx(sz(T * W), -7.0f), df(sz(T * D), -7.0f), dpost(sz(T * n), -7.0f), dcomb(sz(T * n * n), -7.0f);
      mhc_post_backward(ctx, view(dx, {T, W}), view(df, {T, D}), view(dpost, {T, n}), view(dcomb, {T, n, n}),
                        view(dy, {T, W}), view(f, {T, D}), view(x, {T, W}), view(post, {T, n}),
                        view(comb, {T, n, n}), n);
      const vd up = to_double(dy);
      auto loss = [&] { return dot(up, ref_post(fd, xd, pd, cd, T, n, D)); };
      expect_close(dx, fd_grad(xd, loss), 1e-5, "dx");
      expect_close(df, fd_grad(fd, loss), 1e-5, "df");
      expect_close(dpost, fd_grad(pd, loss), 1e-5, "dpost");
      expect_close(dcomb, fd_grad(cd, loss), 1e-5, "dcomb");

      // In place: dx written over dy gives the same bits.
      vf inplace = dy;
      vf df2(sz(T * D)), dpost2(sz(T * n)), dcomb2(sz(T * n * n));
      mhc_post_backward(ctx, view(inplace, {T, W}), view(df2, {T, D}), view(dpost2, {T, n}),
                        view(dcomb2, {T, n, n}), view(inplace, {T, W}), view(f, {T, D}), view(x, {T, W}),
                        view(post, {T, n}), view(comb, {T, n, n}), n);
      expect_bits_equal(inplace.data(), dx.data(), T * W, "dx in place");
      expect_bits_equal(dcomb2.data(), dcomb.data(), T * n * n, "dcomb in place");
    }
  }
}

// comb[a][c] is source a -> destination c: y_c = post_c f + sum_a comb[a][c] X_a.
TEST(Mhc, PostUsesTheTransposedComb) {
  Context ctx;
  const int n = 3;
  const int64_t D = 2;
  vf f = {10.0f, 20.0f};
  vf x = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};  // X_0 = (1, 2), X_1 = (3, 4), X_2 = (5, 6)
  vf post = {0.0f, 0.0f, 1.0f};
  vf comb(9, 0.0f);
  comb[0 * n + 1] = 1.0f;  // X_0 -> stream 1
  comb[2 * n + 0] = 2.0f;  // X_2 -> stream 0, twice
  comb[1 * n + 1] = 0.5f;  // X_1 -> stream 1, half
  vf y(sz(n * D), -7.0f);
  mhc_post(ctx, view(y, {1, n * D}), view(f, {1, D}), view(x, {1, n * D}), view(post, {1, n}),
           view(comb, {1, n, n}), n);
  const vf want = {10.0f, 12.0f, 2.5f, 4.0f, 10.0f, 20.0f};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(y[i], want[i]) << "element " << i;

  // And the gradient flows the same way back: dX_a = sum_c comb[a][c] dY_c.
  vf dy = {1.0f, 0.0f, 0.0f, 1.0f, 0.0f, 0.0f};  // dY_0 = (1, 0), dY_1 = (0, 1)
  vf dx(sz(n * D)), df(sz(D)), dpost(sz(n)), dcomb(sz(n * n));
  mhc_post_backward(ctx, view(dx, {1, n * D}), view(df, {1, D}), view(dpost, {1, n}), view(dcomb, {1, n, n}),
                    view(dy, {1, n * D}), view(f, {1, D}), view(x, {1, n * D}), view(post, {1, n}),
                    view(comb, {1, n, n}), n);
  const vf want_dx = {0.0f, 1.0f, 0.0f, 0.5f, 2.0f, 0.0f};
  for (size_t i = 0; i < want_dx.size(); ++i) EXPECT_EQ(dx[i], want_dx[i]) << "dx element " << i;
  EXPECT_EQ(dcomb[2 * n + 0], 5.0f);  // <dY_0, X_2>
  EXPECT_EQ(dcomb[0 * n + 1], 2.0f);  // <dY_1, X_0>
  EXPECT_EQ(dcomb[1 * n + 0], 3.0f);  // <dY_0, X_1>
}

// ---- the chain: mix -> pre_apply, mix -> post ---------------------------------------------

TEST(Mhc, ChainedMixPreAndPostMatchFiniteDifferences) {
  uint32_t seed = 2000;
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(case_name(c));
    Context ctx;
    Problem p = make_problem(c, 2, false, seed += 20);
    const int n = c.n;
    const int64_t D = c.D, T = p.T, W = p.W;
    vf f = test::randn(T * D, seed + 9), gu = test::randn(T * D, seed + 10),
       gy = test::randn(T * W, seed + 11);

    MixOut out = run_mix(ctx, p);
    vf u(sz(T * D)), y(sz(T * W));
    mhc_pre_apply(ctx, view(u, {T, D}), view(p.x, {T, W}), view(out.pre, {T, n}), n);
    mhc_post(ctx, view(y, {T, W}), view(f, {T, D}), view(p.x, {T, W}), view(out.post, {T, n}),
             view(out.comb, {T, n, n}), n);

    MixGrads g(p, seed + 12);
    const MixGrads g0 = g;
    vf df(sz(T * D)), dpost(sz(T * n)), dcomb(sz(T * n * n)), dpre(sz(T * n));
    // The post backward writes dx; the pre-mix and the mixing values add to it.
    vf dx_post(sz(T * W));
    mhc_post_backward(ctx, view(dx_post, {T, W}), view(df, {T, D}), view(dpost, {T, n}),
                      view(dcomb, {T, n, n}), view(gy, {T, W}), view(f, {T, D}), view(p.x, {T, W}),
                      view(out.post, {T, n}), view(out.comb, {T, n, n}), n);
    for (size_t i = 0; i < g.dx.size(); ++i) g.dx[i] = g.dx[i] + dx_post[i];
    mhc_pre_apply_backward(ctx, view(g.dx, {T, W}), view(dpre, {T, n}), view(gu, {T, D}), view(p.x, {T, W}),
                           view(out.pre, {T, n}), n);
    run_mix_backward(ctx, p, out, g, &dpre, &dpost, &dcomb);

    vd x = to_double(p.x), fn = to_double(p.fn), base = to_double(p.base), scale = to_double(p.scale),
       fd = to_double(f);
    const vd up_u = to_double(gu), up_y = to_double(gy);
    auto loss = [&] {
      RefMix r = ref_mix(x, fn, base, scale, p);
      return dot(up_u, ref_weighted(x, r.pre, T, n, D)) + dot(up_y, ref_post(fd, x, r.post, r.comb, T, n, D));
    };
    constexpr double kTol = 1e-5;
    vd want_dx = fd_grad(x, loss);
    for (size_t i = 0; i < want_dx.size(); ++i) want_dx[i] += double(g0.dx[i]);
    expect_close(g.dx, want_dx, kTol, "dx");
    expect_close(g.dfn, plus(g0.dfn, fd_grad(fn, loss)), kTol, "dfn");
    expect_close(g.dbase, plus(g0.dbase, fd_grad(base, loss)), kTol, "dbase");
    expect_close(g.dscale, plus(g0.dscale, fd_grad(scale, loss)), kTol, "dscale");
    expect_close(df, fd_grad(fd, loss), kTol, "df");
  }
}

// ---- head mix ------------------------------------------------------------------------

struct HeadOut {
  vf h, w, raw, rstd;
  HeadOut(int64_t T, int n, int64_t D)
      : h(sz(T * D), -7.0f), w(sz(T * n), -7.0f), raw(sz(T * n), -7.0f), rstd(sz(T), -7.0f) {}
};

HeadOut run_head(const Context& ctx, Problem& p) {
  const int n = p.c.n;
  HeadOut o(p.T, n, p.c.D);
  mhc_head_forward(ctx, view(o.h, {p.T, p.c.D}), view(o.w, {p.T, n}), view(o.raw, {p.T, n}),
                   view(o.rstd, {p.T}), view(p.x, {p.T, p.W}), view(p.fn, {p.K, p.W}), view(p.base, {p.K}),
                   view(p.scale, {1}), p.cfg);
  return o;
}

void run_head_backward(const Context& ctx, Problem& p, HeadOut& o, MixGrads& g, vf& dh) {
  const int n = p.c.n;
  mhc_head_backward(ctx, view(g.dx, {p.T, p.W}), view(g.dfn, {p.K, p.W}), view(g.dbase, {p.K}),
                    view(g.dscale, {1}), view(dh, {p.T, p.c.D}), view(p.x, {p.T, p.W}), view(o.w, {p.T, n}),
                    view(o.raw, {p.T, n}), view(o.rstd, {p.T}), view(p.fn, {p.K, p.W}), view(p.base, {p.K}),
                    view(p.scale, {1}), p.cfg);
}

TEST(Mhc, HeadMatchesReferenceAndFiniteDifferences) {
  ThreadPool pool(2);
  Context ctx{&pool};
  uint32_t seed = 2600;
  for (int n : {1, 2, 4}) {
    for (int64_t D : {1, 16, 33}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " D=" + std::to_string(D));
      Problem p = make_problem({n, D, 1}, 3, true, seed += 10);
      HeadOut o = run_head(ctx, p);
      vd x = to_double(p.x), fn = to_double(p.fn), base = to_double(p.base), scale = to_double(p.scale);
      RefHead want = ref_head(x, fn, base, scale, p);
      expect_close(o.h, want.h, 1e-5, "h");
      expect_close(o.w, want.w, 1e-6, "w");
      expect_close(o.raw, want.raw, 1e-5, "raw");
      expect_close(o.rstd, want.rstd, 1e-6, "rstd");

      vf dh = test::randn(p.T * D, seed + 5);
      MixGrads g(p, seed + 6);
      const MixGrads g0 = g;
      run_head_backward(ctx, p, o, g, dh);
      const vd up = to_double(dh);
      auto loss = [&] { return dot(up, ref_head(x, fn, base, scale, p).h); };
      constexpr double kTol = 1e-5;
      expect_close(g.dx, plus(g0.dx, fd_grad(x, loss)), kTol, "dx");
      expect_close(g.dfn, plus(g0.dfn, fd_grad(fn, loss)), kTol, "dfn");
      expect_close(g.dbase, plus(g0.dbase, fd_grad(base, loss)), kTol, "dbase");
      expect_close(g.dscale, plus(g0.dscale, fd_grad(scale, loss)), kTol, "dscale");
    }
  }
}

// ---- batch and thread invariance --------------------------------------------------------

// Everything one token gets from every kernel, forward and backward.
struct TokenRun {
  explicit TokenRun(MixOut m) : mix(std::move(m)) {}
  MixOut mix;
  vf u, y, h, hw, dx_mix, dx_post, df, dpost, dcomb, dx_pre, dpre, dx_head;
  vf dfn, dbase, dscale, dfn_head, dbase_head, dscale_head;
};

// Runs every kernel on tokens [t0, t1) of the problem (x, f and the upstream
// gradients are sliced the same way).
TokenRun run_all(const Context& ctx, Problem& full, Problem& head_full, const vf& f_all, const vf& g_all,
                 const vf& gy_all, int64_t t0, int64_t t1) {
  const int n = full.c.n;
  const int64_t D = full.c.D, W = full.W, T = t1 - t0;
  auto rows = [&](const vf& v, int64_t width) { return vf(v.begin() + t0 * width, v.begin() + t1 * width); };
  Problem p = full, ph = head_full;
  p.T = ph.T = T;
  p.x = ph.x = rows(full.x, W);
  vf f = rows(f_all, D), gu = rows(g_all, D), gy = rows(gy_all, W);
  TokenRun r(run_mix(ctx, p));
  r.u.assign(sz(T * D), 0.0f);
  r.y.assign(sz(T * W), 0.0f);
  mhc_pre_apply(ctx, view(r.u, {T, D}), view(p.x, {T, W}), view(r.mix.pre, {T, n}), n);
  mhc_post(ctx, view(r.y, {T, W}), view(f, {T, D}), view(p.x, {T, W}), view(r.mix.post, {T, n}),
           view(r.mix.comb, {T, n, n}), n);
  HeadOut ho = run_head(ctx, ph);
  r.h = ho.h;
  r.hw = ho.w;

  r.dx_post.assign(sz(T * W), 0.0f);
  r.df.assign(sz(T * D), 0.0f);
  r.dpost.assign(sz(T * n), 0.0f);
  r.dcomb.assign(sz(T * n * n), 0.0f);
  mhc_post_backward(ctx, view(r.dx_post, {T, W}), view(r.df, {T, D}), view(r.dpost, {T, n}),
                    view(r.dcomb, {T, n, n}), view(gy, {T, W}), view(f, {T, D}), view(p.x, {T, W}),
                    view(r.mix.post, {T, n}), view(r.mix.comb, {T, n, n}), n);
  r.dx_pre.assign(sz(T * W), 0.0f);
  r.dpre.assign(sz(T * n), 0.0f);
  mhc_pre_apply_backward(ctx, view(r.dx_pre, {T, W}), view(r.dpre, {T, n}), view(gu, {T, D}),
                         view(p.x, {T, W}), view(r.mix.pre, {T, n}), n);
  MixGrads g(p, 5);
  g.dx = r.dx_pre;
  run_mix_backward(ctx, p, r.mix, g, &r.dpre, &r.dpost, &r.dcomb);
  r.dx_mix = g.dx;
  r.dfn = g.dfn;
  r.dbase = g.dbase;
  r.dscale = g.dscale;
  MixGrads gh(ph, 6);
  std::fill(gh.dx.begin(), gh.dx.end(), 0.0f);  // a prefill would differ between the runs' row counts
  run_head_backward(ctx, ph, ho, gh, gu);
  r.dx_head = gh.dx;
  r.dfn_head = gh.dfn;
  r.dbase_head = gh.dbase;
  r.dscale_head = gh.dscale;
  return r;
}

// The per-token outputs of token `t` (within the run) of a and all of b agree bit for bit.
void expect_token_bits(const TokenRun& a, int64_t t, const TokenRun& b, const Problem& p) {
  const int64_t n = p.c.n, D = p.c.D, W = p.W, M = 2 * n + n * n;
  auto same = [&](const vf& va, const vf& vb, int64_t width, const char* what) {
    expect_bits_equal(va.data() + t * width, vb.data(), width, what);
  };
  same(a.mix.raw, b.mix.raw, M, "raw");
  same(a.mix.rstd, b.mix.rstd, 1, "rstd");
  same(a.mix.pre, b.mix.pre, n, "pre");
  same(a.mix.post, b.mix.post, n, "post");
  same(a.mix.comb, b.mix.comb, n * n, "comb");
  same(a.u, b.u, D, "u");
  same(a.y, b.y, W, "y");
  same(a.h, b.h, D, "h");
  same(a.hw, b.hw, n, "head w");
  same(a.dx_post, b.dx_post, W, "dx post");
  same(a.df, b.df, D, "df");
  same(a.dpost, b.dpost, n, "dpost");
  same(a.dcomb, b.dcomb, n * n, "dcomb");
  same(a.dx_pre, b.dx_pre, W, "dx pre");
  same(a.dpre, b.dpre, n, "dpre");
  same(a.dx_mix, b.dx_mix, W, "dx mix");
  same(a.dx_head, b.dx_head, W, "dx head");
}

TEST(Mhc, TokenAloneEqualsTokenInABatchOnOneAndTwoThreads) {
  const Case c{4, 33, 20};
  const int64_t T = 7, tok = 3;
  Problem p = make_problem(c, T, false, 3000);
  Problem ph = make_problem(c, T, true, 3000);
  ph.x = p.x;
  vf f = test::randn(T * c.D, 3100), gu = test::randn(T * c.D, 3101), gy = test::randn(T * p.W, 3102);
  ThreadPool p1(1), p2(2);
  Context c1{&p1}, c2{&p2};
  const TokenRun alone = run_all(c1, p, ph, f, gu, gy, tok, tok + 1);
  const TokenRun batch1 = run_all(c1, p, ph, f, gu, gy, 0, T);
  const TokenRun batch2 = run_all(c2, p, ph, f, gu, gy, 0, T);
  expect_token_bits(batch1, tok, alone, p);
  for (int64_t t = 0; t < T; ++t) {
    SCOPED_TRACE("token " + std::to_string(t));
    TokenRun one = run_all(c2, p, ph, f, gu, gy, t, t + 1);
    expect_token_bits(batch2, t, one, p);
  }
}

// Large enough that the GEMMs split over threads too.
TEST(Mhc, OneAndTwoThreadsGiveTheSameBits) {
  const Case c{4, 512, 20};
  const int64_t T = 130;
  Problem p = make_problem(c, T, false, 3500);
  Problem ph = make_problem(c, T, true, 3600);
  ph.x = p.x;
  vf f = test::randn(T * c.D, 3700), gu = test::randn(T * c.D, 3701), gy = test::randn(T * p.W, 3702);
  ThreadPool p1(1), p2(2);
  Context c1{&p1}, c2{&p2};
  const TokenRun a = run_all(c1, p, ph, f, gu, gy, 0, T);
  const TokenRun b = run_all(c2, p, ph, f, gu, gy, 0, T);
  auto same = [](const vf& va, const vf& vb, const char* what) {
    ASSERT_EQ(va.size(), vb.size()) << what;
    expect_bits_equal(va.data(), vb.data(), int64_t(va.size()), what);
  };
  same(a.mix.raw, b.mix.raw, "raw");
  same(a.mix.comb, b.mix.comb, "comb");
  same(a.y, b.y, "y");
  same(a.h, b.h, "h");
  same(a.dx_mix, b.dx_mix, "dx mix");
  same(a.dx_head, b.dx_head, "dx head");
  same(a.dfn, b.dfn, "dfn");
  same(a.dbase, b.dbase, "dbase");
  same(a.dscale, b.dscale, "dscale");
  same(a.dfn_head, b.dfn_head, "dfn head");
  same(a.dbase_head, b.dbase_head, "dbase head");
  same(a.dscale_head, b.dscale_head, "dscale head");
}

// ---- bad arguments -----------------------------------------------------------------------

TEST(Mhc, BadShapesNameTheArgument) {
  Context ctx;
  const int n = 2;
  const int64_t T = 3, D = 4, W = n * D, M = 2 * n + n * n;
  Problem p = make_problem({n, D, 3}, T, false, 4000);
  MixOut out(T, n);
  vf big(4096, 0.0f);
  auto t = [&](std::initializer_list<int64_t> shape) { return view(big, shape); };
  const Tensor x = view(p.x, {T, W}), fn = view(p.fn, {M, W}), base = view(p.base, {M}),
               scale = view(p.scale, {3});
  const MhcMix mv = out.view(T, n);
  auto expect_names = [](const std::function<void()>& fn_call, const std::string& needle) {
    const std::string e = error_of(fn_call);
    EXPECT_NE(e.find(needle), std::string::npos) << "message: '" << e << "' should name " << needle;
  };

  expect_names(
      [&] {
        mhc_mix_forward(ctx, mv, x, t({M, W + 1}), base, scale, p.cfg);
      },
      "mhc_mix_forward: fn");
  expect_names([&] { mhc_mix_forward(ctx, mv, x, fn, t({M + 1}), scale, p.cfg); }, "mhc_mix_forward: base");
  expect_names([&] { mhc_mix_forward(ctx, mv, x, fn, base, t({1}), p.cfg); }, "mhc_mix_forward: scale");
  expect_names(
      [&] {
        mhc_mix_forward(ctx, mv, t({T, W + 1}), fn, base, scale, p.cfg);
      },
      "mhc_mix_forward: x");
  MhcMix bad = mv;
  bad.comb = t({T, n * n});
  expect_names([&] { mhc_mix_forward(ctx, bad, x, fn, base, scale, p.cfg); }, "out.comb");
  bad = mv;
  bad.rstd = t({T + 1});
  expect_names([&] { mhc_mix_forward(ctx, bad, x, fn, base, scale, p.cfg); }, "out.rstd");
  MhcConfig cfg0 = p.cfg;
  cfg0.sinkhorn_iters = 0;
  expect_names([&] { mhc_mix_forward(ctx, mv, x, fn, base, scale, cfg0); }, "sinkhorn_iters");
  Tensor xi = x;
  xi.dtype = DType::I32;
  expect_names([&] { mhc_mix_forward(ctx, mv, xi, fn, base, scale, p.cfg); }, "mhc_mix_forward: x");

  expect_names(
      [&] {
        mhc_mix_backward(ctx, t({T, W}), t({M, W}), t({M}), t({3}), t({T, n + 1}), Tensor(), Tensor(), x, mv,
                         fn, base, scale, p.cfg);
      },
      "mhc_mix_backward: dpre");
  expect_names(
      [&] {
        mhc_mix_backward(ctx, t({T, W}), t({M, W}), t({M}), t({2}), t({T, n}), Tensor(), Tensor(), x, mv, fn,
                         base, scale, p.cfg);
      },
      "mhc_mix_backward: dscale");
  expect_names(
      [&] {
        mhc_mix_backward(ctx, t({T, W}), t({M, W}), t({M}), t({3}), t({T, n}), t({T, n}), t({T, n, n + 1}), x,
                         mv, fn, base, scale, p.cfg);
      },
      "mhc_mix_backward: dcomb");

  vf u(sz(T * D));
  expect_names([&] { mhc_pre_apply(ctx, view(u, {T, D}), x, t({T, n + 1}), n); }, "mhc_pre_apply: pre");
  expect_names([&] { mhc_pre_apply(ctx, t({T, D + 1}), x, t({T, n}), n); }, "mhc_pre_apply: u");
  expect_names([&] { mhc_pre_apply(ctx, view(u, {T, D}), x, t({T, n}), 3); }, "mhc_pre_apply: x");
  expect_names([&] { mhc_pre_apply(ctx, view(u, {T, D}), x, t({T, n}), 0); }, "n (hc_mult)");
  expect_names(
      [&] {
        mhc_pre_apply_backward(ctx, t({T, W}), t({T, n}), t({T + 1, D}), x, t({T, n}), n);
      },
      "mhc_pre_apply_backward: du");

  vf y(sz(T * W));
  expect_names(
      [&] {
        mhc_post(ctx, view(y, {T, W}), t({T, D}), x, t({T, n}), t({T, n, n + 1}), n);
      },
      "mhc_post: comb");
  expect_names(
      [&] {
        mhc_post(ctx, view(y, {T, W}), t({T, D + 1}), x, t({T, n}), t({T, n, n}), n);
      },
      "mhc_post: f");
  expect_names([&] { mhc_post(ctx, x, t({T, D}), x, t({T, n}), t({T, n, n}), n); }, "y must not alias x");
  expect_names(
      [&] {
        mhc_post_backward(ctx, view(y, {T, W}), t({T, D}), t({T, n + 1}), t({T, n, n}), t({T, W}), t({T, D}),
                          x, t({T, n}), t({T, n, n}), n);
      },
      "mhc_post_backward: dpost");

  Problem ph = make_problem({n, D, 1}, T, true, 4100);
  vf h(sz(T * D));
  expect_names(
      [&] {
        mhc_head_forward(ctx, view(h, {T, D}), t({T, n}), t({T, n}), t({T}), x, view(ph.fn, {n, W}),
                         view(ph.base, {n}), t({3}), ph.cfg);
      },
      "mhc_head_forward: scale");
  expect_names(
      [&] {
        mhc_head_forward(ctx, view(h, {T, D}), t({T, n}), t({T, n}), t({T}), x, fn, view(ph.base, {n}),
                         view(ph.scale, {1}), ph.cfg);
      },
      "mhc_head_forward: fn");
  expect_names(
      [&] {
        mhc_head_backward(ctx, t({T, W}), t({n, W}), t({n}), t({1}), t({T, D + 2}), x, t({T, n}), t({T, n}),
                          t({T}), view(ph.fn, {n, W}), view(ph.base, {n}), view(ph.scale, {1}), ph.cfg);
      },
      "mhc_head_backward: dh");
}

}  // namespace
}  // namespace lockstep::kernels
