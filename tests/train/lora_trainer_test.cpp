// The LoRA trainer: only the adapters change (base bits untouched, no base
// gradient buffer), the adapters' AdamW state saves and reloads so that the
// next steps give the same bits as an uninterrupted run, the learning-rate
// schedule counts the adapters' steps, and what LoRA does not support is
// refused with a message.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "common/small_models.h"
#include "common/test_util.h"
#include "lockstep/model/params.h"
#include "lockstep/train/trainer.h"
#include "model/model_test_util.h"

namespace lockstep::train {
namespace {

Buffer random_params(const ParamLayout& layout) {
  Buffer b = alloc_params(layout);
  init_params(layout, b.as<float>(), 5, 0.1f);
  return b;
}

TrainerConfig lora_config() {
  TrainerConfig tc;
  tc.micro_batch_tokens = 32;
  tc.optim.lr = 1e-2;
  tc.optim.warmup_steps = 2;
  tc.lora.rank = 3;
  tc.lora.alpha = 6;
  tc.lora.target_modules = {"q_proj", "o_proj", "up_proj", "down_proj"};
  tc.lora.init_seed = 11;
  return tc;
}

std::vector<TrainSequence> batch(int64_t V, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<TrainSequence> seqs(3);
  for (auto& s : seqs) {
    for (int j = 0; j < 9; ++j) s.tokens.push_back(int32_t(g() % uint32_t(V)));
    s.prompt_len = 2;
  }
  return seqs;
}

// Mean negative logprob of the targets.
const LossFn kLoss = [](size_t, const float* logp, const float*, int64_t n, float* dlogp, float*) {
  double l = 0;
  for (int64_t i = 0; i < n; ++i) {
    l -= logp[i];
    dlogp[i] = -1.0f / float(n);
  }
  return l / double(n);
};

void train_steps(Trainer& t, int from, int to) {
  for (int s = from; s < to; ++s) {
    t.accumulate(batch(t.config().vocab_size, uint32_t(s)), kLoss, {});
    t.step();
  }
}

TEST(LoraTrainer, TrainsOnlyTheAdaptersOverAnUntouchedBase) {
  const ModelConfig c = test::small_moe();
  const ParamLayout layout(c);
  Buffer p0 = random_params(layout);
  Trainer t(Context{}, c, random_params(layout), lora_config());
  ASSERT_NE(t.lora(), nullptr);
  EXPECT_EQ(t.grads(), nullptr);  // no gradient buffer for the frozen base
  std::vector<float> before(t.lora()->params(), t.lora()->params() + t.lora()->numel());
  train_steps(t, 0, 3);
  EXPECT_EQ(t.version(), 3u);
  EXPECT_EQ(t.lora()->steps_done(), 3);
  EXPECT_EQ(std::memcmp(t.params(), p0.data(), layout.nbytes()), 0) << "the frozen base moved";
  int64_t changed = 0;
  for (int64_t i = 0; i < t.lora()->numel(); ++i) changed += t.lora()->params()[i] != before[size_t(i)];
  EXPECT_GT(changed, t.lora()->numel() / 2);
  for (int64_t i = 0; i < t.lora()->numel(); ++i) ASSERT_EQ(t.lora()->grads()[i], 0.0f) << "not zeroed";
}

TEST(LoraTrainer, OptimizerStateReloadsBitForBit) {
  const ModelConfig c = test::small_moe();
  const ParamLayout layout(c);
  test::TempDir dir("lora-trainer");
  Trainer straight(Context{}, c, random_params(layout), lora_config());
  train_steps(straight, 0, 4);

  Trainer first(Context{}, c, random_params(layout), lora_config());
  train_steps(first, 0, 2);
  const std::string opt = dir.str("optimizer.bin");
  first.save_optimizer(opt);
  Trainer resumed(Context{}, c, random_params(layout), lora_config());
  std::memcpy(resumed.lora()->params(), first.lora()->params(), size_t(first.lora()->numel()) * 4);
  resumed.lora()->load_optimizer(opt);
  EXPECT_EQ(resumed.lora()->steps_done(), 2);  // the schedule (warmup 2) goes on where it was
  train_steps(resumed, 2, 4);
  const size_t bytes = size_t(straight.lora()->numel()) * 4;
  EXPECT_EQ(std::memcmp(straight.lora()->params(), resumed.lora()->params(), bytes), 0);
  EXPECT_EQ(std::memcmp(straight.lora()->m(), resumed.lora()->m(), bytes), 0);
  EXPECT_EQ(std::memcmp(straight.lora()->v(), resumed.lora()->v(), bytes), 0);

  // Another target list has another size: named as such.
  TrainerConfig other = lora_config();
  other.lora.target_modules = {"q_proj"};
  Trainer wrong(Context{}, c, random_params(layout), other);
  test::expect_error([&] { wrong.lora()->load_optimizer(opt); }, {"optimizer.bin", "adapters"});
}

// Activation recompute and the LM head in row/column chunks (its weight
// gradient skipped: the head is frozen) give the adapters' gradients the
// bits of the plain pass.
TEST(LoraTrainer, RecomputeAndChunkedHeadGiveTheSameAdapterGradients) {
  const ModelConfig c = test::small_moe();
  const ParamLayout layout(c);
  auto grads_of = [&](bool recompute, int64_t chunk) {
    TrainerConfig tc = lora_config();
    tc.recompute_activations = recompute;
    tc.logits_chunk = chunk;
    Trainer t(Context{}, c, random_params(layout), tc);
    train_steps(t, 0, 1);  // B non-zero, so every adapter path carries gradient
    t.accumulate(batch(c.vocab_size, 9), kLoss, {});
    return std::vector<float>(t.lora()->grads(), t.lora()->grads() + t.lora()->numel());
  };
  const std::vector<float> plain = grads_of(false, 0);
  double norm = 0;
  for (float g : plain) norm += double(g) * g;
  EXPECT_GT(norm, 0.0);
  EXPECT_EQ(grads_of(true, 0), plain);
  EXPECT_EQ(grads_of(false, 3), plain);
}

TEST(LoraTrainer, RefusesWhatItDoesNotSupportYet) {
  const ModelConfig c = test::small_tied_dense();
  const ParamLayout layout(c);
  TrainerConfig wi = lora_config();
  wi.world_invariant = true;
  test::expect_error([&] { Trainer(Context{}, c, random_params(layout), wi); },
                     {"[lora]", "world_invariant"});
}

}  // namespace
}  // namespace lockstep::train
