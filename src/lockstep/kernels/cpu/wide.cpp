// The wide-vector switch (wide.h): the CPU's answer, read once, and the
// environment's and the tests' say.
#include "lockstep/kernels/cpu/wide.h"

#include <atomic>
#include <cstdlib>
#include <string>

namespace lockstep::kernels {
namespace {

bool cpu_has_avx512() {
#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__)
  static const bool has = __builtin_cpu_supports("avx512f");
  return has;
#else
  return false;  // the wide forms are written for x86 with AVX2 as the base
#endif
}

std::atomic<bool>& switch_on() {
  static std::atomic<bool> on{[] {
    const char* env = std::getenv("LOCKSTEP_WIDE_VECTORS");
    return env == nullptr || std::string(env) != "0";
  }()};
  return on;
}

}  // namespace

bool wide_vectors() {
  return cpu_has_avx512() && switch_on().load(std::memory_order_relaxed);
}

void set_wide_vectors(bool enabled) {
  switch_on().store(enabled, std::memory_order_relaxed);
}

}  // namespace lockstep::kernels
