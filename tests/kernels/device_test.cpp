// Device selection (kernels/gpu/device.h): the messages for a device runtime
// that sees no device or fails, `lockstep info`'s entry per device, and the
// refusal of a device backend that lacks kernel entries. The runtimes here are
// fakes registered by the test: the tests need no GPU.
#include "lockstep/kernels/gpu/device.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "lockstep/base/error.h"

namespace lockstep::kernels {
namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(DeviceSelect, NoDeviceMessageNamesTheFlagTheVendorAndTheDriverError) {
  EXPECT_EQ(
      no_device_message(Device::Cuda, "--device", -1,
                        "cudaGetDeviceCount: CUDA driver version is insufficient for CUDA runtime version"),
      "--device cuda: no CUDA device found (cudaGetDeviceCount: CUDA driver version is insufficient for CUDA "
      "runtime version)");
  EXPECT_EQ(no_device_message(Device::Cuda, "--device", 0, ""),
            "--device cuda: no CUDA device found (cudaGetDeviceCount gives 0 devices)");
  EXPECT_EQ(no_device_message(Device::Hip, "run.toml: [model] device", -1,
                              "hipGetDeviceCount: no ROCm-capable device"),
            "run.toml: [model] device hip: no HIP device found (hipGetDeviceCount: no ROCm-capable device)");
  // A failure without a message still says what was asked.
  EXPECT_EQ(no_device_message(Device::Hip, "--device", -1, ""),
            "--device hip: no HIP device found (hipGetDeviceCount gives -1 devices)");
}

// The fake runtimes' answers.
int g_count = 0;
std::string g_error;
int g_opened = 0;
GpuBackend g_table;

int fake_count(std::string* error) {
  if (g_count < 0) *error = g_error;
  return g_count;
}
const GpuBackend* fake_open(int index) {
  ++g_opened;
  EXPECT_EQ(index, 0);
  return &g_table;
}

TEST(DeviceSelect, ABinaryWithoutTheRuntimeSaysSo) {
  // The test binary registers no runtime for hip.
  EXPECT_EQ(find_device_runtime(Device::Hip), nullptr);
  EXPECT_EQ(describe_device_runtime(Device::Hip), "hip (not built)");
  const std::string e = error_of([] { device_backend(Device::Hip, "--device"); });
  EXPECT_NE(e.find("--device hip: this lockstep binary has no hip backend (not available in this build"),
            std::string::npos)
      << e;
  EXPECT_EQ(device_backend(Device::Cpu, "--device"), nullptr);
  EXPECT_EQ(device_backend(Device::Interpret, "--device"), &interpret_backend());
}

TEST(DeviceSelect, ARuntimeThatSeesNoDeviceStopsWithTheDriverError) {
  register_device_runtime({Device::Cuda, &fake_count, &fake_open});
  ASSERT_NE(find_device_runtime(Device::Cuda), nullptr);
  g_opened = 0;

  g_count = -1;
  g_error = "cudaGetDeviceCount: no CUDA-capable device is detected";
  EXPECT_EQ(describe_device_runtime(Device::Cuda),
            "cuda (built, 0 found: cudaGetDeviceCount: no CUDA-capable device is detected)");
  EXPECT_EQ(error_of([] { device_backend(Device::Cuda, "--device"); }),
            "--device cuda: no CUDA device found (cudaGetDeviceCount: no CUDA-capable device is detected)");

  g_count = 0;
  EXPECT_EQ(describe_device_runtime(Device::Cuda), "cuda (built, 0 found)");
  EXPECT_EQ(error_of([] { device_backend(Device::Cuda, "[model] device"); }),
            "[model] device cuda: no CUDA device found (cudaGetDeviceCount gives 0 devices)");
  EXPECT_EQ(g_opened, 0) << "no device: nothing is opened";

  g_count = 2;
  EXPECT_EQ(describe_device_runtime(Device::Cuda), "cuda (built, 2 found)");
}

TEST(DeviceSelect, ADeviceBackendWithMissingEntriesIsRefusedNotRunOnTheCpuKernels) {
  register_device_runtime({Device::Cuda, &fake_count, &fake_open});
  g_count = 1;
  g_opened = 0;
  // Every entry of the interpret table but two.
  g_table = interpret_backend();
  g_table.name = "cuda";
  g_table.moe_combine = nullptr;
  g_table.sample_rows = nullptr;
  const std::string e = error_of([] { device_backend(Device::Cuda, "--device"); });
  EXPECT_EQ(g_opened, 1);
  EXPECT_NE(e.find("--device cuda: the cuda backend lacks 2 kernel entries (moe_combine, sample_rows)"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("would read device memory from the host"), std::string::npos) << e;

  g_table.moe_combine = interpret_backend().moe_combine;
  g_table.sample_rows = interpret_backend().sample_rows;
  ASSERT_TRUE(g_table.missing().empty());
  EXPECT_EQ(device_backend(Device::Cuda, "--device"), &g_table);
}

}  // namespace
}  // namespace lockstep::kernels
