// Run directory reading for the report (see run_data.h).
#include "lockstep/report/run_data.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <regex>

#include "lockstep/base/error.h"
#include "lockstep/metrics/metric_names.h"
#include "lockstep/metrics/metrics_logger.h"

namespace lockstep::report {
namespace {

namespace fs = std::filesystem;

// A metric value: a number, or a non-finite value as the run may have logged
// it (nlohmann writes NaN as null; other writers use strings). False for
// anything else (a string label, an object): not a metric.
bool metric_value(const nlohmann::json& v, double* out) {
  if (v.is_number()) {
    *out = v.get<double>();
    return true;
  }
  if (v.is_null()) {
    *out = std::numeric_limits<double>::quiet_NaN();
    return true;
  }
  if (!v.is_string()) return false;
  std::string s = v.get<std::string>();
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  if (s == "nan" || s == "+nan" || s == "-nan") {
    *out = std::numeric_limits<double>::quiet_NaN();
    return true;
  }
  if (s == "inf" || s == "+inf" || s == "infinity" || s == "+infinity") {
    *out = std::numeric_limits<double>::infinity();
    return true;
  }
  if (s == "-inf" || s == "-infinity") {
    *out = -std::numeric_limits<double>::infinity();
    return true;
  }
  return false;
}

bool step_of(const nlohmann::json& row, int64_t* step) {
  auto it = row.find("step");
  if (it == row.end()) return false;
  if (it->is_number_integer()) {
    *step = it->get<int64_t>();
    return true;
  }
  if (it->is_number_float()) {
    const double d = it->get<double>();
    if (!std::isfinite(d) || d != std::floor(d)) return false;
    *step = int64_t(d);
    return true;
  }
  return false;
}

void note_time(MetricTable& t, double v) {
  if (!std::isfinite(v) || v <= 0) return;
  t.first_time = t.first_time > 0 ? std::min(t.first_time, v) : v;
  t.last_time = std::max(t.last_time, v);
}

std::string plural(int64_t n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

}  // namespace

std::vector<Point> MetricTable::points(const std::string& name) const {
  std::vector<Point> out;
  auto it = series.find(name);
  if (it == series.end()) return out;
  out.reserve(it->second.size());
  for (const auto& [step, v] : it->second) out.push_back({double(step), v});
  return out;
}

std::vector<std::string> MetricTable::names_with_prefix(const std::string& prefix) const {
  std::vector<std::string> out;
  for (auto it = series.lower_bound(prefix); it != series.end() && it->first.rfind(prefix, 0) == 0; ++it)
    out.push_back(it->first);
  return out;
}

MetricTable load_metrics(const std::string& path, std::vector<std::string>* warnings) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    LS_THROW << path << ": not found (a lockstep run directory has metrics.jsonl)";
  if (!std::ifstream(path)) LS_THROW << path << ": cannot be read";
  int bad_lines = 0;
  const auto rows = metrics::read_metrics(path, &bad_lines);

  MetricTable t;
  int64_t no_step = 0, non_finite = 0;
  std::string non_finite_example;
  for (const auto& row : rows) {
    int64_t step = 0;
    if (!row.is_object()) {
      ++bad_lines;
      continue;
    }
    if (!step_of(row, &step)) {
      ++no_step;
      continue;
    }
    ++t.rows;
    if (t.last_step < t.first_step) {
      t.first_step = t.last_step = step;
    } else {
      t.first_step = std::min(t.first_step, step);
      t.last_step = std::max(t.last_step, step);
    }
    for (auto it = row.begin(); it != row.end(); ++it) {
      if (it.key() == "step") continue;
      double v = 0;
      if (!metric_value(it.value(), &v)) continue;
      if (it.key() == "time") {
        note_time(t, v);
        continue;
      }
      const std::string name = metrics::lockstep_name(it.key());
      if (!std::isfinite(v) && non_finite++ == 0)
        non_finite_example = name + " = " + format_value(v) + " at step " + std::to_string(step);
      // A step logged twice (a resumed run): the later line wins.
      t.series[name][step] = v;
    }
  }
  if (warnings) {
    if (bad_lines > 0)
      warnings->push_back(path + ": " + plural(bad_lines, "malformed line", "malformed lines") +
                          " skipped (a torn last line is expected while a run is writing)");
    if (no_step > 0)
      warnings->push_back(path + ": " + plural(no_step, "line", "lines") +
                          " without a numeric \"step\" skipped");
    if (non_finite > 0)
      warnings->push_back(path + ": " + plural(non_finite, "non-finite value", "non-finite values") +
                          " not drawn (first: " + non_finite_example + ")");
  }
  return t;
}

std::vector<SamplesFile> list_samples_files(const std::string& run_dir) {
  std::vector<SamplesFile> out;
  const fs::path dir = fs::path(run_dir) / "samples";
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  static const std::regex kName(R"(step_0*(\d+)\.jsonl)");
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::smatch m;
    const std::string name = it->path().filename().string();
    if (!std::regex_match(name, m, kName)) continue;
    const std::string digits = m[1].str();
    if (digits.size() > 18) continue;  // not a step number that fits in int64
    out.push_back({std::stoll(digits), it->path().string()});
  }
  std::sort(out.begin(), out.end(),
            [](const SamplesFile& a, const SamplesFile& b) { return a.step < b.step; });
  return out;
}

std::vector<SampleRow> read_samples(const SamplesFile& file, size_t max_rows,
                                    std::vector<std::string>* warnings) {
  std::vector<SampleRow> out;
  std::ifstream in(file.path);
  if (!in) {
    if (warnings) warnings->push_back(file.path + ": cannot be read");
    return out;
  }
  std::string line;
  int64_t line_no = 0;
  while (out.size() < max_rows && std::getline(in, line)) {
    ++line_no;
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) {
      if (warnings)
        warnings->push_back(file.path + ":" + std::to_string(line_no) + ": malformed sample line skipped");
      continue;
    }
    SampleRow r;
    r.step = file.step;
    step_of(j, &r.step);
    auto text = [&](const char* key) {
      auto it = j.find(key);
      if (it == j.end() || it->is_null()) return std::string();
      return it->is_string() ? it->get<std::string>() : it->dump();
    };
    r.prompt = text("prompt");
    r.response = text("response");
    r.finish_reason = text("finish_reason");
    r.has_reward = j.contains("reward") && metric_value(j["reward"], &r.reward);
    r.has_advantage = j.contains("advantage") && metric_value(j["advantage"], &r.advantage);
    if (auto it = j.find("response_len"); it != j.end() && it->is_number())
      r.response_len = it->get<int64_t>();
    r.label = text("label");
    if (auto it = j.find("correct"); it != j.end() && (it->is_boolean() || it->is_number()))
      r.correct = (it->is_boolean() ? it->get<bool>() : it->get<double>() != 0) ? 1 : 0;
    r.failure = text("reward_failure");
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace lockstep::report
