// The report's chart list (see charts.h): one Chart per question a user asks
// of an RL run, filled from the metrics that answer it.
#include "lockstep/report/charts.h"

#include <algorithm>
#include <cstdlib>
#include <tuple>

namespace lockstep::report {
namespace {

Series line(const MetricTable& m, const std::string& metric, const std::string& label, bool dashed = false) {
  Series s;
  s.name = label;
  s.points = m.points(metric);
  s.dashed = dashed;
  return s;
}

std::string hint(const std::vector<std::string>& metrics) {
  std::string s = "not in metrics.jsonl:";
  for (size_t i = 0; i < metrics.size(); ++i) s += (i ? ", " : " ") + metrics[i];
  return s;
}

Chart chart(const std::string& id, const std::string& title, const std::string& y_label,
            const std::vector<std::string>& looked_for) {
  Chart c;
  c.id = id;
  c.title = title;
  c.y_label = y_label;
  c.no_data_hint = hint(looked_for);
  return c;
}

// eval/<set>/<metric> names of one metric (e.g. "truncated_ratio"), by set.
std::vector<std::pair<std::string, std::string>> eval_sets_with(const MetricTable& m,
                                                                const std::string& metric) {
  std::vector<std::pair<std::string, std::string>> out;  // (set, full name)
  for (const auto& name : m.names_with_prefix("eval/")) {
    std::string set, what;
    if (split_eval_name(name, &set, &what) && what == metric) out.push_back({set, name});
  }
  return out;
}

// Sort key of a pass@k metric: k numerically, non-numeric suffixes last.
long pass_k(const std::string& metric) {
  const std::string k = metric.substr(5);
  if (k.empty() || k.find_first_not_of("0123456789") != std::string::npos || k.size() > 9) return 1L << 40;
  return std::atol(k.c_str());
}

}  // namespace

bool split_eval_name(const std::string& name, std::string* set, std::string* metric) {
  if (name.rfind("eval/", 0) != 0) return false;
  const size_t slash = name.rfind('/');
  if (slash <= 4 || slash + 1 >= name.size()) return false;  // eval/<nothing> or a trailing '/'
  *set = name.substr(5, slash - 5);
  *metric = name.substr(slash + 1);
  return !set->empty();
}

std::vector<std::string> sorted_eval_names(const MetricTable& m) {
  std::vector<std::tuple<std::string, int, long, std::string, std::string>>
      keyed;  // (set, kind, k, metric, name)
  for (const auto& name : m.names_with_prefix("eval/")) {
    std::string set, what;
    if (!split_eval_name(name, &set, &what)) continue;
    const bool pass = what.rfind("pass@", 0) == 0;
    keyed.emplace_back(set, pass ? 0 : 1, pass ? pass_k(what) : 0, what, name);
  }
  std::sort(keyed.begin(), keyed.end());
  std::vector<std::string> out;
  for (const auto& k : keyed) out.push_back(std::get<4>(k));
  return out;
}

namespace {

// What the rollouts looked like: reward, eval pass rates, truncation, length.
void add_rollout_charts(const MetricTable& m, std::vector<Chart>& charts) {
  {
    Chart c = chart("reward", "Reward (rollout)", "reward", {"rollout/reward_mean", "rollout/reward_std"});
    if (m.has("rollout/reward_mean") && m.has("rollout/reward_std")) {
      Band b;
      b.name = "mean ± std";
      const auto& mean = m.series.at("rollout/reward_mean");
      const auto& std_dev = m.series.at("rollout/reward_std");
      for (const auto& [step, mu] : mean) {
        auto it = std_dev.find(step);
        if (it == std_dev.end()) continue;
        b.x.push_back(double(step));
        b.lo.push_back(mu - it->second);
        b.hi.push_back(mu + it->second);
      }
      c.bands.push_back(std::move(b));
    }
    c.lines.push_back(line(m, "rollout/reward_mean", "reward mean"));
    charts.push_back(std::move(c));
  }

  {
    Chart c = chart("eval_pass", "Eval pass@1 and pass@k", "pass rate",
                    {"eval/<set>/pass@1", "eval/<set>/pass@<k>"});
    for (const auto& name : sorted_eval_names(m)) {
      std::string set, what;
      split_eval_name(name, &set, &what);
      if (what.rfind("pass@", 0) == 0) c.lines.push_back(line(m, name, set + " " + what, what != "pass@1"));
    }
    charts.push_back(std::move(c));
  }

  {
    Chart c = chart("truncation", "Truncated ratio (finish_reason = length)", "fraction",
                    {"rollout/truncated_ratio", "eval/<set>/truncated_ratio"});
    c.lines.push_back(line(m, "rollout/truncated_ratio", "rollout"));
    for (const auto& [set, name] : eval_sets_with(m, "truncated_ratio"))
      c.lines.push_back(line(m, name, "eval " + set, true));
    charts.push_back(std::move(c));
  }

  {
    Chart c =
        chart("response_len", "Response length", "tokens",
              {"rollout/response_len_mean", "rollout/response_len_max", "eval/<set>/response_len_mean"});
    c.lines.push_back(line(m, "rollout/response_len_mean", "rollout mean"));
    c.lines.push_back(line(m, "rollout/response_len_max", "rollout max", true));
    for (const auto& [set, name] : eval_sets_with(m, "response_len_mean"))
      c.lines.push_back(line(m, name, "eval " + set + " mean"));
    charts.push_back(std::move(c));
  }

  // Only in multi-turn runs ([rollout] env): model turns per episode, in
  // training and held-out episodes, and the environment's failures and time.
  if (m.has("rollout/turns_mean")) {
    Chart c =
        chart("turns", "Multi-turn episodes", "turns / episodes / seconds",
              {"rollout/turns_mean", "eval/<set>/turns_mean", "rollout/env_failures", "rollout/env_time_s"});
    c.lines.push_back(line(m, "rollout/turns_mean", "turns per episode"));
    for (const auto& [set, name] : eval_sets_with(m, "turns_mean"))
      c.lines.push_back(line(m, name, "eval " + set + " turns"));
    c.lines.push_back(line(m, "rollout/env_failures", "env failures", true));
    c.lines.push_back(line(m, "rollout/env_time_s", "env time (s)", true));
    charts.push_back(std::move(c));
  }
}

// What the verifier said, in runs that log it: the fraction judged correct
// (with the score before penalties), and one chart per reward/extra/<key>
// (a Python reward's further keys, each on its own scale).
void add_verifier_charts(const MetricTable& m, std::vector<Chart>& charts) {
  if (m.has("rollout/accuracy")) {
    Chart c = chart("accuracy", "Accuracy (rollout)", "fraction / score",
                    {"rollout/accuracy", "rollout/score_mean"});
    c.lines.push_back(line(m, "rollout/accuracy", "judged correct"));
    c.lines.push_back(line(m, "rollout/score_mean", "verifier score mean", true));
    charts.push_back(std::move(c));
  }
  const std::string prefix = "reward/extra/";
  for (const auto& name : m.names_with_prefix(prefix)) {
    const std::string key = name.substr(prefix.size());
    Chart c = chart("reward_extra/" + key, "Reward extra: " + key, key, {name});
    c.lines.push_back(line(m, name, key));
    charts.push_back(std::move(c));
  }
}

// The trainer's view: the train/rollout gap, KL, clipping, entropy, gradient
// norm, loss, learning rate.
void add_train_charts(const MetricTable& m, std::vector<Chart>& charts) {
  {
    Chart c = chart("logprob_gap", "Train vs rollout logprob gap |Δ logp|", "|Δ logp| (nats)",
                    {"train/train_rollout_logprob_abs_diff", "train/train_rollout_logprob_abs_diff_max"});
    c.lines.push_back(line(m, "train/train_rollout_logprob_abs_diff", "mean |Δ|"));
    c.lines.push_back(line(m, "train/train_rollout_logprob_abs_diff_max", "max |Δ|", true));
    charts.push_back(std::move(c));
  }

  {
    Chart c = chart("kl", "KL divergence", "KL (nats/token)", {"train/train_rollout_kl", "train/kl"});
    c.lines.push_back(line(m, "train/train_rollout_kl", "trainer vs rollout (k3)"));
    c.lines.push_back(line(m, "train/kl", "policy vs reference"));
    charts.push_back(std::move(c));
  }

  {
    Chart c = chart("clipfrac", "Clip fractions", "fraction of tokens",
                    {"train/tis_clipfrac", "train/pg_clipfrac"});
    c.lines.push_back(line(m, "train/tis_clipfrac", "TIS weight clipped"));
    c.lines.push_back(line(m, "train/pg_clipfrac", "PPO ratio clipped", true));
    charts.push_back(std::move(c));
  }

  {
    Chart c = chart("entropy", "Policy entropy", "nats/token", {"train/entropy"});
    c.lines.push_back(line(m, "train/entropy", "entropy"));
    charts.push_back(std::move(c));
  }

  {
    Chart c = chart("grad_norm", "Gradient norm (before clipping)", "L2 norm", {"train/grad_norm"});
    c.lines.push_back(line(m, "train/grad_norm", "grad norm"));
    charts.push_back(std::move(c));
  }

  {
    Chart c = chart("loss", "Loss", "loss", {"train/pg_loss", "train/loss"});
    c.lines.push_back(line(m, "train/pg_loss", "policy-gradient loss"));
    c.lines.push_back(line(m, "train/loss", "loss"));
    charts.push_back(std::move(c));
  }

  {
    Chart c = chart("lr", "Learning rate", "lr", {"train/lr"});
    c.lines.push_back(line(m, "train/lr", "lr"));
    charts.push_back(std::move(c));
  }
}

// Where the time went: step phases, rollout-ahead staleness, throughput.
void add_perf_charts(const MetricTable& m, std::vector<Chart>& charts) {
  {
    Chart c = chart("step_time", "Step time by phase", "seconds",
                    {"perf/rollout_time_s", "perf/reward_time_s", "perf/train_time_s", "perf/weight_sync_s",
                     "perf/eval_time_s", "perf/step_time_s"});
    const std::pair<const char*, const char*> phases[] = {{"perf/rollout_time_s", "rollout"},
                                                          {"perf/reward_time_s", "reward"},
                                                          {"perf/train_time_s", "train"},
                                                          {"perf/weight_sync_s", "weight sync"},
                                                          {"perf/eval_time_s", "eval"}};
    for (const auto& [metric, label] : phases) c.stacked.push_back(line(m, metric, label));
    Series total = line(m, "perf/step_time_s", "step total", true);
    total.color = "#222222";
    c.lines.push_back(std::move(total));
    charts.push_back(std::move(c));
  }

  // Only in runs whose rollout generated ahead of training ([dist]
  // max_weight_staleness > 0): how stale the samples were and how long the
  // trainer still waited for them.
  if (m.has("perf/rollout_wait_time_s")) {
    Chart c = chart("rollout_ahead", "Rollout ahead of training", "steps / seconds",
                    {"rollout/weight_staleness", "perf/rollout_wait_time_s"});
    c.lines.push_back(line(m, "rollout/weight_staleness", "staleness (steps)"));
    c.lines.push_back(line(m, "perf/rollout_wait_time_s", "trainer waited (s)", true));
    charts.push_back(std::move(c));
  }

  {
    Chart c = chart("throughput", "Throughput", "tokens/s",
                    {"perf/rollout_tokens_per_s", "perf/train_tokens_per_s"});
    c.lines.push_back(line(m, "perf/rollout_tokens_per_s", "rollout"));
    c.lines.push_back(line(m, "perf/train_tokens_per_s", "training"));
    charts.push_back(std::move(c));
  }
}

}  // namespace

std::vector<Chart> build_charts(const MetricTable& m, const MetricTable* sft) {
  std::vector<Chart> charts;
  add_rollout_charts(m, charts);
  add_verifier_charts(m, charts);
  add_train_charts(m, charts);
  add_perf_charts(m, charts);
  if (sft) {
    Chart c = chart("sft_loss", "SFT warm-up loss (sft/metrics.jsonl)", "loss", {"train/loss"});
    c.no_data_hint = "not in sft/metrics.jsonl: train/loss";
    c.lines.push_back(line(*sft, "train/loss", "SFT loss"));
    charts.push_back(std::move(c));
  }
  return charts;
}

}  // namespace lockstep::report
