// metrics.jsonl lines: the wall-clock "time" of every line, verl's metric
// names with [log] metric_names = "verl" (and the way back to lockstep's),
// and the [log] keys the logger reads.
#include "lockstep/metrics/metrics_logger.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <set>
#include <string>

#include "lockstep/base/error.h"
#include "lockstep/base/toml_section.h"
#include "lockstep/metrics/metric_names.h"

namespace lockstep::metrics {
namespace {

namespace fs = std::filesystem;

std::string temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("lockstep_metrics_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

double now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

TEST(MetricsLogger, EveryLineCarriesItsWallClockTime) {
  const std::string dir = temp_dir("time");
  const double before = now();
  {
    MetricsLogger log(dir + "/metrics.jsonl");
    log.log(0, {{"eval/test/pass@1", 0.5}});
    log.log(1, {{"train/loss", 1.0}});
  }
  const double after = now();
  const auto lines = read_metrics(dir + "/metrics.jsonl");
  ASSERT_EQ(lines.size(), 2u);
  for (const auto& l : lines) {
    ASSERT_TRUE(l.contains("time")) << l.dump();
    ASSERT_TRUE(l["time"].is_number_float()) << l.dump();
    EXPECT_GE(l["time"].get<double>(), before - 1e-3);
    EXPECT_LE(l["time"].get<double>(), after + 1e-3);
  }
  EXPECT_LE(lines[0]["time"].get<double>(), lines[1]["time"].get<double>());
  EXPECT_EQ(lines[1]["train/loss"], 1.0);
  fs::remove_all(dir);
}

TEST(MetricsLogger, VerlNamesRenameOnlyMetricsWithAnEquivalent) {
  const std::string dir = temp_dir("verl");
  LoggerOptions o;
  o.names = MetricNames::Verl;
  {
    MetricsLogger log(dir + "/metrics.jsonl", MetricsLogger::kAppend, o);
    log.log(1, {{"train/pg_loss", -0.1},
                {"train/grad_norm", 2.0},
                {"rollout/score_mean", 0.5},
                {"rollout/truncated_ratio", 0.25},
                {"perf/rollout_time_s", 3.0},
                {"rollout/accuracy", 0.4},
                {"train/train_rollout_logprob_abs_diff", 0.0}});
  }
  const auto lines = read_metrics(dir + "/metrics.jsonl");
  ASSERT_EQ(lines.size(), 1u);
  const auto& l = lines[0];
  EXPECT_EQ(l["actor/pg_loss"], -0.1);
  EXPECT_EQ(l["actor/grad_norm"], 2.0);
  EXPECT_EQ(l["critic/score/mean"], 0.5);
  EXPECT_EQ(l["response_length/clip_ratio"], 0.25);
  EXPECT_EQ(l["timing_s/gen"], 3.0);
  // No verl equivalent: lockstep's name.
  EXPECT_EQ(l["rollout/accuracy"], 0.4);
  EXPECT_EQ(l["train/train_rollout_logprob_abs_diff"], 0.0);
  EXPECT_FALSE(l.contains("train/pg_loss"));
  EXPECT_FALSE(l.contains("rollout/score_mean"));
  EXPECT_EQ(l["step"], 1);
  EXPECT_TRUE(l.contains("time"));
  fs::remove_all(dir);
}

// The table is a bijection (no two metrics share a name either way), and
// lockstep_name undoes exported_name.
TEST(MetricNames, VerlTableRoundTrips) {
  std::set<std::string> ours, theirs;
  for (const auto& [a, b] : verl_metric_names()) {
    EXPECT_TRUE(ours.insert(std::string(a)).second) << a;
    EXPECT_TRUE(theirs.insert(std::string(b)).second) << b;
    EXPECT_EQ(exported_name(std::string(a), MetricNames::Verl), b);
    EXPECT_EQ(exported_name(std::string(a), MetricNames::Lockstep), a);
    EXPECT_EQ(lockstep_name(std::string(b)), a);
    EXPECT_EQ(lockstep_name(std::string(a)), a);
  }
  for (const auto& name : ours) EXPECT_EQ(theirs.count(name), 0u) << name << " is a name in both schemes";
  EXPECT_EQ(exported_name("rollout/accuracy", MetricNames::Verl), "rollout/accuracy");
  EXPECT_EQ(lockstep_name("eval/test/pass@1"), "eval/test/pass@1");
  EXPECT_EQ(parse_metric_names("verl"), MetricNames::Verl);
  EXPECT_EQ(parse_metric_names("lockstep"), MetricNames::Lockstep);
  EXPECT_THROW(parse_metric_names("wandb"), Error);
}

TEST(LoggerOptions, ReadFromTheLogSection) {
  auto root = parse_toml_with_overrides("[log]\ntensorboard = true\nmetric_names = \"verl\"\n", "x.toml", {});
  TomlSection s(root["log"].as_table(), "x.toml", "log");
  const LoggerOptions o = read_logger_options(s, true);
  s.finish();
  EXPECT_TRUE(o.tensorboard);
  EXPECT_EQ(o.names, MetricNames::Verl);

  TomlSection none(nullptr, "x.toml", "log");
  const LoggerOptions d = read_logger_options(none, true);
  EXPECT_FALSE(d.tensorboard);
  EXPECT_EQ(d.names, MetricNames::Lockstep);
}

TEST(LoggerOptions, BadValuesAndUnreadKeysNameTheKey) {
  auto bad = parse_toml_with_overrides("[log]\nmetric_names = \"wandb\"\n", "x.toml", {});
  TomlSection s(bad["log"].as_table(), "x.toml", "log");
  try {
    read_logger_options(s, true);
    FAIL() << "accepted metric_names = \"wandb\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("metric_names"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("x.toml"), std::string::npos) << e.what();
  }
  // Without names (sft), metric_names is a key nobody reads: finish() refuses it.
  auto sft = parse_toml_with_overrides("[log]\nmetric_names = \"verl\"\n", "s.toml", {});
  TomlSection t(sft["log"].as_table(), "s.toml", "log");
  read_logger_options(t, false);
  EXPECT_THROW(t.finish(), Error);
}

}  // namespace
}  // namespace lockstep::metrics
