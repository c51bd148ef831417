// The GPU MoE backward kernels (kernels/gpu/moe.cu) in interpret mode against
// the CPU kernels, bit for bit: moe_route_backward over every scoring with and
// without normalisation and scaling (duplicate experts, zero and tiny scores),
// moe_gather_backward and moe_combine_backward on odd shapes, several launch
// geometries, 1 and 2 pool threads, the race checker, the dispatch, and the
// same errors as the CPU.
//
// Negative controls, done once by hand: the gather backward adding each slot
// straight into dx (no separate slot sum) failed GatherBackwardMatchesCpu; the
// route backward writing dp[e] = term instead of 0 + term (so -0 survives)
// and the combine backward's dot chaining its lanes in reverse order each
// failed their tests here.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "lockstep/base/thread_pool.h"
#include "lockstep/kernels/gpu/backend.h"
#include "gpu/moe_test_util.h"
#include "lockstep/kernels/gpu/moe.h"

namespace lockstep::kernels {
namespace {

namespace emu = ::lockstep::gpu::emu;
namespace dev = ::lockstep::kernels::gpu::interp;

using moe_test::DeviceVec;
using moe_test::expect_same_bytes;
using moe_test::kRouteLaunches;
using moe_test::view2;

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

const dev::MoeRowsLaunch kRowsLaunches[] = {{128, 1}, {1, 1}, {7, 3}, {32, 5}, {1024, 2}};

constexpr RouterScoring kScorings[] = {RouterScoring::Softmax, RouterScoring::Sigmoid,
                                       RouterScoring::SqrtSoftplus};

// ---- router backward ---------------------------------------------------------------

struct BwdCase {
  RouterConfig cfg;
  int64_t T = 1;
  bool dup = false;  // some tokens list an expert twice
  uint32_t seed = 1;
  int64_t pad = 0;  // extra elements per row of every 2-D operand
  std::string name() const {
    return "E=" + std::to_string(cfg.num_experts) + " K=" + std::to_string(cfg.top_k) +
           " T=" + std::to_string(T) + " scoring=" + std::to_string(static_cast<int>(cfg.scoring)) +
           " norm=" + std::to_string(cfg.normalize) + " scale=" + std::to_string(cfg.routed_scaling) +
           " dup=" + std::to_string(dup) + " pad=" + std::to_string(pad);
  }
};

RouterConfig make_cfg(int E, int K, RouterScoring sc, bool normalize, float scaling) {
  RouterConfig c;
  c.num_experts = E;
  c.top_k = K;
  c.scoring = sc;
  c.normalize = normalize;
  c.routed_scaling = scaling;
  return c;
}

// The three inputs of one router backward: scores (T, E + pad) in the range
// of the scoring, with exact zeros, tiny values (the sqrt-softplus gradient's
// small-sigmoid branch) and -0 gradients; topk_idx (T, K + pad); dtopk_w (T, K + pad).
struct BwdInputs {
  std::vector<float> p, g;
  std::vector<int32_t> idx;
};

BwdInputs make_bwd_inputs(const BwdCase& c) {
  const int E = c.cfg.num_experts, K = c.cfg.top_k;
  const int64_t SE = E + c.pad, SK = K + c.pad;
  std::mt19937 gen(c.seed);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  BwdInputs in;
  in.p.assign(static_cast<size_t>(c.T * SE), -7.0f);
  in.g.assign(static_cast<size_t>(c.T * SK), -7.0f);
  in.idx.assign(static_cast<size_t>(c.T * SK), -1);
  const float special[] = {0.0f, 1e-20f, 1e-4f, 0.05f, 3.5f};
  std::vector<int32_t> perm(static_cast<size_t>(E));
  for (int64_t t = 0; t < c.T; ++t) {
    for (int e = 0; e < E; ++e) {
      float v = c.cfg.scoring == RouterScoring::SqrtSoftplus ? 3.0f * unit(gen) : unit(gen);
      if (gen() % 6 == 0) v = special[gen() % 5];
      if (c.cfg.scoring != RouterScoring::SqrtSoftplus) v = std::min(v, 1.0f);
      in.p[static_cast<size_t>(t * SE + e)] = v;
    }
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), gen);
    for (int s = 0; s < K; ++s) {
      int32_t e = perm[static_cast<size_t>(s)];
      if (c.dup && s > 0 && gen() % 3 == 0) e = in.idx[static_cast<size_t>(t * SK)];  // slot 0's expert again
      in.idx[static_cast<size_t>(t * SK + s)] = e;
      float gv = normal(gen);
      if (gen() % 7 == 0) gv = gen() % 2 ? -0.0f : 0.0f;
      in.g[static_cast<size_t>(t * SK + s)] = gv;
    }
  }
  return in;
}

// dlogits (T, E + pad) of case c on the CPU (launch null) or the GPU kernel
// on device copies of every operand.
std::vector<float> run_route_backward(const Context& ctx, const BwdCase& c, const dev::MoeRouteLaunch* launch) {
  const int64_t E = c.cfg.num_experts, K = c.cfg.top_k, T = c.T, SE = E + c.pad, SK = K + c.pad;
  BwdInputs in = make_bwd_inputs(c);
  std::vector<float> dz(static_cast<size_t>(T * SE), 5.0f);
  if (launch == nullptr) {
    moe_route_backward(ctx, view2(dz.data(), DType::F32, T, E, SE), view2(in.g.data(), DType::F32, T, K, SK),
                       view2(in.p.data(), DType::F32, T, E, SE), view2(in.idx.data(), DType::I32, T, K, SK), c.cfg);
    return dz;
  }
  DeviceVec<float> ddz(dz, "dlogits"), dg(in.g, "dtopk_w"), dp(in.p, "scores");
  DeviceVec<int32_t> didx(in.idx, "topk_idx");
  dev::moe_route_backward(ctx, view2(ddz.data(), DType::F32, T, E, SE), view2(dg.data(), DType::F32, T, K, SK),
                          view2(dp.data(), DType::F32, T, E, SE), view2(didx.data(), DType::I32, T, K, SK), c.cfg,
                          *launch);
  return ddz.host(dz.size());
}

void expect_route_backward_matches(const Context& ctx, const BwdCase& c, const dev::MoeRouteLaunch& launch) {
  expect_same_bytes(run_route_backward(ctx, c, &launch), run_route_backward(ctx, c, nullptr),
                    c.name() + " launch=" + std::to_string(launch.threads) + "/" + std::to_string(launch.max_blocks));
}

TEST(GpuMoeBackward, RouteBackwardMatchesCpuOnEveryConfig) {
  Context ctx;
  int n = 0;
  for (int E : {1, 4, 8, 17, 64})
    for (int K : {1, 2, 4, 8}) {
      if (K > E) continue;
      for (int64_t T : {1, 7, 33})
        for (RouterScoring sc : kScorings)
          for (int variant = 0; variant < 4; ++variant) {
            BwdCase c;
            c.cfg = make_cfg(E, K, sc, variant & 1, variant & 2 ? 2.5f : 1.0f);
            c.T = T;
            c.dup = K > 1 && n % 3 == 0;
            c.seed = static_cast<uint32_t>(100 + n);
            c.pad = n % 5 == 0 ? 3 : 0;
            expect_route_backward_matches(ctx, c, kRouteLaunches[n % std::size(kRouteLaunches)]);
            ++n;
          }
    }
}

TEST(GpuMoeBackward, RouteBackwardMatchesCpuInEveryLaunch) {
  Context ctx;
  for (const auto& launch : kRouteLaunches)
    for (RouterScoring sc : kScorings)
      for (bool norm : {false, true}) {
        BwdCase c;
        c.cfg = make_cfg(64, 8, sc, norm, 1.5f);
        c.T = 17;
        c.dup = true;
        c.seed = 7;
        expect_route_backward_matches(ctx, c, launch);
      }
}

// ---- gather and combine backward ------------------------------------------------------

// Random topk_idx (T, K) with distinct experts per token.
std::vector<int32_t> make_topk(int64_t T, int K, int E, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<int32_t> idx(static_cast<size_t>(T * K));
  std::vector<int32_t> perm(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), g);
    for (int s = 0; s < K; ++s) idx[static_cast<size_t>(t * K + s)] = perm[static_cast<size_t>(s)];
  }
  return idx;
}

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = g() % 9 == 0 ? -0.0f : normal(g);  // signed zeros through the sums
  return v;
}

std::string shape_name(const char* what, int E, int K, int64_t T, int64_t D, const dev::MoeRowsLaunch& launch) {
  return std::string(what) + " E=" + std::to_string(E) + " K=" + std::to_string(K) + " T=" + std::to_string(T) +
         " D=" + std::to_string(D) + " launch=" + std::to_string(launch.threads) + "/" +
         std::to_string(launch.rows_per_block);
}

// dx (T, D) += the slot sums of dxe (R, D), rows padded by `pad` elements.
void expect_gather_backward_matches(const Context& ctx, int E, int K, int64_t T, int64_t D, int64_t pad,
                                    const dev::MoeRowsLaunch& launch, uint32_t seed) {
  std::vector<int32_t> topk = make_topk(T, K, E, seed);
  const MoeDispatch plan = moe_plan(Tensor(topk.data(), DType::I32, {T, K}), E);
  const int64_t R = T * K, S = D + pad;
  const std::vector<float> dxe = random_floats(static_cast<size_t>(R * S), seed + 1);
  const std::vector<float> dx0 = random_floats(static_cast<size_t>(T * S), seed + 2);
  std::vector<float> want = dx0, hdxe = dxe;
  moe_gather_backward(ctx, view2(want.data(), DType::F32, T, D, S), view2(hdxe.data(), DType::F32, R, D, S), plan);
  DeviceVec<float> ddx(dx0, "dx"), ddxe(dxe, "dxe");
  dev::moe_gather_backward(ctx, view2(ddx.data(), DType::F32, T, D, S), view2(ddxe.data(), DType::F32, R, D, S),
                           plan, launch);
  expect_same_bytes(ddx.host(want.size()), want, shape_name("gather_backward", E, K, T, D, launch));
}

// dye (R, D) and dtopk_w (T, K) from dy (T, D), ye (R, D), topk_w (T, K).
void expect_combine_backward_matches(const Context& ctx, int E, int K, int64_t T, int64_t D, int64_t pad,
                                     const dev::MoeRowsLaunch& launch, uint32_t seed) {
  std::vector<int32_t> topk = make_topk(T, K, E, seed);
  const MoeDispatch plan = moe_plan(Tensor(topk.data(), DType::I32, {T, K}), E);
  const int64_t R = T * K, S = D + pad, SK = K + pad;
  std::vector<float> dy = random_floats(static_cast<size_t>(T * S), seed + 1);
  std::vector<float> ye = random_floats(static_cast<size_t>(R * S), seed + 2);
  std::vector<float> w = random_floats(static_cast<size_t>(T * SK), seed + 3);
  std::vector<float> dye(static_cast<size_t>(R * S), 9.0f), dw(static_cast<size_t>(T * SK), 9.0f);
  DeviceVec<float> ddy(dy, "dy"), dye_in(ye, "ye"), dwt(w, "topk_w"), ddye(dye, "dye"), ddw(dw, "dtopk_w");
  moe_combine_backward(ctx, view2(dye.data(), DType::F32, R, D, S), view2(dw.data(), DType::F32, T, K, SK),
                       view2(dy.data(), DType::F32, T, D, S), view2(ye.data(), DType::F32, R, D, S),
                       view2(w.data(), DType::F32, T, K, SK), plan);
  dev::moe_combine_backward(ctx, view2(ddye.data(), DType::F32, R, D, S), view2(ddw.data(), DType::F32, T, K, SK),
                            view2(ddy.data(), DType::F32, T, D, S), view2(dye_in.data(), DType::F32, R, D, S),
                            view2(dwt.data(), DType::F32, T, K, SK), plan, launch);
  const std::string what = shape_name("combine_backward", E, K, T, D, launch);
  expect_same_bytes(ddye.host(dye.size()), dye, what + " dye");
  expect_same_bytes(ddw.host(dw.size()), dw, what + " dtopk_w");
}

TEST(GpuMoeBackward, GatherBackwardMatchesCpu) {
  Context ctx;
  int n = 0;
  for (int E : {1, 4, 8, 64})
    for (int K : {1, 2, 4, 8}) {
      if (K > E) continue;
      for (int64_t T : {1, 7, 33})
        for (int64_t D : {1, 7, 33, 100}) {
          expect_gather_backward_matches(ctx, E, K, T, D, n % 3 == 0 ? 3 : 0,
                                         kRowsLaunches[n % std::size(kRowsLaunches)], static_cast<uint32_t>(n + 1));
          ++n;
        }
    }
}

TEST(GpuMoeBackward, CombineBackwardMatchesCpu) {
  Context ctx;
  int n = 0;
  for (int E : {1, 4, 8, 64})
    for (int K : {1, 2, 4, 8}) {
      if (K > E) continue;
      for (int64_t T : {1, 7, 33})
        for (int64_t D : {0, 1, 7, 17, 33, 129}) {
          expect_combine_backward_matches(ctx, E, K, T, D, n % 3 == 0 ? 3 : 0,
                                          kRowsLaunches[n % std::size(kRowsLaunches)], static_cast<uint32_t>(n + 1));
          ++n;
        }
    }
}

TEST(GpuMoeBackward, RaceFreeAndPoolIndependent) {
  {
    emu::Options o;
    o.check_races = true;
    emu::ScopedOptions scoped(o);
    Context ctx;
    BwdCase c;
    c.cfg = make_cfg(17, 4, RouterScoring::Softmax, true, 2.5f);
    c.T = 7;
    c.dup = true;
    expect_route_backward_matches(ctx, c, {5, 3});
    expect_gather_backward_matches(ctx, 8, 4, 7, 33, 2, {7, 3}, 11);
    expect_combine_backward_matches(ctx, 8, 4, 7, 33, 2, {7, 3}, 11);
  }
  auto pool = make_pool(2);
  Context ctx2;
  ctx2.pool = pool.get();
  for (RouterScoring sc : kScorings) {
    BwdCase c;
    c.cfg = make_cfg(64, 8, sc, true, 2.5f);
    c.T = 33;
    expect_route_backward_matches(ctx2, c, {64, 0});
    expect_route_backward_matches(ctx2, c, {7, 4});
  }
  for (const auto& launch : kRowsLaunches) {
    expect_gather_backward_matches(ctx2, 64, 8, 33, 17, 0, launch, 21);
    expect_combine_backward_matches(ctx2, 64, 8, 33, 17, 0, launch, 21);
  }
}

TEST(GpuMoeBackward, RejectsWhatTheCpuRejectsWithTheSameError) {
  Context ctx;
  const RouterConfig cfg = make_cfg(8, 2, RouterScoring::Sigmoid, false, 1.0f);
  std::vector<float> dz(24), g(6), p(24, 0.5f);
  std::vector<int32_t> idx = {0, 1, 2, 8, 3, 4};  // token 1 slot 1 out of range
  const Tensor tdz(dz.data(), DType::F32, {3, 8}), tg(g.data(), DType::F32, {3, 2}), tp(p.data(), DType::F32, {3, 8});
  const Tensor ti(idx.data(), DType::I32, {3, 2});
  std::string cpu = error_of([&] { moe_route_backward(ctx, tdz, tg, tp, ti, cfg); });
  std::string gpu = error_of([&] { dev::moe_route_backward(ctx, tdz, tg, tp, ti, cfg, {}); });
  EXPECT_NE(cpu.find("token 1 slot 1 has expert index 8"), std::string::npos) << cpu;
  EXPECT_EQ(gpu, cpu);
  const Tensor tg_bad(g.data(), DType::F32, {2, 3});
  cpu = error_of([&] { moe_route_backward(ctx, tdz, tg_bad, tp, ti, cfg); });
  gpu = error_of([&] { dev::moe_route_backward(ctx, tdz, tg_bad, tp, ti, cfg, {}); });
  EXPECT_NE(cpu, "");
  EXPECT_EQ(gpu, cpu);
  idx[3] = 5;
  const std::string launch = error_of([&] { dev::moe_route_backward(ctx, tdz, tg, tp, ti, cfg, {512, 0}); });
  EXPECT_NE(launch.find("bad launch"), std::string::npos) << launch;

  const MoeDispatch plan = moe_plan(ti, 8);  // T = 3, K = 2, R = 6
  std::vector<float> a(6 * 5), b(3 * 5), c(6);
  const Tensor rows(a.data(), DType::F32, {6, 5}), tok_bad(b.data(), DType::F32, {3, 4}),
      tok(b.data(), DType::F32, {3, 5}), w(c.data(), DType::F32, {3, 2});
  cpu = error_of([&] { moe_gather_backward(ctx, tok_bad, rows, plan); });
  gpu = error_of([&] { dev::moe_gather_backward(ctx, tok_bad, rows, plan, {}); });
  EXPECT_NE(cpu, "");
  EXPECT_EQ(gpu, cpu);
  cpu = error_of([&] { moe_combine_backward(ctx, rows, w, tok_bad, rows, w, plan); });
  gpu = error_of([&] { dev::moe_combine_backward(ctx, rows, w, tok_bad, rows, w, plan, {}); });
  EXPECT_NE(cpu, "");
  EXPECT_EQ(gpu, cpu);
  const std::string rows_launch = error_of([&] { dev::moe_gather_backward(ctx, tok, rows, plan, {0, 1}); });
  EXPECT_NE(rows_launch.find("bad launch"), std::string::npos) << rows_launch;
}

// ---- through the dispatch -------------------------------------------------------------

TEST(GpuMoeBackward, CpuEntriesForwardToTheInterpretBackendWithTheCpuBits) {
  // The dispatch itself, on host vectors: the pointer check (emu_test, and
  // every kernel test above on device buffers) is off for it.
  emu::Options o = emu::options();
  o.check_pointers = false;
  const emu::ScopedOptions scoped(o);
  const GpuBackend& be = interpret_backend();
  ASSERT_NE(be.moe_route_backward, nullptr);
  ASSERT_NE(be.moe_gather_backward, nullptr);
  ASSERT_NE(be.moe_combine_backward, nullptr);
  for (int threads : {1, 2}) {
    auto pool = make_pool(threads);
    Context cpu;
    cpu.pool = pool.get();
    Context gpu = cpu;
    gpu.gpu = &be;
    const int E = 64, K = 8;
    const int64_t T = 33, D = 19, R = T * K;
    for (RouterScoring sc : kScorings) {
      BwdCase c;
      c.cfg = make_cfg(E, K, sc, true, 2.5f);
      c.T = T;
      c.dup = true;
      c.seed = 3;
      // Host buffers: in interpret mode device memory is host memory.
      expect_same_bytes(run_route_backward(gpu, c, nullptr), run_route_backward(cpu, c, nullptr),
                        "dispatch route_backward " + c.name());
    }
    std::vector<int32_t> topk = make_topk(T, K, E, 5);
    const MoeDispatch plan = moe_plan(Tensor(topk.data(), DType::I32, {T, K}), E);
    std::vector<float> rows_in = random_floats(static_cast<size_t>(R * D), 6);
    std::vector<float> dy = random_floats(static_cast<size_t>(T * D), 7);
    std::vector<float> w = random_floats(static_cast<size_t>(T * K), 8);
    std::vector<float> dx[2], dye[2], dw[2];
    for (int k = 0; k < 2; ++k) {
      const Context& ctx = k == 0 ? cpu : gpu;
      dx[k] = random_floats(static_cast<size_t>(T * D), 9);
      dye[k].assign(static_cast<size_t>(R * D), 0.0f);
      dw[k].assign(static_cast<size_t>(T * K), 0.0f);
      moe_gather_backward(ctx, Tensor(dx[k].data(), DType::F32, {T, D}), Tensor(rows_in.data(), DType::F32, {R, D}),
                          plan);
      moe_combine_backward(ctx, Tensor(dye[k].data(), DType::F32, {R, D}), Tensor(dw[k].data(), DType::F32, {T, K}),
                           Tensor(dy.data(), DType::F32, {T, D}), Tensor(rows_in.data(), DType::F32, {R, D}),
                           Tensor(w.data(), DType::F32, {T, K}), plan);
    }
    expect_same_bytes(dx[1], dx[0], "dispatch gather_backward");
    expect_same_bytes(dye[1], dye[0], "dispatch combine_backward dye");
    expect_same_bytes(dw[1], dw[0], "dispatch combine_backward dtopk_w");
  }
}

}  // namespace
}  // namespace lockstep::kernels
