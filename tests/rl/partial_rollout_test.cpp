// Partial rollouts ([rollout] partial): samples paused at a step's token
// budget resume exactly where they stopped (same tokens and logprob bits as
// one uninterrupted generation when the weights do not change), every token
// matches the trainer at its own weight version bit for bit, groups too
// stale are discarded and counted, the config keys, and the RL loop end to
// end with samples finishing across steps.
#include "lockstep/rl/partial_rollout.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>

#include "../common/small_models.h"
#include "../model/model_test_util.h"
#include "lockstep/base/error.h"
#include "lockstep/data/jsonl.h"
#include "lockstep/metrics/metrics_logger.h"
#include "lockstep/model/params.h"
#include "lockstep/model/weights.h"
#include "lockstep/reward/reward.h"
#include "lockstep/rl/loop.h"
#include "lockstep/rl/rollout_backend.h"
#include "lockstep/tokenizer/byte_level.h"
#include "lockstep/train/checkpoint.h"
#include "lockstep/train/trainer.h"

namespace lockstep::rl {
namespace {

// The rollout engine on parameters the test sets, version by version.
class VersionedRollout : public RolloutBackend {
 public:
  VersionedRollout(const ModelConfig& cfg, const float* init)
      : layout_(cfg), params_(alloc_params(layout_)), weights_(ctx_, layout_, params_.as<float>()) {
    std::memcpy(params_.as<float>(), init, layout_.nbytes());
    weights_.refresh(ctx_, 0);
    rollout::EngineConfig ec;
    ec.num_blocks = 256;
    ec.block_size = 4;
    ec.max_prefill_chunk = 5;  // resumed prompts are prefilled in odd chunks
    engine_ = std::make_unique<rollout::Engine>(ctx_, &weights_, ec);
  }
  std::vector<rollout::RequestResult> generate(std::vector<rollout::Request> requests, const RolloutProgress&,
                                               int64_t* generated_tokens) override {
    const int64_t before = engine_->stats().generated_tokens;
    auto out = engine_->generate(std::move(requests));
    if (generated_tokens) *generated_tokens = engine_->stats().generated_tokens - before;
    return out;
  }
  void sync(train::Trainer&) override { LS_THROW << "the test sets the weights itself"; }
  bool aligned() const override { return true; }
  // Takes `params` as weight version `version`.
  void set(const float* params, uint64_t version) {
    std::memcpy(params_.as<float>(), params, layout_.nbytes());
    weights_.refresh(ctx_, version);
    engine_->update_weights(&weights_);
  }

 private:
  Context ctx_;
  ParamLayout layout_;
  Buffer params_;
  model::ModelWeights weights_;
  std::unique_ptr<rollout::Engine> engine_;
};

// A tiny model, its initial parameters and a few prompts.
struct Model {
  Model() : cfg(test::small_moe()), layout(cfg), init(alloc_params(layout)) {
    init_params(layout, init.as<float>(), 11, 0.3f);
  }
  // Version v's parameters: the initial ones, each scaled by a factor of its own.
  Buffer version(uint64_t v) const {
    Buffer p = alloc_params(layout);
    const float* a = init.as<float>();
    float* out = p.as<float>();
    for (size_t i = 0; i < size_t(layout.numel()); ++i)
      out[i] = a[i] * (1.0f + 0.05f * float(v) * float(int64_t(i * 2654435761u % 7) - 3));
    return p;
  }
  rollout::Request request(int64_t prompt, int64_t n, int64_t max_new_tokens,
                           std::vector<int32_t> stops = {}) const {
    rollout::Request r;
    for (int64_t t = 0; t < 3 + prompt; ++t) r.prompt_ids.push_back(int32_t((prompt * 13 + t * 7) % 90 + 1));
    r.params.n = n;
    r.params.seed = 1000 + prompt;
    r.params.max_new_tokens = max_new_tokens;
    r.params.stop_token_ids = std::move(stops);
    return r;
  }
  ModelConfig cfg;
  ParamLayout layout;
  Buffer init;
};

PartialConfig partial(int64_t budget, int64_t max_staleness) {
  PartialConfig p;
  p.enabled = true;
  p.token_budget = budget;
  p.max_staleness = max_staleness;
  return p;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Budget 9 over 6 samples: one token each, every sample paused after the
// first step. Budget 30: sub-rounds hand what early stops leave to the others.
TEST(PartialRollout, APausedSampleResumesAsIfItHadNeverStopped) {
  Model m;
  const std::vector<int32_t> stops = {5, 9, 17, 23, 31, 40, 44, 52, 63, 71};  // lengths vary
  for (int64_t budget : {9, 30}) {
    SCOPED_TRACE("budget " + std::to_string(budget));
    VersionedRollout backend(m.cfg, m.init.as<float>());
    PartialRollout pr(partial(budget, /*max_staleness=*/0), /*max_new_tokens=*/14,
                      m.cfg.max_position_embeddings);
    for (int64_t p = 0; p < 2; ++p) pr.add(size_t(p), m.request(p, 3, 14, stops));
    std::vector<PartialGroup> done;
    for (int r = 0; r < 20 && pr.in_flight() > 0; ++r) {
      for (auto& g : pr.round(backend, 0, {})) done.push_back(std::move(g));
      const PartialStats& st = pr.stats();
      if (r == 0 && budget == 9) {
        EXPECT_EQ(st.paused, 6);
        EXPECT_EQ(st.rounds, 1);
      }
      if (r == 0 && budget == 30) {
        EXPECT_GT(st.rounds, 1);
      }
      // Within the budget, and stopped only when what is left cannot give
      // every paused sample a token.
      EXPECT_LE(st.generated_tokens, budget);
      if (st.paused > 0) {
        EXPECT_LT(budget - st.generated_tokens, st.paused);
      }
    }
    ASSERT_EQ(done.size(), 2u);
    EXPECT_EQ(pr.in_flight(), 0);
    std::set<size_t> lengths;
    for (const auto& g : done)
      for (size_t i = 0; i < g.samples.size(); ++i) {
        const PartialSample& s = g.samples[i];
        lengths.insert(s.output_ids.size());
        // The same sample generated at once: its own request, its own seed.
        rollout::Request whole = m.request(int64_t(g.prompt), 1, 14, stops);
        whole.params.seed = sample_seed(1000 + int64_t(g.prompt), int64_t(i));
        std::vector<rollout::Request> reqs;
        reqs.push_back(std::move(whole));
        const auto ref = backend.generate(std::move(reqs), {}, nullptr);
        const rollout::SampleResult& r = ref[0].samples[0];
        EXPECT_EQ(s.output_ids, r.output_ids) << "prompt " << g.prompt << " sample " << i;
        EXPECT_TRUE(same_bits(s.logprobs, r.logprobs)) << "prompt " << g.prompt << " sample " << i;
        EXPECT_EQ(s.finish_reason, r.finish_reason);
        EXPECT_EQ(s.versions, std::vector<uint64_t>(s.output_ids.size(), 0));
      }
    EXPECT_GT(lengths.size(), 2u) << "the stop tokens should give samples of several lengths";
  }
}

// Weights change after every round: each token's rollout logprob is, bit for
// bit, the trainer's (train::Scorer) under the parameters of its own version.
TEST(PartialRollout, EveryTokenMatchesTheTrainerAtItsOwnVersion) {
  Model m;
  VersionedRollout backend(m.cfg, m.init.as<float>());
  const int64_t kMaxNew = 12;
  PartialRollout pr(partial(/*budget=*/12, /*max_staleness=*/8), kMaxNew, m.cfg.max_position_embeddings);
  for (int64_t p = 0; p < 2; ++p) pr.add(size_t(p), m.request(p, 2, kMaxNew));
  std::vector<Buffer> versions;
  std::vector<PartialGroup> done;
  for (uint64_t v = 0; pr.in_flight() > 0; ++v) {
    ASSERT_LT(v, 8u);
    versions.push_back(m.version(v));
    backend.set(versions.back().as<float>(), v);
    for (auto& g : pr.round(backend, v, {})) done.push_back(std::move(g));
  }
  ASSERT_EQ(done.size(), 2u);
  ASSERT_GE(versions.size(), 3u);  // a share of 3 tokens: 12 tokens take four versions
  std::vector<train::TrainSequence> seqs;
  std::vector<const PartialSample*> samples;
  for (const auto& g : done)
    for (const auto& s : g.samples) {
      train::TrainSequence t;
      t.tokens = g.request.prompt_ids;
      t.prompt_len = int32_t(t.tokens.size());
      t.tokens.insert(t.tokens.end(), s.output_ids.begin(), s.output_ids.end());
      seqs.push_back(std::move(t));
      samples.push_back(&s);
      EXPECT_GE(std::set<uint64_t>(s.versions.begin(), s.versions.end()).size(), 3u);
    }
  int64_t checked = 0, other_version_differs = 0;
  for (uint64_t v = 0; v < versions.size(); ++v) {
    Buffer copy = alloc_params(m.layout);
    std::memcpy(copy.as<float>(), versions[v].as<float>(), m.layout.nbytes());
    train::Scorer scorer(Context{}, m.cfg, std::move(copy), 64);
    const auto scores = scorer.score(seqs, train::ScoreOptions{});
    for (size_t i = 0; i < seqs.size(); ++i) {
      const PartialSample& s = *samples[i];
      ASSERT_EQ(scores[i].logp.size(), s.logprobs.size());
      for (size_t t = 0; t < s.logprobs.size(); ++t) {
        const bool equal = std::memcmp(&scores[i].logp[t], &s.logprobs[t], sizeof(float)) == 0;
        if (s.versions[t] == v) {
          EXPECT_TRUE(equal) << "sample " << i << " token " << t << " of version " << v << ": trainer "
                             << scores[i].logp[t] << ", rollout " << s.logprobs[t];
          ++checked;
        } else {
          other_version_differs += equal ? 0 : 1;
        }
      }
    }
  }
  EXPECT_EQ(checked, 4 * kMaxNew);  // every token, once, at its own version
  EXPECT_GT(other_version_differs, 0) << "the versions' weights should give other logprobs";
}

TEST(PartialRollout, AGroupTooStaleIsDiscardedAndCounted) {
  Model m;
  for (int64_t bound : {0, 1}) {
    VersionedRollout backend(m.cfg, m.init.as<float>());
    PartialRollout pr(partial(/*budget=*/16, bound), /*max_new_tokens=*/8, m.cfg.max_position_embeddings);
    for (int64_t p = 0; p < 2; ++p) pr.add(size_t(p), m.request(p, 2, 8));
    EXPECT_TRUE(pr.round(backend, 0, {}).empty());  // 4 tokens each of 8: all paused
    EXPECT_EQ(pr.stats().paused, 4);
    const Buffer v1 = m.version(1);
    backend.set(v1.as<float>(), 1);
    const auto done = pr.round(backend, 1, {});
    const PartialStats& st = pr.stats();
    if (bound == 0) {  // the tokens of version 0 would train under version 1
      EXPECT_TRUE(done.empty());
      EXPECT_EQ(st.discarded_groups, 2);
      EXPECT_EQ(st.discarded_samples, 4);
      EXPECT_EQ(st.generated_tokens, 0);
    } else {
      ASSERT_EQ(done.size(), 2u);
      EXPECT_EQ(st.discarded_groups, 0);
      EXPECT_EQ(st.resumed_tokens, 16);
      EXPECT_EQ(st.staleness_tokens, (std::vector<int64_t>{16, 16}));
      const nlohmann::json j = st.to_json();
      EXPECT_EQ(j["rollout/token_staleness_1"], 16);
      EXPECT_EQ(j["rollout/token_staleness_max"], 1);
      EXPECT_EQ(j["rollout/token_staleness_mean"].get<double>(), 0.5);
    }
    EXPECT_EQ(pr.in_flight(), 0);
  }
}

TEST(PartialRollout, TheGapLeavesOutOtherVersionsAtTheirPositions) {
  const std::vector<std::vector<float>> rollout = {{1, 2, 3}, {4, 5}}, trainer = {{1, 9, 3}, {7, 5}};
  const std::vector<std::vector<uint64_t>> versions = {{1, 0, 1}, {}};
  int64_t left_out = 0;
  EXPECT_EQ(tokens_of_version(trainer, versions, 1, &left_out),
            (std::vector<std::vector<float>>{{1, 3}, {7, 5}}));
  EXPECT_EQ(left_out, 1);
  EXPECT_EQ(other_versions_as_rollout(trainer, rollout, versions, 1),
            (std::vector<std::vector<float>>{{1, 2, 3}, {7, 5}}));
}

TEST(PartialRollout, ConfigKeysAndTheSettingsTheyRefuse) {
  const std::string base = "[rollout]\nbatch_size = 2\nn = 2\nmax_new_tokens = 16\n";
  auto config = [&](const std::vector<std::string>& sets) {
    toml::table t = parse_toml_with_overrides(base, "rl.toml", sets);
    return rl_config_from_toml(t, "rl.toml");
  };
  EXPECT_FALSE(config({}).partial.enabled);
  const RlConfig c =
      config({"rollout.partial=true", "rollout.partial_token_budget=40", "rollout.partial_max_staleness=3"});
  EXPECT_TRUE(c.partial.enabled);
  EXPECT_EQ(c.partial.token_budget, 40);
  EXPECT_EQ(c.partial.max_staleness, 3);
  EXPECT_TRUE(c.partial.gap_all);
  EXPECT_FALSE(config({"rollout.partial=true", "rollout.partial_gap=\"current\""}).partial.gap_all);
  test::expect_error(
      [&] {
        config({"rollout.partial=true", "rollout.partial_gap=\"some\""});
      },
      {"rl.toml", "partial_gap", "all, current"});
  test::expect_error([&] { config({"rollout.partial_gap=\"all\""}); },
                     {"rl.toml", "partial_gap", "partial = true"});
  test::expect_error([&] { config({"rollout.partial_token_budget=40"}); },
                     {"rl.toml", "partial_token_budget", "partial = true"});
  test::expect_error(
      [&] {
        config({"rollout.partial=true", "rollout.partial_token_budget=0"});
      },
      {"partial_token_budget"});
  test::expect_error(
      [&] {
        config({"rollout.partial=true", "rollout.partial_max_staleness=33"});
      },
      {"partial_max_staleness"});
  test::expect_error(
      [&] {
        config({"rollout.partial=true", "algo.dynamic_sampling=true"});
      },
      {"rl.toml", "dynamic_sampling"});
  test::expect_error(
      [&] {
        config({"rollout.partial=true", "rollout.repetition_penalty=1.2"});
      },
      {"repetition_penalty"});
}

// ---------------------------------------------------------------- the loop

// Correct (reward 1) when the response has an even number of bytes.
class EvenLength : public reward::Reward {
 public:
  reward::RewardResult evaluate(const reward::RewardRequest& q) const override {
    reward::RewardResult r;
    r.correct = q.response.size() % 2 == 0;
    r.reward = r.correct ? 1.0 : 0.0;
    return r;
  }
  std::string type() const override { return "even"; }
};

struct LoopFixture {
  LoopFixture() : dir("rl-partial") {
    tokenizer::write_byte_level_tokenizer(dir.str("tok"));
    tok.emplace(tokenizer::Tokenizer::load(dir.str("tok")));
    cfg = test::small_moe();
    cfg.vocab_size = 260;
    cfg.max_position_embeddings = 128;
    cfg.eos_token_ids = {258};
    layout.emplace(cfg);
    init = alloc_params(*layout);
    init_params(*layout, init.as<float>(), 5, 0.3f);
    for (int i = 0; i < 16; ++i) {
      data::PromptExample ex;
      ex.line = i + 1;
      ex.prompt_text = "question " + std::to_string(i) + ":";
      ex.prompt_ids = tok->encode(ex.prompt_text, false);
      ex.label = i;
      train.push_back(std::move(ex));
    }
  }
  RlConfig config(const std::string& out) const {
    RlConfig c;
    c.batch_size = 4;
    c.rollout.sampling.n = 4;
    c.rollout.sampling.max_new_tokens = 12;
    // A third of the bytes end a response: lengths from 1 to 12 tokens.
    for (int32_t t = 0; t < 256; t += 3) c.rollout.sampling.stop_token_ids.push_back(t);
    c.rollout.engine.num_blocks = 256;
    c.rollout.engine.block_size = 4;
    c.partial = partial(/*budget=*/32, /*max_staleness=*/3);  // 2 tokens a sample when 16 run
    c.trainer.optim.lr = 1e-2;
    c.trainer.micro_batch_tokens = 64;
    c.steps = 6;
    c.seed = 9;
    c.checkpoints = false;
    c.reward.threads = 1;
    c.log.progress = false;
    c.log_interval = 0;
    c.log.samples_per_step = 64;
    c.out_dir = out;
    return c;
  }
  RlInputs inputs() const {
    RlInputs in;
    in.tok = &*tok;
    in.train = train;
    in.tokenizer_dir = dir.str("tok");
    in.reward = std::make_shared<EvenLength>();
    return in;
  }
  std::unique_ptr<train::Trainer> trainer(const RlConfig& c) const {
    Buffer p = alloc_params(*layout);
    std::memcpy(p.as<float>(), init.as<float>(), layout->nbytes());
    return std::make_unique<train::Trainer>(Context{}, cfg, std::move(p), c.trainer);
  }
  test::TempDir dir;
  std::optional<tokenizer::Tokenizer> tok;
  ModelConfig cfg;
  std::optional<ParamLayout> layout;
  Buffer init;
  std::vector<data::PromptExample> train;
};

std::vector<nlohmann::json> metrics_of(const std::string& run) {
  int bad = 0;
  auto m = metrics::read_metrics(run + "/metrics.jsonl", &bad);
  EXPECT_EQ(bad, 0);
  return m;
}

// One run of the long-samples test below: its per-step checks; the trained
// steps' pg_loss appended to *pg_loss.
void check_long_samples_run(const LoopFixture& f, const RlConfig& c, std::vector<double>& pg_loss) {
  auto t = f.trainer(c);
  const RlResult r = run_rl(*t, f.inputs(), c, false);
  EXPECT_EQ(r.steps_run, 6);
  EXPECT_EQ(r.max_logprob_abs_diff_max, 0.0);
  EXPECT_GT(t->version(), 1u);
  const auto m = metrics_of(c.out_dir);
  ASSERT_EQ(m.size(), 6u);
  int64_t paused = 0, resumed = 0, left_out = 0, covered = 0, trained_steps = 0, stale_tokens = 0;
  for (const auto& s : m) {
    paused += s["rollout/partial_paused"].get<int64_t>();
    resumed += s["rollout/partial_resumed_tokens"].get<int64_t>();
    EXPECT_LE(s["rollout/token_staleness_max"].get<int64_t>(), 3);
    int64_t step_stale = 0;  // tokens of older versions in the groups that finished (and train)
    for (int k = 1; k <= 3; ++k)
      step_stale += s["rollout/token_staleness_" + std::to_string(k)].get<int64_t>();
    stale_tokens += step_stale;
    // The batch stays in flight: finished, still running or discarded, batch_size groups each step.
    EXPECT_EQ(s["rollout/partial_in_flight_groups"].get<int64_t>() +
                  s["rollout/partial_finished_groups"].get<int64_t>() +
                  s["rollout/partial_discarded_groups"].get<int64_t>(),
              c.batch_size);
    if (!s.contains("train/pg_loss")) continue;
    ++trained_steps;
    pg_loss.push_back(s["train/pg_loss"].get<double>());
    // The older tokens are the ones "all" rescores at their own version and
    // "current" leaves out, and they rule out the on-policy shortcut.
    // Importance weights come from each token's own rollout logprob: exactly
    // 1 for the trainer's version's tokens (aligned), not for the older ones.
    if (c.partial.gap_all) {
      EXPECT_EQ(s["train/partial_gap_left_out_tokens"].get<int64_t>(), 0);
      EXPECT_EQ(s["train/partial_gap_rescored_tokens"].get<int64_t>(), step_stale);
      EXPECT_EQ(s["train/partial_gap_rescored_abs_diff_max"].get<double>(), 0.0);
      // One copy per older version a token may still have: at most partial_max_staleness.
      EXPECT_LE(s["train/partial_gap_versions_kept"].get<int64_t>(), c.partial.max_staleness);
      covered += s["train/partial_gap_rescored_tokens"].get<int64_t>();
    } else {
      EXPECT_EQ(s["train/partial_gap_left_out_tokens"].get<int64_t>(), step_stale);
      EXPECT_FALSE(s.contains("train/partial_gap_rescored_tokens"));
      left_out += s["train/partial_gap_left_out_tokens"].get<int64_t>();
    }
    if (step_stale == 0) {
      EXPECT_EQ(s["train/tis_weight_mean"].get<double>(), 1.0);
    } else {
      EXPECT_NE(s["train/tis_weight_mean"].get<double>(), 1.0);
      EXPECT_EQ(s["train/on_policy_shortcut"], 0);
    }
    EXPECT_EQ(s["train/train_rollout_logprob_abs_diff_max"].get<double>(), 0.0);
    EXPECT_EQ(s["train/train_rollout_logprob_bitwise_equal_frac"].get<double>(), 1.0);
  }
  EXPECT_GT(paused, 0);
  EXPECT_GT(resumed, 0);
  EXPECT_GT(stale_tokens, 0);
  EXPECT_GT(c.partial.gap_all ? covered : left_out, 0)
      << "some trained sample should hold tokens of an older version";
  EXPECT_GE(trained_steps, 3);
  // samples/*.jsonl: every token's version, some samples of several.
  int64_t multi = 0, lines = 0;
  for (const auto& e : std::filesystem::directory_iterator(c.out_dir + "/samples"))
    for (const auto& line : data::read_jsonl(e.path().string())) {
      const auto& j = line.value;
      ++lines;
      ASSERT_TRUE(j.contains("versions"));
      const auto v = j["versions"].get<std::vector<uint64_t>>();
      EXPECT_EQ(int64_t(v.size()), j["response_len"].get<int64_t>());
      EXPECT_TRUE(std::is_sorted(v.begin(), v.end()));
      EXPECT_LE(v.back() - v.front(), 3u);
      multi += v.front() != v.back() ? 1 : 0;
    }
  EXPECT_GT(lines, 0);
  EXPECT_GT(multi, 0);
}

// Responses longer than a step's share finish over several steps on newer
// weights; aligned mode (on_gap = abort) checks every token bit for bit at
// its own version (partial_gap = "all", the default), or the trainer's
// version's tokens only ("current", the others counted as left out); the
// run trains, the same way in both.
TEST(PartialRolloutLoop, LongSamplesFinishAcrossStepsWithEveryTokensVersion) {
  LoopFixture f;
  std::vector<double> pg_loss[2];
  for (bool all : {true, false}) {
    SCOPED_TRACE(all ? "partial_gap = all" : "partial_gap = current");
    RlConfig c = f.config(f.dir.str(all ? "run" : "run-current"));
    c.algo.rollout_is = IsLevel::Token;
    c.partial.gap_all = all;
    check_long_samples_run(f, c, pg_loss[all ? 0 : 1]);
  }
  EXPECT_EQ(pg_loss[0], pg_loss[1]) << "the gap mode measures only; training is the same";
}

// Fast mode (bf16 rollout, f32 trainer): the rollout's own packed weights
// carry the trainer's version, the gap is measured (not zero) on every
// token, the older ones at their own version too, and TIS corrects every
// token.
TEST(PartialRolloutLoop, FastModeMeasuresTheGapOnEveryTokenAtItsVersion) {
  LoopFixture f;
  RlConfig c = f.config(f.dir.str("bf16"));
  c.rollout.precision = "bf16";
  c.rollout.engine.bf16_kv = true;
  c.algo.rollout_is = IsLevel::Token;
  c.partial.token_budget = 20;  // fewer tokens a step: groups finish in different steps
  auto t = f.trainer(c);
  const RlResult r = run_rl(*t, f.inputs(), c, false);
  EXPECT_GT(r.max_logprob_abs_diff, 0.0);
  int64_t rescored = 0, trained = 0, older_gap_steps = 0;
  for (const auto& s : metrics_of(c.out_dir)) {
    if (!s.contains("train/pg_loss")) continue;
    ++trained;
    EXPECT_EQ(s["train/partial_gap_left_out_tokens"].get<int64_t>(), 0);
    const int64_t n = s["train/partial_gap_rescored_tokens"].get<int64_t>();
    rescored += n;
    const double older = s["train/partial_gap_rescored_abs_diff"].get<double>();
    EXPECT_EQ(older > 0.0, n > 0) << "step " << s["step"];
    EXPECT_LT(older, 0.1);
    older_gap_steps += older > 0.0 ? 1 : 0;
    EXPECT_GT(s["train/train_rollout_logprob_abs_diff"].get<double>(), 0.0);
    EXPECT_LT(s["train/train_rollout_logprob_abs_diff"].get<double>(), 0.1);
    EXPECT_EQ(s["train/on_policy_shortcut"], 0);
    EXPECT_TRUE(s.contains("train/tis_weight_mean"));
  }
  EXPECT_GE(trained, 3);
  EXPECT_GT(rescored, 0);
  EXPECT_GT(older_gap_steps, 0);
}

// The colocated engine with each sample's tokens forced: prompt i's samples
// are lengths[i] tokens long (the last one EOS), their content drawn from the
// sample's seed. The logprobs are the engine's own, on the trainer's weights.
class ForcedRollout : public LocalRollout {
 public:
  ForcedRollout(train::Trainer& trainer, const RlConfig& c, const std::vector<data::PromptExample>& prompts,
                std::vector<int64_t> lengths)
      : LocalRollout(trainer, c.rollout, c.seed), prompts_(prompts), lengths_(std::move(lengths)) {}
  std::vector<rollout::RequestResult> generate(std::vector<rollout::Request> requests,
                                               const RolloutProgress& progress,
                                               int64_t* generated_tokens) override {
    for (auto& r : requests) {
      const size_t p = prompt_of(r.prompt_ids);
      const size_t done = r.prompt_ids.size() - prompts_[p].prompt_ids.size();
      for (size_t t = done; t < size_t(lengths_[p]); ++t)
        r.forced_output.push_back(
            t + 1 == size_t(lengths_[p]) ? 258 : int32_t(40 + (uint64_t(r.params.seed) * 7 + t) % 50));
    }
    return LocalRollout::generate(std::move(requests), progress, generated_tokens);
  }

 private:
  // The training prompt the request continues (no prompt is a prefix of another).
  size_t prompt_of(const std::vector<int32_t>& ids) const {
    for (size_t p = 0; p < prompts_.size(); ++p) {
      const auto& q = prompts_[p].prompt_ids;
      if (q.size() <= ids.size() && std::equal(q.begin(), q.end(), ids.begin())) return p;
    }
    LS_THROW << "a request that continues no training prompt";
  }
  const std::vector<data::PromptExample>& prompts_;
  std::vector<int64_t> lengths_;
};

// Rewarded by a hash of the response: samples of one group differ.
class HashParity : public reward::Reward {
 public:
  reward::RewardResult evaluate(const reward::RewardRequest& q) const override {
    reward::RewardResult r;
    r.correct = std::hash<std::string>{}(q.response) % 2 == 0;
    r.reward = r.correct ? 1.0 : 0.0;
    return r;
  }
  std::string type() const override { return "hash-parity"; }
};

// Every sample of a group ends in the same step (forced lengths): a group
// that trains holds tokens of this step's version and, when it ran over
// several steps, older ones. Those rule out the on-policy shortcut (a sample's
// version is its oldest token's), and exactly them the gap rescores at their
// own version.
TEST(PartialRolloutLoop, OlderTokensRuleOutTheOnPolicyShortcut) {
  LoopFixture f;
  RlConfig c = f.config(f.dir.str("forced"));
  c.batch_size = 2;
  c.rollout.sampling.n = 2;
  c.rollout.sampling.max_new_tokens = 8;
  c.rollout.sampling.stop_token_ids.clear();
  c.partial = partial(/*budget=*/8, /*max_staleness=*/3);
  c.algo.rollout_is = IsLevel::Token;
  auto t = f.trainer(c);
  RlInputs in = f.inputs();
  in.reward = std::make_shared<HashParity>();
  std::vector<int64_t> lengths;
  for (size_t p = 0; p < f.train.size(); ++p) lengths.push_back(p % 3 == 0 ? 6 : 2);
  in.rollout = std::make_shared<ForcedRollout>(*t, c, f.train, lengths);
  run_rl(*t, in, c, false);
  int64_t stale_steps = 0, fresh_steps = 0;
  for (const auto& s : metrics_of(c.out_dir)) {
    if (!s.contains("train/pg_loss")) continue;
    int64_t stale = 0;
    for (int k = 1; k <= 3; ++k) stale += s["rollout/token_staleness_" + std::to_string(k)].get<int64_t>();
    EXPECT_EQ(s["train/partial_gap_left_out_tokens"].get<int64_t>(), 0) << "step " << s["step"];
    EXPECT_EQ(s["train/partial_gap_rescored_tokens"].get<int64_t>(), stale) << "step " << s["step"];
    EXPECT_EQ(s["train/on_policy_shortcut"], stale > 0 ? 0 : 1) << "step " << s["step"];
    EXPECT_EQ(s["train/train_rollout_logprob_abs_diff_max"].get<double>(), 0.0);
    (stale > 0 ? stale_steps : fresh_steps) += 1;
  }
  EXPECT_GT(stale_steps, 0);
  EXPECT_GT(fresh_steps, 0);
}

// ForcedRollout with a planted fault: the last logprob of every sample paused
// at its share is one ulp off. Such a token trains at an older version than
// the trainer's when an update ran before its sample finished.
class NudgePaused : public ForcedRollout {
 public:
  using ForcedRollout::ForcedRollout;
  std::vector<rollout::RequestResult> generate(std::vector<rollout::Request> requests,
                                               const RolloutProgress& progress,
                                               int64_t* generated_tokens) override {
    auto out = ForcedRollout::generate(std::move(requests), progress, generated_tokens);
    for (auto& r : out)
      for (auto& s : r.samples)
        if (s.finish_reason == "length" && !s.logprobs.empty())
          s.logprobs.back() = std::nextafter(s.logprobs.back(), 0.0f);
    return out;
  }
};

// The gap check covers the older tokens: on_gap = "abort" stops the step
// naming the token; with "warn" the rescored tokens' own mismatch shows it.
TEST(PartialRolloutLoop, AnOlderTokensGapIsFound) {
  LoopFixture f;
  for (RlConfig::OnGap on_gap : {RlConfig::OnGap::Abort, RlConfig::OnGap::Warn}) {
    const bool abort = on_gap == RlConfig::OnGap::Abort;
    SCOPED_TRACE(abort ? "abort" : "warn");
    RlConfig c = f.config(f.dir.str(abort ? "fault" : "fault-warn"));
    c.on_gap = on_gap;
    c.batch_size = 2;
    c.rollout.sampling.n = 2;
    c.rollout.sampling.max_new_tokens = 8;  // the forced lengths end before it: "length" is a pause
    c.rollout.sampling.stop_token_ids.clear();
    c.partial = partial(/*budget=*/8, /*max_staleness=*/3);
    auto t = f.trainer(c);
    RlInputs in = f.inputs();
    in.reward = std::make_shared<HashParity>();
    std::vector<int64_t> lengths;
    for (size_t p = 0; p < f.train.size(); ++p) lengths.push_back(p % 3 == 0 ? 6 : 2);
    in.rollout = std::make_shared<NudgePaused>(*t, c, f.train, lengths);
    if (abort) {
      test::expect_error([&] { run_rl(*t, in, c, false); },
                         {"differs from the rollout's", "sample", "response token", "on_gap"});
      continue;
    }
    run_rl(*t, in, c, false);
    int64_t older_gap_steps = 0;
    for (const auto& s : metrics_of(c.out_dir)) {
      if (!s.contains("train/pg_loss")) continue;
      const double d = s["train/partial_gap_rescored_abs_diff_max"].get<double>();
      EXPECT_LT(d, 1e-5);  // one ulp
      older_gap_steps += d > 0.0 ? 1 : 0;
    }
    EXPECT_GT(older_gap_steps, 0) << "no nudged token trained at an older version";
  }
}

// A checkpoint while samples are paused: they are not saved; the resumed run
// starts with none in flight and draws a whole batch.
TEST(PartialRolloutLoop, ResumeDropsThePausedSamples) {
  LoopFixture f;
  RlConfig c = f.config(f.dir.str("resume"));
  c.checkpoints = true;
  c.save_interval = 2;
  c.steps = 2;
  {
    auto t = f.trainer(c);
    run_rl(*t, f.inputs(), c, false);
  }
  const auto before = metrics_of(c.out_dir);
  ASSERT_EQ(before.size(), 2u);
  ASSERT_GT(before[1]["rollout/partial_in_flight_groups"].get<int64_t>(), 0)
      << "nothing paused at the checkpoint";
  c.steps = 3;
  auto t = f.trainer(c);
  const RlResult r = run_rl(*t, f.inputs(), c, true);
  EXPECT_EQ(r.steps_run, 1);
  const auto after = metrics_of(c.out_dir);
  ASSERT_EQ(after.size(), 3u);
  EXPECT_LT(before[1]["rollout/partial_new_groups"].get<int64_t>(), c.batch_size);
  EXPECT_EQ(after[2]["rollout/partial_new_groups"], c.batch_size);
  EXPECT_EQ(after[2]["rollout/partial_resumed_tokens"], 0);
  EXPECT_EQ(after[2]["rollout/token_staleness_1"], 0);
}

}  // namespace
}  // namespace lockstep::rl
