// Watchdog: one thread sleeping until the armed operation's deadline.
#include "lockstep/comm/watchdog.h"

#include <cstdio>
#include <cstdlib>

namespace lockstep::comm {

Watchdog::Watchdog(double timeout_s, int world_rank) : timeout_s_(timeout_s), world_rank_(world_rank) {
  if (timeout_s_ > 0) thread_ = std::thread([this] { loop(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::arm(const char* op, const std::string& comm) {
  if (timeout_s_ <= 0) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    armed_ = true;
    op_ = op;
    comm_ = comm;
    deadline_ = std::chrono::steady_clock::now() +
                std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeout_s_));
  }
  cv_.notify_all();
}

void Watchdog::disarm() {
  if (timeout_s_ <= 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  armed_ = false;
}

void Watchdog::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (!armed_) {
      cv_.wait(lock);
      continue;
    }
    const auto deadline = deadline_;
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && armed_ && deadline_ == deadline) {
      std::fprintf(stderr,
                   "lockstep: rank %d: MPI %s on communicator '%s' did not complete within %g s "
                   "([dist] timeout_s): a peer rank hangs, died, or skipped the call. Ending the job "
                   "(exit code %d).\n",
                   world_rank_, op_, comm_.c_str(), timeout_s_, kWatchdogExitCode);
      std::fflush(stderr);
      // The main thread is blocked inside MPI and cannot be unwound; ending
      // the process is the only way out, and makes the launcher stop the job.
      std::_Exit(kWatchdogExitCode);
    }
  }
}

}  // namespace lockstep::comm
