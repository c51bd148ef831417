// The GPU RMSNorm kernels (kernels/gpu/rmsnorm.cu) in interpret mode, bit for
// bit against the CPU kernels (kernels/cpu/rmsnorm.h): odd widths, strided and
// in-place rows, accumulated dw, several block shapes, 1 and 2 pool threads,
// the race check, and the dispatch through the interpret backend.
//
// Negative controls (done once by hand): giving element i to lane i % 8
// instead of i % 16 in rmsnorm_forward_kernel's sum of squares failed
// ForwardMatchesCpuOverShapesStridesAndBlocks from D = 16 on (rstd 1-2 ulp
// off), and summing dw over tokens in reverse order failed
// BackwardMatchesCpuSeparateAndInPlace at T = 5 (dw 1 ulp off).
#include "lockstep/kernels/gpu/rmsnorm.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/test_util.h"
#include "gpu/row_kernel_util.h"
#include "lockstep/kernels/cpu/rmsnorm.h"
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

// A NaN no kernel writes: marks what must stay untouched (row padding, skipped outputs).
const float kUnwritten = [] {
  const uint32_t u = 0x7fc0beefu;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}();

struct Shape {
  int64_t T, D, ld;  // ld: row stride of every (T, D) operand
  float scale;       // of x; 1e18 overflows the sum of squares to inf
};

std::vector<Shape> shapes() {
  std::vector<Shape> out;
  for (int64_t D : {1, 7, 16, 17, 64, 100})
    for (int64_t T : {1, 5, 33}) out.push_back({T, D, D + (T % 2 == 1 ? 3 : 0), 1.0f});
  out.push_back({9, 33, 40, 1e-3f});
  out.push_back({4, 100, 100, 1e18f});
  return out;
}

std::vector<G::RmsnormLaunch> launches() {
  return {G::RmsnormLaunch{1, 1}, G::RmsnormLaunch{3, 32}, G::RmsnormLaunch{}, G::RmsnormLaunch{64, 1024}};
}

std::string name(const Shape& s, const G::RmsnormLaunch& cfg, int threads) {
  return "T=" + std::to_string(s.T) + " D=" + std::to_string(s.D) + " ld=" + std::to_string(s.ld) +
         " rows_per_block=" + std::to_string(cfg.rows_per_block) +
         " dw_threads=" + std::to_string(cfg.dw_threads) + " threads=" + std::to_string(threads);
}

// Forward on both sides; in_place makes y the same view as x.
void check_forward(const Shape& s, const G::RmsnormLaunch& cfg, int threads, bool keep_rstd, bool in_place) {
  const std::string what = name(s, cfg, threads) + (in_place ? " in place" : "");
  const int64_t n = s.T * s.ld;
  const std::vector<float> x = test::randn(n, uint32_t(s.T * 131 + s.D), s.scale);
  const std::vector<float> w = test::randn(s.D, uint32_t(s.D + 7));
  const float eps = 1e-6f;
  PoolContext pc(threads);

  std::vector<float> xc = x, yc(sz(n), kUnwritten), rc(sz(s.T), kUnwritten);
  Tensor cx = rows_view(xc.data(), s.T, s.D, s.ld);
  Tensor cy = in_place ? cx : rows_view(yc.data(), s.T, s.D, s.ld);
  Tensor cr = keep_rstd ? Tensor(rc.data(), DType::F32, {s.T}) : Tensor();
  rmsnorm_forward(pc.ctx, cy, cr, cx, Tensor(const_cast<float*>(w.data()), DType::F32, {s.D}), eps);

  DeviceArray<float> dx(x, "x"), dw(w, "w"), dy(std::vector<float>(sz(n), kUnwritten), "y"),
      dr(std::vector<float>(sz(s.T), kUnwritten), "rstd");
  Tensor gx = rows_view(dx.data(), s.T, s.D, s.ld);
  Tensor gy = in_place ? gx : rows_view(dy.data(), s.T, s.D, s.ld);
  Tensor gr = keep_rstd ? Tensor(dr.data(), DType::F32, {s.T}) : Tensor();
  G::rmsnorm_forward(pc.ctx, gy, gr, gx, Tensor(dw.data(), DType::F32, {s.D}), eps, cfg);

  expect_same_bits(dx.host(), xc, what + ": x");
  expect_same_bits(dy.host(), yc, what + ": y");
  expect_same_bits(dr.host(), rc, what + ": rstd");
}

TEST(GpuRmsnorm, ForwardMatchesCpuOverShapesStridesAndBlocks) {
  const auto cfgs = launches();
  int k = 0;
  for (const Shape& s : shapes())
    for (int threads : {1, 2}) {
      check_forward(s, cfgs[sz(k % 4)], threads, k % 3 != 0, false);
      ++k;
    }
}

TEST(GpuRmsnorm, ForwardInPlaceMatchesCpu) {
  for (const auto& cfg : launches()) check_forward({17, 100, 103, 1.0f}, cfg, 2, true, true);
}

// h_out = x + r then the norm; alias: 0 separate, 1 h_out is x, 2 h_out is r.
void check_add_forward(const Shape& s, const G::RmsnormLaunch& cfg, int threads, int alias) {
  const std::string what = name(s, cfg, threads) + " alias=" + std::to_string(alias);
  const int64_t n = s.T * s.ld;
  const std::vector<float> x = test::randn(n, uint32_t(s.T * 17 + s.D), s.scale);
  const std::vector<float> r = test::randn(n, uint32_t(s.T * 19 + s.D), s.scale);
  const std::vector<float> w = test::randn(s.D, uint32_t(s.D + 9));
  const float eps = 1e-5f;
  PoolContext pc(threads);

  std::vector<float> xc = x, ac = r, hc(sz(n), kUnwritten), yc(sz(n), kUnwritten), rc(sz(s.T), kUnwritten);
  Tensor cx = rows_view(xc.data(), s.T, s.D, s.ld), ca = rows_view(ac.data(), s.T, s.D, s.ld);
  Tensor ch = alias == 1 ? cx : alias == 2 ? ca : rows_view(hc.data(), s.T, s.D, s.ld);
  add_rmsnorm_forward(pc.ctx, rows_view(yc.data(), s.T, s.D, s.ld), ch, Tensor(rc.data(), DType::F32, {s.T}),
                      cx, ca, Tensor(const_cast<float*>(w.data()), DType::F32, {s.D}), eps);

  DeviceArray<float> dx(x, "x"), da(r, "r"), dw(w, "w"), dh(std::vector<float>(sz(n), kUnwritten), "h_out"),
      dy(std::vector<float>(sz(n), kUnwritten), "y"), dr(std::vector<float>(sz(s.T), kUnwritten), "rstd");
  Tensor gx = rows_view(dx.data(), s.T, s.D, s.ld), ga = rows_view(da.data(), s.T, s.D, s.ld);
  Tensor gh = alias == 1 ? gx : alias == 2 ? ga : rows_view(dh.data(), s.T, s.D, s.ld);
  G::add_rmsnorm_forward(pc.ctx, rows_view(dy.data(), s.T, s.D, s.ld), gh,
                         Tensor(dr.data(), DType::F32, {s.T}), gx, ga, Tensor(dw.data(), DType::F32, {s.D}),
                         eps, cfg);

  expect_same_bits(dx.host(), xc, what + ": x");
  expect_same_bits(da.host(), ac, what + ": r");
  expect_same_bits(dh.host(), hc, what + ": h_out");
  expect_same_bits(dy.host(), yc, what + ": y");
  expect_same_bits(dr.host(), rc, what + ": rstd");
}

TEST(GpuRmsnorm, AddRmsnormMatchesCpuSeparateAndInPlace) {
  const auto cfgs = launches();
  int k = 0;
  for (const Shape& s : shapes()) {
    check_add_forward(s, cfgs[sz(k % 4)], 1 + k % 2, k % 3);
    ++k;
  }
}

// dw accumulates onto random values; in_place makes dx the same view as dy.
void check_backward(const Shape& s, const G::RmsnormLaunch& cfg, int threads, bool in_place) {
  const std::string what = name(s, cfg, threads) + (in_place ? " in place" : "");
  const int64_t n = s.T * s.ld;
  const std::vector<float> x = test::randn(n, uint32_t(s.T * 23 + s.D), s.scale);
  const std::vector<float> g = test::randn(n, uint32_t(s.T * 29 + s.D));
  const std::vector<float> w = test::randn(s.D, uint32_t(s.D + 11));
  const std::vector<float> dw0 = test::randn(s.D, uint32_t(s.D + 13));
  std::vector<float> rstd = test::uniform(s.T, uint32_t(s.T + 3), 0.5f, 2.0f);
  PoolContext pc(threads);

  std::vector<float> gc = g, dxc(sz(n), kUnwritten), dwc = dw0;
  Tensor cg = rows_view(gc.data(), s.T, s.D, s.ld);
  rmsnorm_backward(
      pc.ctx, in_place ? cg : rows_view(dxc.data(), s.T, s.D, s.ld), Tensor(dwc.data(), DType::F32, {s.D}),
      cg, rows_view(const_cast<float*>(x.data()), s.T, s.D, s.ld),
      Tensor(const_cast<float*>(w.data()), DType::F32, {s.D}), Tensor(rstd.data(), DType::F32, {s.T}));

  DeviceArray<float> dg(g, "dy"), dx(x, "x"), dw(w, "w"), ddw(dw0, "dw"), dr(rstd, "rstd"),
      ddx(std::vector<float>(sz(n), kUnwritten), "dx");
  Tensor gg = rows_view(dg.data(), s.T, s.D, s.ld);
  G::rmsnorm_backward(pc.ctx, in_place ? gg : rows_view(ddx.data(), s.T, s.D, s.ld),
                      Tensor(ddw.data(), DType::F32, {s.D}), gg, rows_view(dx.data(), s.T, s.D, s.ld),
                      Tensor(dw.data(), DType::F32, {s.D}), Tensor(dr.data(), DType::F32, {s.T}), cfg);

  expect_same_bits(dg.host(), gc, what + ": dy (dx when in place)");
  expect_same_bits(ddx.host(), dxc, what + ": dx");
  expect_same_bits(ddw.host(), dwc, what + ": dw");
}

TEST(GpuRmsnorm, BackwardMatchesCpuSeparateAndInPlace) {
  const auto cfgs = launches();
  int k = 0;
  for (const Shape& s : shapes())
    for (int threads : {1, 2}) {
      check_backward(s, cfgs[sz(k % 4)], threads, k % 3 == 1);
      ++k;
    }
}

TEST(GpuRmsnorm, EveryKernelGivesTheSameBitsInEveryThreadOrder) {
  gpu_test::emu::Options o;
  o.check_races = true;
  gpu_test::emu::ScopedOptions scoped(o);
  const Shape s{13, 37, 40, 1.0f};
  const G::RmsnormLaunch cfg{4, 16};
  check_forward(s, cfg, 2, true, true);
  check_add_forward(s, cfg, 2, 1);
  check_backward(s, cfg, 2, true);
}

TEST(GpuRmsnorm, CpuEntriesDispatchToTheInterpretBackend) {
  const GpuBackend& be = interpret_backend();
  ASSERT_NE(be.rmsnorm_forward, nullptr);
  ASSERT_NE(be.add_rmsnorm_forward, nullptr);
  ASSERT_NE(be.rmsnorm_backward, nullptr);
  const int64_t T = 6, D = 45, n = T * D;
  const std::vector<float> x = test::randn(n, 1), r = test::randn(n, 2), w = test::randn(D, 3),
                           g = test::randn(n, 4);
  for (int threads : {1, 2}) {
    PoolContext cpu(threads), dev(threads);
    dev.ctx.gpu = &be;
    std::vector<float> results[2];  // y, h_out, rstd, dx, dw of each side, concatenated
    for (int side = 0; side < 2; ++side) {
      const Context& ctx = side == 0 ? cpu.ctx : dev.ctx;
      DeviceArray<float> dx(x, "x"), dr(r, "r"), dw(w, "w"), dg(g, "dy"), y(n, "y"), h(n, "h_out"),
          rs(T, "rstd"), ddx(n, "dx"), ddw(std::vector<float>(sz(D), 0.5f), "dw");
      const Tensor tx(dx.data(), DType::F32, {T, D}), tr(dr.data(), DType::F32, {T, D}),
          tw(dw.data(), DType::F32, {D});
      const Tensor ty(y.data(), DType::F32, {T, D}), th(h.data(), DType::F32, {T, D}),
          trs(rs.data(), DType::F32, {T});
      rmsnorm_forward(ctx, ty, trs, tx, tw, 1e-6f);
      add_rmsnorm_forward(ctx, ty, th, trs, tx, tr, tw, 1e-6f);
      rmsnorm_backward(ctx, Tensor(ddx.data(), DType::F32, {T, D}), Tensor(ddw.data(), DType::F32, {D}),
                       Tensor(dg.data(), DType::F32, {T, D}), th, tw, trs);
      for (const auto* a : {&y, &h, &rs, &ddx, &ddw}) {
        const auto v = a->host();
        results[side].insert(results[side].end(), v.begin(), v.end());
      }
    }
    expect_same_bits(results[1], results[0], "dispatch, threads=" + std::to_string(threads));
  }
}

TEST(GpuRmsnorm, ShapeErrorsAreTheCpuKernelsErrors) {
  std::vector<float> a(64), b(64), w(8), rs(8);
  const Tensor x(a.data(), DType::F32, {4, 8}), y_bad(b.data(), DType::F32, {4, 7});
  const Tensor tw(w.data(), DType::F32, {8}), trs(rs.data(), DType::F32, {4});
  Context cpu, dev;
  dev.gpu = &interpret_backend();
  const std::string want = error_of([&] { rmsnorm_forward(cpu, y_bad, trs, x, tw, 1e-6f); });
  ASSERT_NE(want, "");
  EXPECT_EQ(error_of([&] { rmsnorm_forward(dev, y_bad, trs, x, tw, 1e-6f); }), want);
  const std::string want_bw =
      error_of([&] { rmsnorm_backward(cpu, x, tw, x, x, tw, Tensor(rs.data(), DType::F32, {3})); });
  ASSERT_NE(want_bw, "");
  EXPECT_EQ(error_of([&] { rmsnorm_backward(dev, x, tw, x, x, tw, Tensor(rs.data(), DType::F32, {3})); }),
            want_bw);
  EXPECT_NE(error_of([&] {
              G::rmsnorm_forward(cpu, x, trs, x, tw, 1e-6f, G::RmsnormLaunch{65, 256});
            }).find("rows_per_block"),
            std::string::npos);
}

}  // namespace
}  // namespace lockstep::kernels
