// Tests for the countdown and exact-match rewards, RewardOptions parsing and
// the factory, and the BigInt / Rational helpers.
#include <gtest/gtest.h>

#include <cmath>

#include "lockstep/base/error.h"
#include "lockstep/reward/bigint.h"
#include "lockstep/reward/countdown.h"
#include "lockstep/reward/exact.h"
#include "lockstep/reward/reward.h"

namespace lockstep::reward {
namespace {

nlohmann::json cd_label(int64_t target, std::vector<int64_t> numbers) {
  return {{"target", target}, {"numbers", numbers}};
}

struct CountdownCase {
  const char* response;
  int64_t target;
  std::vector<int64_t> numbers;
  double reward;  // with the default options: 1 correct, 0.1 well-formed, 0 otherwise
};

TEST(Countdown, Table) {
  std::vector<CountdownCase> cases = {
      {"<think>try</think><answer>(93-43)+1</answer>", 51, {93, 43, 1}, 1.0},
      {"<answer>93 - 43 + 1 = 51</answer>", 51, {93, 43, 1}, 1.0},
      {"<answer>51 = 1 + (93 - 43)</answer>", 51, {93, 43, 1}, 1.0},
      {"<answer>93 - 43</answer>", 51, {93, 43, 1}, 0.1},            // a number unused
      {"<answer>(93-43)*1</answer>", 51, {93, 43, 1}, 0.1},          // wrong value
      {"<answer>93+43+1+1</answer>", 51, {93, 43, 1}, 0.1},          // a number used twice
      {"<answer>93 \\times 1 - 43 + 1</answer>", 51, {93, 43, 1}, 0.1},
      {"<answer>abc</answer>", 51, {93, 43, 1}, 0.0},                // not an equation
      {"<answer>-1 + 52</answer>", 51, {1, 52}, 0.0},                // no unary minus
      {"<answer>6 / (1 - 3/4)</answer>", 24, {6, 1, 3, 4}, 1.0},     // exact rational arithmetic
      {"<answer>4/(2-2)+24</answer>", 24, {4, 2, 2, 24}, 0.1},       // division by zero
      {"\\boxed{(93-43)+1}", 51, {93, 43, 1}, 1.0},
      {"Let me compute.\n(93-43)+1\n", 51, {93, 43, 1}, 1.0},
      {"<answer>1</answer> no wait <answer>(93-43)+1</answer>", 51, {93, 43, 1}, 1.0},
      {"<answer>(93 \xE2\x88\x92 43) \xC3\x97 1 + 1</answer>", 51, {93, 43, 1, 1}, 1.0},
      {"<answer>((((93-43))))+1</answer>", 51, {93, 43, 1}, 1.0},
      {"<answer>2 * 3 * 4</answer>", 24, {2, 3, 4}, 1.0},
      {"<answer>24</answer>", 24, {2, 3, 4}, 0.1},
      {"", 24, {2, 3, 4}, 0.0},
  };
  CountdownReward r(RewardOptions{});
  for (const auto& c : cases) {
    auto res = r.score(c.response, cd_label(c.target, c.numbers));
    EXPECT_FALSE(res.failed()) << c.response << ": " << res.failure;
    EXPECT_DOUBLE_EQ(res.reward, c.reward) << c.response << " extracted=[" << res.extracted << "]";
    EXPECT_EQ(res.correct, c.reward == 1.0) << c.response;
  }
}

TEST(Countdown, LabelFormsAndFailures) {
  CountdownReward r(RewardOptions{});
  EXPECT_TRUE(r.score("<answer>2*3*4</answer>", "{\"target\": 24, \"numbers\": [2, 3, 4]}").correct);
  EXPECT_TRUE(r.score("<answer>2*3*4</answer>", nlohmann::json::object({{"target", 24}, {"nums", {2, 3, 4}}})).correct);
  EXPECT_TRUE(r.score("<answer>2*3*4</answer>", nullptr, cd_label(24, {2, 3, 4})).correct);  // label in metadata
  auto bad = r.score("<answer>2*3*4</answer>", "24");
  EXPECT_TRUE(bad.failed());
  EXPECT_EQ(bad.failure.rfind("bad_label", 0), 0u);
  EXPECT_TRUE(std::isnan(bad.reward));
}

TEST(Countdown, FormatRewardIsConfigurable) {
  RewardOptions o;
  o.type = "countdown";
  o.format_reward = 0.0;
  o.correct_reward = 2.0;
  CountdownReward r(o);
  EXPECT_DOUBLE_EQ(r.score("<answer>93-43</answer>", cd_label(51, {93, 43, 1})).reward, 0.0);
  EXPECT_DOUBLE_EQ(r.score("<answer>93-43+1</answer>", cd_label(51, {93, 43, 1})).reward, 2.0);
}

TEST(Countdown, CheckDetails) {
  auto c = check_countdown("(1 + 2) * 3", 9, {1, 2, 3});
  EXPECT_TRUE(c.well_formed && c.numbers_ok && c.reaches_target);
  c = check_countdown("1 + 2 * 3", 9, {1, 2, 3});
  EXPECT_TRUE(c.well_formed && c.numbers_ok);
  EXPECT_FALSE(c.reaches_target);  // precedence: 7
  c = check_countdown(std::string(2000, '('), 1, {1});
  EXPECT_FALSE(c.well_formed);
  c = check_countdown(std::string(100, '(') + "1" + std::string(100, ')'), 1, {1});
  EXPECT_FALSE(c.well_formed);  // nesting limit
  c = check_countdown("99999999999999999999 + 1", 1, {1});
  EXPECT_FALSE(c.well_formed);  // literal too long
}

TEST(ExactMatch, Options) {
  RewardOptions o;
  o.type = "exact";
  ExactMatchReward plain(o);
  EXPECT_TRUE(plain.score("  Paris\n", "Paris").correct);  // strip is on by default
  EXPECT_FALSE(plain.score("paris", "Paris").correct);
  EXPECT_TRUE(plain.score("42", 42).correct);
  EXPECT_TRUE(plain.score("b", nlohmann::json::array({"a", "b"})).correct);
  o.casefold = true;
  EXPECT_TRUE(ExactMatchReward(o).score("PARIS", "paris").correct);
  o.casefold = false;
  o.strip = false;
  EXPECT_FALSE(ExactMatchReward(o).score(" Paris", "Paris").correct);
  o.strip = true;
  o.extractors = {"answer_tag"};
  o.format_reward = 0.2;
  ExactMatchReward tagged(o);
  auto ok = tagged.score("<answer> Paris </answer>", "Paris");
  EXPECT_TRUE(ok.correct);
  EXPECT_EQ(ok.extracted, "Paris");
  EXPECT_DOUBLE_EQ(tagged.score("<answer>Rome</answer>", "Paris").reward, 0.2);
  EXPECT_DOUBLE_EQ(tagged.score("Paris", "Paris").reward, 0.0);  // no tag: nothing found
  EXPECT_TRUE(plain.score("x", nlohmann::json::object()).failed());
}

TEST(RewardOptions, FromJson) {
  auto o = RewardOptions::from_json({{"type", "math"},
                                     {"extractors", "boxed, answer_is"},
                                     {"tolerance", 1e-4},
                                     {"format_reward", 0.1},
                                     {"timeout_s", 5},
                                     {"threads", 3}});
  EXPECT_EQ(o.extractors, (std::vector<std::string>{"boxed", "answer_is"}));
  EXPECT_DOUBLE_EQ(o.tolerance, 1e-4);
  EXPECT_DOUBLE_EQ(o.effective_format_reward(), 0.1);
  EXPECT_EQ(o.threads, 3);
  auto back = RewardOptions::from_json(o.to_json());
  EXPECT_EQ(back.to_json(), o.to_json());
  EXPECT_DOUBLE_EQ(RewardOptions::from_json({{"type", "countdown"}}).effective_format_reward(), 0.1);
  EXPECT_DOUBLE_EQ(RewardOptions::from_json({{"type", "math"}}).effective_format_reward(), 0.0);
}

void expect_error_naming(const nlohmann::json& j, const std::string& key) {
  try {
    RewardOptions::from_json(j);
    FAIL() << "no error for " << j.dump();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
  }
}

TEST(RewardOptions, RejectsBadInput) {
  expect_error_naming({{"tolerence", 1e-3}}, "tolerence");
  expect_error_naming({{"tolerance", "small"}}, "tolerance");
  expect_error_naming({{"retries", 1.5}}, "retries");
  expect_error_naming({{"strip", 1}}, "strip");
  expect_error_naming({{"type", "maths"}}, "maths");
  expect_error_naming({{"extractors", {"boxed", "regex"}}}, "regex");
  expect_error_naming({{"type", "remote"}}, "url");
  expect_error_naming({{"type", "remote"}, {"url", "ftp://x"}}, "url");
  expect_error_naming({{"timeout_s", 0}}, "timeout_s");
  expect_error_naming({{"max_concurrency", 0}}, "max_concurrency");
  expect_error_naming(nlohmann::json::array(), "JSON object");
}

// Found by tests/fuzz/targets/toml.cpp: a wrong-typed value was quoted whole,
// so a deeply nested table under [reward] gave a message of kilobytes.
TEST(RewardOptions, WrongTypesQuoteAnExcerptOfTheValue) {
  nlohmann::json deep = std::string(3000, 'R');
  for (int i = 0; i < 40; ++i) deep = nlohmann::json{{"level" + std::to_string(i), deep}};
  for (const char* key : {"function", "tolerance", "retries", "strip", "extractors"}) {
    try {
      RewardOptions::from_json({{key, deep}});
      FAIL() << key << ": accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(key), std::string::npos) << msg;
      EXPECT_LT(msg.size(), 300u) << key << ": " << msg.size() << " bytes";
    }
  }
  const std::string long_name(5000, 'x');
  for (const nlohmann::json& j : {nlohmann::json{{long_name, 1}}, nlohmann::json{{"extractors", {long_name}}},
                                  nlohmann::json{{"type", "python"}, {"function", long_name}}}) {
    try {
      RewardOptions::from_json(j).validate();
      FAIL() << "accepted";
    } catch (const Error& e) {
      EXPECT_LT(std::string(e.what()).size(), 400u) << std::string(e.what()).substr(0, 200);
    }
  }
  try {
    RewardOptions::from_json(nlohmann::json::array({deep}));
    FAIL() << "an array accepted";
  } catch (const Error& e) {
    EXPECT_LT(std::string(e.what()).size(), 300u);
  }
}

TEST(RewardFactory, BuildsEachType) {
  EXPECT_EQ(make_reward(RewardOptions::from_json({{"type", "math"}}))->type(), "math");
  EXPECT_EQ(make_reward(RewardOptions::from_json({{"type", "countdown"}}))->type(), "countdown");
  EXPECT_EQ(make_reward(RewardOptions::from_json({{"type", "exact"}}))->type(), "exact");
  auto remote = make_reward(RewardOptions::from_json({{"type", "remote"}, {"url", "http://127.0.0.1:1/x"}}));
  EXPECT_EQ(remote->type(), "remote");
  EXPECT_EQ(remote->max_parallelism(), 16);
}

TEST(BigInt, Arithmetic) {
  auto a = *BigInt::from_decimal("123456789012345678901234567890");
  auto b = *BigInt::from_decimal("987654321098765432109876543210");
  EXPECT_EQ(BigInt::add(a, b)->to_string(), "1111111110111111111011111111100");
  EXPECT_EQ(BigInt::sub(a, b)->to_string(), "-864197532086419753208641975320");
  EXPECT_EQ(BigInt::mul(a, b)->to_string(), "121932631137021795226185032733622923332237463801111263526900");
  BigInt q, r;
  BigInt::divmod(b, a, &q, &r);
  EXPECT_EQ(q.to_string(), "8");
  EXPECT_EQ(r.to_string(), "9000000000900000000090");
  BigInt::divmod(*BigInt::mul(a, b), BigInt(int64_t(1) << 40), &q, &r);
  EXPECT_EQ(BigInt::add(*BigInt::mul(q, BigInt(int64_t(1) << 40)), r)->to_string(), BigInt::mul(a, b)->to_string());
  EXPECT_EQ(BigInt::gcd(*BigInt::from_decimal("1071"), *BigInt::from_decimal("462")).to_string(), "21");
  EXPECT_EQ(BigInt::gcd(*BigInt::mul(a, BigInt(6)), *BigInt::mul(b, BigInt(6))).to_string(),
            BigInt::mul(BigInt::gcd(a, b), BigInt(6))->to_string());
  EXPECT_FALSE(BigInt::from_decimal("12a").has_value());
  EXPECT_FALSE(BigInt::from_decimal(std::string(5000, '9')).has_value());  // over the size cap
  EXPECT_EQ(BigInt(-5).to_string(), "-5");
  EXPECT_DOUBLE_EQ(a.to_double(), 1.2345678901234568e29);
}

TEST(Rational, ExactAndCapped) {
  auto r = *Rational::from_decimal("0.125");
  EXPECT_EQ(r.to_string(), "1/8");
  EXPECT_EQ(Rational::from_decimal("1.5e3")->to_string(), "1500");
  EXPECT_EQ(Rational::from_decimal("25e-2")->to_string(), "1/4");
  EXPECT_EQ(Rational::add(Rational(1), *Rational::div(Rational(1), Rational(3)))->to_string(), "4/3");
  EXPECT_EQ(Rational::pow(Rational(2), 100)->to_string(), "1267650600228229401496703205376");
  EXPECT_EQ(Rational::pow(*Rational::div(Rational(2), Rational(3)), -2)->to_string(), "9/4");
  EXPECT_FALSE(Rational::pow(Rational(2), 100000).has_value());  // 100000 bits > cap
  EXPECT_FALSE(Rational::pow(Rational(0), -1).has_value());
  EXPECT_FALSE(Rational::div(Rational(1), Rational(0)).has_value());
  EXPECT_EQ(Rational::pow(Rational(-1), 1000001)->to_string(), "-1");
  auto big = *Rational::pow(Rational(10), 400);
  auto ratio = *Rational::div(big, *Rational::pow(Rational(10), 399));
  EXPECT_DOUBLE_EQ(ratio.to_double(), 10.0);
  EXPECT_TRUE(std::isinf(big.to_double()));
  EXPECT_LT(Rational::compare(*Rational::from_decimal("0.333"), *Rational::div(Rational(1), Rational(3))), 0);
}

}  // namespace
}  // namespace lockstep::reward
