// The KL reference model of the RL loop (train::Scorer): its logprobs and
// entropies are Trainer::score's bits on the same parameters, micro-batch
// cut included, and it keeps its own parameters when the trainer trains.
#include <gtest/gtest.h>

#include <cstring>

#include "lockstep/model/params.h"
#include "lockstep/train/trainer.h"
#include "../model/model_test_util.h"

namespace lockstep::train {
namespace {

std::vector<TrainSequence> sequences(int64_t vocab) {
  std::vector<TrainSequence> seqs;
  for (int i = 0; i < 5; ++i) {
    TrainSequence s;
    for (int t = 0; t < 6 + 3 * i; ++t) s.tokens.push_back(int32_t((7 * i + 5 * t + 1) % vocab));
    s.prompt_len = 2 + i % 3;
    seqs.push_back(std::move(s));
  }
  return seqs;
}

Buffer copy_of(const ParamLayout& layout, const float* p) {
  Buffer b = alloc_params(layout);
  std::memcpy(b.as<float>(), p, layout.nbytes());
  return b;
}

void expect_same_bits(const std::vector<TokenScores>& a, const std::vector<TokenScores>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].logp.size(), b[i].logp.size()) << i;
    ASSERT_EQ(a[i].entropy.size(), b[i].entropy.size()) << i;
    // No memcmp of no bytes: an empty vector's data() may be null.
    EXPECT_TRUE(a[i].logp.empty() || std::memcmp(a[i].logp.data(), b[i].logp.data(), a[i].logp.size() * 4) == 0)
        << "logp of " << i;
    EXPECT_TRUE(a[i].entropy.empty() ||
                std::memcmp(a[i].entropy.data(), b[i].entropy.data(), a[i].entropy.size() * 4) == 0)
        << "entropy of " << i;
  }
}

TEST(RlReference, ScorerGivesTrainerScoreBits) {
  for (const ModelConfig& cfg : {test::tiny_moe_config(), test::tiny_dense_config()}) {
    const ParamLayout layout(cfg);
    Buffer init = alloc_params(layout);
    init_params(layout, init.as<float>(), 11, 0.3f);
    const auto seqs = sequences(cfg.vocab_size);
    for (int64_t mbt : {int64_t(16), int64_t(4096)}) {  // several micro-batches, then one
      TrainerConfig tc;
      tc.micro_batch_tokens = mbt;
      Trainer trainer(Context{}, cfg, copy_of(layout, init.as<float>()), tc);
      Scorer ref(Context{}, cfg, copy_of(layout, init.as<float>()), mbt);
      for (bool entropy : {false, true}) {
        ScoreOptions so;
        so.entropy = entropy;
        so.temperature = 0.7f;
        expect_same_bits(ref.score(seqs, so), trainer.score(seqs, so));
        expect_same_bits(ref.score(seqs, so), ref.score(seqs, so));  // buffers kept from call to call
      }
    }
  }
}

TEST(RlReference, ScorerStaysFrozenWhileTheTrainerTrains) {
  const ModelConfig cfg = test::tiny_dense_config();
  const ParamLayout layout(cfg);
  Buffer init = alloc_params(layout);
  init_params(layout, init.as<float>(), 3, 0.3f);
  TrainerConfig tc;
  tc.optim.lr = 1e-2;
  Trainer trainer(Context{}, cfg, copy_of(layout, init.as<float>()), tc);
  Scorer ref(Context{}, cfg, copy_of(layout, init.as<float>()), tc.micro_batch_tokens);
  const auto seqs = sequences(cfg.vocab_size);
  const auto before = ref.score(seqs, {});
  LossFn loss = [](size_t, const float* logp, const float*, int64_t n, float* dlogp, float*) {
    double l = 0;
    for (int64_t t = 0; t < n; ++t) {
      l -= logp[t];
      dlogp[t] = -1.0f;
    }
    return l;
  };
  trainer.accumulate(seqs, loss, {});
  trainer.step();
  expect_same_bits(ref.score(seqs, {}), before);
  const auto after = trainer.score(seqs, {});
  EXPECT_NE(std::memcmp(after[0].logp.data(), before[0].logp.data(), before[0].logp.size() * 4), 0);
}

}  // namespace
}  // namespace lockstep::train
