// The GPU MoE kernels (kernels/gpu/moe.cu) in interpret mode against the CPU
// kernels, bit for bit: the router over every RouterConfig variant (three
// scorings, bias, normalisation, scaling, group limits, replay, planted ties,
// NaN / inf logits), gather for every dtype and combine, on odd shapes,
// several launch geometries, 1 and 2 pool threads, and through the dispatch.
//
// Negative controls, done once by hand: the combine summing its slots in
// reverse order (CombineMatchesCpu), the router's ranking breaking ties to the
// higher index (every router test with planted ties), and the canonical sum
// adding each lane's elements in reverse order (RouteMatchesCpuOnEveryConfig,
// softmax with E = 64) each failed here.
#include "gpu/moe_test_util.h"
#include "lockstep/kernels/gpu/moe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "lockstep/base/thread_pool.h"
#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::kernels {
namespace {

namespace emu = ::lockstep::gpu::emu;
namespace dev = ::lockstep::kernels::gpu::interp;

using moe_test::DeviceVec;
using moe_test::expect_same_bytes;
using moe_test::kRouteLaunches;
using moe_test::view2;

const dev::MoeRowsLaunch kRowsLaunches[] = {{128, 1}, {1, 1}, {7, 3}, {32, 5}, {1024, 2}};

// ---- router -----------------------------------------------------------------------

enum class Data { Normal, Ties, Special };

struct RouteCase {
  RouterConfig cfg;
  int64_t T = 1;
  bool bias = false;
  bool replay = false;
  Data data = Data::Normal;
  uint32_t seed = 1;
  int64_t pad = 0;  // extra elements per row of every 2-D operand
  std::string name() const {
    return "E=" + std::to_string(cfg.num_experts) + " K=" + std::to_string(cfg.top_k) +
           " T=" + std::to_string(T) + " scoring=" + std::to_string(static_cast<int>(cfg.scoring)) +
           " norm=" + std::to_string(cfg.normalize) + " scale=" + std::to_string(cfg.routed_scaling) +
           " groups=" + std::to_string(cfg.n_group) + "/" + std::to_string(cfg.topk_group) +
           " bias=" + std::to_string(bias) + " replay=" + std::to_string(replay) +
           " data=" + std::to_string(static_cast<int>(data)) + " pad=" + std::to_string(pad);
  }
};

// Logits (T, E + pad): normal; a few repeated values (equal scores, so the
// ranking's tie rule decides); or specials (NaN, +-inf, past the softplus
// threshold, very negative) among normal values.
std::vector<float> make_logits(const RouteCase& c) {
  const int64_t E = c.cfg.num_experts, S = E + c.pad;
  std::mt19937 g(c.seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  const float ties[] = {-1.0f, 0.0f, 0.5f, 1.0f};
  const float special[] = {std::numeric_limits<float>::quiet_NaN(),
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           25.0f,
                           20.0f,
                           -120.0f,
                           -0.0f,
                           88.5f};
  std::vector<float> z(static_cast<size_t>(c.T * S), -77.0f);  // pads hold a marker
  for (int64_t t = 0; t < c.T; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      float& v = z[static_cast<size_t>(t * S + e)];
      v = normal(g);
      if (c.data == Data::Ties) v = ties[g() % 4];
      if (c.data == Data::Special && g() % 4 == 0) v = special[g() % 8];
    }
  }
  return z;
}

std::vector<float> make_bias(const RouteCase& c) {
  std::mt19937 g(c.seed * 7 + 3);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  std::vector<float> b(static_cast<size_t>(c.cfg.num_experts));
  for (auto& v : b) v = c.data == Data::Ties ? (g() % 2 ? 0.25f : 0.0f) : normal(g);
  return b;
}

// Distinct experts per token (T, K + pad).
std::vector<int32_t> make_replay(const RouteCase& c) {
  const int E = c.cfg.num_experts, K = c.cfg.top_k;
  std::mt19937 g(c.seed * 13 + 5);
  std::vector<int32_t> r(static_cast<size_t>(c.T * (K + c.pad)), -1);
  std::vector<int32_t> perm(static_cast<size_t>(E));
  for (int64_t t = 0; t < c.T; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), g);
    for (int s = 0; s < K; ++s) r[static_cast<size_t>(t * (K + c.pad) + s)] = perm[static_cast<size_t>(s)];
  }
  return r;
}

// Output buffers of one routing call, starting from the same fill.
struct RouteOut {
  std::vector<int32_t> idx;
  std::vector<float> w, p;
};

RouteOut route_start(const RouteCase& c) {
  const int64_t E = c.cfg.num_experts, K = c.cfg.top_k;
  RouteOut o;
  o.idx.assign(static_cast<size_t>(c.T * (K + c.pad)), -9);
  o.w.assign(static_cast<size_t>(c.T * (K + c.pad)), -5.0f);
  o.p.assign(static_cast<size_t>(c.T * (E + c.pad)), -3.0f);
  return o;
}

// Routes case c on the CPU (ctx.gpu unset) or, with `launch`, with the GPU
// kernel on device copies of every operand.
RouteOut run_route(const Context& ctx, const RouteCase& c, const dev::MoeRouteLaunch* launch) {
  const int64_t E = c.cfg.num_experts, K = c.cfg.top_k, T = c.T;
  const std::vector<float> z = make_logits(c), b = make_bias(c);
  const std::vector<int32_t> rep = make_replay(c);
  RouteOut o = route_start(c);
  DeviceVec<float> dz(z, "router_logits"), db(b, "bias"), dw(o.w, "topk_w"), dp(o.p, "scores");
  DeviceVec<int32_t> drep(rep, "replay_idx"), didx(o.idx, "topk_idx");
  const bool on_dev = launch != nullptr;
  std::vector<float> hz = z, hb = b;
  std::vector<int32_t> hrep = rep;
  float* zp = on_dev ? dz.data() : hz.data();
  float* bp = on_dev ? db.data() : hb.data();
  int32_t* rp = on_dev ? drep.data() : hrep.data();
  float* wp = on_dev ? dw.data() : o.w.data();
  float* pp = on_dev ? dp.data() : o.p.data();
  int32_t* ip = on_dev ? didx.data() : o.idx.data();
  const Tensor logits = view2(zp, DType::F32, T, E, E + c.pad);
  const Tensor bias = c.bias ? Tensor(bp, DType::F32, {E}) : Tensor{};
  const Tensor replay = c.replay ? view2(rp, DType::I32, T, K, K + c.pad) : Tensor{};
  const Tensor idx = view2(ip, DType::I32, T, K, K + c.pad), w = view2(wp, DType::F32, T, K, K + c.pad),
               p = view2(pp, DType::F32, T, E, E + c.pad);
  if (on_dev) {
    dev::moe_route(ctx, idx, w, p, logits, bias, replay, c.cfg, *launch);
    o.idx = didx.host(o.idx.size());
    o.w = dw.host(o.w.size());
    o.p = dp.host(o.p.size());
  } else {
    moe_route(ctx, idx, w, p, logits, bias, replay, c.cfg);
  }
  return o;
}

void expect_route_matches(const Context& ctx, const RouteCase& c, const dev::MoeRouteLaunch& launch) {
  const RouteOut want = run_route(ctx, c, nullptr);
  const RouteOut got = run_route(ctx, c, &launch);
  const std::string what =
      c.name() + " launch=" + std::to_string(launch.threads) + "/" + std::to_string(launch.max_blocks);
  expect_same_bytes(got.idx, want.idx, what + " topk_idx");
  expect_same_bytes(got.p, want.p, what + " scores");
  expect_same_bytes(got.w, want.w, what + " topk_w");
}

RouterConfig make_cfg(int E, int K, RouterScoring sc, bool normalize, float scaling, int n_group = 1,
                      int topk_group = 1) {
  RouterConfig c;
  c.num_experts = E;
  c.top_k = K;
  c.scoring = sc;
  c.normalize = normalize;
  c.routed_scaling = scaling;
  c.n_group = n_group;
  c.topk_group = topk_group;
  return c;
}

constexpr RouterScoring kScorings[] = {RouterScoring::Softmax, RouterScoring::Sigmoid,
                                       RouterScoring::SqrtSoftplus};

TEST(GpuMoe, RouteMatchesCpuOnEveryConfig) {
  Context ctx;
  int n = 0;
  for (int E : {1, 4, 8, 64})
    for (int K : {1, 2, 4, 8}) {
      if (K > E) continue;
      for (int64_t T : {1, 7, 33})
        for (RouterScoring sc : kScorings)
          for (int variant = 0; variant < 4; ++variant) {
            // bias and normalisation crossed; scaling and data alternate.
            RouteCase c;
            c.cfg = make_cfg(E, K, sc, variant & 1, n % 2 ? 2.5f : 1.0f);
            c.T = T;
            c.bias = variant & 2;
            c.data = n % 3 == 0 ? Data::Ties : Data::Normal;
            c.seed = static_cast<uint32_t>(100 + n);
            c.pad = n % 5 == 0 ? 3 : 0;
            expect_route_matches(ctx, c, kRouteLaunches[n % std::size(kRouteLaunches)]);
            ++n;
          }
    }
}

TEST(GpuMoe, RouteMatchesCpuWithPlantedTiesInEveryLaunch) {
  // Every logit one of four values: most ranks are decided by the index rule.
  Context ctx;
  for (const auto& launch : kRouteLaunches)
    for (RouterScoring sc : kScorings) {
      RouteCase c;
      c.cfg = make_cfg(64, 8, sc, true, 1.5f);
      c.T = 7;
      c.bias = sc != RouterScoring::Softmax;
      c.data = Data::Ties;
      c.seed = 7;
      expect_route_matches(ctx, c, launch);
    }
}

TEST(GpuMoe, RouteMatchesCpuWithGroupLimits) {
  Context ctx;
  struct G {
    int E, K, n_group, topk_group;
  };
  // DeepSeek-V3-like groups, two-expert groups, one-expert groups (score = the
  // best alone), and all groups allowed.
  const G groups[] = {{64, 8, 8, 3}, {64, 4, 8, 1}, {8, 2, 4, 2}, {8, 4, 8, 4}, {4, 4, 2, 2}, {64, 1, 32, 5}};
  int n = 0;
  for (const G& gr : groups)
    for (RouterScoring sc : kScorings)
      for (Data d : {Data::Normal, Data::Ties}) {
        RouteCase c;
        c.cfg = make_cfg(gr.E, gr.K, sc, n % 2 == 0, n % 3 ? 2.5f : 1.0f, gr.n_group, gr.topk_group);
        c.T = n % 2 ? 33 : 7;
        c.bias = n % 4 != 3;
        c.data = d;
        c.seed = static_cast<uint32_t>(500 + n);
        expect_route_matches(ctx, c, kRouteLaunches[n % std::size(kRouteLaunches)]);
        ++n;
      }
}

TEST(GpuMoe, RouteMatchesCpuWithReplay) {
  Context ctx;
  int n = 0;
  for (int E : {1, 8, 64})
    for (int K : {1, 4, 8}) {
      if (K > E) continue;
      for (RouterScoring sc : kScorings) {
        RouteCase c;
        c.cfg = make_cfg(E, K, sc, n % 2 == 0, n % 3 ? 1.0f : 2.5f, E == 64 ? 8 : 1, E == 64 ? 2 : 1);
        c.T = n % 2 ? 33 : 7;
        c.bias = n % 2 == 1;  // ignored for selection under replay
        c.replay = true;
        c.seed = static_cast<uint32_t>(900 + n);
        c.pad = n % 3 == 0 ? 2 : 0;
        expect_route_matches(ctx, c, kRouteLaunches[n % std::size(kRouteLaunches)]);
        ++n;
      }
    }
}

TEST(GpuMoe, RouteMatchesCpuOnNanAndInfiniteLogits) {
  // Interpret mode: NaN payloads too are the CPU's (host arithmetic). On a
  // device, NaNs made by arithmetic may differ in payload; indices do not.
  Context ctx;
  int n = 0;
  for (RouterScoring sc : kScorings)
    for (bool norm : {false, true})
      for (bool bias : {false, true}) {
        RouteCase c;
        c.cfg = make_cfg(8, 4, sc, norm, 2.0f, n % 2 ? 4 : 1, n % 2 ? 2 : 1);
        c.T = 33;
        c.bias = bias;
        c.data = Data::Special;
        c.seed = static_cast<uint32_t>(1300 + n);
        expect_route_matches(ctx, c, kRouteLaunches[n % std::size(kRouteLaunches)]);
        ++n;
      }
}

TEST(GpuMoe, RouteIsRaceFreeAndPoolIndependent) {
  RouteCase c;
  c.cfg = make_cfg(64, 8, RouterScoring::Softmax, true, 2.5f, 8, 3);
  c.T = 7;
  c.bias = true;
  c.data = Data::Ties;
  {
    emu::Options o;
    o.check_races = true;
    emu::ScopedOptions scoped(o);
    Context ctx;
    expect_route_matches(ctx, c, {16, 3});
  }
  auto pool = make_pool(2);
  Context ctx2;
  ctx2.pool = pool.get();
  for (RouterScoring sc : kScorings) {
    c.cfg.scoring = sc;
    c.T = 33;
    expect_route_matches(ctx2, c, {64, 0});
    expect_route_matches(ctx2, c, {7, 4});
  }
}

TEST(GpuMoe, RouteRejectsWhatTheCpuRejectsWithTheSameError) {
  RouteCase c;
  c.cfg = make_cfg(8, 2, RouterScoring::Sigmoid, false, 1.0f);
  c.T = 3;
  c.replay = true;
  std::vector<float> z = make_logits(c), w(6), p(24);
  std::vector<int32_t> idx(6), rep = {0, 1, 2, 2, 3, 4};  // token 1 lists expert 2 twice
  const Tensor tz(z.data(), DType::F32, {3, 8}), tw(w.data(), DType::F32, {3, 2}),
      tp(p.data(), DType::F32, {3, 8});
  const Tensor ti(idx.data(), DType::I32, {3, 2}), tr(rep.data(), DType::I32, {3, 2});
  auto error_of = [](auto&& fn) -> std::string {
    try {
      fn();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  Context ctx;
  const std::string cpu = error_of([&] { moe_route(ctx, ti, tw, tp, tz, Tensor{}, tr, c.cfg); });
  const std::string gpu = error_of([&] { dev::moe_route(ctx, ti, tw, tp, tz, Tensor{}, tr, c.cfg, {}); });
  EXPECT_NE(cpu.find("lists expert index 2 twice"), std::string::npos) << cpu;
  EXPECT_EQ(gpu, cpu);
  // The GPU router's own limits: groups (shared memory) and block size.
  RouterConfig many = make_cfg(512, 2, RouterScoring::Sigmoid, false, 1.0f, 512, 2);
  std::vector<float> z512(512, 0.0f), p512(512);
  const Tensor tz512(z512.data(), DType::F32, {1, 512}), tp512(p512.data(), DType::F32, {1, 512});
  const Tensor ti1(idx.data(), DType::I32, {1, 2}), tw1(w.data(), DType::F32, {1, 2});
  const std::string groups =
      error_of([&] { dev::moe_route(ctx, ti1, tw1, tp512, tz512, Tensor{}, Tensor{}, many, {}); });
  EXPECT_NE(groups.find("n_group=512"), std::string::npos) << groups;
  const std::string launch = error_of([&] {
    dev::moe_route(ctx, ti, tw, tp, tz, Tensor{}, Tensor{}, c.cfg, {512, 0});
  });
  EXPECT_NE(launch.find("bad launch"), std::string::npos) << launch;
}

// ---- gather and combine ------------------------------------------------------------

// Random topk_idx (T, K) with distinct experts per token when K <= E.
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

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(g());
  return v;
}

// xe (R, D) gathered from x (T, D) of dtype dt, rows padded by `pad` elements.
void expect_gather_matches(const Context& ctx, DType dt, int E, int K, int64_t T, int64_t D, int64_t pad,
                           const dev::MoeRowsLaunch& launch, uint32_t seed) {
  std::vector<int32_t> topk = make_topk(T, K, E, seed);
  const MoeDispatch plan = moe_plan(Tensor(topk.data(), DType::I32, {T, K}), E);
  const size_t es = dtype_size(dt);
  const int64_t R = T * K, S = D + pad;
  const std::vector<uint8_t> x = random_bytes(static_cast<size_t>(T * S) * es, seed + 1);
  std::vector<uint8_t> want(static_cast<size_t>(R * S) * es, 0xA5), hx = x;
  moe_gather(ctx, view2(want.data(), dt, R, D, S), view2(hx.data(), dt, T, D, S), plan);
  DeviceVec<uint8_t> dx(x, "x"), dxe(std::vector<uint8_t>(want.size(), 0xA5), "xe");
  dev::moe_gather(ctx, view2(dxe.data(), dt, R, D, S), view2(dx.data(), dt, T, D, S), plan, launch);
  expect_same_bytes(dxe.host(want.size()), want,
                    std::string("gather ") + dtype_name(dt) + " E=" + std::to_string(E) +
                        " K=" + std::to_string(K) + " T=" + std::to_string(T) + " D=" + std::to_string(D) +
                        " launch=" + std::to_string(launch.threads) + "/" +
                        std::to_string(launch.rows_per_block));
}

TEST(GpuMoe, GatherMatchesCpuForEveryDtype) {
  Context ctx;
  int n = 0;
  for (DType dt : {DType::F32, DType::BF16, DType::FP8E4M3, DType::I32})
    for (int E : {1, 4, 8, 64})
      for (int K : {1, 2, 4, 8}) {
        if (K > E) continue;
        for (int64_t T : {1, 7, 33}) {
          const int64_t D = std::array<int64_t, 4>{1, 7, 33, 100}[static_cast<size_t>(n % 4)];
          expect_gather_matches(ctx, dt, E, K, T, D, n % 3 == 0 ? 5 : 0,
                                kRowsLaunches[n % std::size(kRowsLaunches)], static_cast<uint32_t>(n + 1));
          ++n;
        }
      }
}

// y (T, D) combined from ye (R, D) and topk_w (T, K), with padded rows.
void expect_combine_matches(const Context& ctx, int E, int K, int64_t T, int64_t D, int64_t pad,
                            const dev::MoeRowsLaunch& launch, uint32_t seed) {
  std::vector<int32_t> topk = make_topk(T, K, E, seed);
  const MoeDispatch plan = moe_plan(Tensor(topk.data(), DType::I32, {T, K}), E);
  const int64_t R = T * K, S = D + pad, SK = K + pad;
  std::mt19937 g(seed + 2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> ye(static_cast<size_t>(R * S)), w(static_cast<size_t>(T * SK));
  for (auto& v : ye) v = normal(g);
  for (auto& v : w) v = normal(g);
  if (seed % 4 == 0) ye[0] = -0.0f, w[0] = 0.0f;  // signed zeros through the chain
  std::vector<float> want(static_cast<size_t>(T * S), 9.0f);
  moe_combine(ctx, view2(want.data(), DType::F32, T, D, S), view2(ye.data(), DType::F32, R, D, S),
              view2(w.data(), DType::F32, T, K, SK), plan);
  DeviceVec<float> dye(ye, "ye"), dw(w, "topk_w"), dy(std::vector<float>(want.size(), 9.0f), "y");
  dev::moe_combine(ctx, view2(dy.data(), DType::F32, T, D, S), view2(dye.data(), DType::F32, R, D, S),
                   view2(dw.data(), DType::F32, T, K, SK), plan, launch);
  expect_same_bytes(dy.host(want.size()), want,
                    "combine E=" + std::to_string(E) + " K=" + std::to_string(K) + " T=" + std::to_string(T) +
                        " D=" + std::to_string(D) + " launch=" + std::to_string(launch.threads) + "/" +
                        std::to_string(launch.rows_per_block));
}

TEST(GpuMoe, CombineMatchesCpu) {
  Context ctx;
  int n = 0;
  for (int E : {1, 4, 8, 64})
    for (int K : {1, 2, 4, 8}) {
      if (K > E) continue;
      for (int64_t T : {1, 7, 33})
        for (int64_t D : {1, 7, 33, 129}) {
          expect_combine_matches(ctx, E, K, T, D, n % 3 == 0 ? 3 : 0,
                                 kRowsLaunches[n % std::size(kRowsLaunches)], static_cast<uint32_t>(n + 1));
          ++n;
        }
    }
}

TEST(GpuMoe, GatherAndCombineAreRaceFreeAndPoolIndependent) {
  {
    emu::Options o;
    o.check_races = true;
    emu::ScopedOptions scoped(o);
    Context ctx;
    expect_gather_matches(ctx, DType::BF16, 8, 4, 7, 33, 2, {7, 3}, 11);
    expect_combine_matches(ctx, 8, 4, 7, 33, 2, {7, 3}, 11);
  }
  auto pool = make_pool(2);
  Context ctx2;
  ctx2.pool = pool.get();
  for (const auto& launch : kRowsLaunches) {
    expect_gather_matches(ctx2, DType::F32, 64, 8, 33, 17, 0, launch, 21);
    expect_combine_matches(ctx2, 64, 8, 33, 17, 0, launch, 21);
  }
}

// ---- through the dispatch -------------------------------------------------------------

TEST(GpuMoe, CpuEntriesForwardToTheInterpretBackendWithTheCpuBits) {
  // The dispatch itself, on host vectors: the pointer check (emu_test, and
  // every kernel test above on device buffers) is off for it.
  emu::Options o = emu::options();
  o.check_pointers = false;
  const emu::ScopedOptions scoped(o);
  const GpuBackend& be = interpret_backend();
  ASSERT_NE(be.moe_route, nullptr);
  ASSERT_NE(be.moe_gather, nullptr);
  ASSERT_NE(be.moe_combine, nullptr);
  for (int threads : {1, 2}) {
    auto pool = make_pool(threads);
    Context cpu;
    cpu.pool = pool.get();
    Context gpu = cpu;
    gpu.gpu = &be;
    const int E = 64, K = 8;
    const int64_t T = 33, D = 19;
    RouteCase c;
    c.cfg = make_cfg(E, K, RouterScoring::Sigmoid, true, 2.5f, 8, 4);
    c.T = T;
    c.bias = true;
    c.data = Data::Ties;
    // Host buffers: in interpret mode device memory is host memory.
    std::vector<float> z = make_logits(c), b = make_bias(c);
    RouteOut r[2] = {route_start(c), route_start(c)};
    for (int k = 0; k < 2; ++k) {
      moe_route(k == 0 ? cpu : gpu, Tensor(r[k].idx.data(), DType::I32, {T, K}),
                Tensor(r[k].w.data(), DType::F32, {T, K}), Tensor(r[k].p.data(), DType::F32, {T, E}),
                Tensor(z.data(), DType::F32, {T, E}), Tensor(b.data(), DType::F32, {E}), Tensor{}, c.cfg);
    }
    expect_same_bytes(r[1].idx, r[0].idx, "dispatch topk_idx");
    expect_same_bytes(r[1].w, r[0].w, "dispatch topk_w");
    expect_same_bytes(r[1].p, r[0].p, "dispatch scores");

    const MoeDispatch plan = moe_plan(Tensor(r[0].idx.data(), DType::I32, {T, K}), E);
    std::vector<float> x(static_cast<size_t>(T * D));
    std::mt19937 g(3);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto& v : x) v = normal(g);
    std::vector<float> xe[2], y[2];
    for (int k = 0; k < 2; ++k) {
      xe[k].assign(static_cast<size_t>(T * K * D), 0.0f);
      y[k].assign(static_cast<size_t>(T * D), 0.0f);
      const Context& ctx = k == 0 ? cpu : gpu;
      moe_gather(ctx, Tensor(xe[k].data(), DType::F32, {T * K, D}), Tensor(x.data(), DType::F32, {T, D}),
                 plan);
      moe_combine(ctx, Tensor(y[k].data(), DType::F32, {T, D}), Tensor(xe[k].data(), DType::F32, {T * K, D}),
                  Tensor(r[0].w.data(), DType::F32, {T, K}), plan);
    }
    expect_same_bytes(xe[1], xe[0], "dispatch gather");
    expect_same_bytes(y[1], y[0], "dispatch combine");
  }
}

}  // namespace
}  // namespace lockstep::kernels
