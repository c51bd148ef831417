// The RL loop end to end on a tiny random MoE model with a deterministic
// verifier: what a run writes (metrics, samples, eval, checkpoints), the
// alignment guarantee at every step, bit-identical resume, fast mode with
// TIS, KL to the reference, several updates per batch, dynamic sampling,
// rollout one step ahead of training (max_weight_staleness) and the config
// errors.
#include "lockstep/rl/loop.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "../model/model_test_util.h"
#include "lockstep/base/error.h"
#include "lockstep/data/jsonl.h"
#include "lockstep/metrics/metrics_logger.h"
#include "lockstep/model/params.h"
#include "lockstep/model/weights.h"
#include "lockstep/reward/reward.h"
#include "lockstep/rl/rollout_backend.h"
#include "lockstep/rollout/engine.h"
#include "lockstep/tokenizer/byte_level.h"
#include "lockstep/train/checkpoint.h"

namespace lockstep::rl {
namespace {

namespace fs = std::filesystem;

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

class Constant : public reward::Reward {
 public:
  reward::RewardResult evaluate(const reward::RewardRequest&) const override {
    reward::RewardResult r;
    r.reward = 0.5;
    return r;
  }
  std::string type() const override { return "constant"; }
};

// Hangs (far past the time limit) on responses of odd length.
class Hangs : public reward::Reward {
 public:
  reward::RewardResult evaluate(const reward::RewardRequest& q) const override {
    if (q.response.size() % 2 == 1) std::this_thread::sleep_for(std::chrono::seconds(10));
    reward::RewardResult r;
    r.correct = q.response.size() % 4 == 0;
    r.reward = r.correct ? 1.0 : 0.0;
    return r;
  }
  std::string type() const override { return "hangs"; }
};

// Fails every sample, as a reward file that returns a string does.
class AlwaysFails : public reward::Reward {
 public:
  reward::RewardResult evaluate(const reward::RewardRequest&) const override {
    return reward::RewardResult::failure_result("bad_return: score returned str");
  }
  std::string type() const override { return "always-fails"; }
};

struct Fixture {
  static constexpr int64_t kMicroBatchTokens = 64;  // several micro-batches per step

  Fixture() : dir("rl-loop") {
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
    for (int i = 0; i < 12; ++i) {
      data::PromptExample ex;
      ex.line = i + 1;
      ex.prompt_text = "question " + std::to_string(i) + ":";
      ex.prompt_ids = tok->encode(ex.prompt_text, false);
      ex.label = i;
      (i < 9 ? train : eval).push_back(std::move(ex));
    }
  }

  RlConfig config(const std::string& out) const {
    RlConfig c;
    c.batch_size = 3;
    c.rollout.sampling.n = 4;
    c.rollout.sampling.max_new_tokens = 6;
    c.rollout.engine.num_blocks = 256;
    c.rollout.engine.block_size = 4;
    c.trainer.optim.lr = 1e-2;
    c.trainer.micro_batch_tokens = kMicroBatchTokens;
    c.steps = 3;
    c.seed = 9;
    c.save_interval = 2;
    c.keep_last = 5;
    c.eval.interval = 2;
    c.eval.config.n = 2;
    c.eval.config.sampling.max_new_tokens = 6;
    c.reward.threads = 1;
    c.eval.config.reward.threads = 1;
    c.log.progress = false;
    c.log_interval = 0;
    c.out_dir = out;
    return c;
  }

  RlInputs inputs(std::shared_ptr<const reward::Reward> r = std::make_shared<EvenLength>()) const {
    RlInputs in;
    in.tok = &*tok;
    in.train = train;
    in.eval = eval;
    in.tokenizer_dir = dir.str("tok");
    Buffer ref = alloc_params(*layout);
    std::memcpy(ref.as<float>(), init.as<float>(), layout->nbytes());
    in.reference = std::make_shared<train::Scorer>(Context{}, cfg, std::move(ref), kMicroBatchTokens);
    in.reward = std::move(r);
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
  std::vector<data::PromptExample> train, eval;
};

// A rollout that runs apart from the trainer, as rollout ranks do: its own
// copy of the weights, taken at sync(), and submit/collect. It logs each call
// with the weight version it generated with or received, and throws on the
// calls MpiRollout would deadlock on (sync or generate while a batch is in
// flight). It generates at submit(): the weights cannot change before
// collect(), so the samples are those a rollout rank would return.
class AheadRollout : public RolloutBackend {
 public:
  AheadRollout(train::Trainer& trainer, const RlConfig& c)
      : ctx_(trainer.context()),
        layout_(trainer.config()),
        params_(alloc_params(layout_)),
        weights_(ctx_, layout_, params_.as<float>()) {
    rollout::EngineConfig ec = c.rollout.engine;
    ec.seed = c.seed;
    engine_ = std::make_unique<rollout::Engine>(ctx_, &weights_, ec);
    AheadRollout::sync(trainer);
  }
  std::vector<rollout::RequestResult> generate(std::vector<rollout::Request> requests, const RolloutProgress&,
                                               int64_t* generated_tokens) override {
    LS_CHECK(!in_flight_) << "generate while a batch is in flight";
    calls.push_back("generate " + std::to_string(weights_.version()));
    return run(std::move(requests), generated_tokens);
  }
  void sync(train::Trainer& trainer) override {
    LS_CHECK(!in_flight_) << "sync while a batch is in flight";
    std::memcpy(params_.as<float>(), trainer.params(), layout_.nbytes());
    weights_.refresh(ctx_, trainer.version());
    engine_->update_weights(&weights_);
    calls.push_back("sync " + std::to_string(trainer.version()));
  }
  bool aligned() const override { return true; }
  bool can_overlap() const override { return true; }
  void submit(std::vector<rollout::Request> requests) override {
    LS_CHECK(!in_flight_) << "a second batch submitted";
    calls.push_back("submit " + std::to_string(weights_.version()));
    pending_ = run(std::move(requests), &pending_tokens_);
    in_flight_ = true;
  }
  std::vector<rollout::RequestResult> collect(const RolloutProgress&, int64_t* generated_tokens) override {
    LS_CHECK(in_flight_) << "collect without a batch";
    in_flight_ = false;
    calls.push_back("collect");
    if (generated_tokens) *generated_tokens = pending_tokens_;
    return std::move(pending_);
  }

  std::vector<std::string> calls;

 private:
  std::vector<rollout::RequestResult> run(std::vector<rollout::Request> requests, int64_t* tokens) {
    const int64_t before = engine_->stats().generated_tokens;
    auto out = engine_->generate(std::move(requests));
    if (tokens) *tokens = engine_->stats().generated_tokens - before;
    return out;
  }
  Context ctx_;
  ParamLayout layout_;
  Buffer params_;
  model::ModelWeights weights_;
  std::unique_ptr<rollout::Engine> engine_;
  bool in_flight_ = false;
  std::vector<rollout::RequestResult> pending_;
  int64_t pending_tokens_ = 0;
};

std::vector<nlohmann::json> metrics_of(const std::string& run) {
  int bad = 0;
  auto m = metrics::read_metrics(run + "/metrics.jsonl", &bad);
  EXPECT_EQ(bad, 0);
  return m;
}

// Aligned at every precision: both engines in bf16 or fp8, the gap is exactly
// 0 every step and the trainer reuses the rollout's logprobs.
TEST(RlLoop, AlignedAtBf16AndFp8HasAGapOfZero) {
  for (const char* precision : {"bf16", "fp8"}) {
    SCOPED_TRACE(precision);
    Fixture f;
    RlConfig c = f.config(f.dir.str(precision));
    c.rollout.precision = c.rollout.trainer_precision = precision;
    c.rollout.fp8_block = c.trainer.fp8_block = 16;
    c.trainer.precision = std::string(precision) == "bf16" ? DType::BF16 : DType::FP8E4M3;
    c.eval.interval = 0;
    f.eval.clear();
    auto t = f.trainer(c);
    const RlResult r = run_rl(*t, f.inputs(), c, false);
    EXPECT_EQ(r.max_logprob_abs_diff_max, 0.0);
    const auto m = metrics_of(c.out_dir);
    ASSERT_EQ(m.size(), 3u);
    for (const auto& s : m) {
      EXPECT_EQ(s["train/train_rollout_logprob_abs_diff"].get<double>(), 0.0);
      EXPECT_EQ(s["train/train_rollout_logprob_bitwise_equal_frac"].get<double>(), 1.0);
      EXPECT_EQ(s["train/on_policy_shortcut"], 1);
    }
    EXPECT_EQ(t->version(), 3u);
  }
}

// A rollout that reports one token's logprob one ulp off while claiming to be
// aligned: what a numerics bug in one engine looks like to the loop.
class PlantedGapRollout : public RolloutBackend {
 public:
  PlantedGapRollout(train::Trainer& trainer, const RlConfig& c) : inner_(trainer, c.rollout, c.seed) {}
  std::vector<rollout::RequestResult> generate(std::vector<rollout::Request> requests,
                                               const RolloutProgress& p, int64_t* tokens) override {
    auto out = inner_.generate(std::move(requests), p, tokens);
    auto& lp = out.at(0).samples.at(0).logprobs;
    if (lp.size() > 1) lp[1] = std::nextafter(lp[1], 0.0f);
    return out;
  }
  void sync(train::Trainer& trainer) override { inner_.sync(trainer); }
  bool aligned() const override { return true; }
  std::optional<std::string> localise(train::Trainer& trainer, const train::TrainSequence& seq,
                                      const rollout::SamplingParams& params) override {
    return inner_.localise(trainer, seq, params);
  }

 private:
  LocalRollout inner_;
};

TEST(RlLoop, APlantedGapAbortsTheStepBeforeTheOptimizerRuns) {
  Fixture f;
  RlConfig c = f.config(f.dir.str("planted"));
  c.rollout.sampling.ignore_eos = true;  // every sample has several tokens
  c.eval.interval = 0;
  f.eval.clear();
  auto t = f.trainer(c);
  RlInputs in = f.inputs();
  in.rollout = std::make_shared<PlantedGapRollout>(*t, c);
  test::expect_error([&] { run_rl(*t, in, c, false); },
                     {"aligned mode", "sample 0 of the step's batch, response token 1",
                      "before the optimizer ran", "on_gap", "replayed through the rollout engine's decode",
                      "no intermediate differs", "rows compared", "arises after it"});
  EXPECT_EQ(t->version(), 0u) << "the optimizer ran";

  // warn: the same difference is reported and training goes on.
  RlConfig w = f.config(f.dir.str("planted-warn"));
  w.rollout.sampling.ignore_eos = true;
  w.eval.interval = 0;
  w.on_gap = RlConfig::OnGap::Warn;
  auto t2 = f.trainer(w);
  RlInputs in2 = f.inputs();
  in2.rollout = std::make_shared<PlantedGapRollout>(*t2, w);
  const RlResult r = run_rl(*t2, in2, w, false);
  EXPECT_GT(r.max_logprob_abs_diff_max, 0.0);
  EXPECT_EQ(t2->version(), 3u);
}

TEST(RlLoop, AlignedRunWritesMetricsSamplesEvalAndCheckpoints) {
  Fixture f;
  const std::string out = f.dir.str("run");
  RlConfig c = f.config(out);
  auto t = f.trainer(c);
  std::vector<int64_t> seen;
  RlInputs in = f.inputs();
  in.on_step = [&](int64_t step, const nlohmann::json&) { seen.push_back(step); };
  const RlResult r = run_rl(*t, in, c, false);
  EXPECT_EQ(seen, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(r.steps_run, 3);
  EXPECT_EQ(t->version(), 3u);
  ASSERT_TRUE(r.first_eval && r.last_eval);
  EXPECT_EQ(r.first_eval_step, 0);
  EXPECT_EQ(r.last_eval_step, 3);
  EXPECT_EQ(r.max_logprob_abs_diff_max, 0.0);

  const auto m = metrics_of(out);
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[0]["step"], 0);
  EXPECT_TRUE(m[0].contains("eval/test/pass@1"));
  EXPECT_TRUE(m[2].contains("eval/test/pass@2"));
  for (size_t i = 1; i < m.size(); ++i) {
    const auto& s = m[i];
    EXPECT_EQ(s["step"], int64_t(i));
    for (const char* k :
         {"rollout/reward_mean", "rollout/reward_std", "rollout/response_len_mean", "rollout/truncated_ratio",
          "train/pg_loss", "train/entropy", "train/grad_norm", "train/pg_clipfrac", "train/train_rollout_kl",
          "perf/step_time_s", "perf/rollout_time_s", "perf/train_time_s", "perf/weight_sync_s",
          "perf/rollout_tokens_per_s", "perf/train_tokens_per_s"})
      EXPECT_TRUE(s.contains(k)) << "step " << i << " lacks " << k;
    // Aligned mode: the trainer's logprobs equal the rollout's bit for bit.
    EXPECT_EQ(s["train/train_rollout_logprob_abs_diff"].get<double>(), 0.0);
    EXPECT_EQ(s["train/train_rollout_logprob_abs_diff_max"].get<double>(), 0.0);
    EXPECT_EQ(s["train/train_rollout_logprob_bitwise_equal_frac"].get<double>(), 1.0);
    EXPECT_EQ(s["train/on_policy_shortcut"], 1);
    EXPECT_EQ(s["rollout/weight_staleness"].get<double>(), 0.0);  // rollout and training alternate
    EXPECT_EQ(s["rollout/num_samples"], 12);
  }
  // Checkpoints at step 2 and 3, latest = 3, loadable with the prompt cursor.
  EXPECT_TRUE(fs::exists(out + "/checkpoints/step_2/model.safetensors"));
  auto latest = train::find_latest_checkpoint(out);
  ASSERT_TRUE(latest);
  EXPECT_EQ(latest->step, 3);
  EXPECT_EQ(latest->state["prompt_cursor"], 9);
  EXPECT_TRUE(fs::exists(out + "/checkpoints/step_3/tokenizer.json"));
  // Samples and per-problem eval files.
  auto samples = data::read_jsonl(out + "/samples/step_000001.jsonl");
  ASSERT_FALSE(samples.empty());
  EXPECT_TRUE(samples[0].value.contains("response"));
  EXPECT_TRUE(samples[0].value.contains("reward"));
  EXPECT_TRUE(samples[0].value.contains("advantage"));
  EXPECT_EQ(data::read_jsonl(out + "/eval/step_000000.jsonl").size(), f.eval.size());
  EXPECT_TRUE(fs::exists(out + "/eval/step_000003.jsonl"));
  // A second fresh run into the same directory is refused (nothing is lost).
  const auto size = fs::file_size(out + "/metrics.jsonl");
  auto t2 = f.trainer(c);
  test::expect_error([&] { run_rl(*t2, f.inputs(), c, false); }, {"already holds a run", "--resume"});
  EXPECT_EQ(fs::file_size(out + "/metrics.jsonl"), size);
}

TEST(RlLoop, ResumeAfterAStopGivesTheSameWeightsBitForBit) {
  Fixture f;
  RlConfig full = f.config(f.dir.str("full"));
  full.steps = 4;
  full.save_interval = 1;
  auto a = f.trainer(full);
  run_rl(*a, f.inputs(), full, false);

  RlConfig part = f.config(f.dir.str("part"));
  part.steps = 2;
  part.save_interval = 1;
  {
    auto b = f.trainer(part);
    run_rl(*b, f.inputs(), part, false);
  }
  // A line of a step after the checkpoint (as if the run died mid-step).
  {
    std::ofstream os(f.dir.str("part") + "/metrics.jsonl", std::ios::app);
    os << "{\"step\": 3, \"rollout/reward_mean\": 0.5}\n{\"step\": 4, \"trunc";
  }
  part.steps = 4;
  auto b = f.trainer(part);  // fresh initial weights: resume must load the checkpoint
  const RlResult r = run_rl(*b, f.inputs(), part, true);
  EXPECT_EQ(r.steps_run, 2);
  EXPECT_EQ(b->version(), a->version());
  EXPECT_EQ(std::memcmp(a->params(), b->params(), f.layout->nbytes()), 0) << "resumed weights differ";
  const auto m = metrics_of(f.dir.str("part"));
  std::vector<int64_t> steps;
  for (const auto& x : m) steps.push_back(x["step"].get<int64_t>());
  EXPECT_EQ(steps, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  const auto ma = metrics_of(f.dir.str("full"));
  EXPECT_EQ(ma[4]["rollout/reward_mean"], m[4]["rollout/reward_mean"]);
}

// Killed after its step-0 eval line but before the first checkpoint, a run
// resumed with --resume starts again from step 0: the step-0 line it
// writes again replaces the old one (each step once in metrics.jsonl).
TEST(RlLoop, ResumeWithoutACheckpointWritesStepZeroOnce) {
  Fixture f;
  RlConfig c = f.config(f.dir.str("nockpt"));
  c.steps = 1;
  fs::create_directories(c.out_dir);
  {
    std::ofstream os(c.out_dir + "/metrics.jsonl");
    os << "{\"step\": 0, \"eval/test/pass@1\": 0.25}\n{\"step\": 1, \"rollout/rew";
  }
  auto t = f.trainer(c);
  run_rl(*t, f.inputs(), c, true);
  std::vector<int64_t> steps;
  for (const auto& x : metrics_of(c.out_dir)) steps.push_back(x["step"].get<int64_t>());
  EXPECT_EQ(steps, (std::vector<int64_t>{0, 1}));
}

// [log] metric_names = "verl" and tensorboard = true, read from TOML and
// applied: verl's names where they exist (lockstep's elsewhere), every line
// timed, and one TensorBoard events file beside metrics.jsonl.
TEST(RlLoop, LogSectionGivesVerlNamesAndTensorBoard) {
  const toml::table t =
      parse_toml_with_overrides("[log]\ntensorboard = true\nmetric_names = \"verl\"\n", "x.toml", {});
  const RlConfig parsed = rl_config_from_toml(t, "x.toml");
  EXPECT_TRUE(parsed.log.metrics.tensorboard);
  EXPECT_EQ(parsed.log.metrics.names, metrics::MetricNames::Verl);
  Fixture f;
  RlConfig c = f.config(f.dir.str("verl"));
  c.log.metrics = parsed.log.metrics;
  auto tr = f.trainer(c);
  run_rl(*tr, f.inputs(), c, false);
  const auto m = metrics_of(c.out_dir);
  ASSERT_GE(m.size(), 2u);
  for (const auto& s : m) EXPECT_TRUE(s.contains("time")) << s.dump();
  const auto& s = m[1];
  for (const char* k :
       {"actor/pg_loss", "actor/entropy", "actor/grad_norm", "critic/score/mean", "critic/rewards/mean",
        "critic/advantages/mean", "response_length/mean", "response_length/clip_ratio", "timing_s/gen",
        "timing_s/step", "rollout/accuracy", "train/train_rollout_logprob_abs_diff"})
    EXPECT_TRUE(s.contains(k)) << "step 1 lacks " << k;
  for (const char* k : {"train/pg_loss", "rollout/reward_mean", "perf/rollout_time_s"})
    EXPECT_FALSE(s.contains(k)) << "step 1 still has " << k;
  std::vector<fs::path> events;
  for (const auto& e : fs::directory_iterator(c.out_dir + "/tensorboard")) events.push_back(e.path());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].filename().string().rfind("events.out.tfevents.", 0), 0u);
  EXPECT_GT(fs::file_size(events[0]), 100u);
}

TEST(RlLoop, FastModeReportsTheGapAndAppliesTis) {
  Fixture f;
  RlConfig c = f.config(f.dir.str("bf16"));
  c.rollout.precision = "bf16";  // the trainer stays f32: fast mode
  c.rollout.engine.bf16_kv = true;
  c.algo.rollout_is = IsLevel::Token;
  c.algo.rollout_is_threshold = 1.01;  // tight: some tokens get truncated
  c.algo.routing_replay = true;
  c.eval.interval = 0;
  f.eval.clear();
  auto t = f.trainer(c);
  const RlResult r = run_rl(*t, f.inputs(), c, false);
  EXPECT_GT(r.max_logprob_abs_diff, 0.0);
  const auto m = metrics_of(c.out_dir);
  ASSERT_EQ(m.size(), 3u);  // no eval set: no step 0
  for (const auto& s : m) {
    EXPECT_GT(s["train/train_rollout_logprob_abs_diff"].get<double>(), 0.0);
    EXPECT_LT(s["train/train_rollout_logprob_abs_diff"].get<double>(), 0.1);
    EXPECT_EQ(s["train/on_policy_shortcut"], 0);
    EXPECT_TRUE(s.contains("train/tis_clipfrac"));
    EXPECT_GT(s["perf/old_logprob_time_s"].get<double>(), 0.0);
  }
  double clip = 0;
  for (const auto& s : m) clip += s["train/tis_clipfrac"].get<double>();
  EXPECT_GT(clip, 0.0);
}

TEST(RlLoop, KlToTheReferenceAndSeveralUpdatesPerBatch) {
  Fixture f;
  RlConfig c = f.config(f.dir.str("kl"));
  c.algo.kl_coef = 0.1;
  c.algo.num_steps_per_rollout = 2;
  c.steps = 2;
  c.eval.interval = 0;
  f.eval.clear();
  auto t = f.trainer(c);
  run_rl(*t, f.inputs(), c, false);
  EXPECT_EQ(t->version(), 4u);  // two optimizer steps per RL step
  const auto m = metrics_of(c.out_dir);
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0]["train/num_updates"], 2);
  // The first mini-batch runs at the reference weights (k3 = 0), the second
  // after an update: the step's KL is positive, and stays so.
  EXPECT_GT(m[0]["train/kl"].get<double>(), 0.0);
  EXPECT_GT(m[1]["train/kl"].get<double>(), 0.0);
  EXPECT_TRUE(std::isfinite(m[1]["train/kl"].get<double>()));
  // One update per batch: the first step trains at the reference itself, KL exactly 0.
  RlConfig one = f.config(f.dir.str("kl1"));
  one.algo.kl_coef = 0.1;
  one.steps = 1;
  one.eval.interval = 0;
  auto t1 = f.trainer(one);
  run_rl(*t1, f.inputs(), one, false);
  EXPECT_EQ(metrics_of(one.out_dir)[0]["train/kl"].get<double>(), 0.0);
  EXPECT_GT(m[0]["perf/ref_logprob_time_s"].get<double>(), 0.0);
}

TEST(RlLoop, DynamicSamplingDropsGroupsThatAgree) {
  Fixture f;
  RlConfig c = f.config(f.dir.str("dyn"));
  c.algo.dynamic_sampling = true;
  c.algo.max_sampling_tries = 3;
  c.steps = 1;
  c.eval.interval = 0;
  f.eval.clear();
  auto t = f.trainer(c);
  run_rl(*t, f.inputs(std::make_shared<Constant>()), c, false);
  EXPECT_EQ(t->version(), 0u);  // nothing left to train on
  const auto m = metrics_of(c.out_dir);
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0]["rollout/sampling_tries"], 3);
  EXPECT_EQ(m[0]["rollout/filtered_groups"], 9);
  EXPECT_EQ(m[0]["train/skipped"], 1);

  // With a verifier that separates samples, groups survive and the batch fills.
  RlConfig d = f.config(f.dir.str("dyn2"));
  d.algo.dynamic_sampling = true;
  d.steps = 1;
  d.eval.interval = 0;
  auto t2 = f.trainer(d);
  run_rl(*t2, f.inputs(), d, false);
  const auto m2 = metrics_of(d.out_dir);
  EXPECT_EQ(t2->version(), 1u);
  EXPECT_LE(m2[0]["train/samples"].get<int64_t>(), 12);
}

TEST(RlLoop, AHangingRewardTimesOutAndIsCountedNotTrained) {
  Fixture f;
  RlConfig c = f.config(f.dir.str("hang"));
  c.steps = 1;
  c.eval.interval = 0;
  c.reward.timeout_s = 1.0;  // 10x under the hang, and far above a normal reward
  c.reward.threads = 2;
  f.eval.clear();
  auto t = f.trainer(c);
  run_rl(*t, f.inputs(std::make_shared<Hangs>()), c, false);
  const auto m = metrics_of(c.out_dir);
  ASSERT_EQ(m.size(), 1u);
  const int64_t failures = m[0]["rollout/reward_failures"].get<int64_t>();
  EXPECT_GT(failures, 0);
  EXPECT_GT(m[0]["train/samples"].get<int64_t>(), 0);
  EXPECT_LE(m[0]["train/samples"].get<int64_t>() + failures, 12);  // failed samples are not trained on
  auto samples = data::read_jsonl(c.out_dir + "/samples/step_000001.jsonl");
  int nulls = 0;
  for (const auto& r : samples) nulls += r.value["reward"].is_null() ? 1 : 0;
  EXPECT_GT(nulls, 0);
}

// A step whose rewards all fail stops the run with the first failure's
// reason, before any update; its metrics line (without a reward mean) and its
// samples (each with its reward_failure) are written first.
TEST(RlLoop, EveryRewardFailingStopsTheRunWithTheReason) {
  Fixture f;
  RlConfig c = f.config(f.dir.str("allfail"));
  c.steps = 3;
  c.eval.interval = 0;
  f.eval.clear();
  auto t = f.trainer(c);
  try {
    run_rl(*t, f.inputs(std::make_shared<AlwaysFails>()), c, false);
    ADD_FAILURE() << "a run whose rewards all failed went on";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rl step 1: every reward failed"), std::string::npos) << what;
    EXPECT_NE(what.find("the first failure: bad_return: score returned str"), std::string::npos) << what;
  }
  EXPECT_EQ(t->version(), 0u);  // nothing trained on failures
  const auto m = metrics_of(c.out_dir);
  ASSERT_EQ(m.size(), 1u);
  EXPECT_FALSE(m[0].contains("rollout/reward_mean")) << m[0].dump();
  EXPECT_EQ(m[0]["rollout/reward_failures"], m[0]["rollout/num_samples"]);
  const auto samples = data::read_jsonl(c.out_dir + "/samples/step_000001.jsonl");
  ASSERT_FALSE(samples.empty());
  for (const auto& r : samples) {
    EXPECT_TRUE(r.value["reward"].is_null());
    EXPECT_TRUE(r.value.contains("label"));
    EXPECT_EQ(r.value.value("reward_failure", ""), "bad_return: score returned str");
  }
}

// A verl-style Python reward in the loop: its dict's extra keys become
// reward/extra/<key> metrics, and each sample (training and eval) is scored
// exactly once (the file appends a line per call).
TEST(RlLoop, APythonRewardLogsItsExtraKeysAndScoresEachSampleOnce) {
  Fixture f;
  RlConfig c = f.config(f.dir.str("py"));
  c.steps = 1;
  const std::string calls = f.dir.str("calls.txt");
  {
    std::ofstream(f.dir.str("len_reward.py"))
        << "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        << "    with open(" << nlohmann::json(calls).dump() << ", 'a') as f:\n"
        << "        f.write('x\\n')\n"
        << "    return {'score': float(len(solution_str) % 2 == 0), 'length': len(solution_str), 'one': 1}\n";
  }
  reward::RewardOptions o;
  o.type = "python";
  o.path = f.dir.str("len_reward.py");
  o.workers = 1;
  if (std::filesystem::exists("/usr/bin/python3")) o.python = "/usr/bin/python3";
  c.reward = o;
  c.eval.config.reward = o;
  auto t = f.trainer(c);
  run_rl(*t, f.inputs(std::shared_ptr<const reward::Reward>(reward::make_reward(o))), c, false);
  const auto m = metrics_of(c.out_dir);
  ASSERT_EQ(m.size(), 2u);  // the eval before the first step, then step 1
  EXPECT_EQ(m[1]["reward/extra/one"].get<double>(), 1.0);
  EXPECT_GE(m[1]["reward/extra/length"].get<double>(), 0.0);
  EXPECT_EQ(m[1]["rollout/reward_failures"].get<int64_t>(), 0);
  int64_t scored = 0;
  for (const auto& x : m) {
    scored += x.value("rollout/num_samples", int64_t(0));
    for (const auto& [k, v] : x.items())
      if (k.rfind("eval/", 0) == 0 && k.find("/num_samples") != std::string::npos) scored += v.get<int64_t>();
  }
  std::ifstream in(calls);
  int64_t lines = 0;
  for (std::string l; std::getline(in, l);) ++lines;
  EXPECT_GT(scored, 0);
  EXPECT_EQ(lines, scored);
}

// Rollout one step ahead: step k+1's prompts are submitted before step k
// trains and collected when step k+1 starts; only then does the rollout get
// the weights of step k's update. Eval (steps 0, 2, 4) needs the rollout idle
// and on the step's weights, so it collects the batch in flight first.
TEST(RlLoop, StaleRolloutGeneratesOneStepAheadAndSyncsAfterCollect) {
  Fixture f;
  for (const bool with_eval : {false, true}) {
    SCOPED_TRACE(with_eval ? "with eval" : "no eval");
    RlConfig c = f.config(f.dir.str(with_eval ? "ahead-eval" : "ahead"));
    c.steps = 4;
    c.save_interval = 2;
    c.max_weight_staleness = 1;
    RlInputs in = f.inputs();
    if (!with_eval) in.eval.clear();
    auto t = f.trainer(c);
    auto backend = std::make_shared<AheadRollout>(*t, c);
    in.rollout = backend;
    run_rl(*t, in, c, false);
    EXPECT_EQ(t->version(), 4u);
    const std::vector<std::string> no_eval = {"sync 0",   "generate 0", "submit 0", "collect",
                                              "sync 1",   "submit 1",   "collect",  "sync 2",
                                              "submit 2", "collect",    "sync 3"};
    const std::vector<std::string> eval = {"sync 0",   "generate 0", "generate 0", "submit 0", "collect",
                                           "sync 1",   "submit 1",   "collect",    "sync 2",   "generate 2",
                                           "submit 2", "collect",    "sync 3",     "sync 4",   "generate 4"};
    EXPECT_EQ(backend->calls, with_eval ? eval : no_eval);
    auto m = metrics_of(c.out_dir);
    if (with_eval) m.erase(m.begin());  // step 0: eval only
    ASSERT_EQ(m.size(), 4u);
    for (size_t i = 0; i < m.size(); ++i) {
      SCOPED_TRACE("step " + std::to_string(i + 1));
      // Step 1 is generated on the weights it trains from; every later step
      // one step behind them: the shortcut is off and old logprobs recomputed.
      EXPECT_EQ(m[i]["rollout/weight_staleness"].get<double>(), i == 0 ? 0.0 : 1.0);
      EXPECT_EQ(m[i]["train/on_policy_shortcut"], i == 0 ? 1 : 0);
      EXPECT_EQ(m[i]["weight_version"], int64_t(i + 1));
      EXPECT_TRUE(m[i].contains("perf/rollout_wait_time_s"));
      if (i > 0) {  // the off-policy gap
        EXPECT_GT(m[i]["train/train_rollout_logprob_abs_diff"].get<double>(), 0.0);
      }
    }
    // The checkpoint of step 2 is written while step 3's prompts are in
    // flight: its cursor points before them (3 prompts a step).
    std::ifstream state(c.out_dir + "/checkpoints/step_2/trainer_state.json");
    EXPECT_EQ(nlohmann::json::parse(state)["prompt_cursor"], 6);
    EXPECT_EQ(train::find_latest_checkpoint(c.out_dir)->state["prompt_cursor"], 12);
  }
}

// A stale run that dies after step 2's checkpoint (step 3 in flight) resumes
// from it: step 3's prompts are drawn again, generated on the checkpoint's
// weights (so step 3 is on-policy), and every step appears once.
TEST(RlLoop, StaleRolloutResumesWithThePromptsThatWereInFlight) {
  Fixture f;
  f.eval.clear();
  RlConfig full = f.config(f.dir.str("full"));
  full.steps = 4;
  full.max_weight_staleness = 1;
  {
    auto t = f.trainer(full);
    RlInputs in = f.inputs();
    in.rollout = std::make_shared<AheadRollout>(*t, full);
    run_rl(*t, in, full, false);
  }
  RlConfig part = f.config(f.dir.str("part"));
  part.steps = 4;
  part.save_interval = 2;
  part.max_weight_staleness = 1;
  {
    auto t = f.trainer(part);
    RlInputs in = f.inputs();
    in.rollout = std::make_shared<AheadRollout>(*t, part);
    in.after_step = [](int64_t step) {
      if (step == 2) throw std::runtime_error("killed");
    };
    EXPECT_THROW(run_rl(*t, in, part, false), std::runtime_error);
  }
  auto t = f.trainer(part);
  RlInputs in = f.inputs();
  auto backend = std::make_shared<AheadRollout>(*t, part);
  in.rollout = backend;
  const RlResult r = run_rl(*t, in, part, true);
  EXPECT_EQ(r.steps_run, 2);
  EXPECT_EQ(t->version(), 4u);
  EXPECT_EQ(backend->calls,
            (std::vector<std::string>{"sync 0", "sync 2", "generate 2", "submit 2", "collect", "sync 3"}));
  const auto m = metrics_of(part.out_dir);
  std::vector<int64_t> steps;
  for (const auto& x : m) steps.push_back(x["step"].get<int64_t>());
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(m[2]["rollout/weight_staleness"].get<double>(), 0.0);
  EXPECT_EQ(m[3]["rollout/weight_staleness"].get<double>(), 1.0);
  // The same prompts as the uninterrupted run (their samples differ: other weights).
  auto prompts = [](const std::string& file) {
    std::vector<std::string> p;
    for (const auto& l : data::read_jsonl(file)) p.push_back(l.value["prompt"].get<std::string>());
    return p;
  };
  for (const char* s : {"/samples/step_000003.jsonl", "/samples/step_000004.jsonl"})
    EXPECT_EQ(prompts(part.out_dir + s), prompts(full.out_dir + s)) << s;
}

TEST(RlLoop, StalenessNeedsARolloutThatCanOverlap) {
  Fixture f;
  RlConfig c = f.config(f.dir.str("colocated"));
  c.max_weight_staleness = 1;
  auto t = f.trainer(c);
  RlInputs in = f.inputs();
  in.rollout =
      std::make_shared<LocalRollout>(*t, c.rollout, c.seed);  // what each colocated trainer rank runs
  test::expect_error([&] { run_rl(*t, in, c, false); },
                     {"max_weight_staleness = 1", "rollout_ranks > 0", "colocated"});
}

// One process with max_weight_staleness = 1 and no backend given: the
// default OverlapRollout generates each next batch on a thread of its own
// while the trainer trains. The run is one step stale after step 1, and two
// runs (2 and 1 engine threads) end with the same weights and metrics.
TEST(RlLoop, OneProcessRolloutAheadRunsOnItsOwnThreadAndIsDeterministic) {
  Fixture f;
  auto run = [&](const std::string& name, int64_t threads) {
    RlConfig c = f.config(f.dir.str(name));
    c.steps = 4;
    c.max_weight_staleness = 1;
    c.rollout_threads = threads;
    auto t = f.trainer(c);
    run_rl(*t, f.inputs(), c, false);
    std::vector<float> w(t->params(), t->params() + t->layout().numel());
    return std::make_pair(metrics_of(c.out_dir), w);
  };
  const auto [ma, wa] = run("ahead-a", 2);
  const auto [mb, wb] = run("ahead-b", 1);
  EXPECT_EQ(std::memcmp(wa.data(), wb.data(), wa.size() * sizeof(float)), 0);
  ASSERT_EQ(ma.size(), mb.size());
  std::vector<double> stale;
  for (size_t i = 0; i < ma.size(); ++i) {
    if (ma[i].contains("rollout/weight_staleness"))
      stale.push_back(ma[i]["rollout/weight_staleness"].get<double>());
    for (const auto& [k, v] : ma[i].items()) {
      if (k.rfind("perf/", 0) == 0 || k == "time" || (k.size() > 2 && k.compare(k.size() - 2, 2, "_s") == 0))
        continue;
      EXPECT_EQ(v, mb[i][k]) << "line " << i << " " << k;
    }
  }
  EXPECT_EQ(stale, (std::vector<double>{0, 1, 1, 1}));
}

TEST(RlConfig, APythonRewardPathIsRelativeToTheConfigFile) {
  const std::string base = "[reward]\ntype = \"python\"\npath = \"rewards/r.py\"\n";
  toml::table t = parse_toml_with_overrides(base, "/work/cfg/rl.toml", {}, "/work/cfg");
  EXPECT_EQ(rl_config_from_toml(t, "/work/cfg/rl.toml").reward.path, "/work/cfg/rewards/r.py");
  toml::table u =
      parse_toml_with_overrides(base, "/work/cfg/rl.toml", {"reward.path=\"/abs/r.py\""}, "/work/cfg");
  EXPECT_EQ(rl_config_from_toml(u, "/work/cfg/rl.toml").reward.path, "/abs/r.py");
  // Given with --set: the current folder's.
  toml::table v =
      parse_toml_with_overrides(base, "/work/cfg/rl.toml", {"reward.path=\"r2.py\""}, "/work/cfg");
  EXPECT_EQ(rl_config_from_toml(v, "/work/cfg/rl.toml").reward.path,
            (std::filesystem::current_path() / "r2.py").string());
}

TEST(RlConfig, ReadsSectionsAndNamesBadKeys) {
  const std::string base =
      "[rollout]\nbatch_size = 4\nn = 4\nmax_new_tokens = 32\n[train]\nsteps = 7\nlr = 1e-5\n"
      "[algo]\nadvantage = \"drgrpo\"\nloss_agg = \"seq-mean-token-sum-norm\"\n[eval]\ninterval = 5\n"
      "[reward]\ntype = \"math\"\n[log]\nreport_interval = 3\n";
  toml::table t = parse_toml_with_overrides(base, "rl.toml", {});
  const RlConfig c = rl_config_from_toml(t, "rl.toml");
  EXPECT_EQ(c.batch_size, 4);
  EXPECT_EQ(c.steps, 7);
  EXPECT_EQ(c.algo.advantage, Advantage::DrGrpo);
  EXPECT_EQ(c.algo.loss_agg_norm_len, 32);  // defaults to max_new_tokens
  EXPECT_EQ(c.eval.interval, 5);
  EXPECT_EQ(c.log.report_interval, 3);
  EXPECT_EQ(c.out_dir, "runs/rl");
  auto error_of = [&](const std::vector<std::string>& sets) {
    try {
      toml::table x = parse_toml_with_overrides(base, "rl.toml", sets);
      rl_config_from_toml(x, "rl.toml");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of({"train.batch_size=8"}).find("batch_size"), std::string::npos);
  EXPECT_NE(error_of({"algo.eps=0.1"}).find("eps"), std::string::npos);
  EXPECT_NE(error_of({"rollout.n=1"}).find("n must be >= 2"), std::string::npos);
  EXPECT_NE(error_of({"algo.overlong_buffer_len=40"}).find("overlong_buffer_len"), std::string::npos);
  EXPECT_NE(error_of({"extra.key=1"}).find("[extra]"), std::string::npos);
  EXPECT_NE(error_of({"log.color=true"}).find("color"), std::string::npos);
}

}  // namespace
}  // namespace lockstep::rl
