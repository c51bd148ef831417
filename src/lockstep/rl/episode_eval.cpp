#include "lockstep/rl/episode_eval.h"

#include "lockstep/base/error.h"
#include "lockstep/base/rng.h"
#include "lockstep/base/timer.h"

namespace lockstep::rl {

rollout::SamplingParams eval_sampling(const eval::EvalConfig& config) {
  rollout::SamplingParams p = config.sampling;
  p.n = config.n;
  return p;
}

namespace {

// Problem i is seeded as the single-turn eval seeds its request i.
std::vector<EpisodePrompt> episode_prompts(const eval::EvalConfig& config,
                                           const std::vector<data::PromptExample>& problems) {
  std::vector<EpisodePrompt> out;
  out.reserve(problems.size());
  for (size_t i = 0; i < problems.size(); ++i) {
    const data::PromptExample& ex = problems[i];
    EpisodePrompt p;
    p.prompt_ids = ex.prompt_ids;
    p.prompt_text = ex.prompt_text;
    p.sample = {{"prompt", ex.prompt_text}, {"label", ex.label}, {"metadata", ex.metadata}};
    p.seed = static_cast<int64_t>(mix_seed(config.seed, i) >> 1);
    out.push_back(std::move(p));
  }
  return out;
}

// The verdict of an episode the environment rewarded or failed.
reward::RewardResult environment_verdict(const Episode& e) {
  if (e.env_failed) return reward::RewardResult::failure_result("environment: " + e.env_error);
  reward::RewardResult r;
  r.reward = *e.env_reward;
  r.correct = r.reward > 0;
  return r;
}

}  // namespace

eval::EvalSummary evaluate_episodes(MultiTurnRollout& episodes, const eval::EvalConfig& config,
                                    const eval::Evaluator::ScoreBatchFn& score, const tokenizer::Tokenizer& tok,
                                    const std::vector<data::PromptExample>& problems,
                                    std::vector<eval::EvalProblemResult>* per_problem, MultiTurnStats* stats) {
  if (problems.empty()) LS_THROW << "eval '" << config.name << "': no problems";
  Timer timer;
  MultiTurnStats st;
  std::vector<Episode> eps = episodes.run(episode_prompts(config, problems), &st);
  const size_t n = size_t(config.n);
  LS_CHECK(eps.size() == problems.size() * n) << eps.size() << " episodes for " << problems.size() << " problems";
  const double generate_s = timer.seconds();
  Timer score_timer;

  // The transcript of each episode; the verifier's requests for the others.
  std::vector<eval::EvalProblemResult> probs(problems.size());
  std::vector<reward::RewardRequest> requests;
  double turns = 0;
  for (size_t p = 0; p < problems.size(); ++p) {
    const data::PromptExample& ex = problems[p];
    eval::EvalProblemResult& pr = probs[p];
    pr = eval::problem_result(ex, int64_t(p), config.n);
    for (size_t s = 0; s < n; ++s) {
      const Episode& e = eps[p * n + s];
      eval::EvalSample es;
      es.response = tok.decode(e.output_ids, /*skip_special_tokens=*/false);
      es.length = int64_t(e.output_ids.size());
      es.finish_reason = e.finish_reason;
      es.turns = e.turns;
      turns += double(e.turns);
      if (!e.env_reward && !e.env_failed) requests.push_back({ex.prompt_text, e.last_completion, ex.label, ex.metadata});
      pr.samples.push_back(std::move(es));
    }
  }
  const std::vector<reward::RewardResult> scored = requests.empty() ? std::vector<reward::RewardResult>{} : score(requests);
  LS_CHECK(scored.size() == requests.size()) << "scorer returned " << scored.size() << " results";
  std::vector<reward::RewardResult> verdicts;
  verdicts.reserve(eps.size());
  size_t k = 0;
  for (const Episode& e : eps) verdicts.push_back(e.env_reward || e.env_failed ? environment_verdict(e) : scored[k++]);

  eval::EvalSummary sum = eval::aggregate(config, probs, verdicts);
  sum.turns_mean = turns / double(std::max<size_t>(eps.size(), 1));
  sum.generate_s = generate_s;
  sum.score_s = score_timer.seconds();
  sum.elapsed_s = generate_s + sum.score_s;
  sum.generated_tokens = st.generated_tokens;  // the model's tokens (observations excluded)
  const double model_s = generate_s - st.env_seconds;
  sum.tokens_per_s = model_s > 0 ? double(st.generated_tokens) / model_s : 0.0;
  if (stats) *stats = st;
  if (per_problem) *per_problem = std::move(probs);
  return sum;
}

}  // namespace lockstep::rl
