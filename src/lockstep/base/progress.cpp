// ProgressBar drawing.
#include "lockstep/base/progress.h"

#include <unistd.h>

#include <cstdio>

namespace lockstep {

ProgressBar::ProgressBar(std::string label, int64_t total, bool force)
    : label_(std::move(label)), total_(total), enabled_(force || isatty(STDERR_FILENO)) {}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::update(int64_t done, int64_t tokens) {
  std::lock_guard<std::mutex> l(mu_);
  done_ = done;
  tokens_ = tokens;
  const double now = timer_.seconds();
  if (now - last_draw_ >= 0.2) {
    draw(false);
    last_draw_ = now;
  }
}

void ProgressBar::finish() {
  std::lock_guard<std::mutex> l(mu_);
  if (finished_) return;
  finished_ = true;
  draw(true);
}

void ProgressBar::draw(bool final) {
  if (!enabled_) return;
  constexpr int kWidth = 30;
  const double frac = total_ > 0 ? double(done_) / double(total_) : 1.0;
  const int fill = int(frac * kWidth);
  char bar[kWidth + 1];
  for (int i = 0; i < kWidth; ++i) bar[i] = i < fill ? '=' : (i == fill ? '>' : ' ');
  bar[kWidth] = 0;
  const double secs = timer_.seconds();
  std::fprintf(stderr, "\r%s %lld/%lld [%s] %.0f tok/s %.1fs%s", label_.c_str(), (long long)done_,
               (long long)total_, bar, secs > 0 ? double(tokens_) / secs : 0.0, secs, final ? "\n" : "");
  std::fflush(stderr);
}

}  // namespace lockstep
