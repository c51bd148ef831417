// The engine's per-request options beyond plain sampling: top-N alternative
// logprobs (each bit for bit what token_logprob_forward, and so the trainer,
// gives for that token), prompt logprobs (equal to the trainer's score of the
// same ids), and the logit processors (logit_bias, min_new_tokens, the
// penalties), which change what is sampled but never the reported logprobs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "lockstep/kernels/cpu/softmax.h"
#include "lockstep/model/params.h"
#include "lockstep/rollout/engine.h"
#include "lockstep/rollout/logit_processors.h"
#include "lockstep/rollout/rollout_config.h"
#include "lockstep/train/trainer.h"

namespace lockstep::rollout {
namespace {

ModelConfig tiny_moe() {
  ModelConfig c;
  c.architecture = Architecture::Qwen3Moe;
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.qk_norm = true;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 24;
  c.norm_topk_prob = true;
  c.max_position_embeddings = 256;
  c.eos_token_ids = {63};
  return c;
}

struct Model {
  Model() : layout(tiny_moe()), params(alloc_params(layout)) {
    init_params(layout, params.as<float>(), 3, 0.5f);
    weights = std::make_unique<model::ModelWeights>(Context{}, layout, params.as<float>());
  }
  // A trainer over a copy of the same f32 weights.
  std::unique_ptr<train::Trainer> trainer(const Context& ctx) const {
    Buffer copy(layout.nbytes());
    std::memcpy(copy.data(), params.data(), layout.nbytes());
    return std::make_unique<train::Trainer>(ctx, layout.config(), std::move(copy), train::TrainerConfig{});
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

EngineConfig small_config(int64_t chunk = 16) {
  EngineConfig e;
  e.num_blocks = 256;
  e.block_size = 4;
  e.max_batch_tokens = 64;
  e.max_prefill_chunk = chunk;
  return e;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// The trainer's logprob of every token of `tokens` from position 1 on.
std::vector<float> trainer_logp(train::Trainer& t, const std::vector<int32_t>& tokens, float temperature) {
  train::TrainSequence s;
  s.tokens = tokens;
  s.prompt_len = 1;
  train::ScoreOptions so;
  so.temperature = temperature;
  return t.score({s}, so)[0].logp;
}

// The trainer's logprob of every vocabulary token after `prefix`: one
// sequence per candidate, so the ranking can be checked without the engine.
std::vector<float> trainer_row(train::Trainer& t, const std::vector<int32_t>& prefix, int64_t V, float temperature) {
  std::vector<train::TrainSequence> seqs;
  for (int64_t v = 0; v < V; ++v) {
    train::TrainSequence s;
    s.tokens = prefix;
    s.tokens.push_back(int32_t(v));
    s.prompt_len = int32_t(prefix.size());
    seqs.push_back(std::move(s));
  }
  train::ScoreOptions so;
  so.temperature = temperature;
  std::vector<float> row;
  for (auto& sc : t.score(seqs, so)) row.push_back(sc.logp.at(0));
  return row;
}

// The k best of `row` by (logprob descending, id ascending).
TopLogprobs brute_top(const std::vector<float>& row, int64_t k) {
  std::vector<int32_t> idx(row.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = int32_t(i);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return row[size_t(a)] > row[size_t(b)]; });
  TopLogprobs out;
  for (int64_t i = 0; i < k; ++i) out.emplace_back(idx[size_t(i)], row[size_t(idx[size_t(i)])]);
  return out;
}

void expect_same(const TopLogprobs& got, const TopLogprobs& want, const std::string& where) {
  ASSERT_EQ(got.size(), want.size()) << where;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first) << where << " rank " << i;
    EXPECT_TRUE(same_bits(got[i].second, want[i].second))
        << where << " rank " << i << ": " << got[i].second << " vs " << want[i].second;
  }
}

}  // namespace

// top_logprobs against the kernel itself, on rows with ties and -inf.
TEST(TopLogprobs, EachValueIsTokenLogprobForwardsAndTiesGoToTheLowerId) {
  const int64_t R = 5, V = 37, k = 7;
  std::mt19937 g(11);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> logits(size_t(R * V));  // (R, V)
  for (auto& x : logits) x = nd(g);
  for (int64_t v = 0; v < V; v += 3) logits[size_t(2 * V + v)] = 20.0f;  // row 2: its top 7 all tied
  for (int64_t v = 0; v < V; v += 2) logits[size_t(3 * V + v)] = -std::numeric_limits<float>::infinity();
  for (float t : {1.0f, 0.7f}) {
    std::vector<TopLogprobs> top;
    top_logprobs(Context{}, Tensor(logits.data(), DType::F32, {R, V}), k, t, &top);
    ASSERT_EQ(int64_t(top.size()), R);
    for (int64_t r = 0; r < R; ++r) {
      // Every token's logprob on this row through token_logprob_forward.
      std::vector<float> row(static_cast<size_t>(V));
      for (int64_t v = 0; v < V; ++v) {
        int32_t target = int32_t(v);
        float lp = 0;
        kernels::token_logprob_forward(Context{}, Tensor(&lp, DType::F32, {1}), Tensor(), Tensor(),
                                       Tensor(logits.data() + r * V, DType::F32, {1, V}),
                                       Tensor(&target, DType::I32, {1}), t);
        row[size_t(v)] = lp;
      }
      expect_same(top[size_t(r)], brute_top(row, k), "T=" + std::to_string(t) + " row " + std::to_string(r));
    }
  }
}

// Alternatives of output tokens: the trainer's ranking and bits at every position.
TEST(TopLogprobs, OutputAlternativesEqualTheTrainersAtEveryPosition) {
  Model m;
  ThreadPool pool(2);
  Context ctx{&pool, 0};
  auto trainer = m.trainer(ctx);
  for (float temperature : {0.0f, 0.8f}) {
    Engine e(ctx, m.weights.get(), small_config());
    std::vector<Request> rs;
    for (int i = 0; i < 3; ++i) {
      rs.push_back(req(prompt(5 + 4 * i, 30 + i), temperature, 2, 6, i));
      rs.back().params.top_logprobs = 1 + 2 * i;
    }
    rs.push_back(req(prompt(7, 40), temperature, 1, 6));  // asks for none
    auto out = e.generate(rs);
    EXPECT_TRUE(out[3].samples[0].top_logprobs.empty());
    const float lt = temperature > 0 ? temperature : 1.0f;
    for (int i = 0; i < 3; ++i)
      for (const SampleResult& s : out[size_t(i)].samples) {
        ASSERT_EQ(s.top_logprobs.size(), s.output_ids.size());
        std::vector<int32_t> prefix = out[size_t(i)].prompt_ids;
        for (size_t j = 0; j < s.output_ids.size(); ++j) {
          const std::vector<float> row = trainer_row(*trainer, prefix, 64, lt);
          expect_same(s.top_logprobs[j], brute_top(row, 1 + 2 * i),
                      "request " + std::to_string(i) + " token " + std::to_string(j));
          EXPECT_GE(s.top_logprobs[j][0].second, s.logprobs[j]);
          prefix.push_back(s.output_ids[j]);
        }
      }
  }
}

// Prompt logprobs: the trainer's score of the prompt, whatever the chunking.
TEST(PromptLogprobs, EqualTheTrainersScoreOfThePromptBitForBit) {
  Model m;
  ThreadPool pool(2);
  Context ctx{&pool, 0};
  auto trainer = m.trainer(ctx);
  for (int64_t chunk : {3, 512}) {
    Engine e(ctx, m.weights.get(), small_config(chunk));
    // A first request publishes the prompt's blocks; the prompt-logprob ones must not use them.
    e.generate({req(prompt(21, 50), 1.0f, 1, 2)});
    std::vector<Request> rs;
    for (int64_t start : {0, 1, 7, 20}) {
      rs.push_back(req(prompt(21, 50), 0.7f, 2, 4, start));
      rs.back().prompt_logprob_start = start;
      rs.back().params.top_logprobs = start == 7 ? 3 : 0;
    }
    auto out = e.generate(rs);
    const std::vector<int32_t> p = prompt(21, 50);
    const std::vector<float> want = trainer_logp(*trainer, p, 0.7f);  // positions 1..20
    for (size_t i = 0; i < rs.size(); ++i) {
      const RequestResult& r = out[i];
      const int64_t start = rs[i].prompt_logprob_start;
      EXPECT_EQ(r.prompt_logprob_start, start);
      ASSERT_EQ(int64_t(r.prompt_logprobs.size()), 21 - start);
      for (int64_t pos = start; pos < 21; ++pos) {
        const float got = r.prompt_logprobs[size_t(pos - start)];
        if (pos == 0) {
          EXPECT_TRUE(std::isnan(got));
          continue;
        }
        EXPECT_TRUE(same_bits(got, want[size_t(pos - 1)]))
            << "chunk " << chunk << " start " << start << " position " << pos << ": " << got << " vs "
            << want[size_t(pos - 1)];
      }
      if (rs[i].params.top_logprobs == 0) {
        EXPECT_TRUE(r.prompt_top_logprobs.empty());
        continue;
      }
      ASSERT_EQ(r.prompt_top_logprobs.size(), r.prompt_logprobs.size());
      for (int64_t pos = start; pos < 21; ++pos) {
        const std::vector<int32_t> prefix(p.begin(), p.begin() + pos);
        expect_same(r.prompt_top_logprobs[size_t(pos - start)], brute_top(trainer_row(*trainer, prefix, 64, 0.7f), 3),
                    "prompt position " + std::to_string(pos));
      }
    }
  }
}

TEST(PromptLogprobs, AStartOutsideThePromptIsRejected) {
  Model m;
  Engine e(Context{}, m.weights.get(), small_config());
  Request r = req(prompt(5, 1), 1.0f, 1, 2);
  r.prompt_logprob_start = 5;
  EXPECT_THROW(e.submit(r), Error);
  r.prompt_logprob_start = -2;
  EXPECT_THROW(e.submit(r), Error);
}

// The processors' arithmetic on a row made by hand.
TEST(LogitProcessors, EachFollowsItsDocumentedFormula) {
  const std::vector<int32_t> tokens = {1, 2, 3, 3, 3, 1};  // prompt {1, 2}, output {3, 3, 3, 1}
  const std::vector<int64_t> eos = {4};
  auto run = [&](const SamplingParams& p) {
    std::vector<float> row = {2.0f, -1.0f, 4.0f, 1.0f, 0.5f, -3.0f};
    process_logits(row.data(), 6, p, {&tokens, 2, &eos});
    return row;
  };
  SamplingParams p;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  EXPECT_EQ(run(p), (std::vector<float>{2.0f, -1.0f - 0.5f - 0.25f, 4.0f, 1.0f - 1.5f - 0.25f, 0.5f, -3.0f}));
  p = {};
  p.repetition_penalty = 2.0f;  // tokens 1, 2, 3 (prompt and output)
  EXPECT_EQ(run(p), (std::vector<float>{2.0f, -2.0f, 2.0f, 0.5f, 0.5f, -3.0f}));
  p = {};
  p.logit_bias = {{5, 10.0f}, {0, -100.0f}};
  EXPECT_EQ(run(p), (std::vector<float>{-98.0f, -1.0f, 4.0f, 1.0f, 0.5f, 7.0f}));
  p = {};
  p.min_new_tokens = 5;  // 4 output tokens so far: EOS and stop tokens masked
  p.stop_token_ids = {2};
  const float ninf = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(run(p), (std::vector<float>{2.0f, -1.0f, ninf, 1.0f, ninf, -3.0f}));
  p.min_new_tokens = 4;  // reached
  EXPECT_EQ(run(p), (std::vector<float>{2.0f, -1.0f, 4.0f, 1.0f, 0.5f, -3.0f}));
  p.ignore_eos = true;
  p.min_new_tokens = 5;
  EXPECT_EQ(run(p), (std::vector<float>{2.0f, -1.0f, ninf, 1.0f, 0.5f, -3.0f}));
}

TEST(LogitProcessors, ValidateNamesTheField) {
  auto message = [](const SamplingParams& p) {
    try {
      p.validate();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  SamplingParams p;
  p.frequency_penalty = 2.5f;
  EXPECT_NE(message(p).find("frequency_penalty"), std::string::npos);
  p = {};
  p.presence_penalty = -3.0f;
  EXPECT_NE(message(p).find("presence_penalty"), std::string::npos);
  p = {};
  p.repetition_penalty = 0.0f;
  EXPECT_NE(message(p).find("repetition_penalty"), std::string::npos);
  p = {};
  p.min_new_tokens = -1;
  EXPECT_NE(message(p).find("min_new_tokens"), std::string::npos);
  p = {};
  p.logit_bias = {{3, 101.0f}};
  EXPECT_NE(message(p).find("logit_bias"), std::string::npos);
  p = {};
  p.top_logprobs = 21;
  EXPECT_NE(message(p).find("top_logprobs"), std::string::npos);
}

// A strong logit_bias forces its token; the logprobs reported are still the
// unbiased model's, which the trainer computes.
TEST(LogitProcessors, StrongLogitBiasForcesATokenAndLogprobsKeepTheirMeaning) {
  Model m;
  Engine e(Context{}, m.weights.get(), small_config());
  Request r = req(prompt(9, 60), 1.0f, 3, 8);
  r.params.logit_bias = {{17, 100.0f}};
  r.params.top_logprobs = 2;
  auto out = e.generate({r})[0];
  auto trainer = m.trainer(Context{});
  for (const SampleResult& s : out.samples) {
    EXPECT_EQ(s.output_ids, std::vector<int32_t>(8, 17));
    std::vector<int32_t> all = out.prompt_ids;
    all.insert(all.end(), s.output_ids.begin(), s.output_ids.end());
    const std::vector<float> want = trainer_logp(*trainer, all, 1.0f);
    for (size_t j = 0; j < s.logprobs.size(); ++j) {
      EXPECT_TRUE(same_bits(s.logprobs[j], want[out.prompt_ids.size() - 1 + j])) << j;
      EXPECT_LT(s.logprobs[j], -0.01f) << "the unbiased model is not sure of token 17";
    }
  }
}

// EOS forced by logit_bias: without min_new_tokens the first token ends the
// sample; with it the sample runs min_new_tokens tokens first.
TEST(LogitProcessors, MinNewTokensPreventsAnEarlyEos) {
  Model m;
  Engine e(Context{}, m.weights.get(), small_config());
  Request r = req(prompt(6, 70), 1.0f, 2, 20);
  r.params.logit_bias = {{63, 100.0f}};
  auto early = e.generate({r})[0];
  for (const SampleResult& s : early.samples) EXPECT_EQ(s.output_ids, std::vector<int32_t>{63});
  r.params.min_new_tokens = 5;
  auto late = e.generate({r})[0];
  for (const SampleResult& s : late.samples) {
    ASSERT_EQ(s.output_ids.size(), 6u);
    EXPECT_EQ(s.finish_reason, "stop");
    EXPECT_EQ(s.output_ids.back(), 63);
    for (size_t j = 0; j < 5; ++j) EXPECT_NE(s.output_ids[j], 63) << j;
  }
}

// Penalties change greedy choices, stay batch invariant, and leave the
// logprobs equal to the trainer's.
TEST(LogitProcessors, PenaltiesChangeSamplingOnlyAndStayBatchInvariant) {
  Model m;
  auto trainer = m.trainer(Context{});
  Engine e(Context{}, m.weights.get(), small_config());
  auto plain = e.generate({req(prompt(8, 80), 0.0f, 1, 24)})[0].samples[0];
  Request r = req(prompt(8, 80), 0.0f, 1, 24);
  r.params.repetition_penalty = 3.0f;
  r.params.frequency_penalty = 2.0f;
  r.params.presence_penalty = 2.0f;
  r.params.ignore_eos = true;
  auto alone = e.generate({r})[0];
  const SampleResult& pen = alone.samples[0];
  EXPECT_NE(pen.output_ids, plain.output_ids);
  std::vector<Request> batch;
  for (int i = 0; i < 6; ++i) batch.push_back(req(prompt(3 + i, 90 + i), 0.9f, 2, 10, i));
  batch.insert(batch.begin() + 3, r);
  auto mixed = e.generate(batch);
  EXPECT_EQ(mixed[3].samples[0].output_ids, pen.output_ids);
  std::vector<int32_t> all = alone.prompt_ids;
  all.insert(all.end(), pen.output_ids.begin(), pen.output_ids.end());
  const std::vector<float> want = trainer_logp(*trainer, all, 1.0f);
  for (size_t j = 0; j < pen.logprobs.size(); ++j)
    EXPECT_TRUE(same_bits(pen.logprobs[j], want[alone.prompt_ids.size() - 1 + j])) << j;
}

TEST(LogitProcessors, ALogitBiasIdOutsideTheVocabularyIsRejected) {
  Model m;
  Engine e(Context{}, m.weights.get(), small_config());
  Request r = req(prompt(5, 1), 1.0f, 1, 2);
  r.params.logit_bias = {{64, 1.0f}};
  EXPECT_THROW(e.submit(r), Error);
}

// The [rollout] keys of the processors, and errors naming the key.
TEST(LogitProcessors, RolloutConfigKeys) {
  auto section = [](const std::string& text) {
    toml::table t = toml::parse(text);
    TomlSection s(t["rollout"].as_table(), "run.toml", "rollout");
    RolloutSection r = rollout_section_from_toml(s);
    s.finish();
    return r.sampling;
  };
  const SamplingParams p = section(
      "[rollout]\nfrequency_penalty = 0.5\npresence_penalty = -0.25\nrepetition_penalty = 1.1\nmin_new_tokens = 3\n");
  EXPECT_FLOAT_EQ(p.frequency_penalty, 0.5f);
  EXPECT_FLOAT_EQ(p.presence_penalty, -0.25f);
  EXPECT_FLOAT_EQ(p.repetition_penalty, 1.1f);
  EXPECT_EQ(p.min_new_tokens, 3);
  EXPECT_FALSE(section("[rollout]\n").processes_logits());
  for (const char* bad : {"frequency_penalty = 3.0", "presence_penalty = -2.5", "repetition_penalty = 0.0",
                          "min_new_tokens = -1"}) {
    const std::string key = std::string(bad).substr(0, std::string(bad).find(' '));
    try {
      section(std::string("[rollout]\n") + bad + "\n");
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("run.toml"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  }
}

}  // namespace lockstep::rollout
