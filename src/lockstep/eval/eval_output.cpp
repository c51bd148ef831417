// Metric maps, JSON and the console table for evaluation results.
#include "lockstep/eval/eval_output.h"

#include <cmath>
#include <cstdio>

#include "lockstep/base/number_text.h"

namespace lockstep::eval {

namespace {

// JSON has no NaN: a failed sample's reward is written as null.
nlohmann::json number_or_null(double x) {
  return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr);
}

nlohmann::json ks_to_json(const std::map<int64_t, double>& m) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : m) j[std::to_string(k)] = v;
  return j;
}

std::string fmt(const char* format, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, x);
  return buf;
}

}  // namespace

std::map<std::string, double> eval_metrics(const EvalSummary& s) {
  const std::string p = "eval/" + s.name + "/";
  std::map<std::string, double> m;
  m[p + "pass@1"] = s.pass_at_1;
  for (const auto& [k, v] : s.pass_at_k) m[p + "pass@" + std::to_string(k)] = v;
  m[p + "truncated_ratio"] = s.truncated_ratio;
  m[p + "response_len_mean"] = s.response_len_mean;
  m[p + "reward_mean"] = s.reward_mean;
  m[p + "reward_failures"] = double(s.reward_failures);
  m[p + "num_problems"] = double(s.num_problems);
  m[p + "num_samples"] = double(s.num_samples);
  m[p + "tokens_per_s"] = s.tokens_per_s;
  m[p + "time_s"] = s.elapsed_s;
  if (s.turns_mean > 0) m[p + "turns_mean"] = s.turns_mean;
  return m;
}

nlohmann::json summary_to_json(const EvalSummary& s) {
  nlohmann::json j;
  j["name"] = s.name;
  j["num_problems"] = s.num_problems;
  j["num_samples"] = s.num_samples;
  j["n"] = s.n;
  j["pass@1"] = s.pass_at_1;
  j["pass@k"] = ks_to_json(s.pass_at_k);
  j["truncated_ratio"] = s.truncated_ratio;
  j["truncated"] = s.truncated;
  j["aborted"] = s.aborted;
  j["response_len_mean"] = s.response_len_mean;
  j["reward_mean"] = s.reward_mean;
  j["reward_failures"] = s.reward_failures;
  j["failure_reasons"] = s.failure_reasons;
  j["generated_tokens"] = s.generated_tokens;
  j["tokens_per_s"] = s.tokens_per_s;
  j["generate_s"] = s.generate_s;
  j["score_s"] = s.score_s;
  j["elapsed_s"] = s.elapsed_s;
  j["metrics"] = eval_metrics(s);
  return j;
}

nlohmann::json problem_to_json(const EvalProblemResult& p) {
  nlohmann::json j;
  j["index"] = p.index;
  j["line"] = p.line;
  j["prompt"] = p.prompt;
  j["label"] = p.label;
  if (!p.metadata.is_null()) j["metadata"] = p.metadata;
  j["n"] = p.n;
  j["correct"] = p.correct;
  j["failures"] = p.failures;
  j["truncated"] = p.truncated;
  j["pass@k"] = ks_to_json(p.pass_at_k);
  nlohmann::json samples = nlohmann::json::array();
  for (const auto& s : p.samples) {
    nlohmann::json e;
    e["response"] = s.response;
    e["reward"] = number_or_null(s.reward);
    e["correct"] = s.correct;
    e["finish_reason"] = s.finish_reason;
    e["length"] = s.length;
    e["extracted"] = s.extracted;
    e["failure"] = s.failure.empty() ? nlohmann::json(nullptr) : nlohmann::json(s.failure);
    if (s.turns > 0) e["turns"] = s.turns;
    samples.push_back(std::move(e));
  }
  j["samples"] = std::move(samples);
  return j;
}

std::string format_summary_table(const EvalSummary& s) {
  std::string out =
      "eval " + s.name + ": " + count_of(s.num_problems, "problem") + " x " + count_of(s.n, "sample") + "\n";
  auto row = [&](const std::string& key, const std::string& value) {
    out += "  " + key + std::string(key.size() < 20 ? 20 - key.size() : 1, ' ') + value + "\n";
  };
  for (const auto& [k, v] : s.pass_at_k) row("pass@" + std::to_string(k), fmt("%.4f", v));
  row("truncated ratio", fmt("%.4f", s.truncated_ratio) + " (" + std::to_string(s.truncated) + " of " +
                             std::to_string(s.num_samples) + " finished by length)");
  row("response length", fmt("%.1f", s.response_len_mean) + " tokens (mean)");
  row("reward mean", fmt("%.4f", s.reward_mean) + " (over samples scored without failure)");
  std::string failures = std::to_string(s.reward_failures);
  if (!s.failure_reasons.empty()) {
    failures += " (";
    bool first = true;
    for (const auto& [reason, count] : s.failure_reasons) {
      failures += (first ? "" : ", ") + reason + ": " + std::to_string(count);
      first = false;
    }
    failures += ")";
  }
  row("reward failures", failures);
  if (s.aborted) row("aborted samples", std::to_string(s.aborted));
  row("problems", std::to_string(s.num_problems));
  row("samples", std::to_string(s.num_samples));
  row("tokens/s", fmt("%.1f", s.tokens_per_s) + " (" + std::to_string(s.generated_tokens) +
                      " tokens; generation " + fmt("%.2f", s.generate_s) + " s, scoring " +
                      fmt("%.2f", s.score_s) + " s)");
  return out;
}

}  // namespace lockstep::eval
