// `lockstep info`: build configuration, SIMD target, thread count, devices.
#include <iostream>

#include "lockstep/base/thread_pool.h"
#include "lockstep/cli/command.h"
#include "lockstep/kernels/cpu/simd.h"
#include "lockstep/kernels/cpu/wide.h"
#include "lockstep/kernels/gpu/backend.h"
#include "lockstep/kernels/gpu/device.h"

namespace lockstep::cli {
namespace {

int run_info(const Args& args) {
  args.check_known({});
  std::cout << "lockstep " << LOCKSTEP_VERSION << "\n"
            << "compiler:       " << __VERSION__ << "\n"
            << "threads:        " << default_thread_count() << " (LOCKSTEP_THREADS overrides)\n"
            << "simd target:    " << kernels::simd_target_name() << " (Highway static target)\n"
            << "wide vectors:   "
            << (kernels::wide_vectors()
                    ? "AVX-512 (f32 GEMM and attention; LOCKSTEP_WIDE_VECTORS=0 turns them off)"
                    : "off (the CPU has no AVX-512F, or LOCKSTEP_WIDE_VECTORS=0)")
            << "\n"
            << "numerics:       f32 accumulation, fixed reduction order, -ffp-contract=off\n";
  const kernels::GpuBackend& b = kernels::interpret_backend();
  std::cout << "devices:        cpu, interpret (GPU kernel sources emulated on the CPU: "
            << b.covered().size() << " of " << b.covered().size() + b.missing().size() << " kernel entries";
  if (!b.missing().empty()) {
    std::cout << "; on the CPU kernels:";
    for (const auto& m : b.missing()) std::cout << " " << m;
  }
  std::cout << "), " << kernels::describe_device_runtime(kernels::Device::Cuda) << ", "
            << kernels::describe_device_runtime(kernels::Device::Hip) << "\n";
  return 0;
}

LS_REGISTER_COMMAND(Command{
    "info",
    "print build and machine information",
    "usage: lockstep info\n\nPrints the version, compiler, SIMD target, default thread count and the "
    "devices\n(--device) this build runs, with the GPU kernels interpret mode covers and, for\ncuda and hip, "
    "whether the binary has the device's runtime and how many devices\nit sees.\n",
    {},
    run_info});

}  // namespace
}  // namespace lockstep::cli
