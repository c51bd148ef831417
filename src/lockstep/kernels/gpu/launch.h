// Launches on a device (CUDA or HIP builds only; portable.h includes this and
// LS_LAUNCH expands to DeviceLaunch there). Every launch goes on the backend's
// stream and is checked right after, naming the kernel and its launch site, as
// interpret mode's launches are (interp/emu.h).
#pragma once

#include <utility>

#include "lockstep/kernels/gpu/portable.h"

#if !defined(LOCKSTEP_GPU_INTERP)
namespace lockstep::kernels::gpu::LS_GPU_NS {

#if defined(LOCKSTEP_GPU_HIP)
using DeviceStream = hipStream_t;
#else
using DeviceStream = cudaStream_t;
#endif

// The backend's stream (runtime.cu): every launch, allocation and copy of the
// backend is ordered on it. The default stream until the device is opened.
DeviceStream stream();

// After a launch: throws, naming the kernel, its launch site and the runtime's
// error, when the launch failed (the runtime's last error). With
// LOCKSTEP_GPU_SYNC=1 in the environment it also waits for the kernel, so that
// an error while it runs (a fault) is reported at its own launch.
void check_launch(const char* kernel, const char* file, int line);

// LS_LAUNCH(ctx, kernel, grid, block)(args...) on a device.
template <typename... P>
class DeviceLaunch {
 public:
  DeviceLaunch(const char* name, const char* file, int line, dim3 grid, dim3 block, void (*kernel)(P...))
      : name_(name), file_(file), line_(line), grid_(grid), block_(block), kernel_(kernel) {}

  template <typename... A>
  void operator()(A&&... args) const {
    kernel_<<<grid_, block_, 0, stream()>>>(std::forward<A>(args)...);
    check_launch(name_, file_, line_);
  }

 private:
  const char* name_;
  const char* file_;
  int line_;
  dim3 grid_, block_;
  void (*kernel_)(P...);
};

}  // namespace lockstep::kernels::gpu::LS_GPU_NS
#endif
