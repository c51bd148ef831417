// The parity suite's big sweep (label slow): many more random cases, with
// longer prompts and generations, more prompts and samples per case, than
// the fast test. LOCKSTEP_PARITY_CASES / LOCKSTEP_PARITY_SEED override it.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>

#include "parity/parity_util.h"

namespace lockstep::parity {
namespace {

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoll(v, nullptr, 10) : fallback;
}

}  // namespace

TEST(ParitySlow, WideRandomSweepIsBitForBit) {
  const int64_t n_cases = env_int("LOCKSTEP_PARITY_CASES", 150);
  const uint64_t seed0 = uint64_t(env_int("LOCKSTEP_PARITY_SEED", 50000));
  const CaseShape shape{.max_prompts = 24, .max_prompt_len = 80, .max_new_tokens = 24, .max_n = 8};
  ThreadPool pool2(2);
  std::mt19937_64 g(seed0);
  CaseStats total;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n_cases; ++i) {
    const CaseStats st = check_case(random_case(seed0 + uint64_t(i), shape), &pool2, g);
    total.tokens += st.tokens;
    total.runs += st.runs;
    total.preemptions += st.preemptions;
    total.max_batch = std::max(total.max_batch, st.max_batch);
    if (HasFailure()) break;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "[parity slow] %lld cases (seeds %llu..), %lld engine runs matched, %lld sampled tokens, "
      "%lld preemptions, largest batch %lld sequences, %.1f s\n",
      (long long)n_cases, (unsigned long long)seed0, (long long)total.runs, (long long)total.tokens,
      (long long)total.preemptions, (long long)total.max_batch, secs);
  EXPECT_GT(total.preemptions, 0);
}

}  // namespace lockstep::parity
