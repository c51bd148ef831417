// The GPU forms of DeepSeek-V4's per-element steps and routed-expert row
// scaling and sums (kernels/gpu/v4_rows.cu) in interpret mode, bit for bit
// against the CPU kernels (kernels/cpu/v4_rows.h, moe.h): odd sizes, strided
// rows, in-place calls, special values, several block shapes
// and grid-stride loops, 1 and 2 pool threads, the race check, and the
// dispatch from the CPU entries. The CPU references run on host copies, so
// this binary runs in strict interpret mode.
//
// Negative controls (done once by hand): scaling by s * 1.0000001f in
// scale_values_kernel failed ScaleValuesMatchesCpu (first at n = 15), 1 ulp
// off; summing the slots in reverse order in sum_rows_kernel failed
// ExpertRowsMatchCpu's moe_sum (first at T = 1, K = 3, F = 1), 1 ulp off.
#include "lockstep/kernels/gpu/v4_rows.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <limits>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "gpu/row_kernel_util.h"
#include "lockstep/kernels/cpu/v4_rows.h"
#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::kernels {
namespace {

namespace G = gpu::interp;
using gpu_test::DeviceArray;
using gpu_test::expect_same_bits;
using gpu_test::PoolContext;

inline size_t sz(int64_t n) {
  return static_cast<size_t>(n);
}

std::vector<G::RowsLaunch> launches() {
  return {G::RowsLaunch{}, G::RowsLaunch{1, 0}, G::RowsLaunch{33, 0}, G::RowsLaunch{64, 3},
          G::RowsLaunch{1024, 1}};
}

std::string name(int64_t n, const G::RowsLaunch& cfg, int threads) {
  return "n=" + std::to_string(n) + " threads/block=" + std::to_string(cfg.threads) +
         " max_blocks=" + std::to_string(cfg.max_blocks) + " pool=" + std::to_string(threads);
}

MoeDispatch random_plan(int64_t T, int64_t K, int E, uint32_t seed) {
  std::vector<int32_t> idx(sz(T * K));
  const std::vector<float> u = test::uniform(T, seed, 0.0f, float(E));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t s = 0; s < K; ++s) idx[sz(t * K + s)] = int32_t((int64_t(u[sz(t)]) + 3 * s) % E);
  return moe_plan(Tensor(idx.data(), DType::I32, {T, K}), E);
}

void check_scale(int64_t n, float s, const G::RowsLaunch& cfg, int threads, uint32_t seed) {
  std::vector<float> x = test::randn(n, seed, 4.0f);
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {-0.0f, 0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(), 1e-40f, FLT_MAX};
  for (size_t i = 0; i < std::size(specials) && i < x.size(); ++i) x[(i * 37 + 5) % x.size()] = specials[i];
  PoolContext pc(threads);
  std::vector<float> c = x;
  scale_values(pc.ctx, Tensor(c.data(), DType::F32, {n}), s);
  DeviceArray<float> d(x, "x");
  G::scale_values(pc.ctx, Tensor(d.data(), DType::F32, {n}), s, cfg);
  expect_same_bits(d.host(), c, name(n, cfg, threads) + " s=" + std::to_string(s));
}

// Forward and backward of the row weights; topk (T, K) with row stride K + 1.
void check_row_weights(int64_t T, int64_t K, const G::RowsLaunch& cfg, int threads, uint32_t seed) {
  const std::string what =
      "T=" + std::to_string(T) + " K=" + std::to_string(K) + " " + name(T * K, cfg, threads);
  const MoeDispatch plan = random_plan(T, K, 6, seed);
  const int64_t ld = K + 1;
  const std::vector<float> w = test::randn(T * ld, seed + 1), g = test::randn(T * K, seed + 2);
  PoolContext pc(threads);
  std::vector<float> cw = w, cg = g, crows(sz(T * K), -7.0f), cdw(sz(T * ld), -7.0f);
  Tensor cwt(cw.data(), DType::F32, {T, K}), cdwt(cdw.data(), DType::F32, {T, K});
  cwt.stride[0] = cdwt.stride[0] = ld;
  moe_row_weights(pc.ctx, Tensor(crows.data(), DType::F32, {T * K, 1}), cwt, plan);
  moe_row_weights_backward(pc.ctx, cdwt, Tensor(cg.data(), DType::F32, {T * K, 1}), plan);
  DeviceArray<float> dw(w, "topk_w"), dg(g, "dw_rows"), drows(std::vector<float>(sz(T * K), -7.0f), "w_rows"),
      ddw(std::vector<float>(sz(T * ld), -7.0f), "dtopk_w");
  Tensor dwt(dw.data(), DType::F32, {T, K}), ddwt(ddw.data(), DType::F32, {T, K});
  dwt.stride[0] = ddwt.stride[0] = ld;
  G::moe_row_weights(pc.ctx, Tensor(drows.data(), DType::F32, {T * K, 1}), dwt, plan, cfg);
  G::moe_row_weights_backward(pc.ctx, ddwt, Tensor(dg.data(), DType::F32, {T * K, 1}), plan, cfg);
  expect_same_bits(drows.host(), crows, what + ": row weights");
  expect_same_bits(ddw.host(), cdw, what + ": their backward");
}

// moe_scale_rows, moe_sum and their backwards on (R, F) rows of stride F + 1
// (padding never written), topk (T, K) of stride K + 2; also dx over dy and
// y over x (in place).
void check_expert_rows(int64_t T, int64_t K, int64_t F, const G::RowsLaunch& cfg, int threads,
                       uint32_t seed) {
  const std::string what = "T=" + std::to_string(T) + " K=" + std::to_string(K) + " F=" + std::to_string(F) +
                           " " + name(T * K, cfg, threads);
  const MoeDispatch plan = random_plan(T, K, 5, seed);
  const int64_t R = T * K, ld = F + 1, wld = K + 2;
  std::vector<float> x = test::randn(R * ld, seed + 1, 2.0f), g = test::randn(R * ld, seed + 2, 2.0f),
                     w = test::randn(T * wld, seed + 3), dyt = test::randn(T * ld, seed + 4);
  x[sz(ld + 1 < R * ld ? ld + 1 : 0)] = -0.0f;  // a -0 through the slot-order sum from +0
  PoolContext pc(threads);
  auto rows = [](float* p, int64_t n, int64_t cols, int64_t stride) {
    return gpu_test::rows_view(p, n, cols, stride);
  };
  // CPU on host copies.
  std::vector<float> cx = x, cg = g, cw = w, cdy = dyt, cy(sz(R * ld), -7.0f), cdw(sz(T * wld), -7.0f),
                     cs(sz(T * ld), -7.0f), cde(sz(R * ld), -7.0f);
  moe_scale_rows(pc.ctx, rows(cy.data(), R, F, ld), rows(cx.data(), R, F, ld), rows(cw.data(), T, K, wld),
                 plan);
  moe_scale_rows_backward(pc.ctx, rows(cg.data(), R, F, ld), rows(cdw.data(), T, K, wld),
                          rows(cg.data(), R, F, ld), rows(cx.data(), R, F, ld), rows(cw.data(), T, K, wld),
                          plan);
  moe_sum(pc.ctx, rows(cs.data(), T, F, ld), rows(cy.data(), R, F, ld), plan);
  moe_sum_backward(pc.ctx, rows(cde.data(), R, F, ld), rows(cdy.data(), T, F, ld), plan);
  moe_scale_rows(pc.ctx, rows(cx.data(), R, F, ld), rows(cx.data(), R, F, ld), rows(cw.data(), T, K, wld),
                 plan);
  // The GPU entries on device buffers.
  DeviceArray<float> dx(x, "x"), dg(g, "dy"), dw(w, "topk_w"), ddy(dyt, "dy_tokens"),
      dy(std::vector<float>(sz(R * ld), -7.0f), "y"), ddw(std::vector<float>(sz(T * wld), -7.0f), "dtopk_w"),
      ds(std::vector<float>(sz(T * ld), -7.0f), "sum"), dde(std::vector<float>(sz(R * ld), -7.0f), "dye");
  G::moe_scale_rows(pc.ctx, rows(dy.data(), R, F, ld), rows(dx.data(), R, F, ld), rows(dw.data(), T, K, wld),
                    plan, cfg);
  G::moe_scale_rows_backward(pc.ctx, rows(dg.data(), R, F, ld), rows(ddw.data(), T, K, wld),
                             rows(dg.data(), R, F, ld), rows(dx.data(), R, F, ld), rows(dw.data(), T, K, wld),
                             plan, cfg);
  G::moe_sum(pc.ctx, rows(ds.data(), T, F, ld), rows(dy.data(), R, F, ld), plan, cfg);
  G::moe_sum_backward(pc.ctx, rows(dde.data(), R, F, ld), rows(ddy.data(), T, F, ld), plan, cfg);
  G::moe_scale_rows(pc.ctx, rows(dx.data(), R, F, ld), rows(dx.data(), R, F, ld), rows(dw.data(), T, K, wld),
                    plan, cfg);
  expect_same_bits(dy.host(), cy, what + ": moe_scale_rows");
  expect_same_bits(dg.host(), cg, what + ": moe_scale_rows_backward dx over dy");
  expect_same_bits(ddw.host(), cdw, what + ": moe_scale_rows_backward dtopk_w");
  expect_same_bits(ds.host(), cs, what + ": moe_sum");
  expect_same_bits(dde.host(), cde, what + ": moe_sum_backward");
  expect_same_bits(dx.host(), cx, what + ": moe_scale_rows in place");
}

TEST(GpuV4Rows, ScaleValuesMatchesCpu) {
  const auto cfgs = launches();
  size_t k = 0;
  for (int64_t n : {1, 15, 17, 257, 1000})
    for (float s : {0.17677669f, -2.5f, 1e-30f}) {
      check_scale(n, s, cfgs[k % cfgs.size()], 1 + int(k % 2), uint32_t(600 + k));
      ++k;
    }
}

TEST(GpuV4Rows, RowWeightsMatchCpu) {
  const auto cfgs = launches();
  size_t k = 0;
  for (int64_t T : {1, 6, 33})
    for (int64_t K : {1, 2, 4}) {
      check_row_weights(T, K, cfgs[k % cfgs.size()], 1 + int(k % 2), uint32_t(700 + k));
      ++k;
    }
}

TEST(GpuV4Rows, ExpertRowsMatchCpu) {
  const auto cfgs = launches();
  size_t k = 0;
  for (int64_t T : {1, 7})
    for (int64_t K : {1, 2, 3})
      for (int64_t F : {1, 17, 40}) {
        check_expert_rows(T, K, F, cfgs[k % cfgs.size()], 1 + int(k % 2), uint32_t(800 + k));
        ++k;
      }
}

TEST(GpuV4Rows, SameBitsInEveryThreadOrder) {
  gpu_test::emu::Options o;
  o.check_races = true;
  gpu_test::emu::ScopedOptions scoped(o);
  check_scale(90, 0.3f, G::RowsLaunch{32, 2}, 2, 14);
  check_row_weights(9, 3, G::RowsLaunch{8, 2}, 2, 15);
  check_expert_rows(5, 2, 33, G::RowsLaunch{16, 2}, 2, 16);
}

TEST(GpuV4Rows, CpuEntriesDispatchToTheInterpretBackend) {
  const GpuBackend& be = interpret_backend();
  ASSERT_NE(be.scale_values, nullptr);
  ASSERT_NE(be.moe_row_weights, nullptr);
  ASSERT_NE(be.moe_row_weights_backward, nullptr);
  ASSERT_NE(be.moe_scale_rows, nullptr);
  ASSERT_NE(be.moe_scale_rows_backward, nullptr);
  ASSERT_NE(be.moe_sum, nullptr);
  ASSERT_NE(be.moe_sum_backward, nullptr);
  const int64_t T = 5, K = 2;
  const MoeDispatch plan = random_plan(T, K, 4, 40);
  const std::vector<float> w = test::randn(T * K, 41);
  PoolContext cpu(2), dev(2);
  dev.ctx.gpu = &be;
  // The device context on device buffers: a CPU kernel reached through it
  // would fault on them in strict mode.
  std::vector<float> cw = w, crows(sz(T * K)), cback(sz(T * K));
  scale_values(cpu.ctx, Tensor(cw.data(), DType::F32, {T, K}), 0.7f);
  moe_row_weights(cpu.ctx, Tensor(crows.data(), DType::F32, {T * K, 1}),
                  Tensor(cw.data(), DType::F32, {T, K}), plan);
  moe_row_weights_backward(cpu.ctx, Tensor(cback.data(), DType::F32, {T, K}),
                           Tensor(crows.data(), DType::F32, {T * K, 1}), plan);
  DeviceArray<float> dw(w, "w"), drows(T * K, "rows"), dback(T * K, "back");
  scale_values(dev.ctx, Tensor(dw.data(), DType::F32, {T, K}), 0.7f);
  moe_row_weights(dev.ctx, Tensor(drows.data(), DType::F32, {T * K, 1}),
                  Tensor(dw.data(), DType::F32, {T, K}), plan);
  moe_row_weights_backward(dev.ctx, Tensor(dback.data(), DType::F32, {T, K}),
                           Tensor(drows.data(), DType::F32, {T * K, 1}), plan);
  expect_same_bits(dw.host(), cw, "dispatch: scale");
  expect_same_bits(drows.host(), crows, "dispatch: row weights");
  expect_same_bits(dback.host(), cback, "dispatch: backward (the weights back in place)");
  expect_same_bits(dback.host(), cw, "backward inverts the gather");
  // The routed experts' entries of moe.h: scale the rows, sum them per token.
  std::vector<float> cscaled(sz(T * K)), csum(sz(T));
  moe_scale_rows(cpu.ctx, Tensor(cscaled.data(), DType::F32, {T * K, 1}),
                 Tensor(crows.data(), DType::F32, {T * K, 1}), Tensor(cw.data(), DType::F32, {T, K}), plan);
  moe_sum(cpu.ctx, Tensor(csum.data(), DType::F32, {T, 1}), Tensor(cscaled.data(), DType::F32, {T * K, 1}),
          plan);
  DeviceArray<float> dscaled(T * K, "scaled"), dsum(T, "sum");
  moe_scale_rows(dev.ctx, Tensor(dscaled.data(), DType::F32, {T * K, 1}),
                 Tensor(drows.data(), DType::F32, {T * K, 1}), Tensor(dw.data(), DType::F32, {T, K}), plan);
  moe_sum(dev.ctx, Tensor(dsum.data(), DType::F32, {T, 1}), Tensor(dscaled.data(), DType::F32, {T * K, 1}),
          plan);
  expect_same_bits(dsum.host(), csum, "dispatch: moe_scale_rows then moe_sum");
}

}  // namespace
}  // namespace lockstep::kernels
