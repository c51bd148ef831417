// The GPU AdamW step (kernels/gpu/adamw.cu) in interpret mode against the CPU
// kernel, bit for bit: odd sizes, several hyper-parameter sets (no weight
// decay, step 1 and step 1000, beta1 = 0, lr = 0), several consecutive steps,
// several launch geometries, 1 and 2 pool threads, and through the dispatch.
//
// Negative control, done once by hand: computing m with one fused
// multiply-add (ls_fma(b1, m, c1 * g)) instead of the CPU's two roundings
// failed AdamWMatchesCpu on every size.
#include "lockstep/kernels/gpu/adamw.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "lockstep/base/thread_pool.h"
#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::kernels {
namespace {

namespace emu = ::lockstep::gpu::emu;
namespace dev = ::lockstep::kernels::gpu::interp;

// n floats of emulated device memory holding a copy of `host`.
class DeviceFloats {
 public:
  DeviceFloats(const std::vector<float>& host, const char* what)
      : n_(host.size()), p_(static_cast<float*>(emu::device_alloc(n_ * sizeof(float), what))) {
    emu::copy_to_device(p_, host.data(), n_ * sizeof(float));
  }
  ~DeviceFloats() { emu::device_free(p_); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  float* data() const { return p_; }
  std::vector<float> host() const {
    std::vector<float> v(n_);
    emu::copy_from_device(v.data(), p_, n_ * sizeof(float));
    return v;
  }

 private:
  size_t n_;
  float* p_;
};

void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0)
      FAIL() << what << ": first differing element " << i << " (gpu " << got[i] << ", cpu " << want[i] << ")";
}

AdamWParams params(float lr, float b1, float b2, float eps, float wd, int64_t step) {
  AdamWParams hp;
  hp.lr = lr;
  hp.beta1 = b1;
  hp.beta2 = b2;
  hp.eps = eps;
  hp.weight_decay = wd;
  hp.step = step;
  return hp;
}

// The hyper-parameter sets: defaults without decay at step 1, decay at step
// 1000 (bias corrections near 1), a small eps against tiny v, beta1 = 0, lr = 0.
const AdamWParams kParams[] = {
    params(1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 1),   params(3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1000),
    params(1e-2f, 0.8f, 0.999f, 1e-6f, 0.01f, 7), params(5e-3f, 0.0f, 0.5f, 1e-12f, 0.05f, 2),
    params(0.0f, 0.9f, 0.95f, 1e-8f, 0.1f, 3),    params(2e-5f, 0.95f, 0.99f, 1e-8f, 0.0f, 1000),
};

const dev::AdamWLaunch kLaunches[] = {{256, 4}, {1, 1}, {33, 3}, {1024, 1}, {7, 5}};

// State of one parameter buffer: (n) each.
struct State {
  std::vector<float> p, g, m, v;
};

State make_state(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  State s;
  s.p.resize(static_cast<size_t>(n));
  s.g.resize(static_cast<size_t>(n));
  s.m.assign(static_cast<size_t>(n), 0.0f);  // first step: fresh moments
  s.v.assign(static_cast<size_t>(n), 0.0f);
  for (auto& x : s.p) x = normal(gen);
  for (auto& x : s.g) x = normal(gen) * 1e-2f;
  // Zero, tiny and large gradients: v = 0 (sqrt 0, eps alone), subnormal g*g.
  if (n > 3) s.g[0] = 0.0f, s.g[1] = 1e-30f, s.g[2] = -3e4f;
  return s;
}

// `steps` consecutive updates (fresh gradients each step), CPU and GPU.
void expect_adamw_matches(const Context& ctx, int64_t n, AdamWParams hp, const dev::AdamWLaunch& launch,
                          uint32_t seed, int steps) {
  State cpu = make_state(n, seed);
  DeviceFloats dp(cpu.p, "param"), dg(cpu.g, "grad"), dm(cpu.m, "m"), dv(cpu.v, "v");
  std::mt19937 gen(seed + 1);
  std::normal_distribution<float> normal(0.0f, 1e-2f);
  for (int k = 0; k < steps; ++k) {
    adamw_step(ctx, cpu.p.data(), cpu.g.data(), cpu.m.data(), cpu.v.data(), n, hp);
    dev::adamw_step(ctx, dp.data(), dg.data(), dm.data(), dv.data(), n, hp, launch);
    const std::string what = "n=" + std::to_string(n) + " step=" + std::to_string(hp.step) +
                             " wd=" + std::to_string(hp.weight_decay) +
                             " launch=" + std::to_string(launch.threads) + "/" +
                             std::to_string(launch.per_thread);
    expect_same_bits(dp.host(), cpu.p, what + " param");
    expect_same_bits(dm.host(), cpu.m, what + " m");
    expect_same_bits(dv.host(), cpu.v, what + " v");
    for (auto& x : cpu.g) x = normal(gen);
    std::memcpy(dg.data(), cpu.g.data(), cpu.g.size() * sizeof(float));
    ++hp.step;
  }
}

TEST(GpuAdamW, AdamWMatchesCpu) {
  Context ctx;
  int k = 0;
  for (int64_t n : {1, 7, 1000, 4097})
    for (const AdamWParams& hp : kParams) {
      expect_adamw_matches(ctx, n, hp, kLaunches[k % std::size(kLaunches)], static_cast<uint32_t>(k + 1), 3);
      ++k;
    }
}

TEST(GpuAdamW, EveryLaunchGivesTheSameBits) {
  Context ctx;
  for (const auto& launch : kLaunches) expect_adamw_matches(ctx, 4097, kParams[1], launch, 5, 2);
}

TEST(GpuAdamW, RaceFreeAndPoolIndependent) {
  {
    emu::Options o;
    o.check_races = true;
    emu::ScopedOptions scoped(o);
    Context ctx;
    expect_adamw_matches(ctx, 1000, kParams[2], {33, 3}, 9, 1);
  }
  auto pool = make_pool(2);
  Context ctx2;
  ctx2.pool = pool.get();
  for (const AdamWParams& hp : kParams) expect_adamw_matches(ctx2, 4097, hp, {64, 2}, 13, 2);
}

TEST(GpuAdamW, RejectsWhatTheCpuRejectsWithTheSameError) {
  std::vector<float> p(4, 1.0f), g(4, 0.5f), m(4), v(4);
  auto error_of = [](auto&& fn) -> std::string {
    try {
      fn();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  Context ctx;
  for (const AdamWParams& bad :
       {params(1e-3f, 1.0f, 0.9f, 1e-8f, 0.0f, 1), params(1e-3f, 0.9f, 0.9f, 0.0f, 0.0f, 1),
        params(1e-3f, 0.9f, 0.9f, 1e-8f, 0.0f, 0)}) {
    const std::string cpu =
        error_of([&] { adamw_step(ctx, p.data(), g.data(), m.data(), v.data(), 4, bad); });
    const std::string gpu =
        error_of([&] { dev::adamw_step(ctx, p.data(), g.data(), m.data(), v.data(), 4, bad, {}); });
    EXPECT_NE(cpu.find("adamw_step"), std::string::npos) << cpu;
    EXPECT_EQ(gpu, cpu);
  }
  EXPECT_NE(error_of([&] {
              dev::adamw_step(ctx, p.data(), g.data(), m.data(), v.data(), 4, kParams[0], {0, 1});
            }).find("bad launch"),
            std::string::npos);
}

TEST(GpuAdamW, CpuEntryForwardsToTheInterpretBackendWithTheCpuBits) {
  ASSERT_NE(interpret_backend().adamw_step, nullptr);
  for (int threads : {1, 2}) {
    auto pool = make_pool(threads);
    Context cpu;
    cpu.pool = pool.get();
    Context gpu = cpu;
    gpu.gpu = &interpret_backend();
    State a = make_state(4097, 17);
    DeviceFloats p(a.p, "param"), g(a.g, "grad"), m(a.m, "m"), v(a.v, "v");
    for (const AdamWParams& hp : kParams) {
      adamw_step(cpu, a.p.data(), a.g.data(), a.m.data(), a.v.data(), 4097, hp);
      adamw_step(gpu, p.data(), g.data(), m.data(), v.data(), 4097, hp);
    }
    expect_same_bits(p.host(), a.p, "dispatch param");
    expect_same_bits(m.host(), a.m, "dispatch m");
    expect_same_bits(v.host(), a.v, "dispatch v");
  }
}

}  // namespace
}  // namespace lockstep::kernels
