// StepClock: step counter and time-left estimate of the console lines.
#include "lockstep/base/step_clock.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace lockstep {

std::string StepClock::head(int64_t step) const {
  return "step " + std::to_string(step) + "/" + std::to_string(total_);
}

std::string StepClock::timing(int64_t step) const {
  const double elapsed = timer_.seconds();
  const int64_t done = std::max<int64_t>(step - first_ + 1, 1);
  const double left = elapsed / double(done) * double(std::max<int64_t>(total_ - step, 0));
  return "elapsed " + duration(elapsed) + ", left " + duration(left);
}

std::string StepClock::duration(double seconds) {
  const auto s = static_cast<int64_t>(std::llround(std::max(seconds, 0.0)));
  char buf[48];
  if (s < 60) {
    std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(s));
  } else if (s < 3600) {
    std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>(s % 3600 / 60));
  }
  return buf;
}

}  // namespace lockstep
