// Tests for the GEMM kernels: double-precision references for X·Wᵀ, dY·W and
// dYᵀ·X in every weight storage, bit-exact agreement with the numerics contract
// (one std::fma chain per output), batch and thread invariance, accumulate,
// row strides, sentinel guards, adjoint identities and error messages.
#include "lockstep/kernels/cpu/gemm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/test_util.h"
#include "lockstep/base/thread_pool.h"
#include "lockstep/kernels/cpu/wide.h"

namespace lockstep::kernels {
namespace {

using test::expect_bits_equal;
using test::Guarded;
using test::randn;

// A weight storage to test: dtype plus fp8 block (0 = per tensor).
struct Storage {
  DType dtype;
  int64_t block;
  std::string name() const {
    return std::string(dtype_name(dtype)) + (dtype == DType::FP8E4M3 ? "/block" + std::to_string(block) : "");
  }
};
const std::vector<Storage> kStorages = {
    {DType::F32, 0}, {DType::BF16, 0}, {DType::FP8E4M3, 0}, {DType::FP8E4M3, 32}};

// A row-major f32 matrix with a row stride `ld` >= cols (the gap is filled with
// a sentinel NaN that must never be written or read into a result).
struct Mat {
  int64_t rows = 0, cols = 0, ld = 0;
  std::vector<float> v;
  Mat(int64_t r, int64_t c, int64_t pad = 0) : rows(r), cols(c), ld(c + pad), v(static_cast<size_t>(r * (c + pad))) {
    float nan;
    std::memcpy(&nan, &Guarded::kSentinel, 4);
    for (auto& x : v) x = nan;
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j) at(i, j) = 0.0f;
  }
  float& at(int64_t i, int64_t j) { return v[static_cast<size_t>(i * ld + j)]; }
  float at(int64_t i, int64_t j) const { return v[static_cast<size_t>(i * ld + j)]; }
  Tensor t() {
    Tensor x(v.data(), DType::F32, {rows, cols});
    x.stride[0] = ld;
    return x;
  }
  void fill_randn(uint32_t seed) {
    auto r = randn(rows * cols, seed);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) at(i, j) = r[static_cast<size_t>(i * cols + j)];
  }
  std::vector<float> dense() const {
    std::vector<float> d(static_cast<size_t>(rows * cols));
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) d[static_cast<size_t>(i * cols + j)] = at(i, j);
    return d;
  }
  // The gap between rows still holds the sentinel.
  void check_gaps(const char* what) const {
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = cols; j < ld; ++j) {
        uint32_t u;
        std::memcpy(&u, &v[static_cast<size_t>(i * ld + j)], 4);
        ASSERT_EQ(u, Guarded::kSentinel) << what << ": wrote into the row gap at (" << i << ", " << j << ")";
      }
  }
};

std::vector<float> unpack(const PackedWeight& pw) {
  std::vector<float> w(static_cast<size_t>(pw.n * pw.k));
  unpack_weight(Context{}, Tensor(w.data(), DType::F32, {pw.n, pw.k}), pw);
  return w;
}

// ---------------------------------------------------------------------------
// References. The contract reference is the definition itself: one float FMA
// chain per output over the reduction index, then y = y + chain if accumulating.

// y (M,N) from x (M,K) and w (N,K), all dense.
std::vector<float> contract_xwt(const std::vector<float>& x, const std::vector<float>& w, int64_t M, int64_t N,
                                int64_t K, const std::vector<float>* y0) {
  std::vector<float> y(static_cast<size_t>(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) acc = std::fma(x[m * K + k], w[n * K + k], acc);
      y[m * N + n] = y0 ? (*y0)[m * N + n] + acc : acc;
    }
  return y;
}

// dx (M,K) = dy (M,N) · w (N,K): chain over n.
std::vector<float> contract_dyw(const std::vector<float>& dy, const std::vector<float>& w, int64_t M, int64_t N,
                                int64_t K, const std::vector<float>* y0) {
  std::vector<float> dx(static_cast<size_t>(M * K));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) {
      float acc = 0.0f;
      for (int64_t n = 0; n < N; ++n) acc = std::fma(dy[m * N + n], w[n * K + k], acc);
      dx[m * K + k] = y0 ? (*y0)[m * K + k] + acc : acc;
    }
  return dx;
}

// dw (N,K) = dy (M,N)ᵀ · x (M,K): chain over m.
std::vector<float> contract_dytx(const std::vector<float>& dy, const std::vector<float>& x, int64_t M, int64_t N,
                                 int64_t K, const std::vector<float>* y0) {
  std::vector<float> dw(static_cast<size_t>(N * K));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      float acc = 0.0f;
      for (int64_t m = 0; m < M; ++m) acc = std::fma(dy[m * N + n], x[m * K + k], acc);
      dw[n * K + k] = y0 ? (*y0)[n * K + k] + acc : acc;
    }
  return dw;
}

// Double-precision check of c (R,C) = sum_t a(r,t) b(t,c): each element must be
// within the sequential-FMA error bound (T + 2) * 2^-24 * sum_t |a b|.
template <typename A, typename B>
void expect_near_double(const std::vector<float>& got, int64_t R, int64_t C, int64_t T, A a, B b, const std::string& what) {
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) {
      double s = 0, sa = 0;
      for (int64_t t = 0; t < T; ++t) {
        const double p = double(a(r, t)) * double(b(t, c));
        s += p;
        sa += std::fabs(p);
      }
      const double tol = double(T + 2) * std::ldexp(1.0, -24) * sa + 1e-30;
      ASSERT_LE(std::fabs(double(got[r * C + c]) - s), tol) << what << " at (" << r << ", " << c << ")";
    }
}

// ---------------------------------------------------------------------------
// Packing

TEST(GemmPack, UnpackGivesTheStoredValues) {
  const Context ctx;
  for (auto [N, K] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {37, 70}, {16, 64}, {5, 129}}) {
    Mat w(N, K, 3);
    w.fill_randn(static_cast<uint32_t>(N * 1000 + K));
    w.at(0, 0) = 0.0f;
    if (N * K > 4) w.at(N - 1, K - 1) = 1e-9f;  // an e4m3 subnormal after scaling
    const std::vector<float> wd = w.dense();
    for (const Storage& s : kStorages) {
      SCOPED_TRACE(s.name() + " N=" + std::to_string(N) + " K=" + std::to_string(K));
      PackedWeight pw = pack_weight(ctx, w.t(), s.dtype, s.block);
      EXPECT_EQ(pw.n, N);
      EXPECT_EQ(pw.k, K);
      const std::vector<float> got = unpack(pw);
      std::vector<float> want(wd.size());
      if (s.dtype == DType::F32) {
        want = wd;
      } else if (s.dtype == DType::BF16) {
        for (size_t i = 0; i < wd.size(); ++i) want[i] = round_bf16(wd[i]);
      } else {
        // Independent recomputation: scale = the smallest power of two with
        // absmax / scale <= 448, per block; q = e4m3(w / scale).
        const int64_t bn = s.block ? s.block : N, bk = s.block ? s.block : K;
        for (int64_t n = 0; n < N; ++n)
          for (int64_t k = 0; k < K; ++k) {
            float amax = 0;
            for (int64_t i = n / bn * bn; i < std::min(N, n / bn * bn + bn); ++i)
              for (int64_t j = k / bk * bk; j < std::min(K, k / bk * bk + bk); ++j) amax = std::max(amax, std::fabs(wd[i * K + j]));
            float scale = 1.0f;
            if (amax > 0) {
              scale = std::ldexp(1.0f, -126);
              while (amax / scale > 448.0f) scale *= 2.0f;
            }
            want[n * K + k] = fp8_to_f32(f32_to_fp8(wd[n * K + k] / scale, true)) * scale;
            // The stored scale is halved (codes doubled, same values) when the
            // block's largest code would be 224, so it is in [240, 448].
            if (amax > 0 && fp8_to_f32(f32_to_fp8(amax / scale, true)) <= 224.0f) scale *= 0.5f;
            EXPECT_EQ(pw.fp8_scale(n, k), scale);
          }
      }
      expect_bits_equal(got.data(), want.data(), N * K, "unpacked weight");
    }
  }
}

// A fused (q | k | v) matrix with row segments {0, 200, 248}, 128 x 128
// blocks and sizes that are not multiples of 128: every element's scale is
// that of its own tensor's block (rows counted from the tensor's first row),
// computed here from scratch, and the values are e4m3(w / s0) * s0 of that
// block. k is 8 times larger, so a block straddling q and k (what packing
// without segments does) gets another scale: the negative control.
TEST(GemmPack, RowSegmentsRestartTheScaleBlocks) {
  const Context ctx;
  const int64_t K = 130, B = 128;
  const std::vector<int64_t> seg = {0, 200, 248}, ends = {200, 248, 296};
  const int64_t N = ends.back();
  Mat w(N, K);
  w.fill_randn(21);
  for (int64_t n = 200; n < 248; ++n)
    for (int64_t k = 0; k < K; ++k) w.at(n, k) *= 8.0f;
  const PackedWeight pw = pack_weight(ctx, w.t(), DType::FP8E4M3, B, seg);
  EXPECT_EQ(pw.scale_blocks_n(), 2 + 1 + 1);
  const std::vector<float> got = unpack(pw);
  int64_t straddling_differs = 0;
  const PackedWeight plain = pack_weight(ctx, w.t(), DType::FP8E4M3, B);
  for (size_t t = 0; t < seg.size(); ++t)
    for (int64_t n = seg[t]; n < ends[t]; ++n)
      for (int64_t k = 0; k < K; ++k) {
        const int64_t r0 = seg[t] + (n - seg[t]) / B * B, r1 = std::min(ends[t], r0 + B);
        const int64_t c0 = k / B * B, c1 = std::min(K, c0 + B);
        float amax = 0;
        for (int64_t i = r0; i < r1; ++i)
          for (int64_t j = c0; j < c1; ++j) amax = std::max(amax, std::fabs(w.at(i, j)));
        float s0 = std::ldexp(1.0f, -126);
        while (amax / s0 > 448.0f) s0 *= 2.0f;
        const float stored = fp8_to_f32(f32_to_fp8(amax / s0, true)) <= 224.0f ? s0 * 0.5f : s0;
        ASSERT_EQ(pw.fp8_scale(n, k), stored) << "(" << n << ", " << k << ")";
        const float want = fp8_to_f32(f32_to_fp8(w.at(n, k) / s0, true)) * s0;
        ASSERT_EQ(f32_bits(got[static_cast<size_t>(n * K + k)]), f32_bits(want)) << "(" << n << ", " << k << ")";
        straddling_differs += plain.fp8_scale(n, k) != stored;
      }
  EXPECT_GT(straddling_differs, 0) << "the control: blocks over the fused rows must differ somewhere";
  // A repack keeps the segments; bad segments are refused.
  PackedWeight again = pack_weight(ctx, w.t(), DType::FP8E4M3, B, seg);
  repack_weight(ctx, again, w.t());
  ASSERT_EQ(std::memcmp(again.data.data(), pw.data.data(), pw.data.size()), 0);
  ASSERT_EQ(std::memcmp(again.block_scales.data(), pw.block_scales.data(), pw.block_scales.size()), 0);
  EXPECT_THROW(pack_weight(ctx, w.t(), DType::FP8E4M3, B, {1, 200}), Error);
  EXPECT_THROW(pack_weight(ctx, w.t(), DType::FP8E4M3, B, {0, 200, 200}), Error);
  EXPECT_THROW(pack_weight(ctx, w.t(), DType::FP8E4M3, B, {0, N}), Error);
}

TEST(GemmPack, Bf16InputIsKeptExactly) {
  const Context ctx;
  const int64_t N = 19, K = 33;
  auto f = randn(N * K, 5);
  std::vector<bf16_t> h(f.size());
  convert_f32_to_bf16(f.data(), h.data(), f.size());
  const Tensor wt(h.data(), DType::BF16, {N, K});
  for (DType st : {DType::F32, DType::BF16}) {
    const std::vector<float> got = unpack(pack_weight(ctx, wt, st));
    for (size_t i = 0; i < h.size(); ++i) ASSERT_EQ(f32_bits(got[i]), f32_bits(bf16_to_f32(h[i]))) << i;
  }
}

TEST(GemmPack, RepackMatchesAFreshPack) {
  const Context ctx;
  for (const Storage& s : kStorages) {
    Mat w(40, 50);
    w.fill_randn(1);
    PackedWeight pw = pack_weight(ctx, w.t(), s.dtype, s.block);
    w.fill_randn(2);
    repack_weight(ctx, pw, w.t());
    const PackedWeight fresh = pack_weight(ctx, w.t(), s.dtype, s.block);
    ASSERT_EQ(pw.data.size(), fresh.data.size());
    EXPECT_EQ(std::memcmp(pw.data.data(), fresh.data.data(), pw.data.size()), 0) << s.name();
    const auto a = unpack(pw), b = unpack(fresh);
    expect_bits_equal(a.data(), b.data(), 40 * 50, "repacked");
  }
}

TEST(GemmPack, PreQuantizedFp8MatchesPackWeight) {
  const Context ctx;
  const int64_t N = 70, K = 45, B = 32;
  Mat w(N, K);
  w.fill_randn(9);
  const PackedWeight ref = pack_weight(ctx, w.t(), DType::FP8E4M3, B);
  const int64_t NB = ref.scale_blocks_n(), KB = ref.scale_blocks_k();
  ASSERT_EQ(NB, 3);
  ASSERT_EQ(KB, 2);
  std::vector<fp8_t> q(static_cast<size_t>(N * K));
  std::vector<float> sc(static_cast<size_t>(NB * KB));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) q[n * K + k] = f32_to_fp8(w.at(n, k) / ref.fp8_scale(n, k), true);
  for (int64_t i = 0; i < NB; ++i)
    for (int64_t j = 0; j < KB; ++j) sc[i * KB + j] = ref.fp8_scale(i * B, j * B);
  const PackedWeight pw =
      pack_weight_fp8(ctx, Tensor(q.data(), DType::FP8E4M3, {N, K}), Tensor(sc.data(), DType::F32, {NB, KB}), B);
  const auto a = unpack(pw), b = unpack(ref);
  expect_bits_equal(a.data(), b.data(), N * K, "pre-quantized");
  q[5] = 0x7f;  // e4m3 NaN
  EXPECT_THROW(pack_weight_fp8(ctx, Tensor(q.data(), DType::FP8E4M3, {N, K}), Tensor(sc.data(), DType::F32, {NB, KB}), B),
               Error);
}

TEST(GemmPack, RejectsWhatFp8CannotHold) {
  const Context ctx;
  Mat w(4, 4);
  w.fill_randn(3);
  w.at(2, 1) = std::nanf("");
  try {
    pack_weight(ctx, w.t(), DType::FP8E4M3);
    FAIL() << "NaN weight accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("(2, 1)"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(pack_weight(ctx, w.t(), DType::BF16));
  w.at(2, 1) = 2e5f;  // needs a scale of 512 > 2^7
  EXPECT_THROW(pack_weight(ctx, w.t(), DType::FP8E4M3), Error);
  EXPECT_THROW(pack_weight(ctx, w.t(), DType::I32), Error);
  Mat w2(4, 5);
  PackedWeight pw = pack_weight(ctx, w2.t(), DType::F32);
  try {
    repack_weight(ctx, pw, w.t());
    FAIL() << "shape mismatch accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("(4, 4) f32"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(4, 5)"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------------------
// MXFP4: fp8 storage holding e2m1 values with one power-of-two scale per 32

// The MXFP4 value of w[n, k], from the rule's definition in double: the
// group's scale s is the smallest power of two (at least 2^-127) with
// amax / s <= 6, the value the e2m1 grid point nearest w / s (ties to the
// even code) times s.
double mxfp4_reference(const Mat& w, int64_t n, int64_t k) {
  static const double kGrid[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  const int64_t g0 = k / 32 * 32;
  double amax = 0;
  for (int64_t i = g0; i < g0 + 32; ++i) amax = std::max(amax, std::fabs(double(w.at(n, i))));
  double s = std::ldexp(1.0, -127);
  while (amax / s > 6) s *= 2;
  const double a = std::fabs(double(w.at(n, k))) / s;
  int best = 0;
  for (int i = 1; i < 8; ++i) {
    const double d = std::fabs(a - kGrid[i]), db = std::fabs(a - kGrid[best]);
    if (d < db || (d == db && i % 2 == 0)) best = i;
  }
  return std::copysign(kGrid[best] * s, double(w.at(n, k)));
}

// Rows whose groups span many scales, one all-zero group, one tiny group.
Mat mxfp4_test_weight(int64_t N, int64_t K, uint32_t seed) {
  Mat w(N, K);
  w.fill_randn(seed);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) w.at(n, k) = std::ldexp(w.at(n, k), int((n * 7 + k / 32 * 3) % 17) - 12);
  for (int64_t k = 32; k < 64 && k < K; ++k) w.at(std::min<int64_t>(3, N - 1), k) = 0.0f;
  for (int64_t k = 0; k < 32; ++k) w.at(0, k) = std::ldexp(w.at(0, k), -110);
  return w;
}

TEST(GemmMxfp4, PackedValuesFollowTheRule) {
  ThreadPool pool(2);
  for (auto [N, K] : std::vector<std::pair<int64_t, int64_t>>{{1, 32}, {37, 96}, {16, 64}, {70, 160}}) {
    SCOPED_TRACE("N=" + std::to_string(N) + " K=" + std::to_string(K));
    const Mat w = mxfp4_test_weight(N, K, uint32_t(N + K));
    Mat wc = w;
    const PackedWeight pw = pack_weight_mxfp4(Context{&pool}, wc.t());
    EXPECT_TRUE(pw.mxfp4);
    EXPECT_EQ(pw.storage, DType::FP8E4M3);
    EXPECT_EQ(pw.data.size(), size_t(pw.panels() * K * 8)) << "half a byte per weight";
    EXPECT_EQ(pw.block_n, 1);
    EXPECT_EQ(pw.block_k, 32);
    const std::vector<float> got = unpack(pw);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) {
        const double want = mxfp4_reference(w, n, k);
        ASSERT_EQ(double(got[size_t(n * K + k)]), want) << "(" << n << ", " << k << ") of " << w.at(n, k);
        // The scale of (n, k) is its own group's power of two.
        const float sc = pw.fp8_scale(n, k);
        int e = 0;
        ASSERT_EQ(std::frexp(sc, &e), 0.5f) << "scale " << sc << " at (" << n << ", " << k << ")";
      }
    // Packing the packed values again gives back the same bytes and scales
    // (a checkpoint written from them packs as the original).
    std::vector<float> again = got;
    const PackedWeight pw2 = pack_weight_mxfp4(Context{}, Tensor(again.data(), DType::F32, {N, K}));
    ASSERT_EQ(pw2.data.size(), pw.data.size());
    EXPECT_EQ(std::memcmp(pw2.data.data(), pw.data.data(), pw.data.size()), 0);
    EXPECT_EQ(std::memcmp(pw2.block_scales.data(), pw.block_scales.data(), pw.block_scales.size()), 0);
  }
}

TEST(GemmMxfp4, ProductsFollowTheContractAndAreBatchAndThreadInvariant) {
  ThreadPool pool2(2);
  // Up to 300 rows: small products read the nibbles in place, larger ones
  // widen panels into f32 scratch first; both give the contract's bits.
  const int64_t kMaxM = 300, N = 45, K = 1024;
  Mat w = mxfp4_test_weight(N, K, 5), x(kMaxM, K, 3);
  x.fill_randn(6);
  const PackedWeight pw = pack_weight_mxfp4(Context{}, w.t());
  const std::vector<float> weff = unpack(pw), xd = x.dense();
  std::vector<float> alone(size_t(kMaxM * N));
  for (int64_t m = 0; m < kMaxM; ++m)
    gemm_xwt(Context{}, Tensor(alone.data() + m * N, DType::F32, {1, N}), x.t().slice_rows(m, m + 1), pw);
  const std::vector<float> want = contract_xwt(xd, weff, kMaxM, N, K, nullptr);
  expect_bits_equal(alone.data(), want.data(), kMaxM * N, "mxfp4 xwt vs contract");
  expect_near_double(
      alone, kMaxM, N, K, [&](int64_t m, int64_t k) { return xd[m * K + k]; },
      [&](int64_t k, int64_t n) { return mxfp4_reference(w, n, k); }, "mxfp4 xwt vs double");
  for (int64_t M : {int64_t(2), int64_t(7), int64_t(16), int64_t(33), int64_t(70), kMaxM}) {
    Guarded y(M * N);
    gemm_xwt(Context{&pool2}, y.tensor({M, N}), x.t().slice_rows(0, M), pw);
    y.check("y");
    expect_bits_equal(y.data(), alone.data(), M * N, ("M=" + std::to_string(M) + ", 2 threads").c_str());
  }
}

TEST(GemmMxfp4, RepackMatchesAFreshPack) {
  Mat w = mxfp4_test_weight(40, 64, 1);
  PackedWeight pw = pack_weight_mxfp4(Context{}, w.t());
  w = mxfp4_test_weight(40, 64, 2);
  repack_weight(Context{}, pw, w.t());
  const PackedWeight fresh = pack_weight_mxfp4(Context{}, w.t());
  EXPECT_TRUE(pw.mxfp4);
  EXPECT_EQ(std::memcmp(pw.data.data(), fresh.data.data(), pw.data.size()), 0);
  EXPECT_EQ(std::memcmp(pw.panel_scales.data(), fresh.panel_scales.data(), pw.panel_scales.size()), 0);
}

TEST(GemmMxfp4, RefusesWhatMxfp4CannotHold) {
  auto message = [](Mat& w) {
    try {
      pack_weight_mxfp4(Context{}, w.t());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  Mat narrow(4, 40);
  EXPECT_NE(message(narrow).find("multiple of 32"), std::string::npos) << message(narrow);
  Mat w(4, 64);
  w.fill_randn(3);
  w.at(2, 33) = std::nanf("");
  EXPECT_NE(message(w).find("(2, 33)"), std::string::npos) << message(w);
  w.at(2, 33) = 1e4f;  // needs a scale of 2^11
  EXPECT_NE(message(w).find("row 2 at column 32"), std::string::npos) << message(w);
}

// ---------------------------------------------------------------------------
// X·Wᵀ

// Runs gemm_xwt on strided, guarded operands and checks it against the
// contract (bits) and the double reference (error bound).
void check_xwt(const Context& ctx, int64_t M, int64_t N, int64_t K, const Storage& s, bool accumulate, uint32_t seed) {
  SCOPED_TRACE(s.name() + " M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) +
               (accumulate ? " accumulate" : ""));
  Mat x(M, K, 5), w(N, K, 2), y(M, N, 3);
  x.fill_randn(seed);
  w.fill_randn(seed + 1);
  y.fill_randn(seed + 2);
  const PackedWeight pw = pack_weight(ctx, w.t(), s.dtype, s.block);
  const std::vector<float> weff = unpack(pw), xd = x.dense(), y0 = y.dense();
  Guarded guard(M * y.ld);  // y's storage ends in sentinels
  std::memcpy(guard.data(), y.v.data(), y.v.size() * 4);
  Tensor yt(guard.data(), DType::F32, {M, N});
  yt.stride[0] = y.ld;
  gemm_xwt(ctx, yt, x.t(), pw, accumulate);
  guard.check("y");
  std::memcpy(y.v.data(), guard.data(), y.v.size() * 4);
  y.check_gaps("y");
  const std::vector<float> got = y.dense();
  const std::vector<float> want = contract_xwt(xd, weff, M, N, K, accumulate ? &y0 : nullptr);
  expect_bits_equal(got.data(), want.data(), M * N, "xwt vs contract");
  if (!accumulate) {
    expect_near_double(
        got, M, N, K, [&](int64_t m, int64_t k) { return xd[m * K + k]; },
        [&](int64_t k, int64_t n) { return weff[n * K + k]; }, "xwt vs double");
  }
}

TEST(GemmXwt, AwkwardShapesMatchContractAndDouble) {
  ThreadPool pool(2);
  const Context ctx{&pool};
  const std::vector<std::array<int64_t, 3>> shapes = {
      {1, 1, 1}, {1, 17, 1}, {3, 1, 5}, {7, 33, 19}, {13, 16, 64}, {6, 48, 31}, {8, 65, 40}, {64, 40, 128}, {9, 100, 77}, {31, 5, 300}};
  uint32_t seed = 10;
  for (const auto& [M, N, K] : shapes)
    for (const Storage& s : kStorages) check_xwt(ctx, M, N, K, s, false, seed++);
}

TEST(GemmXwt, RandomShapes) {
  ThreadPool pool(2);
  std::mt19937 g(123);
  std::uniform_int_distribution<int64_t> dm(1, 70), dn(1, 90), dk(1, 150);
  for (int i = 0; i < 24; ++i) {
    const Context ctx{i % 2 ? &pool : nullptr};
    check_xwt(ctx, dm(g), dn(g), dk(g), kStorages[i % 4], i % 3 == 0, 1000 + i);
  }
}

TEST(GemmXwt, AccumulateAddsTheFinishedChain) {
  const Context ctx;
  for (const Storage& s : kStorages) check_xwt(ctx, 5, 20, 37, s, true, 77);
}

TEST(GemmXwt, ZeroSizes) {
  const Context ctx;
  Mat w(8, 0), x(3, 0), y(3, 8);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 8; ++j) y.at(i, j) = -0.0f;
  const PackedWeight pw = pack_weight(ctx, w.t(), DType::F32);
  gemm_xwt(ctx, y.t(), x.t(), pw, true);  // -0 + (+0) = +0
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 8; ++j) EXPECT_EQ(f32_bits(y.at(i, j)), 0u);
  Mat x0(0, 4), y0(0, 8), w4(8, 4);
  EXPECT_NO_THROW(gemm_xwt(ctx, y0.t(), x0.t(), pack_weight(ctx, w4.t(), DType::BF16)));
}

TEST(GemmXwt, PlainWeightOverloadPacksExactly) {
  ThreadPool pool(2);
  const Context ctx{&pool};
  const int64_t M = 11, N = 23, K = 50;
  Mat x(M, K), w(N, K, 1), y(M, N);
  x.fill_randn(1);
  w.fill_randn(2);
  gemm_xwt(ctx, y.t(), x.t(), w.t());
  auto want = contract_xwt(x.dense(), w.dense(), M, N, K, nullptr);
  auto got = y.dense();
  expect_bits_equal(got.data(), want.data(), M * N, "plain f32 w");
  // bf16 weights: the chain uses their exact f32 values.
  std::vector<float> wd = w.dense();
  std::vector<bf16_t> wb(wd.size());
  convert_f32_to_bf16(wd.data(), wb.data(), wd.size());
  convert_bf16_to_f32(wb.data(), wd.data(), wd.size());
  gemm_xwt(ctx, y.t(), x.t(), Tensor(wb.data(), DType::BF16, {N, K}));
  want = contract_xwt(x.dense(), wd, M, N, K, nullptr);
  got = y.dense();
  expect_bits_equal(got.data(), want.data(), M * N, "plain bf16 w");
}

// A row of Y is bit-identical whatever M, the storage path (in-kernel widening
// for few rows, staged panels for many), the N blocking and the thread count.
TEST(GemmXwt, BatchAndThreadInvariance) {
  ThreadPool pool1(1), pool2(2);
  const int64_t kMaxM = 257;
  // (N, K): panels + tail; a K whose panel exceeds the N-block budget; N < 16
  // so two threads split rows instead of panels. K is large enough that the
  // bigger M use both threads (small products run on one).
  for (auto [N, K] : std::vector<std::pair<int64_t, int64_t>>{{70, 600}, {40, 4100}, {5, 8200}}) {
    Mat x(kMaxM, K, 1), w(N, K);
    x.fill_randn(static_cast<uint32_t>(N + K));
    w.fill_randn(static_cast<uint32_t>(N * K));
    for (const Storage& s : kStorages) {
      SCOPED_TRACE(s.name() + " N=" + std::to_string(N) + " K=" + std::to_string(K));
      const PackedWeight pw = pack_weight(Context{}, w.t(), s.dtype, s.block);
      // Each row alone, one thread.
      std::vector<float> alone(static_cast<size_t>(kMaxM * N));
      for (int64_t m = 0; m < kMaxM; ++m)
        gemm_xwt(Context{}, Tensor(alone.data() + m * N, DType::F32, {1, N}), x.t().slice_rows(m, m + 1), pw);
      std::vector<int64_t> Ms;
      for (int64_t m = 1; m <= 64; ++m) Ms.push_back(m);
      Ms.push_back(100);
      Ms.push_back(kMaxM);
      for (ThreadPool* pool : {&pool1, &pool2}) {
        const Context ctx{pool};
        for (int64_t M : Ms) {
          if (K > 1000 && M > 8 && M < 64 && M % 7 != 0) continue;  // keep the big-K cases quick
          Guarded y(M * N);
          gemm_xwt(ctx, y.tensor({M, N}), x.t().slice_rows(0, M), pw);
          y.check("y");
          const std::string what = "M=" + std::to_string(M) + " threads=" + std::to_string(pool->size());
          expect_bits_equal(y.data(), alone.data(), M * N, what.c_str());
        }
      }
    }
  }
}

// An in-place weight (the trainer's f32 master read where it is) gives the bits
// of the packed f32 copy and of the contract, for every M and both thread
// counts, also with a row stride, a panel tail, several staging chunks and
// accumulate; the rows it reads are W's own, so a change to W is seen by the
// next product without a repack. unpack_weight gives the rows; repack_weight
// and non-f32 rows are refused.
TEST(GemmXwt, InPlaceWeightMatchesThePackedCopy) {
  ThreadPool pool1(1), pool2(2);
  for (auto [N, K, pad] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {70, 600, 3}, {5, 8200, 0}, {300, 4100, 1}, {33, 17, 0}}) {
    SCOPED_TRACE("N=" + std::to_string(N) + " K=" + std::to_string(K));
    const int64_t kMaxM = 130;
    Mat x(kMaxM, K, 1), w(N, K, pad);
    x.fill_randn(static_cast<uint32_t>(N + K));
    w.fill_randn(static_cast<uint32_t>(N * K + 1));
    const PackedWeight packed = pack_weight(Context{}, w.t(), DType::F32);
    const PackedWeight in_place = in_place_weight(w.t());
    EXPECT_TRUE(in_place.in_place());
    EXPECT_EQ(in_place.data.size(), 0u);
    EXPECT_EQ(unpack(in_place), w.dense());
    for (ThreadPool* pool : {&pool1, &pool2}) {
      const Context ctx{pool};
      for (int64_t M : {int64_t{1}, int64_t{2}, int64_t{7}, int64_t{64}, kMaxM}) {
        if (K > 4000 && M > 7 && M < kMaxM) continue;  // keep the big-K cases quick
        const std::string what = "M=" + std::to_string(M) + " threads=" + std::to_string(pool->size());
        Guarded want(M * N), got(M * N);
        gemm_xwt(ctx, want.tensor({M, N}), x.t().slice_rows(0, M), packed);
        gemm_xwt(ctx, got.tensor({M, N}), x.t().slice_rows(0, M), in_place);
        got.check("y");
        expect_bits_equal(got.data(), want.data(), M * N, what.c_str());
        if (M == kMaxM) {
          const auto contract = contract_xwt(x.dense(), w.dense(), kMaxM, N, K, nullptr);
          std::vector<float> g(got.data(), got.data() + M * N);
          expect_bits_equal(g.data(), contract.data(), M * N, (what + " vs contract").c_str());
          gemm_xwt(ctx, got.tensor({M, N}), x.t().slice_rows(0, M), in_place, /*accumulate=*/true);
          gemm_xwt(ctx, want.tensor({M, N}), x.t().slice_rows(0, M), packed, /*accumulate=*/true);
          expect_bits_equal(got.data(), want.data(), M * N, (what + " accumulate").c_str());
        }
      }
    }
    w.check_gaps("w");
    // W changes (an optimizer step): the in-place weight multiplies by the new rows.
    w.at(N - 1, K - 1) += 1.0f;
    w.at(0, 0) -= 0.5f;
    const PackedWeight repacked = pack_weight(Context{}, w.t(), DType::F32);
    Guarded want(N), got(N);
    gemm_xwt(Context{}, want.tensor({1, N}), x.t().slice_rows(0, 1), repacked);
    gemm_xwt(Context{}, got.tensor({1, N}), x.t().slice_rows(0, 1), in_place);
    expect_bits_equal(got.data(), want.data(), N, "after the rows changed");
  }
  Mat w(20, 8);
  PackedWeight pw = in_place_weight(w.t());
  EXPECT_THROW(repack_weight(Context{}, pw, w.t()), Error);
  std::vector<bf16_t> wb(20 * 8);
  try {
    in_place_weight(Tensor(wb.data(), DType::BF16, {20, 8}));
    FAIL() << "bf16 rows were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("must be f32"), std::string::npos) << e.what();
  }
}

// Shapes big enough to reach every blocking path of the drivers: several row
// blocks (A kept in L3), several staging chunks (fp8 widened to f32),
// in-kernel widening with next-block prefetch. Bits still follow the contract.
TEST(GemmXwt, LargeShapesCoverEveryBlockingPath) {
  ThreadPool pool(2);
  const Context ctx{&pool};
  check_xwt(ctx, 9, 300, 4100, {DType::FP8E4M3, 0}, false, 1);   // fp8 staged to f32, two chunks
  check_xwt(ctx, 8, 300, 4100, {DType::FP8E4M3, 128}, true, 2);  // fp8 in-kernel, prefetch
  check_xwt(ctx, 7, 70, 4100, {DType::BF16, 0}, false, 3);       // bf16, two tiles, prefetch
  check_xwt(ctx, 12, 70, 4100, {DType::F32, 0}, false, 4);       // f32, two tiles, prefetch
  check_xwt(ctx, 25, 70, 4100, {DType::F32, 0}, true, 7);        // f32, three tiles share the prefetch
  check_xwt(ctx, 25, 70, 4100, {DType::BF16, 0}, false, 8);      // bf16, three tiles share the prefetch
  check_xwt(ctx, 600, 20, 4100, {DType::BF16, 0}, false, 5);     // two row blocks
  check_xwt(ctx, 700, 40, 100, {DType::F32, 0}, true, 6);        // panel in L1, two row blocks
}

TEST(GemmXwt, ShapeMismatchNamesShapes) {
  const Context ctx;
  Mat x(4, 16), y(4, 8), w(8, 12);
  const PackedWeight pw = pack_weight(ctx, w.t(), DType::BF16);
  try {
    gemm_xwt(ctx, y.t(), x.t(), pw);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("(4, 16) f32"), std::string::npos) << m;
    EXPECT_NE(m.find("(8, 12) packed bf16"), std::string::npos) << m;
    EXPECT_NE(m.find("(4, 8) f32"), std::string::npos) << m;
  }
  Mat y2(5, 8), x2(4, 12);
  EXPECT_THROW(gemm_xwt(ctx, y2.t(), x2.t(), pw), Error);
  try {
    gemm_xwt(ctx, y.t(), x.t(), w.t());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("(8, 12) f32"), std::string::npos) << e.what();
  }
  std::vector<bf16_t> xb(48);
  EXPECT_THROW(gemm_xwt(ctx, y.t(), Tensor(xb.data(), DType::BF16, {4, 12}), pw), Error);
  Tensor bad = x2.t();
  bad.stride[0] = 3;  // overlapping rows
  EXPECT_THROW(gemm_xwt(ctx, y.t(), bad, pw), Error);
}

// ---------------------------------------------------------------------------
// dY·W and dYᵀ·X

void check_dyw(const Context& ctx, int64_t M, int64_t N, int64_t K, bool bf16_w, bool accumulate, uint32_t seed) {
  SCOPED_TRACE(std::string(bf16_w ? "bf16" : "f32") + " M=" + std::to_string(M) + " N=" + std::to_string(N) +
               " K=" + std::to_string(K) + (accumulate ? " accumulate" : ""));
  Mat dy(M, N, 2), w(N, K, 3), dx(M, K, 1);
  dy.fill_randn(seed);
  w.fill_randn(seed + 1);
  dx.fill_randn(seed + 2);
  std::vector<float> wd = w.dense();
  std::vector<bf16_t> wb(wd.size());
  Tensor wt = w.t();
  if (bf16_w) {
    convert_f32_to_bf16(wd.data(), wb.data(), wd.size());
    convert_bf16_to_f32(wb.data(), wd.data(), wd.size());
    wt = Tensor(wb.data(), DType::BF16, {N, K});
  }
  const std::vector<float> dyd = dy.dense(), dx0 = dx.dense();
  Guarded guard(M * dx.ld);
  std::memcpy(guard.data(), dx.v.data(), dx.v.size() * 4);
  Tensor dxt(guard.data(), DType::F32, {M, K});
  dxt.stride[0] = dx.ld;
  gemm_dyw(ctx, dxt, dy.t(), wt, accumulate);
  guard.check("dx");
  std::memcpy(dx.v.data(), guard.data(), dx.v.size() * 4);
  dx.check_gaps("dx");
  const auto got = dx.dense();
  const auto want = contract_dyw(dyd, wd, M, N, K, accumulate ? &dx0 : nullptr);
  expect_bits_equal(got.data(), want.data(), M * K, "dyw vs contract");
  if (!accumulate)
    expect_near_double(
        got, M, K, N, [&](int64_t m, int64_t n) { return dyd[m * N + n]; },
        [&](int64_t n, int64_t k) { return wd[n * K + k]; }, "dyw vs double");
}

void check_dytx(const Context& ctx, int64_t M, int64_t N, int64_t K, bool accumulate, uint32_t seed) {
  SCOPED_TRACE("M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) +
               (accumulate ? " accumulate" : ""));
  Mat dy(M, N, 1), x(M, K, 4), dw(N, K, 2);
  dy.fill_randn(seed);
  x.fill_randn(seed + 1);
  dw.fill_randn(seed + 2);
  const std::vector<float> dyd = dy.dense(), xd = x.dense(), dw0 = dw.dense();
  Guarded guard(N * dw.ld);
  std::memcpy(guard.data(), dw.v.data(), dw.v.size() * 4);
  Tensor dwt(guard.data(), DType::F32, {N, K});
  dwt.stride[0] = dw.ld;
  gemm_dytx(ctx, dwt, dy.t(), x.t(), accumulate);
  guard.check("dw");
  std::memcpy(dw.v.data(), guard.data(), dw.v.size() * 4);
  dw.check_gaps("dw");
  const auto got = dw.dense();
  const auto want = contract_dytx(dyd, xd, M, N, K, accumulate ? &dw0 : nullptr);
  expect_bits_equal(got.data(), want.data(), N * K, "dytx vs contract");
  if (!accumulate)
    expect_near_double(
        got, N, K, M, [&](int64_t n, int64_t m) { return dyd[m * N + n]; },
        [&](int64_t m, int64_t k) { return xd[m * K + k]; }, "dytx vs double");
}

TEST(GemmBackward, AwkwardShapesMatchContractAndDouble) {
  ThreadPool pool(2);
  const std::vector<std::array<int64_t, 3>> shapes = {
      {1, 1, 1}, {1, 1, 17}, {5, 3, 1}, {7, 33, 19}, {13, 64, 16}, {6, 31, 48}, {64, 128, 40}, {9, 77, 100}, {300, 9, 21}};
  uint32_t seed = 50;
  for (const auto& [M, N, K] : shapes)
    for (int threads : {1, 2}) {
      const Context ctx{threads == 2 ? &pool : nullptr};
      check_dyw(ctx, M, N, K, false, false, seed++);
      check_dyw(ctx, M, N, K, true, false, seed++);
      check_dytx(ctx, M, N, K, false, seed++);
    }
}

TEST(GemmBackward, AccumulateAndRandomShapes) {
  ThreadPool pool(2);
  std::mt19937 g(7);
  std::uniform_int_distribution<int64_t> dm(1, 80), dn(1, 90), dk(1, 90);
  for (int i = 0; i < 16; ++i) {
    const Context ctx{i % 2 ? &pool : nullptr};
    const int64_t M = dm(g), N = dn(g), K = dk(g);
    check_dyw(ctx, M, N, K, i % 4 >= 2, i % 3 == 0, 200 + i);
    check_dytx(ctx, M, N, K, i % 3 != 1, 300 + i);
  }
}

// Long reductions and wide outputs: several staging chunks and row blocks.
TEST(GemmBackward, LargeShapesCoverEveryBlockingPath) {
  ThreadPool pool(2);
  const Context ctx{&pool};
  check_dyw(ctx, 7, 4100, 300, false, false, 1);   // two chunks of W panels
  check_dyw(ctx, 5, 4100, 40, true, true, 2);
  check_dytx(ctx, 4100, 13, 300, true, 3);         // two chunks of X panels
  check_dytx(ctx, 4100, 260, 20, false, 4);        // two row blocks of dW
}

// dX rows do not depend on M; dW does not depend on the thread count.
TEST(GemmBackward, BatchAndThreadInvariance) {
  ThreadPool pool2(2);
  const int64_t kMaxM = 100, N = 700, K = 90;  // M >= 67 runs on both threads
  Mat dy(kMaxM, N), w(N, K), x(kMaxM, K);
  dy.fill_randn(1);
  w.fill_randn(2);
  x.fill_randn(3);
  std::vector<float> alone(static_cast<size_t>(kMaxM * K));
  for (int64_t m = 0; m < kMaxM; ++m)
    gemm_dyw(Context{}, Tensor(alone.data() + m * K, DType::F32, {1, K}), dy.t().slice_rows(m, m + 1), w.t());
  for (const Context& ctx : {Context{}, Context{&pool2}})
    for (int64_t M : {1, 2, 3, 7, 8, 9, 13, 31, 64, 100}) {
      Guarded dx(M * K);
      gemm_dyw(ctx, dx.tensor({M, K}), dy.t().slice_rows(0, M), w.t());
      dx.check("dx");
      expect_bits_equal(dx.data(), alone.data(), M * K, ("dyw M=" + std::to_string(M)).c_str());
    }
  Guarded dw1(N * K), dw2(N * K);
  gemm_dytx(Context{}, dw1.tensor({N, K}), dy.t(), x.t(), false);
  gemm_dytx(Context{&pool2}, dw2.tensor({N, K}), dy.t(), x.t(), false);
  expect_bits_equal(dw1.data(), dw2.data(), N * K, "dytx threads");
  // A wide dW (many panels) and a narrow one (threads split rows), over 2000
  // tokens so that both threads work.
  for (auto [n, k] : std::vector<std::pair<int64_t, int64_t>>{{6, 800}, {300, 8}}) {
    Mat dyn(2000, n), xn(2000, k);
    dyn.fill_randn(4);
    xn.fill_randn(5);
    Guarded a(n * k), b(n * k);
    gemm_dytx(Context{}, a.tensor({n, k}), dyn.t(), xn.t(), false);
    gemm_dytx(Context{&pool2}, b.tensor({n, k}), dyn.t(), xn.t(), false);
    expect_bits_equal(a.data(), b.data(), n * k, "dytx threads");
  }
}

// <dY, X·Wᵀ> = <dY·W, X> = <dYᵀ·X, W>: the backward products are the adjoints.
TEST(GemmBackward, AdjointIdentities) {
  ThreadPool pool(2);
  const Context ctx{&pool};
  const int64_t M = 37, N = 45, K = 53;
  Mat x(M, K), w(N, K), dy(M, N), y(M, N), dx(M, K), dw(N, K);
  x.fill_randn(1);
  w.fill_randn(2);
  dy.fill_randn(3);
  gemm_xwt(ctx, y.t(), x.t(), w.t());
  gemm_dyw(ctx, dx.t(), dy.t(), w.t());
  gemm_dytx(ctx, dw.t(), dy.t(), x.t(), false);
  auto dot = [](const Mat& a, const Mat& b, double* sa) {
    double s = 0;
    *sa = 0;
    for (int64_t i = 0; i < a.rows; ++i)
      for (int64_t j = 0; j < a.cols; ++j) {
        s += double(a.at(i, j)) * b.at(i, j);
        *sa += std::fabs(double(a.at(i, j)) * b.at(i, j));
      }
    return s;
  };
  double s1a, s2a, s3a;
  const double s1 = dot(dy, y, &s1a), s2 = dot(dx, x, &s2a), s3 = dot(dw, w, &s3a);
  const double tol = 1e-5 * (s1a + s2a + s3a);
  EXPECT_NEAR(s1, s2, tol);
  EXPECT_NEAR(s1, s3, tol);
}

TEST(GemmBackward, ShapeMismatchNamesShapes) {
  const Context ctx;
  Mat dx(4, 12), dy(4, 8), w(9, 12), x(4, 12), dw(8, 13);
  try {
    gemm_dyw(ctx, dx.t(), dy.t(), w.t());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("(4, 8) f32"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(9, 12) f32"), std::string::npos) << e.what();
  }
  try {
    gemm_dytx(ctx, dw.t(), dy.t(), x.t());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("(8, 13) f32"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(4, 12) f32"), std::string::npos) << e.what();
  }
  std::vector<fp8_t> w8(9 * 12);
  EXPECT_THROW(gemm_dyw(ctx, dx.t(), dy.t(), Tensor(w8.data(), DType::FP8E4M3, {8, 12})), Error);
}

// ---------------------------------------------------------------------------
// Wide (AVX-512) and narrow tiles

// Restores the wide tiles (where the CPU has them) when a test ends.
struct NarrowTiles {
  NarrowTiles() { set_wide_vectors(false); }
  ~NarrowTiles() { set_wide_vectors(true); }
};

// Every tile row count of both kernels (1..13 rows, a wide tile and its
// remainders), f32 and packed bf16 weights, partial panels, both A layouts,
// accumulate, 1 and 2 threads.
void check_every_tile(uint32_t seed) {
  ThreadPool pool(2);
  for (int threads : {1, 2}) {
    const Context ctx{threads == 2 ? &pool : nullptr};
    for (int64_t M : {1, 3, 4, 7, 12, 13, 25, 40}) {
      check_xwt(ctx, M, 37, 70, {DType::F32, 0}, M % 2 == 1, seed++);
      check_xwt(ctx, M, 37, 70, {DType::BF16, 0}, M % 2 == 0, seed++);  // packed bf16: widened as loaded
      check_dyw(ctx, M, 70, 37, false, M % 2 == 0, seed++);
      check_dytx(ctx, 70, M, 37, M % 3 == 0, seed++);
    }
    check_xwt(ctx, 700, 40, 100, {DType::F32, 0}, true, seed++);  // a panel in L1, two row blocks
    check_dytx(ctx, 4100, 13, 300, true, seed++);                 // two chunks of X panels
  }
}

TEST(GemmWide, NarrowTilesFollowTheContract) {
  const NarrowTiles narrow;
  EXPECT_FALSE(wide_vectors());
  check_every_tile(4000);
}

TEST(GemmWide, WideTilesFollowTheContract) {
  if (!wide_vectors()) GTEST_SKIP() << "this CPU has no AVX-512F (or LOCKSTEP_WIDE_VECTORS=0)";
  check_every_tile(5000);
}

// Restores the default k-blocking when a test ends.
struct SmallKBlocks {
  explicit SmallKBlocks(const GemmKBlocking& k) { set_gemm_kblocking(k); }
  ~SmallKBlocks() { set_gemm_kblocking(GemmKBlocking{}); }
};

// Chains cut into blocks of 32 (a short last one), three panels staged per
// block, partial chains in row blocks of 12 or 24 (a short remainder joins
// the last): the bits of the uncut contract, for every product that reads B
// from rows (plain f32 and bf16 operands, in-place weights), with accumulate.
TEST(GemmWide, KBlockedChainsFollowTheContract) {
  if (!wide_vectors()) GTEST_SKIP() << "this CPU has no AVX-512F (or LOCKSTEP_WIDE_VECTORS=0)";
  for (int64_t carry : {int64_t{3 * 16 * 4 * 12}, int64_t{3 * 16 * 4 * 24}}) {
    const SmallKBlocks small({32, 64, 32 * 16 * 4 * 3, carry, 1});
    SCOPED_TRACE("carry_bytes " + std::to_string(carry));
    ThreadPool pool(2);
    uint32_t seed = 6000;
    for (int threads : {1, 2}) {
      const Context ctx{threads == 2 ? &pool : nullptr};
      for (int64_t M : {4, 13, 27, 40}) {
        check_dyw(ctx, M, 101, 37, false, M % 2 == 0, seed++);  // 101 = 3 blocks + 5
        check_dyw(ctx, M, 64, 50, true, M % 2 == 1, seed++);    // bf16 W
        check_dytx(ctx, 100, M, 37, M % 3 == 0, seed++);
      }
      check_dytx(ctx, 96, 41, 70, true, seed++);        // 41 rows: blocks of 12 or 24 and a remainder
      check_dyw(ctx, 3, 101, 37, false, true, seed++);  // too few rows for the wide tiles: not cut
      // An in-place weight (cut) against its packed copy (read whole).
      Mat x(29, 101, 1), w(37, 101, 2);
      x.fill_randn(seed++);
      w.fill_randn(seed++);
      Guarded want(29 * 37), got(29 * 37);
      gemm_xwt(ctx, want.tensor({29, 37}), x.t(), pack_weight(Context{}, w.t(), DType::F32));
      gemm_xwt(ctx, got.tensor({29, 37}), x.t(), in_place_weight(w.t()));
      got.check("y");
      expect_bits_equal(got.data(), want.data(), 29 * 37, "in-place weight");
    }
  }
}

TEST(GemmWide, KBlockingRefusesNonPositiveFields) {
  EXPECT_THROW(set_gemm_kblocking({0, 64, 1024, 1024}), Error);
  EXPECT_THROW(set_gemm_kblocking({32, 64, 1024, -1}), Error);
  EXPECT_THROW(set_gemm_kblocking({32, 64, 1024, 1024, 0}), Error);
  EXPECT_EQ(gemm_kblocking().block, GemmKBlocking{}.block);
}

}  // namespace
}  // namespace lockstep::kernels
