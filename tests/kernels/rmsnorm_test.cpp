// Tests for RMSNorm (plain, fused residual add, backward): double references,
// bit-exact batch and thread invariance, finite differences, guards, shapes.
#include "lockstep/kernels/cpu/rmsnorm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
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

// Double reference: y = x * rstd * w per row; returns rstd.
std::vector<double> ref_forward(const std::vector<double>& x, const std::vector<double>& w, int64_t T,
                                int64_t D, double eps, std::vector<double>* y) {
  std::vector<double> r(sz(T));
  y->assign(sz(T * D), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0;
    for (int64_t i = 0; i < D; ++i) ss += x[sz(t * D + i)] * x[sz(t * D + i)];
    r[sz(t)] = 1.0 / std::sqrt(ss / double(D) + eps);
    for (int64_t i = 0; i < D; ++i) (*y)[sz(t * D + i)] = x[sz(t * D + i)] * r[sz(t)] * w[sz(i)];
  }
  return r;
}

std::vector<double> to_double(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// Copies a dense (T, D) block into a buffer with row stride ld.
void scatter_rows(const std::vector<float>& src, float* dst, int64_t T, int64_t D, int64_t ld) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < D; ++i) dst[t * ld + i] = src[sz(t * D + i)];
}
std::vector<float> gather_rows(const float* src, int64_t T, int64_t D, int64_t ld) {
  std::vector<float> out(sz(T * D));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < D; ++i) out[sz(t * D + i)] = src[t * ld + i];
  return out;
}
Tensor strided(float* p, int64_t T, int64_t D, int64_t ld) {
  Tensor t(p, DType::F32, {T, D});
  t.stride[0] = ld;
  return t;
}

TEST(RmsNorm, ForwardMatchesDoubleReference) {
  ThreadPool pool(2);
  Context ctx{&pool};
  uint32_t seed = 10;
  for (int64_t T : {1, 3, 17}) {
    for (int64_t D : {1, 7, 16, 33, 256, 1000}) {
      for (int64_t pad : {0, 5}) {
        const int64_t ld = D + pad;
        const float eps = 1e-6f;
        auto xs = test::randn(T * D, seed++, 2.0f);
        auto ws = test::randn(D, seed++);
        Guarded x(T * ld), y(T * ld, 7.0f), r(T);
        scatter_rows(xs, x.data(), T, D, ld);
        Tensor wt(ws.data(), DType::F32, {D});
        rmsnorm_forward(ctx, strided(y.data(), T, D, ld), r.tensor({T}), strided(x.data(), T, D, ld), wt,
                        eps);
        y.check("y");
        r.check("rstd");
        std::vector<double> yr;
        auto rr = ref_forward(to_double(xs), to_double(ws), T, D, eps, &yr);
        const std::string what =
            "T=" + std::to_string(T) + " D=" + std::to_string(D) + " pad=" + std::to_string(pad);
        expect_close(gather_rows(y.data(), T, D, ld), yr, 4e-6, ("y " + what).c_str());
        expect_close(r.values(), rr, 2e-6, ("rstd " + what).c_str());
        // Padding between rows is untouched.
        for (int64_t t = 0; t < T; ++t)
          for (int64_t i = D; i < ld; ++i) ASSERT_EQ(y[t * ld + i], 7.0f) << what;
      }
    }
  }
}

TEST(RmsNorm, ZeroRowGivesZeroOutputAndFiniteRstd) {
  Context ctx;
  std::vector<float> x(64, 0.0f), w(64, 1.0f), y(64, 1.0f), r(1);
  rmsnorm_forward(ctx, Tensor(y.data(), DType::F32, {1, 64}), Tensor(r.data(), DType::F32, {1}),
                  Tensor(x.data(), DType::F32, {1, 64}), Tensor(w.data(), DType::F32, {64}), 1e-6f);
  EXPECT_FLOAT_EQ(r[0], 1.0f / std::sqrt(1e-6f));
  for (float v : y) EXPECT_EQ(v, 0.0f);
}

TEST(RmsNorm, RstdIsOptionalAndYMayAliasX) {
  Context ctx;
  const int64_t T = 5, D = 77;
  auto x = test::randn(T * D, 1), w = test::randn(D, 2);
  std::vector<float> y(sz(T * D)), r(sz(T));
  Tensor wt(w.data(), DType::F32, {D});
  rmsnorm_forward(ctx, Tensor(y.data(), DType::F32, {T, D}), Tensor(r.data(), DType::F32, {T}),
                  Tensor(x.data(), DType::F32, {T, D}), wt, 1e-5f);
  std::vector<float> y2 = x;
  rmsnorm_forward(ctx, Tensor(y2.data(), DType::F32, {T, D}), Tensor(), Tensor(y2.data(), DType::F32, {T, D}),
                  wt, 1e-5f);
  expect_bits_equal(y.data(), y2.data(), T * D, "in place, no rstd");
}

TEST(RmsNorm, FusedAddEqualsAddThenNormBitForBit) {
  ThreadPool pool(2);
  Context ctx{&pool};
  const int64_t T = 40, D = 1000;
  auto x = test::randn(T * D, 3), res = test::randn(T * D, 4), w = test::randn(D, 5);
  Tensor wt(w.data(), DType::F32, {D});
  // Separate: h = x + r, then rmsnorm.
  std::vector<float> h(sz(T * D)), y(sz(T * D)), r(sz(T));
  for (size_t i = 0; i < h.size(); ++i) h[i] = x[i] + res[i];
  rmsnorm_forward(ctx, Tensor(y.data(), DType::F32, {T, D}), Tensor(r.data(), DType::F32, {T}),
                  Tensor(h.data(), DType::F32, {T, D}), wt, 1e-6f);
  // Fused, with guards.
  Guarded hf(T * D), yf(T * D), rf(T);
  add_rmsnorm_forward(ctx, yf.tensor({T, D}), hf.tensor({T, D}), rf.tensor({T}),
                      Tensor(x.data(), DType::F32, {T, D}), Tensor(res.data(), DType::F32, {T, D}), wt,
                      1e-6f);
  hf.check("h_out");
  yf.check("y");
  rf.check("rstd");
  expect_bits_equal(hf.data(), h.data(), T * D, "h");
  expect_bits_equal(yf.data(), y.data(), T * D, "y");
  expect_bits_equal(rf.data(), r.data(), T, "rstd");
  // In-place residual stream: h_out aliases x.
  std::vector<float> xs = x, y3(sz(T * D));
  add_rmsnorm_forward(ctx, Tensor(y3.data(), DType::F32, {T, D}), Tensor(xs.data(), DType::F32, {T, D}),
                      Tensor(), Tensor(xs.data(), DType::F32, {T, D}), Tensor(res.data(), DType::F32, {T, D}),
                      wt, 1e-6f);
  expect_bits_equal(xs.data(), h.data(), T * D, "h in place");
  expect_bits_equal(y3.data(), y.data(), T * D, "y after in-place add");
}

// Each row computed alone equals that row inside any batch of 1..64, 1 or 2 threads.
TEST(RmsNorm, BatchAndThreadInvariance) {
  const int64_t N = 64, D = 1000;  // D large enough that 2 threads split the rows
  auto x = test::randn(N * D, 6, 3.0f), dy = test::randn(N * D, 7), w = test::randn(D, 8);
  Tensor wt(w.data(), DType::F32, {D});
  ThreadPool p1(1), p2(2);
  auto run = [&](ThreadPool& p, int64_t r0, int64_t r1, std::vector<float>* y, std::vector<float>* dx,
                 std::vector<float>* rs) {
    Context ctx{&p};
    const int64_t n = r1 - r0;
    y->assign(sz(n * D), 0.0f);
    dx->assign(sz(n * D), 0.0f);
    rs->assign(sz(n), 0.0f);
    std::vector<float> dw(sz(D), 0.0f);
    Tensor xt = Tensor(x.data(), DType::F32, {N, D}).slice_rows(r0, r1);
    rmsnorm_forward(ctx, Tensor(y->data(), DType::F32, {n, D}), Tensor(rs->data(), DType::F32, {n}), xt, wt,
                    1e-6f);
    rmsnorm_backward(ctx, Tensor(dx->data(), DType::F32, {n, D}), Tensor(dw.data(), DType::F32, {D}),
                     Tensor(dy.data(), DType::F32, {N, D}).slice_rows(r0, r1), xt, wt,
                     Tensor(rs->data(), DType::F32, {n}));
  };
  std::vector<std::vector<float>> y1(N), dx1(N), r1(N);
  for (int64_t r = 0; r < N; ++r) run(p1, r, r + 1, &y1[r], &dx1[r], &r1[r]);
  std::vector<float> y, dx, rs;
  for (ThreadPool* p : {&p1, &p2}) {
    for (int64_t b = 1; b <= N; ++b) {
      for (int64_t r0 : {int64_t(0), N - b}) {
        run(*p, r0, r0 + b, &y, &dx, &rs);
        for (int64_t i = 0; i < b; ++i) {
          expect_bits_equal(y.data() + i * D, y1[r0 + i].data(), D, "y row");
          expect_bits_equal(dx.data() + i * D, dx1[r0 + i].data(), D, "dx row");
          expect_bits_equal(rs.data() + i, r1[r0 + i].data(), 1, "rstd row");
        }
      }
    }
  }
}

TEST(RmsNorm, WeightGradientIsThreadInvariantAndAccumulatesInTokenOrder) {
  const int64_t T = 50, D = 1024;
  auto x = test::randn(T * D, 9), dy = test::randn(T * D, 10), w = test::randn(D, 11);
  auto dw0 = test::randn(D, 12);
  std::vector<float> rs(sz(T)), y(sz(T * D)), dx(sz(T * D));
  Tensor xt(x.data(), DType::F32, {T, D}), wt(w.data(), DType::F32, {D}), rt(rs.data(), DType::F32, {T});
  Context c0;
  rmsnorm_forward(c0, Tensor(y.data(), DType::F32, {T, D}), rt, xt, wt, 1e-6f);
  std::vector<std::vector<float>> results;
  ThreadPool p1(1), p2(2);
  for (ThreadPool* p : {&p1, &p2}) {
    Context ctx{p};
    std::vector<float> dw = dw0;
    rmsnorm_backward(ctx, Tensor(dx.data(), DType::F32, {T, D}), Tensor(dw.data(), DType::F32, {D}),
                     Tensor(dy.data(), DType::F32, {T, D}), xt, wt, rt);
    results.push_back(dw);
  }
  expect_bits_equal(results[0].data(), results[1].data(), D, "dw 1 vs 2 threads");
  // The written contract: dw[c] = (((dw0 + a_0) + a_1) + ...), a_t = (dy * x) * rstd[t].
  for (int64_t c = 0; c < D; ++c) {
    float acc = dw0[sz(c)];
    for (int64_t t = 0; t < T; ++t) acc = acc + (dy[sz(t * D + c)] * x[sz(t * D + c)]) * rs[sz(t)];
    ASSERT_EQ(acc, results[0][sz(c)]) << c;
  }
}

// Analytic f32 gradients against central differences of a double reference of
// L = sum dy * y (dy fixed random weights).
TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  Context ctx;
  uint32_t seed = 100;
  for (int64_t T : {1, 3}) {
    for (int64_t D : {1, 5, 37}) {
      const double eps = 1e-5;
      auto xs = test::randn(T * D, seed++), ws = test::randn(D, seed++), dys = test::randn(T * D, seed++);
      auto xd = to_double(xs), wd = to_double(ws);
      auto loss = [&](const std::vector<double>& xv, const std::vector<double>& wv) {
        std::vector<double> y;
        ref_forward(xv, wv, T, D, eps, &y);
        double l = 0;
        for (size_t i = 0; i < y.size(); ++i) l += double(dys[i]) * y[i];
        return l;
      };
      const double h = 1e-5;
      std::vector<double> fdx(sz(T * D)), fdw(sz(D));
      for (size_t k = 0; k < xd.size(); ++k) {
        auto a = xd, b = xd;
        a[k] += h;
        b[k] -= h;
        fdx[k] = (loss(a, wd) - loss(b, wd)) / (2 * h);
      }
      for (size_t k = 0; k < wd.size(); ++k) {
        auto a = wd, b = wd;
        a[k] += h;
        b[k] -= h;
        fdw[k] = (loss(xd, a) - loss(xd, b)) / (2 * h);
      }
      std::vector<float> y(sz(T * D)), rs(sz(T));
      Tensor xt(xs.data(), DType::F32, {T, D}), wt(ws.data(), DType::F32, {D}),
          rt(rs.data(), DType::F32, {T});
      rmsnorm_forward(ctx, Tensor(y.data(), DType::F32, {T, D}), rt, xt, wt, float(eps));
      Guarded dx(T * D, 123.0f), dw(D, 0.0f);
      rmsnorm_backward(ctx, dx.tensor({T, D}), dw.tensor({D}), Tensor(dys.data(), DType::F32, {T, D}), xt, wt,
                       rt);
      dx.check("dx");
      dw.check("dw");
      const std::string what = "T=" + std::to_string(T) + " D=" + std::to_string(D);
      expect_close(dx.values(), fdx, 1e-4, ("dx " + what).c_str(), 1e-6);
      expect_close(dw.values(), fdw, 1e-4, ("dw " + what).c_str(), 1e-6);
      // Accumulation: a second call adds the same gradient again.
      rmsnorm_backward(ctx, dx.tensor({T, D}), dw.tensor({D}), Tensor(dys.data(), DType::F32, {T, D}), xt, wt,
                       rt);
      for (auto& v : fdw) v *= 2;
      expect_close(dw.values(), fdw, 1e-4, ("dw twice " + what).c_str(), 1e-6);
    }
  }
}

TEST(RmsNorm, ShapeMismatchNamesTheShapes) {
  Context ctx;
  std::vector<float> buf(1000);
  Tensor x(buf.data(), DType::F32, {4, 8}), y_bad(buf.data(), DType::F32, {4, 9}),
      w(buf.data(), DType::F32, {8});
  Tensor w_bad(buf.data(), DType::F32, {7}), r(buf.data(), DType::F32, {4}),
      r_bad(buf.data(), DType::F32, {3});
  std::string msg = error_of([&] { rmsnorm_forward(ctx, y_bad, r, x, w, 1e-6f); });
  EXPECT_NE(msg.find("(4, 8)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(4, 9)"), std::string::npos) << msg;
  msg = error_of([&] { rmsnorm_forward(ctx, x, r, x, w_bad, 1e-6f); });
  EXPECT_NE(msg.find("(7,)"), std::string::npos) << msg;
  msg = error_of([&] { rmsnorm_forward(ctx, x, r_bad, x, w, 1e-6f); });
  EXPECT_NE(msg.find("(3,)"), std::string::npos) << msg;
  msg = error_of([&] { add_rmsnorm_forward(ctx, x, x, r, x, y_bad, w, 1e-6f); });
  EXPECT_NE(msg.find("(4, 9)"), std::string::npos) << msg;
  msg = error_of([&] { rmsnorm_backward(ctx, x, w, y_bad, x, w, r); });
  EXPECT_NE(msg.find("dy"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(4, 9)"), std::string::npos) << msg;
  Tensor xi(buf.data(), DType::I32, {4, 8});
  msg = error_of([&] { rmsnorm_forward(ctx, x, r, xi, w, 1e-6f); });
  EXPECT_NE(msg.find("i32"), std::string::npos) << msg;
}

}  // namespace
}  // namespace lockstep::kernels
