// Device memory behind the Allocator interface: the interpret backend's
// allocator (guard zones, poisoning, copies), the launch check that rejects
// host pointers, and the engines' buffers landing in device memory.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "lockstep/kernels/gpu/backend.h"
#include "lockstep/kernels/gpu/portable.h"
#include "lockstep/model/workspace.h"
#include "lockstep/rollout/engine.h"
#include "lockstep/train/trainer.h"
#include "parity/parity_util.h"

namespace lockstep::kernels {
namespace {

namespace emu = ::lockstep::gpu::emu;

const Allocator& device() { return *interpret_backend().memory; }

Context device_context() {
  Context c;
  c.gpu = &interpret_backend();
  return c;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

LS_GLOBAL void scale_kernel(const float* x, float* y, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) y[i] = gpu::ls_mul(x[i], 2.0f);
}

TEST(GpuMemory, InterpretAllocatorFillsAlignsCopiesAndKnowsItsMemory) {
  const Allocator& m = device();
  EXPECT_STREQ(m.name(), "interpret");
  EXPECT_EQ(m.host_visible(), emu::options().host_access);  // strict by default (host_access_test.cpp)
  const size_t before = emu::live_allocations();
  {
    Buffer zero(1000, m, Fill::Zero, "zeroed");
    Buffer undef(1000, m, Fill::Undefined, "undefined");
    EXPECT_EQ(emu::live_allocations(), before + 2);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(zero.data()) % kAlignment, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(undef.data()) % kAlignment, 0u);
    std::vector<float> z(250), u(250);
    m.copy_out(z.data(), zero.data(), 1000);
    m.copy_out(u.data(), undef.data(), 1000);
    for (int i = 0; i < 250; ++i) {
      EXPECT_EQ(z[size_t(i)], 0.0f) << i;
      EXPECT_TRUE(std::isnan(u[size_t(i)])) << i;  // poisoned: a read before a write shows
    }
    EXPECT_TRUE(m.holds(zero.data()));
    EXPECT_TRUE(m.holds(undef.as<char>() + 999));
    std::vector<float> host(250, 0.0f);
    EXPECT_FALSE(m.holds(host.data()));
    EXPECT_EQ(&zero.memory(), &m);

    std::vector<float> a(250), b(250, -1.0f);
    for (int i = 0; i < 250; ++i) a[size_t(i)] = float(i) * 0.5f;
    m.copy_in(undef.data(), a.data(), 1000);
    m.copy(zero.data(), undef.data(), 1000);
    m.copy_out(b.data(), zero.data(), 1000);
    EXPECT_EQ(a, b);
    Buffer moved = std::move(zero);  // ownership moves with the allocator
    EXPECT_EQ(&moved.memory(), &m);
    EXPECT_EQ(emu::live_allocations(), before + 2);
  }
  EXPECT_EQ(emu::live_allocations(), before);  // released through the allocator
}

TEST(GpuMemory, HostAllocatorIsTheDefaultAndZeroFills) {
  Buffer b(256);
  EXPECT_STREQ(b.memory().name(), "host");
  Buffer u(256, host_allocator(), Fill::Undefined, "host");
  for (int i = 0; i < 64; ++i) EXPECT_EQ(u.as<float>()[i], 0.0f);
  EXPECT_EQ(&device_memory(Context{}), &host_allocator());
  EXPECT_EQ(&device_memory(device_context()), &device());
  EXPECT_EQ(&device_memory(cpu_context(device_context())), &host_allocator());
}

TEST(GpuMemory, GuardZonesCoverAllocatorBuffers) {
  Buffer b(64, device(), Fill::Zero, "planted overrun");
  const char one = 1;
  emu::copy_to_device(b.as<char>() + 64, &one, 1);  // one byte past the end
  const std::string e = error_of([] { emu::check_guards("test"); });
  EXPECT_NE(e.find("wrote past the end of device buffer 'planted overrun'"), std::string::npos) << e;
  EXPECT_NE(e.find("offset 64"), std::string::npos) << e;
  const unsigned char ad = 0xAD;
  emu::copy_to_device(b.as<unsigned char>() + 64, &ad,
                      1);  // repair the guard: its first byte (0x7FC0DEAD, little-endian)
  EXPECT_EQ(error_of([] { emu::check_guards("test"); }), "");
}

TEST(GpuMemory, LaunchRejectsHostPointersAndNamesTheArgument) {
  Context ctx;
  Buffer x(64 * 4, device(), Fill::Zero, "x"), y(64 * 4, device(), Fill::Undefined, "y");
  LS_LAUNCH(ctx, scale_kernel, dim3(1), dim3(64))(x.as<const float>(), y.as<float>(), 64);
  EXPECT_EQ(emu::read_device(y.as<float>() + 5), 0.0f);
  std::vector<float> host(64, 1.0f);
  const std::string e = error_of([&] {
    LS_LAUNCH(ctx, scale_kernel, dim3(1), dim3(64))(x.as<const float>(), host.data(), 64);
  });
  EXPECT_NE(e.find("kernel scale_kernel"), std::string::npos) << e;
  EXPECT_NE(e.find("host pointer as argument 1"), std::string::npos) << e;
  EXPECT_EQ(host[0], 1.0f);  // the launch did not run
  // Null pointers (optional outputs) and the end of an allocation (an empty view) pass.
  LS_LAUNCH(ctx, scale_kernel, dim3(1), dim3(64))(x.as<const float>() + 64, nullptr, 0);
  // The check can be turned off (tests of the dispatch on host vectors).
  emu::Options o = emu::options();
  o.check_pointers = false;
  const emu::ScopedOptions scoped(o);
  LS_LAUNCH(ctx, scale_kernel, dim3(1), dim3(64))(x.as<const float>(), host.data(), 64);
  EXPECT_EQ(host[0], 0.0f);
}

TEST(GpuMemory, WorkspaceAndActivationsComeFromTheContextsDevice) {
  const Context ctx = device_context();
  model::Workspace ws(device_memory(ctx));
  const Tensor t = ws.get(0, DType::F32, {3, 5});
  EXPECT_TRUE(device().holds(t.data));
  EXPECT_TRUE(std::isnan(emu::read_device(t.f32())));  // undefined until written
  OwnedTensor act;
  const Tensor a = model::reuse(ctx, act, DType::F32, {4});
  EXPECT_TRUE(device().holds(a.data));
  // A tensor from the host is reallocated in device memory, not reused.
  OwnedTensor host(DType::F32, {4});
  const void* old = host.view().data;
  EXPECT_NE(model::reuse(ctx, host, DType::F32, {4}).data, old);
  EXPECT_TRUE(device().holds(host.view().data));
}

TEST(GpuMemory, EnginesKeepWeightsKvAndTrainingStateInDeviceMemory) {
  std::mt19937_64 g(7);
  const ModelConfig c = parity::random_config(g);
  const parity::Model m(c, 11);
  const Context ctx = device_context();
  // Host-built weights are refused by an engine on the device, clearly.
  const std::string e = error_of([&] { rollout::Engine bad(ctx, m.weights.get(), rollout::EngineConfig{}); });
  EXPECT_NE(e.find("not in that device's memory"), std::string::npos) << e;
  // Weights built for the device mirror the host master there.
  model::ModelWeights w(ctx, m.layout, const_cast<float*>(m.params.as<float>()));
  EXPECT_TRUE(device().holds(w.flat()));
  std::vector<unsigned char> mirror(m.layout.nbytes());
  device().copy_out(mirror.data(), w.flat(), mirror.size());
  EXPECT_EQ(std::memcmp(mirror.data(), m.params.data(), m.layout.nbytes()), 0);
  EXPECT_TRUE(device().holds(w.rope().cos.data()));
  EXPECT_TRUE(device().holds(w.lm_head().data.data()));
  rollout::Engine engine(ctx, &w, rollout::EngineConfig{});
  // A trainer on the device moves its parameters there; gradients and moments live there.
  Buffer copy(m.layout.nbytes());
  std::memcpy(copy.data(), m.params.data(), m.layout.nbytes());
  train::Trainer t(ctx, c, std::move(copy), train::TrainerConfig{});
  EXPECT_TRUE(device().holds(t.params()));
  device().copy_out(mirror.data(), t.params(), mirror.size());
  EXPECT_EQ(std::memcmp(mirror.data(), m.params.data(), m.layout.nbytes()), 0);
  EXPECT_TRUE(device().holds(t.weights().flat()));
}

}  // namespace
}  // namespace lockstep::kernels
