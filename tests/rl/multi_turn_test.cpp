// Multi-turn rollouts with environments: a Python class per sample in real
// worker processes, an HTTP environment against a real server in the test,
// failures (raising, hanging, malformed replies) counted and never scored,
// the loss mask (environment tokens train nothing), the alignment guarantee
// over whole multi-turn sequences, and RL steps end to end.
#include "lockstep/rl/multi_turn.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "../model/model_test_util.h"
#include "lockstep/base/error.h"
#include "lockstep/base/timer.h"
#include "lockstep/data/jsonl.h"
#include "lockstep/model/params.h"
#include "lockstep/reward/reward.h"
#include "lockstep/rl/algo.h"
#include "lockstep/rl/episode_eval.h"
#include "lockstep/rl/loop.h"
#include "lockstep/rl/rl_config.h"
#include "lockstep/rl/rollout_backend.h"
#include "lockstep/tokenizer/byte_level.h"

namespace lockstep::rl {
namespace {

// A tool environment: the model's turn is answered with "obs <turn>"; the
// episode is done after `turns` steps with reward = the number of messages
// the environment saw (so a reward checks what step() received; label
// "noreward": none, the verifier decides). Sample
// labels choose failures: "raise" raises in step, "hang" sleeps past the
// timeout, "bad" returns a malformed reply.
constexpr const char* kEnvPy = R"PY(
import time

class Env:
    def __init__(self):
        self.turn = 0
        self.label = None

    def reset(self, sample):
        self.label = sample["label"]
        return [{"role": "user", "content": "task " + str(sample["prompt"])}]

    def step(self, messages, completion):
        assert messages[-1]["role"] == "assistant" and messages[-1]["content"] == completion
        self.turn += 1
        if self.label == "raise" and self.turn == 2:
            raise ValueError("tool exploded")
        if self.label == "hang":
            time.sleep(30)
        if self.label == "bad":
            return {"observation": 3}
        if self.turn >= 3:
            reward = None if self.label == "noreward" else float(len(messages))
            return {"observation": None, "reward": reward, "done": True}
        return {"observation": "obs " + str(self.turn), "reward": None, "done": False}
)PY";

struct Fixture {
  Fixture() : dir("rl-multi-turn") {
    tokenizer::write_byte_level_tokenizer(dir.str("tok"));
    tok.emplace(tokenizer::Tokenizer::load(dir.str("tok")));
    cfg = test::tiny_dense_config();
    cfg.vocab_size = 260;
    cfg.max_position_embeddings = 256;
    cfg.eos_token_ids = {258};
    layout.emplace(cfg);
    init = alloc_params(*layout);
    init_params(*layout, init.as<float>(), 11, 0.3f);
    test::write_bytes(dir.str("env.py"), kEnvPy);
    env.env = "python";
    env.path = dir.str("env.py");
    env.workers = 2;
    env.timeout_s = 5;
    env.max_turns = 4;
    env.max_total_tokens = 160;
    sampling.n = 2;
    sampling.max_new_tokens = 4;
  }

  std::unique_ptr<train::Trainer> trainer() const {
    Buffer p = alloc_params(*layout);
    std::memcpy(p.as<float>(), init.as<float>(), layout->nbytes());
    train::TrainerConfig tc;
    tc.optim.lr = 1e-2;
    tc.micro_batch_tokens = 128;
    return std::make_unique<train::Trainer>(Context{}, cfg, std::move(p), tc);
  }

  std::vector<EpisodePrompt> prompts(const std::vector<std::string>& labels) const {
    std::vector<EpisodePrompt> out;
    for (size_t i = 0; i < labels.size(); ++i) {
      EpisodePrompt p;
      p.prompt_text = "q" + std::to_string(i);
      p.prompt_ids = tok->encode(p.prompt_text, false);
      p.sample = {{"prompt", p.prompt_text}, {"label", labels[i]}};
      p.seed = int64_t(i) + 3;
      out.push_back(std::move(p));
    }
    return out;
  }

  rollout::RolloutSection rollout_section() const {
    rollout::RolloutSection r;
    r.engine.num_blocks = 512;
    r.engine.block_size = 4;
    r.sampling = sampling;
    return r;
  }

  test::TempDir dir;
  std::optional<tokenizer::Tokenizer> tok;
  ModelConfig cfg;
  std::optional<ParamLayout> layout;
  Buffer init;
  EnvConfig env;
  rollout::SamplingParams sampling;
};

// The trainer's logprobs of an episode's whole sequence, per output token.
std::vector<float> rescore(train::Trainer& t, const Episode& e) {
  train::TrainSequence s;
  s.tokens = e.prompt_ids;
  s.tokens.insert(s.tokens.end(), e.output_ids.begin(), e.output_ids.end());
  s.prompt_len = int32_t(e.prompt_ids.size());
  s.loss_mask = e.loss_mask;
  return t.score({s}, train::ScoreOptions{}).at(0).logp;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Every model token's rollout logprob has the trainer's bits.
void expect_gap_zero(train::Trainer& t, const Episode& e) {
  const std::vector<float> lp = rescore(t, e);
  ASSERT_EQ(lp.size(), e.output_ids.size());
  int64_t model_tokens = 0;
  for (size_t k = 0; k < lp.size(); ++k) {
    if (!e.loss_mask[k]) continue;
    ++model_tokens;
    EXPECT_EQ(bits(lp[k]), bits(e.logprobs[k]))
        << "output token " << k << ": trainer " << lp[k] << ", rollout " << e.logprobs[k];
  }
  EXPECT_GT(model_tokens, 0);
}

TEST(MultiTurn, PythonEnvironmentEpisodesAreOneSequenceWithGapZero) {
  Fixture f;
  auto trainer = f.trainer();
  LocalRollout rollout(*trainer, f.rollout_section(), 1);
  auto env = make_environment(f.env);
  MultiTurnRollout mt(rollout, *env, *f.tok, f.env, f.sampling);
  MultiTurnStats st;
  const std::vector<Episode> eps = mt.run(f.prompts({"ok", "ok", "ok"}), &st);
  ASSERT_EQ(eps.size(), 6u);
  EXPECT_EQ(st.env_failures, 0);
  EXPECT_EQ(st.rounds, 3);
  for (const Episode& e : eps) {
    EXPECT_FALSE(e.env_failed) << e.env_error;
    EXPECT_EQ(e.turns, 3);
    EXPECT_EQ(e.finish_reason, "done");
    // user, assistant, user(obs 1), assistant, user(obs 2), assistant
    ASSERT_TRUE(e.env_reward.has_value());
    EXPECT_EQ(*e.env_reward, 6.0);
    ASSERT_EQ(e.messages.size(), 6u);
    EXPECT_EQ(e.messages[2].content, "obs 1");
    // The prompt is reset's conversation through the chat template.
    EXPECT_EQ(e.prompt_ids, f.tok->encode_chat({{"user", e.messages[0].content}}, true));
    ASSERT_EQ(e.loss_mask.size(), e.output_ids.size());
    ASSERT_EQ(e.logprobs.size(), e.output_ids.size());
    // The environment's tokens are the template's text of its message.
    std::vector<int32_t> env_ids;
    for (size_t k = 0; k < e.output_ids.size(); ++k)
      if (!e.loss_mask[k]) env_ids.push_back(e.output_ids[k]);
    const std::string env_text = f.tok->decode(env_ids, false);
    EXPECT_NE(env_text.find("<|im_start|>user\nobs 1<|im_end|>\n<|im_start|>assistant\n"), std::string::npos)
        << env_text;
    EXPECT_NE(env_text.find("<|im_start|>user\nobs 2<|im_end|>"), std::string::npos) << env_text;
    // The whole history is one sequence: the conversation rendered by the
    // template is a prefix of the decoded sequence plus the last turn.
    std::vector<int32_t> all = e.prompt_ids;
    all.insert(all.end(), e.output_ids.begin(), e.output_ids.end());
    const std::string text = f.tok->decode(all, false);
    EXPECT_EQ(text.rfind(f.tok->decode(e.prompt_ids, false), 0), 0u);
    expect_gap_zero(*trainer, e);
  }
  // Episodes of one prompt differ (their own seeds), runs repeat.
  EXPECT_NE(eps[0].output_ids, eps[1].output_ids);
  const std::vector<Episode> again = mt.run(f.prompts({"ok", "ok", "ok"}), nullptr);
  for (size_t i = 0; i < eps.size(); ++i) EXPECT_EQ(again[i].output_ids, eps[i].output_ids);
}

TEST(MultiTurn, RaisingHangingAndMalformedEnvironmentsFailTheirSamplesOnly) {
  Fixture f;
  f.env.timeout_s = 1.5;
  auto trainer = f.trainer();
  LocalRollout rollout(*trainer, f.rollout_section(), 1);
  auto env = make_environment(f.env);
  MultiTurnRollout mt(rollout, *env, *f.tok, f.env, f.sampling);
  MultiTurnStats st;
  const std::vector<Episode> eps = mt.run(f.prompts({"raise", "ok", "bad"}), &st);
  ASSERT_EQ(eps.size(), 6u);
  EXPECT_EQ(st.env_failures, 4);
  for (int i : {0, 1}) {
    EXPECT_TRUE(eps[i].env_failed);
    EXPECT_EQ(eps[i].finish_reason, "env_error");
    EXPECT_NE(eps[i].env_error.find("ValueError: tool exploded"), std::string::npos) << eps[i].env_error;
    EXPECT_NE(eps[i].env_error.find("env.py:4 Env.step"), std::string::npos) << eps[i].env_error;
    EXPECT_EQ(eps[i].turns, 2);
  }
  for (int i : {2, 3}) {
    EXPECT_FALSE(eps[i].env_failed) << eps[i].env_error;
    EXPECT_EQ(eps[i].turns, 3);
  }
  for (int i : {4, 5}) {
    EXPECT_TRUE(eps[i].env_failed);
    EXPECT_NE(eps[i].env_error.find("\"observation\" must be a string"), std::string::npos)
        << eps[i].env_error;
  }
  // A hanging step is killed at the deadline: its samples fail (and any
  // other instance its worker held, which died with it).
  MultiTurnStats hung;
  const std::vector<Episode> h = mt.run(f.prompts({"hang"}), &hung);
  EXPECT_EQ(hung.env_failures, 2);
  int timed_out = 0;
  for (const Episode& e : h) {
    EXPECT_TRUE(e.env_failed);
    const bool timeout = e.env_error.find("env_timeout_s") != std::string::npos;
    timed_out += timeout ? 1 : 0;
    // Two instances on one worker: the second dies with the first's worker.
    if (!timeout) {
      EXPECT_NE(e.env_error.find("died"), std::string::npos) << e.env_error;
    }
  }
  EXPECT_GE(timed_out, 1);
  // The pool restarted the killed workers: a fresh run is whole again.
  MultiTurnStats st2;
  const std::vector<Episode> ok = mt.run(f.prompts({"ok"}), &st2);
  EXPECT_EQ(st2.env_failures, 0);
  for (const Episode& e : ok) EXPECT_EQ(e.turns, 3) << e.env_error;
}

// Episodes end before they overflow the model's context (the engine would
// refuse the next turn's request); a prompt that leaves no room fails.
TEST(MultiTurn, EpisodesStopAtTheContext) {
  Fixture f;
  f.env.max_total_tokens = 0;
  auto trainer = f.trainer();
  LocalRollout rollout(*trainer, f.rollout_section(), 1);
  auto env = make_environment(f.env);
  MultiTurnRollout mt(rollout, *env, *f.tok, f.env, f.sampling, /*context=*/64);
  MultiTurnStats st;
  const std::vector<Episode> eps = mt.run(f.prompts({"ok"}), &st);
  EXPECT_EQ(st.env_failures, 0);
  for (const Episode& e : eps) {
    EXPECT_EQ(e.finish_reason, "budget");
    EXPECT_LT(e.turns, 3);
    EXPECT_LT(int64_t(e.prompt_ids.size() + e.output_ids.size()), 64);
    expect_gap_zero(*trainer, e);
  }
  MultiTurnRollout tight(rollout, *env, *f.tok, f.env, f.sampling, /*context=*/10);
  MultiTurnStats st2;
  for (const Episode& e : tight.run(f.prompts({"ok"}), &st2)) {
    EXPECT_TRUE(e.env_failed);
    EXPECT_NE(e.env_error.find("leaves no room"), std::string::npos) << e.env_error;
  }
  EXPECT_EQ(st2.env_failures, 2);
}

TEST(MultiTurn, MissingClassOrFileIsAClearError) {
  Fixture f;
  f.env.class_name = "Nope";
  test::expect_error([&] { make_environment(f.env); }, {"no function 'Nope'", "Env"});
  f.env.path = f.dir.str("missing.py");
  test::expect_error([&] { make_environment(f.env); }, {"missing.py"});
}

// The protocol over HTTP: a server in this process keeps each session's turn.
class EnvServer {
 public:
  EnvServer() {
    server_.Post("/env", [this](const httplib::Request& req, httplib::Response& res) {
      const nlohmann::json j = nlohmann::json::parse(req.body);
      const int64_t session = j.at("session").get<int64_t>();
      std::lock_guard<std::mutex> lk(mu_);
      nlohmann::json out;
      const std::string op = j.at("op").get<std::string>();
      ops.push_back(op);
      if (op == "reset") {
        turns_[session] = 0;
        out = "plain prompt " + j["sample"]["prompt"].get<std::string>();
      } else if (op == "step") {
        const int turn = ++turns_.at(session);
        if (!j.contains("sample") && j["completion"].get<std::string>() == j["messages"].back()["content"])
          out = turn >= 2 ? nlohmann::json{{"observation", nullptr}, {"reward", 0.5}, {"done", true}}
                          : nlohmann::json{{"observation", "tool says " + std::to_string(turn)},
                                           {"reward", 0.25},
                                           {"done", false}};
        else
          out = {{"bogus", 1}};  // an unknown key fails the sample loudly
      } else {
        turns_.erase(session);
        out = nullptr;
      }
      res.set_content(out.dump(), "application/json");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    for (int i = 0; i < 500 && !server_.is_running(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ~EnvServer() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/env"; }
  std::vector<std::string> ops;
  size_t open_sessions() {
    std::lock_guard<std::mutex> lk(mu_);
    return turns_.size();
  }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::map<int64_t, int> turns_;
};

TEST(MultiTurn, HttpEnvironmentSpeaksTheProtocol) {
  Fixture f;
  EnvServer server;
  f.env.env = server.url();
  auto trainer = f.trainer();
  LocalRollout rollout(*trainer, f.rollout_section(), 1);
  auto env = make_environment(f.env);
  MultiTurnRollout mt(rollout, *env, *f.tok, f.env, f.sampling);
  MultiTurnStats st;
  // 32 episodes at once: env_workers (2) bounds the requests in flight, which
  // a small server's thread pool would otherwise drop.
  const std::vector<Episode> eps = mt.run(f.prompts(std::vector<std::string>(16, "a")), &st);
  ASSERT_EQ(eps.size(), 32u);
  EXPECT_EQ(st.env_failures, 0);
  for (const Episode& e : eps) {
    EXPECT_FALSE(e.env_failed) << e.env_error;
    EXPECT_EQ(e.turns, 2);
    ASSERT_TRUE(e.env_reward.has_value());
    EXPECT_EQ(*e.env_reward, 0.75);  // summed over the steps
    // A prompt string is encoded as is (no template).
    EXPECT_EQ(f.tok->decode(e.prompt_ids, false).rfind("plain prompt q", 0), 0u);
    expect_gap_zero(*trainer, e);
  }
  EXPECT_EQ(server.open_sessions(), 0u);  // every session closed
  // A dead server fails every sample, counted.
  EnvConfig dead = f.env;
  dead.env = "http://127.0.0.1:1/env";
  dead.timeout_s = 1;
  auto denv = make_environment(dead);
  MultiTurnRollout mt2(rollout, *denv, *f.tok, dead, f.sampling);
  MultiTurnStats st2;
  const std::vector<Episode> failed = mt2.run(f.prompts({"a"}), &st2);
  EXPECT_EQ(st2.env_failures, 2);
  for (const Episode& e : failed) EXPECT_NE(e.env_error.find("(reset)"), std::string::npos) << e.env_error;
}

// The loss of a masked sequence is that of the same terms without the
// masked tokens: masked tokens get zero gradient, the rest the same bits.
TEST(MultiTurn, MaskedTokensContributeNothing) {
  const std::vector<float> logp = {-1.0f, -2.0f, -0.5f, -3.0f, -0.25f, -1.5f};
  const std::vector<float> old = {-1.1f, -1.9f, -0.4f, -2.0f, -0.3f, -1.4f};
  const std::vector<float> ent = {0.5f, 0.7f, 0.2f, 0.9f, 0.1f, 0.3f};
  const std::vector<uint8_t> mask = {1, 0, 1, 0, 0, 1};
  std::vector<float> klogp, kold, kent;
  for (size_t t = 0; t < mask.size(); ++t)
    if (mask[t]) {
      klogp.push_back(logp[t]);
      kold.push_back(old[t]);
      kent.push_back(ent[t]);
    }
  for (PolicyLoss pl : {PolicyLoss::Ppo, PolicyLoss::Gspo, PolicyLoss::Cispo}) {
    AlgoConfig a;
    a.policy_loss = pl;
    a.entropy_coef = 0.01;
    a.rollout_is = IsLevel::Sequence;
    SeqLossInput in;
    in.logp = logp.data();
    in.old_logp = old.data();
    in.entropy = ent.data();
    in.mask = mask.data();
    in.n = 6;
    in.advantage = 0.7;
    in.token_weight = 1.0 / 3;
    std::vector<double> w = importance_weights(old.data(), logp.data(), 6, a, nullptr, mask.data());
    in.is_weight = w.data();
    std::vector<float> dlogp(6, 9.0f), dent(6, 9.0f);
    SeqLossStats st;
    const double l = sequence_loss(a, in, dlogp.data(), dent.data(), &st);
    SeqLossInput kin = in;
    kin.logp = klogp.data();
    kin.old_logp = kold.data();
    kin.entropy = kent.data();
    kin.mask = nullptr;
    kin.n = 3;
    std::vector<double> kw = importance_weights(kold.data(), klogp.data(), 3, a, nullptr);
    kin.is_weight = kw.data();
    std::vector<float> kd(3), kde(3);
    SeqLossStats kst;
    const double kl = sequence_loss(a, kin, kd.data(), kde.data(), &kst);
    EXPECT_EQ(l, kl) << to_string(pl);
    EXPECT_EQ(st.pg_loss, kst.pg_loss);
    EXPECT_EQ(st.ratio_sum, kst.ratio_sum);
    size_t k = 0;
    for (size_t t = 0; t < 6; ++t) {
      if (!mask[t]) {
        EXPECT_EQ(dlogp[t], 0.0f);
        EXPECT_EQ(dent[t], 0.0f);
        EXPECT_EQ(w[t], 1.0);
        continue;
      }
      EXPECT_EQ(dlogp[t], kd[k]) << to_string(pl) << " token " << t;
      EXPECT_EQ(dent[t], kde[k]);
      EXPECT_EQ(w[t], kw[k]);
      ++k;
    }
  }
  train::TrainSequence s;
  s.tokens = {1, 2, 3, 4, 5, 6, 7};
  s.loss_mask = mask;
  EXPECT_EQ(s.num_loss_targets(), 3);
  s.loss_mask.pop_back();
  test::expect_error([&] { (void)s.num_loss_targets(); }, {"loss_mask has 5 entries for 6 targets"});
}

// The trainer's gradient of a masked multi-turn sequence equals that of a
// loss over the model tokens only (the masked tokens' terms do not exist).
TEST(MultiTurn, MaskedTokensHaveNoGradient) {
  Fixture f;
  auto a = f.trainer(), b = f.trainer();
  train::TrainSequence s;
  s.tokens = f.tok->encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\nhi<|im_end|>", false);
  s.prompt_len = 4;
  s.loss_mask.assign(size_t(s.num_targets()), 1);
  for (size_t k = 5; k < 12; ++k) s.loss_mask[k] = 0;
  AlgoConfig cfg;
  auto masked = [&](size_t, const float* lp, const float*, int64_t n, float* dl, float* de) {
    std::vector<float> old(lp, lp + n);
    SeqLossInput in;
    in.logp = lp;
    in.old_logp = old.data();
    in.mask = s.loss_mask.data();
    in.n = n;
    in.advantage = 1.0;
    in.token_weight = 0.1;
    return sequence_loss(cfg, in, dl, de, nullptr);
  };
  auto kept_only = [&](size_t, const float* lp, const float*, int64_t n, float* dl, float* de) {
    double loss = 0;
    for (int64_t t = 0; t < n; ++t) {
      dl[t] = 0.0f;
      if (de) de[t] = 0.0f;
      if (!s.loss_mask[size_t(t)]) continue;
      SeqLossInput in;
      const float o = lp[t];
      in.logp = lp + t;
      in.old_logp = &o;
      in.n = 1;
      in.advantage = 1.0;
      in.token_weight = 0.1;
      loss += sequence_loss(cfg, in, dl + t, nullptr, nullptr);
    }
    return loss;
  };
  const double la = a->accumulate({s}, masked, train::ScoreOptions{});
  const double lb = b->accumulate({s}, kept_only, train::ScoreOptions{});
  EXPECT_EQ(la, lb);
  const int64_t n = a->layout().numel();
  EXPECT_EQ(std::memcmp(a->grads(), b->grads(), size_t(n) * 4), 0);
  double norm = 0;
  for (int64_t i = 0; i < n; ++i) norm += double(a->grads()[i]) * a->grads()[i];
  EXPECT_GT(norm, 0);
}

TEST(MultiTurn, ObservationTextIsWhatTheTemplateAppends) {
  Fixture f;
  const std::string t =
      observation_text(*f.tok, {{"user", "x"}, {"assistant", "y"}}, "tool", "42", "<|im_end|>");
  EXPECT_EQ(t, "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n");
}

// The bundled calculator environment (configs/examples/tool_math_env.py)
// in real workers: a tool call is answered, the final number is scored.
TEST(MultiTurn, ExampleCalculatorEnvironment) {
  namespace fs = std::filesystem;
  EnvConfig c;
  c.env = "python";
  // Tests run in the build directory; __FILE__ is relative to it or absolute.
  c.path = (fs::path(__FILE__).parent_path() / "../../configs/examples/tool_math_env.py")
               .lexically_normal()
               .string();
  ASSERT_TRUE(fs::exists(c.path)) << c.path;
  c.workers = 1;
  auto env = make_environment(c);
  const EnvReset r =
      env->reset(7, {{"prompt", "x"}, {"label", "56"}, {"metadata", {{"question", "What is 7*8?"}}}});
  ASSERT_TRUE(r.messages.has_value());
  EXPECT_EQ(r.messages->back().content, "What is 7*8?");
  EnvStep s = env->step(7, *r.messages, "let me compute <calc>7 * (4 + 4)</calc>");
  EXPECT_FALSE(s.done);
  EXPECT_EQ(s.observation.value_or(""), "<result>56</result>");
  EXPECT_FALSE(s.reward.has_value());
  s = env->step(7, *r.messages, "<calc>1/0</calc>");
  EXPECT_NE(s.observation.value_or("").find("error"), std::string::npos);
  s = env->step(7, *r.messages, "The answer is 56");
  EXPECT_TRUE(s.done);
  EXPECT_EQ(s.reward.value_or(-1), 1.0);
  env->close(7);
  EXPECT_THROW(env->step(7, *r.messages, "again"), Error);  // the session is gone
}

TEST(MultiTurn, ConfigKeysAndErrors) {
  auto parse = [](const std::string& rollout) {
    const toml::table t = parse_toml_with_overrides(
        "[rollout]\n" + rollout + "\n[algo]\nadvantage = \"reinforce++\"\n", "/cfg/x.toml", {}, "/cfg");
    return rl_config_from_toml(t, "/cfg/x.toml");
  };
  const RlConfig c = parse("env = \"python\"\nenv_path = \"e.py\"\nmax_turns = 3\nmax_total_tokens = 99");
  EXPECT_TRUE(c.env.enabled());
  EXPECT_EQ(c.env.path, "/cfg/e.py");  // next to the config (the path rule)
  EXPECT_EQ(c.env.class_name, "Env");
  EXPECT_EQ(c.env.max_turns, 3);
  EXPECT_EQ(c.env.max_total_tokens, 99);
  EXPECT_EQ(parse("env = \"http://localhost:9/env\"").env.env, "http://localhost:9/env");
  test::expect_error([&] { parse("env = \"python\""); }, {"env_path"});
  test::expect_error([&] { parse("env = \"ftp://x\""); }, {"env", "ftp://x"});
  test::expect_error([&] { parse("max_turns = 3"); }, {"max_turns", "only used with [rollout] env"});
  test::expect_error([&] { parse("env = \"python\"\nenv_path = \"e.py\"\nmax_turns = 0"); }, {"max_turns"});
}

// RL steps end to end: episodes of three turns, the environment's reward,
// gap 0 (the run aborts otherwise), the metrics and the samples' turns.
// The rollout as a round-by-round backend (no streaming): the schedule the
// streaming one must equal.
class RoundByRound final : public RolloutBackend {
 public:
  explicit RoundByRound(RolloutBackend& inner) : inner_(inner) {}
  std::vector<rollout::RequestResult> generate(std::vector<rollout::Request> requests,
                                               const RolloutProgress& progress, int64_t* tokens) override {
    return inner_.generate(std::move(requests), progress, tokens);
  }
  void sync(train::Trainer& t) override { inner_.sync(t); }
  bool aligned() const override { return inner_.aligned(); }

 private:
  RolloutBackend& inner_;
};

// "wait" episodes block in their first step until every "go" episode has
// ended (three turns each), and fail after `patience` seconds.
class Rendezvous final : public Environment {
 public:
  Rendezvous(int go, double patience) : go_left_(go), patience_(patience) {}
  EnvReset reset(int64_t session, const nlohmann::json& sample) override {
    std::lock_guard<std::mutex> l(mu_);
    label_[session] = sample["label"].get<std::string>();
    EnvReset r;
    r.messages = std::vector<tokenizer::ChatMessage>{{"user", "task"}};
    return r;
  }
  EnvStep step(int64_t session, const std::vector<tokenizer::ChatMessage>&, const std::string&) override {
    std::unique_lock<std::mutex> l(mu_);
    const int turn = ++turn_[session];
    if (label_[session] == "wait" && turn == 1 &&
        !cv_.wait_for(l, std::chrono::duration<double>(patience_), [&] { return go_left_ == 0; }))
      throw EnvFailure("the go episodes did not end while this one waited");
    EnvStep s;
    if (turn < 3) {
      s.observation = "obs";
      return s;
    }
    if (label_[session] == "go" && --go_left_ == 0) cv_.notify_all();
    s.reward = 1.0;
    s.done = true;
    return s;
  }
  void close(int64_t) override {}

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int go_left_;
  double patience_;
  std::map<int64_t, std::string> label_;
  std::map<int64_t, int> turn_;
};

// The colocated rollout streams turns: an episode's next turn is generated
// as soon as its environment answered, while others still wait on theirs.
// The episodes equal the round-by-round schedule's bit for bit.
TEST(MultiTurn, StreamedEpisodesDoNotWaitForEachOtherAndEqualRounds) {
  Fixture f;
  auto trainer = f.trainer();
  LocalRollout rollout(*trainer, f.rollout_section(), 1);
  ASSERT_TRUE(rollout.can_stream());
  RoundByRound rounds(rollout);
  auto env = make_environment(f.env);
  MultiTurnRollout streamed(rollout, *env, *f.tok, f.env, f.sampling),
      stepped(rounds, *env, *f.tok, f.env, f.sampling);
  MultiTurnStats a, b;
  const std::vector<Episode> x = streamed.run(f.prompts({"ok", "ok", "ok"}), &a);
  const std::vector<Episode> y = stepped.run(f.prompts({"ok", "ok", "ok"}), &b);
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(x[i].output_ids, y[i].output_ids) << i;
    EXPECT_EQ(x[i].loss_mask, y[i].loss_mask) << i;
    ASSERT_EQ(x[i].logprobs.size(), y[i].logprobs.size());
    for (size_t k = 0; k < x[i].logprobs.size(); ++k)
      EXPECT_EQ(bits(x[i].logprobs[k]), bits(y[i].logprobs[k]));
    EXPECT_EQ(x[i].env_reward, y[i].env_reward);
    EXPECT_EQ(x[i].turns, y[i].turns);
  }
  EXPECT_EQ(a.generated_tokens, b.generated_tokens);
  EXPECT_EQ(a.rounds, b.rounds);
  // Two "wait" episodes need both "go" episodes to finish three turns first.
  Rendezvous patient(2, 20.0);
  MultiTurnRollout meet(rollout, patient, *f.tok, f.env, f.sampling);
  MultiTurnStats st;
  for (const Episode& e : meet.run(f.prompts({"wait", "go"}), &st)) {
    EXPECT_FALSE(e.env_failed) << e.env_error;
    EXPECT_EQ(e.turns, 3);
  }
  EXPECT_EQ(st.env_failures, 0);
  // Round by round the go episodes cannot go on while the wait episodes
  // block the round: the wait episodes give up.
  Rendezvous impatient(2, 0.5);
  MultiTurnRollout locked(rounds, impatient, *f.tok, f.env, f.sampling);
  const std::vector<Episode> z = locked.run(f.prompts({"wait", "go"}), &st);
  EXPECT_TRUE(z[0].env_failed && z[1].env_failed);
  EXPECT_FALSE(z[2].env_failed || z[3].env_failed);
}

// The held-out eval of a multi-turn task runs episodes: the environment's
// reward decides where it gave one, the verifier scores the last model turn
// where it gave none, a raising environment is a scoring failure; the seeds
// are the eval's, so a rerun repeats.
TEST(MultiTurn, HeldOutEvalRunsEpisodes) {
  Fixture f;
  auto trainer = f.trainer();
  LocalRollout rollout(*trainer, f.rollout_section(), 1);
  auto env = make_environment(f.env);
  eval::EvalConfig ec;
  ec.name = "held";
  ec.n = 2;
  ec.seed = 5;
  ec.sampling = f.sampling;
  MultiTurnRollout mt(rollout, *env, *f.tok, f.env, eval_sampling(ec));
  std::vector<data::PromptExample> problems;
  for (const char* label : {"ok", "noreward", "raise"}) {
    data::PromptExample ex;
    ex.line = int64_t(problems.size()) + 1;
    ex.prompt_text = "e" + std::to_string(problems.size());
    ex.prompt_ids = f.tok->encode(ex.prompt_text, false);
    ex.label = label;
    problems.push_back(std::move(ex));
  }
  std::vector<reward::RewardRequest> asked;
  const auto score = [&](const std::vector<reward::RewardRequest>& reqs) {
    asked = reqs;
    std::vector<reward::RewardResult> out(reqs.size());
    for (auto& r : out) {
      r.reward = 0.5;
      r.correct = true;
    }
    return out;
  };
  std::vector<eval::EvalProblemResult> per;
  MultiTurnStats st;
  const eval::EvalSummary s = evaluate_episodes(mt, ec, score, *f.tok, problems, &per, &st);
  EXPECT_EQ(s.name, "held");
  EXPECT_EQ(s.num_problems, 3);
  EXPECT_EQ(s.num_samples, 6);
  ASSERT_EQ(per.size(), 3u);
  EXPECT_EQ(per[0].correct, 2);  // the environment's reward 6 > 0
  EXPECT_EQ(per[1].correct, 2);  // the verifier's verdict
  EXPECT_EQ(per[2].correct, 0);
  EXPECT_EQ(per[2].failures, 2);
  EXPECT_EQ(s.reward_failures, 2);
  EXPECT_NE(per[2].samples[0].failure.find("tool exploded"), std::string::npos) << per[2].samples[0].failure;
  EXPECT_DOUBLE_EQ(s.pass_at_1, 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(s.reward_mean, (6 + 6 + 0.5 + 0.5) / 4.0);
  EXPECT_DOUBLE_EQ(s.turns_mean, (3 + 3 + 3 + 3 + 2 + 2) / 6.0);
  EXPECT_EQ(st.env_failures, 2);
  // Only the episodes without an environment reward reach the verifier, with
  // their last model turn as the response.
  ASSERT_EQ(asked.size(), 2u);
  for (const auto& r : asked) EXPECT_EQ(r.label, "noreward");
  EXPECT_EQ(per[0].samples[0].turns, 3);
  EXPECT_NE(per[0].samples[0].response.find("obs 2"), std::string::npos) << per[0].samples[0].response;
  EXPECT_EQ(per[1].samples[1].response.substr(per[1].samples[1].response.size() - asked[1].response.size() -
                                              std::string("<|im_end|>").size()),
            asked[1].response + "<|im_end|>");
  std::vector<eval::EvalProblemResult> again;
  evaluate_episodes(mt, ec, score, *f.tok, problems, &again, nullptr);
  for (size_t p = 0; p < per.size(); ++p)
    for (size_t k = 0; k < per[p].samples.size(); ++k)
      EXPECT_EQ(again[p].samples[k].response, per[p].samples[k].response);
  EXPECT_NE(per[0].samples[0].response, per[0].samples[1].response);
}

TEST(MultiTurn, RlStepsWithAnEnvironment) {
  Fixture f;
  auto trainer = f.trainer();
  std::vector<data::PromptExample> train;
  for (int i = 0; i < 4; ++i) {
    data::PromptExample ex;
    ex.line = i + 1;
    ex.prompt_text = "p" + std::to_string(i);
    ex.prompt_ids = f.tok->encode(ex.prompt_text, false);
    ex.label = "ok";
    train.push_back(std::move(ex));
  }
  RlConfig c;
  c.rollout = f.rollout_section();
  c.rollout.sampling.n = 3;
  c.env = f.env;
  c.batch_size = 2;
  c.steps = 2;
  c.trainer.optim.lr = 1e-2;
  c.trainer.micro_batch_tokens = 128;
  c.log.progress = false;
  c.log_interval = 0;
  c.reward.threads = 1;
  c.out_dir = f.dir.str("run");
  RlInputs in;
  in.tok = &*f.tok;
  in.train = train;
  in.tokenizer_dir = f.dir.str("tok");
  in.eval = train;  // held-out episodes before the first step and after the last
  c.eval.config.n = 2;
  c.eval.config.sampling.max_new_tokens = 4;
  std::vector<nlohmann::json> metrics;
  in.on_step = [&](int64_t, const nlohmann::json& m) { metrics.push_back(m); };
  for (bool recompute : {false, true}) {
    c.algo.recompute_logprobs = recompute;
    c.out_dir = f.dir.str(recompute ? "run-recompute" : "run");
    metrics.clear();
    const RlResult r = run_rl(*trainer, in, c, false);
    EXPECT_EQ(r.steps_run, 2);
    EXPECT_EQ(r.max_logprob_abs_diff, 0.0);
    ASSERT_TRUE(r.first_eval && r.last_eval);
    EXPECT_EQ(r.first_eval->turns_mean, 3.0);
    EXPECT_EQ(r.last_eval->num_samples, 8);
    EXPECT_EQ(r.last_eval->pass_at_1, 1.0);  // the environment's reward 6
    ASSERT_EQ(metrics.size(), 3u);           // step 0 (the first eval) and the two steps
    EXPECT_EQ(metrics[0]["eval/test/turns_mean"].get<double>(), 3.0);
    metrics.erase(metrics.begin());
    for (const auto& m : metrics) {
      EXPECT_EQ(m["rollout/turns_mean"].get<double>(), 3.0);
      EXPECT_EQ(m["rollout/env_failures"].get<int64_t>(), 0);
      EXPECT_GE(m["rollout/env_time_s"].get<double>(), 0.0);
      EXPECT_EQ(m["rollout/reward_mean"].get<double>(), 6.0);
      EXPECT_EQ(m["train/train_rollout_logprob_abs_diff"].get<double>(), 0.0);
      EXPECT_EQ(m["train/train_rollout_logprob_bitwise_equal_frac"].get<double>(), 1.0);
      // Trained tokens are the model's: 3 turns of at most 4 tokens.
      EXPECT_LE(m["train/tokens"].get<int64_t>(), 2 * 3 * 3 * 4);
    }
    const auto lines = data::read_jsonl(c.out_dir + "/samples/step_000002.jsonl");
    ASSERT_FALSE(lines.empty());
    EXPECT_EQ(lines[0].value["turns"].get<int64_t>(), 3);
  }
}

}  // namespace
}  // namespace lockstep::rl
