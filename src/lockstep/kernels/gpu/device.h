// Which device runs a model's kernels: `[model] device` and `--device` on the
// commands that run a model. "cpu" (the default) runs the CPU kernels;
// "interpret" runs the GPU kernel sources on the CPU under the emulator
// (slow; for tests and debugging, docs/gpu.md); "cuda" and "hip" run them on
// a GPU, in a binary built with that device's runtime (DeviceRuntime below).
#pragma once

#include <string>
#include <vector>

#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::kernels {

enum class Device { Cpu, Interpret, Cuda, Hip };

// "cpu", "interpret", "cuda", "hip"; anything else throws, naming `where`
// (e.g. "--device" or "run.toml: [model] device").
Device parse_device(const std::string& s, const std::string& where);
const char* device_name(Device d);

// A device runtime linked into the binary (kernels/gpu/runtime.cu, built by
// nvcc or hipcc): the lockstep binary registers the ones it was built with
// before it runs a command. Libraries and tests register none.
struct DeviceRuntime {
  Device device = Device::Cuda;
  // The devices the runtime sees. On a failure of the runtime or the driver:
  // -1, with *error set to "call: the runtime's message".
  int (*count)(std::string* error) = nullptr;
  // Makes device `index` current, creates the backend's stream, and returns
  // its table (complete: check_complete). Throws on a runtime error.
  const GpuBackend* (*open)(int index) = nullptr;
};
void register_device_runtime(const DeviceRuntime& rt);
// Null when this binary has no runtime for d.
const DeviceRuntime* find_device_runtime(Device d);

// The error for a device runtime that sees no device: `where` is the flag or
// config key ("--device"), count and error as DeviceRuntime::count gives them.
// E.g. `--device cuda: no CUDA device found (cudaGetDeviceCount: no
// CUDA-capable device is detected)`.
std::string no_device_message(Device d, const std::string& where, int count, const std::string& error);

// A backend on a real device cannot fall back to a CPU kernel (the CPU kernel
// would read device memory from the host): throws, naming `where` and listing
// the entries of b that are null. Interpret mode does not need this.
void check_complete(const GpuBackend& b, const std::string& where);

// "cuda (built, 1 found)", "hip (built, 0 found: hipGetDeviceCount: ...)", or
// "cuda (not built)": one entry of `lockstep info`'s device list.
std::string describe_device_runtime(Device d);

// The backend table Context::gpu points at for d (null for the CPU). Throws,
// saying why and naming `where`, for a device this binary cannot run: no
// runtime built in, no device found, or a table with entries missing.
const GpuBackend* device_backend(Device d, const std::string& where = "device");

}  // namespace lockstep::kernels
