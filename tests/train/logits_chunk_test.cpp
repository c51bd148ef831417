// Scoring's memory: the logits in chunks (TrainerConfig::logits_chunk; the
// forward stops at the vocabulary projection's input, and the trainer takes
// the logits and logprobs a few rows at a time) and one layer's K/V scratch
// for all layers. Every logprob and entropy must have the bits of the
// unchunked pass at every chunk size, for dense, MoE and DeepSeek-V4 models,
// at f32, bf16 and fp8, and with a temperature.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "common/small_models.h"
#include "common/v4_config.h"
#include "lockstep/base/error.h"
#include "lockstep/model/forward.h"
#include "lockstep/model/kv_cache.h"
#include "lockstep/model/params.h"
#include "lockstep/train/trainer.h"

namespace lockstep::train {
namespace {

ModelConfig moe_config() {
  return test::small_moe();
}

ModelConfig dense_config() {
  return test::small_tied_dense();
}

std::vector<TrainSequence> sequences(const ModelConfig& c) {
  std::mt19937 g(11);
  std::vector<TrainSequence> seqs;
  for (int len : {14, 5, 23, 9}) {
    TrainSequence s;
    for (int i = 0; i < len; ++i)
      s.tokens.push_back(int32_t(g() % uint32_t(std::min<int64_t>(c.vocab_size, 48))));
    s.prompt_len = 2;
    seqs.push_back(s);
  }
  return seqs;
}

std::vector<TokenScores> score(const ModelConfig& c, DType precision, int64_t chunk, float temperature,
                               int64_t micro_batch_tokens) {
  ParamLayout layout(c);
  Buffer params = alloc_params(layout);
  init_params(layout, params.as<float>(), 7, 0.4f);
  TrainerConfig tc;
  tc.precision = precision;
  tc.fp8_block = 16;
  tc.logits_chunk = chunk;
  tc.micro_batch_tokens = micro_batch_tokens;
  Trainer t(Context{}, c, std::move(params), tc);
  ScoreOptions so;
  so.entropy = true;
  so.temperature = temperature;
  return t.score(sequences(c), so);
}

void expect_same_bits(const std::vector<TokenScores>& a, const std::vector<TokenScores>& b,
                      const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].logp.size(), b[i].logp.size()) << what << " sequence " << i;
    ASSERT_FALSE(a[i].logp.empty());
    EXPECT_EQ(std::memcmp(a[i].logp.data(), b[i].logp.data(), a[i].logp.size() * sizeof(float)), 0)
        << what << ": logprob bits differ in sequence " << i;
    EXPECT_EQ(std::memcmp(a[i].entropy.data(), b[i].entropy.data(), a[i].entropy.size() * sizeof(float)), 0)
        << what << ": entropy bits differ in sequence " << i;
  }
}

void check_every_chunk_size(const ModelConfig& c, DType precision) {
  for (int64_t micro : {int64_t(1 << 20), int64_t(16)}) {
    const auto whole = score(c, precision, 0, 0.7f, micro);
    for (int64_t chunk : {1, 2, 5, 16, 49, 50, 1024}) {
      SCOPED_TRACE("chunk " + std::to_string(chunk) + ", micro-batch " + std::to_string(micro) + ", " +
                   dtype_name(precision));
      expect_same_bits(whole, score(c, precision, chunk, 0.7f, micro), "chunked");
    }
  }
}

TEST(LogitsChunk, DenseScoresHaveTheUnchunkedBits) {
  for (DType p : {DType::F32, DType::BF16, DType::FP8E4M3}) check_every_chunk_size(dense_config(), p);
}

TEST(LogitsChunk, MoeScoresHaveTheUnchunkedBits) {
  for (DType p : {DType::F32, DType::BF16, DType::FP8E4M3}) check_every_chunk_size(moe_config(), p);
}

TEST(LogitsChunk, V4ScoresHaveTheUnchunkedBits) {
  for (DType p : {DType::F32, DType::FP8E4M3}) check_every_chunk_size(test::tiny_v4(), p);
}

// The head input is the forward's last normed rows: projecting it gives the
// forward's own logits, bit for bit.
TEST(LogitsChunk, HeadInputProjectsToTheForwardsLogits) {
  const ModelConfig c = dense_config();
  ParamLayout layout(c);
  Buffer params = alloc_params(layout);
  init_params(layout, params.as<float>(), 3, 0.4f);
  model::ModelWeights w(Context{}, layout, params.as<float>());
  const std::vector<int32_t> toks = {1, 5, 9, 2, 44, 7, 3};
  std::vector<int32_t> blocks = {0};
  model::KvCache kv(c, 1, 16, DType::F32);
  model::RaggedBatch b(1);
  b.add_sequence(toks.data(), int32_t(toks.size()), 0, blocks.data(), 1);
  for (int32_t r = 0; r < int32_t(toks.size()); ++r) b.logit_rows.push_back(r);
  model::Workspace ws;
  model::ForwardResult full, deferred;
  model::forward(Context{}, w, kv, ws, b, model::ForwardOptions{}, &full);
  model::ForwardOptions no_head;
  no_head.lm_head = false;
  model::forward(Context{}, w, kv, ws, b, no_head, &deferred);
  EXPECT_EQ(deferred.logits.view().data, nullptr) << "the deferred forward wrote logits";
  OwnedTensor logits(DType::F32, {int64_t(toks.size()), c.vocab_size});
  model::lm_head_forward(Context{}, w, logits.view().slice_rows(0, 3),
                         deferred.head_input.view().slice_rows(0, 3));
  model::lm_head_forward(Context{}, w, logits.view().slice_rows(3, 7),
                         deferred.head_input.view().slice_rows(3, 7));
  EXPECT_EQ(std::memcmp(logits.f32(), full.logits.f32(), toks.size() * size_t(c.vocab_size) * sizeof(float)),
            0);
  // With saved activations too (a chunked training pass): the head input is
  // the saved normed rows backward starts from.
  model::Activations acts;
  no_head.save_activations = true;
  model::forward(Context{}, w, kv, ws, b, no_head, &deferred, &acts);
  EXPECT_EQ(std::memcmp(deferred.head_input.f32(), acts.normed_rows.f32(),
                        toks.size() * size_t(c.hidden_size) * sizeof(float)),
            0);
}

// Scoring's KV scratch: one array for every layer of a dense or MoE model
// (the scores above, taken on it, have the full cache's bits); DeepSeek-V4
// keeps its per-layer stores.
TEST(LogitsChunk, ScoringScratchHoldsOneLayersKeys) {
  const ModelConfig c = moe_config();
  const model::KvCache full(c, 8, 16), scratch = model::KvCache::scoring_scratch(c, 8, 16);
  EXPECT_TRUE(scratch.shared_layers());
  EXPECT_EQ(scratch.num_layers(), c.num_layers);
  EXPECT_EQ(scratch.nbytes() * size_t(c.num_layers), full.nbytes());
  EXPECT_EQ(scratch.k(0).data, scratch.k(c.num_layers - 1).data);
  const ModelConfig v4 = test::tiny_v4();
  const model::KvCache v4_scratch = model::KvCache::scoring_scratch(v4, 8, 16);
  EXPECT_FALSE(v4_scratch.shared_layers());
  EXPECT_EQ(v4_scratch.nbytes(), model::KvCache(v4, 8, 16).nbytes());
}

}  // namespace
}  // namespace lockstep::train
