// Tests for the sparse attention core with a sink: a double reference (its
// backward checked by finite differences), the header's numerics written out
// in scalar code (bit for bit, forward and the ordered dstore scatter), the
// sink's limits, batch and thread invariance, strided views, bad arguments.
#include "lockstep/kernels/cpu/sparse_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "lockstep/kernels/cpu/simd.h"

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

// One attention problem: q (T, H, Dh), store (N, Dh), cand (T, C), sink (H).
struct Problem {
  int64_t T = 0, H = 0, Dh = 0, N = 0, C = 0;
  float scale = 1.0f;
  std::vector<float> q, store, sink;
  std::vector<int32_t> cand;

  Tensor qt() { return Tensor(q.data(), DType::F32, {T, H, Dh}); }
  Tensor storet() { return Tensor(store.data(), DType::F32, {N, Dh}); }
  Tensor candt() { return Tensor(cand.data(), DType::I32, {T, C}); }
  Tensor sinkt() { return Tensor(sink.data(), DType::F32, {H}); }
};

// Random candidates with -1 holes and a row 0 that every query references
// (column 0); query 1 lists one row twice and the last query has only holes.
Problem make_problem(int64_t T, int64_t H, int64_t Dh, int64_t N, int64_t C, uint32_t seed) {
  Problem p;
  p.T = T, p.H = H, p.Dh = Dh, p.N = N, p.C = C;
  p.scale = 1.0f / std::sqrt(static_cast<float>(Dh));
  p.q = test::randn(T * H * Dh, seed * 5 + 1);
  p.store = test::randn(N * Dh, seed * 5 + 2);
  p.sink = test::randn(H, seed * 5 + 3);
  std::mt19937 g(seed * 5 + 4);
  std::uniform_int_distribution<int32_t> row(0, static_cast<int32_t>(N - 1));
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  p.cand.resize(sz(T * C));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) p.cand[sz(t * C + c)] = c == 0 ? 0 : (u(g) < 0.2f ? -1 : row(g));
  if (T > 1 && C > 2) p.cand[sz(1 * C + 2)] = p.cand[sz(1 * C + 1)] = 3 % static_cast<int32_t>(N);
  if (T > 2)
    for (int64_t c = 0; c < C; ++c) p.cand[sz((T - 1) * C + c)] = -1;
  return p;
}

struct RefOut {
  std::vector<double> out, lse;  // (T, H, Dh), (T, H)
};

// Straightforward double forward: softmax over the valid candidates and the sink.
RefOut ref_forward(const Problem& p, const std::vector<double>& q, const std::vector<double>& store,
                   const std::vector<double>& sink) {
  RefOut r;
  r.out.assign(sz(p.T * p.H * p.Dh), 0.0);
  r.lse.assign(sz(p.T * p.H), 0.0);
  for (int64_t t = 0; t < p.T; ++t)
    for (int64_t h = 0; h < p.H; ++h) {
      std::vector<double> z;
      std::vector<int64_t> rows;
      for (int64_t c = 0; c < p.C; ++c) {
        const int32_t j = p.cand[sz(t * p.C + c)];
        if (j < 0) continue;
        double dot = 0;
        for (int64_t d = 0; d < p.Dh; ++d) dot += q[sz((t * p.H + h) * p.Dh + d)] * store[sz(j * p.Dh + d)];
        z.push_back(dot * double(p.scale));
        rows.push_back(j);
      }
      double m = sink[sz(h)];
      for (double v : z) m = std::max(m, v);
      double l = std::exp(sink[sz(h)] - m);
      for (double v : z) l += std::exp(v - m);
      for (size_t k = 0; k < z.size(); ++k)
        for (int64_t d = 0; d < p.Dh; ++d)
          r.out[sz((t * p.H + h) * p.Dh + d)] += std::exp(z[k] - m) / l * store[sz(rows[k] * p.Dh + d)];
      r.lse[sz(t * p.H + h)] = m + std::log(l);
    }
  return r;
}

std::vector<double> widen(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

RefOut ref_forward(const Problem& p) {
  return ref_forward(p, widen(p.q), widen(p.store), widen(p.sink));
}

struct RefGrad {
  std::vector<double> dq, dstore, dsink;  // (T, H, Dh), (N, Dh), (H)
};

// The backward formulas in double (dstore and dsink from zero).
RefGrad ref_backward(const Problem& p, const std::vector<double>& q, const std::vector<double>& store,
                     const std::vector<double>& sink, const std::vector<double>& dout) {
  const RefOut f = ref_forward(p, q, store, sink);
  RefGrad g;
  g.dq.assign(q.size(), 0.0);
  g.dstore.assign(store.size(), 0.0);
  g.dsink.assign(sink.size(), 0.0);
  const double sc = p.scale;
  for (int64_t t = 0; t < p.T; ++t)
    for (int64_t h = 0; h < p.H; ++h) {
      const size_t th = sz((t * p.H + h) * p.Dh);
      double Dt = 0;
      for (int64_t d = 0; d < p.Dh; ++d) Dt += dout[th + sz(d)] * f.out[th + sz(d)];
      const double l = f.lse[sz(t * p.H + h)];
      g.dsink[sz(h)] -= std::exp(sink[sz(h)] - l) * Dt;
      for (int64_t c = 0; c < p.C; ++c) {
        const int32_t j = p.cand[sz(t * p.C + c)];
        if (j < 0) continue;
        double z = 0, dp = 0;
        for (int64_t d = 0; d < p.Dh; ++d) {
          z += q[th + sz(d)] * store[sz(j * p.Dh + d)];
          dp += dout[th + sz(d)] * store[sz(j * p.Dh + d)];
        }
        const double pj = std::exp(z * sc - l), dz = pj * (dp - Dt);
        for (int64_t d = 0; d < p.Dh; ++d) {
          g.dq[th + sz(d)] += dz * sc * store[sz(j * p.Dh + d)];
          g.dstore[sz(j * p.Dh + d)] += dz * sc * q[th + sz(d)] + pj * dout[th + sz(d)];
        }
      }
    }
  return g;
}

// The header's forward numerics, written out one (t, h) at a time.
void exact_forward(const Problem& p, std::vector<float>& out, std::vector<float>& lse) {
  out.assign(sz(p.T * p.H * p.Dh), 0.0f);
  lse.assign(sz(p.T * p.H), 0.0f);
  for (int64_t t = 0; t < p.T; ++t)
    for (int64_t h = 0; h < p.H; ++h) {
      const float* qr = p.q.data() + (t * p.H + h) * p.Dh;
      std::vector<float> z;
      std::vector<const float*> rows;
      for (int64_t c = 0; c < p.C; ++c) {
        const int32_t j = p.cand[sz(t * p.C + c)];
        if (j < 0) continue;
        rows.push_back(p.store.data() + j * p.Dh);
        z.push_back(canonical_dot(qr, rows.back(), p.Dh) * p.scale);
      }
      float m = p.sink[sz(h)];
      for (float v : z) m = std::max(m, v);
      std::vector<float> e;
      for (float v : z) e.push_back(exp1(v - m));
      const float l = canonical_sum(e.data(), static_cast<int64_t>(e.size())) + exp1(p.sink[sz(h)] - m);
      float* o = out.data() + (t * p.H + h) * p.Dh;
      for (size_t k = 0; k < e.size(); ++k) {
        const float pk = e[k] / l;
        for (int64_t d = 0; d < p.Dh; ++d) o[d] = std::fma(pk, rows[k][d], o[d]);
      }
      lse[sz(t * p.H + h)] = m + log1(l);
    }
}

// The backward's numerics written out in the header's (t, h, column) order:
// p = exp1(z - lse), ds = p * (<dout, kv> - Dt) * scale, each reference adding
// fma(p, dout, fma(ds, q, row)) to its store row; dsink -= exp1(sink - lse) * Dt.
void exact_backward(const Problem& p, const std::vector<float>& dout, const std::vector<float>& out,
                    const std::vector<float>& lse, std::vector<float>& dq, std::vector<float>& dstore,
                    std::vector<float>& dsink) {
  dq.assign(sz(p.T * p.H * p.Dh), 0.0f);
  for (int64_t t = 0; t < p.T; ++t)
    for (int64_t h = 0; h < p.H; ++h) {
      const int64_t th = (t * p.H + h) * p.Dh;
      const float Dt = canonical_dot(dout.data() + th, out.data() + th, p.Dh);
      const float l = lse[sz(t * p.H + h)];
      for (int64_t c = 0; c < p.C; ++c) {
        const int32_t j = p.cand[sz(t * p.C + c)];
        if (j < 0) continue;
        const float* kv = p.store.data() + j * p.Dh;
        const float pj = exp1(canonical_dot(p.q.data() + th, kv, p.Dh) * p.scale - l);
        const float ds = pj * (canonical_dot(dout.data() + th, kv, p.Dh) - Dt) * p.scale;
        for (int64_t d = 0; d < p.Dh; ++d) {
          dq[sz(th + d)] = std::fma(ds, kv[d], dq[sz(th + d)]);
          float& r = dstore[sz(j * p.Dh + d)];
          r = std::fma(pj, dout[sz(th + d)], std::fma(ds, p.q[sz(th + d)], r));
        }
      }
      dsink[sz(h)] -= exp1(p.sink[sz(h)] - l) * Dt;
    }
}

struct Fwd {
  std::vector<float> out, lse;
};

Fwd run_forward(const Context& ctx, Problem& p) {
  Guarded out(p.T * p.H * p.Dh), lse(p.T * p.H);
  sparse_attention_forward(ctx, out.tensor({p.T, p.H, p.Dh}), lse.tensor({p.T, p.H}), p.qt(), p.storet(),
                           p.candt(), p.sinkt(), p.scale);
  out.check("out");
  lse.check("lse");
  return {out.values(), lse.values()};
}

struct Bwd {
  std::vector<float> dq, dstore, dsink;
};

// dstore and dsink start from the given values (they accumulate).
Bwd run_backward(const Context& ctx, Problem& p, std::vector<float>& dout, Fwd& f,
                 const std::vector<float>& dstore0, const std::vector<float>& dsink0) {
  Guarded dq(p.T * p.H * p.Dh), dstore(p.N * p.Dh), dsink(p.H);
  for (int64_t i = 0; i < p.N * p.Dh; ++i) dstore[i] = dstore0[sz(i)];
  for (int64_t i = 0; i < p.H; ++i) dsink[i] = dsink0[sz(i)];
  sparse_attention_backward(
      ctx, dq.tensor({p.T, p.H, p.Dh}), dstore.tensor({p.N, p.Dh}), dsink.tensor({p.H}),
      Tensor(dout.data(), DType::F32, {p.T, p.H, p.Dh}), Tensor(f.out.data(), DType::F32, {p.T, p.H, p.Dh}),
      Tensor(f.lse.data(), DType::F32, {p.T, p.H}), p.qt(), p.storet(), p.candt(), p.sinkt(), p.scale);
  dq.check("dq");
  dstore.check("dstore");
  dsink.check("dsink");
  return {dq.values(), dstore.values(), dsink.values()};
}

Bwd run_backward(const Context& ctx, Problem& p, std::vector<float>& dout, Fwd& f) {
  return run_backward(ctx, p, dout, f, std::vector<float>(sz(p.N * p.Dh), 0.0f),
                      std::vector<float>(sz(p.H), 0.0f));
}

TEST(SparseAttention, ForwardMatchesDoubleReference) {
  ThreadPool pool(2);
  Context ctx{&pool};
  uint32_t seed = 1;
  for (int64_t Dh : {1, 16, 37, 64}) {
    for (int64_t C : {1, 5, 40}) {
      Problem p = make_problem(/*T=*/9, /*H=*/3, Dh, /*N=*/23, C, seed++);
      const std::string what = "Dh=" + std::to_string(Dh) + " C=" + std::to_string(C);
      const Fwd f = run_forward(ctx, p);
      const RefOut r = ref_forward(p);
      expect_close(f.out, r.out, 2e-6, (what + " out").c_str(), 1e-7);
      expect_close(f.lse, r.lse, 1e-6, (what + " lse").c_str(), 1e-6);
    }
  }
}

TEST(SparseAttention, ForwardIsTheHeaderNumericsBitForBit) {
  Context ctx;
  Problem p = make_problem(12, 4, 48, 30, 33, 7);
  const Fwd f = run_forward(ctx, p);
  std::vector<float> out, lse;
  exact_forward(p, out, lse);
  expect_bits_equal(f.out.data(), out.data(), p.T * p.H * p.Dh, "out");
  expect_bits_equal(f.lse.data(), lse.data(), p.T * p.H, "lse");
}

TEST(SparseAttention, SinkLimits) {
  Context ctx;
  // A very negative sink leaves the plain softmax over the candidates.
  Problem p = make_problem(6, 2, 16, 12, 7, 11);
  std::fill(p.sink.begin(), p.sink.end(), -1e30f);
  p.cand[sz((p.T - 1) * p.C)] = 5;  // the hole-only query gets one candidate
  const Fwd f = run_forward(ctx, p);
  std::vector<double> naive(sz(p.T * p.H * p.Dh), 0.0);
  for (int64_t t = 0; t < p.T; ++t)
    for (int64_t h = 0; h < p.H; ++h) {
      std::vector<double> w;
      std::vector<int32_t> rows;
      for (int64_t c = 0; c < p.C; ++c) {
        const int32_t j = p.cand[sz(t * p.C + c)];
        if (j < 0) continue;
        double z = 0;
        for (int64_t d = 0; d < p.Dh; ++d)
          z += double(p.q[sz((t * p.H + h) * p.Dh + d)]) * p.store[sz(j * p.Dh + d)];
        w.push_back(std::exp(z * p.scale));
        rows.push_back(j);
      }
      double sum = 0;
      for (double v : w) sum += v;
      for (size_t k = 0; k < w.size(); ++k)
        for (int64_t d = 0; d < p.Dh; ++d)
          naive[sz((t * p.H + h) * p.Dh + d)] += w[k] / sum * p.store[sz(rows[k] * p.Dh + d)];
    }
  expect_close(f.out, naive, 2e-6, "sink -1e30 vs naive softmax", 1e-7);

  // A query with only holes returns 0 and lse = sink; a dominant sink pulls
  // the output toward 0 by the factor 1 - p_sink.
  Problem s = make_problem(3, 2, 8, 5, 4, 12);
  s.sink = {0.5f, 30.0f};
  const Fwd g = run_forward(ctx, s);
  for (int64_t h = 0; h < s.H; ++h) {
    EXPECT_EQ(g.lse[sz((s.T - 1) * s.H + h)], s.sink[sz(h)]);
    for (int64_t d = 0; d < s.Dh; ++d) EXPECT_EQ(g.out[sz(((s.T - 1) * s.H + h) * s.Dh + d)], 0.0f);
  }
  for (int64_t d = 0; d < s.Dh; ++d) EXPECT_LT(std::fabs(g.out[sz((0 * s.H + 1) * s.Dh + d)]), 1e-9f);
}

TEST(SparseAttention, ReferenceBackwardMatchesFiniteDifferences) {
  Problem p = make_problem(5, 2, 4, 7, 5, 21);
  const std::vector<double> q = widen(p.q), store = widen(p.store), sink = widen(p.sink);
  const std::vector<double> dout = widen(test::randn(p.T * p.H * p.Dh, 22));
  const RefGrad g = ref_backward(p, q, store, sink, dout);
  auto loss = [&](const std::vector<double>& qq, const std::vector<double>& ss,
                  const std::vector<double>& kk) {
    const RefOut f = ref_forward(p, qq, ss, kk);
    double l = 0;
    for (size_t i = 0; i < f.out.size(); ++i) l += f.out[i] * dout[i];
    return l;
  };
  const double eps = 1e-6;
  auto check = [&](std::vector<double> base, const std::vector<double>& grad, int which, const char* what) {
    for (size_t i = 0; i < base.size(); ++i) {
      std::vector<double> up = base, dn = base;
      up[i] += eps;
      dn[i] -= eps;
      auto at = [&](const std::vector<double>& v) {
        return which == 0 ? loss(v, store, sink) : which == 1 ? loss(q, v, sink) : loss(q, store, v);
      };
      const double fd = (at(up) - at(dn)) / (2 * eps);
      EXPECT_NEAR(grad[i], fd, 1e-7 * (1 + std::fabs(fd))) << what << " element " << i;
    }
  };
  check(q, g.dq, 0, "dq");
  check(store, g.dstore, 1, "dstore");
  check(sink, g.dsink, 2, "dsink");
}

TEST(SparseAttention, BackwardMatchesDoubleReferenceAndAccumulates) {
  ThreadPool pool(2);
  Context ctx{&pool};
  uint32_t seed = 31;
  for (int64_t Dh : {1, 16, 40}) {
    for (int64_t C : {1, 6, 33}) {
      Problem p = make_problem(10, 3, Dh, 17, C, seed++);
      const std::string what = "Dh=" + std::to_string(Dh) + " C=" + std::to_string(C);
      std::vector<float> dout = test::randn(p.T * p.H * p.Dh, seed++);
      Fwd f = run_forward(ctx, p);
      const std::vector<float> dstore0 = test::randn(p.N * p.Dh, seed++), dsink0 = test::randn(p.H, seed++);
      const Bwd b = run_backward(ctx, p, dout, f, dstore0, dsink0);
      RefGrad g = ref_backward(p, widen(p.q), widen(p.store), widen(p.sink), widen(dout));
      for (size_t i = 0; i < g.dstore.size(); ++i) g.dstore[i] += dstore0[i];
      for (size_t i = 0; i < g.dsink.size(); ++i) g.dsink[i] += dsink0[i];
      expect_close(b.dq, g.dq, 2e-5, (what + " dq").c_str(), 1e-6);
      expect_close(b.dstore, g.dstore, 2e-5, (what + " dstore").c_str(), 1e-6);
      expect_close(b.dsink, g.dsink, 2e-5, (what + " dsink").c_str(), 1e-6);
    }
  }
}

// Large enough that the backward processes its tokens in two chunks; the
// ordered scatter must not show the chunk boundary.
TEST(SparseAttention, BackwardIsTheOrderedScatterBitForBit) {
  for (int64_t T : {int64_t{9}, int64_t{1100}}) {
    const int64_t C = T > 100 ? 512 : 12;
    Problem p = make_problem(T, 2, T > 100 ? 4 : 24, T > 100 ? 300 : 20, C, 41);
    ThreadPool pool(2);
    Context ctx{&pool};
    std::vector<float> dout = test::randn(p.T * p.H * p.Dh, 42);
    Fwd f = run_forward(ctx, p);
    std::vector<float> dstore = test::randn(p.N * p.Dh, 43), dsink = test::randn(p.H, 44);
    const Bwd b = run_backward(ctx, p, dout, f, dstore, dsink);
    std::vector<float> dq;
    exact_backward(p, dout, f.out, f.lse, dq, dstore, dsink);
    const std::string what = "T=" + std::to_string(T);
    expect_bits_equal(b.dq.data(), dq.data(), p.T * p.H * p.Dh, (what + " dq").c_str());
    expect_bits_equal(b.dstore.data(), dstore.data(), p.N * p.Dh, (what + " dstore").c_str());
    expect_bits_equal(b.dsink.data(), dsink.data(), p.H, (what + " dsink").c_str());
  }
}

TEST(SparseAttention, BitsIndependentOfThreadsAndBatch) {
  Problem p = make_problem(64, 4, 32, 200, 16, 51);
  std::vector<float> dout = test::randn(p.T * p.H * p.Dh, 52);
  Context c0;
  ThreadPool p1(1), p2(2);
  Context c1{&p1}, c2{&p2};
  Fwd f0 = run_forward(c0, p);
  const Bwd b0 = run_backward(c0, p, dout, f0);
  for (const Context* ctx : {&c1, &c2}) {
    Fwd f = run_forward(*ctx, p);
    expect_bits_equal(f.out.data(), f0.out.data(), p.T * p.H * p.Dh, "out");
    expect_bits_equal(f.lse.data(), f0.lse.data(), p.T * p.H, "lse");
    const Bwd b = run_backward(*ctx, p, dout, f);
    expect_bits_equal(b.dq.data(), b0.dq.data(), p.T * p.H * p.Dh, "dq");
    expect_bits_equal(b.dstore.data(), b0.dstore.data(), p.N * p.Dh, "dstore");
    expect_bits_equal(b.dsink.data(), b0.dsink.data(), p.H, "dsink");
  }
  // A query alone gives the bits it gets in the batch, forward and dq.
  for (int64_t t : {int64_t{0}, int64_t{17}, int64_t{63}}) {
    Problem one = p;
    one.T = 1;
    one.q.assign(p.q.begin() + t * p.H * p.Dh, p.q.begin() + (t + 1) * p.H * p.Dh);
    one.cand.assign(p.cand.begin() + t * p.C, p.cand.begin() + (t + 1) * p.C);
    Fwd f = run_forward(c2, one);
    expect_bits_equal(f.out.data(), f0.out.data() + t * p.H * p.Dh, p.H * p.Dh, "out alone");
    expect_bits_equal(f.lse.data(), f0.lse.data() + t * p.H, p.H, "lse alone");
    std::vector<float> dout1(dout.begin() + t * p.H * p.Dh, dout.begin() + (t + 1) * p.H * p.Dh);
    const Bwd b = run_backward(c2, one, dout1, f);
    expect_bits_equal(b.dq.data(), b0.dq.data() + t * p.H * p.Dh, p.H * p.Dh, "dq alone");
  }
}

TEST(SparseAttention, StridedViewsGiveTheContiguousBits) {
  Context ctx;
  Problem p = make_problem(7, 3, 16, 11, 9, 61);
  const Fwd f0 = run_forward(ctx, p);
  // q inside a wider (T, H, Dh + 5) buffer, cand rows padded to C + 3, out and
  // lse written into padded rows.
  const int64_t qw = p.Dh + 5, cw = p.C + 3;
  std::vector<float> qbuf(sz(p.T * p.H * qw), NAN), obuf(sz(p.T * p.H * qw), 0.0f), lbuf(sz(p.T * (p.H + 2)));
  std::vector<int32_t> cbuf(sz(p.T * cw), -7);
  for (int64_t t = 0; t < p.T; ++t) {
    for (int64_t h = 0; h < p.H; ++h)
      for (int64_t d = 0; d < p.Dh; ++d) qbuf[sz((t * p.H + h) * qw + d)] = p.q[sz((t * p.H + h) * p.Dh + d)];
    for (int64_t c = 0; c < p.C; ++c) cbuf[sz(t * cw + c)] = p.cand[sz(t * p.C + c)];
  }
  auto view3 = [&](std::vector<float>& b) {
    Tensor v(b.data(), DType::F32, {p.T, p.H, p.Dh});
    v.stride[0] = p.H * qw;
    v.stride[1] = qw;
    return v;
  };
  Tensor ct(cbuf.data(), DType::I32, {p.T, p.C});
  ct.stride[0] = cw;
  Tensor lt(lbuf.data(), DType::F32, {p.T, p.H});
  lt.stride[0] = p.H + 2;
  sparse_attention_forward(ctx, view3(obuf), lt, view3(qbuf), p.storet(), ct, p.sinkt(), p.scale);
  for (int64_t t = 0; t < p.T; ++t)
    for (int64_t h = 0; h < p.H; ++h) {
      expect_bits_equal(obuf.data() + (t * p.H + h) * qw, f0.out.data() + (t * p.H + h) * p.Dh, p.Dh, "out");
      ASSERT_EQ(lbuf[sz(t * (p.H + 2) + h)], f0.lse[sz(t * p.H + h)]);
    }
  // lse may be skipped.
  std::vector<float> out(sz(p.T * p.H * p.Dh));
  sparse_attention_forward(ctx, Tensor(out.data(), DType::F32, {p.T, p.H, p.Dh}), Tensor(), p.qt(),
                           p.storet(), p.candt(), p.sinkt(), p.scale);
  expect_bits_equal(out.data(), f0.out.data(), p.T * p.H * p.Dh, "out without lse");
}

TEST(SparseAttention, BadArgumentsThrowNamingThem) {
  Context ctx;
  Problem p = make_problem(4, 2, 8, 6, 3, 71);
  std::vector<float> out(sz(p.T * p.H * p.Dh)), lse(sz(p.T * p.H)), big(1024);
  Tensor ot(out.data(), DType::F32, {p.T, p.H, p.Dh}), lt(lse.data(), DType::F32, {p.T, p.H});
  auto fwd = [&](Tensor o, Tensor l, Tensor q, Tensor s, Tensor c, Tensor k) {
    return error_of([&] { sparse_attention_forward(ctx, o, l, q, s, c, k, p.scale); });
  };
  EXPECT_EQ(fwd(ot, lt, p.qt(), p.storet(), p.candt(), p.sinkt()), "");
  EXPECT_NE(fwd(ot, lt, Tensor(p.q.data(), DType::F32, {p.T, p.H * p.Dh}), p.storet(), p.candt(), p.sinkt())
                .find(": q"),
            std::string::npos);
  EXPECT_NE(fwd(ot, lt, p.qt(), Tensor(big.data(), DType::F32, {p.N, p.Dh + 1}), p.candt(), p.sinkt())
                .find(": store"),
            std::string::npos);
  EXPECT_NE(
      fwd(ot, lt, p.qt(), p.storet(), Tensor(big.data(), DType::F32, {p.T, p.C}), p.sinkt()).find(": cand"),
      std::string::npos);
  EXPECT_NE(fwd(ot, lt, p.qt(), p.storet(), Tensor(p.cand.data(), DType::I32, {p.T - 1, p.C}), p.sinkt())
                .find(": cand"),
            std::string::npos);
  EXPECT_NE(
      fwd(ot, lt, p.qt(), p.storet(), p.candt(), Tensor(big.data(), DType::F32, {p.H + 1})).find(": sink"),
      std::string::npos);
  EXPECT_NE(
      fwd(Tensor(big.data(), DType::F32, {p.T, p.H, p.Dh + 1}), lt, p.qt(), p.storet(), p.candt(), p.sinkt())
          .find(": out"),
      std::string::npos);
  EXPECT_NE(fwd(ot, Tensor(big.data(), DType::F32, {p.T, p.H + 1}), p.qt(), p.storet(), p.candt(), p.sinkt())
                .find(": lse"),
            std::string::npos);
  Tensor strided_q = p.qt();
  strided_q.stride[2] = 2;
  EXPECT_NE(fwd(ot, lt, strided_q, p.storet(), p.candt(), p.sinkt()).find(": q"), std::string::npos);
  // Candidates outside [-1, N).
  for (int32_t bad : {static_cast<int32_t>(p.N), -2}) {
    Problem b = p;
    b.cand[sz(2 * b.C + 1)] = bad;
    const std::string e = fwd(ot, lt, b.qt(), b.storet(), b.candt(), b.sinkt());
    EXPECT_NE(e.find("cand[2][1]"), std::string::npos) << e;
  }

  // Backward: every gradient and input is checked.
  std::vector<float> dout(out.size()), dq(out.size()), dstore(sz(p.N * p.Dh)), dsink(sz(p.H));
  Tensor dot(dout.data(), DType::F32, {p.T, p.H, p.Dh}), dqt(dq.data(), DType::F32, {p.T, p.H, p.Dh});
  Tensor dst(dstore.data(), DType::F32, {p.N, p.Dh}), dkt(dsink.data(), DType::F32, {p.H});
  auto bwd = [&](Tensor a, Tensor b, Tensor c, Tensor d, Tensor l, Tensor cand) {
    return error_of([&] {
      sparse_attention_backward(ctx, a, b, c, d, ot, l, p.qt(), p.storet(), cand, p.sinkt(), p.scale);
    });
  };
  EXPECT_EQ(bwd(dqt, dst, dkt, dot, lt, p.candt()), "");
  Tensor wide(big.data(), DType::F32, {p.T, p.H, p.Dh + 1});
  EXPECT_NE(bwd(wide, dst, dkt, dot, lt, p.candt()).find(": dq"), std::string::npos);
  EXPECT_NE(
      bwd(dqt, Tensor(big.data(), DType::F32, {p.N + 1, p.Dh}), dkt, dot, lt, p.candt()).find(": dstore"),
      std::string::npos);
  EXPECT_NE(bwd(dqt, dst, Tensor(big.data(), DType::F32, {p.H, 1}), dot, lt, p.candt()).find(": dsink"),
            std::string::npos);
  EXPECT_NE(bwd(dqt, dst, dkt, wide, lt, p.candt()).find(": dout"), std::string::npos);
  EXPECT_NE(bwd(dqt, dst, dkt, dot, Tensor(), p.candt()).find(": lse"), std::string::npos);
  std::vector<int32_t> bad = p.cand;
  bad[0] = static_cast<int32_t>(p.N);
  EXPECT_NE(bwd(dqt, dst, dkt, dot, lt, Tensor(bad.data(), DType::I32, {p.T, p.C})).find("cand[0][0]"),
            std::string::npos);
}

}  // namespace
}  // namespace lockstep::kernels
