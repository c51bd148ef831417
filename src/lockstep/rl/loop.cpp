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
#include "lockstep/base/timer.h"
#include "lockstep/data/jsonl.h"
#include "lockstep/eval/eval_output.h"
#include "lockstep/metrics/metrics_logger.h"
#include "lockstep/model/weights.h"
#include "lockstep/reward/batch.h"
#include "lockstep/rollout/engine.h"
#include "lockstep/train/checkpoint.h"
#include "lockstep/train/data_order.h"
#include "lockstep/train/mismatch.h"
#include "lockstep/train/train_config.h"

namespace lockstep::rl {

// ---------------------------------------------------------------- config

RlConfig rl_config_from_toml(const toml::table& root, const std::string& source) {
  static const std::vector<std::string> kSections = {"model", "data",  "rollout", "train", "algo",
                                                     "reward", "eval", "log",     "sync",  "dist"};
  for (const auto& [k, v] : root) {
    const std::string key(k.str());
    if (std::find(kSections.begin(), kSections.end(), key) == kSections.end())
      LS_THROW << source << ": unknown section [" << key << "] (rl reads [model] [data] [rollout] [train] [algo] "
               << "[reward] [eval] [log])";
    if (!v.is_table()) LS_THROW << source << ": '" << key << "' must be a section";
  }
  // [dist] is read by the command that launches the ranks (cli/cmd_rl.cpp).
  if (const auto* t = root["sync"].as_table(); t && !t->empty())
    LS_THROW << source << ": [sync] is not supported by this build of `lockstep rl` yet "
             << "(weights go to colocated engines in memory and to rollout ranks by [dist]; see docs/distributed.md)";
  RlConfig c;
  {
    TomlSection s(root["rollout"].as_table(), source, "rollout");
    c.batch_size = s.get_int("batch_size", c.batch_size, 1, 1 << 20);
    c.rollout = rollout::rollout_section_from_toml(s);
    s.finish();
  }
  {
    TomlSection s(root["train"].as_table(), source, "train");
    if (s.has("batch_size"))
      s.fail("batch_size", "not used by rl: prompts per step are [rollout] batch_size, samples per prompt "
                           "[rollout] n, optimizer steps per batch [algo] num_steps_per_rollout");
    const train::TrainSection t = train::train_section_from_toml(s);
    s.finish();
    c.trainer = t.trainer;
    c.steps = t.sft.steps;
    c.seed = t.sft.seed;
    c.shuffle = t.sft.shuffle;
    c.save_interval = t.sft.save_interval;
    c.keep_last = t.sft.keep_last;
    c.log_interval = t.sft.log_interval;
    c.out_dir = root["train"]["out_dir"].value_or(std::string("runs/rl"));
    c.threads = t.threads;
  }
  {
    TomlSection s(root["algo"].as_table(), source, "algo");
    c.algo = algo_config_from_toml(s);
    s.finish();
  }
  {
    TomlSection s(root["eval"].as_table(), source, "eval");
    c.eval = eval::eval_section_from_toml(s);
    s.finish();
  }
  c.reward = eval::reward_options_from_toml(root["reward"].as_table(), source);
  c.eval.config.reward = c.reward;
  {
    TomlSection s(root["log"].as_table(), source, "log");
    c.log.report_interval = s.get_int("report_interval", c.log.report_interval, 0);
    c.log.samples_interval = s.get_int("samples_interval", c.log.samples_interval, 0);
    c.log.samples_per_step = s.get_int("samples_per_step", c.log.samples_per_step, 0);
    c.log.progress = s.get_bool("progress", c.log.progress);
    s.finish();
  }
  if (c.algo.loss_agg == LossAgg::SeqMeanTokenSumNorm && c.algo.loss_agg_norm_len == 0)
    c.algo.loss_agg_norm_len = c.rollout.sampling.max_new_tokens;
  if (c.algo.overlong_buffer_len >= c.rollout.sampling.max_new_tokens)
    LS_THROW << source << ": [algo] overlong_buffer_len (" << c.algo.overlong_buffer_len
             << ") must be below [rollout] max_new_tokens (" << c.rollout.sampling.max_new_tokens << ")";
  if (c.rollout.sampling.n < 2 && c.algo.advantage != Advantage::ReinforcePP)
    LS_THROW << source << ": [rollout] n must be >= 2 for group advantages (" << to_string(c.algo.advantage)
             << "); use advantage = \"reinforce++\" for one sample per prompt";
  return c;
}

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
  std::string finish_reason, response;
  double reward = 0, score = 0, advantage = 0;
  bool correct = false, failed = false;
  uint64_t version = 0, version_end = 0;
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

class Runner {
 public:
  Runner(train::Trainer& trainer, const RlInputs& in, const RlConfig& cfg)
      : trainer_(trainer), in_(in), cfg_(cfg), ctx_(trainer.context()),
        stream_(in.train.size(), cfg.seed, cfg.shuffle) {
    LS_CHECK(in.tok) << "rl: no tokenizer";
    LS_CHECK(!in.train.empty()) << "rl: no training prompts";
    rollout_ = in.rollout ? in.rollout : std::make_shared<LocalRollout>(trainer, cfg.rollout, cfg.seed);
    writer_ = in.group.writer;
    reward_ = in.reward ? in.reward : std::shared_ptr<const reward::Reward>(reward::make_reward(cfg.reward));
    scorer_ = std::make_unique<reward::BatchScorer>(reward_, reward::batch_options_for(cfg.reward));
    if (!in.eval.empty()) {
      eval::EvalConfig ecfg = cfg.eval.config;
      evaluator_ = std::make_unique<eval::Evaluator>(ecfg, reward_);
    }
    if (cfg.algo.kl_coef > 0) {
      LS_CHECK(in.ref_params) << "rl: [algo] kl_coef > 0 needs the reference model's parameters";
      Buffer ref = alloc_params(trainer.model_layout());
      std::copy(in.ref_params, in.ref_params + trainer.model_layout().numel(), ref.as<float>());
      train::TrainerConfig rc;
      rc.micro_batch_tokens = cfg.trainer.micro_batch_tokens;
      ref_ = std::make_unique<train::Trainer>(ctx_, trainer.config(), std::move(ref), rc);
    }
    end_of_turn_ = data::end_of_turn_id(*in.tok);
    overlap_ = cfg.max_weight_staleness > 0;
    if (overlap_ && !rollout_->can_overlap())
      LS_THROW << "[dist] max_weight_staleness = " << cfg.max_weight_staleness << ": the rollout runs in the "
               << "trainer's own process (colocated), so it cannot generate while the trainer trains; rollout "
               << "ahead of training needs rollout ranks ([dist] rollout_ranks > 0)";
    synced_version_ = trainer.version();  // every backend starts on the trainer's weights
  }

  RlResult run(bool resume);

 private:
  std::vector<Group> draw(int64_t count, std::vector<rollout::Request>& reqs);
  void fill(std::vector<Group>& groups, std::vector<rollout::RequestResult> results);
  std::vector<Group> rollout_round(int64_t count);
  void submit_ahead();
  void collect_ahead();
  std::vector<Group> take_ahead();
  void score_groups(std::vector<Group>& groups);
  double staleness(const std::vector<Group>& groups, int64_t step) const;
  nlohmann::json update(std::vector<Group>& groups);
  double sync_weights();
  double sync_if_stale();
  void run_eval(int64_t step, nlohmann::json& m, RlResult& result);
  void write_samples(int64_t step, const std::vector<Group>& groups);

  train::Trainer& trainer_;
  const RlInputs& in_;
  const RlConfig& cfg_;
  Context ctx_;
  PromptStream stream_;
  uint64_t cursor_ = 0;  // prompts drawn so far
  std::shared_ptr<RolloutBackend> rollout_;
  bool writer_ = true;
  std::shared_ptr<const reward::Reward> reward_;
  std::unique_ptr<reward::BatchScorer> scorer_;
  std::unique_ptr<eval::Evaluator> evaluator_;
  std::unique_ptr<train::Trainer> ref_;
  int32_t end_of_turn_ = -1;
  std::map<std::string, double> phase_total_;
  // Overlap ([dist] max_weight_staleness > 0): the batch generated ahead.
  bool overlap_ = false;
  std::optional<Ahead> ahead_;
  uint64_t synced_version_ = 0;  // the weights the rollout holds
  // Weight version -> the last step at whose end the trainer held it (the
  // start step for the weights a run starts or resumes from): staleness is
  // counted in steps, whatever the optimizer steps per batch.
  std::map<uint64_t, int64_t> version_step_;
  // Per-step phase times. t_rollout_: the trainer's time in rollout calls
  // (generate, submit, waiting in collect); t_generate_: time the step's
  // samples took to generate (for a batch generated ahead: submit to results).
  double t_rollout_ = 0, t_generate_ = 0, t_wait_ = 0, t_reward_ = 0, t_old_ = 0, t_ref_ = 0, t_train_ = 0;
  double t_sync_ = 0;
  size_t sync_bytes_ = 0;
  int64_t rollout_tokens_ = 0, train_tokens_ = 0;
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
      x.finish_reason = s.finish_reason;
      x.version = s.weight_version;  // the weights the engine actually used
      x.version_end = s.weight_version_end;
      groups[i].samples.push_back(std::move(x));
    }
}

// One synchronous round: `count` prompts, generated now.
std::vector<Group> Runner::rollout_round(int64_t count) {
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
    rollout_tokens_ += tokens;
  }
  const double secs = t.seconds();
  t_rollout_ += secs;
  t_generate_ += secs;
  fill(groups, std::move(results));
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
  t_rollout_ += t.seconds();
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
  t_rollout_ += waited;
  t_wait_ += waited;
  ahead_->seconds = ahead_->submitted.seconds();
  ahead_->in_flight = false;
  fill(ahead_->groups, std::move(results));
}

std::vector<Group> Runner::take_ahead() {
  collect_ahead();
  std::vector<Group> groups = std::move(ahead_->groups);
  rollout_tokens_ += ahead_->tokens;
  t_generate_ += ahead_->seconds;
  ahead_.reset();
  return groups;
}

void Runner::score_groups(std::vector<Group>& groups) {
  Timer t;
  std::vector<reward::RewardRequest> reqs;
  for (auto& g : groups)
    for (auto& s : g.samples) {
      s.response = in_.tok->decode(s.output_ids, true);
      reward::RewardRequest r;
      r.prompt = in_.train[g.prompt].prompt_text;
      r.response = s.response;
      r.label = in_.train[g.prompt].label;
      r.metadata = in_.train[g.prompt].metadata;
      reqs.push_back(std::move(r));
    }
  auto results = scorer_->score(reqs);
  size_t k = 0;
  for (auto& g : groups)
    for (auto& s : g.samples) {
      const auto& r = results[k++];
      s.failed = r.failed() || s.finish_reason == "abort";
      s.correct = r.correct;
      s.score = r.failed() ? 0.0 : r.reward;
      s.reward = s.score + overlong_penalty(int64_t(s.output_ids.size()), cfg_.rollout.sampling.max_new_tokens,
                                            cfg_.algo.overlong_buffer_len, cfg_.algo.overlong_penalty_factor);
    }
  t_reward_ += t.seconds();
}

double Runner::sync_weights() {
  Timer t;
  rollout_->sync(trainer_);
  synced_version_ = trainer_.version();
  sync_bytes_ += rollout_->last_sync_bytes();
  const double secs = t.seconds();
  t_sync_ += secs;
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
  const AlgoConfig& a = cfg_.algo;
  nlohmann::json m = nlohmann::json::object();
  // Samples that train: those scored successfully, in groups of >= 2 of them
  // (one sample has no baseline) unless REINFORCE++ (batch baseline).
  struct Item {
    size_t g, s;
  };
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
    if (rewards.size() < 2 && a.advantage != Advantage::ReinforcePP) continue;
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
      tok.push_back(int64_t(groups[it.g].samples[it.s].output_ids.size()));
    }
    whiten_advantages(adv, tok, a.adv_eps);
    for (size_t i = 0; i < items.size(); ++i) groups[items[i].g].samples[items[i].s].advantage = adv[i];
  }
  if (items.empty()) {
    m["train/skipped"] = 1;
    return m;
  }
  // Sequences.
  std::vector<train::TrainSequence> seqs;
  std::vector<std::vector<float>> rollout_lp;
  bool same_version = true;
  for (auto& it : items) {
    const Group& g = groups[it.g];
    const Sample& s = g.samples[it.s];
    train::TrainSequence t;
    t.tokens = g.prompt_ids;
    t.tokens.insert(t.tokens.end(), s.output_ids.begin(), s.output_ids.end());
    t.prompt_len = int32_t(g.prompt_ids.size());
    if (a.routing_replay) t.routed_experts = s.routed_experts;
    seqs.push_back(std::move(t));
    rollout_lp.push_back(s.rollout_logp);
    same_version = same_version && s.version == trainer_.version() && s.version_end == trainer_.version();
    train_tokens_ += int64_t(seqs.back().tokens.size());
  }
  train::ScoreOptions so;
  so.temperature = cfg_.rollout.sampling.logprob_temperature();
  so.replay = a.routing_replay;
  // Old-policy logprobs: the on-policy shortcut reuses the rollout's when
  // they are the trainer's own bits (aligned mode, same weight version).
  const bool shortcut = rollout_->aligned() && same_version && !a.recompute_logprobs;
  std::vector<std::vector<float>> old_lp;
  if (shortcut) {
    old_lp = rollout_lp;
  } else {
    Timer t;
    for (auto& sc : trainer_.score(seqs, so)) old_lp.push_back(std::move(sc.logp));
    t_old_ += t.seconds();
  }
  m["train/on_policy_shortcut"] = shortcut ? 1 : 0;
  std::vector<std::vector<float>> ref_lp;
  if (ref_) {
    Timer t;
    for (auto& sc : ref_->score(seqs, so)) ref_lp.push_back(std::move(sc.logp));
    t_ref_ += t.seconds();
  }
  // Importance weights between the trainer's old logprobs and the rollout's.
  std::vector<std::vector<double>> isw(seqs.size());
  int64_t is_corrected = 0, total_tokens = 0;
  double is_sum = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int64_t n = seqs[i].num_targets();
    total_tokens += n;
    if (a.rollout_is != IsLevel::None) {
      isw[i] = importance_weights(old_lp[i].data(), rollout_lp[i].data(), n, a, &is_corrected);
      for (double w : isw[i]) is_sum += w;
    }
  }
  // Mismatch: the recomputed old logprobs if any, else (shortcut) the first
  // mini-batch's forward, which runs under the rollout's weights.
  std::optional<train::MismatchStats> mismatch;
  if (!shortcut) mismatch = train::compute_mismatch(rollout_lp, old_lp);

  // Mini-batches: contiguous slices of the samples, one optimizer step each.
  const int64_t n_mb = std::min<int64_t>(a.num_steps_per_rollout, int64_t(seqs.size()));
  SeqLossStats tot;
  int64_t tot_tokens = 0;
  double grad_norm_sum = 0, lr = 0;
  int64_t skipped = 0;
  Timer t;
  std::vector<std::vector<float>> first_lp;
  ProgressBar bar("train", int64_t(seqs.size()), false);
  if (!cfg_.log.progress) bar.finish();
  int64_t trained_seqs = 0, trained_tokens = 0;
  for (int64_t mb = 0; mb < n_mb; ++mb) {
    const size_t b = size_t(int64_t(seqs.size()) * mb / n_mb), e = size_t(int64_t(seqs.size()) * (mb + 1) / n_mb);
    int64_t part_tokens = 0;
    for (size_t k = b; k < e; ++k) part_tokens += seqs[k].num_targets();
    const int64_t part_seqs = int64_t(e - b);
    // This trainer rank's shard [sb, se) of the mini-batch (all of it on one rank).
    size_t sb = b, se = e;
    if (in_.group.shard) {
      const auto [lo, hi] = in_.group.shard(e - b);
      sb = b + lo;
      se = b + hi;
    }
    std::vector<train::TrainSequence> part(seqs.begin() + long(sb), seqs.begin() + long(se));
    const int64_t norm_len = a.loss_agg_norm_len > 0 ? a.loss_agg_norm_len : cfg_.rollout.sampling.max_new_tokens;
    train::LossFn loss = [&](size_t i, const float* logp, const float* ent, int64_t n, float* dlogp, float* dent) {
      const size_t k = sb + i;
      SeqLossInput li;
      li.logp = logp;
      li.entropy = ent;
      li.old_logp = old_lp[k].data();
      li.ref_logp = ref_lp.empty() ? nullptr : ref_lp[k].data();
      li.is_weight = isw[k].empty() ? nullptr : isw[k].data();
      li.n = n;
      li.advantage = groups[items[k].g].samples[items[k].s].advantage;
      // Weights from the whole mini-batch's counts: the shards' gradients sum to it.
      li.token_weight = token_weight(a.loss_agg, n, part_tokens, part_seqs, norm_len);
      SeqLossStats st;
      const double l = sequence_loss(a, li, dlogp, dent, &st);
      tot.pg_loss += st.pg_loss / double(n_mb);
      tot.kl += st.kl / double(n_mb);
      tot.entropy += st.entropy / double(n_mb);
      tot.clipped += st.clipped;
      tot.ratio_sum += st.ratio_sum;
      tot.approx_kl += st.approx_kl;
      return l;
    };
    train::ScoreOptions to = so;
    to.entropy = true;  // reported every step (cheap next to the logits)
    std::vector<train::TokenScores> scores;
    // Micro-batch by micro-batch (the trainer's own cut, so the gradients are
    // the same bits as one accumulate call), to drive the progress bar.
    double l = 0;
    auto mbs = trainer_.micro_batches(part);
    // Expert parallelism: every training call is collective over the EP
    // group, so every trainer makes as many (extra ones are empty).
    if (trainer_.expert_comm() != nullptr && in_.group.max)
      mbs.resize(size_t(in_.group.max(double(mbs.size()))), {part.size(), part.size()});
    for (const auto& [m0, m1] : mbs) {
      std::vector<train::TrainSequence> sub(part.begin() + long(m0), part.begin() + long(m1));
      const size_t off = m0;
      train::LossFn sub_loss = [&, off](size_t i, const float* lp, const float* en, int64_t n, float* dl, float* de) {
        return loss(off + i, lp, en, n, dl, de);
      };
      std::vector<train::TokenScores> sub_scores;
      l += trainer_.accumulate(sub, sub_loss, to, mb == 0 ? &sub_scores : nullptr);
      for (auto& sc : sub_scores) scores.push_back(std::move(sc));
      trained_seqs += int64_t(m1 - m0);
      for (size_t k = m0; k < m1; ++k) trained_tokens += int64_t(part[k].tokens.size());
      bar.update(trained_seqs, trained_tokens);
    }
    if (in_.group.sum) {  // every rank must agree on skipping the step
      std::vector<double> v = {l};
      in_.group.sum(v);
      l = v[0];
    }
    if (mb == 0 && shortcut) {
      for (auto& sc : scores) first_lp.push_back(std::move(sc.logp));
      std::vector<std::vector<float>> rl(rollout_lp.begin() + long(sb), rollout_lp.begin() + long(se));
      mismatch = train::compute_mismatch(rl, first_lp);
      if (in_.group.sum && in_.group.max) {  // every rank's shard of the mini-batch
        train::MismatchStats& x = *mismatch;
        std::vector<double> v = {x.abs_diff_mean * double(x.samples), double(x.samples), x.kl_k3 * double(x.tokens),
                                 x.bitwise_equal_frac * double(x.tokens), double(x.tokens)};
        in_.group.sum(v);
        x.samples = int64_t(v[1]);
        x.tokens = int64_t(v[4]);
        x.abs_diff_mean = v[1] > 0 ? v[0] / v[1] : 0.0;
        x.kl_k3 = v[4] > 0 ? v[2] / v[4] : 0.0;
        x.bitwise_equal_frac = v[4] > 0 ? v[3] / v[4] : 1.0;
        x.abs_diff_max = in_.group.max(x.abs_diff_max);
      }
    }
    tot_tokens += part_tokens;
    if (!std::isfinite(l)) {
      std::fill(trainer_.grads(), trainer_.grads() + trainer_.layout().numel(), 0.0f);
      ++skipped;
      continue;
    }
    const train::OptimizerStats os = trainer_.step();
    grad_norm_sum += os.grad_norm;
    lr = os.lr;
    skipped += os.skipped ? 1 : 0;
  }
  bar.finish();
  t_train_ += t.seconds();
  if (in_.group.sum) {
    std::vector<double> v = {tot.pg_loss, tot.kl, tot.entropy, double(tot.clipped), tot.ratio_sum, tot.approx_kl};
    in_.group.sum(v);
    tot.pg_loss = v[0];
    tot.kl = v[1];
    tot.entropy = v[2];
    tot.clipped = int64_t(v[3]);
    tot.ratio_sum = v[4];
    tot.approx_kl = v[5];
  }
  const double tt = double(std::max<int64_t>(tot_tokens, 1));
  m["train/pg_loss"] = tot.pg_loss;
  m["train/entropy"] = tot.entropy;
  if (ref_) m["train/kl"] = tot.kl;
  m["train/pg_clipfrac"] = double(tot.clipped) / tt;
  m["train/ratio_mean"] = tot.ratio_sum / tt;
  m["train/ppo_kl"] = tot.approx_kl / tt;
  m["train/grad_norm"] = grad_norm_sum / double(std::max<int64_t>(n_mb - skipped, 1));
  m["train/lr"] = lr;
  m["train/skipped"] = skipped;
  m["train/num_updates"] = n_mb;
  m["train/samples"] = int64_t(seqs.size());
  m["train/tokens"] = total_tokens;
  if (a.rollout_is != IsLevel::None) {
    m["train/tis_clipfrac"] = double(is_corrected) / double(std::max<int64_t>(total_tokens, 1));
    m["train/tis_weight_mean"] = is_sum / double(std::max<int64_t>(total_tokens, 1));
  }
  if (mismatch) {
    m.update(mismatch->to_json());
  }
  std::vector<double> adv;
  for (auto& it : items) adv.push_back(groups[it.g].samples[it.s].advantage);
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
  const eval::EvalSummary s = evaluator_->run(gen, *in_.tok, in_.eval, &per);
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
  std::cout << ", truncated " << s.truncated_ratio << ", len " << s.response_len_mean << " (" << secs << " s)"
            << std::endl;
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
    }
  std::filesystem::create_directories(cfg_.out_dir + "/samples");
  data::write_jsonl_atomic(cfg_.out_dir + "/samples/" + step_name(step) + ".jsonl", lines);
}

RlResult Runner::run(bool resume) {
  RlResult result;
  Timer total;
  std::filesystem::create_directories(cfg_.out_dir);
  int64_t start = 0;
  const std::string metrics_path = cfg_.out_dir + "/metrics.jsonl";
  if (writer_ && !resume && std::filesystem::exists(metrics_path) && std::filesystem::file_size(metrics_path) > 0)
    LS_THROW << cfg_.out_dir << " already holds a run (" << metrics_path
             << "); continue it with --resume or choose another output directory";
  if (resume) {
    if (auto info = train::find_latest_checkpoint(cfg_.out_dir)) {
      train::load_checkpoint(*info, trainer_);
      start = info->step;
      cursor_ = info->state.value("prompt_cursor", uint64_t(0));
      sync_weights();
      if (writer_) std::cout << "rl: resumed from " << info->dir << " (step " << start << ")" << std::endl;
    } else {
      LS_LOG(Warn) << "--resume: no checkpoint in " << cfg_.out_dir << ", starting from step 0";
    }
  }
  version_step_[trainer_.version()] = start;
  std::unique_ptr<metrics::MetricsLogger> log;
  if (writer_) log = std::make_unique<metrics::MetricsLogger>(metrics_path, resume ? start : -1);
  if (start == 0 && evaluator_) {
    nlohmann::json m = nlohmann::json::object();
    run_eval(0, m, result);
    if (log) log->log(0, m);
    if (in_.on_step) in_.on_step(0, m);
  }
  for (int64_t step = start + 1; step <= cfg_.steps; ++step) {
    Timer step_timer;
    t_rollout_ = t_generate_ = t_wait_ = t_reward_ = t_old_ = t_ref_ = t_train_ = t_sync_ = 0;
    sync_bytes_ = 0;
    rollout_tokens_ = train_tokens_ = 0;
    nlohmann::json m = nlohmann::json::object();
    // 1-3. Rollout, rewards, dynamic-sampling filter.
    std::vector<Group> groups, all;
    int64_t tries = 0, filtered = 0;
    // Overlap: the next step's first round starts as soon as this step needs
    // the rollout no more (never past the last step), so it generates while
    // this step scores and trains.
    auto submit_next = [&] {
      if (overlap_ && step < cfg_.steps && !ahead_) submit_ahead();
    };
    while (int64_t(groups.size()) < cfg_.batch_size && tries < cfg_.algo.max_sampling_tries) {
      // Overlap: the first round was generated ahead (none on the first step
      // of a run); then the rollout is idle and gets the last update's weights
      // before it generates anything else.
      auto round = tries == 0 && ahead_ ? take_ahead() : rollout_round(cfg_.batch_size - int64_t(groups.size()));
      if (tries == 0 && overlap_) sync_if_stale();
      if (!cfg_.algo.dynamic_sampling) submit_next();  // no more rounds this step
      score_groups(round);
      ++tries;
      for (auto& g : round) {
        all.push_back(g);
        bool agree = true;
        for (auto& s : g.samples) agree = agree && !s.failed && s.reward == g.samples.front().reward;
        if (cfg_.algo.dynamic_sampling && agree) {
          ++filtered;
          continue;
        }
        groups.push_back(std::move(g));
      }
      if (!cfg_.algo.dynamic_sampling) break;
    }
    // Rollout metrics over every sample drawn this step (before filtering).
    std::vector<double> rewards, scores, lens;
    int64_t truncated = 0, failures = 0, correct = 0, n_samples = 0;
    for (auto& g : all)
      for (auto& s : g.samples) {
        ++n_samples;
        lens.push_back(double(s.output_ids.size()));
        truncated += s.finish_reason == "length" ? 1 : 0;
        if (s.failed) {
          ++failures;
          continue;
        }
        rewards.push_back(s.reward);
        scores.push_back(s.score);
        correct += s.correct ? 1 : 0;
      }
    m["rollout/reward_mean"] = mean_of(rewards);
    m["rollout/reward_std"] = std_of(rewards);
    m["rollout/score_mean"] = mean_of(scores);
    m["rollout/accuracy"] = double(correct) / double(std::max<int64_t>(n_samples, 1));
    m["rollout/response_len_mean"] = mean_of(lens);
    m["rollout/response_len_max"] = lens.empty() ? 0.0 : *std::max_element(lens.begin(), lens.end());
    m["rollout/truncated_ratio"] = double(truncated) / double(std::max<int64_t>(n_samples, 1));
    m["rollout/reward_failures"] = failures;
    m["rollout/num_samples"] = n_samples;
    m["rollout/sampling_tries"] = tries;
    m["rollout/filtered_groups"] = filtered;
    m["rollout/prompts_drawn"] = int64_t(all.size());
    if (int64_t(groups.size()) > cfg_.batch_size) groups.resize(size_t(cfg_.batch_size));
    submit_next();  // after dynamic sampling's extra rounds, which draw prompts first
    m["rollout/weight_staleness"] = staleness(groups.empty() ? all : groups, step);
    // 4-5. Advantages and update(s).
    if (groups.empty()) {
      LS_LOG(Warn) << "rl step " << step << ": every group was filtered (rewards all agree) after " << tries
                   << " tries; no update this step";
      m["train/skipped"] = 1;
    } else {
      m.update(update(groups));
    }
    version_step_[trainer_.version()] = step;
    if (version_step_.size() > 64) version_step_.erase(version_step_.begin());  // versions only grow
    // 6. Weight sync. Overlap: the rollout is generating the next batch and
    // takes the new weights after it (next step), unless an eval needs it
    // idle and on this step's weights now.
    const bool last = step == cfg_.steps;
    const bool eval_now = evaluator_ && (last || (cfg_.eval.interval > 0 && step % cfg_.eval.interval == 0));
    if (!overlap_) {
      sync_weights();
    } else if (eval_now) {
      collect_ahead();
      sync_if_stale();
    }
    const double t_sync = t_sync_;
    const double step_core = step_timer.seconds();
    m["perf/rollout_time_s"] = t_rollout_;
    m["perf/reward_time_s"] = t_reward_;
    m["perf/old_logprob_time_s"] = t_old_;
    if (ref_) m["perf/ref_logprob_time_s"] = t_ref_;
    m["perf/train_time_s"] = t_train_;
    m["perf/weight_sync_s"] = t_sync;
    if (sync_bytes_ > 0) m["perf/weight_sync_gb_per_s"] = double(sync_bytes_) / std::max(t_sync, 1e-9) * 1e-9;
    if (overlap_) m["perf/rollout_wait_time_s"] = t_wait_;
    m["perf/rollout_tokens_per_s"] = double(rollout_tokens_) / std::max(t_generate_, 1e-9);
    m["perf/train_tokens_per_s"] = double(train_tokens_) / std::max(t_train_ + t_old_, 1e-9);
    m["weight_version"] = trainer_.version();
    // 7. Eval, samples.
    if (eval_now) run_eval(step, m, result);
    if (writer_ && cfg_.log.samples_interval > 0 && (step % cfg_.log.samples_interval == 0 || last))
      write_samples(step, groups.empty() ? all : groups);
    m["perf/step_time_s"] = step_timer.seconds();
    if (m.contains("train/train_rollout_logprob_abs_diff")) {
      result.max_logprob_abs_diff =
          std::max(result.max_logprob_abs_diff, m["train/train_rollout_logprob_abs_diff"].get<double>());
      result.max_logprob_abs_diff_max =
          std::max(result.max_logprob_abs_diff_max, m["train/train_rollout_logprob_abs_diff_max"].get<double>());
    }
    phase_total_["rollout"] += t_rollout_;
    phase_total_["reward"] += t_reward_;
    phase_total_["old_logprob"] += t_old_;
    phase_total_["ref_logprob"] += t_ref_;
    phase_total_["train"] += t_train_;
    phase_total_["weight_sync"] += t_sync;
    phase_total_["other"] += step_core - (t_rollout_ + t_reward_ + t_old_ + t_ref_ + t_train_ + t_sync);
    if (log) log->log(step, m);
    ++result.steps_run;
    if (writer_ && cfg_.log_interval > 0 && (step % cfg_.log_interval == 0 || last)) {
      auto get = [&](const char* k) { return m.contains(k) && m[k].is_number() ? m[k].get<double>() : 0.0; };
      std::cout << metrics::format_console_line(step, {{"reward", get("rollout/reward_mean")},
                                                       {"acc", get("rollout/accuracy")},
                                                       {"len", get("rollout/response_len_mean")},
                                                       {"trunc", get("rollout/truncated_ratio")},
                                                       {"pg_loss", get("train/pg_loss")},
                                                       {"gap", get("train/train_rollout_logprob_abs_diff")},
                                                       {"grad_norm", get("train/grad_norm")},
                                                       {"s", get("perf/step_time_s")}})
                << std::endl;
    }
    if (in_.on_step) in_.on_step(step, m);
    // Checkpoint.
    const bool save_now = last || (cfg_.save_interval > 0 && step % cfg_.save_interval == 0);
    // Expert parallelism: every trainer of the writer's group sends its
    // experts' optimizer state (a collective; nothing otherwise).
    if (save_now) trainer_.prepare_checkpoint(writer_, cfg_.out_dir + "/checkpoints/optimizer.gathered");
    if (writer_ && save_now) {
      Timer ct;
      // Prompts generated ahead are not trained on yet: the cursor points
      // before them, so --resume draws them again (on the saved weights).
      const uint64_t cursor = ahead_ ? ahead_->cursor : cursor_;
      nlohmann::json state = {{"prompt_cursor", cursor}, {"data_seed", cfg_.seed}, {"kind", "rl"}};
      train::save_checkpoint(cfg_.out_dir, step, trainer_, state, in_.tokenizer_dir, cfg_.keep_last);
      phase_total_["checkpoint"] += ct.seconds();
    }
    if (writer_ && in_.after_step) in_.after_step(step);
  }
  LS_CHECK(!ahead_) << "rl: a batch generated ahead of the last step";
  result.seconds = total.seconds();
  for (auto& [k, v] : phase_total_)
    result.phase_seconds.push_back({k, result.steps_run ? v / double(result.steps_run) : 0.0});
  return result;
}

}  // namespace

RlResult run_rl(train::Trainer& trainer, const RlInputs& in, const RlConfig& cfg, bool resume) {
  cfg.algo.validate();
  Runner r(trainer, in, cfg);
  return r.run(resume);
}

}  // namespace lockstep::rl
