// The lockstep -> verl metric name table (see metric_names.h). Only names
// whose verl metric measures the same quantity are listed.
#include "lockstep/metrics/metric_names.h"

#include <map>

#include "lockstep/base/error.h"

namespace lockstep::metrics {
namespace {

using NameMap = std::map<std::string, std::string, std::less<>>;

NameMap build_map(bool to_verl) {
  NameMap m;
  for (const auto& [ours, verl] : verl_metric_names()) {
    if (to_verl)
      m.emplace(std::string(ours), std::string(verl));
    else
      m.emplace(std::string(verl), std::string(ours));
  }
  return m;
}

}  // namespace

MetricNames parse_metric_names(const std::string& s) {
  if (s == "lockstep") return MetricNames::Lockstep;
  if (s == "verl") return MetricNames::Verl;
  LS_THROW << "metric names \"" << s << "\": expected \"lockstep\" or \"verl\"";
}

const char* to_string(MetricNames n) {
  return n == MetricNames::Verl ? "verl" : "lockstep";
}

const std::vector<std::pair<std::string_view, std::string_view>>& verl_metric_names() {
  static const std::vector<std::pair<std::string_view, std::string_view>> table = {
      {"train/pg_loss", "actor/pg_loss"},
      {"train/entropy", "actor/entropy"},
      {"train/pg_clipfrac", "actor/pg_clipfrac"},
      {"train/ppo_kl", "actor/ppo_kl"},
      {"train/kl", "actor/kl_loss"},
      {"train/grad_norm", "actor/grad_norm"},
      {"train/lr", "actor/lr"},
      {"rollout/score_mean", "critic/score/mean"},
      {"rollout/reward_mean", "critic/rewards/mean"},
      {"train/advantage_mean", "critic/advantages/mean"},
      {"critic/values_mean", "critic/values/mean"},
      {"critic/returns_mean", "critic/returns/mean"},
      {"rollout/response_len_mean", "response_length/mean"},
      {"rollout/response_len_max", "response_length/max"},
      {"rollout/truncated_ratio", "response_length/clip_ratio"},
      {"perf/step_time_s", "timing_s/step"},
      {"perf/rollout_time_s", "timing_s/gen"},
      {"perf/reward_time_s", "timing_s/reward"},
      {"perf/old_logprob_time_s", "timing_s/old_log_prob"},
      {"perf/ref_logprob_time_s", "timing_s/ref"},
      {"perf/train_time_s", "timing_s/update_actor"},
      {"perf/eval_time_s", "timing_s/testing"},
  };
  return table;
}

std::string exported_name(const std::string& name, MetricNames names) {
  if (names == MetricNames::Lockstep) return name;
  static const NameMap to_verl = build_map(true);
  auto it = to_verl.find(name);
  return it == to_verl.end() ? name : it->second;
}

std::string lockstep_name(const std::string& name) {
  static const NameMap from_verl = build_map(false);
  auto it = from_verl.find(name);
  return it == from_verl.end() ? name : it->second;
}

}  // namespace lockstep::metrics
