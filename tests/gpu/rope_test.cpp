// The GPU rotate-half RoPE (kernels/gpu/rope.cu) in interpret mode, bit for bit
// against the CPU's table forms (kernels/cpu/rope.h): head widths from 2, heads
// and tokens strided inside a fused buffer, positions at both ends of the
// table, several block shapes and grid-stride loops, 1 and 2 pool threads, the
// race check, and the dispatch through the interpret backend.
//
// Negative control (done once by hand): forming hi = b * c + a * s as one FMA,
// fma(a, s, b * c), failed ForwardAndBackwardMatchCpu from its second case
// (T = 5, Dh = 2) on, 1 ulp off.
#include "lockstep/kernels/gpu/rope.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "gpu/row_kernel_util.h"
#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::kernels {
namespace {

namespace G = gpu::interp;
using gpu_test::DeviceArray;
using gpu_test::error_of;
using gpu_test::expect_same_bits;
using gpu_test::PoolContext;

struct Shape {
  int64_t T, H, Dh;
  int64_t ldh, ldt;  // head and token strides of x (>= Dh, >= H * ldh)
};

// x (T, H, Dh) over p with the shape's strides.
Tensor heads_view(float* p, const Shape& s) {
  Tensor t(p, DType::F32, {s.T, s.H, s.Dh});
  t.stride[0] = s.ldt;
  t.stride[1] = s.ldh;
  return t;
}

// Random positions in [0, max_pos), the first token at 0 and the last at max_pos - 1.
std::vector<int32_t> positions(int64_t T, int32_t max_pos, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int32_t> d(0, max_pos - 1);
  std::vector<int32_t> p(static_cast<size_t>(T));
  for (auto& v : p) v = d(g);
  p.front() = 0;
  p.back() = max_pos - 1;
  return p;
}

std::vector<G::RopeLaunch> launches() {
  return {G::RopeLaunch{}, G::RopeLaunch{1, 0}, G::RopeLaunch{32, 0}, G::RopeLaunch{64, 2},
          G::RopeLaunch{7, 1}};
}

// ctx on the interpret backend: a table built there lies in device memory,
// which both the CPU and the GPU kernels read.
Context device_context(const Context& ctx) {
  Context c = ctx;
  c.gpu = &interpret_backend();
  return c;
}

// Forward then backward on both sides, x compared after each.
void check(const Shape& s, const G::RopeLaunch& cfg, int threads, double theta, uint32_t seed) {
  const std::string what = "T=" + std::to_string(s.T) + " H=" + std::to_string(s.H) +
                           " Dh=" + std::to_string(s.Dh) + " threads/block=" + std::to_string(cfg.threads) +
                           " max_blocks=" + std::to_string(cfg.max_blocks) +
                           " pool=" + std::to_string(threads);
  PoolContext pc(threads);
  const int32_t max_pos = 300;
  const RopeTable table = make_rope_table(device_context(pc.ctx), s.Dh, theta, max_pos);
  const int64_t n = s.T * s.ldt;
  const std::vector<float> x = test::randn(n, seed, 2.0f);
  std::vector<int32_t> pos = positions(s.T, max_pos, seed + 1);

  std::vector<float> xc = x;
  const Tensor cpos(pos.data(), DType::I32, {s.T});
  DeviceArray<float> dx(x, "x");
  DeviceArray<int32_t> dpos(pos, "positions");
  const Tensor gpos(dpos.data(), DType::I32, {s.T});

  rope_forward(pc.ctx, heads_view(xc.data(), s), cpos, table);
  G::rope_forward(pc.ctx, heads_view(dx.data(), s), gpos, table, cfg);
  expect_same_bits(dx.host(), xc, what + ": forward");
  rope_backward(pc.ctx, heads_view(xc.data(), s), cpos, table);
  G::rope_backward(pc.ctx, heads_view(dx.data(), s), gpos, table, cfg);
  expect_same_bits(dx.host(), xc, what + ": backward");
}

// DeepSeek-V4's interleaved pairs: forward then inverse on both sides.
void check_interleaved(const Shape& s, const G::RopeLaunch& cfg, int threads, double theta, uint32_t seed) {
  const std::string what = "interleaved T=" + std::to_string(s.T) + " H=" + std::to_string(s.H) +
                           " Dh=" + std::to_string(s.Dh) + " threads/block=" + std::to_string(cfg.threads) +
                           " pool=" + std::to_string(threads);
  PoolContext pc(threads);
  const int32_t max_pos = 300;
  const RopeTable table = make_rope_table(device_context(pc.ctx), s.Dh, theta, max_pos);
  const std::vector<float> x = test::randn(s.T * s.ldt, seed, 2.0f);
  std::vector<int32_t> pos = positions(s.T, max_pos, seed + 1);
  std::vector<float> xc = x;
  const Tensor cpos(pos.data(), DType::I32, {s.T});
  DeviceArray<float> dx(x, "x");
  DeviceArray<int32_t> dpos(pos, "positions");
  const Tensor gpos(dpos.data(), DType::I32, {s.T});
  rope_interleaved_forward(pc.ctx, heads_view(xc.data(), s), cpos, table);
  G::rope_interleaved_forward(pc.ctx, heads_view(dx.data(), s), gpos, table, cfg);
  expect_same_bits(dx.host(), xc, what + ": forward");
  rope_interleaved_inverse(pc.ctx, heads_view(xc.data(), s), cpos, table);
  G::rope_interleaved_inverse(pc.ctx, heads_view(dx.data(), s), gpos, table, cfg);
  expect_same_bits(dx.host(), xc, what + ": inverse");
}

TEST(GpuRope, ForwardAndBackwardMatchCpu) {
  const auto cfgs = launches();
  size_t k = 0;
  for (int64_t Dh : {2, 6, 8, 64, 100})
    for (int64_t H : {1, 3})
      for (int64_t T : {1, 5, 33}) {
        // Every other case strided: heads padded by 2, tokens by 5 (a view into a fused buffer).
        const bool strided = k % 2 == 1;
        const int64_t ldh = strided ? Dh + 2 : Dh, ldt = strided ? H * ldh + 5 : H * ldh;
        check({T, H, Dh, ldh, ldt}, cfgs[k % cfgs.size()], 1 + int(k % 2), k % 3 == 0 ? 1e6 : 10000.0,
              uint32_t(100 + k));
        ++k;
      }
}

TEST(GpuRope, InterleavedForwardAndInverseMatchCpu) {
  const auto cfgs = launches();
  size_t k = 0;
  for (int64_t Dh : {2, 8, 64})
    for (int64_t H : {1, 3})
      for (int64_t T : {1, 5, 33}) {
        const bool strided = k % 2 == 1;
        const int64_t ldh = strided ? Dh + 2 : Dh, ldt = strided ? H * ldh + 5 : H * ldh;
        check_interleaved({T, H, Dh, ldh, ldt}, cfgs[k % cfgs.size()], 1 + int(k % 2), 10000.0,
                          uint32_t(500 + k));
        if (HasFatalFailure()) return;
        ++k;
      }
}

TEST(GpuRope, EveryLaunchShapeGivesTheSameBits) {
  for (const auto& cfg : launches()) check({9, 4, 16, 20, 90}, cfg, 2, 10000.0, 7);
}

TEST(GpuRope, SameBitsInEveryThreadOrder) {
  gpu_test::emu::Options o;
  o.check_races = true;
  gpu_test::emu::ScopedOptions scoped(o);
  check({7, 2, 12, 14, 30}, G::RopeLaunch{16, 0}, 2, 10000.0, 11);
  check({7, 2, 12, 14, 30}, G::RopeLaunch{16, 2}, 1, 10000.0, 12);
}

TEST(GpuRope, CpuEntriesDispatchToTheInterpretBackend) {
  const GpuBackend& be = interpret_backend();
  ASSERT_NE(be.rope_forward, nullptr);
  ASSERT_NE(be.rope_backward, nullptr);
  const Shape s{6, 2, 10, 10, 20};
  for (int threads : {1, 2}) {
    PoolContext cpu(threads), dev(threads);
    dev.ctx.gpu = &be;
    const RopeTable table = make_rope_table(dev.ctx, s.Dh, 10000.0, 50);  // in device memory: both sides read it
    const std::vector<float> x = test::randn(s.T * s.ldt, 3);
    std::vector<int32_t> pos = positions(s.T, 50, 4);
    std::vector<float> out[2];
    for (int side = 0; side < 2; ++side) {
      const Context& ctx = side == 0 ? cpu.ctx : dev.ctx;
      DeviceArray<float> dx(x, "x");
      DeviceArray<int32_t> dpos(pos, "positions");
      rope_forward(ctx, heads_view(dx.data(), s), Tensor(dpos.data(), DType::I32, {s.T}), table);
      out[side] = dx.host();
      rope_backward(ctx, heads_view(dx.data(), s), Tensor(dpos.data(), DType::I32, {s.T}), table);
      const auto back = dx.host();
      out[side].insert(out[side].end(), back.begin(), back.end());
    }
    expect_same_bits(out[1], out[0], "dispatch, threads=" + std::to_string(threads));
  }
}

TEST(GpuRope, ArgumentErrorsAreTheCpuKernelsErrors) {
  Context cpu, dev;
  dev.gpu = &interpret_backend();
  const RopeTable table = make_rope_table(dev, 8, 10000.0, 4);
  std::vector<float> x(2 * 8);
  std::vector<int32_t> far = {0, 4}, neg = {-1, 0};
  const Tensor tx(x.data(), DType::F32, {2, 1, 8}), t6(x.data(), DType::F32, {2, 1, 6});
  const Tensor pfar(far.data(), DType::I32, {2}), pneg(neg.data(), DType::I32, {2});
  for (const auto& call : std::vector<std::function<void(const Context&)>>{
           [&](const Context& c) { rope_forward(c, tx, pfar, table); },
           [&](const Context& c) { rope_backward(c, tx, pneg, table); },
           [&](const Context& c) { rope_forward(c, t6, pfar, table); }}) {
    const std::string want = error_of([&] { call(cpu); });
    ASSERT_NE(want, "");
    EXPECT_EQ(error_of([&] { call(dev); }), want);
  }
}

}  // namespace
}  // namespace lockstep::kernels
