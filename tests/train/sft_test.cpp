// SFT trainer tests: the loss of a tiny model on a small dataset goes close
// to 0; an interrupted run resumed from its checkpoint reproduces the
// uninterrupted run's losses bit for bit; checkpoints are published atomically.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <random>

#include "lockstep/metrics/metrics_logger.h"
#include "lockstep/model/params.h"
#include "lockstep/model/pretrained.h"
#include "lockstep/train/checkpoint.h"
#include "lockstep/train/sft.h"
#include "../model/model_test_util.h"

namespace fs = std::filesystem;

namespace lockstep::train {
namespace {

ModelConfig tiny_moe() {
  ModelConfig c;
  c.architecture = Architecture::Qwen3Moe;
  c.vocab_size = 32;
  c.hidden_size = 32;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.qk_norm = true;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 32;
  c.norm_topk_prob = true;
  c.max_position_embeddings = 128;
  return c;
}

// "a b c = " -> reversed digits: a toy task a tiny model can memorise.
std::vector<TrainSequence> dataset(int n, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<TrainSequence> out;
  for (int i = 0; i < n; ++i) {
    TrainSequence s;
    std::vector<int32_t> digits;
    for (int j = 0; j < 4; ++j) digits.push_back(int32_t(2 + g() % 10));
    s.tokens = {1};
    s.tokens.insert(s.tokens.end(), digits.begin(), digits.end());
    s.tokens.push_back(20);
    s.prompt_len = int32_t(s.tokens.size());
    s.tokens.insert(s.tokens.end(), digits.rbegin(), digits.rend());
    s.tokens.push_back(0);
    out.push_back(s);
  }
  return out;
}

std::unique_ptr<Trainer> make_trainer(const ModelConfig& c, Context ctx) {
  ParamLayout layout(c);
  Buffer params = alloc_params(layout);
  init_params(layout, params.as<float>(), 1234, 0.1f);
  TrainerConfig tc;
  tc.optim.lr = 3e-3;
  tc.optim.warmup_steps = 5;
  tc.optim.weight_decay = 0.01;
  tc.micro_batch_tokens = 40;  // several micro-batches per step
  return std::make_unique<Trainer>(ctx, c, std::move(params), tc);
}

std::string temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("lockstep_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

}  // namespace

TEST(Sft, LossGoesCloseToZeroOnASmallDataset) {
  ThreadPool pool(2);
  Context ctx{&pool, 0};
  auto trainer = make_trainer(tiny_moe(), ctx);
  auto data = dataset(8, 1);
  double first = 0, last = 0;
  for (int step = 1; step <= 150; ++step) {
    std::vector<TrainSequence> batch;
    for (size_t i : sft_batch_indices(data.size(), 8, step, 0, true)) batch.push_back(data[i]);
    SftStepStats s = sft_step(*trainer, batch);
    ASSERT_FALSE(s.skipped);
    if (step == 1) first = s.loss;
    last = s.loss;
  }
  EXPECT_GT(first, 2.0);
  EXPECT_LT(last, 0.1) << "first loss " << first;
}

TEST(Sft, BatchOrderIsAPureFunctionOfSeedAndStep) {
  auto a = sft_batch_indices(10, 4, 3, 7, true);
  EXPECT_EQ(a, sft_batch_indices(10, 4, 3, 7, true));
  EXPECT_NE(a, sft_batch_indices(10, 4, 3, 8, true));
  // Each epoch is a permutation.
  std::vector<int> seen(10, 0);
  for (int step = 1; step <= 5; ++step)
    for (size_t i : sft_batch_indices(10, 2, step, 7, true)) seen[i]++;
  for (int s : seen) EXPECT_EQ(s, 1);
}

TEST(Sft, ResumeReproducesTheUninterruptedRunBitForBit) {
  ThreadPool pool(2);
  Context ctx{&pool, 0};
  auto data = dataset(12, 2);
  SftConfig cfg;
  cfg.steps = 8;
  cfg.batch_size = 4;
  cfg.seed = 3;
  cfg.save_interval = 4;
  cfg.log_interval = 0;

  const std::string full_dir = temp_dir("full"), part_dir = temp_dir("part");
  std::vector<double> full, resumed;
  {
    auto t = make_trainer(tiny_moe(), ctx);
    run_sft(*t, data, full_dir, cfg, false, "", [&](const SftStepStats& s) { full.push_back(s.loss); });
  }
  {
    SftConfig half = cfg;
    half.steps = 6;  // "killed" after step 6; last checkpoint is step 4
    auto t = make_trainer(tiny_moe(), ctx);
    run_sft(*t, data, part_dir, half, false, "");
    // Pretend the step-6 checkpoint never happened: latest -> step_4.
    fs::remove_all(fs::path(part_dir) / "checkpoints" / "step_6");
    std::ofstream(fs::path(part_dir) / "checkpoints" / "latest") << "step_4\n";
  }
  {
    auto t = make_trainer(tiny_moe(), ctx);
    run_sft(*t, data, part_dir, cfg, true, "", [&](const SftStepStats& s) { resumed.push_back(s.loss); });
  }
  ASSERT_EQ(full.size(), 8u);
  ASSERT_EQ(resumed.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(resumed[i], full[4 + i]) << "step " << 5 + i;
  // metrics.jsonl has exactly one line per step, steps 1..8, after the resume.
  auto lines = metrics::read_metrics(part_dir + "/metrics.jsonl");
  ASSERT_EQ(lines.size(), 8u);
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(lines[i]["step"].get<int64_t>(), int64_t(i + 1));
  // The final checkpoints of both runs hold identical weights.
  auto a = load_pretrained(full_dir + "/checkpoints/step_8");
  auto b = load_pretrained(part_dir + "/checkpoints/step_8");
  ASSERT_EQ(a.layout.numel(), b.layout.numel());
  EXPECT_EQ(0, std::memcmp(a.params.data(), b.params.data(), a.layout.nbytes()));
  fs::remove_all(full_dir);
  fs::remove_all(part_dir);
}

// [log] tensorboard = true: one events file beside metrics.jsonl, and every
// line carries its wall-clock time.
TEST(Sft, TensorBoardEventsBesideTheMetrics) {
  Context ctx{};
  auto data = dataset(6, 2);
  SftConfig cfg;
  cfg.steps = 2;
  cfg.batch_size = 2;
  cfg.log_interval = 0;
  cfg.log.tensorboard = true;
  const std::string dir = temp_dir("tensorboard");
  run_sft(*make_trainer(tiny_moe(), ctx), data, dir, cfg, false, "");
  std::vector<fs::path> events;
  for (const auto& e : fs::directory_iterator(dir + "/tensorboard")) events.push_back(e.path());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].filename().string().rfind("events.out.tfevents.", 0), 0u);
  // The version record and one event per step, each a few dozen bytes at least.
  EXPECT_GT(fs::file_size(events[0]), 100u);
  for (const auto& l : metrics::read_metrics(dir + "/metrics.jsonl"))
    EXPECT_TRUE(l.contains("time")) << l.dump();
  fs::remove_all(dir);
}

// A fresh run (no resume) into a directory that holds a run is refused and
// leaves its metrics as they were; it used to append its own steps to them.
TEST(Sft, AFreshRunIntoAnotherRunsDirectoryIsRefused) {
  Context ctx{};
  auto data = dataset(6, 2);
  SftConfig cfg;
  cfg.steps = 2;
  cfg.batch_size = 2;
  cfg.log_interval = 0;
  const std::string dir = temp_dir("twice");
  run_sft(*make_trainer(tiny_moe(), ctx), data, dir, cfg, false, "");
  const std::string metrics = dir + "/metrics.jsonl";
  const auto before = metrics::read_metrics(metrics);
  ASSERT_EQ(before.size(), 2u);
  test::expect_error([&] { run_sft(*make_trainer(tiny_moe(), ctx), data, dir, cfg, false, ""); },
                     {"already holds a run", "metrics.jsonl", "--resume"});
  EXPECT_EQ(metrics::read_metrics(metrics), before);
  fs::remove_all(dir);
}

TEST(Sft, LatestNeverNamesAHalfWrittenCheckpoint) {
  ThreadPool pool(1);
  Context ctx{&pool, 0};
  const std::string dir = temp_dir("latest");
  auto t = make_trainer(tiny_moe(), ctx);
  save_checkpoint(dir, 1, *t, {});
  // A crash mid-save leaves a step_2.tmp directory; latest still names step_1.
  fs::create_directories(fs::path(dir) / "checkpoints" / "step_2.tmp");
  std::ofstream(fs::path(dir) / "checkpoints" / "step_2.tmp" / "model.safetensors") << "garbage";
  auto info = find_latest_checkpoint(dir);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->step, 1);
  load_checkpoint(*info, *t);
  // A latest pointing at a missing checkpoint is an error naming it.
  std::ofstream(fs::path(dir) / "checkpoints" / "latest") << "step_9\n";
  try {
    find_latest_checkpoint(dir);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("step_9"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

// keep_last removes old checkpoints by moving them aside first: a process
// killed while removing one (here at the "checkpoint.discard" pause point)
// leaves step_1.old, never a half-removed step_1 that looks like a
// checkpoint; remove_crash_leftovers (run by --resume) sweeps the leftovers.
TEST(Sft, AKilledPruneLeavesNoHalfRemovedCheckpoint) {
  const std::string dir = temp_dir("prune");
  const std::string notify = dir + "/paused";
  ::setenv("LOCKSTEP_PAUSE_AT", "checkpoint.discard", 1);
  ::setenv("LOCKSTEP_PAUSE_NOTIFY", notify.c_str(), 1);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // the trainer is made after the fork: the child has no other threads
    ThreadPool pool(1);
    Context ctx{&pool, 0};
    auto t = make_trainer(tiny_moe(), ctx);
    save_checkpoint(dir, 1, *t, {}, "", 1);
    save_checkpoint(dir, 2, *t, {}, "", 1);  // removes step_1: waits at the pause point
    std::_Exit(0);
  }
  for (int i = 0; i < 3000 && !fs::exists(notify); ++i) ::usleep(10000);
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  ::unsetenv("LOCKSTEP_PAUSE_AT");
  ::unsetenv("LOCKSTEP_PAUSE_NOTIFY");
  ASSERT_TRUE(fs::exists(notify)) << "the child never reached checkpoint.discard";
  const fs::path ck = fs::path(dir) / "checkpoints";
  EXPECT_FALSE(fs::exists(ck / "step_1"));
  EXPECT_TRUE(fs::exists(ck / "step_1.old"));
  auto info = find_latest_checkpoint(dir);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->step, 2);
  auto names = [&] {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(ck)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  };
  // --resume sweeps what killed runs leave: here also a half-written step_7
  // and an expert-parallel optimizer state gathered for a save that never came.
  fs::create_directories(ck / "step_7.tmp");
  std::ofstream(ck / "optimizer.gathered") << "x";
  remove_crash_leftovers(dir);
  EXPECT_EQ(names(), (std::vector<std::string>{"latest", "step_2"}));
  ThreadPool pool(1);
  Context ctx{&pool, 0};
  auto t = make_trainer(tiny_moe(), ctx);
  load_checkpoint(*info, *t);
  save_checkpoint(dir, 3, *t, {}, "", 1);
  EXPECT_EQ(names(), (std::vector<std::string>{"latest", "step_3"}));
  fs::remove_all(dir);
}

}  // namespace lockstep::train
