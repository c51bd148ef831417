// How far a run of numbered steps has come, for its console line: "step 3/10"
// and the time elapsed and left (the mean time of the steps this process ran,
// times the steps still to run).
#pragma once

#include <cstdint>
#include <string>

#include "lockstep/base/timer.h"

namespace lockstep {

class StepClock {
 public:
  // first_step: the first step this process runs (after a resume, the one
  // after the checkpoint's); total: the run's last step.
  StepClock(int64_t first_step, int64_t total) : first_(first_step), total_(total) {}
  // "step 3/10".
  std::string head(int64_t step) const;
  // "elapsed 12s, left 30s" after `step` finished.
  std::string timing(int64_t step) const;
  // "12s", "3m05s", "1h02m".
  static std::string duration(double seconds);

 private:
  int64_t first_, total_;
  Timer timer_;
};

}  // namespace lockstep
