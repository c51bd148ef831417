// Which device runs a model's kernels: `[model] device` and `--device` on the
// commands that run a model. "cpu" (the default) runs the CPU kernels;
// "interpret" runs the GPU kernel sources on the CPU under the emulator
// (slow; for tests and debugging, docs/gpu.md); "cuda" and "hip" name the
// device backends.
#pragma once

#include <string>

#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::kernels {

enum class Device { Cpu, Interpret, Cuda, Hip };

// "cpu", "interpret", "cuda", "hip"; anything else throws, naming `where`
// (e.g. "--device" or "run.toml: [model] device").
Device parse_device(const std::string& s, const std::string& where);
const char* device_name(Device d);

// The backend table Context::gpu points at for d (null for the CPU). Throws,
// saying why, for a device this build cannot run.
const GpuBackend* device_backend(Device d);

}  // namespace lockstep::kernels
