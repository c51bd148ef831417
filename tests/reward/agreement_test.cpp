// Agreement of the math verifier with the published test cases of other
// verifiers (tests/reward/data/verify_cases.jsonl: each line a label, a
// response or a bare answer, the verdict the other verifier's tests expect,
// and the source). Prints the agreement rate per category, fails when it
// drops below the measured level, when a case disagrees without a recorded
// reason, or when one case takes more than its CPU-time budget.
#include <gtest/gtest.h>
#include <time.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lockstep/reward/math_verifier.h"

namespace lockstep::reward {
namespace {

// Measured on this suite (see docs/rewards.md); a drop means a regression.
constexpr double kMinAgreement = 0.97;
// CPU seconds one case may take. A guard against hangs and blow-ups, not a
// speed target: real cases take microseconds. Sanitizer and debug builds
// run several times slower, so they get a wider budget.
#if defined(NDEBUG) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
constexpr double kCaseCpuBudgetS = 0.1;
#else
constexpr double kCaseCpuBudgetS = 1.0;
#endif

struct VerifyCase {
  int line = 0;
  std::string label, text, source, category, known;
  bool is_response = true;  // text is a whole response (extract first), else a bare answer
  bool expected = false;
};

std::string data_path() {
  // Tests run in the build directory; __FILE__ is relative to it or absolute.
  return (std::filesystem::path(__FILE__).parent_path() / "data" / "verify_cases.jsonl").string();
}

std::vector<VerifyCase> load_cases(const std::string& path) {
  std::ifstream in(path);
  if (!in) ADD_FAILURE() << "cannot open " << path;
  std::vector<VerifyCase> out;
  std::string line;
  int no = 0;
  while (std::getline(in, line)) {
    ++no;
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    bool has_text = j.is_object() && (j.contains("response") != j.contains("answer"));
    if (!has_text || !j.contains("label") || !j.contains("expected") || !j.contains("source") ||
        !j["expected"].is_boolean()) {
      ADD_FAILURE() << path << ":" << no
                    << ": need label, exactly one of response/answer, expected (bool) and source";
      continue;
    }
    VerifyCase c;
    c.line = no;
    c.label = j["label"].get<std::string>();
    c.is_response = j.contains("response");
    c.text = j[c.is_response ? "response" : "answer"].get<std::string>();
    c.expected = j["expected"].get<bool>();
    c.source = j["source"].get<std::string>();
    c.category = j.value("category", "other");
    c.known = j.value("known_disagreement", "");
    out.push_back(std::move(c));
  }
  return out;
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Tally {
  int n = 0, agree = 0;
};

TEST(VerifierAgreement, PublishedCasesOfOtherVerifiers) {
  auto cases = load_cases(data_path());
  ASSERT_GE(cases.size(), 300u) << data_path();
  std::map<std::string, Tally> by_category;
  Tally all;
  double slowest = 0;
  int slowest_line = 0;
  std::vector<std::string> now_agree;
  for (const auto& c : cases) {
    double t0 = thread_cpu_seconds();
    bool got = c.is_response ? math_response_correct(c.text, c.label)
                             : math_answers_equivalent(label_to_answer(c.label), c.text);
    double dt = thread_cpu_seconds() - t0;
    if (dt > slowest) {
      slowest = dt;
      slowest_line = c.line;
    }
    EXPECT_LE(dt, kCaseCpuBudgetS) << "line " << c.line << " took " << dt << " s of CPU";
    bool agree = got == c.expected;
    auto& cat = by_category[c.category];
    ++cat.n;
    ++all.n;
    cat.agree += agree;
    all.agree += agree;
    if (!agree && c.known.empty()) {
      ADD_FAILURE() << "line " << c.line << " (" << c.source << "): expected " << c.expected << ", got "
                    << got << "\n  label: " << c.label << "\n  "
                    << (c.is_response ? "response: " : "answer: ") << c.text.substr(0, 300);
    }
    if (!agree && !c.known.empty()) std::printf("  disagrees (known) line %d: %s\n", c.line, c.known.c_str());
    if (agree && !c.known.empty()) now_agree.push_back(std::to_string(c.line));
  }
  for (const auto& [name, t] : by_category)
    std::printf("[%-17s] %3d cases, %3d agree (%.1f%%)\n", name.c_str(), t.n, t.agree, 100.0 * t.agree / t.n);
  double rate = static_cast<double>(all.agree) / all.n;
  std::printf("agreement: %d / %d = %.2f%%; slowest case: line %d, %.6f s CPU\n", all.agree, all.n,
              100.0 * rate, slowest_line, slowest);
  for (const auto& l : now_agree)
    std::printf("  line %s has a known_disagreement note but now agrees\n", l.c_str());
  EXPECT_GE(rate, kMinAgreement);
}

}  // namespace
}  // namespace lockstep::reward
