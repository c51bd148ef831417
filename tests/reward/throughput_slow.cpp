// Verifier throughput (responses/s) on synthetic chain-of-thought responses
// of about 1 KB with a final answer: printed, never asserted (timing is not
// a test). Run: ctest -L slow -R throughput --verbose.
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "lockstep/reward/batch.h"
#include "lockstep/reward/math_verifier.h"

namespace lockstep::reward {
namespace {

struct Pair {
  const char* answer;
  const char* label;
};

const Pair kAnswers[] = {
    {"42", "42"},
    {"\\frac{3}{4}", "0.75"},
    {"2\\sqrt{3}", "\\sqrt{12}"},
    {"(1, -2)", "(1,-2)"},
    {"[0, \\frac{1}{2})", "[0,0.5)"},
    {"x = 7", "7"},
    {"25\\%", "0.25"},
    {"\\frac{\\pi}{6}", "\\frac{\\pi}{6}"},
    {"1,024", "1024"},
    {"\\{1, 3\\}", "\\{3,1\\}"},
    {"17", "18"},
    {"\\frac{1}{3}", "0.33"},
    {"x^2 + 2x + 1", "(x+1)^2"},
    {"\\text{(B)}", "B"},
};

std::vector<RewardRequest> make_requests(size_t n) {
  std::mt19937 g(11);
  const char* filler[] = {"Let", "us", "compute", "$a_n = 2a_{n-1} + 1$", "so", "that", "$3 \\cdot 7 = 21$",
                          "and", "hence", "the", "sum", "is", "$\\frac{n(n+1)}{2}$", "for", "n", "=", "10,"};
  std::vector<RewardRequest> out;
  for (size_t i = 0; i < n; ++i) {
    std::string cot;
    while (cot.size() < 1000) {
      cot += filler[g() % (sizeof(filler) / sizeof(filler[0]))];
      cot += ' ';
    }
    const Pair& p = kAnswers[g() % (sizeof(kAnswers) / sizeof(kAnswers[0]))];
    RewardRequest r;
    r.response = cot + "\nTherefore the answer is $\\boxed{" + p.answer + "}$.";
    r.label = p.label;
    out.push_back(std::move(r));
  }
  return out;
}

TEST(Throughput, MathVerifier) {
  auto reqs = make_requests(20000);
  auto reward = std::make_shared<MathVerifier>(RewardOptions{});
  auto t0 = std::chrono::steady_clock::now();
  int64_t correct = 0;
  for (const auto& r : reqs) correct += reward->evaluate(r).correct;
  double single = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("math verifier, 1 thread:  %zu responses (~1 KB) in %.3f s = %.0f responses/s (%lld correct)\n",
              reqs.size(), single, static_cast<double>(reqs.size()) / single, static_cast<long long>(correct));

  BatchScorer scorer(reward, BatchOptions{0, 10.0, 1.0});
  BatchStats stats;
  auto t1 = std::chrono::steady_clock::now();
  scorer.score(reqs, &stats);
  double batch = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  std::printf("math verifier, batch (%d threads): %.0f responses/s, accuracy %.3f, failures %lld\n",
              scorer.threads(), static_cast<double>(reqs.size()) / batch, stats.accuracy(),
              static_cast<long long>(stats.failures));
  EXPECT_EQ(stats.failures, 0);
  EXPECT_EQ(stats.correct, correct);
}

}  // namespace
}  // namespace lockstep::reward
