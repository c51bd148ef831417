// Device names, the device runtimes linked into the binary, and the backend
// each device selects (device.h).
#include "lockstep/kernels/gpu/device.h"

#include <sstream>

#include "lockstep/base/error.h"

namespace lockstep::kernels {

namespace {

// The runtimes registered by the binary (at most one per device).
std::vector<DeviceRuntime>& runtimes() {
  static std::vector<DeviceRuntime> r;
  return r;
}

const char* vendor_name(Device d) {
  return d == Device::Hip ? "HIP" : "CUDA";
}

}  // namespace

Device parse_device(const std::string& s, const std::string& where) {
  if (s == "cpu") return Device::Cpu;
  if (s == "interpret") return Device::Interpret;
  if (s == "cuda") return Device::Cuda;
  if (s == "hip") return Device::Hip;
  LS_THROW << where << ": unknown device \"" << s << "\" (expected \"cpu\", \"interpret\", \"cuda\" or \"hip\")";
}

const char* device_name(Device d) {
  switch (d) {
    case Device::Cpu: return "cpu";
    case Device::Interpret: return "interpret";
    case Device::Cuda: return "cuda";
    case Device::Hip: return "hip";
  }
  return "?";
}

void register_device_runtime(const DeviceRuntime& rt) {
  LS_CHECK(rt.count != nullptr && rt.open != nullptr)
      << "device runtime " << device_name(rt.device) << " incomplete";
  for (auto& r : runtimes()) {
    if (r.device == rt.device) {
      r = rt;
      return;
    }
  }
  runtimes().push_back(rt);
}

const DeviceRuntime* find_device_runtime(Device d) {
  for (const auto& r : runtimes()) {
    if (r.device == d) return &r;
  }
  return nullptr;
}

std::string no_device_message(Device d, const std::string& where, int count, const std::string& error) {
  std::ostringstream os;
  os << where << " " << device_name(d) << ": no " << vendor_name(d) << " device found (";
  if (count < 0 && !error.empty()) {
    os << error;
  } else {
    os << (d == Device::Hip ? "hipGetDeviceCount" : "cudaGetDeviceCount") << " gives " << count << " devices";
  }
  os << ")";
  return os.str();
}

void check_complete(const GpuBackend& b, const std::string& where) {
  const std::vector<std::string> missing = b.missing();
  if (missing.empty()) return;
  std::ostringstream os;
  for (size_t i = 0; i < missing.size(); ++i) os << (i ? ", " : "") << missing[i];
  LS_THROW
      << where << " " << b.name << ": the " << b.name << " backend lacks " << missing.size()
      << " kernel entries (" << os.str()
      << "); on a device their CPU kernels would read device memory from the host, so this device cannot "
         "run the model";
}

std::string describe_device_runtime(Device d) {
  const DeviceRuntime* rt = find_device_runtime(d);
  std::ostringstream os;
  os << device_name(d);
  if (rt == nullptr) {
    os << " (not built)";
    return os.str();
  }
  std::string error;
  const int n = rt->count(&error);
  os << " (built, " << (n < 0 ? 0 : n) << " found";
  if (n < 0) os << ": " << error;
  os << ")";
  return os.str();
}

const GpuBackend* device_backend(Device d, const std::string& where) {
  switch (d) {
    case Device::Cpu: return nullptr;
    case Device::Interpret: return &interpret_backend();
    case Device::Cuda:
    case Device::Hip: break;
  }
  const DeviceRuntime* rt = find_device_runtime(d);
  if (rt == nullptr) {
    LS_THROW << where << " " << device_name(d) << ": this lockstep binary has no " << device_name(d)
             << " backend (not available in this build: configure with -DLOCKSTEP_"
             << (d == Device::Hip ? "HIP" : "CUDA")
             << "=ON where the compiler is installed). Use --device cpu, or --device interpret to run the "
                "same GPU "
                "kernel sources on the CPU (slow; docs/gpu.md)";
  }
  std::string error;
  const int n = rt->count(&error);
  if (n <= 0) LS_THROW << no_device_message(d, where, n, error);
  const GpuBackend* b = rt->open(0);
  check_complete(*b, where);
  note_device_memory(b->memory);
  return b;
}

}  // namespace lockstep::kernels
