// first_gap finds the first token whose two logprobs differ in any bit
// (-0.0 vs 0.0 and NaN payloads included); describe_gap names it.
#include "lockstep/rl/gap_check.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace lockstep::rl {
namespace {

TEST(GapCheck, FindsTheFirstDifferingBitInSampleThenPositionOrder) {
  std::vector<std::vector<float>> a = {{-1.5f, -0.25f}, {-3.0f, -2.0f, -1.0f}, {-0.5f}};
  std::vector<std::vector<float>> b = a;
  EXPECT_FALSE(first_gap(a, b).has_value());
  b[2][0] = std::nextafter(b[2][0], 0.0f);
  b[1][2] = -1.0000001f;
  const auto g = first_gap(a, b, 10);
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->sample, 11u);
  EXPECT_EQ(g->token, 2);
  EXPECT_EQ(g->rollout, -1.0f);
  const std::string d = describe_gap(*g, 5);
  EXPECT_NE(d.find("sample 11 of the step's batch, response token 2 (position 7)"), std::string::npos) << d;
  EXPECT_NE(d.find("0xbf800000"), std::string::npos) << d;
}

TEST(GapCheck, SignOfZeroAndNanPayloadsCount) {
  EXPECT_TRUE(first_gap({{0.0f}}, {{-0.0f}}).has_value());
  const float q = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(first_gap({{q}}, {{q}}).has_value()) << "the same NaN bits are equal";
  EXPECT_TRUE(first_gap({{q}}, {{-q}}).has_value());
}

TEST(GapCheck, ShapeMismatchIsAnError) {
  EXPECT_ANY_THROW(first_gap({{1.0f}}, {}));
  EXPECT_ANY_THROW(first_gap({{1.0f}}, {{1.0f, 2.0f}}));
}

}  // namespace
}  // namespace lockstep::rl
