// Kernel self-check used by `lockstep demo` until the RL demo exists: each
// kernel against a double-precision reference, plus a batch-invariance probe.
#pragma once

#include <ostream>

namespace lockstep::cli {
bool run_selfcheck(std::ostream& out);
}
