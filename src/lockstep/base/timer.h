// Wall-clock timing for metrics (perf/*) and progress output.
#pragma once

#include <chrono>

namespace lockstep {

class Timer {
 public:
  Timer() : start_(Clock::now()) {}
  void reset() { start_ = Clock::now(); }
  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point start_;
};

// Adds the lifetime of the scope to *total (seconds).
class ScopedTimer {
 public:
  explicit ScopedTimer(double* total) : total_(total) {}
  ~ScopedTimer() { *total_ += timer_.seconds(); }
  ScopedTimer(const ScopedTimer&) = delete;
  ScopedTimer& operator=(const ScopedTimer&) = delete;

 private:
  double* total_;
  Timer timer_;
};

}  // namespace lockstep
