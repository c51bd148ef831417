// The row-wise adds and the sigmoid (kernels/cpu/rows.h) against plain
// double-precision references: one add (or one product then one add) of f32
// values computed in double and rounded once is the correctly rounded f32
// result, so those must match bit for bit; the sigmoid within a few ulps.
// Also: strided rows, aliasing, batch and thread invariance, shape errors.
#include "lockstep/kernels/cpu/rows.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "lockstep/base/error.h"

namespace lockstep::kernels {
namespace {

inline size_t sz(int64_t n) {
  return static_cast<size_t>(n);
}

// (T, N) view of p with row stride ld.
Tensor rows(float* p, int64_t T, int64_t N, int64_t ld) {
  Tensor t(p, DType::F32, {T, N});
  t.stride[0] = ld;
  return t;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Rows, AddRowBiasMatchesDoubleReferenceOnStridedRows) {
  ThreadPool pool(2);
  Context ctx{&pool};
  for (int64_t N : {1, 7, 33, 130})
    for (int64_t T : {1, 5, 64}) {
      const int64_t ld = N + 3;
      std::vector<float> y = test::randn(T * ld, uint32_t(T * 100 + N), 4.0f);
      const std::vector<float> b = test::randn(N, uint32_t(N), 2.0f), y0 = y;
      add_row_bias(ctx, rows(y.data(), T, N, ld), Tensor(const_cast<float*>(b.data()), DType::F32, {N}));
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < ld; ++j) {
          const size_t i = sz(t * ld + j);
          const float want = j < N ? float(double(y0[i]) + double(b[sz(j)])) : y0[i];  // padding untouched
          ASSERT_EQ(y[i], want) << "T=" << T << " N=" << N << " t=" << t << " j=" << j;
        }
    }
}

TEST(Rows, AddRowsMatchesDoubleReferenceAndMayAlias) {
  ThreadPool pool(2);
  Context ctx{&pool};
  const int64_t T = 9, N = 45, ld = 50;
  const std::vector<float> a = test::randn(T * ld, 3, 5.0f), b = test::randn(T * N, 4, 5.0f);
  for (int alias : {0, 1}) {
    std::vector<float> av = a, bv = b, out(sz(T * N), -1.0f);
    Tensor at = rows(av.data(), T, N, ld), bt = rows(bv.data(), T, N, N);
    add_rows(ctx, alias == 1 ? at : rows(out.data(), T, N, N), at, bt);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < N; ++j) {
        const float want = float(double(a[sz(t * ld + j)]) + double(b[sz(t * N + j)]));
        const float got = alias == 1 ? av[sz(t * ld + j)] : out[sz(t * N + j)];
        ASSERT_EQ(got, want) << "alias=" << alias << " t=" << t << " j=" << j;
      }
  }
}

TEST(Rows, AddScaledRowsRoundsTheProductThenAdds) {
  ThreadPool pool(2);
  Context ctx{&pool};
  const int64_t T = 11, N = 37;
  const std::vector<float> y0 = test::randn(T * N, 5, 3.0f), x = test::randn(T * N, 6, 3.0f),
                           s = test::uniform(T, 7, 0.0f, 1.0f);
  for (bool gated : {true, false}) {
    std::vector<float> y = y0, xv = x, sv = s;
    add_scaled_rows(ctx, rows(y.data(), T, N, N), rows(xv.data(), T, N, N),
                    gated ? Tensor(sv.data(), DType::F32, {T}) : Tensor());
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < N; ++j) {
        const size_t i = sz(t * N + j);
        const float term = gated ? float(double(x[i]) * double(s[sz(t)])) : x[i];
        ASSERT_EQ(y[i], float(double(y0[i]) + double(term))) << "gated=" << gated << " t=" << t << " j=" << j;
      }
  }
}

TEST(Rows, SigmoidMatchesDoubleReference) {
  Context ctx;
  std::vector<float> x = test::randn(1000, 8, 8.0f);
  x.insert(x.end(), {0.0f, -0.0f, 20.0f, -20.0f, 88.0f, -88.0f, -104.0f});
  std::vector<float> y(x.size());
  const int64_t n = int64_t(x.size());
  sigmoid_forward(ctx, Tensor(y.data(), DType::F32, {n}), Tensor(x.data(), DType::F32, {n, 1}));
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = 1.0 / (1.0 + std::exp(-double(x[i])));
    // A few ulps of the result, or an absolute 1e-37 where it underflows.
    ASSERT_NEAR(double(y[i]), want, 4.0 * std::ldexp(1.0, -23) * want + 1e-37) << "x=" << x[i];
  }
}

// Row t's result does not depend on the other rows or the thread count.
TEST(Rows, BatchAndThreadInvariant) {
  ThreadPool one(1), two(2);
  Context c1{&one}, c2{&two};
  const int64_t T = 33, N = 70;
  const std::vector<float> y0 = test::randn(T * N, 9), x = test::randn(T * N, 10), s = test::randn(T, 11),
                           b = test::randn(N, 12);
  std::vector<float> all = y0, xv = x, sv = s, bv = b;
  Tensor bias(bv.data(), DType::F32, {N});
  add_row_bias(c2, rows(all.data(), T, N, N), bias);
  add_rows(c2, rows(all.data(), T, N, N), rows(all.data(), T, N, N), rows(xv.data(), T, N, N));
  add_scaled_rows(c2, rows(all.data(), T, N, N), rows(xv.data(), T, N, N),
                  Tensor(sv.data(), DType::F32, {T}));
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> row(y0.begin() + t * N, y0.begin() + (t + 1) * N);
    Tensor r = rows(row.data(), 1, N, N), xr = rows(xv.data() + t * N, 1, N, N);
    add_row_bias(c1, r, bias);
    add_rows(c1, r, r, xr);
    add_scaled_rows(c1, r, xr, Tensor(sv.data() + t, DType::F32, {1}));
    test::expect_bits_equal(row.data(), all.data() + t * N, N, "row alone vs in the batch");
  }
}

TEST(Rows, ShapeErrorsNameTheOperand) {
  Context ctx;
  std::vector<float> a(64), b(64);
  const Tensor y(a.data(), DType::F32, {4, 8}), x_bad(b.data(), DType::F32, {4, 7});
  EXPECT_NE(
      error_of([&] { add_row_bias(ctx, y, Tensor(b.data(), DType::F32, {7})); }).find("add_row_bias: bias"),
      std::string::npos);
  EXPECT_NE(error_of([&] { add_rows(ctx, y, y, x_bad); }).find("add_rows: b"), std::string::npos);
  EXPECT_NE(error_of([&] { add_scaled_rows(ctx, y, y, Tensor(b.data(), DType::F32, {3})); }).find("T = 4"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              sigmoid_forward(ctx, Tensor(a.data(), DType::F32, {5}), x_bad);
            }).find("sigmoid_forward"),
            std::string::npos);
}

}  // namespace
}  // namespace lockstep::kernels
