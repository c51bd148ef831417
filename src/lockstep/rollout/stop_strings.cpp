// Stop-string checking over a window of trailing tokens.
#include "lockstep/rollout/stop_strings.h"

#include <algorithm>

namespace lockstep::rollout {

std::function<int64_t(const std::vector<int32_t>&)> make_stop_checker(const tokenizer::Tokenizer& tok,
                                                                       std::vector<std::string> stops) {
  size_t longest = 0;
  for (const auto& s : stops) longest = std::max(longest, s.size());
  return [tok, stops = std::move(stops), longest](const std::vector<int32_t>& out) -> int64_t {
    if (stops.empty() || out.empty()) return -1;
    // The newest token completes any stop string found now (earlier tokens were
    // checked before), so a window of `longest` + 1 tokens is enough.
    const size_t window = std::min(out.size(), longest + 1);
    const std::string tail = tok.decode(std::span<const int32_t>(out.data() + out.size() - window, window));
    for (const auto& s : stops)
      if (!s.empty() && tail.find(s) != std::string::npos) return int64_t(out.size());
    return -1;
  };
}

std::string cut_at_stop(const std::string& text, const std::vector<std::string>& stops) {
  size_t cut = text.size();
  for (const auto& s : stops) {
    if (s.empty()) continue;
    const size_t p = text.find(s);
    if (p != std::string::npos) cut = std::min(cut, p);
  }
  return text.substr(0, cut);
}

}  // namespace lockstep::rollout
