// A one-line progress bar on stderr ("samples 12/64 [=====>   ] 310 tok/s"),
// redrawn at most a few times a second; silent when stderr is not a terminal
// unless forced, so logs and CI output stay clean.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

#include "lockstep/base/timer.h"

namespace lockstep {

class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total, bool force = false);
  ~ProgressBar();
  // Sets the done count and the token count behind the rate.
  void update(int64_t done, int64_t tokens);
  void finish();

 private:
  void draw(bool final);
  std::string label_;
  int64_t total_, done_ = 0, tokens_ = 0;
  bool enabled_, finished_ = false;
  Timer timer_;
  double last_draw_ = -1;
  std::mutex mu_;
};

}  // namespace lockstep
