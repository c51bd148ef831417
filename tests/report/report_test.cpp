// The run report on real run directories in a temp dir: a full RL run with a
// torn last metrics line, eval steps, samples with HTML special characters,
// summary.json and an SFT warm-up; missing files; NaN values; a single step;
// the atomic write. Also the metrics and samples readers on their own.
#include "lockstep/report/report.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "lockstep/base/error.h"
#include "lockstep/report/charts.h"
#include "lockstep/report/run_data.h"

namespace lockstep::report {
namespace {

namespace fs = std::filesystem;

// The charts every report has (sft_loss only with sft/metrics.jsonl).
const char* const kChartIds[] = {"reward", "eval_pass", "truncation", "response_len", "logprob_gap",
                                 "kl",     "clipfrac",  "entropy",    "grad_norm",    "loss",
                                 "lr",     "step_time", "throughput"};
constexpr int kCharts = 13;

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "lockstep_report_XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream f(p, std::ios::binary);
  f << text;
}

std::string read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + what.size())) ++n;
  return n;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& w : v) s += w + "\n";
  return s;
}

bool any_contains(const std::vector<std::string>& v, const std::string& what) {
  for (const auto& s : v)
    if (s.find(what) != std::string::npos) return true;
  return false;
}

// The <svg ...> element of one chart.
std::string chart_svg(const std::string& html, const std::string& id) {
  const size_t at = html.find("data-chart=\"" + id + "\"");
  if (at == std::string::npos) return "";
  const size_t begin = html.rfind("<svg", at);
  const size_t end = html.find("</svg>", at);
  return html.substr(begin, end + 6 - begin);
}

bool is_nodata(const std::string& svg) {
  return svg.find("class=\"chart nodata\"") != std::string::npos;
}

// A step of an RL run with every DESIGN §6 metric; eval every 5 steps.
std::string rl_line(int step) {
  const double t = step;
  std::ostringstream os;
  os << "{\"step\": " << step;
  if (step > 0) {
    os << ", \"rollout/reward_mean\": " << 0.1 + 0.05 * t << ", \"rollout/reward_std\": 0.2"
       << ", \"rollout/response_len_mean\": " << 40 + t << ", \"rollout/response_len_max\": " << 64
       << ", \"rollout/truncated_ratio\": " << 0.3 / t << ", \"train/train_rollout_logprob_abs_diff\": 0"
       << ", \"train/train_rollout_logprob_abs_diff_max\": 0, \"train/train_rollout_kl\": 0"
       << ", \"train/kl\": " << 0.001 * t << ", \"train/tis_clipfrac\": 0, \"train/pg_loss\": " << -0.01 * t
       << ", \"train/pg_clipfrac\": 0.02, \"train/entropy\": " << 2.0 - 0.1 * t
       << ", \"train/grad_norm\": " << 1.0 / t << ", \"train/lr\": 1e-5, \"perf/step_time_s\": 3.5"
       << ", \"perf/rollout_time_s\": 2.0, \"perf/reward_time_s\": 0.1, \"perf/train_time_s\": 1.2"
       << ", \"perf/weight_sync_s\": 0.05, \"perf/rollout_tokens_per_s\": 1500"
       << ", \"perf/train_tokens_per_s\": 2400";
  }
  if (step % 5 == 0) {
    os << ", \"eval/test/pass@1\": " << 0.1 + 0.05 * t << ", \"eval/test/pass@4\": " << 0.3 + 0.04 * t
       << ", \"eval/test/pass@16\": " << 0.5 + 0.03 * t << ", \"eval/test/truncated_ratio\": 0.1"
       << ", \"eval/test/response_len_mean\": 50, \"eval/hard/pass@1\": " << 0.01 * t;
    if (step > 0) os << ", \"perf/eval_time_s\": 0.7";
  }
  os << "}\n";
  return os.str();
}

const char* const kNasty = "<script>alert(\\\"x\\\")</script> & 'q' <b>bold</b>";
const char* const kNastyEscaped =
    "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;q&#39; &lt;b&gt;bold&lt;/b&gt;";

std::string sample_line(int step, int i) {
  std::ostringstream os;
  os << "{\"step\": " << step << ", \"prompt\": \"Q" << i << " " << kNasty << "\", \"response\": \"A" << i
     << " 2 < 3 && 4 > 1 → ∑\\nline2\", \"reward\": " << (i % 2) << ", \"finish_reason\": \""
     << (i == 3 ? "length" : "stop") << "\", \"response_len\": " << 10 + i
     << ", \"advantage\": " << (i % 2 ? 0.5 : -0.5) << "}\n";
  return os.str();
}

// A full run directory: 10 steps, a torn 11th line, two samples files.
void make_full_run(const fs::path& dir) {
  write(dir / "config.toml", "[model]\npath = \"m<1>\"\n[log]\nreport_interval = 5\n");
  std::string metrics;
  for (int s = 0; s <= 10; ++s) metrics += rl_line(s);
  metrics += "{\"step\": 11, \"rollout/rew";  // torn: the run was writing it
  write(dir / "metrics.jsonl", metrics);
  std::string first, last;
  for (int i = 0; i < 6; ++i) first += sample_line(1, i), last += sample_line(10, i);
  write(dir / "samples" / "step_000001.jsonl", first);
  write(dir / "samples" / "step_10.jsonl", last);
  write(dir / "samples" / "notes.txt", "not a samples file");
  write(dir / "summary.json", "{\"final\": {\"pass@1\": 0.6, \"note\": \"a<b\"}, \"steps\": 10}");
}

TEST(Report, FullRun) {
  TempDir tmp;
  const fs::path run = tmp.path() / "run";
  make_full_run(run);
  const ReportResult r = write_report(run.string(), "");
  EXPECT_EQ(r.path, (run / "report.html").string());
  EXPECT_EQ(r.charts, kCharts);
  ASSERT_TRUE(fs::exists(r.path));
  const std::string html = read(r.path);

  // The torn last line is a warning, returned and shown in the page.
  ASSERT_EQ(r.warnings.size(), 1u) << joined(r.warnings);
  EXPECT_NE(r.warnings[0].find("metrics.jsonl: 1 malformed line skipped"), std::string::npos);
  EXPECT_NE(html.find("id=\"warnings\""), std::string::npos);
  EXPECT_NE(html.find("1 malformed line skipped"), std::string::npos);

  // Every chart is there and has data.
  EXPECT_EQ(count(html, "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart"), kCharts);
  for (const char* id : kChartIds) {
    const std::string svg = chart_svg(html, id);
    ASSERT_FALSE(svg.empty()) << id;
    EXPECT_FALSE(is_nodata(svg)) << id;
  }
  // pass@1 and pass@k of both sets, one line each, pass@4 before pass@16.
  const std::string pass = chart_svg(html, "eval_pass");
  EXPECT_EQ(count(pass, "class=\"series line\""), 4);
  EXPECT_LT(pass.find("test pass@4"), pass.find("test pass@16"));
  EXPECT_NE(pass.find("hard pass@1"), std::string::npos);
  // Reward: the ± std band under the mean.
  const std::string reward = chart_svg(html, "reward");
  EXPECT_EQ(count(reward, "class=\"series band\""), 1);
  EXPECT_EQ(count(reward, "class=\"series line\""), 1);
  // Step time: five phases stacked and the total as a line.
  const std::string time = chart_svg(html, "step_time");
  EXPECT_EQ(count(time, "class=\"series area\""), 5);
  EXPECT_EQ(count(time, "class=\"series line\""), 1);
  // Truncation: rollout and eval.
  EXPECT_EQ(count(chart_svg(html, "truncation"), "class=\"series line\""), 2);

  // Eval table: first (step 0) vs last (step 10) eval.
  EXPECT_NE(html.find("step 0 (first eval)"), std::string::npos);
  EXPECT_NE(html.find("step 10 (last eval)"), std::string::npos);
  EXPECT_NE(html.find("<td>eval/test/pass@16</td>"), std::string::npos);
  EXPECT_NE(html.find("<td>eval/hard/pass@1</td>"), std::string::npos);

  // Samples: 4 from the first file and 4 from the last, escaped.
  EXPECT_EQ(count(html, kNastyEscaped), 8);
  EXPECT_EQ(html.find("<script>alert"), std::string::npos);
  EXPECT_EQ(html.find("<b>bold"), std::string::npos);
  EXPECT_NE(html.find("2 &lt; 3 &amp;&amp; 4 &gt; 1 → ∑\nline2"), std::string::npos);
  EXPECT_NE(html.find("Q3 "), std::string::npos);
  EXPECT_EQ(html.find("Q4 "), std::string::npos);  // only the first 4 of each file
  EXPECT_NE(html.find("<td>length</td>"), std::string::npos);

  // summary.json flattened; config.toml shown escaped.
  EXPECT_NE(html.find("<td>final.pass@1</td><td>0.6</td>"), std::string::npos);
  EXPECT_NE(html.find("<td>final.note</td><td>a&lt;b</td>"), std::string::npos);
  EXPECT_NE(html.find("path = &quot;m&lt;1&gt;&quot;"), std::string::npos);
  EXPECT_NE(html.find("report_interval = 5"), std::string::npos);

  // Self-contained: no external resources.
  EXPECT_EQ(html.find("src=\"http"), std::string::npos);
  EXPECT_EQ(html.find("href=\"http"), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);
  EXPECT_NE(html.find("id=\"render-check\""), std::string::npos);
}

TEST(Report, MissingRunDirOrMetricsIsAnErrorNamingTheFile) {
  TempDir tmp;
  try {
    write_report((tmp.path() / "nope").string(), "");
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nope"), std::string::npos) << e.what();
  }
  const fs::path run = tmp.path() / "run";
  write(run / "config.toml", "[model]\n");
  try {
    write_report(run.string(), "");
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find((run / "metrics.jsonl").string()), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(run / "report.html"));
}

TEST(Report, AbsentMetricsGiveNoDataPanels) {
  TempDir tmp;
  const fs::path run = tmp.path() / "run";
  write(run / "config.toml", "[train]\nlr = 1e-5\n");
  // An SFT run: loss, grad norm, lr, train tokens/s only.
  std::string m;
  for (int s = 1; s <= 4; ++s)
    m += "{\"step\": " + std::to_string(s) + ", \"train/loss\": " + std::to_string(3.0 / s) +
         ", \"train/grad_norm\": 1.5, \"train/lr\": 1e-5, \"perf/train_tokens_per_s\": 900}\n";
  write(run / "metrics.jsonl", m);
  const ReportResult r = write_report(run.string(), "");
  EXPECT_TRUE(r.warnings.empty()) << joined(r.warnings);
  EXPECT_EQ(r.charts, kCharts);
  const std::string html = read(r.path);
  for (const char* id : {"loss", "grad_norm", "lr", "throughput"})
    EXPECT_FALSE(is_nodata(chart_svg(html, id))) << id;
  for (const char* id : {"reward", "eval_pass", "truncation", "response_len", "logprob_gap", "kl", "clipfrac",
                         "entropy", "step_time"}) {
    const std::string svg = chart_svg(html, id);
    ASSERT_FALSE(svg.empty()) << id;  // present, not vanished
    EXPECT_TRUE(is_nodata(svg)) << id;
    EXPECT_NE(svg.find(">no data<"), std::string::npos) << id;
  }
  EXPECT_NE(chart_svg(html, "kl").find("train/train_rollout_kl"), std::string::npos);
  EXPECT_EQ(count(html, "class=\"chart nodata\""), 9);
  EXPECT_NE(html.find("No eval/* metrics"), std::string::npos);
  EXPECT_NE(html.find("No samples/step_N.jsonl files"), std::string::npos);
}

TEST(Report, NonFiniteValuesAreSkippedAndReported) {
  TempDir tmp;
  const fs::path run = tmp.path() / "run";
  write(run / "config.toml", "");
  write(run / "metrics.jsonl",
        "{\"step\": 1, \"train/grad_norm\": 1.0, \"train/entropy\": null}\n"
        "{\"step\": 2, \"train/grad_norm\": null, \"train/entropy\": \"nan\"}\n"
        "{\"step\": 3, \"train/grad_norm\": \"inf\", \"train/entropy\": \"-Infinity\"}\n"
        "{\"step\": 4, \"train/grad_norm\": 2.0, \"train/entropy\": null, \"note\": \"text\"}\n"
        "{\"train/grad_norm\": 5.0}\n"
        "{\"step\": 5, \"rollout/reward_mean\": NaN}\n");  // not JSON: the whole line is skipped
  const ReportResult r = write_report(run.string(), "");
  EXPECT_TRUE(
      any_contains(r.warnings, "6 non-finite values not drawn (first: train/entropy = nan at step 1)"));
  EXPECT_TRUE(any_contains(r.warnings, "1 line without a numeric \"step\" skipped"));
  EXPECT_TRUE(any_contains(r.warnings, "1 malformed line skipped"));
  const std::string html = read(r.path);
  const std::string grad = chart_svg(html, "grad_norm");
  EXPECT_FALSE(is_nodata(grad));
  EXPECT_NE(grad.find("data-points=\"2\""), std::string::npos);
  EXPECT_TRUE(is_nodata(chart_svg(html, "entropy")));  // every value non-finite
  EXPECT_TRUE(is_nodata(chart_svg(html, "reward")));
  // No NaN or inf ever reaches a coordinate.
  static const std::regex kBad(R"(( d|cx|cy|x|y|x1|x2|y1|y2|width|height)="[^"]*(nan|inf)[^"]*")");
  EXPECT_FALSE(std::regex_search(html, kBad));
}

TEST(Report, SingleStepAndEvalOnlyStepZero) {
  TempDir tmp;
  const fs::path run = tmp.path() / "run";
  write(run / "config.toml", "");
  write(run / "metrics.jsonl", "{\"step\": 0, \"eval/test/pass@1\": 0.125, \"eval/test/pass@8\": 0.5}\n");
  const ReportResult r = write_report(run.string(), "");
  EXPECT_TRUE(r.warnings.empty()) << joined(r.warnings);
  const std::string html = read(r.path);
  const std::string pass = chart_svg(html, "eval_pass");
  EXPECT_FALSE(is_nodata(pass));
  EXPECT_EQ(count(pass, "class=\"marker\""), 2);
  EXPECT_NE(pass.find("test pass@1 | step 0: 0.125"), std::string::npos);
  EXPECT_NE(html.find("step 0 (first eval)"), std::string::npos);
  EXPECT_EQ(html.find("(last eval)"), std::string::npos);  // one eval: one column

  // One full RL step.
  write(run / "metrics.jsonl", rl_line(1));
  const ReportResult r1 = write_report(run.string(), "");
  const std::string h1 = read(r1.path);
  for (const char* id : {"reward", "step_time", "grad_norm", "response_len"})
    EXPECT_FALSE(is_nodata(chart_svg(h1, id)));
  EXPECT_EQ(count(chart_svg(h1, "reward"), "class=\"marker\""), 1);
}

TEST(Report, EmptyMetricsFileStillWritesAPage) {
  TempDir tmp;
  const fs::path run = tmp.path() / "run";
  write(run / "metrics.jsonl", "");
  const ReportResult r = write_report(run.string(), "");
  EXPECT_EQ(r.charts, kCharts);
  EXPECT_TRUE(any_contains(r.warnings, "no steps logged yet"));
  EXPECT_TRUE(any_contains(r.warnings, "config.toml: not found"));
  EXPECT_EQ(count(read(r.path), "class=\"chart nodata\""), kCharts);
}

TEST(Report, BadSideFilesAreWarningsNotErrors) {
  TempDir tmp;
  const fs::path run = tmp.path() / "run";
  write(run / "config.toml", "[model\nbroken = \n");
  write(run / "metrics.jsonl", rl_line(1));
  write(run / "summary.json", "{\"a\": ");
  write(run / "samples" / "step_1.jsonl", sample_line(1, 0) + "{\"prompt\": \n" + sample_line(1, 1));
  const ReportResult r = write_report(run.string(), "");
  EXPECT_TRUE(any_contains(r.warnings, "config.toml:1: not valid TOML"));
  EXPECT_TRUE(any_contains(r.warnings, "summary.json: not valid JSON"));
  EXPECT_TRUE(any_contains(r.warnings, "step_1.jsonl:2: malformed sample line skipped"));
  const std::string html = read(r.path);
  EXPECT_EQ(count(html, kNastyEscaped), 2);                        // the two good samples
  EXPECT_NE(html.find("[model\nbroken = \n"), std::string::npos);  // still shown
}

TEST(Report, SftWarmupAddsALossChart) {
  TempDir tmp;
  const fs::path run = tmp.path() / "run";
  make_full_run(run);
  write(run / "sft" / "metrics.jsonl",
        "{\"step\": 1, \"train/loss\": 2.5}\n{\"step\": 2, \"train/loss\": 1.5}\n");
  const ReportResult r = write_report(run.string(), "");
  EXPECT_EQ(r.charts, kCharts + 1);
  const std::string svg = chart_svg(read(r.path), "sft_loss");
  ASSERT_FALSE(svg.empty());
  EXPECT_FALSE(is_nodata(svg));
  EXPECT_NE(svg.find("data-points=\"2\""), std::string::npos);
}

TEST(Report, RolloutAheadAddsAStalenessChart) {
  TempDir tmp;
  const fs::path run = tmp.path() / "run";
  make_full_run(run);
  EXPECT_TRUE(chart_svg(read(write_report(run.string(), "").path), "rollout_ahead").empty())
      << "a synchronous run has no staleness chart";
  write(run / "metrics.jsonl",
        "{\"step\": 1, \"rollout/weight_staleness\": 0, \"perf/rollout_wait_time_s\": 0.5}\n"
        "{\"step\": 2, \"rollout/weight_staleness\": 1, \"perf/rollout_wait_time_s\": 0.0}\n"
        "{\"step\": 3, \"rollout/weight_staleness\": 1, \"perf/rollout_wait_time_s\": 0.1}\n");
  const ReportResult r = write_report(run.string(), "");
  const std::string svg = chart_svg(read(r.path), "rollout_ahead");
  ASSERT_FALSE(svg.empty());
  EXPECT_FALSE(is_nodata(svg));
  EXPECT_NE(svg.find("data-points=\"3\""), std::string::npos);
}

TEST(Report, MultiTurnRunsAddATurnsChart) {
  TempDir tmp;
  const fs::path run = tmp.path() / "run";
  make_full_run(run);
  EXPECT_TRUE(chart_svg(read(write_report(run.string(), "").path), "turns").empty())
      << "a single-turn run has no turns chart";
  write(
      run / "metrics.jsonl",
      "{\"step\": 0, \"eval/test/turns_mean\": 1.5}\n"
      "{\"step\": 1, \"rollout/turns_mean\": 1.2, \"rollout/env_failures\": 0, \"rollout/env_time_s\": 0.1}\n"
      "{\"step\": 2, \"rollout/turns_mean\": 1.9, \"rollout/env_failures\": 1, \"rollout/env_time_s\": 0.2, "
      "\"eval/test/turns_mean\": 1.9}\n");
  const std::string svg = chart_svg(read(write_report(run.string(), "").path), "turns");
  ASSERT_FALSE(svg.empty());
  EXPECT_FALSE(is_nodata(svg));
  EXPECT_NE(svg.find("data-points=\"2\""), std::string::npos);
  EXPECT_NE(svg.find("eval test turns"), std::string::npos);
}

// A run that logs the verifier's verdicts gets an accuracy chart, and one
// chart per reward/extra/<key>.
TEST(Report, AccuracyAndEveryRewardExtraAreCharted) {
  TempDir tmp;
  const fs::path run = tmp.path() / "run";
  make_full_run(run);
  const std::string before = read(write_report(run.string(), "").path);
  EXPECT_TRUE(chart_svg(before, "accuracy").empty()) << "no rollout/accuracy, no accuracy chart";
  EXPECT_EQ(before.find("reward_extra/"), std::string::npos);
  std::string m;
  for (int s = 1; s <= 3; ++s)
    m += "{\"step\": " + std::to_string(s) + ", \"rollout/accuracy\": " + std::to_string(0.2 * s) +
         ", \"rollout/score_mean\": " + std::to_string(0.2 * s) +
         ", \"reward/extra/acc\": " + std::to_string(0.1 * s) +
         ", \"reward/extra/format_ok\": 1, \"reward/extra/len\": " + std::to_string(40 + s) + "}\n";
  write(run / "metrics.jsonl", m);
  const ReportResult r = write_report(run.string(), "");
  EXPECT_EQ(r.charts, kCharts + 4);
  const std::string html = read(r.path);
  const std::string acc = chart_svg(html, "accuracy");
  ASSERT_FALSE(acc.empty());
  EXPECT_FALSE(is_nodata(acc));
  EXPECT_EQ(count(acc, "class=\"series line\""), 2);
  EXPECT_NE(acc.find("data-points=\"3\""), std::string::npos);
  EXPECT_NE(html.find("at step 3\">accuracy<b>0.6</b>"), std::string::npos);  // at a glance: the latest
  for (const char* key : {"acc", "format_ok", "len"}) {
    const std::string svg = chart_svg(html, std::string("reward_extra/") + key);
    ASSERT_FALSE(svg.empty()) << key;
    EXPECT_FALSE(is_nodata(svg)) << key;
    EXPECT_EQ(count(svg, "class=\"series line\""), 1) << key;
    EXPECT_NE(svg.find(std::string("Reward extra: ") + key), std::string::npos) << key;
  }
}

// A run logged with [log] metric_names = "verl" charts like one logged with
// lockstep's names; each line's "time" is not a metric but the logged span.
TEST(Report, VerlNamesAndTimestampsAreUnderstood) {
  TempDir tmp;
  const fs::path run = tmp.path() / "run";
  make_full_run(run);
  std::string m;
  for (int s = 1; s <= 3; ++s)
    m += "{\"step\": " + std::to_string(s) + ", \"time\": " + std::to_string(1700000000 + 50 * (s - 1)) +
         ".25, \"critic/rewards/mean\": " + std::to_string(0.1 * s) +
         ", \"rollout/reward_std\": 0.1, \"actor/pg_loss\": -0.5, \"actor/grad_norm\": 2, \"actor/lr\": 1e-6"
         ", \"response_length/mean\": 30, \"response_length/clip_ratio\": 0.5, \"timing_s/gen\": 1.5"
         ", \"timing_s/step\": 2.5}\n";
  write(run / "metrics.jsonl", m);
  const ReportResult r = write_report(run.string(), "");
  EXPECT_TRUE(r.warnings.empty()) << joined(r.warnings);
  const std::string html = read(r.path);
  for (const char* id : {"reward", "loss", "grad_norm", "lr", "response_len", "truncation", "step_time"})
    EXPECT_FALSE(is_nodata(chart_svg(html, id))) << id;
  EXPECT_EQ(count(chart_svg(html, "reward"), "class=\"series band\""), 1);
  EXPECT_NE(html.find("<td>train/pg_loss</td>"), std::string::npos);  // the metrics table: lockstep's names
  EXPECT_EQ(html.find("<td>actor/pg_loss</td>"), std::string::npos);
  EXPECT_EQ(html.find("<td>time</td>"), std::string::npos);
  EXPECT_NE(html.find("logged 2023-11-14 22:13:20 UTC – 2023-11-14 22:15:00 UTC (0 h 01 min 40 s)"),
            std::string::npos);

  const MetricTable t = load_metrics((run / "metrics.jsonl").string(), nullptr);
  EXPECT_FALSE(t.has("time"));
  EXPECT_TRUE(t.has("perf/rollout_time_s"));
  EXPECT_EQ(t.first_time, 1700000000.25);
  EXPECT_EQ(t.last_time, 1700000100.25);
}

// The samples table's label, correct and failure columns; a sample without
// them (an older run) leaves the cells empty.
TEST(Report, SamplesShowLabelVerdictAndFailure) {
  TempDir tmp;
  const fs::path run = tmp.path() / "run";
  make_full_run(run);
  write(run / "samples" / "step_10.jsonl",
        "{\"prompt\": \"P0\", \"response\": \"R0\", \"label\": \"42<x>\", \"correct\": true, \"reward\": 1}\n"
        "{\"prompt\": \"P1\", \"response\": \"R1\", \"label\": [\"7\", \"8\"], \"correct\": false, "
        "\"reward\": 0,"
        " \"reward_failure\": null}\n"
        "{\"prompt\": \"P2\", \"response\": \"R2\", \"label\": \"9\", \"correct\": false, \"reward\": null,"
        " \"reward_failure\": \"timeout after 5 s <verifier>\"}\n"
        "{\"prompt\": \"P3\", \"response\": \"R3\"}\n");
  const std::string html = read(write_report(run.string(), "").path);
  EXPECT_NE(html.find("<th>label</th><th>failure</th>"), std::string::npos);
  auto row = [&](const std::string& prompt) {
    const size_t at = html.find(">" + prompt + "<");
    return html.substr(html.rfind("<tr>", at), html.find("</tr>", at) - html.rfind("<tr>", at));
  };
  EXPECT_NE(row("P0").find("<td class=\"text\">42&lt;x&gt;</td>"), std::string::npos) << row("P0");
  EXPECT_NE(row("P0").find("title=\"correct\">✓</td>"), std::string::npos) << row("P0");
  EXPECT_NE(row("P0").find("<td class=\"text failure\"></td>"), std::string::npos) << row("P0");
  EXPECT_NE(row("P1").find("[&quot;7&quot;,&quot;8&quot;]"), std::string::npos) << row("P1");
  EXPECT_NE(row("P1").find("title=\"not correct\">✗</td>"), std::string::npos) << row("P1");
  EXPECT_NE(row("P1").find("<td class=\"text failure\"></td>"), std::string::npos) << row("P1");
  EXPECT_NE(row("P2").find("<td class=\"text failure\">timeout after 5 s &lt;verifier&gt;</td>"),
            std::string::npos)
      << row("P2");
  EXPECT_NE(row("P3").find("<td></td>"), std::string::npos) << row("P3");  // no verdict
  EXPECT_NE(row("P3").find("<td class=\"text\"></td><td class=\"text failure\"></td>"), std::string::npos)
      << row("P3");

  const auto rows = read_samples({10, (run / "samples" / "step_10.jsonl").string()}, 10, nullptr);
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0].correct, 1);
  EXPECT_EQ(rows[1].correct, 0);
  EXPECT_EQ(rows[3].correct, -1);
  EXPECT_EQ(rows[2].failure, "timeout after 5 s <verifier>");
  EXPECT_EQ(rows[1].failure, "");
  EXPECT_EQ(rows[1].label, "[\"7\",\"8\"]");
}

TEST(Report, AtomicWriteToOutPath) {
  TempDir tmp;
  const fs::path run = tmp.path() / "run";
  make_full_run(run);
  const fs::path out_dir = tmp.path() / "out";
  fs::create_directories(out_dir);
  const fs::path out = out_dir / "r.html";
  write(out, "old contents");
  const ReportResult r = write_report(run.string(), out.string());
  EXPECT_EQ(r.path, out.string());
  const std::string html = read(out);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("</html>\n"), std::string::npos);
  // Only the final file: no temporary left next to it, nothing in the run dir.
  int files = 0;
  for (const auto& e : fs::directory_iterator(out_dir)) {
    ++files;
    EXPECT_EQ(e.path().filename(), "r.html");
  }
  EXPECT_EQ(files, 1);
  EXPECT_FALSE(fs::exists(run / "report.html"));
  // An output folder that does not exist: an Error naming the path, no file.
  const fs::path bad = tmp.path() / "missing" / "r.html";
  try {
    write_report(run.string(), bad.string());
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad.string()), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(bad));
}

TEST(Report, LongRunStaysSmall) {
  TempDir tmp;
  const fs::path run = tmp.path() / "run";
  std::string m;
  for (int s = 0; s <= 6000; ++s) m += rl_line(s);
  write(run / "metrics.jsonl", m);
  write(run / "config.toml", "");
  const ReportResult r = write_report(run.string(), "");
  EXPECT_TRUE(r.warnings.empty()) << joined(r.warnings);
  EXPECT_LT(fs::file_size(r.path), 4u * 1000 * 1000);
}

TEST(ReportRunData, LoadMetricsKeepsTheLastLineOfAStepAndCountsBadLines) {
  TempDir tmp;
  const fs::path p = tmp.path() / "metrics.jsonl";
  write(p,
        "{\"step\": 1, \"a\": 1}\n\n{\"step\": 2, \"a\": 2, \"b\": 7}\n{\"step\": 2, \"a\": "
        "3}\n[1,2]\n{\"step\": 3.0, \"a\": 4}\n{\"st");
  std::vector<std::string> warnings;
  const MetricTable t = load_metrics(p.string(), &warnings);
  EXPECT_EQ(t.rows, 4);
  EXPECT_EQ(t.first_step, 1);
  EXPECT_EQ(t.last_step, 3);
  ASSERT_TRUE(t.has("a"));
  EXPECT_EQ(t.series.at("a").size(), 3u);
  EXPECT_EQ(t.series.at("a").at(2), 3.0);  // the later line of step 2 wins
  EXPECT_EQ(t.series.at("b").at(2), 7.0);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("2 malformed lines skipped"), std::string::npos) << warnings[0];
  const auto pts = t.points("a");
  ASSERT_EQ(pts.size(), 3u);
  EXPECT_EQ(pts[2].x, 3.0);
  EXPECT_TRUE(t.points("zzz").empty());
}

TEST(ReportRunData, SamplesFilesInStepOrder) {
  TempDir tmp;
  write(tmp.path() / "samples" / "step_10.jsonl", "");
  write(tmp.path() / "samples" / "step_000002.jsonl", "");
  write(tmp.path() / "samples" / "step_0.jsonl", "");
  write(tmp.path() / "samples" / "step_x.jsonl", "");
  write(tmp.path() / "samples" / "step_3.json", "");
  const auto files = list_samples_files(tmp.path().string());
  ASSERT_EQ(files.size(), 3u);
  EXPECT_EQ(files[0].step, 0);
  EXPECT_EQ(files[1].step, 2);
  EXPECT_EQ(files[2].step, 10);
  EXPECT_TRUE(list_samples_files((tmp.path() / "none").string()).empty());
}

TEST(ReportCharts, SplitEvalName) {
  std::string set, metric;
  ASSERT_TRUE(split_eval_name("eval/test/pass@1", &set, &metric));
  EXPECT_EQ(set, "test");
  EXPECT_EQ(metric, "pass@1");
  ASSERT_TRUE(split_eval_name("eval/gsm8k/hard/pass@8", &set, &metric));
  EXPECT_EQ(set, "gsm8k/hard");
  EXPECT_EQ(metric, "pass@8");
  EXPECT_FALSE(split_eval_name("eval/pass@1", &set, &metric));
  EXPECT_FALSE(split_eval_name("train/kl", &set, &metric));
  EXPECT_FALSE(split_eval_name("eval/test/", &set, &metric));
}

}  // namespace
}  // namespace lockstep::report
