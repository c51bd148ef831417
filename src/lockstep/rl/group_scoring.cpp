// score_across_ranks: score this rank's shard, gather every rank's verdicts
// as JSON text, concatenate in rank order.
#include "lockstep/rl/group_scoring.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "lockstep/base/error.h"

namespace lockstep::rl {

std::string encode_results(const std::vector<reward::RewardResult>& results) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& r : results) {
    nlohmann::json j = {{"r", std::isfinite(r.reward) ? nlohmann::json(r.reward) : nlohmann::json(nullptr)},
                        {"c", r.correct},
                        {"x", r.extracted},
                        {"f", r.failure}};
    if (!r.extra.empty()) j["e"] = r.extra;
    a.push_back(std::move(j));
  }
  return a.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::vector<reward::RewardResult> decode_results(const std::string& text) {
  std::vector<reward::RewardResult> out;
  for (const auto& j : nlohmann::json::parse(text)) {
    reward::RewardResult r;
    r.reward = j["r"].is_null() ? std::nan("") : j["r"].get<double>();
    r.correct = j["c"].get<bool>();
    r.extracted = j["x"].get<std::string>();
    r.failure = j["f"].get<std::string>();
    if (auto e = j.find("e"); e != j.end()) r.extra = e->get<std::map<std::string, double>>();
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<reward::RewardResult> score_across_ranks(reward::BatchScorer& scorer, TrainerGroup& group,
                                                     const std::vector<reward::RewardRequest>& requests) {
  if (group.ranks() == 1) return scorer.score(requests);
  const auto [begin, end] = group.shard(requests.size());
  std::vector<reward::RewardRequest> mine(requests.begin() + std::ptrdiff_t(begin),
                                          requests.begin() + std::ptrdiff_t(end));
  const std::vector<std::string> parts = group.gather_strings(encode_results(scorer.score(mine)));
  std::vector<reward::RewardResult> all;
  all.reserve(requests.size());
  for (const auto& p : parts)
    for (auto& r : decode_results(p)) all.push_back(std::move(r));
  LS_CHECK(all.size() == requests.size()) << "rl: " << all.size() << " verdicts gathered for " << requests.size()
                                          << " samples";
  return all;
}

}  // namespace lockstep::rl
