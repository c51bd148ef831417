// Device names and the backend each one selects (device.h).
#include "lockstep/kernels/gpu/device.h"

#include "lockstep/base/error.h"

namespace lockstep::kernels {

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

const GpuBackend* device_backend(Device d) {
  switch (d) {
    case Device::Cpu: return nullptr;
    case Device::Interpret: return &interpret_backend();
    case Device::Cuda:
    case Device::Hip: break;
  }
  LS_THROW << "device \"" << device_name(d) << "\": this lockstep binary has no " << device_name(d)
           << " backend: the GPU kernels are built for " << device_name(d)
           << " only as a compile and lint target, and the engines do not yet keep their weights, KV cache and "
              "activations in device memory. Use --device cpu, or --device interpret to run the same GPU kernel "
              "sources on the CPU (slow; docs/gpu.md)";
}

}  // namespace lockstep::kernels
