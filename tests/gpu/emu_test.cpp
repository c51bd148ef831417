// The interpret-mode emulator itself: indices, shared memory, barriers, and
// each check it promises (a planted race, a divergent barrier, out-of-bounds
// writes, poisoned memory, launch limits) caught with a message that names it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "lockstep/base/error.h"
#include "lockstep/kernels/gpu/portable.h"

namespace lockstep::gpu {
namespace {

namespace emu = lockstep::gpu::emu;

// A kernel error ends the launch by unwinding the emulated threads' fibers,
// which Boost.Context switches to without telling AddressSanitizer (Debian's
// Boost is not built with BOOST_USE_ASAN), so ASan reports the unwinding as
// stack-buffer overflows. The tests of those errors run in the other builds.
#if defined(__SANITIZE_ADDRESS__)
#define SKIP_UNDER_ASAN() GTEST_SKIP() << "fiber unwinding is invisible to AddressSanitizer"
#else
#define SKIP_UNDER_ASAN() (void)0
#endif

// Device buffer of n floats for a test; freed at scope end.
struct DeviceFloats {
  explicit DeviceFloats(int64_t n, const char* what = "buf")
      : n(n), p(static_cast<float*>(emu::device_alloc(sizeof(float) * size_t(n), what))) {}
  ~DeviceFloats() { emu::device_free(p); }
  // One element from or to the host, through the emulator's copies (device
  // memory is inaccessible to host code; i may point into a guard zone).
  float at(int64_t i) const { return emu::read_device(p + i); }
  void set(int64_t i, float v) { emu::copy_to_device(p + i, &v, sizeof(v)); }
  std::vector<float> host() const {
    std::vector<float> v(static_cast<size_t>(n));
    emu::copy_from_device(v.data(), p, v.size() * sizeof(float));
    return v;
  }
  int64_t n;
  float* p;
};

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Reverses each block's slice through shared memory: correct, with the barrier.
LS_GLOBAL void reverse_kernel(const float* x, float* y, int n) {
  LS_SHARED(float, tile, 64);
  const int base = static_cast<int>(blockIdx.x * blockDim.x);
  const int t = static_cast<int>(threadIdx.x);
  tile[t] = base + t < n ? x[base + t] : 0.0f;
  __syncthreads();
  const int src = static_cast<int>(blockDim.x) - 1 - t;
  if (base + t < n) y[base + t] = tile[src];
}

// The same without the barrier: a thread may read its partner's slot before
// the partner wrote it.
LS_GLOBAL void racy_reverse_kernel(const float* x, float* y, int n) {
  LS_SHARED(float, tile, 64);
  const int base = static_cast<int>(blockIdx.x * blockDim.x);
  const int t = static_cast<int>(threadIdx.x);
  tile[t] = base + t < n ? x[base + t] : 0.0f;
  const int src = static_cast<int>(blockDim.x) - 1 - t;
  if (base + t < n) y[base + t] = tile[src];
}

TEST(GpuEmu, SharedMemoryWithBarrierGivesTheSameBitsInEveryOrder) {
  const int n = 200;
  DeviceFloats x(n, "x"), y(n, "y");
  for (int i = 0; i < n; ++i) x.set(i, 0.5f * float(i) - 7.0f);
  emu::Options o;
  o.check_races = true;
  emu::ScopedOptions scoped(o);
  Context ctx;
  LS_LAUNCH(ctx, reverse_kernel, dim3(blocks_for(n, 64)), dim3(64))(x.p, y.p, n);
  for (int i = 0; i < n; ++i) {
    const int b = i / 64, t = i % 64;
    const int src = b * 64 + 63 - t;
    const float want = src < n ? x.at(src) : 0.0f;
    EXPECT_EQ(y.at(i), want) << i;
  }
}

TEST(GpuEmu, PlantedRaceIsCaughtByRunningTheThreadsInOtherOrders) {
  const int n = 128;
  DeviceFloats x(n, "x"), y(n, "y");
  for (int i = 0; i < n; ++i) x.set(i, float(i));
  emu::Options o;
  o.check_races = true;
  emu::ScopedOptions scoped(o);
  Context ctx;
  const std::string err =
      error_of([&] { LS_LAUNCH(ctx, racy_reverse_kernel, dim3(2), dim3(64))(x.p, y.p, n); });
  EXPECT_NE(err.find("racy_reverse_kernel"), std::string::npos) << err;
  EXPECT_NE(err.find("different results"), std::string::npos) << err;
  EXPECT_NE(err.find("'y'"), std::string::npos) << err;
}

TEST(GpuEmu, RacyKernelReadsPoisonedSharedMemoryInForwardOrder) {
  // Forward order: thread t reads slot 63-t before thread 63-t wrote it (for
  // t < 32), so it reads the NaN poison of a fresh block.
  const int n = 64;
  DeviceFloats x(n, "x"), y(n, "y");
  for (int i = 0; i < n; ++i) x.set(i, float(i));
  emu::Options o;
  o.schedule = emu::Schedule::Forward;
  emu::ScopedOptions scoped(o);
  Context ctx;
  LS_LAUNCH(ctx, racy_reverse_kernel, dim3(1), dim3(64))(x.p, y.p, n);
  EXPECT_TRUE(std::isnan(y.at(0)));
  EXPECT_EQ(y.at(63), 0.0f);  // thread 63 reads slot 0, written by thread 0 before it
}

LS_GLOBAL void divergent_barrier_kernel(float* y) {
  if (threadIdx.x < 10) __syncthreads();
  y[threadIdx.x] = 1.0f;
}

TEST(GpuEmu, BarrierNotReachedByEveryThreadIsNamedWithBlockAndLine) {
  SKIP_UNDER_ASAN();
  DeviceFloats y(32);
  Context ctx;
  const std::string err = error_of([&] { LS_LAUNCH(ctx, divergent_barrier_kernel, dim3(3), dim3(32))(y.p); });
  EXPECT_NE(err.find("divergent_barrier_kernel"), std::string::npos) << err;
  EXPECT_NE(err.find("reached by 10 of 32 threads"), std::string::npos) << err;
  EXPECT_NE(err.find("emu_test.cpp:"), std::string::npos) << err;
  EXPECT_NE(err.find("block ("), std::string::npos) << err;
}

LS_GLOBAL void two_barriers_kernel(float* y) {
  if (threadIdx.x % 2 == 0) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  y[threadIdx.x] = 2.0f;
}

TEST(GpuEmu, ThreadsWaitingAtDifferentBarriersAreCaught) {
  SKIP_UNDER_ASAN();
  DeviceFloats y(8);
  Context ctx;
  const std::string err = error_of([&] { LS_LAUNCH(ctx, two_barriers_kernel, dim3(1), dim3(8))(y.p); });
  EXPECT_NE(err.find("different barriers"), std::string::npos) << err;
}

LS_GLOBAL void write_one_past_kernel(float* y, int n, int offset) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) y[i + offset] = 3.0f;
}

TEST(GpuEmu, OutOfBoundsWritesHitAGuardZoneAndAreNamed) {
  Context ctx;
  {
    DeviceFloats y(100, "activations");
    const std::string err = error_of([&] { LS_LAUNCH(ctx, write_one_past_kernel, dim3(4), dim3(32))(y.p, 100, 1); });
    EXPECT_NE(err.find("past the end of device buffer 'activations'"), std::string::npos) << err;
    EXPECT_NE(err.find("offset 400"), std::string::npos) << err;
    EXPECT_NE(err.find("write_one_past_kernel"), std::string::npos) << err;
  }
  {
    DeviceFloats y(100, "weights");
    const std::string err = error_of([&] { LS_LAUNCH(ctx, write_one_past_kernel, dim3(4), dim3(32))(y.p, 100, -1); });
    EXPECT_NE(err.find("before the start of device buffer 'weights'"), std::string::npos) << err;
  }
  {
    DeviceFloats y(100, "ok");  // in bounds: no error, every element written
    LS_LAUNCH(ctx, write_one_past_kernel, dim3(4), dim3(32))(y.p, 100, 0);
    for (float v : y.host()) EXPECT_EQ(v, 3.0f);
  }
}

TEST(GpuEmu, DeviceMemoryStartsPoisonedAndReadsPastTheEndAreNaN) {
  DeviceFloats y(10);
  for (float v : y.host()) EXPECT_TRUE(std::isnan(v));
  EXPECT_TRUE(std::isnan(y.at(10)));  // the guard zone reads as NaN
  EXPECT_TRUE(std::isnan(y.at(-1)));
}

LS_GLOBAL void index_kernel(unsigned* out) {
  const unsigned bx = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned tx = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned per_block = blockDim.x * blockDim.y * blockDim.z;
  out[bx * per_block + tx] = bx * 1000u + tx;
}

TEST(GpuEmu, ThreeDimensionalIndicesCoverEveryThreadOnceOnAnyPool) {
  const dim3 grid(3, 2, 2), block(4, 3, 2);
  const size_t n = 12 * 24;
  for (int threads : {1, 2}) {
    auto* out = static_cast<unsigned*>(emu::device_alloc(n * sizeof(unsigned), "out"));
    auto pool = make_pool(threads);
    Context ctx;
    ctx.pool = pool.get();
    LS_LAUNCH(ctx, index_kernel, grid, block)(out);
    for (size_t i = 0; i < n; ++i)
      EXPECT_EQ(emu::read_device(out + i), unsigned(i / 24) * 1000u + unsigned(i % 24)) << i;
    emu::device_free(out);
  }
}

LS_GLOBAL void big_shared_kernel(float* y) {
  LS_SHARED(float, a, 8192);
  LS_SHARED(float, b, 8192);  // 64 KiB in all: above the 48 KiB limit
  a[threadIdx.x] = 1.0f;
  b[threadIdx.x] = 1.0f;
  y[threadIdx.x] = a[threadIdx.x];
}

LS_GLOBAL void throwing_kernel(float* y) {
  __syncthreads();
  LS_CHECK(threadIdx.x != 5) << "device-side check failed in thread " << threadIdx.x;
  y[threadIdx.x] = 0.0f;
}

TEST(GpuEmu, LaunchLimitsAndKernelErrorsAreReported) {
  SKIP_UNDER_ASAN();
  DeviceFloats y(2048);
  Context ctx;
  std::string err = error_of([&] { LS_LAUNCH(ctx, big_shared_kernel, dim3(1), dim3(32))(y.p); });
  EXPECT_NE(err.find("shared array 'b'"), std::string::npos) << err;
  EXPECT_NE(err.find("above the limit of 49152"), std::string::npos) << err;
  err = error_of([&] { LS_LAUNCH(ctx, write_one_past_kernel, dim3(1), dim3(2048))(y.p, 10, 0); });
  EXPECT_NE(err.find("block of 2048 threads"), std::string::npos) << err;
  err = error_of([&] { LS_LAUNCH(ctx, write_one_past_kernel, dim3(0), dim3(32))(y.p, 10, 0); });
  EXPECT_NE(err.find("empty grid"), std::string::npos) << err;
  // An error inside a kernel thread propagates; the other threads' stacks unwind.
  err = error_of([&] { LS_LAUNCH(ctx, throwing_kernel, dim3(2), dim3(16))(y.p); });
  EXPECT_NE(err.find("device-side check failed in thread 5"), std::string::npos) << err;
  // And the emulator still works afterwards.
  LS_LAUNCH(ctx, write_one_past_kernel, dim3(1), dim3(32))(y.p, 32, 0);
  EXPECT_EQ(y.at(31), 3.0f);
}

TEST(GpuEmu, KernelSideFunctionsOutsideALaunchAreAnError) {
  EXPECT_NE(error_of([] { (void)threadIdx; }).find("outside a launch"), std::string::npos);
}

}  // namespace
}  // namespace lockstep::gpu
