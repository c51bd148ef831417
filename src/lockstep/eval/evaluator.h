// The eval runner: n samples of every problem from the rollout engine, each
// decoded and scored by a verifier, aggregated into pass@1, pass@k,
// truncation rate and response length. `lockstep eval` and the RL loop (every
// eval.interval steps) both run it; docs/eval.md defines every metric.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lockstep/data/dataset.h"
#include "lockstep/reward/batch.h"
#include "lockstep/reward/reward.h"
#include "lockstep/rollout/engine.h"
#include "lockstep/rollout/sampler.h"
#include "lockstep/tokenizer/tokenizer.h"

namespace lockstep::eval {

struct EvalConfig {
  std::string name = "test";  // the set's name in metric keys: eval/<name>/pass@1
  int64_t n = 8;              // samples per problem (the n of pass@k)
  // Temperature 1 and no truncation by default: pass@k estimates the model's
  // own distribution. `n` and `seed` of these params are set per problem.
  rollout::SamplingParams sampling;
  // Problem i is sampled with request seed mix_seed(seed, i) (i = its index
  // in the problem list), so an evaluation is reproducible whatever else the
  // engine runs, and repeated evaluations during training draw the same
  // random numbers (less noise between steps).
  uint64_t seed = 0;
  // Also stop at the tokenizer's end-of-turn token (<|im_end|>, <|eot_id|>),
  // which some models' config.json does not list as eos.
  bool stop_at_end_of_turn = true;
  reward::RewardOptions reward;

  EvalConfig() { sampling.max_new_tokens = 1024; }
  void validate() const;  // throws Error naming the bad field
};

// One generated response and its verdict.
struct EvalSample {
  std::string response;       // decoded, special tokens skipped
  int64_t length = 0;         // output tokens (the stop token included)
  std::string finish_reason;  // "stop", "length" or "abort"
  double reward = 0.0;        // NaN when scoring failed
  bool correct = false;       // false when scoring failed
  std::string extracted;
  std::string failure;  // "" unless scoring failed
  int64_t turns = 0;    // multi-turn episodes: model turns (0: a single-turn sample)
};

struct EvalProblemResult {
  int64_t index = 0;  // position in the problem list
  int64_t line = 0;   // line of the data file
  std::string prompt;
  nlohmann::json label, metadata;
  int64_t n = 0;                        // samples
  int64_t correct = 0;                  // c of pass@k; failed samples never count
  int64_t failures = 0;                 // samples whose scoring failed
  int64_t truncated = 0;                // samples that ended with finish reason "length"
  std::map<int64_t, double> pass_at_k;  // k -> pass_at_k(n, correct, k)
  std::vector<EvalSample> samples;
};

struct EvalSummary {
  std::string name;
  int64_t num_problems = 0, num_samples = 0, n = 0;
  double pass_at_1 = 0;                 // mean over problems of correct / n
  std::map<int64_t, double> pass_at_k;  // k -> mean over problems (k = 1 included)
  double truncated_ratio = 0;           // samples with finish reason "length" / samples
  double response_len_mean = 0;         // mean output tokens per sample
  double reward_mean = 0;               // over samples whose scoring did not fail
  int64_t reward_failures = 0;
  std::map<std::string, int64_t> failure_reasons;
  int64_t truncated = 0, aborted = 0;
  int64_t generated_tokens = 0;
  double generate_s = 0, score_s = 0, elapsed_s = 0;
  double tokens_per_s = 0;  // generated tokens / generate_s
  double turns_mean = 0;    // multi-turn episodes: model turns per sample (0: single-turn)
};

// Runs the requests and returns their results in request order (how the
// RL loop plugs in an engine running in background mode).
using GenerateFn = std::function<std::vector<rollout::RequestResult>(std::vector<rollout::Request>)>;

// Holds the verifier and its scoring threads, so the RL loop builds it once
// and evaluates every eval.interval steps.
class Evaluator {
 public:
  // The reward selected by config.reward.
  explicit Evaluator(EvalConfig config);
  // A given reward (tests, custom verifiers); config.reward then only sets
  // the scoring threads and time limit.
  Evaluator(EvalConfig config, std::shared_ptr<const reward::Reward> reward);
  ~Evaluator();
  Evaluator(const Evaluator&) = delete;
  Evaluator& operator=(const Evaluator&) = delete;

  // Generates with engine.generate (the engine must not be in background
  // mode), scores, aggregates. per_problem (optional) receives one result per
  // problem, in order.
  EvalSummary run(rollout::Engine& engine, const tokenizer::Tokenizer& tok,
                  const std::vector<data::PromptExample>& problems,
                  std::vector<EvalProblemResult>* per_problem = nullptr);
  EvalSummary run(const GenerateFn& generate, const tokenizer::Tokenizer& tok,
                  const std::vector<data::PromptExample>& problems,
                  std::vector<EvalProblemResult>* per_problem = nullptr);

  // The pieces of run(): one request per problem (n samples each) ...
  std::vector<rollout::Request> make_requests(const tokenizer::Tokenizer& tok,
                                              const std::vector<data::PromptExample>& problems) const;
  // ... and decoding, scoring and aggregation of their results.
  // generate_s is the time generation took (for tokens/s).
  EvalSummary score(const tokenizer::Tokenizer& tok, const std::vector<data::PromptExample>& problems,
                    const std::vector<rollout::RequestResult>& results, double generate_s,
                    std::vector<EvalProblemResult>* per_problem = nullptr);

  const EvalConfig& config() const { return config_; }

  // How score() scores its batch of requests (results in order); by
  // default scorer().score. The RL loop splits the batch over its trainer
  // ranks so that each sample is scored once.
  using ScoreBatchFn = std::function<std::vector<reward::RewardResult>(const std::vector<reward::RewardRequest>&)>;
  void set_score_batch(ScoreBatchFn fn) { score_batch_ = std::move(fn); }
  reward::BatchScorer& scorer() { return *scorer_; }

 private:
  EvalConfig config_;
  std::shared_ptr<const reward::Reward> reward_;
  std::unique_ptr<reward::BatchScorer> scorer_;
  ScoreBatchFn score_batch_;
};

// A problem's result before its samples: index, line, prompt, label, metadata, n.
EvalProblemResult problem_result(const data::PromptExample& ex, int64_t index, int64_t n);

// The verdicts (sample order: problem-major) into the samples of `probs`
// (whose response, length and finish_reason are set), and the summary over
// them; timing fields are left 0. A finish reason "length" or "budget"
// (a multi-turn episode out of tokens) counts as truncated.
EvalSummary aggregate(const EvalConfig& config, std::vector<EvalProblemResult>& probs,
                      const std::vector<reward::RewardResult>& verdicts);

// One-shot convenience: Evaluator(config).run(engine, ...).
EvalSummary evaluate(rollout::Engine& engine, const tokenizer::Tokenizer& tok,
                     const std::vector<data::PromptExample>& problems, const EvalConfig& config,
                     std::vector<EvalProblemResult>* per_problem = nullptr);

}  // namespace lockstep::eval
