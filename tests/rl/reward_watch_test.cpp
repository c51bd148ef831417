// Reward failures in an RL run are loud: the stop rule of RewardWatch (every
// reward of a step failed; above max_failure_rate for 3 steps in a row), and
// the step line that shows the failures, a skipped update, step N/TOTAL and
// the time left.
#include "lockstep/rl/reward_watch.h"

#include <gtest/gtest.h>

#include "lockstep/base/step_clock.h"
#include "lockstep/rl/step_line.h"

namespace lockstep::rl {
namespace {

RewardTally tally(int64_t scored, int64_t failed) {
  return {scored, failed, failed ? "bad_return: compute_score (r.py:1) returned str" : ""};
}

TEST(RewardWatch, StopsWhenEveryRewardOfAStepFails) {
  RewardWatch w(0.5);
  EXPECT_EQ(w.observe(1, tally(16, 3)), "");
  const std::string why = w.observe(2, tally(16, 16));
  EXPECT_NE(why.find("rl step 2: every reward failed (16 of 16)"), std::string::npos) << why;
  EXPECT_NE(why.find("the first failure: bad_return: compute_score (r.py:1) returned str"), std::string::npos)
      << why;
}

TEST(RewardWatch, StopsAfterThreeStepsInARowAboveTheRate) {
  RewardWatch w(0.5);
  EXPECT_EQ(w.observe(1, tally(10, 6)), "");
  EXPECT_EQ(w.observe(2, tally(10, 6)), "");
  EXPECT_EQ(w.observe(3, tally(10, 5)), "");  // at the rate, not above: the count starts again
  EXPECT_EQ(w.observe(4, tally(10, 9)), "");
  EXPECT_EQ(w.observe(5, tally(10, 7)), "");
  const std::string why = w.observe(6, tally(10, 8));
  EXPECT_NE(why.find("max_failure_rate = 0.5 for 3 steps in a row (8 of 10 this step)"), std::string::npos)
      << why;
}

TEST(RewardWatch, NothingScoredIsNoFailure) {
  RewardWatch w(0.0);
  for (int64_t step = 1; step <= 5; ++step) EXPECT_EQ(w.observe(step, tally(0, 0)), "");
  // max_failure_rate = 1 never stops on the rate, only when all fail.
  RewardWatch lenient(1.0);
  for (int64_t step = 1; step <= 5; ++step) EXPECT_EQ(lenient.observe(step, tally(10, 9)), "");
}

TEST(StepLine, ShowsFailuresSkipsAndTime) {
  nlohmann::json m = {{"rollout/reward_mean", 0.42},
                      {"rollout/accuracy", 0.5},
                      {"train/grad_norm", 1.5},
                      {"perf/step_time_s", 2.0}};
  const std::string line = format_step_line("step 3/10", m, tally(16, 3), "", "elapsed 6s, left 14s");
  EXPECT_EQ(line.rfind("step 3/10 | reward 0.42 (3/16 failed) | acc 0.5 | ", 0), 0u) << line;
  EXPECT_NE(line.find("| grad_norm 1.5 | s 2 | elapsed 6s, left 14s"), std::string::npos) << line;
  // No sample scored: no mean; a skipped update shows why and no gradient.
  nlohmann::json none = {{"rollout/accuracy", 0.0}, {"train/skipped", 1}};
  const std::string skipped =
      format_step_line("step 4/10", none, tally(16, 16), "all groups filtered (rewards all agree)", "");
  EXPECT_EQ(skipped.rfind("step 4/10 | reward - (16/16 failed) | acc 0 |", 0), 0u) << skipped;
  EXPECT_NE(skipped.find("| skipped: all groups filtered (rewards all agree)"), std::string::npos) << skipped;
  EXPECT_EQ(skipped.find("grad_norm"), std::string::npos) << skipped;
  // Without failures the reward stands alone.
  EXPECT_EQ(format_step_line("step 1/1", m, tally(16, 0), "", "").rfind("step 1/1 | reward 0.42 | acc", 0),
            0u);
}

TEST(StepClock, CountsAndFormats) {
  const StepClock c(5, 20);  // resumed after step 4
  EXPECT_EQ(c.head(7), "step 7/20");
  EXPECT_EQ(c.timing(20).rfind("elapsed ", 0), 0u);
  EXPECT_NE(c.timing(20).find(", left 0s"), std::string::npos) << c.timing(20);
  EXPECT_EQ(StepClock::duration(0.4), "0s");
  EXPECT_EQ(StepClock::duration(59), "59s");
  EXPECT_EQ(StepClock::duration(185), "3m05s");
  EXPECT_EQ(StepClock::duration(3720), "1h02m");
}

}  // namespace
}  // namespace lockstep::rl
