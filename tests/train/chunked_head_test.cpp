// Training with the logits in chunks (TrainerConfig::logits_chunk): the LM
// head's forward and backward a few rows (and vocabulary columns) at a time.
// Losses, logprobs, gradients and the weights after AdamW steps must have the
// bits of the unchunked pass (logits_chunk = 0) at every chunk size, for
// dense models with tied and untied embeddings, MoE and DeepSeek-V4, at f32
// and bf16, for an SFT loss and an RL loss with an entropy term.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/small_models.h"
#include "common/test_util.h"
#include "common/v4_config.h"
#include "lockstep/model/params.h"
#include "lockstep/train/trainer.h"

namespace lockstep::train {
namespace {

ModelConfig tied_dense() {
  return test::small_tied_dense();
}

ModelConfig untied_dense() {
  ModelConfig c = tied_dense();
  c.architecture = Architecture::Qwen2;
  c.vocab_size = 83;
  c.qk_norm = false;
  c.qkv_bias = true;
  c.tie_word_embeddings = false;
  return c;
}

ModelConfig moe() {
  return test::small_moe();
}

std::vector<TrainSequence> sequences(const ModelConfig& c) {
  std::vector<TrainSequence> out;
  for (int s = 0; s < 4; ++s) {
    TrainSequence t;
    for (int i = 0; i < 6 + 5 * s; ++i) t.tokens.push_back(int32_t((i * 29 + s * 11 + 3) % c.vocab_size));
    t.prompt_len = 1 + s;
    out.push_back(std::move(t));
  }
  return out;
}

// The logit rows of all the sequences (one micro-batch holds them all).
int64_t rows_of(const std::vector<TrainSequence>& seqs) {
  int64_t r = 0;
  for (const auto& s : seqs) r += s.num_targets();
  return r;
}

// SFT: the mean negative logprob. RL: a weighted logprob minus an entropy bonus.
LossFn loss_fn(bool rl) {
  return [rl](size_t i, const float* logp, const float* ent, int64_t n, float* dlogp, float* dent) {
    double l = 0;
    for (int64_t t = 0; t < n; ++t) {
      const float w = rl ? 0.1f * float(int64_t(i) - 1 + t % 3) : 1.0f / float(n);
      l -= double(w) * double(logp[t]);
      dlogp[t] = -w;
      if (rl) {
        l -= 0.01 * double(ent[t]);
        dent[t] = -0.01f;
      }
    }
    return l;
  };
}

struct Run {
  std::vector<double> losses;
  std::vector<float> logp;    // every step's, all sequences
  std::vector<float> grads;   // the first step's
  std::vector<float> params;  // after the last step
};

struct Case {
  ModelConfig c;
  DType precision = DType::F32;
  bool rl = false;
  int64_t micro_batch_tokens = 1 << 20;
  bool recompute = false;
  double mtp_loss_coef = 0, indexer_loss_coef = 0;
  bool in_place = false;  // TrainerConfig::in_place_weights
};

Run train(const Case& k, int64_t chunk) {
  ParamLayout layout(k.c);
  Buffer p = alloc_params(layout);
  init_params(layout, p.as<float>(), 17, 0.4f);
  TrainerConfig tc;
  tc.precision = k.precision;
  tc.logits_chunk = chunk;
  tc.micro_batch_tokens = k.micro_batch_tokens;
  tc.recompute_activations = k.recompute;
  tc.mtp_loss_coef = k.mtp_loss_coef;
  tc.indexer_loss_coef = k.indexer_loss_coef;
  tc.in_place_weights = k.in_place;
  tc.optim.lr = 1e-2;
  Trainer t(Context{}, k.c, std::move(p), tc);
  const auto seqs = sequences(k.c);
  ScoreOptions so;
  so.entropy = k.rl;
  so.temperature = k.rl ? 0.8f : 1.0f;
  Run r;
  for (int step = 0; step < 2; ++step) {
    std::vector<TokenScores> scores;
    r.losses.push_back(t.accumulate(seqs, loss_fn(k.rl), so, &scores));
    for (const auto& s : scores) r.logp.insert(r.logp.end(), s.logp.begin(), s.logp.end());
    if (step == 0) r.grads.assign(t.grads(), t.grads() + t.layout().numel());
    t.step();
  }
  r.params.assign(t.params(), t.params() + t.layout().numel());
  return r;
}

void expect_same(const Run& a, const Run& b, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i) EXPECT_EQ(a.losses[i], b.losses[i]) << "loss of step " << i;
  ASSERT_EQ(a.logp.size(), b.logp.size());
  test::expect_bits_equal(a.logp.data(), b.logp.data(), int64_t(a.logp.size()), "logp");
  test::expect_bits_equal(a.grads.data(), b.grads.data(), int64_t(a.grads.size()), "gradients");
  test::expect_bits_equal(a.params.data(), b.params.data(), int64_t(a.params.size()), "params after 2 steps");
}

void check_every_chunk_size(const Case& k) {
  const int64_t R = rows_of(sequences(k.c));
  const Run whole = train(k, 0);
  ASSERT_FALSE(whole.grads.empty());
  for (int64_t chunk : {int64_t(1), int64_t(3), int64_t(7), R - 1, R + 5}) {
    expect_same(whole, train(k, chunk),
                "chunk " + std::to_string(chunk) + " of R = " + std::to_string(R) + ", " +
                    dtype_name(k.precision) + (k.rl ? ", RL" : ", SFT") + ", micro-batch " +
                    std::to_string(k.micro_batch_tokens) + (k.recompute ? ", recompute" : "") +
                    (k.in_place ? ", in place" : ""));
  }
}

void check_model(const ModelConfig& c, std::vector<DType> precisions) {
  for (DType p : precisions)
    for (bool rl : {false, true}) check_every_chunk_size({c, p, rl});
  check_every_chunk_size({c, DType::F32, true, 20});                          // several micro-batches
  check_every_chunk_size({c, DType::BF16, true, 20, true});                   // and recompute
  check_every_chunk_size({c, DType::F32, true, 1 << 20, false, 0, 0, true});  // the master read in place
}

TEST(ChunkedHeadTraining, TiedDenseIsBitIdentical) {
  check_model(tied_dense(), {DType::F32, DType::BF16});
}
TEST(ChunkedHeadTraining, UntiedDenseIsBitIdentical) {
  check_model(untied_dense(), {DType::F32, DType::BF16});
}
TEST(ChunkedHeadTraining, MoeIsBitIdentical) {
  check_model(moe(), {DType::F32, DType::BF16});
}

// fp8 heads train unchunked (the column blocks take f32/bf16 heads only): the
// setting still gives the same bits.
TEST(ChunkedHeadTraining, Fp8TrainsAsBefore) {
  check_every_chunk_size({tied_dense(), DType::FP8E4M3, true});
}

// DeepSeek-V4: the main head in chunks, the MTP heads whole, with the MTP and
// the indexer losses adding into the same gradients.
TEST(ChunkedHeadTraining, V4IsBitIdentical) {
  ModelConfig c = test::tiny_v4();
  for (bool rl : {false, true}) check_every_chunk_size({c, DType::F32, rl});
  c.num_nextn_predict_layers = 1;
  c.compress_ratios.push_back(0);
  check_every_chunk_size({c, DType::F32, true, 1 << 20, false, 0.3, 0.2});
  check_every_chunk_size({c, DType::F32, false, 20, true, 0.3, 0.2});
}

}  // namespace
}  // namespace lockstep::train
