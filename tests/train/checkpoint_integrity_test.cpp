// Checkpoint integrity: checksums.json covers every file but the weights; one
// flipped bit in optimizer.bin or in a tensor, a truncated or missing file,
// bad JSON each make a checkpoint unusable, with the reason; a checkpoint
// without checksums (from before them) still loads; --resume falls back to
// the newest intact checkpoint (and a resumed SFT run then ends bit for bit
// as the uninterrupted one), --resume-from takes exactly the one named.
#include "lockstep/train/checkpoint_integrity.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "common/test_util.h"
#include "lockstep/model/params.h"
#include "lockstep/model/pretrained.h"
#include "lockstep/train/checkpoint.h"
#include "lockstep/train/sft.h"
#include "model/model_test_util.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace lockstep::train {
namespace {

using test::expect_error;
using test::TempDir;

const char* kTensor = "model.layers.1.mlp.up_proj.weight";  // layer 1 is dense in tiny_moe_config

std::unique_ptr<Trainer> make_trainer(Context ctx) {
  const ModelConfig c = test::tiny_moe_config();
  ParamLayout layout(c);
  Buffer params = alloc_params(layout);
  init_params(layout, params.as<float>(), 1234, 0.1f);
  TrainerConfig tc;
  tc.optim.lr = 3e-3;
  tc.micro_batch_tokens = 40;
  return std::make_unique<Trainer>(ctx, c, std::move(params), tc);
}

std::vector<TrainSequence> dataset(int n) {
  std::mt19937 g(5);
  std::vector<TrainSequence> out;
  for (int i = 0; i < n; ++i) {
    TrainSequence s;
    s.tokens = {1};
    for (int j = 0; j < 6; ++j) s.tokens.push_back(int32_t(4 + g() % 50));
    s.prompt_len = 3;
    out.push_back(s);
  }
  return out;
}

void flip_byte(const fs::path& path, size_t at) {
  std::string b = test::read_bytes(path.string());
  ASSERT_LT(at, b.size()) << path;
  b[at] ^= 0x04;
  test::write_bytes(path.string(), b);
}

// One bit in the middle of tensor `name`'s data.
void flip_tensor_bit(const fs::path& file, const std::string& name) {
  const std::string b = test::read_bytes(file.string());
  uint64_t n = 0;
  std::memcpy(&n, b.data(), 8);
  const json h = json::parse(b.substr(8, n));
  const uint64_t begin = h[name]["data_offsets"][0], end = h[name]["data_offsets"][1];
  flip_byte(file, 8 + n + (begin + end) / 2);
}

struct SavedRun {
  TempDir dir{"ckint"};
  ThreadPool pool{1};
  Context ctx{&pool, 0};
  std::unique_ptr<Trainer> trainer = make_trainer(ctx);
  fs::path ck(int step) const { return dir.path() / "checkpoints" / ("step_" + std::to_string(step)); }
  // step_2 and step_3 (keep_last = 2), latest -> step_3.
  void save_three() {
    for (int s = 1; s <= 3; ++s) save_checkpoint(dir.str(), s, *trainer, {{"user", s}}, "", 2);
  }
};

TEST(CheckpointIntegrity, TheManifestCoversEveryFileButTheWeights) {
  SavedRun r;
  r.save_three();
  EXPECT_FALSE(fs::exists(r.ck(1)));
  const json m = json::parse(test::read_bytes((r.ck(3) / kChecksumManifest).string()));
  EXPECT_EQ(m["algorithm"], "xxh64");
  for (const char* f : {"config.json", "optimizer.bin", "trainer_state.json"})
    EXPECT_TRUE(m["files"].contains(f)) << f;
  EXPECT_FALSE(m["files"].contains("model.safetensors"));  // it checks itself, per tensor
  EXPECT_EQ(checkpoint_problem(r.ck(3).string()), "");
}

TEST(CheckpointIntegrity, AFlippedBitAnywhereIsFoundWithItsFileAndTensor) {
  SavedRun r;
  r.save_three();
  flip_byte(r.ck(3) / "optimizer.bin", 100);
  const std::string opt = checkpoint_problem(r.ck(3).string());
  EXPECT_NE(opt.find("optimizer.bin: fails its checksum (file corrupt)"), std::string::npos) << opt;
  flip_tensor_bit(r.ck(2) / "model.safetensors", kTensor);
  const std::string model = checkpoint_problem(r.ck(2).string());
  EXPECT_NE(model.find("model.safetensors: tensor '" + std::string(kTensor) + "' fails its checksum"),
            std::string::npos)
      << model;
  // Loading it directly is refused too, not only the check before a resume.
  auto info = find_latest_checkpoint(r.dir.str());
  info->dir = r.ck(2).string();
  expect_error([&] { load_checkpoint(*info, *r.trainer); }, {kTensor, "fails its checksum"});
}

TEST(CheckpointIntegrity, ResumeFallsBackToTheNewestIntactCheckpointAndSaysWhy) {
  SavedRun r;
  r.save_three();
  flip_byte(r.ck(3) / "optimizer.bin", 100);
  testing::internal::CaptureStderr();
  auto info = find_resume_checkpoint(r.dir.str());
  const std::string err = testing::internal::GetCapturedStderr();
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->step, 2);
  EXPECT_EQ(info->state["user"], 2);
  for (const char* part : {"checkpoint step_3 is corrupt or incomplete", "optimizer.bin: fails its checksum",
                           "falling back to step_2"})
    EXPECT_NE(err.find(part), std::string::npos) << "stderr lacks '" << part << "': " << err;
  load_checkpoint(*info, *r.trainer);

  // --resume-from: exactly the one named; a broken one is an error, not a fallback.
  EXPECT_EQ(find_resume_checkpoint(r.dir.str(), "2")->step, 2);
  EXPECT_EQ(find_resume_checkpoint(r.dir.str(), "step_2")->step, 2);
  EXPECT_EQ(find_resume_checkpoint(r.dir.str(), r.ck(2).string())->step, 2);
  expect_error([&] { find_resume_checkpoint(r.dir.str(), "step_3"); },
               {"--resume-from step_3", "step_3", "optimizer.bin: fails its checksum"});
  expect_error([&] { find_resume_checkpoint(r.dir.str(), "7"); }, {"--resume-from 7", "step_7"});

  // None intact: an error listing each checkpoint and why.
  fs::resize_file(r.ck(2) / "model.safetensors", fs::file_size(r.ck(2) / "model.safetensors") - 9);
  expect_error([&] { find_resume_checkpoint(r.dir.str()); },
               {"no intact checkpoint", "step_3: ", "optimizer.bin: fails its checksum",
                "step_2: ", "truncated safetensors file"});
}

TEST(CheckpointIntegrity, MissingFilesBadJsonAndAMissingLatestTargetAreProblems) {
  SavedRun r;
  r.save_three();
  fs::remove(r.ck(3) / "optimizer.bin");
  EXPECT_NE(checkpoint_problem(r.ck(3).string()).find("no optimizer.bin"), std::string::npos);
  // Without checksums.json (a checkpoint from before them) the JSON itself is checked.
  fs::remove(r.ck(2) / kChecksumManifest);
  EXPECT_EQ(checkpoint_problem(r.ck(2).string()), "");
  test::write_bytes((r.ck(2) / "trainer_state.json").string(), "{\"step\": 2,");
  EXPECT_NE(checkpoint_problem(r.ck(2).string()).find("trainer_state.json"), std::string::npos);
  // latest names a checkpoint that is gone: reported, and the one before is used.
  test::write_bytes((r.dir.path() / "checkpoints" / "latest").string(), "step_9\n");
  expect_error([&] { find_resume_checkpoint(r.dir.str()); },
               {"step_9: ", "no such checkpoint directory", "step_3: ", "step_2: "});
}

TEST(CheckpointIntegrity, ACheckpointWithoutChecksumsLoads) {
  SavedRun r;
  r.save_three();
  // As an older lockstep (or another tool) wrote it: no manifest, no tensor checksums.
  fs::remove(r.ck(3) / kChecksumManifest);
  PretrainedModel m = load_pretrained(r.ck(3).string());
  const fs::path weights = r.ck(3) / "model.safetensors";
  const std::string b = test::read_bytes(weights.string());
  uint64_t n = 0;
  std::memcpy(&n, b.data(), 8);
  json h = json::parse(b.substr(8, n));
  h["__metadata__"] = {{"format", "pt"}};
  const std::string hs = h.dump();
  std::string out(8, '\0');
  const uint64_t hn = hs.size();
  std::memcpy(out.data(), &hn, 8);
  test::write_bytes(weights.string(), out + hs + b.substr(8 + n));
  EXPECT_EQ(checkpoint_problem(r.ck(3).string()), "");
  auto info = find_resume_checkpoint(r.dir.str());
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->step, 3);
  load_checkpoint(*info, *r.trainer);
  test::expect_bits_equal(m.params.as<float>(), r.trainer->checkpoint_params(), m.layout.numel(),
                          "weights of a checkpoint without checksums");
}

// A run whose last checkpoint is corrupt resumes from the one before and
// ends with the same bits as the run that was never interrupted.
TEST(CheckpointIntegrity, AnSftRunResumedPastACorruptCheckpointEndsAsTheUninterruptedOne) {
  ThreadPool pool(1);
  Context ctx{&pool, 0};
  const auto data = dataset(8);
  SftConfig cfg;
  cfg.steps = 4;
  cfg.batch_size = 4;
  cfg.save_interval = 1;
  cfg.keep_last = 2;
  cfg.log_interval = 0;
  TempDir full("ckfull"), part("ckpart");
  run_sft(*make_trainer(ctx), data, full.str(), cfg, false, "");
  run_sft(*make_trainer(ctx), data, part.str(), cfg, false, "");
  flip_tensor_bit(part.path() / "checkpoints" / "step_4" / "model.safetensors", kTensor);
  testing::internal::CaptureStderr();
  std::vector<int64_t> steps;
  run_sft(*make_trainer(ctx), data, part.str(), cfg, true, "",
          [&](const SftStepStats& s) { steps.push_back(s.step); });
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(steps, (std::vector<int64_t>{4}));
  EXPECT_NE(err.find("falling back to step_3"), std::string::npos) << err;
  for (const char* f : {"model.safetensors", "optimizer.bin", "trainer_state.json", "checksums.json"})
    EXPECT_EQ(test::read_bytes(full.str("checkpoints/step_4/") + f),
              test::read_bytes(part.str("checkpoints/step_4/") + f))
        << f;
}

}  // namespace
}  // namespace lockstep::train
