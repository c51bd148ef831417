// The SVG chart writer: nice ticks, tick labels, escaping, and charts that
// stay well-formed and finite with NaN points, one point, constant series,
// bands, stacked areas, many points, and no data at all.
#include "lockstep/report/svg.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <regex>
#include <string>
#include <vector>

namespace lockstep::report {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + what.size())) ++n;
  return n;
}

// Every start tag is closed in order (self-closing tags aside): the SVG is
// well-formed as far as element nesting goes. Fails the test otherwise.
void expect_balanced(const std::string& svg) {
  std::vector<std::string> stack;
  static const std::regex kTag(R"(<(/?)([a-zA-Z]+)[^>]*?(/?)>)");
  for (std::sregex_iterator it(svg.begin(), svg.end(), kTag), end; it != end; ++it) {
    const auto& m = *it;
    if (m[3].length() > 0) continue;
    if (m[1].length() == 0) {
      stack.push_back(m[2].str());
    } else {
      ASSERT_FALSE(stack.empty()) << "closing </" << m[2].str() << "> without an open tag";
      ASSERT_EQ(stack.back(), m[2].str()) << "tags closed out of order";
      stack.pop_back();
    }
  }
  EXPECT_TRUE(stack.empty()) << "unclosed <" << (stack.empty() ? "" : stack.back()) << ">";
}

// The numbers in every d="..." and every cx/cy attribute.
std::vector<double> coordinates(const std::string& svg) {
  std::vector<double> out;
  static const std::regex kNum(R"([-+]?[0-9]*\.?[0-9]+(e[-+]?[0-9]+)?|nan|inf)");
  // The attributes by hand: std::regex recurses once per character, and a
  // long series' path overflows the stack (under AddressSanitizer's frames).
  std::vector<std::string> values;
  for (size_t at = 0; (at = svg.find("=\"", at)) != std::string::npos; at += 2) {
    const bool wanted = (at >= 2 && svg.compare(at - 2, 2, " d") == 0) ||
                        (at >= 2 && (svg.compare(at - 2, 2, "cx") == 0 || svg.compare(at - 2, 2, "cy") == 0));
    const size_t end = svg.find('"', at + 2);
    if (end == std::string::npos) break;
    if (wanted) values.push_back(svg.substr(at + 2, end - at - 2));
  }
  for (const std::string& v : values) {
    for (std::sregex_iterator n(v.begin(), v.end(), kNum), ne; n != ne; ++n) {
      const std::string t = n->str();
      out.push_back(t == "nan" ? kNaN : t == "inf" ? kInf : std::stod(t));
    }
  }
  return out;
}

void expect_inside_viewbox(const std::string& svg) {
  std::smatch m;
  ASSERT_TRUE(std::regex_search(svg, m, std::regex(R"(viewBox="0 0 ([0-9.]+) ([0-9.]+)\")")));
  const double w = std::stod(m[1].str()), h = std::stod(m[2].str());
  const auto coords = coordinates(svg);
  ASSERT_FALSE(coords.empty());
  for (double c : coords) {
    ASSERT_TRUE(std::isfinite(c)) << "non-finite coordinate in the SVG";
    EXPECT_GE(c, -1.0);
    EXPECT_LE(c, std::max(w, h) + 1.0);
  }
}

std::vector<std::string> y_tick_labels(const std::string& svg) {
  std::vector<std::string> out;
  static const std::regex kLabel(R"(<text x="[0-9.]+" y="[0-9.]+" text-anchor="end">([^<]*)</text>)");
  for (std::sregex_iterator it(svg.begin(), svg.end(), kLabel), end; it != end; ++it)
    out.push_back((*it)[1].str());
  return out;
}

Series series(const std::string& name, std::vector<Point> pts) {
  Series s;
  s.name = name;
  s.points = std::move(pts);
  return s;
}

TEST(ReportNiceTicks, CoverRangeWithRoundSteps) {
  const Ticks t = nice_ticks(0.13, 0.93, 5, false);
  EXPECT_DOUBLE_EQ(t.step, 0.2);
  EXPECT_LE(t.lo, 0.13);
  EXPECT_GE(t.hi, 0.93);
  ASSERT_GE(t.values.size(), 4u);
  EXPECT_DOUBLE_EQ(t.values.front(), t.lo);
  EXPECT_NEAR(t.values.back(), t.hi, 1e-12);
  for (size_t i = 1; i < t.values.size(); ++i) EXPECT_NEAR(t.values[i] - t.values[i - 1], t.step, 1e-12);
}

TEST(ReportNiceTicks, StepIsOneTwoOrFiveTimesPowerOfTen) {
  for (double hi : {0.003, 0.7, 3.0, 17.0, 130.0, 9999.0, 2.5e7}) {
    const Ticks t = nice_ticks(0, hi, 5, false);
    const double mant = t.step / std::pow(10.0, std::floor(std::log10(t.step)));
    EXPECT_TRUE(std::abs(mant - 1) < 1e-9 || std::abs(mant - 2) < 1e-9 || std::abs(mant - 5) < 1e-9)
        << "hi=" << hi << " step=" << t.step;
    EXPECT_GE(t.values.size(), 3u);
    EXPECT_LE(t.values.size(), 12u);
  }
}

TEST(ReportNiceTicks, ConstantAndSingleValueGetARange) {
  const Ticks c = nice_ticks(0.5, 0.5, 5, false);
  EXPECT_LT(c.lo, 0.5);
  EXPECT_GT(c.hi, 0.5);
  const Ticks z = nice_ticks(0, 0, 5, false);  // all zero: [0, 1], no negative ticks
  EXPECT_EQ(z.lo, 0);
  EXPECT_GE(z.hi, 1);
  const Ticks x = nice_ticks(7, 7, 6, true);  // one step on the x axis
  EXPECT_LE(x.lo, 6);
  EXPECT_GE(x.hi, 8);
  EXPECT_GE(x.step, 1.0);
}

TEST(ReportNiceTicks, IntegerAxisNeverUsesFractionalSteps) {
  const Ticks t = nice_ticks(0, 3, 6, true);
  EXPECT_GE(t.step, 1.0);
  for (double v : t.values) EXPECT_EQ(v, std::floor(v));
}

TEST(ReportFormatTick, DecimalsFollowTheStep) {
  EXPECT_EQ(format_tick(0.2, 0.2, 1.0), "0.2");
  EXPECT_EQ(format_tick(0.25, 0.05, 1.0), "0.25");
  EXPECT_EQ(format_tick(400, 200, 1000), "400");
  EXPECT_EQ(format_tick(0, 0.1, 1.0), "0");
  EXPECT_EQ(format_tick(-1.5, 0.5, 2.0), "-1.5");
}

TEST(ReportFormatTick, TinyAndHugeValuesStayDistinct) {
  // A learning-rate axis: 1.000e-6 .. 1.004e-6 in steps of 1e-9.
  const Ticks t = nice_ticks(1.0e-6, 1.004e-6, 4, false);
  std::vector<std::string> labels;
  for (double v : t.values)
    labels.push_back(format_tick(v, t.step, std::max(std::abs(t.lo), std::abs(t.hi))));
  for (size_t i = 1; i < labels.size(); ++i) EXPECT_NE(labels[i], labels[i - 1]) << labels[i];
  EXPECT_EQ(format_tick(2.5e7, 5e6, 2.5e7).find('e') != std::string::npos, true);
}

TEST(ReportFormatValue, NonFinite) {
  EXPECT_EQ(format_value(kNaN), "nan");
  EXPECT_EQ(format_value(kInf), "inf");
  EXPECT_EQ(format_value(-kInf), "-inf");
  EXPECT_EQ(format_value(0.125), "0.125");
}

TEST(ReportHtmlEscape, SpecialAndControlCharacters) {
  EXPECT_EQ(html_escape("<a href=\"x\">&'</a>"), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;&lt;/a&gt;");
  EXPECT_EQ(html_escape(std::string("a\x01"
                                    "b\tc\n",
                                    6)),
            "a\xEF\xBF\xBD"
            "b\tc\n");
  EXPECT_EQ(html_escape(std::string("\0", 1)), "\xEF\xBF\xBD");
  EXPECT_EQ(html_escape("héllo → ∑"), "héllo → ∑");  // UTF-8 passes through
}

TEST(ReportUtf8Prefix, NeverSplitsACharacter) {
  const std::string s =
      "ab\xE2\x86\x92"
      "cd";  // "ab→cd", → is 3 bytes
  EXPECT_EQ(utf8_prefix(s, 2), "ab");
  EXPECT_EQ(utf8_prefix(s, 3), "ab");
  EXPECT_EQ(utf8_prefix(s, 4), "ab");
  EXPECT_EQ(utf8_prefix(s, 5), "ab\xE2\x86\x92");
  EXPECT_EQ(utf8_prefix(s, 100), s);
}

TEST(ReportRenderChart, NoDataPanel) {
  Chart c;
  c.id = "kl";
  c.title = "KL";
  c.no_data_hint = "not in metrics.jsonl: train/kl, eval/<set>/pass@1";
  c.lines.push_back(series("empty", {}));
  c.lines.push_back(series("all nan", {{1, kNaN}, {2, kInf}}));
  const RenderedChart r = render_chart(c);
  EXPECT_FALSE(r.has_data);
  EXPECT_EQ(r.series_drawn, 0);
  EXPECT_NE(r.svg.find("class=\"chart nodata\""), std::string::npos);
  EXPECT_NE(r.svg.find("data-chart=\"kl\""), std::string::npos);
  EXPECT_NE(r.svg.find("data-series=\"0\""), std::string::npos);
  EXPECT_NE(r.svg.find(">no data<"), std::string::npos);
  EXPECT_NE(r.svg.find("eval/&lt;set&gt;/pass@1"), std::string::npos);
  EXPECT_EQ(r.svg.find("<set>"), std::string::npos);
  expect_balanced(r.svg);
}

TEST(ReportRenderChart, LinesSkipNonFinitePoints) {
  Chart c;
  c.id = "g";
  c.title = "grad norm";
  c.lines.push_back(series("g", {{0, 1.0}, {1, kNaN}, {2, 3.0}, {3, kInf}, {4, 2.0}, {kNaN, 5.0}}));
  const RenderedChart r = render_chart(c);
  ASSERT_TRUE(r.has_data);
  EXPECT_EQ(r.series_drawn, 1);
  EXPECT_NE(r.svg.find("class=\"chart\""), std::string::npos);
  EXPECT_NE(r.svg.find("data-points=\"3\""), std::string::npos);
  EXPECT_EQ(count(r.svg, "class=\"marker\""), 3);
  expect_balanced(r.svg);
  expect_inside_viewbox(r.svg);
}

TEST(ReportRenderChart, SinglePointHasAMarkerAndRanges) {
  Chart c;
  c.id = "one";
  c.title = "one step";
  c.lines.push_back(series("reward", {{5, 0.25}}));
  const RenderedChart r = render_chart(c);
  ASSERT_TRUE(r.has_data);
  EXPECT_EQ(count(r.svg, "class=\"marker\""), 1);
  EXPECT_NE(r.svg.find("reward | step 5: 0.25"), std::string::npos);  // the point's tooltip
  expect_balanced(r.svg);
  expect_inside_viewbox(r.svg);
}

TEST(ReportRenderChart, ConstantSeriesGetsANonZeroRange) {
  Chart c;
  c.id = "const";
  c.title = "constant";
  c.lines.push_back(series("lr", {{0, 1e-6}, {1, 1e-6}, {2, 1e-6}}));
  const RenderedChart r = render_chart(c);
  ASSERT_TRUE(r.has_data);
  expect_inside_viewbox(r.svg);
  const auto labels = y_tick_labels(r.svg);
  ASSERT_GE(labels.size(), 2u);
  for (size_t i = 1; i < labels.size(); ++i) EXPECT_NE(labels[i], labels[i - 1]);
}

TEST(ReportRenderChart, BandStackAndLegendAreDrawnAndEscaped) {
  Chart c;
  c.id = "mix";
  c.title = "a <b> & c";
  Band b;
  b.name = "mean ± std";
  b.x = {0, 1, 2};
  b.lo = {0.1, kNaN, 0.3};
  b.hi = {0.5, 0.6, 0.7};
  c.bands.push_back(b);
  c.stacked.push_back(series("rollout", {{0, 1}, {1, 2}, {2, 1}}));
  c.stacked.push_back(series("train", {{0, 2}, {2, 2}}));  // step 1 missing: counts as 0
  c.stacked.push_back(series("absent", {}));
  c.lines.push_back(series("x<y>", {{0, 0.2}, {1, 0.3}, {2, 0.4}}));
  const RenderedChart r = render_chart(c);
  ASSERT_TRUE(r.has_data);
  EXPECT_EQ(r.series_drawn, 4);  // band + 2 layers + line; the empty layer is not drawn
  EXPECT_NE(r.svg.find("data-series=\"4\""), std::string::npos);
  EXPECT_EQ(count(r.svg, "class=\"series area\""), 2);
  EXPECT_EQ(count(r.svg, "class=\"series band\""), 1);
  EXPECT_EQ(count(r.svg, "class=\"series line\""), 1);
  EXPECT_NE(r.svg.find("a &lt;b&gt; &amp; c"), std::string::npos);
  EXPECT_NE(r.svg.find("x&lt;y&gt;"), std::string::npos);
  EXPECT_EQ(r.svg.find("x<y>"), std::string::npos);
  EXPECT_EQ(r.svg.find("absent"), std::string::npos);
  expect_balanced(r.svg);
  expect_inside_viewbox(r.svg);
  // The stacked top reaches rollout + train = 3 at steps 0 and 2: the y axis covers it.
  const auto labels = y_tick_labels(r.svg);
  ASSERT_FALSE(labels.empty());
  EXPECT_GE(std::stod(labels.back()), 3.0);
}

TEST(ReportRenderChart, StackWithOneStepIsABar) {
  Chart c;
  c.id = "t";
  c.title = "time";
  c.stacked.push_back(series("rollout", {{3, 1.5}}));
  c.stacked.push_back(series("train", {{3, 0.5}}));
  const RenderedChart r = render_chart(c);
  ASSERT_TRUE(r.has_data);
  EXPECT_EQ(count(r.svg, "class=\"series area\""), 2);
  expect_inside_viewbox(r.svg);
}

TEST(ReportRenderChart, HugeValuesStayFinite) {
  Chart c;
  c.id = "huge";
  c.title = "huge";
  c.lines.push_back(series("h", {{0, -1.7e308}, {1, 1.7e308}, {2, 0}}));
  Band b;
  b.name = "b";
  b.x = {0, 1};
  b.lo = {-1e308, 0};
  b.hi = {1e308, 1e308};
  c.bands.push_back(b);
  const RenderedChart r = render_chart(c);
  ASSERT_TRUE(r.has_data);
  expect_balanced(r.svg);
  expect_inside_viewbox(r.svg);
  for (const auto& label : y_tick_labels(r.svg)) EXPECT_EQ(label.find("inf"), std::string::npos) << label;
}

TEST(ReportRenderChart, LongSeriesIsDecimatedButKeepsSpikes) {
  Chart c;
  c.id = "long";
  c.title = "long";
  std::vector<Point> pts;
  for (int i = 0; i < 50000; ++i) pts.push_back({double(i), std::sin(i * 0.001)});
  pts[31234].y = 40.0;  // one spike
  c.lines.push_back(series("s", pts));
  const RenderedChart r = render_chart(c);
  ASSERT_TRUE(r.has_data);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.svg, m, std::regex(R"(data-points="(\d+)\")")));
  EXPECT_LE(std::stoi(m[1].str()), 2000);
  EXPECT_GE(std::stoi(m[1].str()), 500);
  EXPECT_EQ(count(r.svg, "class=\"marker\""), 0);  // too many points for per-point tooltips
  EXPECT_LT(r.svg.size(), 60u * 1000);
  // The spike sets the y range, so it survived decimation.
  const auto labels = y_tick_labels(r.svg);
  ASSERT_FALSE(labels.empty());
  EXPECT_GE(std::stod(labels.back()), 40.0);
  expect_inside_viewbox(r.svg);
}

}  // namespace
}  // namespace lockstep::report
