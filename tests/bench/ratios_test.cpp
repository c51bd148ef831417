// The benchmarks' ratio table: each row divides a measured figure by the
// baseline measured beside it, and says which bound a decode roofline is.
#include "lockstep/bench/ratios.h"

#include <gtest/gtest.h>

#include <string>

namespace lockstep::perf {
namespace {

bool has_row(const std::string& table, const std::string& ratio, const std::string& value) {
  std::size_t at = table.find(ratio);
  if (at == std::string::npos) return false;
  const std::size_t end = table.find('\n', at);
  return table.substr(at, end - at).find(value) != std::string::npos;
}

TEST(BenchRatios, EachRatioAgainstItsBaseline) {
  TrainBenchResult t;
  t.model = "m";
  t.gflops = 60;
  t.tokens_per_s = 1234;
  t.peak.wall_gflops = 200;
  t.peak.cpu_gflops = 150;  // the larger of the two is the peak
  TrainBenchResult t8 = t;
  t8.opt.precision = DType::FP8E4M3;
  t8.gflops = 50;

  RolloutBenchResult r;
  r.model = "m";
  r.peak = t.peak;
  DecodeResult d1;
  d1.batch = 1;
  d1.tokens_per_s = 300;
  d1.roofline_tokens_per_s = 400;
  d1.compute_step_ms = 1;
  d1.memory_step_ms = 2.5;
  DecodeResult d16 = d1;
  d16.batch = 16;
  d16.tokens_per_s = 900;
  d16.roofline_tokens_per_s = 1000;
  d16.memory_step_ms = 0.5;
  r.decode = {d1, d16};
  r.prefill_gflops = 20;
  r.grpo_shared = {1.0, 800, 900};
  r.grpo_unshared = {2.0, 800, 4000};

  const std::string s = ratio_table({t, t8}, {r}).str();
  EXPECT_TRUE(has_row(s, "training FLOP/s / FMA peak  ", "30.0%")) << s;
  EXPECT_TRUE(has_row(s, "training FLOP/s / FMA peak (fp8)", "25.0%")) << s;
  EXPECT_TRUE(has_row(s, "decode batch 1 / roofline", "75.0%")) << s;
  EXPECT_TRUE(has_row(s, "decode batch 1 / roofline", "memory bound")) << s;
  EXPECT_TRUE(has_row(s, "decode batch 16 / roofline", "90.0%")) << s;
  EXPECT_TRUE(has_row(s, "decode batch 16 / roofline", "compute bound")) << s;
  EXPECT_TRUE(has_row(s, "prefill FLOP/s / FMA peak", "10.0%")) << s;
  EXPECT_TRUE(has_row(s, "GRPO prefix sharing / none", "2.00x")) << s;
}

}  // namespace
}  // namespace lockstep::perf
