// The eval runner: requests (n seeded samples per problem), decoding, batch
// scoring with time limits, and aggregation into an EvalSummary.
#include "lockstep/eval/evaluator.h"

#include <algorithm>
#include <cmath>

#include "lockstep/base/error.h"
#include "lockstep/base/rng.h"
#include "lockstep/base/timer.h"
#include "lockstep/eval/pass_at_k.h"

namespace lockstep::eval {

Evaluator::Evaluator(EvalConfig config) : Evaluator(config, reward::make_reward(config.reward)) {}

Evaluator::Evaluator(EvalConfig config, std::shared_ptr<const reward::Reward> reward)
    : config_(std::move(config)), reward_(std::move(reward)) {
  config_.validate();
  LS_CHECK(reward_ != nullptr) << "Evaluator needs a reward";
  scorer_ = std::make_unique<reward::BatchScorer>(reward_, reward::batch_options_for(config_.reward));
}

Evaluator::~Evaluator() = default;

std::vector<rollout::Request> Evaluator::make_requests(
    const tokenizer::Tokenizer& tok, const std::vector<data::PromptExample>& problems) const {
  rollout::SamplingParams params = config_.sampling;
  params.n = config_.n;
  if (config_.stop_at_end_of_turn) {
    std::optional<int32_t> eot;
    try {
      eot = data::end_of_turn_id(tok);
    } catch (const Error&) {
      // A tokenizer without any end token: the model's own eos ids still apply.
    }
    if (eot && std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(), *eot) ==
                   params.stop_token_ids.end())
      params.stop_token_ids.push_back(*eot);
  }
  std::vector<rollout::Request> out;
  out.reserve(problems.size());
  for (size_t i = 0; i < problems.size(); ++i) {
    rollout::Request r;
    r.prompt_ids = problems[i].prompt_ids;
    r.params = params;
    // Non-negative: a negative seed means "let the engine choose" (sampler.h).
    r.params.seed = static_cast<int64_t>(mix_seed(config_.seed, i) >> 1);
    out.push_back(std::move(r));
  }
  return out;
}

EvalSummary Evaluator::run(rollout::Engine& engine, const tokenizer::Tokenizer& tok,
                           const std::vector<data::PromptExample>& problems,
                           std::vector<EvalProblemResult>* per_problem) {
  return run([&](std::vector<rollout::Request> rs) { return engine.generate(std::move(rs)); }, tok, problems,
             per_problem);
}

EvalSummary Evaluator::run(const GenerateFn& generate, const tokenizer::Tokenizer& tok,
                           const std::vector<data::PromptExample>& problems,
                           std::vector<EvalProblemResult>* per_problem) {
  if (problems.empty()) LS_THROW << "eval '" << config_.name << "': no problems";
  Timer timer;
  auto results = generate(make_requests(tok, problems));
  return score(tok, problems, results, timer.seconds(), per_problem);
}

EvalProblemResult problem_result(const data::PromptExample& ex, int64_t index, int64_t n) {
  EvalProblemResult pr;
  pr.index = index;
  pr.line = ex.line;
  pr.prompt = ex.prompt_text;
  pr.label = ex.label;
  pr.metadata = ex.metadata;
  pr.n = n;
  return pr;
}

EvalSummary aggregate(const EvalConfig& config, std::vector<EvalProblemResult>& probs,
                      const std::vector<reward::RewardResult>& verdicts) {
  size_t samples = 0;
  for (const auto& pr : probs) samples += pr.samples.size();
  LS_CHECK(verdicts.size() == samples) << verdicts.size() << " verdicts for " << samples << " samples";
  reward::BatchStats stats;
  for (const auto& r : verdicts) stats.add(r);
  const auto ks = pass_at_k_ks(config.n);
  EvalSummary sum;
  sum.name = config.name;
  sum.n = config.n;
  sum.num_problems = int64_t(probs.size());
  for (int64_t k : ks) sum.pass_at_k[k] = 0.0;
  double len_sum = 0.0;
  size_t v = 0;
  for (auto& pr : probs) {
    for (auto& es : pr.samples) {
      const reward::RewardResult& r = verdicts[v++];
      es.reward = r.failed() ? std::nan("") : r.reward;
      es.correct = !r.failed() && r.correct;  // a failure is reported, never scored
      es.extracted = r.extracted;
      es.failure = r.failure;
      pr.correct += es.correct ? 1 : 0;
      pr.failures += r.failed() ? 1 : 0;
      pr.truncated += es.finish_reason == "length" || es.finish_reason == "budget" ? 1 : 0;
      sum.aborted += es.finish_reason == "abort" ? 1 : 0;
      sum.generated_tokens += es.length;
      len_sum += double(es.length);
    }
    for (int64_t k : ks) {
      pr.pass_at_k[k] = pass_at_k(pr.n, pr.correct, k);
      sum.pass_at_k[k] += pr.pass_at_k[k];
    }
    sum.truncated += pr.truncated;
    sum.num_samples += pr.n;
  }
  for (auto& [k, value] : sum.pass_at_k) value /= double(sum.num_problems);
  sum.pass_at_1 = sum.pass_at_k[1];
  sum.truncated_ratio = double(sum.truncated) / double(sum.num_samples);
  sum.response_len_mean = len_sum / double(sum.num_samples);
  sum.reward_mean = stats.reward_mean();
  sum.reward_failures = stats.failures;
  sum.failure_reasons = stats.failure_reasons;
  return sum;
}

EvalSummary Evaluator::score(const tokenizer::Tokenizer& tok,
                             const std::vector<data::PromptExample>& problems,
                             const std::vector<rollout::RequestResult>& results, double generate_s,
                             std::vector<EvalProblemResult>* per_problem) {
  LS_CHECK(results.size() == problems.size())
      << results.size() << " results for " << problems.size() << " problems";
  Timer timer;
  const auto ks = pass_at_k_ks(config_.n);

  // Decode every sample; rewards are scored as one batch (index p * n + s).
  std::vector<EvalProblemResult> probs(problems.size());
  std::vector<reward::RewardRequest> requests;
  requests.reserve(problems.size() * size_t(config_.n));
  for (size_t p = 0; p < problems.size(); ++p) {
    const auto& ex = problems[p];
    const auto& samples = results[p].samples;
    LS_CHECK(int64_t(samples.size()) == config_.n)
        << "problem " << p << ": " << samples.size() << " samples, expected " << config_.n;
    EvalProblemResult& pr = probs[p];
    pr = problem_result(ex, int64_t(p), config_.n);
    for (const auto& s : samples) {
      EvalSample es;
      es.response = tok.decode(s.output_ids, /*skip_special_tokens=*/true);
      es.length = int64_t(s.output_ids.size());
      es.finish_reason = s.finish_reason;
      requests.push_back({ex.prompt_text, es.response, ex.label, ex.metadata});
      pr.samples.push_back(std::move(es));
    }
  }
  auto verdicts = score_batch_ ? score_batch_(requests) : scorer_->score(requests);
  EvalSummary sum = aggregate(config_, probs, verdicts);
  sum.generate_s = generate_s;
  sum.score_s = timer.seconds();
  sum.elapsed_s = generate_s + sum.score_s;
  sum.tokens_per_s = generate_s > 0 ? double(sum.generated_tokens) / generate_s : 0.0;
  if (per_problem) *per_problem = std::move(probs);
  return sum;
}

EvalSummary evaluate(rollout::Engine& engine, const tokenizer::Tokenizer& tok,
                     const std::vector<data::PromptExample>& problems, const EvalConfig& config,
                     std::vector<EvalProblemResult>* per_problem) {
  Evaluator ev(config);
  return ev.run(engine, tok, problems, per_problem);
}

}  // namespace lockstep::eval
