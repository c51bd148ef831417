// ExactMatchReward: string equality after the configured normalization.
#include "lockstep/reward/exact.h"

#include <cctype>

namespace lockstep::reward {

ExactMatchReward::ExactMatchReward(const RewardOptions& options)
    : strip_(options.strip),
      casefold_(options.casefold),
      correct_reward_(options.correct_reward),
      incorrect_reward_(options.incorrect_reward),
      format_reward_(options.effective_format_reward()) {
  for (const auto& name : options.extractors) extractors_.push_back(*extractor_from_name(name));
}

std::string ExactMatchReward::normalize(std::string_view s) const {
  if (strip_) {
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  }
  std::string out(s);
  if (casefold_)  // ASCII only: no locale tables, the same result everywhere
    for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

RewardResult ExactMatchReward::evaluate(const RewardRequest& request) const {
  std::vector<std::string> labels;
  auto add = [&](const nlohmann::json& v) {
    if (v.is_string()) labels.push_back(normalize(v.get<std::string>()));
    else if (v.is_number()) labels.push_back(normalize(v.dump()));
  };
  if (request.label.is_array()) {
    for (const auto& v : request.label) add(v);
  } else {
    add(request.label);
  }
  if (labels.empty())
    return RewardResult::failure_result("bad_label: exact label must be a string, a number or a list of them, got " +
                                        request.label.dump().substr(0, 200));
  RewardResult r;
  std::string answer;
  if (extractors_.empty()) {
    answer = request.response;
  } else {
    auto ex = extract_answer(request.response, extractors_);
    if (!ex) {
      r.reward = incorrect_reward_;
      return r;
    }
    answer = ex->answer;
  }
  std::string norm = normalize(answer);
  for (const auto& l : labels) r.correct = r.correct || l == norm;
  // Reported for inspection only; a whole response need not be copied twice.
  r.extracted = norm.substr(0, 1000);
  if (r.correct) {
    r.reward = correct_reward_;
  } else {
    r.reward = extractors_.empty() ? incorrect_reward_ : format_reward_;
  }
  return r;
}

}  // namespace lockstep::reward
