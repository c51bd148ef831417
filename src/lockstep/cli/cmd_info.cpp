// `lockstep info`: build configuration, SIMD target and thread count.
#include <iostream>

#include "lockstep/base/thread_pool.h"
#include "lockstep/cli/command.h"
#include "lockstep/kernels/cpu/simd.h"

namespace lockstep::cli {
namespace {

int run_info(const Args& args) {
  args.check_known({});
  std::cout << "lockstep " << LOCKSTEP_VERSION << "\n"
            << "compiler:       " << __VERSION__ << "\n"
            << "threads:        " << default_thread_count() << " (LOCKSTEP_THREADS overrides)\n"
            << "simd target:    " << kernels::simd_target_name() << " (Highway static target)\n"
            << "numerics:       f32 accumulation, fixed reduction order, -ffp-contract=off\n";
  return 0;
}

LS_REGISTER_COMMAND(Command{"info", "print build and machine information",
                            "usage: lockstep info\n\nPrints the version, compiler, SIMD target and default thread count.\n",
                            {}, run_info});

}  // namespace
}  // namespace lockstep::cli
