// The RL loop: one step is rollout -> rewards -> filters -> advantages ->
// update(s) -> weight sync -> metrics / samples / eval / checkpoint.
// With overlap ([dist] max_weight_staleness > 0) a step instead runs:
// collect this step's first round (generated ahead) -> sync the weights of
// the last update -> extra rounds (dynamic sampling) -> submit the next
// step's first round -> rewards ... update(s) -> metrics / eval / checkpoint,
// so the rollout generates step k+1 with the weights of step k-1 while the
// trainer trains step k.
#include "lockstep/rl/loop.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <numeric>

#include "lockstep/base/error.h"
#include "lockstep/base/log.h"
#include "lockstep/base/progress.h"
#include "lockstep/base/rng.h"
#include "lockstep/base/step_clock.h"
#include "lockstep/base/timer.h"
#include "lockstep/data/jsonl.h"
#include "lockstep/eval/eval_output.h"
#include "lockstep/metrics/metrics_logger.h"
#include "lockstep/model/weights.h"
#include "lockstep/reward/batch.h"
#include "lockstep/rl/episode_eval.h"
#include "lockstep/rl/gap_check.h"
#include "lockstep/rl/group_scoring.h"
#include "lockstep/rl/invariant_update.h"
#include "lockstep/rl/multi_turn.h"
#include "lockstep/rl/overlap_rollout.h"
#include "lockstep/rl/partial_gap.h"
#include "lockstep/rl/partial_rollout.h"
#include "lockstep/rl/ppo_critic.h"
#include "lockstep/rl/reward_watch.h"
#include "lockstep/rl/step_line.h"
#include "lockstep/rollout/engine.h"
#include "lockstep/train/checkpoint.h"
#include "lockstep/train/checkpoint_integrity.h"
#include "lockstep/train/data_order.h"
#include "lockstep/train/mismatch.h"

namespace lockstep::rl {

// ---------------------------------------------------------------- prompts

PromptStream::PromptStream(size_t n, uint64_t seed, bool shuffle) : n_(n), seed_(seed), shuffle_(shuffle) {
  LS_CHECK(n > 0) << "no training prompts";
}

size_t PromptStream::at(uint64_t position) {
  const int64_t epoch = int64_t(position / n_);
  if (epoch != epoch_) {
    perm_ = train::epoch_permutation(n_, seed_, epoch, shuffle_);
    epoch_ = epoch;
  }
  return perm_[position % n_];
}

// ---------------------------------------------------------------- the loop

namespace {

// One sampled response with everything the update needs.
struct Sample {
  std::vector<int32_t> output_ids;
  std::vector<float> rollout_logp;
  std::vector<int32_t> routed_experts;
  std::vector<int32_t> indexer_topk;  // DeepSeek-V4
  std::string finish_reason, response;
  std::string reward_failure;  // why scoring failed ("" when it did not)
  double reward = 0, score = 0, advantage = 0;
  bool correct = false, failed = false;
  uint64_t version = 0, version_end = 0;
  std::vector<uint64_t> versions;  // partial rollouts: per output token, the weights that sampled it
  std::map<std::string, double> reward_extra;  // the reward's further numbers (reward/extra/<key>)
  // Multi-turn ([rollout] env): the episode's own prompt (empty: the
  // group's), the loss mask of output_ids (1: model token), its turns, the
  // environment's reward (the sum of its steps'), the last turn's text.
  std::vector<int32_t> prompt_ids;
  std::vector<uint8_t> loss_mask;
  int64_t turns = 1;
  std::optional<double> env_reward;
  bool env_failed = false;
  std::string env_error, last_completion;
};

struct Group {
  size_t prompt = 0;  // index into the training prompts
  std::vector<int32_t> prompt_ids;
  std::vector<Sample> samples;
};

// The next step's first rollout round, generated while this step trains.
struct Ahead {
  std::vector<Group> groups;  // prompts; samples once collected
  uint64_t cursor = 0;        // stream position of its first prompt
  bool in_flight = true;      // submitted, results not received yet
  Timer submitted;            // when it was submitted
  double seconds = 0;         // submit to results: the generation span
  int64_t tokens = 0;         // generated
};

double mean_of(const std::vector<double>& v) {
  return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
}

double std_of(const std::vector<double>& v) {
  if (v.size() < 2) return 0.0;
  const double m = mean_of(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / double(v.size()));
}

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%06lld", static_cast<long long>(step));
  return buf;
}

// Per-step phase times and counts. rollout: the trainer's time in rollout
// calls (generate, submit, waiting in collect); generate: the time the step's
// samples took to generate (for a batch generated ahead: submit to results).
struct StepPerf {
  double rollout = 0, generate = 0, wait = 0, reward = 0, old_logprob = 0, ref_logprob = 0, train = 0, sync = 0;
  double env = 0;  // multi-turn: time in environment calls (part of rollout)
  size_t sync_bytes = 0;
  int64_t rollout_tokens = 0, train_tokens = 0;
};

// One step's samples: the groups that train (after the dynamic-sampling
// filter, at most batch_size) and every group drawn.
struct StepSamples {
  std::vector<Group> groups, all;
  int64_t tries = 0, filtered = 0;
};

// A sample that trains: its group and its index in the group.
struct Item {
  size_t g, s;
};

// The sequences of one update and what the update computes about them.
struct UpdateBatch {
  std::vector<Item> items;
  std::vector<train::TrainSequence> seqs;
  // Per sequence, per response token: the rollout's, the trainer's before
  // the update (old) and the reference's logprobs (ref: empty without KL).
  std::vector<std::vector<float>> rollout_lp, old_lp, ref_lp;
  std::vector<std::vector<double>> isw;        // importance weights (empty: none)
  std::vector<std::vector<double>> token_adv;  // GAE: per response token (empty: the samples' scalar)
  // Partial rollouts: per sequence, per response token, the weight version
  // that sampled it (else empty), and what the gap covered of them.
  std::vector<std::vector<uint64_t>> versions;
  PartialGapStats gap;
  bool shortcut = false;      // old_lp are the rollout's (on-policy shortcut)
  bool same_version = false;  // every sample came from the trainer's current weights
  int64_t tokens = 0;         // response tokens
  int64_t is_corrected = 0;   // tokens whose importance weight was clipped or masked
  double is_sum = 0;          // sum of the importance weights
  std::optional<train::MismatchStats> mismatch;
};

// Per sequence, the entries of the model's own tokens (loss_mask's ones):
// sequence first_sample + i of the batch for lp[i]. The gap check and the
// mismatch metrics compare only what the model generated.
std::vector<std::vector<float>> model_tokens(const std::vector<std::vector<float>>& lp, const UpdateBatch& b,
                                             size_t first_sample) {
  std::vector<std::vector<float>> out;
  for (size_t i = 0; i < lp.size(); ++i) {
    const std::vector<uint8_t>& mask = b.seqs[first_sample + i].loss_mask;
    if (mask.empty()) {
      out.push_back(lp[i]);
      continue;
    }
    LS_CHECK(mask.size() == lp[i].size()) << "rl: sample " << first_sample + i << " has " << lp[i].size()
                                          << " logprobs for a loss mask of " << mask.size();
    std::vector<float> kept;
    for (size_t t = 0; t < mask.size(); ++t)
      if (mask[t]) kept.push_back(lp[i][t]);
    out.push_back(std::move(kept));
  }
  return out;
}

// What the mini-batches of one update add up to.
struct UpdateTotals {
  StepSums sums;  // reduced over the trainer ranks after the last mini-batch
  int64_t n_mb = 0, skipped = 0, tokens = 0;
  double grad_norm_sum = 0, lr = 0;
};

// A single process's rollout: the engine beside the trainer, or with
// max_weight_staleness > 0 (single-turn) one on its own thread that
// generates ahead of training.
std::shared_ptr<RolloutBackend> default_rollout(train::Trainer& trainer, const RlConfig& cfg) {
  if (cfg.max_weight_staleness > 0 && !cfg.env.enabled())
    return std::make_shared<OverlapRollout>(trainer, cfg.rollout, cfg.seed, cfg.rollout_threads);
  return std::make_shared<LocalRollout>(trainer, cfg.rollout, cfg.seed);
}

class Runner {
 public:
  Runner(train::Trainer& trainer, const RlInputs& in, const RlConfig& cfg)
      : trainer_(trainer),
        in_(in),
        cfg_(cfg),
        group_(*in.group),
        stream_(in.train.size(), cfg.seed, cfg.shuffle),
        watch_(cfg.reward.max_failure_rate) {
    LS_CHECK(in.tok) << "rl: no tokenizer";
    LS_CHECK(!in.train.empty()) << "rl: no training prompts";
    rollout_ = in.rollout ? in.rollout : default_rollout(trainer, cfg);
    writer_ = group_.writer();
    reward_ = in.reward ? in.reward : std::shared_ptr<const reward::Reward>(reward::make_reward(cfg.reward));
    scorer_ = std::make_unique<reward::BatchScorer>(reward_, reward::batch_options_for(cfg.reward));
    if (!in.eval.empty()) {
      evaluator_ = std::make_unique<eval::Evaluator>(cfg.eval.config, reward_);
      evaluator_->set_score_batch([this](const std::vector<reward::RewardRequest>& reqs) {
        return score_across_ranks(evaluator_->scorer(), group_, reqs);
      });
    }
    if (cfg.algo.kl_coef > 0) {
      LS_CHECK(in.reference) << "rl: [algo] kl_coef > 0 needs the reference model (RlInputs::reference)";
      LS_CHECK(in.reference->weights().layout().numel() == trainer.model_layout().numel())
          << "rl: the reference model has " << in.reference->weights().layout().numel() << " parameters, the "
          << "trainer's " << trainer.model_layout().numel();
      ref_ = in.reference.get();
    }
    if (cfg.algo.advantage == Advantage::Gae) {
      if (group_.ranks() > 1)
        LS_THROW << "rl: [algo] advantage = \"gae\" (PPO with a critic) trains the critic on one trainer "
                    "rank; this "
                 << "run has " << group_.ranks()
                 << " (data or expert parallelism is not supported for the critic)";
      critic_ = std::make_unique<PpoCritic>(trainer.context(), trainer.config(), trainer.params(), cfg.critic,
                                            cfg.algo);
    }
    end_of_turn_ = data::end_of_turn_id(*in.tok);
    overlap_ = cfg.max_weight_staleness > 0;
    if (overlap_ && !rollout_->can_overlap())
      LS_THROW << "[dist] max_weight_staleness = " << cfg.max_weight_staleness << ": each colocated trainer "
               << "rank generates a share of the batch itself, so it cannot generate while it trains; rollout "
               << "ahead of training needs rollout ranks ([dist] rollout_ranks > 0) or a single process";
    synced_version_ = trainer.version();  // every backend starts on the trainer's weights
    if (cfg.partial.enabled) {
      if (overlap_) LS_THROW << partial_overlap_error();
      partial_ = std::make_unique<PartialRollout>(cfg.partial, cfg.rollout.sampling.max_new_tokens,
                                                  trainer.config().max_position_embeddings);
      if (cfg.partial.gap_all) version_scorers_ = std::make_unique<VersionScorers>(trainer);
    }
    if (cfg.env.enabled()) {
      if (overlap_)
        LS_THROW << "[rollout] env (multi-turn) cannot generate ahead of training ([dist] max_weight_staleness > 0)";
      env_ = make_environment(cfg.env);
      multi_ = std::make_unique<MultiTurnRollout>(*rollout_, *env_, *in.tok, cfg.env, cfg.rollout.sampling,
                                                  trainer.config().max_position_embeddings);
      multi_->share_across(&group_);  // each episode's environment runs on one trainer rank
      if (evaluator_) {  // held-out episodes, with the eval's sampling
        multi_eval_ = std::make_unique<MultiTurnRollout>(*rollout_, *env_, *in.tok, cfg.env,
                                                         eval_sampling(cfg.eval.config),
                                                         trainer.config().max_position_embeddings);
        multi_eval_->share_across(&group_);
      }
    }
  }

  RlResult run(bool resume);

 private:
  // The samples the reward scored this step and its failures.
  static RewardTally tally_rewards(const StepSamples& ss);
  [[noreturn]] void stop_run(int64_t step, const StepSamples& ss, nlohmann::json& m,
                             metrics::MetricsLogger* log, const RewardTally& tally, const std::string& why);
  // Rollout.
  std::vector<Group> draw(int64_t count, std::vector<rollout::Request>& reqs);
  void fill(std::vector<Group>& groups, std::vector<rollout::RequestResult> results);
  std::vector<Group> rollout_round(int64_t count);
  std::vector<Group> episode_round(int64_t count);
  std::vector<Group> partial_round();
  void submit_ahead();
  void collect_ahead();
  std::vector<Group> take_ahead();
  void score_groups(std::vector<Group>& groups);
  double staleness(const std::vector<Group>& groups, int64_t step) const;
  // The phases of one step (run_step).
  int64_t begin_run(bool resume);
  void run_step(int64_t step, metrics::MetricsLogger* log, RlResult& result);
  StepSamples collect_samples(int64_t step);
  void filter_round(std::vector<Group>& round, StepSamples& ss) const;
  void rollout_metrics(const StepSamples& ss, nlohmann::json& m) const;
  void train_step(int64_t step, StepSamples& ss, nlohmann::json& m);
  void sync_step(bool eval_now);
  void perf_metrics(nlohmann::json& m) const;
  void record_step(const nlohmann::json& m, double step_core, RlResult& result);
  void log_console(int64_t step, const nlohmann::json& m, const RewardTally& tally, bool last) const;
  void save_step(int64_t step, bool last);
  // The phases of one update (update).
  nlohmann::json update(std::vector<Group>& groups);
  std::vector<Item> assign_advantages(std::vector<Group>& groups) const;
  bool make_sequences(const std::vector<Group>& groups, UpdateBatch& b);
  train::ScoreOptions score_options() const;
  void old_logprobs(UpdateBatch& b, bool same_version);
  void ref_logprobs(UpdateBatch& b);
  void weigh_samples(UpdateBatch& b);
  void partial_gap(UpdateBatch& b);
  void own_version_gap(UpdateBatch& b);
  std::string localise_gap(const train::TrainSequence* seq);
  void check_gap(const std::vector<std::vector<float>>& rollout, const std::vector<std::vector<float>>& trainer,
                 const UpdateBatch& b, size_t first_sample);
  UpdateTotals train_minibatches(const std::vector<Group>& groups, UpdateBatch& b);
  double accumulate_minibatch(const std::vector<Group>& groups, const UpdateBatch& b, int64_t mb, ProgressBar& bar,
                              UpdateTotals& tot);
  double train_part(const std::vector<train::TrainSequence>& part, const train::LossFn& loss, bool keep_scores,
                    ProgressBar& bar, std::vector<train::TokenScores>& scores);
  void first_minibatch_mismatch(const UpdateBatch& b, size_t sb, size_t se, std::vector<train::TokenScores>& scores,
                                UpdateTotals& tot);
  void optimizer_step(double loss, UpdateTotals& tot);
  nlohmann::json update_metrics(const std::vector<Group>& groups, const UpdateBatch& b,
                                const UpdateTotals& tot) const;
  // Weight sync, eval, files.
  double sync_weights();
  double sync_if_stale();
  void run_eval(int64_t step, nlohmann::json& m, RlResult& result);
  void write_samples(int64_t step, const std::vector<Group>& groups);
  void critic_advantages(std::vector<Group>& groups, UpdateBatch& b);

  train::Trainer& trainer_;
  const RlInputs& in_;
  const RlConfig& cfg_;
  TrainerGroup& group_;
  PromptStream stream_;
  uint64_t cursor_ = 0;  // prompts drawn so far
  std::shared_ptr<RolloutBackend> rollout_;
  bool writer_ = true;
  std::shared_ptr<const reward::Reward> reward_;
  std::unique_ptr<reward::BatchScorer> scorer_;
  std::unique_ptr<eval::Evaluator> evaluator_;
  train::Scorer* ref_ = nullptr;  // the KL reference (in_.reference) when kl_coef > 0
  std::unique_ptr<PpoCritic> critic_;  // [algo] advantage = "gae": PPO's value model
  int32_t end_of_turn_ = -1;
  // Multi-turn rollouts ([rollout] env): the environment and the driver.
  std::unique_ptr<Environment> env_;
  std::unique_ptr<MultiTurnRollout> multi_, multi_eval_;
  std::map<std::string, double> phase_total_;
  // Overlap ([dist] max_weight_staleness > 0): the batch generated ahead.
  bool overlap_ = false;
  std::optional<Ahead> ahead_;
  uint64_t synced_version_ = 0;  // the weights the rollout holds
  std::unique_ptr<PartialRollout> partial_;  // [rollout] partial: the groups in flight across steps
  // partial_gap = "all": the trainer's parameters at the versions older tokens in flight hold.
  std::unique_ptr<VersionScorers> version_scorers_;
  // Weight version -> the last step at whose end the trainer held it (the
  // start step for the weights a run starts or resumes from): staleness is
  // counted in steps, whatever the optimizer steps per batch.
  std::map<uint64_t, int64_t> version_step_;
  StepPerf perf_;  // of the current step
  RewardWatch watch_;               // reward failures: the warning and the stop rule
  std::optional<StepClock> clock_;  // the console line's step N/TOTAL and time left
  std::string skipped_;             // why the current step made no update ("": it did)
  // train_minibatches' progress over the update's sequences.
  int64_t trained_seqs_ = 0, trained_tokens_ = 0;
};

// `count` prompts from the stream: their groups (no samples yet) and requests.
std::vector<Group> Runner::draw(int64_t count, std::vector<rollout::Request>& reqs) {
  std::vector<Group> groups;
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t pos = cursor_++;
    const size_t idx = stream_.at(pos);
    rollout::Request r;
    r.prompt_ids = in_.train[idx].prompt_ids;
    r.params = cfg_.rollout.sampling;
    r.params.seed = int64_t(mix_seed(cfg_.seed, pos) >> 1);
    if (end_of_turn_ >= 0) r.params.stop_token_ids.push_back(end_of_turn_);
    r.params.return_logprobs = true;
    r.return_experts = cfg_.algo.routing_replay;
    reqs.push_back(std::move(r));
    Group g;
    g.prompt = idx;
    g.prompt_ids = in_.train[idx].prompt_ids;
    groups.push_back(std::move(g));
  }
  return groups;
}

void Runner::fill(std::vector<Group>& groups, std::vector<rollout::RequestResult> results) {
  LS_CHECK(results.size() == groups.size()) << "rollout: " << results.size() << " results for " << groups.size()
                                            << " requests";
  for (size_t i = 0; i < groups.size(); ++i)
    for (auto& s : results[i].samples) {
      Sample x;
      x.output_ids = std::move(s.output_ids);
      x.rollout_logp = std::move(s.logprobs);
      x.routed_experts = std::move(s.routed_experts);
      x.indexer_topk = std::move(s.indexer_topk);
      x.finish_reason = s.finish_reason;
      x.version = s.weight_version;  // the weights the engine actually used
      x.version_end = s.weight_version_end;
      groups[i].samples.push_back(std::move(x));
    }
}

// One synchronous round: `count` prompts, generated now.
std::vector<Group> Runner::rollout_round(int64_t count) {
  if (multi_) return episode_round(count);
  std::vector<rollout::Request> reqs;
  std::vector<Group> groups = draw(count, reqs);
  Timer t;
  std::vector<rollout::RequestResult> results;
  {
    ProgressBar bar("rollout", count * cfg_.rollout.sampling.n, false);
    if (!cfg_.log.progress) bar.finish();
    int64_t tokens = 0;
    results = rollout_->generate(
        std::move(reqs), [&](int64_t done, int64_t toks) { bar.update(done, toks); }, &tokens);
    perf_.rollout_tokens += tokens;
  }
  const double secs = t.seconds();
  perf_.rollout += secs;
  perf_.generate += secs;
  fill(groups, std::move(results));
  return groups;
}

// Multi-turn: `count` prompts, n episodes each, run to their ends now.
std::vector<Group> Runner::episode_round(int64_t count) {
  std::vector<rollout::Request> reqs;
  std::vector<Group> groups = draw(count, reqs);
  std::vector<EpisodePrompt> prompts;
  for (size_t i = 0; i < groups.size(); ++i) {
    const data::PromptExample& ex = in_.train[groups[i].prompt];
    EpisodePrompt p;
    p.prompt_ids = ex.prompt_ids;
    p.prompt_text = ex.prompt_text;
    p.sample = {{"prompt", ex.prompt_text}, {"label", ex.label}, {"metadata", ex.metadata}};
    p.seed = reqs[i].params.seed;
    prompts.push_back(std::move(p));
  }
  Timer t;
  MultiTurnStats st;
  std::vector<Episode> eps = multi_->run(prompts, &st);
  const double secs = t.seconds();
  perf_.rollout += secs;
  perf_.generate += secs - st.env_seconds;
  perf_.env += st.env_seconds;
  perf_.rollout_tokens += st.generated_tokens;
  const size_t n = size_t(cfg_.rollout.sampling.n);
  for (size_t i = 0; i < eps.size(); ++i) {
    Episode& e = eps[i];
    Sample x;
    x.prompt_ids = std::move(e.prompt_ids);
    x.output_ids = std::move(e.output_ids);
    x.rollout_logp = std::move(e.logprobs);
    x.loss_mask = std::move(e.loss_mask);
    x.finish_reason = e.finish_reason;
    x.version = e.version;
    x.version_end = e.version_end;
    x.turns = e.turns;
    x.env_reward = e.env_reward;
    x.env_failed = e.env_failed;
    x.env_error = std::move(e.env_error);
    x.last_completion = std::move(e.last_completion);
    groups[i / n].samples.push_back(std::move(x));
  }
  return groups;
}

// Partial rollouts: new prompts keep batch_size groups in flight; one
// budgeted round on the current weights; the groups that finished in it.
std::vector<Group> Runner::partial_round() {
  std::vector<rollout::Request> reqs;
  std::vector<Group> drawn = draw(cfg_.batch_size - partial_->in_flight(), reqs);
  for (size_t i = 0; i < drawn.size(); ++i) partial_->add(drawn[i].prompt, std::move(reqs[i]));
  Timer t;
  std::vector<PartialGroup> done;
  {
    ProgressBar bar("rollout tokens", cfg_.partial.token_budget, false);
    if (!cfg_.log.progress) bar.finish();
    done = partial_->round(*rollout_, synced_version_, [&](int64_t d, int64_t toks) { bar.update(d, toks); });
  }
  const double secs = t.seconds();
  perf_.rollout += secs;
  perf_.generate += secs;
  perf_.rollout_tokens += partial_->stats().generated_tokens;
  if (version_scorers_) {  // discarded groups' versions go; this update still needs done's
    std::set<uint64_t> held = partial_->held_versions(), done_versions = PartialRollout::versions_of(done);
    held.insert(done_versions.begin(), done_versions.end());
    version_scorers_->release_unheld(held);
  }
  std::vector<Group> groups;
  for (PartialGroup& pg : done) {
    Group g;
    g.prompt = pg.prompt;
    g.prompt_ids = std::move(pg.request.prompt_ids);
    for (PartialSample& ps : pg.samples) {
      Sample x;
      x.output_ids = std::move(ps.output_ids);
      x.rollout_logp = std::move(ps.logprobs);
      x.finish_reason = ps.finish_reason;
      x.versions = std::move(ps.versions);
      x.version =
          x.versions.empty() ? synced_version_ : *std::min_element(x.versions.begin(), x.versions.end());
      x.version_end =
          x.versions.empty() ? synced_version_ : *std::max_element(x.versions.begin(), x.versions.end());
      g.samples.push_back(std::move(x));
    }
    groups.push_back(std::move(g));
  }
  return groups;
}

// Overlap: the next step's first round goes to the rollout now, on the
// weights it holds, and is collected when that step starts (or when an eval
// needs the rollout).
void Runner::submit_ahead() {
  LS_CHECK(!ahead_) << "rl: a second batch submitted ahead";
  Ahead a;
  a.cursor = cursor_;
  std::vector<rollout::Request> reqs;
  a.groups = draw(cfg_.batch_size, reqs);
  Timer t;
  rollout_->submit(std::move(reqs));
  perf_.rollout += t.seconds();
  a.submitted.reset();
  ahead_ = std::move(a);
}

// Waits for the batch generated ahead, if it is still in flight; its samples
// stay in ahead_ for the step that trains on them.
void Runner::collect_ahead() {
  if (!ahead_ || !ahead_->in_flight) return;
  Timer t;
  std::vector<rollout::RequestResult> results;
  {
    ProgressBar bar("rollout", int64_t(ahead_->groups.size()) * cfg_.rollout.sampling.n, false);
    if (!cfg_.log.progress) bar.finish();
    results = rollout_->collect([&](int64_t done, int64_t toks) { bar.update(done, toks); }, &ahead_->tokens);
  }
  const double waited = t.seconds();
  perf_.rollout += waited;
  perf_.wait += waited;
  ahead_->seconds = ahead_->submitted.seconds();
  ahead_->in_flight = false;
  fill(ahead_->groups, std::move(results));
}

std::vector<Group> Runner::take_ahead() {
  collect_ahead();
  std::vector<Group> groups = std::move(ahead_->groups);
  perf_.rollout_tokens += ahead_->tokens;
  perf_.generate += ahead_->seconds;
  ahead_.reset();
  return groups;
}

void Runner::score_groups(std::vector<Group>& groups) {
  Timer t;
  std::vector<reward::RewardRequest> reqs;
  for (auto& g : groups)
    for (auto& s : g.samples) {
      // Multi-turn: the transcript keeps the template tokens between turns.
      s.response = in_.tok->decode(s.output_ids, /*skip_special_tokens=*/s.loss_mask.empty());
      if (s.env_reward || s.env_failed) continue;  // the environment's verdict stands
      reward::RewardRequest r;
      r.prompt = in_.train[g.prompt].prompt_text;
      r.response = multi_ ? s.last_completion : s.response;
      r.label = in_.train[g.prompt].label;
      r.metadata = in_.train[g.prompt].metadata;
      reqs.push_back(std::move(r));
    }
  // Each trainer rank scores its share; all ranks get every verdict.
  auto results = score_across_ranks(*scorer_, group_, reqs);
  size_t k = 0;
  for (auto& g : groups)
    for (auto& s : g.samples) {
      if (s.env_reward || s.env_failed) {
        s.failed = s.env_failed || s.finish_reason == "abort";
        s.score = s.env_failed ? 0.0 : *s.env_reward;
        s.correct = !s.env_failed && s.score > 0;
        s.reward = s.score;
        continue;
      }
      const auto& r = results[k++];
      s.failed = r.failed() || s.finish_reason == "abort";
      s.reward_failure = r.failed() ? r.failure
                         : s.failed ? std::string("the rollout aborted the sample (finish_reason abort)")
                                    : std::string();
      s.correct = r.correct;
      s.reward_extra = r.extra;
      s.score = r.failed() ? 0.0 : r.reward;
      s.reward = s.score + overlong_penalty(int64_t(s.output_ids.size()), cfg_.rollout.sampling.max_new_tokens,
                                            cfg_.algo.overlong_buffer_len, cfg_.algo.overlong_penalty_factor);
    }
  perf_.reward += t.seconds();
}

double Runner::sync_weights() {
  Timer t;
  rollout_->sync(trainer_);
  synced_version_ = trainer_.version();
  perf_.sync_bytes += rollout_->last_sync_bytes();
  const double secs = t.seconds();
  perf_.sync += secs;
  return secs;
}

// Overlap: publishes the trainer's weights unless the rollout holds them
// already (the first step; a step that made no update).
double Runner::sync_if_stale() { return trainer_.version() == synced_version_ ? 0.0 : sync_weights(); }

// Mean over the samples of the steps between the weights that generated them
// and the trainer's, which are those of the end of step - 1: 0 when
// synchronous, 1 for a batch generated one step ahead.
double Runner::staleness(const std::vector<Group>& groups, int64_t step) const {
  double sum = 0;
  int64_t n = 0;
  for (const auto& g : groups)
    for (const auto& s : g.samples) {
      const auto it = version_step_.find(s.version);
      LS_CHECK(it != version_step_.end()) << "rl: a sample of weight version " << s.version
                                          << ", which the trainer never held at the end of a step";
      sum += double(step - 1 - it->second);
      ++n;
    }
  return n ? sum / double(n) : 0.0;
}

// Advantages, old/ref logprobs, then num_steps_per_rollout optimizer steps.
nlohmann::json Runner::update(std::vector<Group>& groups) {
  UpdateBatch b;
  b.items = assign_advantages(groups);
  if (b.items.empty()) {
    nlohmann::json m = nlohmann::json::object();
    m["train/skipped"] = 1;
    return m;
  }
  b.same_version = make_sequences(groups, b);
  if (critic_) critic_advantages(groups, b);
  old_logprobs(b, b.same_version);
  ref_logprobs(b);
  weigh_samples(b);
  const UpdateTotals tot = train_minibatches(groups, b);
  nlohmann::json m = update_metrics(groups, b, tot);
  if (critic_)
    m.update(critic_->update(b.seqs, tot.n_mb));  // independent of the policy's: both use the old values
  return m;
}

// GAE from the critic's values before any update; each sample's scalar
// advantage becomes the mean of its tokens' (for its record and the
// advantage metrics).
void Runner::critic_advantages(std::vector<Group>& groups, UpdateBatch& b) {
  std::vector<double> rewards;
  for (const Item& it : b.items) rewards.push_back(groups[it.g].samples[it.s].reward);
  critic_->advantages(b.seqs, rewards, b.token_adv);
  for (size_t i = 0; i < b.items.size(); ++i) {
    const std::vector<double>& a = b.token_adv[i];
    groups[b.items[i].g].samples[b.items[i].s].advantage = a.empty() ? 0.0 : mean_of(a);
  }
}

// Samples that train: those scored successfully, in groups of >= 2 of them
// (one sample has no baseline) unless REINFORCE++ (batch baseline); each
// gets its advantage.
std::vector<Item> Runner::assign_advantages(std::vector<Group>& groups) const {
  const AlgoConfig& a = cfg_.algo;
  std::vector<Item> items;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    auto& g = groups[gi];
    std::vector<double> rewards;
    std::vector<size_t> idx;
    for (size_t si = 0; si < g.samples.size(); ++si)
      if (!g.samples[si].failed) {
        rewards.push_back(g.samples[si].reward);
        idx.push_back(si);
      }
    // REINFORCE++ and GAE have a batch baseline: a group of one still trains.
    if (rewards.size() < 2 && a.advantage != Advantage::ReinforcePP && a.advantage != Advantage::Gae)
      continue;
    const auto adv = group_advantages(rewards, a.advantage, a.adv_eps);
    for (size_t j = 0; j < idx.size(); ++j) {
      g.samples[idx[j]].advantage = adv[j];
      items.push_back({gi, idx[j]});
    }
  }
  if (a.advantage == Advantage::ReinforcePP && !items.empty()) {
    std::vector<double> adv;
    std::vector<int64_t> tok;
    for (auto& it : items) {
      adv.push_back(groups[it.g].samples[it.s].advantage);
      const Sample& x = groups[it.g].samples[it.s];  // weighed by the tokens that train
      tok.push_back(x.loss_mask.empty() ? int64_t(x.output_ids.size())
                                        : int64_t(std::count(x.loss_mask.begin(), x.loss_mask.end(), uint8_t(1))));
    }
    whiten_advantages(adv, tok, a.adv_eps);
    for (size_t i = 0; i < items.size(); ++i) groups[items[i].g].samples[items[i].s].advantage = adv[i];
  }
  return items;
}

// The items' prompt + response sequences and rollout logprobs; true when
// every sample was generated with the trainer's current weights.
bool Runner::make_sequences(const std::vector<Group>& groups, UpdateBatch& b) {
  bool same_version = true;
  for (auto& it : b.items) {
    const Group& g = groups[it.g];
    const Sample& s = g.samples[it.s];
    train::TrainSequence t;
    const std::vector<int32_t>& prompt = s.prompt_ids.empty() ? g.prompt_ids : s.prompt_ids;
    t.tokens = prompt;
    t.tokens.insert(t.tokens.end(), s.output_ids.begin(), s.output_ids.end());
    t.prompt_len = int32_t(prompt.size());
    t.loss_mask = s.loss_mask;
    if (cfg_.algo.routing_replay) {
      t.routed_experts = s.routed_experts;
      t.indexer_topk = s.indexer_topk;
    }
    b.seqs.push_back(std::move(t));
    b.rollout_lp.push_back(s.rollout_logp);
    b.versions.push_back(s.versions);
    same_version = same_version && s.version == trainer_.version() && s.version_end == trainer_.version();
    perf_.train_tokens += int64_t(b.seqs.back().tokens.size());
  }
  return same_version;
}

train::ScoreOptions Runner::score_options() const {
  train::ScoreOptions so;
  so.temperature = cfg_.rollout.sampling.logprob_temperature();
  so.replay = cfg_.algo.routing_replay;
  return so;
}

// Old-policy logprobs: the on-policy shortcut reuses the rollout's when they
// are the trainer's own bits (aligned mode, same weight version).
void Runner::old_logprobs(UpdateBatch& b, bool same_version) {
  b.shortcut = rollout_->aligned() && same_version && !cfg_.algo.recompute_logprobs;
  if (b.shortcut) {
    b.old_lp = b.rollout_lp;
    return;
  }
  Timer t;
  for (auto& sc : trainer_.score(b.seqs, score_options())) b.old_lp.push_back(std::move(sc.logp));
  perf_.old_logprob += t.seconds();
}

void Runner::ref_logprobs(UpdateBatch& b) {
  if (!ref_) return;
  Timer t;
  for (auto& sc : ref_->score(b.seqs, score_options())) b.ref_lp.push_back(std::move(sc.logp));
  perf_.ref_logprob += t.seconds();
}

// Importance weights between the trainer's old logprobs and the rollout's;
// the mismatch of recomputed old logprobs (the shortcut measures it on the
// first mini-batch's forward instead, which runs under the rollout's weights).
void Runner::weigh_samples(UpdateBatch& b) {
  const AlgoConfig& a = cfg_.algo;
  b.isw.resize(b.seqs.size());
  for (size_t i = 0; i < b.seqs.size(); ++i) {
    const int64_t n = b.seqs[i].num_targets();
    b.tokens += b.seqs[i].num_loss_targets();
    if (a.rollout_is != IsLevel::None) {
      const uint8_t* mask = b.seqs[i].loss_mask.empty() ? nullptr : b.seqs[i].loss_mask.data();
      b.isw[i] = importance_weights(b.old_lp[i].data(), b.rollout_lp[i].data(), n, a, &b.is_corrected, mask);
      for (double w : b.isw[i]) b.is_sum += w;
    }
  }
  if (!b.shortcut && partial_) {
    partial_gap(b);
    return;
  }
  if (!b.shortcut) b.mismatch = train::compute_mismatch(model_tokens(b.rollout_lp, b, 0), model_tokens(b.old_lp, b, 0));
  // Recomputed under the rollout's own weights: in aligned mode the same bits.
  if (!b.shortcut && b.same_version) check_gap(b.rollout_lp, b.old_lp, b, 0);
}

// Partial rollouts: the recomputed old logprobs are the trainer's current
// weights, which sampled only the tokens of the current version. With
// partial_gap = "current" the mismatch and the gap check cover those, the
// older tokens are counted (train/partial_gap_left_out_tokens); with "all"
// every token is compared at its own version. Single-turn only: no loss mask.
void Runner::partial_gap(UpdateBatch& b) {
  const uint64_t v = trainer_.version();
  if (version_scorers_) {
    own_version_gap(b);
    return;
  }
  b.mismatch = train::compute_mismatch(tokens_of_version(b.rollout_lp, b.versions, v, &b.gap.left_out),
                                       tokens_of_version(b.old_lp, b.versions, v, nullptr));
  check_gap(b.rollout_lp, other_versions_as_rollout(b.old_lp, b.rollout_lp, b.versions, v), b, 0);
}

// partial_gap = "all": the older tokens scored on the trainer's parameters of
// their own version (kept since), so the check and the mismatch cover every
// token; in aligned mode each is the rollout's bits.
void Runner::own_version_gap(UpdateBatch& b) {
  const uint64_t v = trainer_.version();
  Timer t;
  VersionRescore own = version_scorers_->rescore(b.seqs, b.versions, b.old_lp, v, score_options());
  perf_.old_logprob += t.seconds();
  b.gap.rescored = own.rescored;
  b.gap.older = train::compute_mismatch(older_tokens(b.rollout_lp, b.versions, v),
                                        older_tokens(own.logprobs, b.versions, v));
  b.mismatch = train::compute_mismatch(b.rollout_lp, own.logprobs);
  check_gap(b.rollout_lp, own.logprobs, b, 0);
}

// Aligned mode fails closed ([rl] on_gap): any token whose trainer logprob
// differs from the rollout's stops the step before the optimizer runs (abort)
// or is reported (warn). Fast mode only measures the gap. Collective over the
// trainer ranks (each checks its shard), so all of them stop together.
void Runner::check_gap(const std::vector<std::vector<float>>& rollout, const std::vector<std::vector<float>>& trainer,
                       const UpdateBatch& b, size_t first_sample) {
  if (!rollout_->aligned()) return;
  const std::optional<GapToken> g =
      first_gap(model_tokens(rollout, b, first_sample), model_tokens(trainer, b, first_sample), first_sample);
  if (group_.max(g ? 1.0 : 0.0) == 0.0) return;
  const std::string what =
      "rl: aligned mode (both engines in " + cfg_.rollout.precision +
      "), but the trainer's logprob differs from the rollout's: " +
      (g ? describe_gap(*g, b.seqs[g->sample].prompt_len) : std::string("on another trainer rank (see its message)"));
  if (cfg_.on_gap == RlConfig::OnGap::Abort)
    LS_THROW << what << ". The step stopped before the optimizer ran ([rl] on_gap = \"abort\"); "
             << localise_gap(g ? &b.seqs[g->sample] : nullptr);
  if (g) {
    LS_LOG(Warn) << what << " ([rl] on_gap = \"warn\": training goes on)";
  }
}

// Where the gap starts: the rank that found it replays the sample through
// the rollout engine's decode against the trainer's forward; elsewhere (or
// where the backend cannot) check-alignment --localise is the way.
std::string Runner::localise_gap(const train::TrainSequence* seq) {
  const std::string command = "`lockstep check-alignment --model <checkpoint> --data <prompts> --precision " +
                              cfg_.rollout.precision + " --localise` names the first intermediate that differs";
  if (seq == nullptr) return command;
  std::optional<std::string> where;
  try {
    where = rollout_->localise(trainer_, *seq, cfg_.rollout.sampling);
  } catch (const Error& e) {
    return "replaying the sample to localise the gap failed (" + std::string(e.what()) + "); " + command;
  }
  if (!where) return command;
  std::string out = "the sample replayed through the rollout engine's decode against the trainer's forward: " + *where;
  if (where->rfind("no intermediate differs", 0) == 0)
    out += " (the forward agrees when the sample runs alone: the difference arises after it, in the logprob, "
           "or depends on the batch the sample ran in)";
  return out;
}

// Mini-batches: contiguous slices of the samples, one optimizer step each.
UpdateTotals Runner::train_minibatches(const std::vector<Group>& groups, UpdateBatch& b) {
  UpdateTotals tot;
  tot.n_mb = std::min<int64_t>(cfg_.algo.num_steps_per_rollout, int64_t(b.seqs.size()));
  Timer t;
  ProgressBar bar("train", int64_t(b.seqs.size()), false);
  if (!cfg_.log.progress) bar.finish();
  trained_seqs_ = trained_tokens_ = 0;
  for (int64_t mb = 0; mb < tot.n_mb; ++mb) optimizer_step(accumulate_minibatch(groups, b, mb, bar, tot), tot);
  bar.finish();
  // world_invariant: every rank already holds the whole group's statistics.
  if (!trainer_.trainer_config().world_invariant) tot.sums.reduce(group_);
  perf_.train += t.seconds();
  if (b.shortcut) b.mismatch = tot.sums.mismatch;
  return tot;
}

// Mini-batch mb's gradients over this rank's shard of it, micro-batch by
// micro-batch (the trainer's own cut, so the gradients are the same bits as
// one accumulate call; the steps drive the progress bar). Returns the loss
// summed over the trainer ranks, so that every rank agrees on skipping.
// world_invariant: the shard is a run of whole micro-batches of the
// mini-batch's own cut, and the loss and statistics are gathered per
// sequence and added in sequence order (rl/invariant_update.h).
double Runner::accumulate_minibatch(const std::vector<Group>& groups, const UpdateBatch& b, int64_t mb,
                                    ProgressBar& bar, UpdateTotals& tot) {
  const AlgoConfig& a = cfg_.algo;
  const bool invariant = trainer_.trainer_config().world_invariant;
  const int64_t n_mb = tot.n_mb, n = int64_t(b.seqs.size());
  const size_t lo = size_t(n * mb / n_mb), hi = size_t(n * (mb + 1) / n_mb);
  int64_t part_tokens = 0;
  for (size_t k = lo; k < hi; ++k) part_tokens += b.seqs[k].num_loss_targets();
  const int64_t part_seqs = int64_t(hi - lo);
  const auto [shard_lo, shard_hi] =
      invariant ? invariant_shard(group_, std::vector<train::TrainSequence>(b.seqs.begin() + long(lo), b.seqs.begin() + long(hi)),
                                  trainer_.trainer_config().micro_batch_tokens)
                : group_.shard(hi - lo);
  const size_t sb = lo + shard_lo, se = lo + shard_hi;  // this rank's [sb, se) of [lo, hi)
  std::vector<train::TrainSequence> part(b.seqs.begin() + long(sb), b.seqs.begin() + long(se));
  const int64_t norm_len = a.loss_agg_norm_len > 0 ? a.loss_agg_norm_len : cfg_.rollout.sampling.max_new_tokens;
  SeqLossStats& ls = tot.sums.loss;
  SeqStatsTable table(invariant ? hi - lo : 0);
  train::LossFn loss = [&](size_t i, const float* logp, const float* ent, int64_t nt, float* dlogp, float* dent) {
    const size_t k = sb + i;
    SeqLossInput li;
    li.logp = logp;
    li.entropy = ent;
    li.old_logp = b.old_lp[k].data();
    li.ref_logp = b.ref_lp.empty() ? nullptr : b.ref_lp[k].data();
    li.is_weight = b.isw[k].empty() ? nullptr : b.isw[k].data();
    li.mask = b.seqs[k].loss_mask.empty() ? nullptr : b.seqs[k].loss_mask.data();
    li.n = nt;
    li.advantage = groups[b.items[k].g].samples[b.items[k].s].advantage;
    li.token_advantage = b.token_adv.empty() ? nullptr : b.token_adv[k].data();
    // Weights from the whole mini-batch's counts: the shards' gradients sum to it.
    li.token_weight = token_weight(a.loss_agg, b.seqs[k].num_loss_targets(), part_tokens, part_seqs, norm_len);
    SeqLossStats st;
    const double l = sequence_loss(a, li, dlogp, dent, &st);
    if (invariant) {
      table.set(k - lo, l, st);
      return l;
    }
    ls.pg_loss += st.pg_loss / double(n_mb);
    ls.kl += st.kl / double(n_mb);
    ls.entropy += st.entropy / double(n_mb);
    ls.clipped += st.clipped;
    ls.ratio_sum += st.ratio_sum;
    ls.approx_kl += st.approx_kl;
    return l;
  };
  std::vector<train::TokenScores> scores;
  double l = train_part(part, loss, mb == 0, bar, scores);
  if (invariant)
    l = table.add_in_order(group_, n_mb, ls);
  else
    group_.sum(&l, 1);
  if (mb == 0 && b.shortcut) first_minibatch_mismatch(b, invariant ? lo : sb, invariant ? hi : se, scores, tot);
  tot.tokens += part_tokens;
  return l;
}

// accumulate() over part's micro-batches; the scores of the forward in
// *scores when keep_scores. Returns the loss summed over part.
double Runner::train_part(const std::vector<train::TrainSequence>& part, const train::LossFn& loss, bool keep_scores,
                          ProgressBar& bar, std::vector<train::TokenScores>& scores) {
  train::ScoreOptions to = score_options();
  to.entropy = true;  // reported every step (cheap next to the logits)
  double l = 0;
  auto mbs = trainer_.micro_batches(part);
  // Expert parallelism: every training call is collective over the EP
  // group, so every trainer makes as many (extra ones are empty).
  if (trainer_.expert_comm() != nullptr) mbs.resize(size_t(group_.max(double(mbs.size()))), {part.size(), part.size()});
  for (const auto& [m0, m1] : mbs) {
    std::vector<train::TrainSequence> sub(part.begin() + long(m0), part.begin() + long(m1));
    const size_t off = m0;
    train::LossFn sub_loss = [&, off](size_t i, const float* lp, const float* en, int64_t nt, float* dl, float* de) {
      return loss(off + i, lp, en, nt, dl, de);
    };
    std::vector<train::TokenScores> sub_scores;
    l += trainer_.accumulate(sub, sub_loss, to, keep_scores ? &sub_scores : nullptr);
    for (auto& sc : sub_scores) scores.push_back(std::move(sc));
    trained_seqs_ += int64_t(m1 - m0);
    for (size_t k = m0; k < m1; ++k) trained_tokens_ += int64_t(part[k].tokens.size());
    bar.update(trained_seqs_, trained_tokens_);
  }
  return l;
}

// The on-policy shortcut's mismatch and gap check on the first mini-batch's
// forward, over samples [sb, se): this rank's shard (StepSums::reduce adds
// the others'), or with world_invariant the whole mini-batch, its logprobs
// gathered from every rank.
void Runner::first_minibatch_mismatch(const UpdateBatch& b, size_t sb, size_t se,
                                      std::vector<train::TokenScores>& scores, UpdateTotals& tot) {
  std::vector<std::vector<float>> first_lp, rl(b.rollout_lp.begin() + long(sb), b.rollout_lp.begin() + long(se));
  for (auto& sc : scores) first_lp.push_back(std::move(sc.logp));
  if (trainer_.trainer_config().world_invariant) {
    std::vector<size_t> lengths;
    for (size_t k = sb; k < se; ++k) lengths.push_back(size_t(b.seqs[k].num_targets()));
    first_lp = gather_logprobs(group_, first_lp, lengths);
  }
  tot.sums.mismatch = train::compute_mismatch(model_tokens(rl, b, sb), model_tokens(first_lp, b, sb));
  tot.sums.has_mismatch = true;
  check_gap(rl, first_lp, b, sb);
}

// One optimizer step on the accumulated gradients, or none (gradients
// dropped) when the loss is not finite.
void Runner::optimizer_step(double loss, UpdateTotals& tot) {
  if (!std::isfinite(loss)) {
    trainer_.zero_grad();
    ++tot.skipped;
    return;
  }
  // The weights about to change still sampled tokens in flight: kept for their gap.
  if (version_scorers_) version_scorers_->keep(trainer_, partial_->held_versions());
  const train::OptimizerStats os = trainer_.step();
  if (version_scorers_) version_scorers_->release_stale(trainer_.version(), cfg_.partial.max_staleness);
  tot.grad_norm_sum += os.grad_norm;
  tot.lr = os.lr;
  tot.skipped += os.skipped ? 1 : 0;
}

nlohmann::json Runner::update_metrics(const std::vector<Group>& groups, const UpdateBatch& b,
                                      const UpdateTotals& tot) const {
  nlohmann::json m = nlohmann::json::object();
  const SeqLossStats& ls = tot.sums.loss;
  const double tt = double(std::max<int64_t>(tot.tokens, 1));
  const double all_tokens = double(std::max<int64_t>(b.tokens, 1));
  m["train/on_policy_shortcut"] = b.shortcut ? 1 : 0;
  m["train/pg_loss"] = ls.pg_loss;
  m["train/entropy"] = ls.entropy;
  if (ref_) m["train/kl"] = ls.kl;
  m["train/pg_clipfrac"] = double(ls.clipped) / tt;
  m["train/ratio_mean"] = ls.ratio_sum / tt;
  m["train/ppo_kl"] = ls.approx_kl / tt;
  m["train/grad_norm"] = tot.grad_norm_sum / double(std::max<int64_t>(tot.n_mb - tot.skipped, 1));
  m["train/lr"] = tot.lr;
  m["train/skipped"] = tot.skipped;
  m["train/num_updates"] = tot.n_mb;
  m["train/samples"] = int64_t(b.seqs.size());
  m["train/tokens"] = b.tokens;
  if (cfg_.algo.rollout_is != IsLevel::None) {
    m["train/tis_clipfrac"] = double(b.is_corrected) / all_tokens;
    m["train/tis_weight_mean"] = b.is_sum / all_tokens;
  }
  if (b.mismatch) m.update(b.mismatch->to_json());
  if (partial_) m.update(b.gap.to_json(version_scorers_.get()));
  std::vector<double> adv;
  for (auto& it : b.items) adv.push_back(groups[it.g].samples[it.s].advantage);
  m["train/advantage_mean"] = mean_of(adv);
  m["train/advantage_std"] = std_of(adv);
  return m;
}

void Runner::run_eval(int64_t step, nlohmann::json& m, RlResult& result) {
  if (!evaluator_) return;
  Timer t;
  std::vector<eval::EvalProblemResult> per;
  eval::GenerateFn gen = [&](std::vector<rollout::Request> reqs) {
    return rollout_->generate(std::move(reqs), {}, nullptr);
  };
  const auto score = [this](const std::vector<reward::RewardRequest>& reqs) {
    return score_across_ranks(evaluator_->scorer(), group_, reqs);
  };
  const eval::EvalSummary s = multi_eval_ ? evaluate_episodes(*multi_eval_, cfg_.eval.config, score, *in_.tok,
                                                              in_.eval, &per, nullptr)
                                          : evaluator_->run(gen, *in_.tok, in_.eval, &per);
  for (auto& [k, v] : eval::eval_metrics(s)) m[k] = v;
  const double secs = t.seconds();
  m["perf/eval_time_s"] = secs;
  phase_total_["eval"] += secs;
  if (writer_) {
    std::filesystem::create_directories(cfg_.out_dir + "/eval");
    std::vector<nlohmann::json> lines;
    for (const auto& p : per) lines.push_back(eval::problem_to_json(p));
    data::write_jsonl_atomic(cfg_.out_dir + "/eval/" + step_name(step) + ".jsonl", lines);
  }
  if (!result.first_eval) {
    result.first_eval = s;
    result.first_eval_step = step;
  }
  result.last_eval = s;
  result.last_eval_step = step;
  if (!writer_) return;
  std::cout << "eval step " << step << ": " << s.name << " pass@1 " << s.pass_at_1;
  for (auto& [k, v] : s.pass_at_k)
    if (k > 1) std::cout << ", pass@" << k << " " << v;
  std::cout << ", truncated " << s.truncated_ratio << ", len " << s.response_len_mean;
  if (s.turns_mean > 0) std::cout << ", turns " << s.turns_mean;
  std::cout << " (" << secs << " s)" << std::endl;
}

void Runner::write_samples(int64_t step, const std::vector<Group>& groups) {
  std::vector<nlohmann::json> lines;
  for (const auto& g : groups)
    for (const auto& s : g.samples) {
      if (int64_t(lines.size()) >= cfg_.log.samples_per_step) break;
      lines.push_back({{"step", step},
                       {"prompt", in_.train[g.prompt].prompt_text},
                       {"response", s.response},
                       {"label", in_.train[g.prompt].label},
                       {"reward", s.failed ? nlohmann::json(nullptr) : nlohmann::json(s.reward)},
                       {"correct", s.correct},
                       {"finish_reason", s.finish_reason},
                       {"response_len", int64_t(s.output_ids.size())},
                       {"advantage", s.advantage}});
      if (!s.reward_failure.empty()) lines.back()["reward_failure"] = s.reward_failure;
      if (!s.versions.empty()) lines.back()["versions"] = s.versions;
      if (multi_) {
        lines.back()["turns"] = s.turns;
        if (s.env_failed) lines.back()["env_error"] = s.env_error;
      }
    }
  std::filesystem::create_directories(cfg_.out_dir + "/samples");
  data::write_jsonl_atomic(cfg_.out_dir + "/samples/" + step_name(step) + ".jsonl", lines);
}

// The step to start after (0, or the resumed checkpoint's), with the
// trainer, prompt cursor and rollout weights set to it.
int64_t Runner::begin_run(bool resume) {
  std::filesystem::create_directories(cfg_.out_dir);
  int64_t start = 0;
  if (writer_ && !resume) train::refuse_existing_run(cfg_.out_dir);
  if (resume) {
    if (auto info = train::find_resume_checkpoint(cfg_.out_dir, in_.resume_from, writer_)) {
      train::load_checkpoint(*info, trainer_);
      if (critic_) critic_->load(info->dir);
      start = info->step;
      cursor_ = info->state.value("prompt_cursor", uint64_t(0));
      sync_weights();
      if (writer_) std::cout << "rl: resumed from " << info->dir << " (step " << start << ")" << std::endl;
    } else {
      LS_LOG(Warn) << "--resume: no checkpoint in " << cfg_.out_dir << ", starting from step 0";
    }
  }
  version_step_[trainer_.version()] = start;
  return start;
}

RlResult Runner::run(bool resume) {
  RlResult result;
  Timer total;
  const int64_t start = begin_run(resume);
  clock_.emplace(start + 1, cfg_.steps);
  std::unique_ptr<metrics::MetricsLogger> log;
  // Resumed: the lines of the steps written again go (the step-0 eval too,
  // when there is no checkpoint to resume from).
  const bool eval_zero = start == 0 && evaluator_;
  if (writer_)
    log = std::make_unique<metrics::MetricsLogger>(
        cfg_.out_dir + "/metrics.jsonl", resume ? (eval_zero ? -1 : start) : metrics::MetricsLogger::kAppend,
        cfg_.log.metrics);
  if (eval_zero) {
    nlohmann::json m = nlohmann::json::object();
    run_eval(0, m, result);
    if (log) log->log(0, m);
    if (in_.on_step) in_.on_step(0, m);
  }
  for (int64_t step = start + 1; step <= cfg_.steps; ++step) run_step(step, log.get(), result);
  LS_CHECK(!ahead_) << "rl: a batch generated ahead of the last step";
  result.seconds = total.seconds();
  for (auto& [k, v] : phase_total_)
    result.phase_seconds.push_back({k, result.steps_run ? v / double(result.steps_run) : 0.0});
  return result;
}

void Runner::run_step(int64_t step, metrics::MetricsLogger* log, RlResult& result) {
  Timer step_timer;
  perf_ = StepPerf{};
  nlohmann::json m = nlohmann::json::object();
  // 1-3. Rollout, rewards, dynamic-sampling filter.
  StepSamples ss = collect_samples(step);
  rollout_metrics(ss, m);
  if (partial_) m.update(partial_->stats().to_json());
  m["rollout/weight_staleness"] = staleness(ss.groups.empty() ? ss.all : ss.groups, step);
  const RewardTally tally = tally_rewards(ss);
  if (const std::string why = watch_.observe(step, tally); !why.empty()) {
    m["perf/step_time_s"] = step_timer.seconds();
    stop_run(step, ss, m, log, tally, why);
  }
  // 4-5. Advantages and update(s).
  train_step(step, ss, m);
  // 6. Weight sync.
  const bool last = step == cfg_.steps;
  const bool eval_now = evaluator_ && (last || (cfg_.eval.interval > 0 && step % cfg_.eval.interval == 0));
  sync_step(eval_now);
  const double step_core = step_timer.seconds();
  perf_metrics(m);
  // 7. Eval, samples, metrics, checkpoint.
  if (eval_now) run_eval(step, m, result);
  if (writer_ && cfg_.log.samples_interval > 0 && (step % cfg_.log.samples_interval == 0 || last))
    write_samples(step, ss.groups.empty() ? ss.all : ss.groups);
  m["perf/step_time_s"] = step_timer.seconds();
  record_step(m, step_core, result);
  if (log) log->log(step, m);
  ++result.steps_run;
  log_console(step, m, tally, last);
  if (in_.on_step) in_.on_step(step, m);
  save_step(step, last);
  if (writer_ && in_.after_step) in_.after_step(step);
}

// Rollout rounds until batch_size groups pass the filter (one round without
// dynamic sampling, at most max_sampling_tries with it).
StepSamples Runner::collect_samples(int64_t step) {
  StepSamples ss;
  // Overlap: the next step's first round starts as soon as this step needs
  // the rollout no more (never past the last step), so it generates while
  // this step scores and trains.
  auto submit_next = [&] {
    if (overlap_ && step < cfg_.steps && !ahead_) submit_ahead();
  };
  while (int64_t(ss.groups.size()) < cfg_.batch_size && ss.tries < cfg_.algo.max_sampling_tries) {
    // Overlap: the first round was generated ahead (none on the first step
    // of a run); then the rollout is idle and gets the last update's weights
    // before it generates anything else.
    auto round = ss.tries == 0 && ahead_ ? take_ahead()
                 : partial_              ? partial_round()
                                         : rollout_round(cfg_.batch_size - int64_t(ss.groups.size()));
    if (ss.tries == 0 && overlap_) sync_if_stale();
    if (!cfg_.algo.dynamic_sampling) submit_next();  // no more rounds this step
    score_groups(round);
    ++ss.tries;
    filter_round(round, ss);
    if (!cfg_.algo.dynamic_sampling) break;
  }
  if (int64_t(ss.groups.size()) > cfg_.batch_size) ss.groups.resize(size_t(cfg_.batch_size));
  submit_next();  // after dynamic sampling's extra rounds, which draw prompts first
  return ss;
}

// Dynamic sampling drops the groups whose rewards all agree (no signal).
void Runner::filter_round(std::vector<Group>& round, StepSamples& ss) const {
  for (auto& g : round) {
    ss.all.push_back(g);
    bool agree = true;
    for (auto& s : g.samples) agree = agree && !s.failed && s.reward == g.samples.front().reward;
    if (cfg_.algo.dynamic_sampling && agree) {
      ++ss.filtered;
      continue;
    }
    ss.groups.push_back(std::move(g));
  }
}

// Over every sample drawn this step (before filtering).
void Runner::rollout_metrics(const StepSamples& ss, nlohmann::json& m) const {
  std::vector<double> rewards, scores, lens;
  std::map<std::string, std::pair<double, int64_t>> extra;  // key -> (sum, samples)
  int64_t truncated = 0, failures = 0, correct = 0, n_samples = 0, env_failures = 0;
  double turns = 0;
  for (auto& g : ss.all)
    for (auto& s : g.samples) {
      ++n_samples;
      turns += double(s.turns);
      env_failures += s.env_failed ? 1 : 0;
      lens.push_back(double(s.output_ids.size()));
      truncated += s.finish_reason == "length" || s.finish_reason == "budget" ? 1 : 0;
      if (s.failed) {
        failures += s.env_failed ? 0 : 1;  // env failures are counted apart
        continue;
      }
      rewards.push_back(s.reward);
      scores.push_back(s.score);
      correct += s.correct ? 1 : 0;
      for (const auto& [key, v] : s.reward_extra) {
        extra[key].first += v;
        ++extra[key].second;
      }
    }
  for (const auto& [key, sn] : extra) m["reward/extra/" + key] = sn.first / double(sn.second);
  if (!rewards.empty()) {  // no sample scored: no mean (a 0 would read as "all wrong")
    m["rollout/reward_mean"] = mean_of(rewards);
    m["rollout/reward_std"] = std_of(rewards);
    m["rollout/score_mean"] = mean_of(scores);
  }
  m["rollout/accuracy"] = double(correct) / double(std::max<int64_t>(n_samples, 1));
  m["rollout/response_len_mean"] = mean_of(lens);
  m["rollout/response_len_max"] = lens.empty() ? 0.0 : *std::max_element(lens.begin(), lens.end());
  m["rollout/truncated_ratio"] = double(truncated) / double(std::max<int64_t>(n_samples, 1));
  m["rollout/reward_failures"] = failures;
  m["rollout/num_samples"] = n_samples;
  m["rollout/sampling_tries"] = ss.tries;
  m["rollout/filtered_groups"] = ss.filtered;
  m["rollout/prompts_drawn"] = int64_t(ss.all.size());
  if (multi_) {
    m["rollout/turns_mean"] = turns / double(std::max<int64_t>(n_samples, 1));
    m["rollout/env_failures"] = env_failures;
    m["rollout/env_time_s"] = perf_.env;
  }
}

void Runner::train_step(int64_t step, StepSamples& ss, nlohmann::json& m) {
  skipped_.clear();
  if (ss.groups.empty()) {
    skipped_ = "all groups filtered (rewards all agree)";
    if (partial_) {
      skipped_ = "no group finished (partial rollouts: every group in flight has a paused sample)";
    } else {
      LS_LOG(Warn) << "rl step " << step << ": every group was filtered (rewards all agree) after "
                   << ss.tries << " tries; no update this step";
    }
    m["train/skipped"] = 1;
  } else {
    m.update(update(ss.groups));
    if (m.value("train/skipped", int64_t(0)) > 0)
      skipped_ = m.contains("train/grad_norm") ? "non-finite loss or gradient"
                                               : "no sample to train on (failed rewards, groups of one)";
  }
  version_step_[trainer_.version()] = step;
  if (version_step_.size() > 64) version_step_.erase(version_step_.begin());  // versions only grow
}

// Synchronous: the rollout takes the new weights now. Overlap: it is
// generating the next batch and takes them after it (next step), unless an
// eval needs it idle and on this step's weights now.
void Runner::sync_step(bool eval_now) {
  if (!overlap_) {
    sync_weights();
  } else if (eval_now) {
    collect_ahead();
    sync_if_stale();
  }
}

void Runner::perf_metrics(nlohmann::json& m) const {
  const StepPerf& p = perf_;
  m["perf/rollout_time_s"] = p.rollout;
  m["perf/reward_time_s"] = p.reward;
  m["perf/old_logprob_time_s"] = p.old_logprob;
  if (ref_) m["perf/ref_logprob_time_s"] = p.ref_logprob;
  m["perf/train_time_s"] = p.train;
  m["perf/weight_sync_s"] = p.sync;
  if (p.sync_bytes > 0) m["perf/weight_sync_gb_per_s"] = double(p.sync_bytes) / std::max(p.sync, 1e-9) * 1e-9;
  if (overlap_) m["perf/rollout_wait_time_s"] = p.wait;
  m["perf/rollout_tokens_per_s"] = double(p.rollout_tokens) / std::max(p.generate, 1e-9);
  m["perf/train_tokens_per_s"] = double(p.train_tokens) / std::max(p.train + p.old_logprob, 1e-9);
  m["weight_version"] = trainer_.version();
}

// The run's largest mismatch and the phase totals. step_core: the step's
// time before eval, samples and checkpoint.
void Runner::record_step(const nlohmann::json& m, double step_core, RlResult& result) {
  if (m.contains("train/train_rollout_logprob_abs_diff")) {
    result.max_logprob_abs_diff =
        std::max(result.max_logprob_abs_diff, m["train/train_rollout_logprob_abs_diff"].get<double>());
    result.max_logprob_abs_diff_max =
        std::max(result.max_logprob_abs_diff_max, m["train/train_rollout_logprob_abs_diff_max"].get<double>());
  }
  const StepPerf& p = perf_;
  const double sync = p.sync;
  phase_total_["rollout"] += p.rollout;
  phase_total_["reward"] += p.reward;
  phase_total_["old_logprob"] += p.old_logprob;
  phase_total_["ref_logprob"] += p.ref_logprob;
  phase_total_["train"] += p.train;
  phase_total_["weight_sync"] += sync;
  phase_total_["other"] += step_core - (p.rollout + p.reward + p.old_logprob + p.ref_logprob + p.train + sync);
}

void Runner::log_console(int64_t step, const nlohmann::json& m, const RewardTally& tally, bool last) const {
  if (!writer_ || cfg_.log_interval <= 0 || (step % cfg_.log_interval != 0 && !last)) return;
  std::cout << format_step_line(clock_->head(step), m, tally, skipped_, clock_->timing(step)) << std::endl;
}

RewardTally Runner::tally_rewards(const StepSamples& ss) {
  RewardTally t;
  for (const auto& g : ss.all)
    for (const auto& s : g.samples) {
      if (s.env_reward || s.env_failed) continue;  // the environment's verdict
      ++t.scored;
      if (!s.failed) continue;
      if (t.failed++ == 0) t.first_failure = s.reward_failure;
    }
  return t;
}

// The step's metrics line, samples and console line are written (so the
// failures can be read), then the run ends with an Error; the checkpoints
// and metrics of the steps before stay as they are.
void Runner::stop_run(int64_t step, const StepSamples& ss, nlohmann::json& m, metrics::MetricsLogger* log,
                      const RewardTally& tally, const std::string& why) {
  if (log) log->log(step, m);
  if (writer_ && cfg_.log.samples_interval > 0) write_samples(step, ss.all);
  skipped_ = "the run stops";
  log_console(step, m, tally, true);
  LS_THROW << why;
}

void Runner::save_step(int64_t step, bool last) {
  const bool save_now =
      cfg_.checkpoints && (last || (cfg_.save_interval > 0 && step % cfg_.save_interval == 0));
  if (!save_now) return;
  // Expert parallelism: every trainer of the writer's group sends its
  // experts' optimizer state (a collective; nothing otherwise).
  trainer_.prepare_checkpoint(writer_, cfg_.out_dir + "/checkpoints/optimizer.gathered");
  if (!writer_) return;
  Timer ct;
  // Prompts generated ahead are not trained on yet: the cursor points before
  // them, so --resume draws them again (on the saved weights).
  const uint64_t cursor = ahead_ ? ahead_->cursor : cursor_;
  nlohmann::json state = {{"prompt_cursor", cursor}, {"data_seed", cfg_.seed}, {"kind", "rl"}};
  std::function<void(const std::string&)> critic;
  if (critic_) critic = [this](const std::string& dir) { critic_->save(dir); };
  train::save_checkpoint(cfg_.out_dir, step, trainer_, state, in_.tokenizer_dir, cfg_.keep_last, critic);
  phase_total_["checkpoint"] += ct.seconds();
}

}  // namespace

RlResult run_rl(train::Trainer& trainer, const RlInputs& in, const RlConfig& cfg, bool resume) {
  cfg.algo.validate();
  LS_CHECK(in.group) << "rl: RlInputs::group is null (OneRank: one process)";
  Runner r(trainer, in, cfg);
  return r.run(resume);
}

}  // namespace lockstep::rl
