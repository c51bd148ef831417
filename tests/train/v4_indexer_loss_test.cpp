// DeepSeek-V4's indexer loss in the trainer ([train] indexer_loss_coef): the
// loss gains coef x the mean KL(teacher || indexer) over the CSA layers'
// query rows; its gradient (checked by finite differences) reaches the
// lightning indexers' own tensors and nothing else; training on it alone
// lowers it; without the coefficient the indexers stay frozen; and the key is
// refused where it cannot apply.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/v4_config.h"
#include "lockstep/base/error.h"
#include "lockstep/model/params.h"
#include "lockstep/train/trainer.h"

namespace lockstep::train {
namespace {

// Sequences of at most 12 tokens: a query sees at most 3 compressed entries,
// so the indexer (index_topk = 3) chooses all of them and its choice cannot
// change when its weights move (the finite differences stay smooth).
std::vector<TrainSequence> sequences() {
  std::mt19937 g(7);
  std::vector<TrainSequence> seqs;
  for (int len : {12, 9, 11, 6}) {
    TrainSequence s;
    for (int i = 0; i < len; ++i) s.tokens.push_back(int32_t(g() % 48));
    s.prompt_len = 2;
    seqs.push_back(s);
  }
  return seqs;
}

Buffer init(const ModelConfig& c) {
  ParamLayout layout(c);
  Buffer b = alloc_params(layout);
  init_params(layout, b.as<float>(), 11, 0.4f);
  return b;
}

// No main loss: accumulate() returns the indexer loss alone.
const LossFn kNone = [](size_t, const float*, const float*, int64_t k, float* dlogp, float*) {
  std::fill(dlogp, dlogp + k, 0.0f);
  return 0.0;
};

std::unique_ptr<Trainer> make(const ModelConfig& c, double coef) {
  TrainerConfig tc;
  tc.micro_batch_tokens = 24;  // several micro-batches: the mean is over the whole call
  tc.indexer_loss_coef = coef;
  tc.optim.lr = 1e-2;
  tc.optim.weight_decay = 0.0;
  tc.optim.grad_clip = 0.0;
  return std::make_unique<Trainer>(Context{}, c, init(c), tc);
}

bool is_indexer(const ParamInfo& p) {
  return p.name.find("attn.indexer.") != std::string::npos;
}

TEST(V4IndexerLoss, GradientMatchesFiniteDifferences) {
  const ModelConfig c = test::tiny_v4();
  auto t = make(c, 0.7);
  const auto seqs = sequences();
  const double loss = t->accumulate(seqs, kNone, ScoreOptions{});
  ASSERT_GT(loss, 0.0) << "the teacher and the untrained indexer should disagree";
  const std::vector<float> grad(t->grads(), t->grads() + t->layout().numel());
  int checked = 0;
  for (const ParamInfo& p : t->layout().params()) {
    if (!is_indexer(p)) {
      // Detached inputs: nothing but the indexers gets a gradient.
      for (int64_t i = 0; i < p.numel; ++i)
        ASSERT_EQ(grad[size_t(p.offset + i)], 0.0f) << p.name << " [" << i << "]";
      continue;
    }
    // The three largest gradients of each indexer tensor.
    std::vector<int64_t> idx(size_t(p.numel));
    for (int64_t i = 0; i < p.numel; ++i) idx[size_t(i)] = i;
    std::partial_sort(idx.begin(), idx.begin() + std::min<int64_t>(3, p.numel), idx.end(),
                      [&](int64_t a, int64_t b) {
                        return std::fabs(grad[size_t(p.offset + a)]) > std::fabs(grad[size_t(p.offset + b)]);
                      });
    for (int64_t j = 0; j < std::min<int64_t>(3, p.numel); ++j) {
      const int64_t at = p.offset + idx[size_t(j)];
      const float x0 = t->params()[at];
      const float eps = 1e-2f * std::max(1.0f, std::fabs(x0));
      auto loss_at = [&](float x) {
        t->params()[at] = x;
        t->params_changed(t->version());
        const double l = t->accumulate(seqs, kNone, ScoreOptions{});
        t->zero_grad();
        return l;
      };
      const double fd = (loss_at(x0 + eps) - loss_at(x0 - eps)) / (2.0 * double(eps));
      loss_at(x0);
      const double g = grad[size_t(at)];
      EXPECT_NEAR(g, fd, 2e-2 * std::max(std::fabs(fd), 1e-3)) << p.name << " [" << idx[size_t(j)] << "]";
      ++checked;
    }
  }
  // Two CSA layers x six indexer tensors.
  EXPECT_EQ(checked, 2 * 6 * 3);
}

TEST(V4IndexerLoss, TrainingOnItLowersItAndMovesOnlyTheIndexers) {
  const ModelConfig c = test::tiny_v4();
  auto t = make(c, 1.0);
  const std::vector<float> before(t->params(), t->params() + t->layout().numel());
  const auto seqs = sequences();
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    last = t->accumulate(seqs, kNone, ScoreOptions{});
    if (step == 0) first = last;
    t->step();
  }
  EXPECT_LT(last, 0.7 * first) << "first " << first;
  for (const ParamInfo& p : t->layout().params()) {
    bool moved = false;
    for (int64_t i = 0; i < p.numel; ++i) moved |= t->params()[p.offset + i] != before[size_t(p.offset + i)];
    EXPECT_EQ(moved, is_indexer(p)) << p.name;
  }
}

TEST(V4IndexerLoss, WithoutTheCoefficientTheIndexersStayFrozen) {
  const ModelConfig c = test::tiny_v4();
  auto t = make(c, 0.0);
  const std::vector<float> before(t->params(), t->params() + t->layout().numel());
  const LossFn nll = [](size_t, const float* logp, const float*, int64_t k, float* dlogp, float*) {
    double l = 0;
    for (int64_t i = 0; i < k; ++i) {
      l -= double(logp[i]);
      dlogp[i] = -1.0f;
    }
    return l;
  };
  for (int step = 0; step < 3; ++step) {
    t->accumulate(sequences(), nll, ScoreOptions{});
    t->step();
  }
  int indexer_tensors = 0;
  for (const ParamInfo& p : t->layout().params()) {
    if (!is_indexer(p)) continue;
    ++indexer_tensors;
    EXPECT_TRUE(p.frozen) << p.name;
    for (int64_t i = 0; i < p.numel; ++i)
      ASSERT_EQ(t->params()[p.offset + i], before[size_t(p.offset + i)]) << p.name;
  }
  EXPECT_EQ(indexer_tensors, 12);
}

std::string error_of(const ModelConfig& c, TrainerConfig tc) {
  try {
    Trainer t(Context{}, c, init(c), tc);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(V4IndexerLoss, RefusedWhereItCannotApply) {
  TrainerConfig tc;
  tc.indexer_loss_coef = 0.5;
  ModelConfig dense = test::tiny_v4();
  dense.compress_ratios = {0, 128, 128, 0};  // no CSA layer, no indexer
  EXPECT_NE(error_of(dense, tc).find("indexer_loss_coef = 0.5 needs a DeepSeek-V4 model with CSA layers"),
            std::string::npos)
      << error_of(dense, tc);
  tc.world_invariant = true;
  EXPECT_NE(error_of(test::tiny_v4(), tc).find("world_invariant = true does not cover the indexer loss"),
            std::string::npos)
      << error_of(test::tiny_v4(), tc);
}

}  // namespace
}  // namespace lockstep::train
