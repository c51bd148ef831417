// Self-check body; grows as kernels land.
#include "lockstep/cli/selfcheck.h"

namespace lockstep::cli {
bool run_selfcheck(std::ostream& out) {
  out << "no kernels yet\n";
  return true;
}
}  // namespace lockstep::cli
