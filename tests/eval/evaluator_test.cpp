// The eval runner on a tiny random model with a deterministic fake verifier:
// every aggregate (pass@1, pass@k, truncation rate, mean length, reward mean,
// failures) is recomputed here from the engine's raw samples and must match;
// runs are reproducible; failures are reported and never count as correct.
// Also the [eval]/[reward] config parsing and the metric names.
#include "lockstep/eval/evaluator.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <future>
#include <map>
#include <optional>

#include "lockstep/base/error.h"
#include "lockstep/eval/eval_config.h"
#include "lockstep/eval/pass_at_k.h"
#include "lockstep/eval/eval_output.h"
#include "lockstep/model/params.h"
#include "lockstep/model/weights.h"
#include "lockstep/tokenizer/byte_level.h"

namespace lockstep::eval {
namespace {

namespace fs = std::filesystem;

// Verdicts that depend only on the response text, so the test can recompute
// them: a byte sum divisible by 5 fails ("fake"), else an even length is
// correct (reward 1) and an odd one is wrong (reward 0.25).
class FakeReward : public reward::Reward {
 public:
  static int verdict(const std::string& r) {  // 0 wrong, 1 correct, 2 failure
    unsigned sum = 0;
    for (unsigned char ch : r) sum += ch;
    if (sum % 5 == 0) return 2;
    return r.size() % 2 == 0 ? 1 : 0;
  }
  reward::RewardResult evaluate(const reward::RewardRequest& q) const override {
    const int v = verdict(q.response);
    if (v == 2) return reward::RewardResult::failure_result("fake");
    reward::RewardResult r;
    r.correct = v == 1;
    r.reward = r.correct ? 1.0 : 0.25;
    return r;
  }
  std::string type() const override { return "fake"; }
};

struct Fixture {
  Fixture() : dir(fs::temp_directory_path() / ("lockstep_eval_test_" + std::to_string(::getpid()))) {
    tokenizer::write_byte_level_tokenizer(dir);
    tok.emplace(tokenizer::Tokenizer::load(dir));
    cfg.architecture = Architecture::Qwen3;
    cfg.vocab_size = 260;  // 256 bytes + 3 specials (+1 never produced by the tokenizer)
    cfg.hidden_size = 32;
    cfg.num_layers = 2;
    cfg.num_heads = 4;
    cfg.num_kv_heads = 2;
    cfg.head_dim = 8;
    cfg.intermediate_size = 48;
    cfg.qk_norm = true;
    cfg.max_position_embeddings = 256;
    cfg.eos_token_ids = {258};
    layout.emplace(cfg);
    params = alloc_params(*layout);
    init_params(*layout, params.as<float>(), 11, 0.5f);  // large init: peaked, varied outputs
    weights = std::make_unique<model::ModelWeights>(Context{}, *layout, params.as<float>());
    for (int i = 0; i < 7; ++i) {
      data::PromptExample ex;
      ex.line = 2 * i + 1;
      std::vector<tokenizer::ChatMessage> msgs = {{"user", "question " + std::to_string(i)}};
      ex.prompt_text = tok->apply_chat_template(msgs, true);
      ex.prompt_ids = tok->encode_chat(msgs, true);
      ex.label = i;
      problems.push_back(std::move(ex));
    }
  }
  ~Fixture() { fs::remove_all(dir); }

  rollout::EngineConfig engine_config() const {
    rollout::EngineConfig e;
    e.num_blocks = 512;
    e.block_size = 4;
    e.max_batch_tokens = 128;
    return e;
  }
  EvalConfig eval_config() const {
    EvalConfig c;
    c.name = "fake";
    c.n = 6;
    c.seed = 17;
    c.sampling.max_new_tokens = 9;
    // Every lower-case letter also stops: a mix of "stop" and "length" finishes.
    for (int32_t b = 'a'; b <= 'z'; ++b) c.sampling.stop_token_ids.push_back(b);
    c.reward.threads = 2;
    return c;
  }

  fs::path dir;
  std::optional<tokenizer::Tokenizer> tok;
  ModelConfig cfg;
  std::optional<ParamLayout> layout;
  Buffer params;
  std::unique_ptr<model::ModelWeights> weights;
  std::vector<data::PromptExample> problems;
};

TEST(Evaluator, AggregatesMatchARecomputationFromRawSamples) {
  Fixture f;
  const EvalConfig ec = f.eval_config();
  Evaluator ev(ec, std::make_shared<FakeReward>());
  rollout::Engine engine(Context{}, f.weights.get(), f.engine_config());
  std::vector<EvalProblemResult> per;
  const EvalSummary s = ev.run(engine, *f.tok, f.problems, &per);

  // The same requests on a fresh engine: the raw samples to recompute from.
  rollout::Engine fresh(Context{}, f.weights.get(), f.engine_config());
  const auto raw = fresh.generate(ev.make_requests(*f.tok, f.problems));
  ASSERT_EQ(raw.size(), f.problems.size());
  ASSERT_EQ(per.size(), f.problems.size());

  int64_t samples = 0, length_finishes = 0, stop_finishes = 0, len_sum = 0, failures = 0, scored = 0;
  double reward_sum = 0, correctness_sum = 0;
  std::map<int64_t, double> pass_sum;
  for (size_t p = 0; p < raw.size(); ++p) {
    ASSERT_EQ(raw[p].samples.size(), size_t(ec.n));
    ASSERT_EQ(per[p].samples.size(), size_t(ec.n));
    EXPECT_EQ(per[p].line, f.problems[p].line);
    EXPECT_EQ(per[p].label, f.problems[p].label);
    EXPECT_EQ(per[p].prompt, f.problems[p].prompt_text);
    int64_t c = 0;
    for (size_t i = 0; i < raw[p].samples.size(); ++i) {
      const auto& r = raw[p].samples[i];
      const std::string text = f.tok->decode(r.output_ids, true);
      const int v = FakeReward::verdict(text);
      const auto& got = per[p].samples[i];
      EXPECT_EQ(got.response, text);  // reproducible: the same seeds give the same samples
      EXPECT_EQ(got.length, int64_t(r.output_ids.size()));
      EXPECT_EQ(got.finish_reason, r.finish_reason);
      EXPECT_EQ(got.correct, v == 1);
      EXPECT_EQ(got.failure, v == 2 ? "fake" : "");
      EXPECT_EQ(std::isnan(got.reward), v == 2);
      ++samples;
      length_finishes += r.finish_reason == "length";
      stop_finishes += r.finish_reason == "stop";
      len_sum += int64_t(r.output_ids.size());
      failures += v == 2;
      if (v != 2) {
        ++scored;
        reward_sum += v == 1 ? 1.0 : 0.25;
      }
      c += v == 1;
    }
    EXPECT_EQ(per[p].correct, c);
    correctness_sum += double(c) / double(ec.n);
    for (int64_t k : {1, 2, 4, 6}) {
      EXPECT_EQ(per[p].pass_at_k.at(k), pass_at_k(ec.n, c, k));
      pass_sum[k] += pass_at_k(ec.n, c, k);
    }
  }
  // The scenario exercises both finish reasons and every verdict.
  EXPECT_GT(length_finishes, 0);
  EXPECT_GT(stop_finishes, 0);
  EXPECT_GT(failures, 0);
  EXPECT_GT(correctness_sum, 0);
  EXPECT_LT(correctness_sum, double(raw.size()));

  const double P = double(raw.size());
  EXPECT_EQ(s.num_problems, int64_t(raw.size()));
  EXPECT_EQ(s.num_samples, samples);
  EXPECT_EQ(s.truncated, length_finishes);
  EXPECT_DOUBLE_EQ(s.truncated_ratio, double(length_finishes) / double(samples));
  EXPECT_DOUBLE_EQ(s.response_len_mean, double(len_sum) / double(samples));
  EXPECT_EQ(s.generated_tokens, len_sum);
  EXPECT_DOUBLE_EQ(s.pass_at_1, correctness_sum / P);
  EXPECT_EQ(s.pass_at_k.size(), 4u);  // 1, 2, 4 and n = 6
  for (const auto& [k, sum] : pass_sum) EXPECT_NEAR(s.pass_at_k.at(k), sum / P, 1e-15) << "k=" << k;
  EXPECT_EQ(s.pass_at_k.at(1), s.pass_at_1);
  EXPECT_EQ(s.reward_failures, failures);
  EXPECT_EQ(s.failure_reasons.at("fake"), failures);
  EXPECT_NEAR(s.reward_mean, reward_sum / double(scored), 1e-15);
  EXPECT_GT(s.tokens_per_s, 0);
  EXPECT_EQ(s.aborted, 0);

  // The metric names the RL loop logs.
  const auto m = eval_metrics(s);
  EXPECT_EQ(m.at("eval/fake/pass@1"), s.pass_at_1);
  EXPECT_EQ(m.at("eval/fake/pass@6"), s.pass_at_k.at(6));
  EXPECT_EQ(m.at("eval/fake/truncated_ratio"), s.truncated_ratio);
  EXPECT_EQ(m.at("eval/fake/response_len_mean"), s.response_len_mean);
  EXPECT_EQ(m.at("eval/fake/reward_mean"), s.reward_mean);
  EXPECT_EQ(m.at("eval/fake/reward_failures"), double(failures));
  const auto j = summary_to_json(s);
  EXPECT_EQ(j["pass@k"]["4"].get<double>(), s.pass_at_k.at(4));
  EXPECT_EQ(j["metrics"]["eval/fake/pass@2"].get<double>(), s.pass_at_k.at(2));
  const auto line = problem_to_json(per[0]);
  EXPECT_EQ(line["samples"].size(), size_t(ec.n));
  EXPECT_EQ(line["n"].get<int64_t>(), ec.n);
  const std::string table = format_summary_table(s);
  EXPECT_NE(table.find("pass@6"), std::string::npos) << table;
  EXPECT_NE(table.find("truncated ratio"), std::string::npos) << table;
}

TEST(Evaluator, RunsAreReproducibleAndTheSeedMatters) {
  Fixture f;
  EvalConfig ec = f.eval_config();
  auto once = [&](uint64_t seed, bool via_fn) {
    EvalConfig c = ec;
    c.seed = seed;
    Evaluator ev(c, std::make_shared<FakeReward>());
    rollout::Engine engine(Context{}, f.weights.get(), f.engine_config());
    std::vector<EvalProblemResult> per;
    if (via_fn) {
      // The GenerateFn path the RL loop uses with a background engine.
      engine.start_background();
      GenerateFn gen = [&](std::vector<rollout::Request> rs) {
        std::vector<std::future<rollout::RequestResult>> futs;
        for (auto& r : rs) futs.push_back(engine.submit_async(std::move(r)));
        std::vector<rollout::RequestResult> out;
        for (auto& fu : futs) out.push_back(fu.get());
        return out;
      };
      ev.run(gen, *f.tok, f.problems, &per);
      engine.stop_background();
    } else {
      ev.run(engine, *f.tok, f.problems, &per);
    }
    std::vector<std::string> texts;
    for (const auto& p : per)
      for (const auto& s : p.samples) texts.push_back(s.response);
    return texts;
  };
  const auto a = once(17, false), b = once(17, true), c = once(18, false);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(Evaluator, EveryFailureIsReportedAndNothingCountsAsCorrect) {
  class AlwaysFails : public reward::Reward {
   public:
    reward::RewardResult evaluate(const reward::RewardRequest&) const override {
      return reward::RewardResult::failure_result("bad_label");
    }
    std::string type() const override { return "fails"; }
  };
  Fixture f;
  EvalConfig ec = f.eval_config();
  ec.n = 2;
  Evaluator ev(ec, std::make_shared<AlwaysFails>());
  rollout::Engine engine(Context{}, f.weights.get(), f.engine_config());
  const EvalSummary s = ev.run(engine, *f.tok, f.problems);
  EXPECT_EQ(s.reward_failures, s.num_samples);
  EXPECT_EQ(s.pass_at_1, 0.0);
  EXPECT_EQ(s.pass_at_k.at(2), 0.0);
}

TEST(Evaluator, ExactRewardFromOptionsScoresTheDecodedResponse) {
  // An "exact" reward whose label is each problem's first greedy response:
  // with temperature 0 every sample matches, so pass@1 = 1.
  Fixture f;
  EvalConfig ec = f.eval_config();
  ec.sampling.temperature = 0.0f;
  ec.n = 2;
  ec.reward.type = "exact";
  rollout::Engine engine(Context{}, f.weights.get(), f.engine_config());
  {
    Evaluator probe(ec);
    std::vector<EvalProblemResult> per;
    probe.run(engine, *f.tok, f.problems, &per);
    for (size_t i = 0; i < per.size(); ++i) f.problems[i].label = per[i].samples[0].response;
  }
  const EvalSummary s = evaluate(engine, *f.tok, f.problems, ec);
  EXPECT_EQ(s.reward_failures, 0);
  EXPECT_EQ(s.pass_at_1, 1.0);
  EXPECT_EQ(s.reward_mean, 1.0);
}

TEST(EvalConfig, ValidationNamesTheField) {
  EvalConfig c;
  c.n = 0;
  EXPECT_THROW(c.validate(), Error);
  c = EvalConfig();
  c.name = "a/b";
  EXPECT_THROW(c.validate(), Error);
  c = EvalConfig();
  c.sampling.top_p = 0.0f;
  try {
    c.validate();
    FAIL() << "top_p 0 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("top_p"), std::string::npos) << e.what();
  }
}

TEST(EvalConfig, TomlSectionsParseAndRejectUnknownKeys) {
  toml::table root = parse_toml_with_overrides(
      "[eval]\nname = \"gsm8k\"\nn = 4\ntemperature = 0.6\ntop_p = 0.95\nmax_new_tokens = 512\nseed = 3\n"
      "interval = 10\noutput = \"o.jsonl\"\nstop_token_ids = [7, 9]\n"
      "[reward]\ntype = \"exact\"\ncasefold = true\n",
      "eval.toml", {"eval.n=16"});
  TomlSection s(root["eval"].as_table(), "eval.toml", "eval");
  EvalSection e = eval_section_from_toml(s);
  s.finish();
  EXPECT_EQ(e.config.name, "gsm8k");
  EXPECT_EQ(e.config.n, 16);
  EXPECT_FLOAT_EQ(e.config.sampling.temperature, 0.6f);
  EXPECT_FLOAT_EQ(e.config.sampling.top_p, 0.95f);
  EXPECT_EQ(e.config.sampling.max_new_tokens, 512);
  EXPECT_EQ(e.config.seed, 3u);
  EXPECT_EQ(e.interval, 10);
  EXPECT_EQ(e.output, "o.jsonl");
  EXPECT_EQ(e.config.sampling.stop_token_ids, (std::vector<int32_t>{7, 9}));
  auto r = reward_options_from_toml(root["reward"].as_table(), "eval.toml");
  EXPECT_EQ(r.type, "exact");
  EXPECT_TRUE(r.casefold);

  toml::table bad =
      parse_toml_with_overrides("[eval]\nsamples = 3\n[reward]\ntyp = \"math\"\n", "bad.toml", {});
  TomlSection b(bad["eval"].as_table(), "bad.toml", "eval");
  eval_section_from_toml(b);
  try {
    b.finish();
    FAIL() << "unknown key accepted";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("samples"), std::string::npos) << err.what();
  }
  try {
    reward_options_from_toml(bad["reward"].as_table(), "bad.toml");
    FAIL() << "unknown reward key accepted";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("bad.toml: [reward]"), std::string::npos) << err.what();
    EXPECT_NE(std::string(err.what()).find("typ"), std::string::npos) << err.what();
  }
  toml::table zero = parse_toml_with_overrides("[eval]\nn = 0\n", "z.toml", {});
  TomlSection z(zero["eval"].as_table(), "z.toml", "eval");
  EXPECT_THROW(eval_section_from_toml(z), Error);
}

}  // namespace
}  // namespace lockstep::eval
