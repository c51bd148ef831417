// The GPU SwiGLU (kernels/gpu/swiglu.cu) in interpret mode, bit for bit against
// the CPU kernels (kernels/cpu/swiglu.h): odd widths, gate and up as the two
// halves of a fused projection, gates past the -100 clamp and special values
// (+-0, +-inf, NaN), outputs aliasing inputs, several block shapes and
// grid-stride loops, 1 and 2 pool threads, the race check, and the dispatch.
//
// Negative control (done once by hand): multiplying by sigmoid instead of
// dividing (silu = g * sigmoid(g)) in swiglu_forward_kernel failed
// ForwardAndBackwardMatchCpu (first at T = 33, F = 1), 1 ulp off.
#include "lockstep/kernels/gpu/swiglu.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "gpu/row_kernel_util.h"
#include "lockstep/kernels/cpu/swiglu.h"
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

// A fused (T, 2F) buffer, gate the first F columns, up the last F; every
// element random (scale 6, so some gates pass -100 only through the specials).
std::vector<float> fused_input(int64_t T, int64_t F, uint32_t seed) {
  std::vector<float> v = test::randn(T * 2 * F, seed, 6.0f);
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {-0.0f,
                            0.0f,
                            -100.0f,
                            -100.5f,
                            -1e4f,
                            -inf,
                            inf,
                            88.0f,
                            90.0f,
                            1e-30f,
                            std::numeric_limits<float>::quiet_NaN()};
  // Specials into gates and ups at spread positions.
  for (size_t i = 0; i < std::size(specials) && i < v.size(); ++i) v[(i * 37) % v.size()] = specials[i];
  return v;
}

std::vector<G::SwigluLaunch> launches() {
  return {G::SwigluLaunch{}, G::SwigluLaunch{1, 0}, G::SwigluLaunch{33, 0}, G::SwigluLaunch{64, 3},
          G::SwigluLaunch{1024, 1}};
}

struct Shape {
  int64_t T, F;
};

std::string name(const Shape& s, const G::SwigluLaunch& cfg, int threads, int alias) {
  return "T=" + std::to_string(s.T) + " F=" + std::to_string(s.F) +
         " threads/block=" + std::to_string(cfg.threads) + " max_blocks=" + std::to_string(cfg.max_blocks) +
         " pool=" + std::to_string(threads) + " alias=" + std::to_string(alias);
}

// Forward: out separate (alias 0) or over gate (1) / up (2). Backward on fresh
// copies: dgate, dup separate (0), or dgate over gate and dup over up (1), or
// dgate over dout and dup over up (2).
void check(const Shape& s, const G::SwigluLaunch& cfg, int threads, int alias, uint32_t seed) {
  const std::string what = name(s, cfg, threads, alias);
  const int64_t T = s.T, F = s.F, W = 2 * F;
  const std::vector<float> gu = fused_input(T, F, seed);
  const std::vector<float> dout = test::randn(T * F, seed + 1);
  PoolContext pc(threads);
  const float unwritten = std::numeric_limits<float>::quiet_NaN();
  {
    std::vector<float> c = gu, co(sz(T * F), unwritten);
    const Tensor cg = rows_view(c.data(), T, F, W), cu = rows_view(c.data() + F, T, F, W);
    swiglu_forward(pc.ctx, alias == 1 ? cg : alias == 2 ? cu : rows_view(co.data(), T, F, F), cg, cu);
    DeviceArray<float> d(gu, "gate|up"), o(std::vector<float>(sz(T * F), unwritten), "out");
    const Tensor dg = rows_view(d.data(), T, F, W), du = rows_view(d.data() + F, T, F, W);
    G::swiglu_forward(pc.ctx, alias == 1 ? dg : alias == 2 ? du : rows_view(o.data(), T, F, F), dg, du, cfg);
    expect_same_bits(d.host(), c, what + ": forward gate|up");
    expect_same_bits(o.host(), co, what + ": forward out");
  }
  {
    std::vector<float> c = gu, cd = dout, cdg(sz(T * F), unwritten), cdu(sz(T * F), unwritten);
    const Tensor cg = rows_view(c.data(), T, F, W), cu = rows_view(c.data() + F, T, F, W);
    const Tensor cdo = rows_view(cd.data(), T, F, F);
    swiglu_backward(pc.ctx,
                    alias == 1   ? cg
                    : alias == 2 ? cdo
                                 : rows_view(cdg.data(), T, F, F),
                    alias != 0 ? cu : rows_view(cdu.data(), T, F, F), cdo, cg, cu);
    DeviceArray<float> d(gu, "gate|up"), dd(dout, "dout"),
        ddg(std::vector<float>(sz(T * F), unwritten), "dgate"),
        ddu(std::vector<float>(sz(T * F), unwritten), "dup");
    const Tensor dg = rows_view(d.data(), T, F, W), du = rows_view(d.data() + F, T, F, W);
    const Tensor ddo = rows_view(dd.data(), T, F, F);
    G::swiglu_backward(pc.ctx,
                       alias == 1   ? dg
                       : alias == 2 ? ddo
                                    : rows_view(ddg.data(), T, F, F),
                       alias != 0 ? du : rows_view(ddu.data(), T, F, F), ddo, dg, du, cfg);
    expect_same_bits(d.host(), c, what + ": backward gate|up");
    expect_same_bits(dd.host(), cd, what + ": backward dout");
    expect_same_bits(ddg.host(), cdg, what + ": backward dgate");
    expect_same_bits(ddu.host(), cdu, what + ": backward dup");
  }
}

TEST(GpuSwiglu, ForwardAndBackwardMatchCpu) {
  const auto cfgs = launches();
  size_t k = 0;
  for (int64_t F : {1, 7, 16, 17, 100, 300})
    for (int64_t T : {1, 7, 33}) {
      check({T, F}, cfgs[k % cfgs.size()], 1 + int(k % 2), int(k % 3), uint32_t(200 + k));
      ++k;
    }
}

TEST(GpuSwiglu, EveryLaunchShapeGivesTheSameBits) {
  for (const auto& cfg : launches())
    for (int alias : {0, 1, 2}) check({5, 70}, cfg, 2, alias, 9);
}

TEST(GpuSwiglu, SameBitsInEveryThreadOrder) {
  gpu_test::emu::Options o;
  o.check_races = true;
  gpu_test::emu::ScopedOptions scoped(o);
  check({6, 40}, G::SwigluLaunch{32, 0}, 2, 0, 13);
  check({6, 40}, G::SwigluLaunch{32, 2}, 2, 1, 14);
}

TEST(GpuSwiglu, CpuEntriesDispatchToTheInterpretBackend) {
  const GpuBackend& be = interpret_backend();
  ASSERT_NE(be.swiglu_forward, nullptr);
  ASSERT_NE(be.swiglu_backward, nullptr);
  const int64_t T = 4, F = 50;
  const std::vector<float> gu = fused_input(T, F, 5), dout = test::randn(T * F, 6);
  for (int threads : {1, 2}) {
    PoolContext cpu(threads), dev(threads);
    dev.ctx.gpu = &be;
    std::vector<float> out[2];
    for (int side = 0; side < 2; ++side) {
      const Context& ctx = side == 0 ? cpu.ctx : dev.ctx;
      DeviceArray<float> d(gu, "gate|up"), dd(dout, "dout"), o(T * F, "out"), dg(T * F, "dgate"),
          du(T * F, "dup");
      const Tensor g = rows_view(d.data(), T, F, 2 * F), u = rows_view(d.data() + F, T, F, 2 * F);
      swiglu_forward(ctx, rows_view(o.data(), T, F, F), g, u);
      swiglu_backward(ctx, rows_view(dg.data(), T, F, F), rows_view(du.data(), T, F, F),
                      rows_view(dd.data(), T, F, F), g, u);
      for (const auto* a : {&o, &dg, &du}) {
        const auto v = a->host();
        out[side].insert(out[side].end(), v.begin(), v.end());
      }
    }
    expect_same_bits(out[1], out[0], "dispatch, threads=" + std::to_string(threads));
  }
}

TEST(GpuSwiglu, ShapeErrorsAreTheCpuKernelsErrors) {
  Context cpu, dev;
  dev.gpu = &interpret_backend();
  std::vector<float> a(64), b(64), c(64);
  const Tensor g(a.data(), DType::F32, {4, 8}), u(b.data(), DType::F32, {4, 8}),
      o_bad(c.data(), DType::F32, {4, 7});
  Tensor u_strided = rows_view(b.data(), 4, 8, 6);  // stride < width
  std::string want = error_of([&] { swiglu_forward(cpu, o_bad, g, u); });
  ASSERT_NE(want, "");
  EXPECT_EQ(error_of([&] { swiglu_forward(dev, o_bad, g, u); }), want);
  want = error_of([&] { swiglu_backward(cpu, g, u, g, g, u_strided); });
  ASSERT_NE(want, "");
  EXPECT_EQ(error_of([&] { swiglu_backward(dev, g, u, g, g, u_strided); }), want);
}

}  // namespace
}  // namespace lockstep::kernels
