// PPO with a critic ([algo] advantage = "gae") through the RL loop on a tiny
// random MoE model: the gap stays 0 at every step, the critic trains (its
// metrics are written and its values move), per-token advantages reach the
// samples, the checkpoint holds the critic, and what is refused says why.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>

#include "../model/model_test_util.h"
#include "lockstep/base/error.h"
#include "lockstep/metrics/metrics_logger.h"
#include "lockstep/model/params.h"
#include "lockstep/model/pretrained.h"
#include "lockstep/reward/reward.h"
#include "lockstep/rl/loop.h"
#include "lockstep/tokenizer/byte_level.h"

namespace lockstep::rl {
namespace {

// Reward 1 for a response of an even number of bytes.
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

// Rank 0 of two trainer ranks (the critic refuses before any collective runs).
class TwoRanks final : public TrainerGroup {
 public:
  int ranks() const override { return 2; }
  int rank() const override { return 0; }
  bool writer() const override { return true; }
  std::pair<size_t, size_t> shard(size_t n) const override { return {0, n / 2}; }
  void sum(double*, size_t) override {}
  double max(double x) override { return x; }
  std::vector<std::string> gather_strings(const std::string& mine) override { return {mine, mine}; }
};

struct Fixture {
  Fixture() : dir("ppo-loop") {
    tokenizer::write_byte_level_tokenizer(dir.str("tok"));
    tok.emplace(tokenizer::Tokenizer::load(dir.str("tok")));
    cfg.architecture = Architecture::Qwen3Moe;
    cfg.vocab_size = 260;
    cfg.hidden_size = 32;
    cfg.num_layers = 2;
    cfg.num_heads = 4;
    cfg.num_kv_heads = 2;
    cfg.head_dim = 8;
    cfg.qk_norm = true;
    cfg.num_experts = 4;
    cfg.num_experts_per_tok = 2;
    cfg.moe_intermediate_size = 24;
    cfg.norm_topk_prob = true;
    cfg.max_position_embeddings = 128;
    cfg.eos_token_ids = {258};
    layout.emplace(cfg);
    init = alloc_params(*layout);
    init_params(*layout, init.as<float>(), 5, 0.3f);
    for (int i = 0; i < 9; ++i) {
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
    c.batch_size = 3;
    c.rollout.sampling.n = 2;
    c.rollout.sampling.max_new_tokens = 6;
    c.rollout.engine.num_blocks = 256;
    c.rollout.engine.block_size = 4;
    c.trainer.optim.lr = 1e-2;
    c.trainer.micro_batch_tokens = 64;
    c.algo.advantage = Advantage::Gae;
    c.algo.num_steps_per_rollout = 2;
    c.critic.critic.optim.lr = 1e-2;
    c.critic.critic.micro_batch_tokens = 48;
    c.steps = 3;
    c.seed = 9;
    c.save_interval = 3;
    c.reward.threads = 1;
    c.log.progress = false;
    c.log_interval = 0;
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

TEST(PpoLoop, TrainsPolicyAndCriticWithAGapOfZero) {
  Fixture f;
  const RlConfig c = f.config(f.dir.str("run"));
  auto t = f.trainer(c);
  const RlResult r = run_rl(*t, f.inputs(), c, false);
  EXPECT_EQ(r.steps_run, 3);
  EXPECT_EQ(r.max_logprob_abs_diff_max, 0.0);
  int bad = 0;
  const auto m = metrics::read_metrics(c.out_dir + "/metrics.jsonl", &bad);
  ASSERT_EQ(bad, 0);
  ASSERT_EQ(m.size(), 3u);
  for (const auto& x : m) {
    EXPECT_EQ(x["train/train_rollout_logprob_abs_diff_max"], 0.0) << x.dump();
    EXPECT_EQ(x["train/num_updates"], 2);
    for (const char* k :
         {"critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/vf_explained_var",
          "critic/grad_norm", "critic/lr", "critic/values_mean", "critic/returns_mean"}) {
      ASSERT_TRUE(x.contains(k)) << k << " in " << x.dump();
      EXPECT_TRUE(std::isfinite(x[k].get<double>())) << k;
    }
    EXPECT_EQ(x["critic/skipped"], 0);
    EXPECT_GT(x["critic/vf_loss"].get<double>(), 0.0);
  }
  // The head starts at zero: the first step's old values are all 0, later ones not.
  EXPECT_EQ(m[0]["critic/values_mean"], 0.0);
  EXPECT_NE(m[2]["critic/values_mean"], 0.0);
  EXPECT_NE(t->version(), 0u);
  for (const char* file : {"model.safetensors", "value_head.safetensors", "optimizer.bin",
                           "value_head_optimizer.safetensors", "config.json"})
    EXPECT_TRUE(std::filesystem::is_regular_file(c.out_dir + "/checkpoints/step_3/critic/" + file)) << file;
}

TEST(PpoLoop, CriticPathStartsFromASavedCriticWithItsHead) {
  Fixture f;
  RlConfig first = f.config(f.dir.str("first"));
  first.steps = 1;
  first.save_interval = 1;
  {
    auto t = f.trainer(first);
    run_rl(*t, f.inputs(), first, false);
  }
  // The saved critic/ folder is a Hugging Face directory with the value head:
  // a new run's critic starts from it, so its first old values are not the
  // zero head's.
  RlConfig second = f.config(f.dir.str("second"));
  second.steps = 1;
  second.critic.path = first.out_dir + "/checkpoints/step_1/critic";
  auto t = f.trainer(second);
  run_rl(*t, f.inputs(), second, false);
  int bad = 0;
  const auto m = metrics::read_metrics(second.out_dir + "/metrics.jsonl", &bad);
  ASSERT_EQ(m.size(), 1u);
  EXPECT_NE(m[0]["critic/values_mean"], 0.0);
  // A critic over another vocabulary cannot read the policy's tokens.
  ModelConfig other = f.cfg;
  other.vocab_size = 300;
  ParamLayout ol(other);
  Buffer op = alloc_params(ol);
  init_params(ol, op.as<float>(), 3, 0.1f);
  save_pretrained(f.dir.str("other"), other, ol, op.as<float>());
  second.critic.path = f.dir.str("other");
  second.out_dir = f.dir.str("third");
  auto t3 = f.trainer(second);
  try {
    run_rl(*t3, f.inputs(), second, false);
    FAIL() << "a critic with another vocabulary was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vocabulary"), std::string::npos) << e.what();
  }
}

TEST(PpoLoop, RefusesMoreThanOneTrainerRankAndAResumeWithoutACritic) {
  Fixture f;
  {
    RlConfig c = f.config(f.dir.str("two"));
    auto t = f.trainer(c);
    RlInputs in = f.inputs();
    in.group = std::make_shared<TwoRanks>();
    try {
      run_rl(*t, in, c, false);
      FAIL() << "two trainer ranks with a critic were accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("one trainer rank"), std::string::npos) << e.what();
    }
  }
  // A GRPO run's checkpoint has no critic/: PPO refuses to resume from it.
  RlConfig grpo = f.config(f.dir.str("grpo"));
  grpo.algo.advantage = Advantage::Grpo;
  grpo.steps = 1;
  grpo.save_interval = 1;
  {
    auto t = f.trainer(grpo);
    run_rl(*t, f.inputs(), grpo, false);
  }
  RlConfig ppo = f.config(f.dir.str("grpo"));
  ppo.steps = 2;
  auto t = f.trainer(ppo);
  try {
    run_rl(*t, f.inputs(), ppo, true);
    FAIL() << "PPO resumed from a checkpoint without a critic";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no critic/"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lockstep::rl
