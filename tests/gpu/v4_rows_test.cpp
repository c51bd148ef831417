// The GPU forms of DeepSeek-V4's per-element steps (kernels/gpu/v4_rows.cu)
// in interpret mode, bit for bit against the CPU kernels
// (kernels/cpu/v4_rows.h): odd sizes, special values, several block shapes
// and grid-stride loops, 1 and 2 pool threads, the race check, and the
// dispatch from the CPU entries. The CPU references run on host copies, so
// this binary runs in strict interpret mode.
//
// Negative control (done once by hand): scaling by s * 1.0000001f in
// scale_values_kernel failed ScaleValuesMatchesCpu (first at n = 15), 1 ulp
// off.
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

TEST(GpuV4Rows, SameBitsInEveryThreadOrder) {
  gpu_test::emu::Options o;
  o.check_races = true;
  gpu_test::emu::ScopedOptions scoped(o);
  check_scale(90, 0.3f, G::RowsLaunch{32, 2}, 2, 14);
  check_row_weights(9, 3, G::RowsLaunch{8, 2}, 2, 15);
}

TEST(GpuV4Rows, CpuEntriesDispatchToTheInterpretBackend) {
  const GpuBackend& be = interpret_backend();
  ASSERT_NE(be.scale_values, nullptr);
  ASSERT_NE(be.moe_row_weights, nullptr);
  ASSERT_NE(be.moe_row_weights_backward, nullptr);
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
}

}  // namespace
}  // namespace lockstep::kernels
