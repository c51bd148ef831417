// Strict interpret mode: device memory is inaccessible to host code outside
// launches and the allocator's copies, as on a device. A planted host read
// dies naming the allocation; the debugging switch (Options::host_access,
// LOCKSTEP_INTERPRET_HOST_ACCESS=1) lets the same read pass; launches and
// copies keep working.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "lockstep/kernels/gpu/backend.h"
#include "lockstep/kernels/gpu/portable.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::kernels {
namespace {

namespace emu = ::lockstep::gpu::emu;

const Allocator& device() {
  return *interpret_backend().memory;
}

emu::Options with_host_access(bool on) {
  emu::Options o = emu::options();
  o.host_access = on;
  return o;
}

LS_GLOBAL void add_one_kernel(const float* x, float* y, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) y[i] = gpu::ls_add(x[i], 1.0f);
}

// A host read of element 3 of a device buffer named `what`.
float planted_host_read(const char* what) {
  Buffer b(64 * sizeof(float), device(), Fill::Zero, what);
  const volatile float* p = b.as<float>();
  return p[3];
}

TEST(GpuHostAccessDeathTest, HostReadOfDeviceMemoryDiesNamingTheAllocation) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const emu::ScopedOptions strict(with_host_access(false));
  EXPECT_FALSE(device().host_visible());
  EXPECT_DEATH(planted_host_read("planted logits"),
               "host code touched device memory: allocation 'planted logits' \\(\\+offset 12 of 256 bytes\\)"
               "(.|\n)*innermost first");
}

TEST(GpuHostAccessDeathTest, HostWriteAndGuardZoneTouchDieToo) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const emu::ScopedOptions strict(with_host_access(false));
  EXPECT_DEATH(
      {
        Buffer b(100, device(), Fill::Undefined, "planted kv block");
        static_cast<volatile unsigned char*>(b.data())[99] = 1;
      },
      "allocation 'planted kv block' \\(\\+offset 99 of 100 bytes\\)");
  EXPECT_DEATH(
      {
        Buffer b(100, device(), Fill::Undefined, "planted scratch");
        (void)static_cast<const volatile unsigned char*>(b.data())[-4];  // the lower guard zone
      },
      "allocation 'planted scratch' \\(\\+offset -4 of 100 bytes\\)");
}

TEST(GpuHostAccessDeathTest, TheSwitchLetsTheSameReadPass) {
  {
    const emu::ScopedOptions open(with_host_access(true));
    EXPECT_TRUE(device().host_visible());
    EXPECT_EQ(planted_host_read("planted logits"), 0.0f);
  }
  // The environment variable sets the option's default.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("LOCKSTEP_INTERPRET_HOST_ACCESS", "1", 1);
        emu::options() = emu::Options{};
        emu::apply_host_access();
        std::exit(planted_host_read("planted logits") == 0.0f && device().host_visible() ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
  // Turned off again, memory made while it was on closes too.
  const emu::ScopedOptions strict(with_host_access(false));
  EXPECT_DEATH(
      {
        emu::Options on = with_host_access(true);
        emu::options() = on;
        Buffer b(64, device(), Fill::Zero, "made while open");
        emu::options().host_access = false;
        emu::apply_host_access();
        (void)static_cast<const volatile unsigned char*>(b.data())[0];
      },
      "allocation 'made while open'");
}

TEST(GpuHostAccess, LaunchesAndCopiesWorkInStrictMode) {
  const emu::ScopedOptions strict(with_host_access(false));
  const int n = 300;
  std::vector<float> host(n);
  for (int i = 0; i < n; ++i) host[size_t(i)] = 0.25f * float(i) - 3.0f;
  Buffer x(n * sizeof(float), device(), Fill::Undefined, "x");
  Buffer y(n * sizeof(float), device(), Fill::Zero, "y");
  Buffer z(n * sizeof(float), device(), Fill::Undefined, "z");
  device().copy_in(x.data(), host.data(), n * sizeof(float));
  Context ctx;
  {
    const emu::DeviceWindow nested;  // windows nest: the launch's own closes only its reference
    LS_LAUNCH(ctx, add_one_kernel, dim3((n + 63) / 64), dim3(64))(x.as<float>(), y.as<float>(), n);
  }
  device().copy(z.data(), y.data(), n * sizeof(float));
  std::vector<float> got(n);
  device().copy_out(got.data(), z.data(), n * sizeof(float));
  for (int i = 0; i < n; ++i) EXPECT_EQ(got[size_t(i)], host[size_t(i)] + 1.0f) << i;
  // A launch from several pool threads, and copies from several host threads
  // at once (the windows overlap).
  auto pool = make_pool(2);
  Context two;
  two.pool = pool.get();
  LS_LAUNCH(two, add_one_kernel, dim3((n + 31) / 32), dim3(32))(y.as<float>(), x.as<float>(), n);
  std::vector<float> parts(n);
  two.parallel_for(n, [&](int64_t a, int64_t b) {
    device().copy_out(parts.data() + a, x.as<float>() + a, size_t(b - a) * sizeof(float));
  });
  for (int i = 0; i < n; ++i) EXPECT_EQ(parts[size_t(i)], host[size_t(i)] + 2.0f) << i;
  EXPECT_FALSE(device().host_visible());
}

}  // namespace
}  // namespace lockstep::kernels
