// The reward interface every verifier implements, the options that select
// and configure one (the [reward] config section maps onto RewardOptions),
// and the factory that builds a verifier from them.
#pragma once

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lockstep::reward {

// One sample to score.
struct RewardRequest {
  std::string prompt;       // optional; only the remote reward uses it
  std::string response;     // the model's output
  nlohmann::json label;     // ground truth: string or number (math, exact), object (countdown)
  nlohmann::json metadata;  // optional per-sample data (null when absent)
};

// The verdict on one sample. A failed sample (failure non-empty: timeout,
// bad label, HTTP error, ...) has no reward: `reward` is NaN so that it can
// never be averaged in as "wrong" by accident. Callers count failures
// (rollout/reward_failures) and decide what to do with the sample.
struct RewardResult {
  double reward = 0.0;
  bool correct = false;
  std::string extracted;  // the answer found in the response; "" when none
  std::string failure;    // "" when scoring succeeded
  // Further numbers a reward reports per sample (python: the other numeric
  // keys of the dict it returns); logged as reward/extra/<key>.
  std::map<std::string, double> extra;
  bool failed() const { return !failure.empty(); }
  static RewardResult failure_result(std::string reason);
};

class Reward {
 public:
  virtual ~Reward() = default;
  // Scores one sample. Implementations are thread-safe (const, no shared
  // mutable state) and bounded in time for every input. Bad labels come
  // back as failures; an exception means a bug.
  virtual RewardResult evaluate(const RewardRequest& request) const = 0;
  virtual std::string type() const = 0;
  // The most samples worth scoring at once; 0 means no limit.
  virtual int max_parallelism() const { return 0; }

  // Convenience: builds the request and turns an exception into a failure.
  RewardResult score(std::string_view response, const nlohmann::json& label,
                     const nlohmann::json& metadata = nullptr, std::string_view prompt = {}) const;
};

// All reward settings. Keys of from_json() have the same names.
struct RewardOptions {
  std::string type = "math";            // math | countdown | exact | remote | python
  std::vector<std::string> extractors;  // math, exact: answer extractors in order ([] = the type's default)
  double tolerance = 1e-6;              // math: relative tolerance for inexact numbers
  double correct_reward = 1.0;          // reward of a correct answer
  double incorrect_reward = 0.0;        // reward when no answer was found (and, by default, when wrong)
  std::optional<double> format_reward;  // a found but wrong answer (default: 0.1 countdown, else incorrect_reward)
  bool strip = true;                    // exact: ignore leading/trailing whitespace
  bool casefold = false;                // exact: ignore ASCII case
  std::string url;                      // remote: http://host:port/path (https:// too)
  double timeout_s = 10.0;              // per-sample time limit; remote: budget for all attempts
  double request_timeout_s = 0.0;       // remote: limit of one attempt (0: timeout_s)
  int retries = 2;                      // remote: attempts after the first
  double backoff_s = 0.25;              // remote: delay before the first retry, doubled each time
  int max_concurrency = 16;             // remote: requests in flight at once
  int threads = 0;                      // batch scoring worker threads (0: hardware threads)
  std::string path;                     // python: the reward file (config: relative to the config's directory)
  std::string function = "compute_score";  // python: the function called per sample
  int workers = 0;                      // python: worker processes (0: min(4, hardware threads))
  std::string python = "python3";       // python: the interpreter (PATH is searched)
  // rl: the run stops when more than this share of a step's rewards fail for
  // 3 steps in a row (a step where every reward fails stops it at once).
  double max_failure_rate = 0.5;

  // Builds options from a JSON object; unknown keys and wrong value types
  // throw lockstep::Error naming the key. Calls validate().
  static RewardOptions from_json(const nlohmann::json& j);
  nlohmann::json to_json() const;
  void validate() const;  // throws Error naming the bad key
  double effective_format_reward() const;
};

// Builds the verifier selected by options.type (validates the options).
std::unique_ptr<Reward> make_reward(const RewardOptions& options);

}  // namespace lockstep::reward
