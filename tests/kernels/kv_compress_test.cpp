// Tests for the DeepSeek-V4 KV compressor (HCA and CSA) and the lightning
// indexer's selection: double references, the header's exact f32 recipe,
// block-0 masking, finite differences, the cross-block gradient, the
// (entry, slot) accumulation order, batch/thread invariance, errors.
#include "lockstep/kernels/cpu/kv_compress.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <utility>
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

constexpr float kInf = std::numeric_limits<float>::infinity();

// ------------------------------------------------------------ compressor setup

// Sequences laid out one after the other in the store; entry t of a sequence
// covers its block t (HCA) or blocks t-1 and t (CSA, block 0's previous half -1).
struct Problem {
  int64_t c = 0, kappa = 1, Dc = 0, P = 0, N = 0, Ne = 0;
  bool overlap = false;
  std::vector<float> store;   // (N, 2*kappa*Dc) [C | Z]
  std::vector<int32_t> rows;  // (Ne, P)
  std::vector<float> ape;     // (c, kappa*Dc)

  int64_t width() const { return 2 * kappa * Dc; }
  Tensor store_t() { return Tensor(store.data(), DType::F32, {N, width()}); }
  Tensor rows_t() { return Tensor(rows.data(), DType::I32, {Ne, P}); }
  Tensor ape_t() { return Tensor(ape.data(), DType::F32, {c, kappa * Dc}); }
};

std::vector<int32_t> sequence_rows(int64_t c, bool overlap, int64_t base, int64_t len) {
  std::vector<int32_t> rows;
  for (int64_t t = 0; t < len / c; ++t) {
    if (overlap)
      for (int64_t p = 0; p < c; ++p) rows.push_back(t == 0 ? -1 : int32_t(base + (t - 1) * c + p));
    for (int64_t p = 0; p < c; ++p) rows.push_back(int32_t(base + t * c + p));
  }
  return rows;
}

Problem make_problem(int64_t c, bool overlap, int64_t Dc, const std::vector<int64_t>& lens, uint32_t seed) {
  Problem pr;
  pr.c = c;
  pr.overlap = overlap;
  pr.kappa = overlap ? 2 : 1;
  pr.Dc = Dc;
  pr.P = pr.kappa * c;
  for (int64_t len : lens) {
    auto r = sequence_rows(c, overlap, pr.N, len);
    pr.rows.insert(pr.rows.end(), r.begin(), r.end());
    pr.N += len;
  }
  pr.Ne = int64_t(pr.rows.size()) / pr.P;
  pr.store = test::randn(pr.N * pr.width(), seed, 1.0f);
  // Scores (Z) spread wider than values so the softmax is far from uniform.
  for (int64_t r = 0; r < pr.N; ++r)
    for (int64_t i = pr.kappa * Dc; i < pr.width(); ++i) pr.store[sz(r * pr.width() + i)] *= 2.5f;
  pr.ape = test::randn(c * pr.kappa * Dc, seed + 1000, 0.7f);
  return pr;
}

// Straightforward double reference from the spec: per entry and channel, a
// softmax over the valid slots of Z + ape, then the weighted sum of C.
std::vector<double> ref_forward(const Problem& pr, const std::vector<double>& store,
                                const std::vector<double>& ape) {
  std::vector<double> out(sz(pr.Ne * pr.Dc));
  const int64_t W = pr.width();
  for (int64_t e = 0; e < pr.Ne; ++e)
    for (int64_t ch = 0; ch < pr.Dc; ++ch) {
      std::vector<double> z, v;
      for (int64_t p = 0; p < pr.P; ++p) {
        const int32_t r = pr.rows[sz(e * pr.P + p)];
        if (r < 0) continue;
        const int64_t col = (pr.overlap && p >= pr.c ? pr.Dc : 0) + ch;
        z.push_back(store[sz(r * W + pr.kappa * pr.Dc + col)] + ape[sz((p % pr.c) * pr.kappa * pr.Dc + col)]);
        v.push_back(store[sz(r * W + col)]);
      }
      const double mx = *std::max_element(z.begin(), z.end());
      double s = 0, y = 0;
      for (size_t k = 0; k < z.size(); ++k) s += std::exp(z[k] - mx);
      for (size_t k = 0; k < z.size(); ++k) y += std::exp(z[k] - mx) / s * v[k];
      out[sz(e * pr.Dc + ch)] = y;
    }
  return out;
}

std::vector<double> to_double(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// The header's f32 recipe, written out slot by slot, for a bit-exact check.
std::vector<float> recipe_forward(const Problem& pr) {
  std::vector<float> out(sz(pr.Ne * pr.Dc));
  const int64_t W = pr.width();
  for (int64_t e = 0; e < pr.Ne; ++e)
    for (int64_t ch = 0; ch < pr.Dc; ++ch) {
      std::vector<float> z, v;
      for (int64_t p = 0; p < pr.P; ++p) {
        const int32_t r = pr.rows[sz(e * pr.P + p)];
        if (r < 0) continue;
        const int64_t col = (pr.overlap && p >= pr.c ? pr.Dc : 0) + ch;
        z.push_back(pr.store[sz(r * W + pr.kappa * pr.Dc + col)] +
                    pr.ape[sz((p % pr.c) * pr.kappa * pr.Dc + col)]);
        v.push_back(pr.store[sz(r * W + col)]);
      }
      float mx = z[0];
      for (float x : z) mx = std::max(mx, x);
      float s = 0.0f, acc = 0.0f;
      for (size_t k = 0; k < z.size(); ++k) {
        const float ep = exp1(z[k] - mx);
        s = s + ep;
        acc = std::fma(ep, v[k], acc);
      }
      out[sz(e * pr.Dc + ch)] = acc / s;
    }
  return out;
}

std::vector<float> run_forward(const Context& ctx, Problem& pr) {
  Guarded out(pr.Ne * pr.Dc, -7.0f);
  compress_forward(ctx, out.tensor({pr.Ne, pr.Dc}), pr.store_t(), pr.rows_t(), pr.ape_t(), int(pr.c),
                   pr.overlap);
  out.check("out");
  return out.values();
}

struct Grads {
  std::vector<float> dstore, dape;
};

Grads run_backward(const Context& ctx, Problem& pr, std::vector<float>& dout, float init = 0.0f) {
  Guarded ds(pr.N * pr.width(), init), da(pr.c * pr.kappa * pr.Dc, init);
  compress_backward(ctx, ds.tensor({pr.N, pr.width()}), da.tensor({pr.c, pr.kappa * pr.Dc}),
                    Tensor(dout.data(), DType::F32, {pr.Ne, pr.Dc}), pr.store_t(), pr.rows_t(), pr.ape_t(),
                    int(pr.c), pr.overlap);
  ds.check("dstore");
  da.check("dape");
  return {ds.values(), da.values()};
}

std::string name_of(const Problem& pr) {
  return "c=" + std::to_string(pr.c) + (pr.overlap ? " overlap" : "") + " Dc=" + std::to_string(pr.Dc);
}

struct Config {
  int64_t c;
  bool overlap;
};
const Config kConfigs[] = {{4, true}, {128, false}, {1, false}, {1, true}, {2, true}, {3, true}, {3, false}};

// ------------------------------------------------------------------ forward

TEST(KvCompress, ForwardMatchesDoubleReferenceAndTheHeaderRecipe) {
  ThreadPool pool(2);
  Context ctx{&pool};
  uint32_t seed = 1;
  for (const Config& cf : kConfigs)
    for (int64_t Dc : {1, 5, 70}) {
      // Lengths with a partial trailing block (not compressed) and a short sequence.
      const std::vector<int64_t> lens = {3 * cf.c + cf.c / 2, cf.c, 2 * cf.c};
      Problem pr = make_problem(cf.c, cf.overlap, Dc, lens, seed++);
      const auto got = run_forward(ctx, pr);
      double vmax = 0;
      for (int64_t r = 0; r < pr.N; ++r)
        for (int64_t i = 0; i < pr.kappa * Dc; ++i)
          vmax = std::max(vmax, std::fabs(double(pr.store[sz(r * pr.width() + i)])));
      const std::string what = name_of(pr);
      expect_close(got, ref_forward(pr, to_double(pr.store), to_double(pr.ape)), 2e-6, what.c_str(),
                   1e-6 * vmax);
      const auto want = recipe_forward(pr);
      expect_bits_equal(got.data(), want.data(), int64_t(got.size()), ("recipe " + what).c_str());
    }
}

// A masked slot is absent: the same bits as a real row whose Z is -inf and C
// is 0 (exp gives exactly 0, adding 0 changes neither s nor the fma chain),
// and block 0 of a CSA sequence depends only on its own tokens.
TEST(KvCompress, BlockZeroMaskingIsAbsence) {
  Context ctx;
  for (int64_t c : {2, 4}) {
    const int64_t Dc = 6;
    Problem pr = make_problem(c, true, Dc, {3 * c}, 11);
    const auto masked = run_forward(ctx, pr);
    for (float v : masked) ASSERT_TRUE(std::isfinite(v));
    Problem sentinel = pr;
    sentinel.N += 1;
    std::vector<float> row(sz(pr.width()), 0.0f);
    for (int64_t i = 2 * Dc; i < 3 * Dc; ++i) row[sz(i)] = -kInf;  // Z, previous half
    sentinel.store.insert(sentinel.store.end(), row.begin(), row.end());
    for (auto& r : sentinel.rows)
      if (r < 0) r = int32_t(pr.N);
    const auto with_sentinel = run_forward(ctx, sentinel);
    expect_bits_equal(masked.data(), with_sentinel.data(), int64_t(masked.size()), "masked vs -inf sentinel");

    // Block 0 ignores everything outside its own tokens' second half.
    Problem moved = pr;
    for (int64_t r = 0; r < pr.N; ++r)
      for (int64_t i = 0; i < pr.width(); ++i) {
        const bool own_half = r < c && ((i >= Dc && i < 2 * Dc) || i >= 3 * Dc);
        if (!own_half) moved.store[sz(r * pr.width() + i)] += 3.0f;
      }
    for (int64_t i = 0; i < c * 2 * Dc; ++i)
      if (i % (2 * Dc) < Dc) moved.ape[sz(i)] -= 1.0f;
    const auto got = run_forward(ctx, moved);
    expect_bits_equal(masked.data(), got.data(), Dc, "block 0 sees only its own half");
  }
}

// One entry alone gives the bits it has among many, with 1 or 2 threads.
TEST(KvCompress, ForwardBatchAndThreadInvariant) {
  ThreadPool pool(2);
  Context one, two{&pool};
  for (const Config& cf : kConfigs) {
    Problem pr = make_problem(cf.c, cf.overlap, 80, {4 * cf.c, 3 * cf.c}, 21);
    const auto a = run_forward(one, pr), b = run_forward(two, pr);
    expect_bits_equal(a.data(), b.data(), int64_t(a.size()), ("1 vs 2 threads " + name_of(pr)).c_str());
    for (int64_t e = 0; e < pr.Ne; e += 3) {
      Problem alone = pr;
      alone.rows.assign(pr.rows.begin() + e * pr.P, pr.rows.begin() + (e + 1) * pr.P);
      alone.Ne = 1;
      const auto got = run_forward(two, alone);
      expect_bits_equal(got.data(), a.data() + e * pr.Dc, pr.Dc, ("alone " + name_of(pr)).c_str());
    }
  }
}

TEST(KvCompress, ForwardTakesStridedViews) {
  Context ctx;
  Problem pr = make_problem(4, true, 7, {13}, 31);
  const auto want = run_forward(ctx, pr);
  const int64_t W = pr.width(), ld = W + 5, ldo = pr.Dc + 3, lda = 2 * pr.Dc + 1, ldr = pr.P + 2;
  std::vector<float> store(sz(pr.N * ld), 9.0f), ape(sz(pr.c * lda), 9.0f), out(sz(pr.Ne * ldo));
  std::vector<int32_t> rows(sz(pr.Ne * ldr), 12345);
  for (int64_t r = 0; r < pr.N; ++r) std::copy_n(pr.store.begin() + r * W, W, store.begin() + r * ld);
  for (int64_t r = 0; r < pr.c; ++r)
    std::copy_n(pr.ape.begin() + r * 2 * pr.Dc, 2 * pr.Dc, ape.begin() + r * lda);
  for (int64_t e = 0; e < pr.Ne; ++e) std::copy_n(pr.rows.begin() + e * pr.P, pr.P, rows.begin() + e * ldr);
  Tensor st(store.data(), DType::F32, {pr.N, W}), at(ape.data(), DType::F32, {pr.c, 2 * pr.Dc});
  Tensor rt(rows.data(), DType::I32, {pr.Ne, pr.P}), ot(out.data(), DType::F32, {pr.Ne, pr.Dc});
  st.stride[0] = ld;
  at.stride[0] = lda;
  rt.stride[0] = ldr;
  ot.stride[0] = ldo;
  compress_forward(ctx, ot, st, rt, at, 4, true);
  for (int64_t e = 0; e < pr.Ne; ++e)
    expect_bits_equal(out.data() + e * ldo, want.data() + e * pr.Dc, pr.Dc, "strided");
}

// ------------------------------------------------------------------ backward

// Central differences of L = sum dout * out on the double reference, for every
// element of the store and of ape; the kernel's f32 gradients must match.
TEST(KvCompress, BackwardMatchesFiniteDifferences) {
  Context ctx;
  uint32_t seed = 41;
  for (const Config& cf :
       {Config{4, true}, Config{2, true}, Config{3, false}, Config{1, true}, Config{5, false}}) {
    Problem pr = make_problem(cf.c, cf.overlap, 3, {3 * cf.c + 1, 2 * cf.c}, seed++);
    auto dout = test::randn(pr.Ne * pr.Dc, seed++);
    const Grads g = run_backward(ctx, pr, dout);
    std::vector<double> s = to_double(pr.store), a = to_double(pr.ape);
    const auto loss = [&] {
      const auto y = ref_forward(pr, s, a);
      double l = 0;
      for (size_t i = 0; i < y.size(); ++i) l += double(dout[i]) * y[i];
      return l;
    };
    const double h = 1e-6;
    const auto central = [&](std::vector<double>& x) {
      std::vector<double> d(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        const double x0 = x[i];
        x[i] = x0 + h;
        const double lp = loss();
        x[i] = x0 - h;
        const double lm = loss();
        x[i] = x0;
        d[i] = (lp - lm) / (2 * h);
      }
      return d;
    };
    const std::string what = name_of(pr);
    expect_close(g.dstore, central(s), 2e-5, ("dstore " + what).c_str(), 1e-6);
    expect_close(g.dape, central(a), 2e-5, ("dape " + what).c_str(), 1e-6);
  }
}

// The gradients accumulate into what dstore and dape already hold. In CSA
// every dstore element has exactly one contribution, so its bits are known.
TEST(KvCompress, BackwardAccumulates) {
  Context ctx;
  Problem pr = make_problem(4, true, 5, {12}, 51);
  auto dout = test::randn(pr.Ne * pr.Dc, 52);
  const Grads zero = run_backward(ctx, pr, dout, 0.0f), acc = run_backward(ctx, pr, dout, 0.5f);
  for (size_t i = 0; i < zero.dstore.size(); ++i) ASSERT_EQ(acc.dstore[i], 0.5f + zero.dstore[i]) << i;
  // dape sums over every entry, starting from what it holds, so only close.
  for (size_t i = 0; i < zero.dape.size(); ++i) ASSERT_NEAR(acc.dape[i], 0.5f + zero.dape[i], 1e-5f) << i;
}

// CSA: a token feeds its own block's entry through channels [Dc, 2Dc) and the
// next block's entry through [0, Dc); the last block's tokens only the former.
TEST(KvCompress, CrossBlockGradientFlow) {
  Context ctx;
  const int64_t c = 4, Dc = 3;
  Problem pr = make_problem(c, true, Dc, {3 * c}, 61);  // entries 0, 1, 2
  const int64_t W = pr.width();
  const auto halves = [&](const Grads& g, int64_t row) {  // |grad| over (first half, second half) of C and Z
    double h0 = 0, h1 = 0;
    for (int64_t i = 0; i < W; ++i) (i % (2 * Dc) < Dc ? h0 : h1) += std::fabs(g.dstore[sz(row * W + i)]);
    return std::pair<double, double>(h0, h1);
  };
  for (int64_t only = 0; only < 3; ++only) {
    std::vector<float> dout(sz(pr.Ne * Dc), 0.0f);
    for (int64_t ch = 0; ch < Dc; ++ch) dout[sz(only * Dc + ch)] = 1.0f + float(ch);
    const Grads g = run_backward(ctx, pr, dout);
    for (int64_t row = 0; row < pr.N; ++row) {
      const auto [h0, h1] = halves(g, row);
      const int64_t block = row / c;
      EXPECT_EQ(h0 > 0, block == only - 1) << "entry " << only << " row " << row << " previous half";
      EXPECT_EQ(h1 > 0, block == only) << "entry " << only << " row " << row << " own half";
    }
  }
  // All entries at once: block 1's rows get both halves, block 2's only its own.
  auto dout = test::randn(pr.Ne * Dc, 62);
  const Grads g = run_backward(ctx, pr, dout);
  for (int64_t row = 0; row < pr.N; ++row) {
    const auto [h0, h1] = halves(g, row);
    EXPECT_EQ(h0 > 0, row < 2 * c) << row;
    EXPECT_GT(h1, 0) << row;
  }
}

// A row that several entries reference gets their contributions in entry
// order: the same bits as running the entries one by one into one buffer.
TEST(KvCompress, BackwardAccumulatesInEntryOrder) {
  Context ctx;
  const int64_t c = 3, Dc = 20;
  Problem pr = make_problem(c, false, Dc, {4 * c}, 71);
  // Entries that share rows on the same channels (a layout no model builds,
  // but the order rule is what makes its sums unambiguous); a repeat within
  // one entry adds in slot order.
  pr.rows = {0, 1, 2, 1, 2, 3, 2, 2, 4, 5, 6, 2, 9, 10, 11};
  pr.Ne = 5;
  auto dout = test::randn(pr.Ne * Dc, 72);
  const Grads all = run_backward(ctx, pr, dout, 0.25f);
  Guarded ds(pr.N * pr.width(), 0.25f), da(c * Dc, 0.25f);
  for (int64_t e = 0; e < pr.Ne; ++e) {
    Problem one = pr;
    one.rows.assign(pr.rows.begin() + e * c, pr.rows.begin() + (e + 1) * c);
    one.Ne = 1;
    compress_backward(ctx, ds.tensor({pr.N, pr.width()}), da.tensor({c, Dc}),
                      Tensor(dout.data() + e * Dc, DType::F32, {1, Dc}), one.store_t(), one.rows_t(),
                      one.ape_t(), int(c), false);
  }
  expect_bits_equal(all.dstore.data(), ds.values().data(), int64_t(all.dstore.size()), "dstore entry order");
  expect_bits_equal(all.dape.data(), da.values().data(), int64_t(all.dape.size()), "dape entry order");
}

// The analytic double gradient at the sizes the model uses (c = 4 and 128).
TEST(KvCompress, BackwardMatchesDoubleReference) {
  ThreadPool pool(2);
  Context ctx{&pool};
  for (const Config& cf : {Config{4, true}, Config{128, false}}) {
    Problem pr = make_problem(cf.c, cf.overlap, 70, {3 * cf.c, 2 * cf.c + 1}, 81);
    auto dout = test::randn(pr.Ne * pr.Dc, 82);
    const Grads g = run_backward(ctx, pr, dout);
    std::vector<double> ds(sz(pr.N * pr.width())), da(sz(pr.c * pr.kappa * pr.Dc));
    const int64_t W = pr.width(), KD = pr.kappa * pr.Dc;
    for (int64_t e = 0; e < pr.Ne; ++e)
      for (int64_t ch = 0; ch < pr.Dc; ++ch) {
        std::vector<double> z, v;
        std::vector<int64_t> col, row, arow;
        for (int64_t p = 0; p < pr.P; ++p) {
          const int32_t r = pr.rows[sz(e * pr.P + p)];
          if (r < 0) continue;
          col.push_back((p >= pr.c ? pr.Dc : 0) + ch);
          row.push_back(r);
          arow.push_back(p % pr.c);
          z.push_back(double(pr.store[sz(r * W + KD + col.back())]) +
                      pr.ape[sz(arow.back() * KD + col.back())]);
          v.push_back(pr.store[sz(r * W + col.back())]);
        }
        const double mx = *std::max_element(z.begin(), z.end());
        double s = 0, y = 0;
        for (double x : z) s += std::exp(x - mx);
        for (size_t k = 0; k < z.size(); ++k) y += std::exp(z[k] - mx) / s * v[k];
        const double go = dout[sz(e * pr.Dc + ch)];
        for (size_t k = 0; k < z.size(); ++k) {
          const double w = std::exp(z[k] - mx) / s, dz = go * w * (v[k] - y);
          ds[sz(row[k] * W + col[k])] += go * w;
          ds[sz(row[k] * W + KD + col[k])] += dz;
          da[sz(arow[k] * KD + col[k])] += dz;
        }
      }
    expect_close(g.dstore, ds, 1e-5, ("dstore " + name_of(pr)).c_str(), 1e-7);
    expect_close(g.dape, da, 1e-5, ("dape " + name_of(pr)).c_str(), 1e-7);
  }
}

// Threads split channels; the bits do not depend on that split, and a
// sequence's row gradients do not depend on the other sequences in the batch.
TEST(KvCompress, BackwardBatchAndThreadInvariant) {
  ThreadPool pool(2);
  Context one, two{&pool};
  for (const Config& cf : {Config{4, true}, Config{128, false}, Config{3, true}}) {
    const int64_t len0 = 3 * cf.c + 1;
    Problem pr = make_problem(cf.c, cf.overlap, 80, {len0, 2 * cf.c, 4 * cf.c}, 91);
    auto dout = test::randn(pr.Ne * pr.Dc, 92);
    const Grads a = run_backward(one, pr, dout), b = run_backward(two, pr, dout);
    const std::string what = name_of(pr);
    expect_bits_equal(a.dstore.data(), b.dstore.data(), int64_t(a.dstore.size()),
                      ("dstore threads " + what).c_str());
    expect_bits_equal(a.dape.data(), b.dape.data(), int64_t(a.dape.size()), ("dape threads " + what).c_str());
    // The first sequence alone: its entries are the first len0 / c.
    Problem alone = pr;
    alone.Ne = len0 / cf.c;
    alone.rows.resize(sz(alone.Ne * pr.P));
    std::vector<float> dalone(dout.begin(), dout.begin() + alone.Ne * pr.Dc);
    const Grads s = run_backward(two, alone, dalone);
    expect_bits_equal(s.dstore.data(), a.dstore.data(), len0 * pr.width(), ("dstore alone " + what).c_str());
  }
}

// ------------------------------------------------------------------ errors

TEST(KvCompress, BadArgumentsThrowNamingThem) {
  Context ctx;
  Problem pr = make_problem(4, true, 3, {12}, 101);
  std::vector<float> out(sz(pr.Ne * pr.Dc)), dout(sz(pr.Ne * pr.Dc)), ds(sz(pr.N * pr.width())),
      da(sz(pr.c * 2 * pr.Dc));
  Tensor ot(out.data(), DType::F32, {pr.Ne, pr.Dc}), dt(dout.data(), DType::F32, {pr.Ne, pr.Dc});
  Tensor dst(ds.data(), DType::F32, {pr.N, pr.width()}), dat(da.data(), DType::F32, {pr.c, 2 * pr.Dc});
  const auto fwd = [&](Tensor o, Tensor s, Tensor r, Tensor a, int c, bool ov) {
    return error_of([&] { compress_forward(ctx, o, s, r, a, c, ov); });
  };
  const auto expect_has = [](const std::string& msg, const char* part) {
    EXPECT_NE(msg.find(part), std::string::npos) << "want '" << part << "' in: " << msg;
  };
  EXPECT_EQ(fwd(ot, pr.store_t(), pr.rows_t(), pr.ape_t(), 4, true), "");
  expect_has(fwd(ot, pr.store_t(), pr.rows_t(), pr.ape_t(), 0, true), "ratio");
  expect_has(fwd(ot, pr.store_t(), pr.rows_t(), pr.ape_t(), 4, false), "store");  // width 4*Dc, wants 2*Dc
  expect_has(fwd(ot, pr.store_t(), pr.rows_t(), pr.ape_t(), 2, true), "rows");    // P = 8, wants 4
  Tensor wide_out(out.data(), DType::F32, {pr.Ne, 2});
  expect_has(fwd(wide_out, pr.store_t(), pr.rows_t(), pr.ape_t(), 4, true), "store");
  Tensor short_out(out.data(), DType::F32, {pr.Ne - 1, pr.Dc});
  expect_has(fwd(short_out, pr.store_t(), pr.rows_t(), pr.ape_t(), 4, true), "out");
  Tensor ape_bad(pr.ape.data(), DType::F32, {3, 2 * pr.Dc});
  expect_has(fwd(ot, pr.store_t(), pr.rows_t(), ape_bad, 4, true), "ape");
  Tensor rows_f32(pr.rows.data(), DType::F32, {pr.Ne, pr.P});
  expect_has(fwd(ot, pr.store_t(), rows_f32, pr.ape_t(), 4, true), "rows");
  Tensor store_i32(pr.store.data(), DType::I32, {pr.N, pr.width()});
  expect_has(fwd(ot, store_i32, pr.rows_t(), pr.ape_t(), 4, true), "store");
  Problem bad = pr;
  bad.rows[5] = int32_t(pr.N);
  expect_has(fwd(ot, bad.store_t(), bad.rows_t(), bad.ape_t(), 4, true), "entry 0 slot 5");
  bad.rows[5] = -2;
  expect_has(fwd(ot, bad.store_t(), bad.rows_t(), bad.ape_t(), 4, true), "outside [-1");
  bad = pr;
  for (int64_t p = 4; p < 8; ++p) bad.rows[sz(p)] = -1;
  expect_has(fwd(ot, bad.store_t(), bad.rows_t(), bad.ape_t(), 4, true), "every slot masked");
  expect_has(error_of([&] {
               compress_backward(ctx, dst, dat, dt, bad.store_t(), bad.rows_t(), bad.ape_t(), 4, true);
             }),
             "every slot masked");

  const auto bwd = [&](Tensor s, Tensor a, Tensor g) {
    return error_of([&] { compress_backward(ctx, s, a, g, pr.store_t(), pr.rows_t(), pr.ape_t(), 4, true); });
  };
  EXPECT_EQ(bwd(dst, dat, dt), "");
  expect_has(bwd(Tensor(ds.data(), DType::F32, {pr.N - 1, pr.width()}), dat, dt), "dstore");
  expect_has(bwd(dst, Tensor(da.data(), DType::F32, {pr.c, pr.Dc}), dt), "dape");
  expect_has(bwd(dst, dat, Tensor(dout.data(), DType::F32, {pr.Ne + 1, pr.Dc})), "dout");
  Tensor overlapping = pr.store_t();
  overlapping.stride[0] = 2;
  expect_has(fwd(ot, overlapping, pr.rows_t(), pr.ape_t(), 4, true), "stride");
}

// ------------------------------------------------------------------ indexer

struct IndexerCase {
  int64_t T, HI, DI, N, C, K;
  std::vector<float> q, w, keys;  // (T, HI, DI), (T, HI), (N, DI)
  std::vector<int32_t> cand;      // (T, C)
};

// Query t sees valid[t] entries (rows drawn at random, repeats allowed), then -1.
IndexerCase make_indexer(int64_t T, int64_t HI, int64_t DI, int64_t N, int64_t C, int64_t K, uint32_t seed) {
  IndexerCase ic{T,
                 HI,
                 DI,
                 N,
                 C,
                 K,
                 test::randn(T * HI * DI, seed),
                 test::uniform(T * HI, seed + 1, -0.2f, 1.0f),
                 test::randn(N * DI, seed + 2),
                 std::vector<int32_t>(sz(T * C), -1)};
  std::mt19937 g(seed + 3);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t valid = int64_t(g() % uint32_t(C + 1));
    for (int64_t j = 0; j < valid; ++j) ic.cand[sz(t * C + j)] = int32_t(g() % uint32_t(N));
  }
  return ic;
}

struct IndexerOut {
  std::vector<int32_t> selected;
  std::vector<float> scores;
};

IndexerOut run_indexer(const Context& ctx, IndexerCase& ic, bool want_scores = true) {
  IndexerOut r{std::vector<int32_t>(sz(ic.T * ic.K), 777), std::vector<float>(sz(ic.T * ic.C), 5.0f)};
  Tensor scores = want_scores ? Tensor(r.scores.data(), DType::F32, {ic.T, ic.C}) : Tensor();
  indexer_select(
      ctx, Tensor(r.selected.data(), DType::I32, {ic.T, ic.K}), scores,
      Tensor(ic.q.data(), DType::F32, {ic.T, ic.HI, ic.DI}), Tensor(ic.w.data(), DType::F32, {ic.T, ic.HI}),
      Tensor(ic.keys.data(), DType::F32, {ic.N, ic.DI}), Tensor(ic.cand.data(), DType::I32, {ic.T, ic.C}));
  return r;
}

// The selection rule written plainly: rank every valid column by (score
// descending, column ascending), keep the first min(K, valid), sort them.
std::vector<int32_t> ref_select(const IndexerCase& ic, const std::vector<float>& scores, int64_t t) {
  std::vector<int32_t> cols;
  for (int64_t j = 0; j < ic.C && ic.cand[sz(t * ic.C + j)] >= 0; ++j) cols.push_back(int32_t(j));
  const float* s = scores.data() + t * ic.C;
  std::stable_sort(cols.begin(), cols.end(), [&](int32_t a, int32_t b) { return s[a] > s[b]; });
  cols.resize(std::min<size_t>(cols.size(), sz(ic.K)));
  std::sort(cols.begin(), cols.end());
  cols.resize(sz(ic.K), -1);
  return cols;
}

TEST(Indexer, ScoresMatchDoubleReferenceAndSelectionFollowsTheRule) {
  ThreadPool pool(2);
  Context ctx{&pool};
  uint32_t seed = 201;
  for (int64_t DI : {1, 16, 37, 128})
    for (int64_t K : {1, 5, 40}) {
      IndexerCase ic = make_indexer(9, 4, DI, 30, 24, K, seed++);
      const IndexerOut got = run_indexer(ctx, ic);
      std::vector<float> recipe(sz(ic.T * ic.C), -kInf);
      for (int64_t t = 0; t < ic.T; ++t) {
        for (int64_t j = 0; j < ic.C; ++j) {
          const int32_t r = ic.cand[sz(t * ic.C + j)];
          if (r < 0) {
            EXPECT_EQ(got.scores[sz(t * ic.C + j)], -kInf) << "padding t=" << t << " j=" << j;
            continue;
          }
          double want = 0, scale = 0;
          float acc = 0.0f;
          for (int64_t h = 0; h < ic.HI; ++h) {
            const float* q = ic.q.data() + (t * ic.HI + h) * DI;
            const float* k = ic.keys.data() + r * DI;
            double dot = 0, mag = 0;
            for (int64_t i = 0; i < DI; ++i) {
              dot += double(q[i]) * k[i];
              mag += std::fabs(double(q[i]) * k[i]);
            }
            const double wh = ic.w[sz(t * ic.HI + h)];
            want += wh * std::max(dot, 0.0);
            scale += std::fabs(wh) * mag;
            acc = std::fma(ic.w[sz(t * ic.HI + h)], std::max(canonical_dot(q, k, DI), 0.0f), acc);
          }
          recipe[sz(t * ic.C + j)] = acc;
          const float s = got.scores[sz(t * ic.C + j)];
          EXPECT_NEAR(s, want, 2e-6 * scale + 1e-30) << "t=" << t << " j=" << j;
          EXPECT_EQ(s, acc) << "header recipe t=" << t << " j=" << j;
        }
        const auto want_sel = ref_select(ic, recipe, t);
        const std::vector<int32_t> sel(got.selected.begin() + t * K, got.selected.begin() + (t + 1) * K);
        EXPECT_EQ(sel, want_sel) << "t=" << t << " DI=" << DI << " K=" << K;
      }
    }
}

TEST(Indexer, TiesGoToTheLowerColumnAndPaddingIsMinusOne) {
  Context ctx;
  // Candidates repeat rows, so scores tie exactly; rows 0 and 1 have dot <= 0
  // with every head (score 0 after ReLU), row 2 scores higher than row 3.
  IndexerCase ic{1, 2, 2, 4, 9, 4, {1, 0, 0, 1}, {0.5f, 0.25f}, {-1, 0, 0, -2, 3, 1, 1, 1}, {}};
  ic.cand = {3, 0, 2, 1, 3, 2, 0, 3, -1};
  IndexerOut got = run_indexer(ctx, ic);
  // Scores: row 3 = 0.5 + 0.25 = 0.75, row 2 = 1.5 + 0.25 = 1.75, rows 0 and 1 = 0.
  const std::vector<float> want_scores = {0.75f, 0, 1.75f, 0, 0.75f, 1.75f, 0, 0.75f, -kInf};
  EXPECT_EQ(got.scores, want_scores);
  // Best: columns 2, 5 (row 2), then the row-3 ties 0, 4, 7 keep the lower two: 0 and 4.
  EXPECT_EQ(got.selected, (std::vector<int32_t>{0, 2, 4, 5}));

  // All scores tie (zero): the first K columns.
  IndexerCase zero = ic;
  zero.cand = {0, 1, 0, 1, 1, 0, -1, -1, -1};
  EXPECT_EQ(run_indexer(ctx, zero).selected, (std::vector<int32_t>{0, 1, 2, 3}));

  // K > valid: every valid column, ascending, then -1; no candidate at all: all -1.
  IndexerCase few = ic;
  few.T = 2;
  few.K = 6;
  few.q.insert(few.q.end(), ic.q.begin(), ic.q.end());
  few.w.insert(few.w.end(), ic.w.begin(), ic.w.end());
  few.cand = {2, 0, 3, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
  got = run_indexer(ctx, few);
  EXPECT_EQ(got.selected, (std::vector<int32_t>{0, 1, 2, -1, -1, -1, -1, -1, -1, -1, -1, -1}));
  for (int64_t j = 3; j < 18; ++j) EXPECT_EQ(got.scores[sz(j)], -kInf) << j;
  // Without a scores tensor the selection is the same.
  EXPECT_EQ(run_indexer(ctx, few, false).selected, got.selected);
}

// A query's selection depends on its own inputs only, whatever the threads.
TEST(Indexer, BatchAndThreadInvariant) {
  ThreadPool pool(2);
  Context one, two{&pool};
  IndexerCase ic = make_indexer(12, 3, 24, 40, 30, 7, 301);
  const IndexerOut a = run_indexer(one, ic), b = run_indexer(two, ic);
  EXPECT_EQ(a.selected, b.selected);
  expect_bits_equal(a.scores.data(), b.scores.data(), int64_t(a.scores.size()), "scores threads");
  for (int64_t t = 0; t < ic.T; t += 5) {
    IndexerCase alone = ic;
    alone.T = 1;
    alone.q.assign(ic.q.begin() + t * ic.HI * ic.DI, ic.q.begin() + (t + 1) * ic.HI * ic.DI);
    alone.w.assign(ic.w.begin() + t * ic.HI, ic.w.begin() + (t + 1) * ic.HI);
    alone.cand.assign(ic.cand.begin() + t * ic.C, ic.cand.begin() + (t + 1) * ic.C);
    const IndexerOut s = run_indexer(two, alone);
    EXPECT_EQ(s.selected,
              std::vector<int32_t>(a.selected.begin() + t * ic.K, a.selected.begin() + (t + 1) * ic.K));
    expect_bits_equal(s.scores.data(), a.scores.data() + t * ic.C, ic.C, "scores alone");
  }
}

TEST(Indexer, BadArgumentsThrowNamingThem) {
  Context ctx;
  IndexerCase ic = make_indexer(3, 2, 8, 10, 5, 2, 401);
  std::vector<int32_t> sel(sz(ic.T * ic.K));
  std::vector<float> sc(sz(ic.T * ic.C));
  Tensor q(ic.q.data(), DType::F32, {ic.T, ic.HI, ic.DI}), w(ic.w.data(), DType::F32, {ic.T, ic.HI});
  Tensor k(ic.keys.data(), DType::F32, {ic.N, ic.DI}), cand(ic.cand.data(), DType::I32, {ic.T, ic.C});
  Tensor st(sel.data(), DType::I32, {ic.T, ic.K}), sct(sc.data(), DType::F32, {ic.T, ic.C});
  const auto call = [&](Tensor s, Tensor scr, Tensor qq, Tensor ww, Tensor kk, Tensor cc) {
    return error_of([&] { indexer_select(ctx, s, scr, qq, ww, kk, cc); });
  };
  const auto expect_has = [](const std::string& msg, const char* part) {
    EXPECT_NE(msg.find(part), std::string::npos) << "want '" << part << "' in: " << msg;
  };
  EXPECT_EQ(call(st, sct, q, w, k, cand), "");
  expect_has(call(st, sct, Tensor(ic.q.data(), DType::F32, {ic.T, ic.HI * ic.DI}), w, k, cand), "qi");
  expect_has(call(st, sct, q, Tensor(ic.w.data(), DType::F32, {ic.T, ic.HI + 1}), k, cand), "w (T, HI)");
  expect_has(call(st, sct, q, w, Tensor(ic.keys.data(), DType::F32, {ic.N, ic.DI - 1}), cand), "keys");
  expect_has(call(st, sct, q, w, k, Tensor(ic.cand.data(), DType::F32, {ic.T, ic.C})), "cand");
  expect_has(call(Tensor(sel.data(), DType::F32, {ic.T, ic.K}), sct, q, w, k, cand), "selected");
  expect_has(call(Tensor(sel.data(), DType::I32, {ic.T - 1, ic.K}), sct, q, w, k, cand), "selected");
  expect_has(call(st, Tensor(sc.data(), DType::F32, {ic.T, ic.C - 1}), q, w, k, cand), "scores");
  IndexerCase bad = ic;
  bad.cand = {0, 1, -1, 2, -1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  expect_has(call(st, sct, q, w, k, Tensor(bad.cand.data(), DType::I32, {ic.T, ic.C})), "after -1 padding");
  bad.cand = {0, 1, 10, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  expect_has(call(st, sct, q, w, k, Tensor(bad.cand.data(), DType::I32, {ic.T, ic.C})), "outside [-1, 10)");
}

}  // namespace
}  // namespace lockstep::kernels
