// The GPU stream helpers (kernels/gpu/streams.cu) and the clamped SwiGLU
// (swiglu.cu) in interpret mode, bit for bit against the CPU kernels
// (kernels/cpu/streams.h, swiglu.h): odd shapes, n = 1..4 streams, strided
// rows, sum_streams over its own first stream, special values (+-0, +-inf,
// NaN, values at the limit), several limits, several block sizes, 1 and 2
// pool threads, the race check, and the dispatch from the CPU entries (the
// path model/v4_util takes). The CPU references run on host copies, so this
// binary runs in strict interpret mode.
//
// Negative control (done once by hand): summing the streams from the last
// one in sum_streams_kernel failed StreamsMatchCpu at its first case with
// n = 3.
#include "lockstep/kernels/cpu/streams.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "gpu/row_kernel_util.h"
#include "lockstep/kernels/cpu/swiglu.h"
#include "lockstep/kernels/gpu/backend.h"
#include "lockstep/kernels/gpu/mhc.h"

namespace lockstep::kernels {
namespace {

namespace G = gpu::interp;
using gpu_test::DeviceArray;
using gpu_test::error_of;
using gpu_test::expect_same_bits;
using gpu_test::PoolContext;
using gpu_test::rows_view;
using vf = std::vector<float>;

size_t sz(int64_t n) {
  return static_cast<size_t>(n);
}

vf with_specials(int64_t n, uint32_t seed, float limit = 7.0f) {
  vf v = test::randn(n, seed, 6.0f);
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {-0.0f, 0.0f,   inf,     -inf,    std::numeric_limits<float>::quiet_NaN(),
                            limit, -limit, FLT_MAX, -150.0f, 1e-40f};
  for (size_t i = 0; i < std::size(specials) && i < v.size(); ++i) v[(i * 37 + 5) % v.size()] = specials[i];
  return v;
}

std::string name(int64_t n, int64_t D, int64_t T, const G::MhcLaunch& launch, int threads) {
  return "n=" + std::to_string(n) + " D=" + std::to_string(D) + " T=" + std::to_string(T) +
         " threads/block=" + std::to_string(launch.threads) + " pool=" + std::to_string(threads);
}

// add_to_streams, sum_streams (into de, then over x's first stream) and
// repeat_streams, x with row stride n*D + 2.
void check_streams(int64_t n, int64_t D, int64_t T, const G::MhcLaunch& launch, int threads, uint32_t seed) {
  const std::string what = name(n, D, T, launch, threads);
  const int64_t W = n * D, ld = W + 2;
  const vf x0 = with_specials(T * ld, seed), e0 = with_specials(T * D, seed + 1);
  PoolContext pc(threads);
  vf cx = x0, ce = e0, cde(sz(T * D), -7.0f);
  add_to_streams(pc.ctx, rows_view(cx.data(), T, W, ld), rows_view(ce.data(), T, D, D), n);
  sum_streams(pc.ctx, rows_view(cde.data(), T, D, D), rows_view(cx.data(), T, W, ld), n);
  sum_streams(pc.ctx, rows_view(cx.data(), T, D, ld), rows_view(cx.data(), T, W, ld), n);
  vf crep(sz(T * ld), -7.0f);
  repeat_streams(pc.ctx, rows_view(crep.data(), T, W, ld), rows_view(cde.data(), T, D, D), n);

  DeviceArray<float> dx(x0, "x"), de(e0, "e"), dde(vf(sz(T * D), -7.0f), "de"),
      drep(vf(sz(T * ld), -7.0f), "rep");
  G::add_to_streams(pc.ctx, rows_view(dx.data(), T, W, ld), rows_view(de.data(), T, D, D), n, launch);
  G::sum_streams(pc.ctx, rows_view(dde.data(), T, D, D), rows_view(dx.data(), T, W, ld), n, launch);
  G::sum_streams(pc.ctx, rows_view(dx.data(), T, D, ld), rows_view(dx.data(), T, W, ld), n, launch);
  G::repeat_streams(pc.ctx, rows_view(drep.data(), T, W, ld), rows_view(dde.data(), T, D, D), n, launch);
  expect_same_bits(dde.host(), cde, what + ": sum_streams");
  expect_same_bits(dx.host(), cx, what + ": add_to_streams, sum_streams in place");
  expect_same_bits(drep.host(), crep, what + ": repeat_streams");
}

// The clamped forward and backward on (T, F) halves of a fused (T, 2F)
// projection, outputs separate, then in place over gate and up.
void check_clamped(int64_t T, int64_t F, float limit, int threads, uint32_t seed) {
  const std::string what = "T=" + std::to_string(T) + " F=" + std::to_string(F) +
                           " limit=" + std::to_string(limit) + " pool=" + std::to_string(threads);
  const vf gu = with_specials(T * 2 * F, seed, limit), d0 = with_specials(T * F, seed + 1, limit);
  PoolContext pc(threads);
  vf c = gu, cd = d0, cout(sz(T * F), -7.0f), cdg(sz(T * F), -7.0f), cdu(sz(T * F), -7.0f);
  auto halves = [&](float* p) { return std::pair{rows_view(p, T, F, 2 * F), rows_view(p + F, T, F, 2 * F)}; };
  {
    const auto [g, u] = halves(c.data());
    const Tensor o = rows_view(cout.data(), T, F, F), d = rows_view(cd.data(), T, F, F);
    swiglu_clamped_forward(pc.ctx, o, g, u, limit);
    swiglu_clamped_backward(pc.ctx, rows_view(cdg.data(), T, F, F), rows_view(cdu.data(), T, F, F), d, g, u,
                            limit);
    swiglu_clamped_backward(pc.ctx, g, u, d, g, u, limit);
  }
  DeviceArray<float> dgu(gu, "gate|up"), dd(d0, "dout"), dout(vf(sz(T * F), -7.0f), "out"),
      ddg(vf(sz(T * F), -7.0f), "dgate"), ddu(vf(sz(T * F), -7.0f), "dup");
  {
    const auto [g, u] = halves(dgu.data());
    const Tensor o = rows_view(dout.data(), T, F, F), d = rows_view(dd.data(), T, F, F);
    G::swiglu_clamped_forward(pc.ctx, o, g, u, limit);
    G::swiglu_clamped_backward(pc.ctx, rows_view(ddg.data(), T, F, F), rows_view(ddu.data(), T, F, F), d, g,
                               u, limit);
    G::swiglu_clamped_backward(pc.ctx, g, u, d, g, u, limit);
  }
  expect_same_bits(dout.host(), cout, what + ": out");
  expect_same_bits(ddg.host(), cdg, what + ": dgate");
  expect_same_bits(ddu.host(), cdu, what + ": dup");
  expect_same_bits(dgu.host(), c, what + ": in place");
}

TEST(GpuStreams, StreamsMatchCpu) {
  const std::vector<G::MhcLaunch> launches = {G::MhcLaunch{}, G::MhcLaunch{16}, G::MhcLaunch{256}};
  size_t k = 0;
  for (int64_t n : {1, 3, 4})
    for (int64_t D : {1, 17, 130})
      for (int64_t T : {1, 6}) {
        check_streams(n, D, T, launches[k % launches.size()], 1 + int(k % 2), uint32_t(100 + k));
        ++k;
      }
}

TEST(GpuStreams, ClampedSwigluMatchesCpu) {
  size_t k = 0;
  for (float limit : {7.0f, 0.5f, 1e-3f, std::numeric_limits<float>::infinity()})
    for (int64_t F : {1, 33, 300})
      for (int64_t T : {1, 5}) {
        check_clamped(T, F, limit, 1 + int(k % 2), uint32_t(200 + k));
        ++k;
      }
}

TEST(GpuStreams, SameBitsInEveryThreadOrder) {
  gpu_test::emu::Options o;
  o.check_races = true;
  gpu_test::emu::ScopedOptions scoped(o);
  check_streams(4, 19, 3, G::MhcLaunch{32}, 2, 300);
  check_clamped(3, 40, 7.0f, 2, 301);
}

// The CPU entries (what model/v4_util calls) reach the GPU kernels through the
// backend table: on device buffers they give the CPU's bits.
TEST(GpuStreams, CpuEntriesDispatchToTheInterpretBackend) {
  const GpuBackend& be = interpret_backend();
  ASSERT_NE(be.add_to_streams, nullptr);
  ASSERT_NE(be.repeat_streams, nullptr);
  ASSERT_NE(be.sum_streams, nullptr);
  ASSERT_NE(be.swiglu_clamped_forward, nullptr);
  ASSERT_NE(be.swiglu_clamped_backward, nullptr);
  const int64_t n = 4, D = 24, T = 5, W = n * D;
  const vf x0 = test::randn(T * W, 400), e0 = test::randn(T * D, 401, 5.0f);
  PoolContext cpu(2), dev(2);
  dev.ctx.gpu = &be;
  vf cx = x0, ce = e0, cs(sz(T * D));
  DeviceArray<float> dx(x0, "x"), de(e0, "e"), ds(vf(sz(T * D), -7.0f), "s");
  for (int side = 0; side < 2; ++side) {
    const Context& ctx = side == 0 ? cpu.ctx : dev.ctx;
    float* x = side == 0 ? cx.data() : dx.data();
    float* e = side == 0 ? ce.data() : de.data();
    float* s = side == 0 ? cs.data() : ds.data();
    const Tensor xt = rows_view(x, T, W, W), et = rows_view(e, T, D, D), st = rows_view(s, T, D, D);
    add_to_streams(ctx, xt, et, n);
    sum_streams(ctx, st, xt, n);
    swiglu_clamped_forward(ctx, et, st, et, 3.0f);
    swiglu_clamped_backward(ctx, st, et, st, et, st, 3.0f);
    repeat_streams(ctx, xt, et, n);
  }
  expect_same_bits(dx.host(), cx, "dispatch: x");
  expect_same_bits(ds.host(), cs, "dispatch: s");
}

TEST(GpuStreams, ShapeErrorsAreTheCpuKernelsErrors) {
  Context cpu, dev;
  dev.gpu = &interpret_backend();
  vf a(64), b(64);
  const Tensor x(a.data(), DType::F32, {2, 8}), e(b.data(), DType::F32, {2, 2}),
      e_bad(b.data(), DType::F32, {2, 3});
  const std::vector<std::function<void(const Context&)>> calls = {
      [&](const Context& c) { add_to_streams(c, x, e_bad, 4); },
      [&](const Context& c) { repeat_streams(c, x, e, 0); },
      [&](const Context& c) { sum_streams(c, e, x, 3); },
      [&](const Context& c) { swiglu_clamped_forward(c, e, e, e, 0.0f); },
      [&](const Context& c) { swiglu_clamped_forward(c, e, e_bad, e, 1.0f); },
      [&](const Context& c) { swiglu_clamped_backward(c, e, e, e, e, e, -1.0f); },
      [&](const Context& c) { swiglu_clamped_backward(c, e, e, e_bad, e, e, 1.0f); },
  };
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::string want = error_of([&] { calls[i](cpu); });
    ASSERT_NE(want, "") << "call " << i;
    EXPECT_EQ(error_of([&] { calls[i](dev); }), want) << "call " << i;
  }
}

}  // namespace
}  // namespace lockstep::kernels
