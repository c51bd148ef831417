// The engine's background loop under load: callers (submit, stats, abort,
// weight updates) wait one step for the lock, not a generation; a request
// submitted while a long one runs joins the running batch; an abort ends its
// samples within a step, frees their KV blocks and stops their tokens.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "lockstep/model/params.h"
#include "lockstep/rollout/engine.h"

namespace lockstep::rollout {
namespace {

using namespace std::chrono_literals;

ModelConfig tiny_long_context() {
  ModelConfig c;
  c.architecture = Architecture::Qwen3;
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.qk_norm = true;
  c.intermediate_size = 48;
  c.max_position_embeddings = 4096;
  c.eos_token_ids = {63};
  return c;
}

struct Model {
  explicit Model(const ModelConfig& c, uint64_t seed) : layout(c), params(alloc_params(layout)) {
    init_params(layout, params.as<float>(), seed, 0.5f);
    weights = std::make_unique<model::ModelWeights>(Context{}, layout, params.as<float>());
  }
  ParamLayout layout;
  Buffer params;
  std::unique_ptr<model::ModelWeights> weights;
};

Request long_request(int64_t n, int64_t max_new) {
  Request r;
  r.prompt_ids = {1, 2, 3, 4, 5, 6, 7, 8};
  r.params.temperature = 1.0f;
  r.params.n = n;
  r.params.max_new_tokens = max_new;
  r.params.ignore_eos = true;
  r.params.seed = 11;
  return r;
}

EngineConfig config(EngineConfig::UpdatePolicy policy = EngineConfig::UpdatePolicy::Finish) {
  EngineConfig e;
  e.num_blocks = 4096;
  e.block_size = 16;
  e.update_policy = policy;
  return e;
}

// Polls until pred() or 60 s; false on timeout.
template <class Pred>
bool wait_until(Pred pred) {
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (!pred())
    if (std::chrono::steady_clock::now() > deadline)
      return false;
    else
      std::this_thread::sleep_for(1ms);
  return true;
}

}  // namespace

// The n=16, 2000-token request runs; a 4-token request submitted meanwhile
// joins the batch: its answer comes a few steps later, while the long one is
// still far from done. Then an abort ends the long one within a step.
TEST(EngineBackground, ARequestJoinsARunningGenerationAndAnAbortStopsIt) {
  Model m(tiny_long_context(), 3);
  Engine e(Context{}, m.weights.get(), config());
  e.start_background();
  uint64_t big_id = 0;
  auto big = e.submit_async(long_request(16, 2000), {}, &big_id);
  ASSERT_NE(big_id, 0u);
  ASSERT_TRUE(wait_until([&] { return e.stats().generated_tokens >= 16 * 3; }));

  const int64_t steps_before = e.stats().steps;
  Request small = long_request(1, 4);
  small.params.temperature = 0.0f;
  auto quick = e.submit_async(small);
  ASSERT_EQ(quick.wait_for(60s), std::future_status::ready);
  const int64_t steps_after = e.stats().steps;
  const RequestResult q = quick.get();
  EXPECT_EQ(q.samples[0].output_ids.size(), 4u);
  EXPECT_EQ(q.samples[0].finish_reason, "length");
  // One prefill step and three decodes, plus the steps taken while this
  // thread was descheduled on a busy machine: far fewer than the long one's 2000.
  EXPECT_LE(steps_after - steps_before, 200) << "the short request waited for the long one";
  EXPECT_NE(big.wait_for(0s), std::future_status::ready);
  EXPECT_LT(e.stats().generated_tokens, 16 * 1000);

  e.abort(big_id);
  ASSERT_EQ(big.wait_for(60s), std::future_status::ready);
  const RequestResult r = big.get();
  ASSERT_EQ(r.samples.size(), 16u);
  for (const SampleResult& s : r.samples) {
    EXPECT_EQ(s.finish_reason, "abort");
    EXPECT_LT(s.output_ids.size(), 2000u);
  }
  // No token after the abort, and every KV block is free again.
  const EngineStats after = e.stats();
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(e.stats().generated_tokens, after.generated_tokens);
  EXPECT_EQ(after.running, 0);
  EXPECT_EQ(after.free_blocks, after.total_blocks);
  e.stop_background();
}

// stop_background does not wait for a generation to finish.
TEST(EngineBackground, StopDoesNotWaitForTheGeneration) {
  Model m(tiny_long_context(), 3);
  Engine e(Context{}, m.weights.get(), config());
  e.start_background();
  auto big = e.submit_async(long_request(16, 2000));
  ASSERT_TRUE(wait_until([&] { return e.stats().generated_tokens >= 16; }));
  e.stop_background();
  EXPECT_LT(e.stats().generated_tokens, 16 * 1000);
}

// A weight update while a long request runs is applied at the next step: with
// policy Finish the running samples continue on the new weights, and a request
// submitted after the switch starts on them.
TEST(EngineBackground, WeightUpdateFinishPolicyContinuesOnTheNewWeights) {
  Model m(tiny_long_context(), 3), m2(tiny_long_context(), 4);
  m2.weights->refresh(Context{}, 7);
  Engine e(Context{}, m.weights.get(), config());
  e.start_background();
  uint64_t big_id = 0;
  auto big = e.submit_async(long_request(4, 2000), {}, &big_id);
  ASSERT_TRUE(wait_until([&] { return e.stats().generated_tokens >= 8; }));
  e.update_weights(m2.weights.get());
  ASSERT_TRUE(wait_until([&] { return e.weight_version() == 7; }));
  const RequestResult next = e.submit_async(long_request(1, 2)).get();
  EXPECT_EQ(next.samples[0].weight_version, 7u);
  EXPECT_NE(big.wait_for(0s), std::future_status::ready);
  e.abort(big_id);
  const RequestResult r = big.get();
  for (const SampleResult& s : r.samples) {
    EXPECT_EQ(s.weight_version, 0u);
    EXPECT_EQ(s.weight_version_end, 7u);
  }
  e.stop_background();
}

// Policy Abort: the update ends the samples in flight with "abort" at the
// next step; a request submitted afterwards runs on the new weights.
TEST(EngineBackground, WeightUpdateAbortPolicyEndsTheRunningSamples) {
  Model m(tiny_long_context(), 3), m2(tiny_long_context(), 4);
  m2.weights->refresh(Context{}, 7);
  Engine e(Context{}, m.weights.get(), config(EngineConfig::UpdatePolicy::Abort));
  e.start_background();
  auto big = e.submit_async(long_request(4, 2000));
  ASSERT_TRUE(wait_until([&] { return e.stats().generated_tokens >= 8; }));
  e.update_weights(m2.weights.get());
  ASSERT_EQ(big.wait_for(60s), std::future_status::ready);
  for (const SampleResult& s : big.get().samples) {
    EXPECT_EQ(s.finish_reason, "abort");
    EXPECT_LT(s.output_ids.size(), 2000u);
  }
  const RequestResult next = e.submit_async(long_request(1, 2)).get();
  EXPECT_EQ(next.samples[0].weight_version, 7u);
  EXPECT_EQ(next.samples[0].finish_reason, "length");
  e.stop_background();
}

}  // namespace lockstep::rollout
