// The GPU row-wise adds, sigmoid (kernels/gpu/rows.cu) and fp8 activation
// quantizer (fp8_quant.cu) in interpret mode, bit for bit against the CPU
// kernels (kernels/cpu/rows.h, fp8_quant.h): odd shapes, strided rows,
// outputs aliasing inputs, special values (+-0, +-inf, NaN, subnormals, values
// near FLT_MAX), several block shapes and grid-stride loops, 1 and 2 pool
// threads, the race check, a row alone against the same row in a batch, and
// the dispatch from the CPU entries. The CPU references run on host copies,
// so this binary runs in strict interpret mode.
//
// Negative controls (done once by hand): in fp8_quantize_kernel, dropping the
// second scale loop (so a scale may be too large) failed Fp8QuantizeMatchesCpu
// (first at T = 9, K = 1: the subnormal row quantized to -0); a fused
// ls_fma(x, s, y) in add_scaled_rows_kernel failed AddsMatchCpu (first at
// T = 33, N = 1), 1 ulp off.
#include "lockstep/kernels/gpu/rows.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <limits>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "gpu/row_kernel_util.h"
#include "lockstep/kernels/cpu/fp8_quant.h"
#include "lockstep/kernels/cpu/rows.h"
#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::kernels {
namespace {

namespace G = gpu::interp;
using gpu_test::DeviceArray;
using gpu_test::error_of;
using gpu_test::expect_same_bits;
using gpu_test::PoolContext;
using gpu_test::rows_view;

inline size_t sz(int64_t n) {
  return static_cast<size_t>(n);
}

// n random values (scale 4) with special values spread over them.
std::vector<float> with_specials(int64_t n, uint32_t seed) {
  std::vector<float> v = test::randn(n, seed, 4.0f);
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {-0.0f,  0.0f,    inf,     -inf,   std::numeric_limits<float>::quiet_NaN(),
                            1e-40f, -3e-39f, FLT_MAX, -1e38f, 90.0f,
                            -90.0f};
  for (size_t i = 0; i < std::size(specials) && i < v.size(); ++i) v[(i * 37 + 5) % v.size()] = specials[i];
  return v;
}

std::vector<G::RowsLaunch> launches() {
  return {G::RowsLaunch{}, G::RowsLaunch{1, 0}, G::RowsLaunch{33, 0}, G::RowsLaunch{64, 3},
          G::RowsLaunch{1024, 1}};
}

std::string name(int64_t T, int64_t N, const G::RowsLaunch& cfg, int threads) {
  return "T=" + std::to_string(T) + " N=" + std::to_string(N) +
         " threads/block=" + std::to_string(cfg.threads) + " max_blocks=" + std::to_string(cfg.max_blocks) +
         " pool=" + std::to_string(threads);
}

// add_row_bias, add_rows (out separate, or over a) and add_scaled_rows (with
// and without scales) on (T, N) rows of stride N + 2 (padding never written).
void check_adds(int64_t T, int64_t N, const G::RowsLaunch& cfg, int threads, uint32_t seed) {
  const std::string what = name(T, N, cfg, threads);
  const int64_t ld = N + 2;
  const std::vector<float> y0 = with_specials(T * ld, seed), x = test::randn(T * N, seed + 1, 3.0f),
                           s = with_specials(T, seed + 2), b = with_specials(N, seed + 3);
  PoolContext pc(threads);
  std::vector<float> cy = y0, cx = x, cs = s, cb = b, co(sz(T * N), -7.0f);
  const Tensor cyt = rows_view(cy.data(), T, N, ld), cxt = rows_view(cx.data(), T, N, N);
  add_row_bias(pc.ctx, cyt, Tensor(cb.data(), DType::F32, {N}));
  add_rows(pc.ctx, rows_view(co.data(), T, N, N), cyt, cxt);
  add_rows(pc.ctx, cyt, cyt, cxt);
  add_scaled_rows(pc.ctx, cyt, cxt, Tensor(cs.data(), DType::F32, {T}));
  add_scaled_rows(pc.ctx, rows_view(co.data(), T, N, N), cxt, Tensor());

  DeviceArray<float> dy(y0, "y"), dx(x, "x"), ds(s, "s"), db(b, "b"),
      dout(std::vector<float>(sz(T * N), -7.0f), "out");
  const Tensor dyt = rows_view(dy.data(), T, N, ld), dxt = rows_view(dx.data(), T, N, N);
  G::add_row_bias(pc.ctx, dyt, Tensor(db.data(), DType::F32, {N}), cfg);
  G::add_rows(pc.ctx, rows_view(dout.data(), T, N, N), dyt, dxt, cfg);
  G::add_rows(pc.ctx, dyt, dyt, dxt, cfg);
  G::add_scaled_rows(pc.ctx, dyt, dxt, Tensor(ds.data(), DType::F32, {T}), cfg);
  G::add_scaled_rows(pc.ctx, rows_view(dout.data(), T, N, N), dxt, Tensor(), cfg);
  expect_same_bits(dy.host(), cy, what + ": bias, add, scaled add");
  expect_same_bits(dout.host(), co, what + ": add into out, unscaled add");
}

// sigmoid_forward over n elements, out separate and in place.
void check_sigmoid(int64_t n, const G::RowsLaunch& cfg, int threads, uint32_t seed) {
  const std::string what = "n=" + std::to_string(n) + " " + name(1, n, cfg, threads);
  std::vector<float> x = with_specials(n, seed);
  for (size_t i = 0; i < x.size(); i += 3) x[i] *= 30.0f;  // into the tails
  PoolContext pc(threads);
  std::vector<float> cx = x, cy(sz(n), -7.0f);
  sigmoid_forward(pc.ctx, Tensor(cy.data(), DType::F32, {n}), Tensor(cx.data(), DType::F32, {n}));
  sigmoid_forward(pc.ctx, Tensor(cx.data(), DType::F32, {n}), Tensor(cx.data(), DType::F32, {n}));
  DeviceArray<float> dx(x, "x"), dy(std::vector<float>(sz(n), -7.0f), "y");
  G::sigmoid_forward(pc.ctx, Tensor(dy.data(), DType::F32, {n}), Tensor(dx.data(), DType::F32, {n}), cfg);
  G::sigmoid_forward(pc.ctx, Tensor(dx.data(), DType::F32, {n}), Tensor(dx.data(), DType::F32, {n}), cfg);
  expect_same_bits(dy.host(), cy, what + ": out");
  expect_same_bits(dx.host(), cx, what + ": in place");
}

// fp8_quantize_rows on (T, K) rows of stride K + 1: random magnitudes over
// many binades (scales from subnormal to huge), specials, whole groups of
// zeros and of tiny values.
std::vector<float> fp8_input(int64_t T, int64_t K, uint32_t seed) {
  const int64_t ld = K + 1;
  std::vector<float> v = with_specials(T * ld, seed);
  const std::vector<float> e = test::uniform(T, seed + 1, -140.0f, 120.0f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < ld; ++k) v[sz(t * ld + k)] = std::ldexp(v[sz(t * ld + k)], int(e[sz(t)]));
  if (T > 2)
    for (int64_t k = 0; k < K; ++k) {
      v[sz(1 * ld + k)] = 0.0f;                        // an all-zero row
      v[sz(2 * ld + k)] = k % 2 ? 1e-45f : -2.8e-45f;  // subnormal amax
    }
  return v;
}

void check_fp8(int64_t T, int64_t K, int64_t group, const G::RowsLaunch& cfg, int threads, uint32_t seed) {
  const std::string what = name(T, K, cfg, threads) + " group=" + std::to_string(group);
  const int64_t ld = K + 1;
  const std::vector<float> x = fp8_input(T, K, seed);
  PoolContext pc(threads);
  std::vector<float> c = x;
  fp8_quantize_rows(pc.ctx, rows_view(c.data(), T, K, ld), group);
  DeviceArray<float> d(x, "x");
  G::fp8_quantize_rows(pc.ctx, rows_view(d.data(), T, K, ld), group, cfg);
  expect_same_bits(d.host(), c, what);
}

TEST(GpuRows, AddsMatchCpu) {
  const auto cfgs = launches();
  size_t k = 0;
  for (int64_t N : {1, 7, 17, 130})
    for (int64_t T : {1, 6, 33}) {
      check_adds(T, N, cfgs[k % cfgs.size()], 1 + int(k % 2), uint32_t(300 + k));
      ++k;
    }
}

TEST(GpuRows, SigmoidMatchesCpu) {
  const auto cfgs = launches();
  size_t k = 0;
  for (int64_t n : {1, 15, 16, 17, 257, 1000}) {
    check_sigmoid(n, cfgs[k % cfgs.size()], 1 + int(k % 2), uint32_t(400 + k));
    ++k;
  }
}

TEST(GpuRows, Fp8QuantizeMatchesCpu) {
  const auto cfgs = launches();
  size_t k = 0;
  for (int64_t group : {128, 1, 5})
    for (int64_t K : {1, 100, 260})
      for (int64_t T : {1, 9}) {
        check_fp8(T, K, group, cfgs[k % cfgs.size()], 1 + int(k % 2), uint32_t(500 + k));
        ++k;
      }
}

TEST(GpuRows, EveryLaunchShapeGivesTheSameBits) {
  for (const auto& cfg : launches()) {
    check_adds(5, 70, cfg, 2, 9);
    check_sigmoid(300, cfg, 2, 10);
    check_fp8(5, 300, 128, cfg, 2, 11);
  }
}

TEST(GpuRows, SameBitsInEveryThreadOrder) {
  gpu_test::emu::Options o;
  o.check_races = true;
  gpu_test::emu::ScopedOptions scoped(o);
  check_adds(6, 40, G::RowsLaunch{32, 2}, 2, 13);
  check_sigmoid(90, G::RowsLaunch{32, 2}, 2, 14);
  check_fp8(6, 140, 128, G::RowsLaunch{1, 0}, 2, 15);
}

// Each row's bits on the GPU do not depend on the rows beside it.
TEST(GpuRows, RowAloneEqualsTheRowInABatch) {
  const int64_t T = 12, N = 150;
  const std::vector<float> y0 = with_specials(T * N, 20), x = test::randn(T * N, 21), s = test::randn(T, 22),
                           b = test::randn(N, 23);
  PoolContext pc(2);
  auto run = [&](int64_t t0, int64_t rows) {
    DeviceArray<float> dy(std::vector<float>(y0.begin() + t0 * N, y0.begin() + (t0 + rows) * N), "y"),
        dx(std::vector<float>(x.begin() + t0 * N, x.begin() + (t0 + rows) * N), "x"),
        ds(std::vector<float>(s.begin() + t0, s.begin() + t0 + rows), "s"), db(b, "b");
    const Tensor yt = rows_view(dy.data(), rows, N, N), xt = rows_view(dx.data(), rows, N, N);
    G::add_row_bias(pc.ctx, yt, Tensor(db.data(), DType::F32, {N}));
    G::add_rows(pc.ctx, yt, yt, xt);
    G::add_scaled_rows(pc.ctx, yt, xt, Tensor(ds.data(), DType::F32, {rows}));
    G::fp8_quantize_rows(pc.ctx, yt, 128);
    G::sigmoid_forward(pc.ctx, Tensor(dy.data(), DType::F32, {rows * N}),
                       Tensor(dy.data(), DType::F32, {rows * N}));
    return dy.host();
  };
  const std::vector<float> all = run(0, T);
  for (int64_t t = 0; t < T; ++t)
    expect_same_bits(run(t, 1), std::vector<float>(all.begin() + t * N, all.begin() + (t + 1) * N),
                     "row " + std::to_string(t) + " alone vs in the batch");
}

TEST(GpuRows, CpuEntriesDispatchToTheInterpretBackend) {
  const GpuBackend& be = interpret_backend();
  ASSERT_NE(be.add_row_bias, nullptr);
  ASSERT_NE(be.add_rows, nullptr);
  ASSERT_NE(be.add_scaled_rows, nullptr);
  ASSERT_NE(be.sigmoid_forward, nullptr);
  ASSERT_NE(be.fp8_quantize_rows, nullptr);
  const int64_t T = 4, N = 130;
  const std::vector<float> y0 = with_specials(T * N, 30), x = test::randn(T * N, 31), s = test::randn(T, 32),
                           b = test::randn(N, 33);
  PoolContext cpu(2), dev(2);
  dev.ctx.gpu = &be;
  // The CPU on host vectors; the device context on device buffers (a CPU
  // kernel reached through it would fault on them in strict mode).
  std::vector<float> cy = y0, cx = x, cs = s, cb = b;
  const Tensor cyt = rows_view(cy.data(), T, N, N), cxt = rows_view(cx.data(), T, N, N);
  DeviceArray<float> dy(y0, "y"), dx(x, "x"), ds(s, "s"), db(b, "b");
  const Tensor dyt = rows_view(dy.data(), T, N, N), dxt = rows_view(dx.data(), T, N, N);
  for (int side = 0; side < 2; ++side) {
    const Context& ctx = side == 0 ? cpu.ctx : dev.ctx;
    const Tensor& yt = side == 0 ? cyt : dyt;
    const Tensor& xt = side == 0 ? cxt : dxt;
    add_row_bias(ctx, yt, Tensor(side == 0 ? cb.data() : db.data(), DType::F32, {N}));
    add_rows(ctx, yt, yt, xt);
    add_scaled_rows(ctx, yt, xt, Tensor(side == 0 ? cs.data() : ds.data(), DType::F32, {T}));
    fp8_quantize_rows(ctx, yt, 128);
    sigmoid_forward(ctx, Tensor(yt.data, DType::F32, {T * N}), Tensor(yt.data, DType::F32, {T * N}));
  }
  expect_same_bits(dy.host(), cy, "dispatch");
}

TEST(GpuRows, ShapeErrorsAreTheCpuKernelsErrors) {
  Context cpu, dev;
  dev.gpu = &interpret_backend();
  std::vector<float> a(64), b(64);
  const Tensor y(a.data(), DType::F32, {4, 8}), x_bad(b.data(), DType::F32, {4, 7});
  const Tensor bias_bad(b.data(), DType::F32, {7}), s_bad(b.data(), DType::F32, {3});
  const std::vector<std::function<void(const Context&)>> calls = {
      [&](const Context& c) { add_row_bias(c, y, bias_bad); },
      [&](const Context& c) { add_rows(c, y, y, x_bad); },
      [&](const Context& c) { add_scaled_rows(c, y, y, s_bad); },
      [&](const Context& c) { sigmoid_forward(c, Tensor(a.data(), DType::F32, {5}), x_bad); },
      [&](const Context& c) { fp8_quantize_rows(c, y, 0); },
  };
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::string want = error_of([&] { calls[i](cpu); });
    ASSERT_NE(want, "") << "call " << i;
    EXPECT_EQ(error_of([&] { calls[i](dev); }), want) << "call " << i;
  }
}

}  // namespace
}  // namespace lockstep::kernels
