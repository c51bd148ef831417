// The run report page (see report.h): header, warnings, a CSS grid of SVG
// charts, the first-vs-last eval table, a few samples, summary.json, every
// metric's range, the resolved config, and a tiny self-check script.
#include "lockstep/report/report.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "lockstep/base/error.h"
#include "lockstep/base/file_util.h"
#include "lockstep/report/charts.h"
#include "lockstep/report/run_data.h"
#include "lockstep/report/svg.h"

namespace lockstep::report {
namespace {

namespace fs = std::filesystem;

// Samples shown from the first and from the last samples file, and how much
// of a prompt or response is shown (a long response stays readable).
constexpr size_t kSamplesPerFile = 4;
constexpr size_t kMaxSampleTextBytes = 1500;
// config.toml and summary.json are small; anything bigger is cut.
constexpr size_t kMaxConfigBytes = size_t{256} * 1024;

const char* const kCss = R"(
body{font-family:"DejaVu Sans",Helvetica,Arial,sans-serif;margin:0;padding:16px 24px 40px;color:#222;background:#f4f5f7}
h1{font-size:22px;margin:0 0 4px}
h2{font-size:17px;margin:28px 0 10px;border-bottom:1px solid #d8d8d8;padding-bottom:4px}
.meta{color:#555;font-size:13px;margin:2px 0}
.glance{display:flex;flex-wrap:wrap;gap:10px;margin:12px 0}
.glance div{background:#fff;border:1px solid #ddd;border-radius:6px;padding:6px 12px;font-size:13px}
.glance b{display:block;font-size:17px}
.warnings{background:#fff4d6;border:1px solid #e0b84c;border-radius:6px;padding:8px 14px;margin:12px 0}
.warnings ul{margin:4px 0;padding-left:20px}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(430px,1fr));gap:14px}
.panel{margin:0;background:#fff;border:1px solid #ddd;border-radius:6px;padding:4px}
svg.chart{display:block;width:100%;height:auto}
table{border-collapse:collapse;font-size:13px;background:#fff}
th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#eef0f3}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.up{color:#2a7a2a}td.down{color:#b03030}
.text{white-space:pre-wrap;word-break:break-word;font-family:"DejaVu Sans Mono",monospace;font-size:12px;max-width:52em}
.cut{color:#888;font-style:italic}
pre.config{background:#fff;border:1px solid #ddd;border-radius:6px;padding:10px 14px;overflow:auto;font-size:12px}
details summary{cursor:pointer;font-weight:bold;margin:8px 0}
)";

// After load, measures every chart (series rendered with a non-empty box
// inside the chart, and where the chart sits on the page) into #render-check, so a
// headless browser can prove the charts render (tests/cli/report_chromium.sh).
// It changes nothing a reader sees.
const char* const kCheckScript = R"(<script>
(function () {
  function check() {
    var out = [];
    document.querySelectorAll('svg.chart').forEach(function (svg) {
      var drawn = 0, r = svg.getBoundingClientRect();
      // The rendered box (empty when not rendered, unlike getBBox), inside the chart.
      svg.querySelectorAll('.series').forEach(function (g) {
        var b = g.getBoundingClientRect();
        if ((b.width > 0 || b.height > 0) && b.left >= r.left - 1 && b.right <= r.right + 1 &&
            b.top >= r.top - 1 && b.bottom <= r.bottom + 1) drawn++;
      });
      out.push({id: svg.getAttribute('data-chart'), nodata: svg.classList.contains('nodata'),
                expected: +svg.getAttribute('data-series'), drawn: drawn,
                x: Math.round(r.left + window.scrollX), y: Math.round(r.top + window.scrollY),
                width: Math.round(r.width), height: Math.round(r.height)});
    });
    var el = document.getElementById('render-check');
    el.textContent = JSON.stringify(out);
    el.setAttribute('data-done', '1');
  }
  if (document.readyState === 'complete') check(); else window.addEventListener('load', check);
})();
</script>)";

std::string read_text(const std::string& path, size_t max_bytes, bool* cut) {
  std::ifstream in(path, std::ios::binary);
  std::string s;
  s.resize(max_bytes + 1);
  in.read(s.data(), std::streamsize(s.size()));
  s.resize(size_t(in.gcount()));
  *cut = s.size() > max_bytes;
  if (*cut) s = utf8_prefix(s, max_bytes);
  return s;
}

std::string utc_time(std::time_t t) {
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

// " · logged FIRST – LAST (DURATION)" from the lines' "time", or "" without it.
std::string logged_span(const MetricTable& m) {
  if (m.first_time <= 0) return "";
  const auto secs = int64_t(m.last_time - m.first_time);
  char dur[48];
  std::snprintf(dur, sizeof dur, "%lld h %02lld min %02lld s", (long long)(secs / 3600),
                (long long)(secs / 60 % 60), (long long)(secs % 60));
  return " · logged " + utc_time(std::time_t(m.first_time)) + " – " + utc_time(std::time_t(m.last_time)) +
         " (" + dur + ")";
}

std::string td_num(double v) {
  return "<td class=\"num\">" + html_escape(format_value(v)) + "</td>";
}

// The value of `name` at its last finite step, if any.
bool last_finite(const MetricTable& m, const std::string& name, int64_t* step, double* value) {
  auto it = m.series.find(name);
  if (it == m.series.end()) return false;
  for (auto r = it->second.rbegin(); r != it->second.rend(); ++r) {
    if (std::isfinite(r->second)) {
      *step = r->first;
      *value = r->second;
      return true;
    }
  }
  return false;
}

std::string glance(const MetricTable& m) {
  std::string s = "<div class=\"glance\">";
  s += "<div>steps<b>" +
       (m.rows ? std::to_string(m.first_step) + " – " + std::to_string(m.last_step) : std::string("none")) +
       "</b></div>";
  std::vector<std::pair<std::string, std::string>> picks = {
      {"rollout/reward_mean", "reward mean"},
      {"rollout/accuracy", "accuracy"},
      {"train/train_rollout_logprob_abs_diff", "mean |Δ logp|"},
      {"train/loss", "loss"},
      {"perf/step_time_s", "step time (s)"}};
  for (const auto& name : sorted_eval_names(m)) {
    std::string set, what;
    split_eval_name(name, &set, &what);
    if (what == "pass@1") picks.insert(picks.begin() + 1, {name, set + " pass@1"});
  }
  for (const auto& [name, label] : picks) {
    int64_t step = 0;
    double v = 0;
    if (!last_finite(m, name, &step, &v)) continue;
    s += "<div title=\"" + html_escape(name) + " at step " + std::to_string(step) + "\">" +
         html_escape(label) + "<b>" + html_escape(format_value(v)) + "</b></div>";
  }
  return s + "</div>";
}

std::string eval_table(const MetricTable& m) {
  const auto names = sorted_eval_names(m);
  if (names.empty()) return "<p class=\"meta\">No eval/* metrics in metrics.jsonl yet.</p>";
  int64_t first = 0, last = 0;
  bool any = false;
  for (const auto& name : names)
    for (const auto& [step, v] : m.series.at(name)) {
      first = any ? std::min(first, step) : step;
      last = any ? std::max(last, step) : step;
      any = true;
    }
  const bool two = first != last;
  std::string s =
      "<table class=\"eval\"><tr><th>metric</th><th>step " + std::to_string(first) + " (first eval)</th>";
  if (two) s += "<th>step " + std::to_string(last) + " (last eval)</th><th>change</th>";
  s += "</tr>";
  for (const auto& name : names) {
    const auto& series = m.series.at(name);
    auto a = series.find(first), b = series.find(last);
    s += "<tr><td>" + html_escape(name) + "</td>";
    s += a == series.end() ? "<td class=\"num\">—</td>" : td_num(a->second);
    if (two) {
      s += b == series.end() ? "<td class=\"num\">—</td>" : td_num(b->second);
      if (a != series.end() && b != series.end() && std::isfinite(a->second) && std::isfinite(b->second)) {
        const double d = b->second - a->second;
        s += std::string("<td class=\"num") +
             (d > 0   ? " up"
              : d < 0 ? " down"
                      : "") +
             "\">" + (d > 0 ? "+" : "") + html_escape(format_value(d)) + "</td>";
      } else {
        s += "<td class=\"num\">—</td>";
      }
    }
    s += "</tr>";
  }
  return s + "</table>";
}

std::string sample_text(const std::string& text) {
  std::string s = html_escape(utf8_prefix(text, kMaxSampleTextBytes));
  if (text.size() > kMaxSampleTextBytes)
    s +=
        "<span class=\"cut\">… (" + std::to_string(text.size() - kMaxSampleTextBytes) + " more bytes)</span>";
  return s;
}

// One samples table row; an absent field is an empty cell (or "—" for numbers).
std::string sample_row(const SampleRow& r) {
  std::string s = "<tr><td class=\"num\">" + std::to_string(r.step) + "</td>";
  s += r.has_reward ? td_num(r.reward) : "<td class=\"num\">—</td>";
  s += r.correct < 0    ? "<td></td>"
       : r.correct == 1 ? "<td class=\"up\" title=\"correct\">✓</td>"
                        : "<td class=\"down\" title=\"not correct\">✗</td>";
  s += r.has_advantage ? td_num(r.advantage) : "<td class=\"num\">—</td>";
  s += "<td>" + html_escape(r.finish_reason) + "</td>";
  s += "<td class=\"num\">" + (r.response_len >= 0 ? std::to_string(r.response_len) : std::string("—")) +
       "</td>";
  s += "<td class=\"text\">" + sample_text(r.label) + "</td>";
  s += "<td class=\"text failure\">" + sample_text(r.failure) + "</td>";
  s += "<td class=\"text\">" + sample_text(r.prompt) + "</td>";
  s += "<td class=\"text\">" + sample_text(r.response) + "</td></tr>";
  return s;
}

std::string samples_section(const std::string& run_dir, std::vector<std::string>* warnings) {
  const auto files = list_samples_files(run_dir);
  if (files.empty()) return "<p class=\"meta\">No samples/step_N.jsonl files.</p>";
  std::vector<SampleRow> rows = read_samples(files.front(), kSamplesPerFile, warnings);
  if (files.size() > 1) {
    auto more = read_samples(files.back(), kSamplesPerFile, warnings);
    rows.insert(rows.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
  }
  std::string s = "<p class=\"meta\">" + std::to_string(files.size()) + " samples file" +
                  (files.size() == 1 ? "" : "s") + "; up to " + std::to_string(kSamplesPerFile) +
                  " samples from the first" + (files.size() > 1 ? " and from the last" : "") + ".</p>";
  if (rows.empty()) return s + "<p class=\"meta\">The samples files hold no readable samples.</p>";
  s += "<table "
       "class=\"samples\"><tr><th>step</th><th>reward</th><th>correct</th><th>advantage</th><th>finish</th>"
       "<th>len</th><th>label</th><th>failure</th><th>prompt</th><th>response</th></tr>";
  for (const auto& r : rows) s += sample_row(r);
  return s + "</table>";
}

void flatten(const nlohmann::json& j, const std::string& prefix,
             std::vector<std::pair<std::string, std::string>>* out) {
  if (j.is_object() && !j.empty()) {
    for (auto it = j.begin(); it != j.end(); ++it)
      flatten(it.value(), prefix.empty() ? it.key() : prefix + "." + it.key(), out);
    return;
  }
  std::string v = j.is_string()         ? j.get<std::string>()
                  : j.is_number_float() ? format_value(j.get<double>())
                                        : j.dump();
  out->push_back({prefix, utf8_prefix(v, 500)});
}

std::string summary_section(const std::string& run_dir, std::vector<std::string>* warnings) {
  const std::string path = (fs::path(run_dir) / "summary.json").string();
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return "";
  bool cut = false;
  const std::string text = read_text(path, kMaxConfigBytes, &cut);
  auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (cut || j.is_discarded()) {
    warnings->push_back(path + ": not valid JSON" + std::string(cut ? " (or larger than 256 KiB)" : "") +
                        "; not shown");
    return "";
  }
  std::vector<std::pair<std::string, std::string>> rows;
  flatten(j, "", &rows);
  std::string s = "<h2>Summary</h2><table class=\"summary\"><tr><th>key</th><th>value</th></tr>";
  for (const auto& [k, v] : rows)
    s += "<tr><td>" + html_escape(k.empty() ? "(value)" : k) + "</td><td>" + html_escape(v) + "</td></tr>";
  return s + "</table>";
}

std::string all_metrics_table(const MetricTable& m) {
  std::string s = "<details><summary>All metrics (" + std::to_string(m.series.size()) +
                  ")</summary><table class=\"metrics\"><tr><th>metric</th><th>steps</th><th>non-finite</th>"
                  "<th>first</th><th>last</th><th>min</th><th>max</th></tr>";
  for (const auto& [name, series] : m.series) {
    int64_t bad = 0;
    double lo = INFINITY, hi = -INFINITY;
    for (const auto& [step, v] : series) {
      if (!std::isfinite(v)) {
        ++bad;
        continue;
      }
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    s += "<tr><td>" + html_escape(name) + "</td><td class=\"num\">" + std::to_string(series.size()) +
         "</td><td class=\"num\">" + std::to_string(bad) + "</td>" + td_num(series.begin()->second) +
         td_num(series.rbegin()->second);
    s += lo <= hi ? td_num(lo) + td_num(hi) : "<td class=\"num\">—</td><td class=\"num\">—</td>";
    s += "</tr>";
  }
  return s + "</table></details>";
}

std::string config_section(const std::string& run_dir, std::vector<std::string>* warnings) {
  const std::string path = (fs::path(run_dir) / "config.toml").string();
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    warnings->push_back(path + ": not found; the resolved config is not shown");
    return "<h2>Config</h2><p class=\"meta\">config.toml not found.</p>";
  }
  bool cut = false;
  const std::string text = read_text(path, kMaxConfigBytes, &cut);
  if (cut) {
    warnings->push_back(path + ": larger than 256 KiB; only the start is shown");
  } else {
    try {
      (void)toml::parse(text, path);
    } catch (const toml::parse_error& e) {
      warnings->push_back(path + ":" + std::to_string(e.source().begin.line) + ": not valid TOML (" +
                          std::string(e.description()) + ")");
    }
  }
  return "<h2>Config</h2><details open><summary>config.toml (resolved)</summary><pre class=\"config\">" +
         html_escape(text) + "</pre></details>";
}

}  // namespace

std::string render_report(const std::string& run_dir, ReportResult* result) {
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec))
    LS_THROW << run_dir << ": not a directory (expected a lockstep run directory)";
  std::vector<std::string>& warnings = result->warnings;
  const MetricTable metrics = load_metrics((fs::path(run_dir) / "metrics.jsonl").string(), &warnings);
  if (metrics.rows == 0)
    warnings.push_back((fs::path(run_dir) / "metrics.jsonl").string() + ": no steps logged yet");

  MetricTable sft;
  bool has_sft = false;
  const std::string sft_path = (fs::path(run_dir) / "sft" / "metrics.jsonl").string();
  if (fs::is_regular_file(sft_path, ec)) {
    try {
      sft = load_metrics(sft_path, &warnings);
      has_sft = true;
    } catch (const Error& e) {
      warnings.push_back(e.what());
    }
  }

  // Sections that may add warnings are built before the warnings box.
  std::string charts_html;
  result->charts = 0;
  for (const auto& chart : build_charts(metrics, has_sft ? &sft : nullptr)) {
    charts_html += "<figure class=\"panel\">" + render_chart(chart).svg + "</figure>\n";
    ++result->charts;
  }
  const std::string samples_html = samples_section(run_dir, &warnings);
  const std::string summary_html = summary_section(run_dir, &warnings);
  const std::string config_html = config_section(run_dir, &warnings);

  std::string name = fs::path(run_dir).lexically_normal().filename().string();
  if (name.empty()) name = fs::path(run_dir).lexically_normal().parent_path().filename().string();

  std::string h;
  h.reserve(size_t{64} * 1024 + charts_html.size());
  h += "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
       "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
       "<title>lockstep report: " +
       html_escape(name) + "</title><style>" + kCss + "</style></head><body>\n";
  h += "<h1>lockstep run report: " + html_escape(name) + "</h1>";
  h += "<p class=\"meta\">run directory <code>" + html_escape(run_dir) + "</code> · " +
       std::to_string(metrics.rows) + " metric lines" + logged_span(metrics) + " · generated " +
       utc_time(std::time(nullptr)) + "</p>";
  h += glance(metrics);
  if (!warnings.empty()) {
    h += "<div class=\"warnings\" id=\"warnings\"><b>Warnings</b><ul>";
    for (const auto& w : warnings) h += "<li>" + html_escape(w) + "</li>";
    h += "</ul></div>";
  }
  h += "<h2>Charts</h2><div class=\"grid\">\n" + charts_html + "</div>\n";
  h += "<h2>Eval: first vs last</h2>" + eval_table(metrics);
  h += "<h2>Samples</h2>" + samples_html;
  h += summary_html;
  if (!metrics.series.empty()) h += "<h2>Metrics</h2>" + all_metrics_table(metrics);
  h += config_html;
  h += "\n<pre id=\"render-check\" hidden></pre>\n";
  h += kCheckScript;
  h += "\n</body></html>\n";
  return h;
}

ReportResult write_report(const std::string& run_dir, const std::string& out_path) {
  ReportResult result;
  const std::string html = render_report(run_dir, &result);
  result.path = out_path.empty() ? (fs::path(run_dir) / "report.html").string() : out_path;
  write_file_atomic(result.path, html);
  return result;
}

}  // namespace lockstep::report
