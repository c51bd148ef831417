// format_step_line: the fields of the rl step line, in order.
#include "lockstep/rl/step_line.h"

#include <cstdio>
#include <sstream>

namespace lockstep::rl {
namespace {

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

}  // namespace

std::string format_step_line(const std::string& head, const nlohmann::json& m, const RewardTally& rewards,
                             const std::string& skipped, const std::string& timing) {
  auto get = [&](const char* k) { return m.contains(k) && m[k].is_number() ? m[k].get<double>() : 0.0; };
  std::ostringstream os;
  os << head << " | reward ";
  // No sample scored: no mean to show (the metric is absent too).
  os << (m.contains("rollout/reward_mean") ? number(get("rollout/reward_mean")) : std::string("-"));
  if (rewards.failed > 0) os << " (" << rewards.failed << "/" << rewards.scored << " failed)";
  for (const auto& [name, key] : {std::pair<const char*, const char*>{"acc", "rollout/accuracy"},
                                  {"len", "rollout/response_len_mean"},
                                  {"trunc", "rollout/truncated_ratio"},
                                  {"pg_loss", "train/pg_loss"},
                                  {"gap", "train/train_rollout_logprob_abs_diff"},
                                  {"grad_norm", "train/grad_norm"},
                                  {"s", "perf/step_time_s"}}) {
    // A step without an update has no loss or gradient to show.
    if (!skipped.empty() && std::string(key).rfind("train/", 0) == 0) continue;
    os << " | " << name << " " << number(get(key));
  }
  if (!skipped.empty()) os << " | skipped: " << skipped;
  if (!timing.empty()) os << " | " << timing;
  return os.str();
}

}  // namespace lockstep::rl
