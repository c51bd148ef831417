// DeepSeek-V4 routing replay through the system: the engine records every
// token's experts and lightning-indexer choices (prefill chunks that split
// compression blocks, decode, forked samples); in aligned mode the trainer
// chooses the same and its replayed score is the rollout's logprobs bit for
// bit; in fast mode (bf16 rollout, f32 trainer) replay makes the router and
// indexer disagreement exactly 0.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "common/v4_config.h"
#include "lockstep/base/error.h"
#include "lockstep/model/params.h"
#include "lockstep/model/v4_forward.h"
#include "lockstep/rollout/engine.h"
#include "lockstep/train/mismatch.h"
#include "lockstep/train/trainer.h"

namespace lockstep::rollout {
namespace {

// The shared toy model: layer 0 hash-routed and window-only, layers 1 and 3
// CSA (ratio 4, indexer, KI = 3), layer 2 HCA (ratio 128); its clamp is
// raised to 0.6 here so the engine's samples hit it.
ModelConfig tiny_v4() {
  ModelConfig c = test::tiny_v4();
  c.swiglu_limit = 0.6;
  return c;
}

struct Model {
  explicit Model(const ModelConfig& c, uint64_t seed = 7) : layout(c), params(alloc_params(layout)) {
    init_params(layout, params.as<float>(), seed, 0.5f);
  }
  Buffer copy() const {
    Buffer b(layout.nbytes());
    std::memcpy(b.data(), params.data(), layout.nbytes());
    return b;
  }
  ParamLayout layout;
  Buffer params;
};

// Prompts of 10 and 13 tokens, 3 samples each, up to 24 new tokens: positions
// past 16, where a CSA query sees more compressed entries than it keeps.
std::vector<Request> requests(int64_t vocab) {
  std::vector<Request> out;
  std::mt19937 g(5);
  for (int len : {10, 13}) {
    Request r;
    for (int i = 0; i < len; ++i) r.prompt_ids.push_back(int32_t(2 + g() % uint32_t(vocab - 2)));
    r.params.temperature = 1.0f;
    r.params.n = 3;
    r.params.max_new_tokens = 24;
    r.params.ignore_eos = true;
    r.params.seed = 11 + len;
    r.return_experts = true;
    out.push_back(std::move(r));
  }
  return out;
}

EngineConfig engine_config() {
  EngineConfig e;
  e.num_blocks = 128;
  e.block_size = 4;
  e.max_batch_tokens = 32;
  e.max_prefill_chunk = 3;  // chunks that split compression blocks and windows
  e.bf16_kv = true;         // fast mode as `lockstep rl` asks (V4 keeps its f32 stores)
  return e;
}

struct Sampled {
  std::vector<train::TrainSequence> seqs;  // with the records for replay
  std::vector<std::vector<float>> logprobs;
};

Sampled sample(const model::ModelWeights& weights) {
  const ModelConfig& c = weights.config();
  const int64_t route_row = c.num_moe_layers() * c.num_experts_per_tok;
  const int64_t indexer_row = model::num_csa_layers(c) * c.index_topk;
  Engine e(Context{}, &weights, engine_config());
  Sampled out;
  for (const auto& r : e.generate(requests(c.vocab_size)))
    for (const auto& s : r.samples) {
      train::TrainSequence t;
      t.tokens = r.prompt_ids;
      t.tokens.insert(t.tokens.end(), s.output_ids.begin(), s.output_ids.end());
      t.prompt_len = int32_t(r.prompt_ids.size());
      EXPECT_EQ(int64_t(s.routed_experts.size()), int64_t(t.tokens.size()) * route_row);
      EXPECT_EQ(int64_t(s.indexer_topk.size()), int64_t(t.tokens.size()) * indexer_row);
      t.routed_experts = s.routed_experts;
      t.indexer_topk = s.indexer_topk;
      out.seqs.push_back(std::move(t));
      out.logprobs.push_back(s.logprobs);
    }
  return out;
}

// Between the rollout's choices and the trainer's: its own, with only the
// experts replayed, and with both replayed.
struct Disagreement {
  double router = 0, indexer = 0;
  double indexer_experts_replayed = 0;
  double router_replayed = 0, indexer_replayed = 0;
};

Disagreement disagreement(const model::ModelWeights& trainer, const Sampled& s) {
  const ModelConfig& c = trainer.config();
  std::vector<std::vector<int32_t>> r_exp, r_idx, own_exp, own_idx, rep_exp, rep_idx, half_idx;
  for (const auto& t : s.seqs) {
    train::TrainerChoices own = train::trainer_choices(Context{}, trainer, t.tokens, nullptr, nullptr);
    train::TrainerChoices half =
        train::trainer_choices(Context{}, trainer, t.tokens, &t.routed_experts, nullptr);
    train::TrainerChoices rep =
        train::trainer_choices(Context{}, trainer, t.tokens, &t.routed_experts, &t.indexer_topk);
    r_exp.push_back(t.routed_experts);
    r_idx.push_back(t.indexer_topk);
    own_exp.push_back(std::move(own.experts));
    own_idx.push_back(std::move(own.indexer));
    rep_exp.push_back(std::move(rep.experts));
    rep_idx.push_back(std::move(rep.indexer));
    half_idx.push_back(std::move(half.indexer));
  }
  const int64_t n_moe = c.num_moe_layers(), K = c.num_experts_per_tok;
  const int64_t n_csa = model::num_csa_layers(c), KI = c.index_topk;
  auto mean = [](const std::vector<double>& v) {
    double m = 0;
    for (double x : v) m += x;
    return v.empty() ? 0.0 : m / double(v.size());
  };
  Disagreement d;
  d.router = mean(train::router_disagreement(r_exp, own_exp, n_moe, K));
  d.router_replayed = mean(train::router_disagreement(r_exp, rep_exp, n_moe, K));
  d.indexer = train::indexer_disagreement(r_idx, own_idx, n_csa, KI);
  d.indexer_experts_replayed = train::indexer_disagreement(r_idx, half_idx, n_csa, KI);
  d.indexer_replayed = train::indexer_disagreement(r_idx, rep_idx, n_csa, KI);
  return d;
}

}  // namespace

// Aligned mode (f32 both sides): the trainer's own choices are the rollout's,
// and the replayed score is the rollout's logprobs bit for bit.
TEST(V4Replay, AlignedReplayReproducesTheRolloutLogprobsBitForBit) {
  const ModelConfig c = tiny_v4();
  Model m(c);
  model::ModelWeights weights(Context{}, m.layout, m.params.as<float>());
  const Sampled s = sample(weights);
  ASSERT_EQ(s.seqs.size(), 6u);
  // The indexer had to choose: some row keeps KI entries of more than KI visible.
  int64_t full_rows = 0;
  for (const auto& t : s.seqs)
    for (size_t i = 0; i + size_t(c.index_topk) <= t.indexer_topk.size(); i += size_t(c.index_topk))
      full_rows += t.indexer_topk[i + size_t(c.index_topk) - 1] >= 0;
  EXPECT_GT(full_rows, 50);

  train::Trainer trainer(Context{}, c, m.copy(), {});
  const Disagreement d = disagreement(trainer.weights(), s);
  EXPECT_EQ(d.router, 0.0);
  EXPECT_EQ(d.indexer, 0.0);
  for (bool replay : {false, true}) {
    train::ScoreOptions so;
    so.replay = replay;
    const auto scores = trainer.score(s.seqs, so);
    int64_t tokens = 0;
    for (size_t i = 0; i < s.seqs.size(); ++i) {
      ASSERT_EQ(scores[i].logp.size(), s.logprobs[i].size()) << "sequence " << i;
      for (size_t j = 0; j < scores[i].logp.size(); ++j, ++tokens)
        ASSERT_EQ(0, std::memcmp(&scores[i].logp[j], &s.logprobs[i][j], 4))
            << "replay=" << replay << " sequence " << i << " token " << j << ": " << scores[i].logp[j]
            << " vs " << s.logprobs[i][j];
    }
    EXPECT_EQ(tokens, 6 * 24);
  }
}

// Fast mode (bf16 rollout weights, f32 trainer): the trainer's own indexer
// chooses differently for some rows, also when only the experts are replayed;
// with replay its forward uses exactly the rollout's experts and entries.
TEST(V4Replay, FastModeReplayMakesTheIndexerDisagreementExactlyZero) {
  const ModelConfig c = tiny_v4();
  Model m(c);
  model::ModelWeights fast(Context{}, m.layout, m.params.as<float>(), DType::BF16);
  const Sampled s = sample(fast);
  train::Trainer trainer(Context{}, c, m.copy(), {});
  const Disagreement d = disagreement(trainer.weights(), s);
  EXPECT_GT(d.indexer, 0.0)
      << "the bf16 rollout should choose some entries differently (else replay proves nothing)";
  EXPECT_GT(d.indexer_experts_replayed, 0.0) << "routing replay alone should leave the indexer's choice free";
  EXPECT_EQ(d.router_replayed, 0.0);
  EXPECT_EQ(d.indexer_replayed, 0.0);
  // The trainer's replayed score differs from its own where the choices did.
  train::ScoreOptions replay;
  replay.replay = true;
  const auto replayed = trainer.score(s.seqs, replay);
  const auto plain = trainer.score(s.seqs, {});
  ASSERT_EQ(replayed.size(), s.seqs.size());
  int64_t changed = 0;
  for (size_t i = 0; i < s.seqs.size(); ++i)
    for (size_t j = 0; j < plain[i].logp.size(); ++j) changed += replayed[i].logp[j] != plain[i].logp[j];
  EXPECT_GT(changed, 0);
}

// The trainer scores with the replayed entries, not its indexer's: another
// valid choice for one (token, CSA layer) row changes that token's logprob
// and no earlier one.
TEST(V4Replay, TrainerScoresWithTheReplayedEntries) {
  const ModelConfig c = tiny_v4();
  Model m(c);
  model::ModelWeights weights(Context{}, m.layout, m.params.as<float>());
  Sampled s = sample(weights);
  s.seqs.resize(1);
  train::TrainSequence& t = s.seqs[0];
  const int64_t KI = c.index_topk, n_csa = model::num_csa_layers(c);
  // The second-to-last token predicts the last one; it sees (p + 1) / 4 entries.
  const int64_t p = int64_t(t.tokens.size()) - 2, visible = (p + 1) / 4;
  ASSERT_GT(visible, KI);
  int32_t* row = t.indexer_topk.data() + (p * n_csa + 1) * KI;  // the second CSA layer
  std::vector<int32_t> other;
  for (int32_t e = 0; e < visible && int64_t(other.size()) < KI; ++e)
    if (std::find(row, row + KI, e) == row + KI) other.push_back(e);
  ASSERT_EQ(int64_t(other.size()), KI);
  std::copy(other.begin(), other.end(), row);
  train::Trainer trainer(Context{}, c, m.copy(), {});
  train::ScoreOptions so;
  so.replay = true;
  const std::vector<float> got = trainer.score(s.seqs, so)[0].logp;
  const std::vector<float>& want = s.logprobs[0];
  ASSERT_EQ(got.size(), want.size());
  const size_t last = got.size() - 1;  // token p's logprob
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), last * sizeof(float))) << "earlier tokens changed";
  EXPECT_NE(got[last], want[last]) << "the replayed entries were not used";
}

// A record of the wrong size for this model is refused, naming the indexer.
TEST(V4Replay, IndexerRecordOfTheWrongSizeIsRefused) {
  const ModelConfig c = tiny_v4();
  Model m(c);
  model::ModelWeights weights(Context{}, m.layout, m.params.as<float>());
  Sampled s = sample(weights);
  s.seqs.resize(1);
  s.seqs[0].indexer_topk.resize(s.seqs[0].indexer_topk.size() - 1);
  train::Trainer trainer(Context{}, c, m.copy(), {});
  train::ScoreOptions so;
  so.replay = true;
  try {
    trainer.score(s.seqs, so);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("indexer replay needs"), std::string::npos) << e.what();
  }
}

}  // namespace lockstep::rollout
