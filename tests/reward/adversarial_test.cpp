// Adversarial inputs for the verifiers: 100k nested braces, a megabyte of
// text, towers of exponents, unbalanced brackets, random bytes and random
// LaTeX soup. Every one must finish within the per-sample time limit
// without a crash (this test is also run under ASan).
#include <gtest/gtest.h>
#include <time.h>

#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "lockstep/reward/batch.h"
#include "lockstep/reward/countdown.h"
#include "lockstep/reward/math_verifier.h"

namespace lockstep::reward {
namespace {

std::string repeat(const std::string& s, size_t n) {
  std::string out;
  out.reserve(s.size() * n);
  for (size_t i = 0; i < n; ++i) out += s;
  return out;
}

std::vector<std::string> hostile_inputs() {
  std::vector<std::string> v = {
      "\\boxed{" + repeat("{", 100000) + "1" + repeat("}", 100000) + "}",
      "\\boxed{" + repeat("{", 100000),
      repeat("}", 100000) + "\\boxed{1}",
      repeat("(", 100000) + "1" + repeat(")", 100000),
      "\\boxed{" + repeat("(", 5000) + "1" + repeat(")", 5000) + "}",
      "\\boxed{" + repeat("\\frac{", 600) + "1" + repeat("}{2}", 600) + "}",
      "\\boxed{" + repeat("\\sqrt{", 600) + "2" + repeat("}", 600) + "}",
      "\\boxed{" + repeat("2^", 900) + "2}",
      "\\boxed{" + repeat("-", 1900) + "1}",
      "\\boxed{1" + repeat("+1", 900) + "}",
      "\\boxed{" + repeat("\\left(", 300) + "x" + repeat("\\right)", 300) + "}",
      "\\boxed{" + std::string(100000, '7') + "}",
      "\\boxed{" + std::string(1990, '9') + "}",
      "\\boxed{10^{10^{10}}}",
      "\\boxed{9^{9^{9^{9}}}}",
      "\\boxed{(10^{10^{10}})!}",
      "\\boxed{\\binom{10^{9}}{10^{5}}}",
      "\\boxed{\\binom{1000000}{5000}}",
      "\\boxed{3000!}",
      "\\boxed{2^{-10^{10}}}",
      "\\boxed{\\sqrt[10^{9}]{2}}",
      "\\boxed{10^{10000}-10^{10000}+1}",
      "\\boxed{1e99999}",
      "\\boxed{0^0 + 0/0 + \\frac{1}{0} + \\log_0 0}",
      "\\boxed{10!!!!!!!!!!}",
      "\\boxed{" + repeat("\\frac{3^{5000}}{2^{7000}}+", 60) + "1}",
      "\\boxed{" + repeat("x^{1000}", 200) + "}",
      "\\boxed{" + repeat("\\pm 1", 50) + "}",
      "\\boxed{" + repeat("(1,", 300) + "1" + repeat(")", 300) + "}",
      "\\boxed{" + repeat("\\{1,", 300) + "1" + repeat("\\}", 300) + "}",
      "\\boxed{" + repeat("1,", 999) + "1}",
      "\\boxed{\\begin{pmatrix}" + repeat("1 & ", 500) + "1\\end{pmatrix}}",
      "\\boxed{" + repeat("x<", 500) + "1}",
      "\\boxed{" + repeat("a=", 500) + "1}",
      "\\boxed{" + repeat("\\text{", 200) + "a" + repeat("}", 200) + "}",
      repeat("\\boxed{", 150000),
      repeat("\\boxed{1}", 100000),
      repeat("$", 1000000),
      repeat("$1$ ", 200000),
      repeat("\\(", 300000),
      repeat("The answer is ", 70000),
      repeat("Answer: ", 120000),
      repeat("<answer>", 100000),
      repeat("1,", 500000),
      repeat("9", 1000000),
      std::string(1000000, 'a'),
      repeat("\\", 1000000),
      repeat("\\frac", 200000),
      repeat("{", 500000) + repeat("}", 500000),
      "",
      "}{",
      "\\boxed{}",
      "\\boxed",
      "\\sqrt",
      "\\frac{1}",
      "\\begin{pmatrix}1 & 2",
      "((()))",
      "[1,2",
      "x = = = 1",
      "\xff\xfe\xfd\x80\x80",
  };
  // The paths for vectors in running text, joined boxes, assignments,
  // inequality unions and decimal approximations.
  std::string big_matrix = "\\begin{pmatrix}";
  for (int r = 0; r < 40; ++r) big_matrix += repeat("1 & ", 39) + "1 \\\\ ";
  big_matrix += "\\end{pmatrix}";
  std::string assignments;
  for (int k = 0; k < 600; ++k) assignments += "x_{" + std::to_string(k) + "}=" + std::to_string(k) + ", ";
  std::vector<std::string> more = {
      "\\boxed{" + big_matrix + "}",
      "The matrix is " + big_matrix + ".",
      "\\boxed{\\begin{pmatrix}" + repeat("\\begin{pmatrix}", 200) + "1" + repeat("\\end{pmatrix}", 200) +
          "\\end{pmatrix}}",
      repeat("\\begin{pmatrix}1", 50000),
      repeat("\\end{pmatrix}", 50000),
      repeat("\\langle 1,", 100000),
      repeat("(1, 2) ", 100000),
      repeat("(", 200000) + "1, 2" + repeat(")", 200000),
      repeat("(1,", 100000) + repeat(")", 100000),
      repeat(")", 300000),
      repeat("\\boxed{1} and x = ", 30000) + "\\boxed{2}",
      repeat("$x=\\boxed{1}$ and $y=", 20000) + "\\boxed{2}$",
      "\\boxed{" + assignments + "y=1}",
      "\\boxed{" + repeat("1 < x \\le ", 400) + "3}",
      "\\boxed{" + repeat("x<1 \\text{ or } ", 400) + "x>2}",
      "\\boxed{" + repeat("(1,2) \\cup ", 400) + "(3,4)}",
      "\\boxed{" + repeat("(-\\infty, 1) \\cup ", 60) + "(2,\\infty)}",
      "\\boxed{0." + std::string(1990, '3') + "}",
      "\\boxed{0." + std::string(40, '3') + "}",
      "\\boxed{0.333" + repeat(", 0.333", 300) + "}",
      "\\boxed{" + repeat("\\frac{1}{3^{200}}+", 40) + "0.333}",
  };
  v.insert(v.end(), more.begin(), more.end());
  // A megabyte of plausible chain-of-thought with numbers and math.
  std::mt19937 g(7);
  std::string cot;
  const char* words[] = {"so", "then", "we", "have", "$x^2+1$", "3.14", "\\frac{1}{2}", "therefore", "=", "42,",
                         "is", "the", "answer", "$\\sqrt{2}$", "(1,2)", "\\{", "\\}", "{", "}", "\\boxed{7}"};
  while (cot.size() < (1u << 20)) {
    cot += words[g() % (sizeof(words) / sizeof(words[0]))];
    cot += ' ';
  }
  v.push_back(cot);
  // Random bytes.
  std::uniform_int_distribution<int> byte(0, 255), len(0, 3000);
  for (int i = 0; i < 150; ++i) {
    std::string s(static_cast<size_t>(len(g)), '\0');
    for (auto& c : s) c = static_cast<char>(byte(g));
    v.push_back(s);
  }
  // Random LaTeX soup, boxed so that it reaches the parser.
  const char* toks[] = {"\\frac", "{", "}", "^", "_", "1", "23", "\\sqrt", "(", ")", "[", "]", "\\left", "\\right",
                        "=", "<", "\\le", "\\pm", "\\text{", "x", "\\pi", ",", ";", "\\cup", "\\infty", "|", "!",
                        "%", "\\%", ".", "e", "\\begin{pmatrix}", "\\end{pmatrix}", "&", "\\\\", "\\{", "\\}",
                        "\\sin", "\\log_", "\\binom", ":", "-", "+", "*", "/", " ", "\\,", "$", "0.5", "10^{"};
  std::uniform_int_distribution<int> tok(0, sizeof(toks) / sizeof(toks[0]) - 1), tlen(1, 400);
  for (int i = 0; i < 400; ++i) {
    std::string s = "\\boxed{";
    int n = tlen(g);
    for (int k = 0; k < n; ++k) s += toks[tok(g)];
    s += "}";
    v.push_back(s);
  }
  return v;
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// CPU seconds one hostile input may take (its three checks together) in an
// optimized build; sanitizer and debug builds run several times slower.
#if defined(NDEBUG) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
constexpr double kInputCpuBudgetS = 0.1;
#else
constexpr double kInputCpuBudgetS = 1.0;
#endif

TEST(Adversarial, EveryInputFinishesWithinTheLimit) {
  auto inputs = hostile_inputs();
  // Each hostile text is scored as a response against a plain label, and
  // (the first 2000 bytes) as a label against itself: both sides of the
  // comparison see it.
  std::vector<RewardRequest> reqs;
  for (const auto& s : inputs) {
    RewardRequest a;
    a.response = s;
    a.label = "1";
    reqs.push_back(a);
    RewardRequest b;
    b.response = "\\boxed{" + s.substr(0, 2000) + "}";
    b.label = s.substr(0, 2000);
    reqs.push_back(b);
  }
  RewardOptions o;
  auto reward = std::shared_ptr<const Reward>(make_reward(o));
  BatchScorer scorer(reward, BatchOptions{2, 10.0, 1.0});
  BatchStats stats;
  auto t0 = std::chrono::steady_clock::now();
  auto results = scorer.score(reqs, &stats);
  double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(stats.timeouts, 0);
  for (size_t i = 0; i < results.size(); ++i) {
    // Labels made of hostile text may be empty after stripping: a bad label
    // is a reported failure, which is fine; anything else is not.
    if (results[i].failed()) {
      EXPECT_EQ(results[i].failure.rfind("bad_label", 0), 0u) << i << ": " << results[i].failure;
    }
  }
  std::printf("%zu hostile samples scored in %.2f s (%zu inputs, up to 1 MB each)\n", reqs.size(), total,
              inputs.size());

  // The slowest single comparison, timed directly (wall clock and CPU time:
  // only the CPU time is checked, the wall clock depends on the machine's load).
  double worst = 0, worst_cpu = 0;
  size_t worst_i = 0, worst_cpu_i = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    double c0 = thread_cpu_seconds();
    auto s0 = std::chrono::steady_clock::now();
    (void)math_answers_equivalent(inputs[i].substr(0, 4000), inputs[i].substr(0, 4000));
    (void)math_response_correct(inputs[i], "10^{10^{10}}");
    (void)check_countdown(inputs[i].substr(0, 1000), 24, {1, 2, 3, 4});
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count();
    double cpu = thread_cpu_seconds() - c0;
    EXPECT_LE(cpu, kInputCpuBudgetS) << "input #" << i << ": " << inputs[i].substr(0, 80);
    if (s > worst) {
      worst = s;
      worst_i = i;
    }
    if (cpu > worst_cpu) {
      worst_cpu = cpu;
      worst_cpu_i = i;
    }
  }
  std::printf("slowest input: #%zu, %.4f s wall; most CPU: #%zu, %.4f s\n", worst_i, worst, worst_cpu_i, worst_cpu);
}

// Labels that send hostile answers down the newer comparison paths (decimal
// approximations, assignments, unions of intervals, matrices), each timed in
// CPU seconds: a hang guard, generous for sanitizer builds.
TEST(Adversarial, NewComparisonPathsStayBounded) {
  const double budget = 2.0;
  std::string big = "\\begin{pmatrix}";
  for (int r = 0; r < 6; ++r) big += repeat("\\frac{1}{3} & ", 5) + "\\frac{1}{3} \\\\ ";
  std::string big_decimal = big;
  big += "\\end{pmatrix}";
  for (size_t p = big_decimal.find("\\frac{1}{3}"); p != std::string::npos; p = big_decimal.find("\\frac{1}{3}"))
    big_decimal.replace(p, 11, "0.333");
  big_decimal += "\\end{pmatrix}";
  std::string many_vars, many_values;
  for (int k = 0; k < 60; ++k) {
    many_vars += std::string(k ? ", " : "") + "x_{" + std::to_string(k) + "}=" + std::to_string(k);
    many_values += std::string(k ? ", " : "") + std::to_string(59 - k);
  }
  struct P {
    std::string gold, pred;
  };
  std::vector<P> pairs = {
      {big, big_decimal},
      {"\\frac{1}{3}", "0." + std::string(1990, '3')},
      {"\\frac{1}{3^{4000}}", "0." + std::string(1900, '0') + "1"},
      {"\\frac{10^{2000}}{3}", "3" + std::string(1990, '3') + ".333"},
      {"(" + many_values + ")", many_vars},
      {many_vars, many_vars},
      {"(-\\infty,1)" + repeat("\\cup(2,3)", 60), "x<1" + repeat(" \\text{ or } 2<x<3", 60)},
      {repeat("1 < ", 30) + "x", "(1,\\infty)"},
  };
  for (const auto& p : pairs) {
    double t0 = thread_cpu_seconds();
    (void)math_answers_equivalent(p.gold, p.pred);
    (void)math_answers_equivalent(p.pred, p.gold);
    double dt = thread_cpu_seconds() - t0;
    EXPECT_LE(dt, budget) << p.gold.substr(0, 80) << " vs " << p.pred.substr(0, 80);
  }
  EXPECT_TRUE(math_answers_equivalent(big, big_decimal));
}

TEST(Adversarial, TowersOfExponentsTerminateWithSaneAnswers) {
  EXPECT_TRUE(math_answers_equivalent("10^{10^{10}}", "10^{10^{10}}"));
  EXPECT_FALSE(math_answers_equivalent("10^{10^{10}}", "10^{10^{10}}+1"));
  EXPECT_FALSE(math_answers_equivalent("2", "9^{9^{9^{9}}}"));
  EXPECT_FALSE(math_answers_equivalent("1", "\\frac{1}{0}"));
  EXPECT_TRUE(math_answers_equivalent("1", "10^{2000}-10^{2000}+1"));  // exact: within the size cap
}

}  // namespace
}  // namespace lockstep::reward
