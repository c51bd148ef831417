// The device runtime of the CUDA and HIP builds (kernels/gpu/device.h's
// DeviceRuntime): how many devices the runtime sees, opening one (device
// selection, the backend's stream, the backend table), and the check after
// every launch (launch.h). Interpret mode has none of this: its launches are
// the emulator's, and this file compiles to nothing there.
#include "lockstep/kernels/gpu/portable.h"

#if !defined(LOCKSTEP_GPU_INTERP)
#include <cstdlib>
#include <cstring>
#include <string>

#include "lockstep/base/error.h"
#include "lockstep/kernels/gpu/device.h"
#include "lockstep/kernels/gpu/launch.h"

#if defined(LOCKSTEP_GPU_HIP)
#define LS_RT(x) hip##x
#define LS_RT_NAME "hip"
#else
#define LS_RT(x) cuda##x
#define LS_RT_NAME "cuda"
#endif

namespace lockstep::kernels::gpu::LS_GPU_NS {

GpuBackend make_backend();  // backend.cu

namespace {

DeviceStream g_stream = nullptr;  // created by open_device

bool sync_every_launch() {
  static const bool on = [] {
    const char* v = std::getenv("LOCKSTEP_GPU_SYNC");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return on;
}

template <typename E>
void check(E rc, const char* call) {
  if (rc != LS_RT(Success)) {
    LS_THROW << LS_RT_NAME << ": " << call << " failed: " << LS_RT(GetErrorName)(rc) << " ("
             << LS_RT(GetErrorString)(rc) << ")";
  }
}

int count_devices(std::string* error) {
  int n = 0;
  const auto rc = LS_RT(GetDeviceCount)(&n);
  if (rc != LS_RT(Success)) {
    if (error) *error = std::string(LS_RT_NAME "GetDeviceCount: ") + LS_RT(GetErrorString)(rc);
    (void)LS_RT(GetLastError)();  // clears the error for later calls
    return -1;
  }
  return n;
}

// Device `index` becomes current (one device per process: the launches, the
// allocator and the stream all use it) and the backend's stream is created.
const GpuBackend* open_device(int index) {
  static int opened = -1;
  if (opened < 0) {
    check(LS_RT(SetDevice)(index), LS_RT_NAME "SetDevice");
    check(LS_RT(StreamCreate)(&g_stream), LS_RT_NAME "StreamCreate");
    opened = index;
  }
  if (opened != index)
    LS_THROW << LS_RT_NAME << ": device " << opened << " is already open; one device per process";
  static const GpuBackend backend = make_backend();
  return &backend;
}

}  // namespace

DeviceStream stream() {
  return g_stream;
}

void check_launch(const char* kernel, const char* file, int line) {
  auto rc = LS_RT(GetLastError)();
  const char* when = "launch";
  if (rc == LS_RT(Success) && sync_every_launch()) {
    rc = LS_RT(StreamSynchronize)(g_stream);
    when = "run";
  }
  if (rc != LS_RT(Success)) {
    LS_THROW << "kernel " << kernel << " (launched at " << file << ":" << line << ") failed to " << when
             << " on " << LS_RT_NAME << ": " << LS_RT(GetErrorName)(rc) << " (" << LS_RT(GetErrorString)(rc)
             << ")";
  }
}

DeviceRuntime device_runtime() {
  DeviceRuntime rt;
#if defined(LOCKSTEP_GPU_HIP)
  rt.device = Device::Hip;
#else
  rt.device = Device::Cuda;
#endif
  rt.count = &count_devices;
  rt.open = &open_device;
  return rt;
}

}  // namespace lockstep::kernels::gpu::LS_GPU_NS

#undef LS_RT
#undef LS_RT_NAME
#endif
