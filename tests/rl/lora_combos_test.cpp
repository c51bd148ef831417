// [lora] with the RL loop's other features: partial rollouts (older tokens
// rescored at their own version's adapters over the shared frozen base, gap
// 0 on every token) and PPO with a critic (the critic a full model started
// from the frozen base, the policy's adapters trained beside it, gap 0);
// expert parallelism refused with the reason.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>

#include "../common/small_models.h"
#include "../model/model_test_util.h"
#include "lockstep/data/jsonl.h"
#include "lockstep/metrics/metrics_logger.h"
#include "lockstep/model/params.h"
#include "lockstep/reward/reward.h"
#include "lockstep/rl/loop.h"
#include "lockstep/rl/partial_gap.h"
#include "lockstep/rl/partial_rollout.h"
#include "lockstep/tokenizer/byte_level.h"
#include "lockstep/train/trainer.h"

namespace lockstep::rl {
namespace {

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

struct Fixture {
  Fixture() : dir("rl-lora-combos") {
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
    c.trainer.optim.lr = 1e-2;
    c.trainer.micro_batch_tokens = 64;
    c.trainer.lora.rank = 4;
    c.trainer.lora.alpha = 8;
    c.trainer.lora.target_modules = {"all-linear"};
    c.trainer.lora.init_seed = 3;
    c.steps = 5;
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

// Samples written whose tokens came from more than one weight version.
int64_t samples_across_versions(const std::string& run) {
  int64_t multi = 0;
  for (const auto& e : std::filesystem::directory_iterator(run + "/samples"))
    for (const auto& line : data::read_jsonl(e.path().string())) {
      const auto v = line.value["versions"].get<std::vector<uint64_t>>();
      if (!v.empty() && v.front() != v.back()) ++multi;
    }
  return multi;
}

// Partial rollouts with [lora], aligned (on_gap = abort): samples finish on
// newer adapters than they started with, and every token, the older ones
// rescored at their own version's adapters, equals its rollout logprob bit
// for bit. Before the kept versions held their adapters, the older tokens
// were scored on the bare base and the run aborted at the first gap.
void check_partial_lora(const Fixture& f, RlConfig c) {
  c.partial.enabled = true;
  c.partial.token_budget = 32;  // 2 tokens a sample when 16 run: responses span steps
  c.partial.max_staleness = 3;
  c.algo.rollout_is = IsLevel::Token;
  auto t = f.trainer(c);
  const float* base = t->params();
  const std::vector<float> base0(base, base + f.layout->numel());
  const RlResult r = run_rl(*t, f.inputs(), c, false);
  EXPECT_EQ(r.steps_run, c.steps);
  EXPECT_EQ(r.max_logprob_abs_diff_max, 0.0);
  EXPECT_GT(t->version(), 1u);
  int64_t rescored = 0;
  for (const auto& s : metrics_of(c.out_dir)) {
    if (!s.contains("train/pg_loss")) continue;
    EXPECT_EQ(s["train/train_rollout_logprob_abs_diff_max"].get<double>(), 0.0);
    EXPECT_EQ(s["train/train_rollout_logprob_bitwise_equal_frac"].get<double>(), 1.0);
    EXPECT_EQ(s["train/partial_gap_left_out_tokens"].get<int64_t>(), 0);
    EXPECT_EQ(s["train/partial_gap_rescored_abs_diff_max"].get<double>(), 0.0);
    rescored += s["train/partial_gap_rescored_tokens"].get<int64_t>();
  }
  EXPECT_GT(rescored, 0) << "no trained token was of an older version: the test would not tell";
  EXPECT_GT(samples_across_versions(c.out_dir), 0);
  // The base stayed frozen, shared by every version's scoring.
  EXPECT_EQ(std::memcmp(base0.data(), t->params(), base0.size() * sizeof(float)), 0);
}

TEST(LoraCombos, PartialRolloutsScoreOlderTokensWithTheirVersionsAdapters) {
  Fixture f;
  check_partial_lora(f, f.config(f.dir.str("partial-f32")));
}

TEST(LoraCombos, PartialRolloutsOnABf16BaseKeepTheGapAtZero) {
  Fixture f;
  RlConfig c = f.config(f.dir.str("partial-bf16"));
  c.rollout.precision = "bf16";
  c.trainer.precision = DType::BF16;
  check_partial_lora(f, c);
}

// The kept versions of a LoRA trainer are its adapters only; the shared base
// scorer applies each version's own adapters (not the trainer's current
// ones): a version kept before a step scores as the trainer did then.
TEST(LoraCombos, AKeptVersionScoresAsTheTrainerDidAtThatVersion) {
  Fixture f;
  RlConfig c = f.config(f.dir.str("kept"));
  auto t = f.trainer(c);
  std::vector<train::TrainSequence> seqs(2);
  for (size_t i = 0; i < seqs.size(); ++i) {
    for (int32_t k = 0; k < 10 + int32_t(i); ++k) seqs[i].tokens.push_back((k * 7 + int32_t(i)) % 250 + 1);
    seqs[i].prompt_len = 4;
  }
  // Move the adapters off their start (B = 0 would make every version the base).
  float* a = t->lora()->params();
  for (int64_t i = 0; i < t->lora()->numel(); ++i) a[i] += 0.01f * float(i % 7) - 0.03f;
  std::vector<std::vector<float>> at1;
  for (auto& s : t->score(seqs, train::ScoreOptions{})) at1.push_back(s.logp);
  VersionScorers vs(*t);
  const uint64_t v1 = t->version();
  vs.keep(*t, {v1});
  ASSERT_EQ(vs.versions(), std::vector<uint64_t>{v1});
  for (int64_t i = 0; i < t->lora()->numel(); ++i) a[i] *= 1.5f;  // the trainer moves on
  std::vector<std::vector<float>> now;
  for (auto& s : t->score(seqs, train::ScoreOptions{})) now.push_back(s.logp);
  ASSERT_NE(now, at1) << "the adapters' change should move the logprobs";
  const std::vector<std::vector<uint64_t>> versions = {std::vector<uint64_t>(now[0].size(), v1),
                                                       std::vector<uint64_t>(now[1].size(), v1)};
  const VersionRescore r = vs.rescore(seqs, versions, now, v1 + 1, train::ScoreOptions{});
  EXPECT_EQ(r.rescored, int64_t(now[0].size() + now[1].size()));
  for (size_t i = 0; i < seqs.size(); ++i) {
    ASSERT_EQ(r.logprobs[i].size(), at1[i].size());
    EXPECT_EQ(std::memcmp(r.logprobs[i].data(), at1[i].data(), at1[i].size() * sizeof(float)), 0) << i;
  }
}

// PPO with a critic and [lora]: the critic is a full model of its own,
// started from the policy's frozen base, and trains fully; the policy trains
// its adapters only. The gap stays 0 and both train.
TEST(LoraCombos, GaeTrainsACriticBesideThePolicysAdapters) {
  Fixture f;
  RlConfig c = f.config(f.dir.str("gae"));
  c.rollout.sampling.stop_token_ids.clear();
  c.rollout.sampling.max_new_tokens = 6;
  c.batch_size = 3;
  c.rollout.sampling.n = 2;
  c.algo.advantage = Advantage::Gae;
  c.critic.critic.optim.lr = 1e-2;
  c.critic.critic.micro_batch_tokens = 48;
  c.steps = 3;
  auto t = f.trainer(c);
  const std::vector<float> base0(t->params(), t->params() + f.layout->numel());
  const RlResult r = run_rl(*t, f.inputs(), c, false);
  EXPECT_EQ(r.steps_run, 3);
  EXPECT_EQ(r.max_logprob_abs_diff_max, 0.0);
  const auto m = metrics_of(c.out_dir);
  ASSERT_EQ(m.size(), 3u);
  for (const auto& x : m) {
    EXPECT_EQ(x["train/train_rollout_logprob_abs_diff_max"], 0.0) << x.dump();
    ASSERT_TRUE(x.contains("critic/vf_loss")) << x.dump();
    EXPECT_TRUE(std::isfinite(x["critic/vf_loss"].get<double>()));
    EXPECT_EQ(x["critic/skipped"], 0);
  }
  EXPECT_NE(m[2]["critic/values_mean"], 0.0);  // the critic's head moved off zero
  EXPECT_GT(t->version(), 0u);
  EXPECT_EQ(std::memcmp(base0.data(), t->params(), base0.size() * sizeof(float)), 0) << "the base moved";
  train::LoraState start(Context{}, *f.layout, c.trainer.lora);  // the adapters as the run began
  EXPECT_NE(std::memcmp(start.params(), t->lora()->params(), size_t(start.numel()) * sizeof(float)), 0)
      << "the adapters did not train";
}

// Expert parallelism splits the experts over ranks; the adapters need every
// expert on the trainer: refused with the reason, before any exchange runs
// (`lockstep rl` and `sft` refuse expert_parallel > 1 earlier, from the config).
TEST(LoraCombos, ExpertParallelismIsRefusedWithTheReason) {
  Fixture f;
  auto t = f.trainer(f.config(f.dir.str("ep")));
  test::expect_error([&] { t->set_expert_comm(nullptr); }, {"[lora]", "expert parallelism"});
}

}  // namespace
}  // namespace lockstep::rl
