// Collective timeout. A rank blocked in an MPI call whose peer hangs (alive,
// but never joins the collective) would wait forever; the MPI call cannot be
// interrupted, so when it has not returned within `timeout_s` the watchdog
// prints which operation on which communicator timed out and ends this
// process with kWatchdogExitCode. mpirun/srun then tears the whole job down.
// (A peer that dies is handled by the launcher itself, without the watchdog.)
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace lockstep::comm {

inline constexpr int kWatchdogExitCode = 86;

class Watchdog {
 public:
  // timeout_s <= 0: disabled (no thread).
  Watchdog(double timeout_s, int world_rank);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  double timeout_s() const { return timeout_s_; }
  // Only one operation is armed at a time: MPI is called from one thread.
  void arm(const char* op, const std::string& comm);
  void disarm();

 private:
  void loop();

  double timeout_s_;
  int world_rank_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, armed_ = false;
  std::chrono::steady_clock::time_point deadline_;
  const char* op_ = "";
  std::string comm_;
  std::thread thread_;
};

// Arms `w` (may be null) for the lifetime of the scope.
class WatchdogScope {
 public:
  WatchdogScope(Watchdog* w, const char* op, const std::string& comm) : w_(w) {
    if (w_) w_->arm(op, comm);
  }
  ~WatchdogScope() {
    if (w_) w_->disarm();
  }
  WatchdogScope(const WatchdogScope&) = delete;
  WatchdogScope& operator=(const WatchdogScope&) = delete;

 private:
  Watchdog* w_;
};

}  // namespace lockstep::comm
