// Rollout engine tests: batch invariance of outputs, seeded reproducibility,
// prefix sharing within a group and across requests, preemption under a tiny
// KV budget, and the alignment promise — the engine's logprobs equal the
// trainer's (Trainer::score) bit for bit.
#include <gtest/gtest.h>

#include <random>

#include "lockstep/model/params.h"
#include "lockstep/rollout/engine.h"
#include "lockstep/rollout/localise.h"
#include "lockstep/train/trainer.h"

namespace lockstep::rollout {
namespace {

ModelConfig tiny_moe(bool moe = true) {
  ModelConfig c;
  c.architecture = moe ? Architecture::Qwen3Moe : Architecture::Qwen3;
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.qk_norm = true;
  if (moe) {
    c.num_experts = 4;
    c.num_experts_per_tok = 2;
    c.moe_intermediate_size = 24;
    c.norm_topk_prob = true;
  } else {
    c.intermediate_size = 48;
  }
  c.max_position_embeddings = 256;
  c.eos_token_ids = {63};
  return c;
}

struct Model {
  explicit Model(const ModelConfig& c, uint64_t seed = 3) : layout(c), params(alloc_params(layout)) {
    init_params(layout, params.as<float>(), seed, 0.5f);  // large init: peaked, varied outputs
    weights = std::make_unique<model::ModelWeights>(Context{}, layout, params.as<float>());
  }
  ParamLayout layout;
  Buffer params;
  std::unique_ptr<model::ModelWeights> weights;
};

std::vector<int32_t> prompt(int n, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(int32_t(g() % 60));
  return p;
}

Request req(std::vector<int32_t> p, float temperature, int64_t n, int64_t max_new, int64_t seed = 1) {
  Request r;
  r.prompt_ids = std::move(p);
  r.params.temperature = temperature;
  r.params.n = n;
  r.params.max_new_tokens = max_new;
  r.params.seed = seed;
  return r;
}

EngineConfig small_config() {
  EngineConfig e;
  e.num_blocks = 256;
  e.block_size = 4;
  e.max_batch_tokens = 64;
  e.max_prefill_chunk = 16;
  return e;
}

}  // namespace

TEST(Engine, GreedyOutputIsTheSameAloneAndInABatchOf32) {
  Model m(tiny_moe());
  Engine alone(Context{}, m.weights.get(), small_config());
  auto ref = alone.generate({req(prompt(13, 1), 0.0f, 1, 12)});
  ThreadPool pool(2);
  Engine batched(Context{&pool, 0}, m.weights.get(), small_config());
  std::vector<Request> rs;
  for (int i = 0; i < 32; ++i)
    rs.push_back(i == 17 ? req(prompt(13, 1), 0.0f, 1, 12) : req(prompt(3 + i % 11, 100 + i), 0.8f, 1 + i % 3, 5 + i % 9));
  auto out = batched.generate(std::move(rs));
  ASSERT_EQ(out.size(), 32u);
  EXPECT_EQ(out[17].samples[0].output_ids, ref[0].samples[0].output_ids);
  EXPECT_EQ(out[17].samples[0].logprobs, ref[0].samples[0].logprobs);
  EXPECT_EQ(ref[0].samples[0].output_ids.size(), 12u);
  EXPECT_EQ(ref[0].samples[0].finish_reason, "length");
}

TEST(Engine, SeededSamplingIsReproducibleAndSeedsMatter) {
  Model m(tiny_moe());
  auto run = [&](int64_t seed) {
    Engine e(Context{}, m.weights.get(), small_config());
    return e.generate({req(prompt(9, 2), 1.0f, 4, 16, seed)})[0];
  };
  auto a = run(5), b = run(5), c = run(6);
  for (int k = 0; k < 4; ++k) EXPECT_EQ(a.samples[size_t(k)].output_ids, b.samples[size_t(k)].output_ids);
  bool differs = false;
  for (int k = 0; k < 4; ++k) differs = differs || a.samples[size_t(k)].output_ids != c.samples[size_t(k)].output_ids;
  EXPECT_TRUE(differs);
  // The n samples of one request differ from each other (independent streams).
  EXPECT_NE(a.samples[0].output_ids, a.samples[1].output_ids);
}

TEST(Engine, GroupSharesThePromptBlocks) {
  Model m(tiny_moe());
  EngineConfig cfg = small_config();
  Engine e(Context{}, m.weights.get(), cfg);
  e.submit(req(prompt(32, 3), 1.0f, 8, 3));  // 32 tokens = 8 full blocks of 4
  // Step until the first token of every sample exists.
  e.step();
  while (e.stats().generated_tokens < 8) ASSERT_TRUE(e.step());
  const int64_t used = e.stats().total_blocks - e.stats().free_blocks;
  // Shared: 8 prompt blocks + one private block per sample for its next token.
  EXPECT_LE(used, 8 + 8) << "without sharing this would be " << 8 * 9;
  e.run_until_done();
  EXPECT_EQ(e.stats().free_blocks, cfg.num_blocks);
}

TEST(Engine, PrefixCacheServesARepeatedPromptWithIdenticalResults) {
  Model m(tiny_moe());
  Engine e(Context{}, m.weights.get(), small_config());
  auto a = e.generate({req(prompt(30, 4), 0.7f, 2, 6)})[0];
  const int64_t hits0 = e.stats().prefix_hit_tokens;
  auto b = e.generate({req(prompt(30, 4), 0.7f, 2, 6)})[0];
  EXPECT_GT(e.stats().prefix_hit_tokens, hits0);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(a.samples[size_t(k)].output_ids, b.samples[size_t(k)].output_ids);
    EXPECT_EQ(a.samples[size_t(k)].logprobs, b.samples[size_t(k)].logprobs);
  }
  e.flush_cache();
  auto c = e.generate({req(prompt(30, 4), 0.7f, 2, 6)})[0];
  EXPECT_EQ(a.samples[0].output_ids, c.samples[0].output_ids);
}

// A finished sample's generated blocks are cached too: a request that
// continues its sequence (a multi-turn episode's next turn) is served from
// them, with the same bits as an engine without a prefix cache.
TEST(Engine, PrefixCacheServesAContinuedSequenceWithIdenticalResults) {
  for (bool moe : {true, false}) {
    Model m(tiny_moe(moe));
    Engine e(Context{}, m.weights.get(), small_config());
    const std::vector<int32_t> p = prompt(13, 9);
    Request turn = req(p, 0.8f, 1, 12);
    turn.params.ignore_eos = true;
    auto first = e.generate({turn})[0].samples[0];
    ASSERT_EQ(first.output_ids.size(), 12u) << "the test wants a turn that runs to max_new_tokens";
    std::vector<int32_t> next = p;
    next.insert(next.end(), first.output_ids.begin(), first.output_ids.end());
    for (int32_t t : prompt(5, 10)) next.push_back(t);
    const int64_t hits0 = e.stats().prefix_hit_tokens;
    auto cached = e.generate({req(next, 0.8f, 2, 8, 7)})[0];
    // 13 + 11 fed tokens = 6 full blocks of 4; the prompt alone had 3.
    EXPECT_EQ(e.stats().prefix_hit_tokens - hits0, 24);
    EngineConfig off = small_config();
    off.prefix_cache = false;
    Engine plain(Context{}, m.weights.get(), off);
    auto ref = plain.generate({req(next, 0.8f, 2, 8, 7)})[0];
    EXPECT_EQ(plain.stats().prefix_hit_tokens, 0);
    for (int k = 0; k < 2; ++k) {
      EXPECT_EQ(cached.samples[size_t(k)].output_ids, ref.samples[size_t(k)].output_ids);
      EXPECT_EQ(cached.samples[size_t(k)].logprobs, ref.samples[size_t(k)].logprobs);
    }
  }
}

TEST(Engine, TinyKvBudgetForcesPreemptionAndResultsStayTheSame) {
  Model m(tiny_moe());
  std::vector<Request> rs;
  for (int i = 0; i < 6; ++i) rs.push_back(req(prompt(10 + i, 50 + i), 0.9f, 2, 24, 7 + i));
  Engine big(Context{}, m.weights.get(), small_config());
  auto ref = big.generate(rs);
  EngineConfig tiny = small_config();
  tiny.num_blocks = 24;  // far fewer than 6 requests x 2 samples x ~9 blocks
  Engine small(Context{}, m.weights.get(), tiny);
  auto out = small.generate(rs);
  EXPECT_GT(small.stats().preemptions, 0);
  for (size_t i = 0; i < rs.size(); ++i)
    for (size_t k = 0; k < 2; ++k) {
      EXPECT_EQ(out[i].samples[k].output_ids, ref[i].samples[k].output_ids) << i << "/" << k;
      EXPECT_EQ(out[i].samples[k].logprobs, ref[i].samples[k].logprobs) << i << "/" << k;
    }
  EXPECT_EQ(small.stats().free_blocks, tiny.num_blocks);
}

TEST(Engine, StopTokensLengthAndAbort) {
  Model m(tiny_moe());
  Engine e(Context{}, m.weights.get(), small_config());
  auto g = e.generate({req(prompt(5, 6), 0.0f, 1, 40)})[0].samples[0];
  ASSERT_FALSE(g.output_ids.empty());
  // Make the first greedy token a stop token: the sample ends right there.
  Request r = req(prompt(5, 6), 0.0f, 1, 40);
  r.params.stop_token_ids = {g.output_ids[0]};
  auto s = e.generate({r})[0].samples[0];
  EXPECT_EQ(s.finish_reason, "stop");
  EXPECT_EQ(s.output_ids.size(), 1u);
  // Abort before running.
  uint64_t id = e.submit(req(prompt(5, 7), 1.0f, 3, 40));
  e.abort(id);
  auto ab = e.run_until_done(id)[0];
  for (auto& x : ab.samples) EXPECT_EQ(x.finish_reason, "abort");
}

TEST(Engine, BadRequestsAreRejectedWithAMessage) {
  Model m(tiny_moe());
  Engine e(Context{}, m.weights.get(), small_config());
  EXPECT_THROW(e.submit(req({}, 1.0f, 1, 4)), Error);
  EXPECT_THROW(e.submit(req(std::vector<int32_t>{1, 2, 99}, 1.0f, 1, 4)), Error);
  EXPECT_THROW(e.submit(req(prompt(300, 1), 1.0f, 1, 4)), Error);
  EXPECT_THROW(e.submit(req(prompt(3, 1), -1.0f, 1, 4)), Error);
  Request r = req(prompt(3, 1), 1.0f, 1, 4);
  r.params.stop = {"x"};
  EXPECT_THROW(e.submit(r), Error);  // no tokenizer
}

TEST(Engine, UpdateWeightsTakesEffectAndFlushesTheCache) {
  Model m(tiny_moe()), m2(tiny_moe(), 99);
  m2.weights->refresh(Context{}, 7);
  Engine e(Context{}, m.weights.get(), small_config());
  auto a = e.generate({req(prompt(12, 8), 0.0f, 1, 8)})[0];
  e.update_weights(m2.weights.get());
  auto b = e.generate({req(prompt(12, 8), 0.0f, 1, 8)})[0];
  EXPECT_EQ(b.samples[0].weight_version, 7u);
  EXPECT_NE(a.samples[0].output_ids, b.samples[0].output_ids);
}

// The alignment promise, engine side: every logprob the engine reports equals
// the trainer's score of the same tokens, bit for bit, whatever the batch,
// chunking, prefix sharing and thread count.
TEST(Alignment, RolloutLogprobsEqualTrainerLogprobsBitForBit) {
  for (bool moe : {false, true}) {
    Model m(tiny_moe(moe));
    for (float temperature : {1.0f, 0.7f}) {
      for (int threads : {1, 2}) {
        for (int64_t chunk : {3, 512}) {
          for (bool prefix : {false, true}) {
            ThreadPool pool(threads);
            Context ctx{&pool, 0};
            EngineConfig cfg = small_config();
            cfg.max_prefill_chunk = chunk;
            cfg.prefix_cache = prefix;
            Engine e(ctx, m.weights.get(), cfg);
            std::vector<Request> rs;
            for (int i = 0; i < 10; ++i) rs.push_back(req(prompt(4 + 3 * i, 200 + i % 4), temperature, 3, 10, i));
            auto out = e.generate(rs);
            // Trainer side.
            Buffer copy(m.layout.nbytes());
            std::memcpy(copy.data(), m.params.data(), m.layout.nbytes());
            train::Trainer t(ctx, m.layout.config(), std::move(copy), {});
            std::vector<train::TrainSequence> seqs;
            std::vector<const SampleResult*> samples;
            for (auto& r : out)
              for (auto& s : r.samples) {
                train::TrainSequence ts;
                ts.tokens = r.prompt_ids;
                ts.tokens.insert(ts.tokens.end(), s.output_ids.begin(), s.output_ids.end());
                ts.prompt_len = int32_t(r.prompt_ids.size());
                seqs.push_back(ts);
                samples.push_back(&s);
              }
            train::ScoreOptions so;
            so.temperature = temperature;
            auto scores = t.score(seqs, so);
            int64_t tokens = 0;
            for (size_t i = 0; i < seqs.size(); ++i) {
              ASSERT_EQ(scores[i].logp.size(), samples[i]->logprobs.size());
              for (size_t j = 0; j < scores[i].logp.size(); ++j) {
                ASSERT_EQ(0, std::memcmp(&scores[i].logp[j], &samples[i]->logprobs[j], 4))
                    << "moe=" << moe << " T=" << temperature << " threads=" << threads << " chunk=" << chunk
                    << " prefix=" << prefix << " seq " << i << " token " << j << ": " << scores[i].logp[j]
                    << " vs " << samples[i]->logprobs[j];
                ++tokens;
              }
            }
            EXPECT_GT(tokens, 100);
          }
        }
      }
    }
  }
}

TEST(Engine, RoutedExpertsCoverEveryTokenAndReplayReproducesTrainerLogprobs) {
  Model m(tiny_moe());
  Engine e(Context{}, m.weights.get(), small_config());
  Request r = req(prompt(11, 9), 1.0f, 2, 7);
  r.return_experts = true;
  auto out = e.generate({r})[0];
  const int64_t row = 2 /*L_moe*/ * 2 /*K*/;
  for (auto& s : out.samples) {
    ASSERT_EQ(int64_t(s.routed_experts.size()), int64_t(11 + s.output_ids.size()) * row);
    for (int32_t x : s.routed_experts) ASSERT_TRUE(x >= 0 && x < 4);
    EXPECT_TRUE(s.indexer_topk.empty()) << "no CSA layers, no indexer record";
  }
  Buffer copy(m.layout.nbytes());
  std::memcpy(copy.data(), m.params.data(), m.layout.nbytes());
  train::Trainer t(Context{}, m.layout.config(), std::move(copy), {});
  std::vector<train::TrainSequence> seqs;
  for (auto& s : out.samples) {
    train::TrainSequence ts;
    ts.tokens = out.prompt_ids;
    ts.tokens.insert(ts.tokens.end(), s.output_ids.begin(), s.output_ids.end());
    ts.prompt_len = 11;
    ts.routed_experts = s.routed_experts;
    seqs.push_back(ts);
  }
  train::ScoreOptions so;
  so.replay = true;
  auto scores = t.score(seqs, so);
  for (size_t i = 0; i < seqs.size(); ++i) EXPECT_EQ(scores[i].logp, out.samples[i].logprobs);
}

// Teacher forcing decodes the given tokens one step at a time: replaying a
// sampled run's tokens (another engine, another seed, in a batch) gives its
// logprobs bit for bit, and any other tokens are taken as given.
TEST(Engine, ForcedOutputReplaysASampledRunBitForBit) {
  Model m(tiny_moe());
  Engine e(Context{}, m.weights.get(), small_config());
  const RequestResult ran = e.generate({req(prompt(11, 4), 1.0f, 1, 10, 7)})[0];
  const std::vector<int32_t>& out = ran.samples[0].output_ids;
  ASSERT_EQ(out.size(), 10u);

  Request forced = req(prompt(11, 4), 1.0f, 1, 40, 99);
  forced.forced_output = out;
  std::vector<int32_t> other(out.rbegin(), out.rend());
  Request forced_other = req(prompt(11, 4), 1.0f, 1, 40, 99);
  forced_other.forced_output = other;
  ThreadPool pool(2);
  Engine replay(Context{&pool, 0}, m.weights.get(), small_config());
  const auto res = replay.generate({req(prompt(5, 5), 0.7f, 2, 9), forced, forced_other});
  EXPECT_EQ(res[1].samples[0].output_ids, out);
  EXPECT_EQ(res[1].samples[0].logprobs, ran.samples[0].logprobs);
  EXPECT_EQ(res[1].samples[0].finish_reason, "length");
  EXPECT_EQ(res[2].samples[0].output_ids, other);
  EXPECT_NE(res[2].samples[0].logprobs, ran.samples[0].logprobs);

  Request bad = req(prompt(3, 6), 1.0f, 1, 4);
  bad.forced_output = {1, 64};
  EXPECT_THROW(replay.submit(bad), Error);
}

// localise_sample names where a rollout whose weights differ from the
// trainer's in one element of layer 1's output projection first parts from
// the trainer's forward, and finds nothing when both read the same weights.
TEST(Engine, LocaliseSampleNamesTheFirstDifferingIntermediate) {
  const ModelConfig c = tiny_moe();
  Model m(c), bent(c);
  ModelParams p = bind(bent.layout, bent.params.as<float>());
  p.layers[1].wo.f32()[5] += 0.25f;
  bent.weights->refresh(Context{}, 1);
  Engine e(Context{}, m.weights.get(), small_config());
  const RequestResult ran = e.generate({req(prompt(9, 8), 1.0f, 1, 8, 3)})[0];
  std::vector<int32_t> tokens = ran.prompt_ids;
  tokens.insert(tokens.end(), ran.samples[0].output_ids.begin(), ran.samples[0].output_ids.end());
  const SamplingParams sp = req({}, 1.0f, 1, 8).params;

  const std::string same = localise_sample(Context{}, *m.weights, *m.weights, small_config(), tokens, 9, sp);
  EXPECT_EQ(same.rfind("no intermediate differs", 0), 0u) << same;
  const std::string bent_where = localise_sample(Context{}, *bent.weights, *m.weights, small_config(), tokens, 9, sp);
  EXPECT_NE(bent_where.find("first divergence: layer 1 'attn_out'"), std::string::npos) << bent_where;
  EXPECT_NE(bent_where.find("position 0"), std::string::npos) << bent_where;
}

}  // namespace lockstep::rollout
