// A colocated aligned rollout over a trainer that reads its f32 master in
// place (TrainerConfig::in_place_weights) has no packed copy to share: it packs
// its own, and generates exactly what it generates over a packed trainer,
// before and after an update (the same tokens and log-probs, bit for bit).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "../common/small_models.h"
#include "../common/test_util.h"
#include "lockstep/model/params.h"
#include "lockstep/rl/rollout_backend.h"
#include "lockstep/train/trainer.h"

namespace lockstep::rl {
namespace {

ModelConfig moe() {
  return test::small_moe();
}

std::vector<rollout::Request> requests() {
  std::vector<rollout::Request> out;
  for (int r = 0; r < 3; ++r) {
    rollout::Request q;
    for (int i = 0; i < 4 + 3 * r; ++i) q.prompt_ids.push_back(int32_t((i * 13 + r * 5 + 2) % 97));
    q.params.n = 2;
    q.params.max_new_tokens = 9;
    q.params.ignore_eos = true;
    q.params.seed = uint64_t(40 + r);
    out.push_back(std::move(q));
  }
  return out;
}

void expect_same(const std::vector<rollout::RequestResult>& a, const std::vector<rollout::RequestResult>& b,
                 const char* when) {
  ASSERT_EQ(a.size(), b.size()) << when;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].samples.size(), b[i].samples.size()) << when;
    for (size_t s = 0; s < a[i].samples.size(); ++s) {
      EXPECT_EQ(a[i].samples[s].output_ids, b[i].samples[s].output_ids) << when << ": request " << i;
      const auto& la = a[i].samples[s].logprobs;
      const auto& lb = b[i].samples[s].logprobs;
      ASSERT_EQ(la.size(), lb.size()) << when;
      test::expect_bits_equal(lb.data(), la.data(), int64_t(la.size()), when);
    }
  }
}

TEST(InPlaceTrainer, ColocatedAlignedRolloutPacksItsOwnWeightsWithTheSameBits) {
  const ModelConfig c = moe();
  ParamLayout layout(c);
  Buffer p0 = alloc_params(layout), p1 = alloc_params(layout);
  init_params(layout, p0.as<float>(), 21, 0.3f);
  std::memcpy(p1.as<float>(), p0.as<float>(), layout.nbytes());
  train::TrainerConfig packed, in_place;
  packed.optim.lr = in_place.optim.lr = 5e-2;
  in_place.in_place_weights = true;
  ThreadPool pool(2);
  const Context ctx{&pool};
  train::Trainer ta(ctx, c, std::move(p0), packed), tb(ctx, c, std::move(p1), in_place);
  rollout::RolloutSection cfg;  // f32, aligned
  LocalRollout ra(ta, cfg, 3), rb(tb, cfg, 3);
  EXPECT_EQ(ra.memory().packed, 0u) << "the rollout over a packed trainer reads the trainer's packed weights";
  EXPECT_GT(rb.memory().packed, 0u) << "the rollout over an in-place trainer needs a packed copy of its own";
  EXPECT_TRUE(rb.aligned());
  expect_same(ra.generate(requests(), nullptr, nullptr), rb.generate(requests(), nullptr, nullptr), "before");

  // One update on the same sequences, then a sync: still the same bits.
  std::vector<train::TrainSequence> seqs(2);
  for (size_t s = 0; s < seqs.size(); ++s) {
    for (int i = 0; i < 12; ++i) seqs[s].tokens.push_back(int32_t((i * 7 + int(s) * 3 + 1) % 97));
    seqs[s].prompt_len = 3;
  }
  train::LossFn loss = [](size_t, const float* logp, const float*, int64_t n, float* dlogp, float*) {
    double l = 0;
    for (int64_t i = 0; i < n; ++i) l -= logp[i] * 0.1, dlogp[i] = -0.1f;
    return l;
  };
  for (train::Trainer* t : {&ta, &tb}) {
    t->accumulate(seqs, loss, train::ScoreOptions{});
    t->step();
  }
  ASSERT_EQ(std::memcmp(ta.params(), tb.params(), layout.nbytes()), 0);
  ra.sync(ta);
  rb.sync(tb);
  expect_same(ra.generate(requests(), nullptr, nullptr), rb.generate(requests(), nullptr, nullptr), "after");
}

}  // namespace
}  // namespace lockstep::rl
