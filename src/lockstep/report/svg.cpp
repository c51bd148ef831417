// SVG chart writer (see svg.h). Coordinates are written with one decimal:
// the viewBox is 560 units wide, so that is finer than any screen pixel.
#include "lockstep/report/svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>

namespace lockstep::report {
namespace {

// Layout of one chart, in viewBox units.
constexpr double kWidth = 560;
constexpr double kLeft = 66;  // room for y tick labels and the y axis label
constexpr double kRight = 18;
constexpr double kTop = 36;  // room for the title
constexpr double kPlotH = 200;
constexpr double kLegendRow = 16;
constexpr double kCharW = 6.2;  // average glyph width of 11px sans-serif, for legend layout

// A line with more points than this is reduced to the min and max of
// kMaxLinePoints/2 buckets: the shape (spikes included) survives and a
// 100k-step run still gives a page of a few MB at most.
constexpr size_t kMaxLinePoints = 2000;
// Per-point circles with a tooltip only when a series is this short.
constexpr size_t kMaxMarkers = 150;

// Tableau 10: distinguishable, and readable on white.
const char* const kPalette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
constexpr int kPaletteSize = 10;

bool finite(double v) {
  return std::isfinite(v);
}

// Values are drawn clamped to +-1e300 so that a range (hi - lo) never
// overflows to inf; nothing a run logs is legitimately near that.
constexpr double kMaxAbs = 1e300;
double clamp_value(double v) {
  return std::clamp(v, -kMaxAbs, kMaxAbs);
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  // "-0.0" and "0.0" read the same; keep the output stable.
  if (std::string(buf) == "-0.0") return "0.0";
  return buf;
}

std::vector<Point> finite_sorted(const std::vector<Point>& in) {
  std::vector<Point> out;
  out.reserve(in.size());
  for (const auto& p : in)
    if (finite(p.x) && finite(p.y)) out.push_back(p);
  std::stable_sort(out.begin(), out.end(), [](const Point& a, const Point& b) { return a.x < b.x; });
  return out;
}

std::vector<Point> decimate(const std::vector<Point>& pts) {
  if (pts.size() <= kMaxLinePoints) return pts;
  const size_t buckets = kMaxLinePoints / 2;
  std::vector<Point> out;
  out.reserve(kMaxLinePoints);
  for (size_t b = 0; b < buckets; ++b) {
    const size_t begin = b * pts.size() / buckets, end = (b + 1) * pts.size() / buckets;
    if (begin >= end) continue;
    size_t lo = begin, hi = begin;
    for (size_t i = begin; i < end; ++i) {
      if (pts[i].y < pts[lo].y) lo = i;
      if (pts[i].y > pts[hi].y) hi = i;
    }
    out.push_back(pts[std::min(lo, hi)]);
    if (lo != hi) out.push_back(pts[std::max(lo, hi)]);
  }
  return out;
}

struct Range {
  double lo = std::numeric_limits<double>::infinity();
  double hi = -std::numeric_limits<double>::infinity();
  void add(double v) {
    if (!finite(v)) return;
    v = clamp_value(v);
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  bool empty() const { return lo > hi; }
};

struct LegendEntry {
  std::string name;
  std::string color;
  enum Kind { kLine, kDashed, kArea, kBand } kind;
};

// Stacked layers evaluated on the union of their x values.
struct Stack {
  std::vector<double> x;                 // (X)
  std::vector<std::vector<double>> cum;  // (layers, X) running sums, bottom first
  std::vector<size_t> layer_of;          // index into Chart::stacked of each drawn layer
};

Stack build_stack(const std::vector<Series>& stacked) {
  Stack s;
  std::vector<std::map<double, double>> values;
  std::map<double, int> xs;
  for (size_t i = 0; i < stacked.size(); ++i) {
    std::map<double, double> v;
    for (const auto& p : stacked[i].points)
      if (finite(p.x) && finite(p.y)) v[p.x] = p.y;
    if (v.empty()) continue;
    for (const auto& [x, y] : v) xs[x] = 0;
    values.push_back(std::move(v));
    s.layer_of.push_back(i);
  }
  std::vector<double> all_x;
  for (const auto& [x, unused] : xs) all_x.push_back(x);
  // Too many x values: average over index buckets, which keeps each layer's
  // mean (the time each phase takes) rather than sampling a few steps.
  const size_t buckets = all_x.size() > kMaxLinePoints ? kMaxLinePoints / 2 : all_x.size();
  s.x.resize(buckets);
  s.cum.assign(values.size(), std::vector<double>(buckets, 0.0));
  for (size_t b = 0; b < buckets; ++b) {
    const size_t begin = b * all_x.size() / buckets, end = (b + 1) * all_x.size() / buckets;
    double sx = 0;
    for (size_t i = begin; i < end; ++i) sx += all_x[i];
    s.x[b] = sx / double(end - begin);
    double below = 0;
    for (size_t l = 0; l < values.size(); ++l) {
      double sy = 0;
      for (size_t i = begin; i < end; ++i) {
        auto it = values[l].find(all_x[i]);
        if (it != values[l].end()) sy += it->second;
      }
      below += sy / double(end - begin);
      s.cum[l][b] = below;
    }
  }
  return s;
}

std::vector<std::string> wrap_words(const std::string& text, size_t width) {
  std::vector<std::string> lines;
  std::string line, word;
  auto flush_word = [&] {
    if (word.empty()) return;
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      lines.push_back(line);
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
    word.clear();
  };
  for (char c : text) {
    if (c == ' ' || c == '\n') {
      flush_word();
      if (c == '\n' && !line.empty()) {
        lines.push_back(line);
        line.clear();
      }
    } else {
      word += c;
    }
  }
  flush_word();
  if (!line.empty()) lines.push_back(line);
  return lines;
}

std::string svg_open(const Chart& c, double height, const char* cls, int series) {
  std::string s =
      "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"" + std::string(cls) + "\" data-chart=\"" +
      html_escape(c.id) + "\" data-series=\"" + std::to_string(series) + "\" viewBox=\"0 0 " + num(kWidth) +
      " " + num(height) +
      "\" role=\"img\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"11\">";
  s += "<title>" + html_escape(c.title) + "</title>";
  s += "<rect class=\"bg\" x=\"0\" y=\"0\" width=\"" + num(kWidth) + "\" height=\"" + num(height) +
       "\" fill=\"#ffffff\"/>";
  s += "<text class=\"title\" x=\"" + num(kWidth / 2) +
       "\" y=\"20\" text-anchor=\"middle\" font-size=\"14\" font-weight=\"bold\" fill=\"#222\">" +
       html_escape(c.title) + "</text>";
  return s;
}

RenderedChart render_no_data(const Chart& c) {
  const auto hint = wrap_words(c.no_data_hint, 80);
  const double box_h = 120;
  const double height = kTop + box_h + 14;
  std::string s = svg_open(c, height, "chart nodata", 0);
  s += "<rect x=\"" + num(kLeft) + "\" y=\"" + num(kTop) + "\" width=\"" + num(kWidth - kLeft - kRight) +
       "\" height=\"" + num(box_h) + "\" fill=\"#f6f6f6\" stroke=\"#bbb\" stroke-dasharray=\"4 3\"/>";
  const double cx = (kLeft + kWidth - kRight) / 2;
  s += "<text class=\"nodata-label\" x=\"" + num(cx) + "\" y=\"" + num(kTop + 42) +
       "\" text-anchor=\"middle\" font-size=\"18\" fill=\"#888\">no data</text>";
  double y = kTop + 64;
  for (const auto& line : hint) {
    if (y > kTop + box_h - 6) break;
    s += "<text x=\"" + num(cx) + "\" y=\"" + num(y) +
         "\" text-anchor=\"middle\" font-size=\"10\" fill=\"#888\">" + html_escape(line) + "</text>";
    y += 13;
  }
  s += "</svg>";
  return {s, 0, false};
}

}  // namespace

Ticks nice_ticks(double lo, double hi, int target, bool integer) {
  Ticks t;
  if (!finite(lo) || !finite(hi)) lo = 0, hi = 1;
  if (hi < lo) std::swap(lo, hi);
  if (hi == lo) {
    // A constant series still needs a y range, a single step an x range. A
    // y of exactly 0 (e.g. the logprob gap in aligned mode) gets [0, 1]: the
    // metrics that sit at 0 are never negative.
    if (!integer && lo == 0) {
      hi = 1;
    } else {
      const double pad = integer ? 1.0 : std::abs(lo) * 0.1;
      lo -= pad;
      hi += pad;
    }
  }
  const double raw = (hi - lo) / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  double step = (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
  if (integer) step = std::max(step, 1.0);
  if (!finite(step) || step <= 0) step = 1;
  t.step = step;
  t.lo = std::floor(lo / step) * step;
  t.hi = std::ceil(hi / step) * step;
  if (t.hi <= t.lo) t.hi = t.lo + step;
  // Ticks by index, not by repeated addition, so they do not drift.
  const long n = std::lround((t.hi - t.lo) / step);
  for (long i = 0; i <= n && i <= 1000; ++i) {
    double v = t.lo + double(i) * step;
    if (std::abs(v) < step * 1e-9) v = 0;  // no "-0" or "1e-17" labels
    t.values.push_back(v);
  }
  return t;
}

std::string format_tick(double v, double step, double abs_max) {
  char buf[48];
  if (v == 0) return "0";
  if (abs_max >= 1e-3 && abs_max < 1e6) {
    const int decimals = std::clamp(int(-std::floor(std::log10(step) + 1e-9)), 0, 9);
    std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  } else {
    // Enough significant digits that neighbouring ticks differ.
    const int digits = std::clamp(int(std::ceil(std::log10(abs_max / step) - 1e-9)) + 1, 2, 12);
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  }
  return buf;
}

std::string format_value(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size() + s.size() / 8);
  for (char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default:
        if ((c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7f)
          out += "\xEF\xBF\xBD";  // U+FFFD: HTML does not allow raw control characters
        else
          out += ch;
    }
  }
  return out;
}

std::string utf8_prefix(std::string_view s, size_t max_bytes) {
  if (s.size() <= max_bytes) return std::string(s);
  size_t n = max_bytes;
  // Back off over continuation bytes (10xxxxxx) to the start of a character.
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return std::string(s.substr(0, n));
}

namespace {

// A band's finite points in x order.
struct BandPts {
  std::vector<double> x, lo, hi;
};

// Everything of a chart that can be drawn, and the data ranges it spans.
struct Drawable {
  std::vector<std::vector<Point>> lines;  // (lines) finite points in x order, decimated
  std::vector<BandPts> bands;             // (bands)
  Stack stack;
  Range xr, yr;
  int drawn = 0;  // lines + bands + layers with at least one finite point
};

BandPts finite_band(const Band& b) {
  std::vector<std::pair<double, std::pair<double, double>>> v;
  const size_t n = std::min({b.x.size(), b.lo.size(), b.hi.size()});
  for (size_t i = 0; i < n; ++i)
    if (finite(b.x[i]) && finite(b.lo[i]) && finite(b.hi[i])) v.push_back({b.x[i], {b.lo[i], b.hi[i]}});
  std::stable_sort(v.begin(), v.end(), [](const auto& a, const auto& bb) { return a.first < bb.first; });
  BandPts bp;
  for (const auto& [x, r] : v) {
    bp.x.push_back(x);
    bp.lo.push_back(r.first);
    bp.hi.push_back(r.second);
  }
  return bp;
}

Drawable collect_drawable(const Chart& c) {
  Drawable d;
  for (const auto& l : c.lines) d.lines.push_back(decimate(finite_sorted(l.points)));
  for (const auto& b : c.bands) d.bands.push_back(finite_band(b));
  d.stack = build_stack(c.stacked);
  for (const auto& l : d.lines) {
    for (const auto& p : l) d.xr.add(p.x), d.yr.add(p.y);
    d.drawn += !l.empty();
  }
  for (const auto& b : d.bands) {
    for (size_t i = 0; i < b.x.size(); ++i) d.xr.add(b.x[i]), d.yr.add(b.lo[i]), d.yr.add(b.hi[i]);
    d.drawn += !b.x.empty();
  }
  if (!d.stack.cum.empty()) {
    for (double x : d.stack.x) d.xr.add(x);
    d.yr.add(0);
    for (const auto& layer : d.stack.cum)
      for (double v : layer) d.yr.add(v);
    d.drawn += int(d.stack.cum.size());
  }
  return d;
}

// Colours of every drawn series, in palette order: stacked layers, then
// lines; the legend lists layers, bands, then lines.
struct Styles {
  std::vector<LegendEntry> legend;
  std::vector<std::string> layer_color;  // (stack layers)
  std::vector<std::string> line_color;   // (lines); empty for an empty line
  std::vector<std::string> band_color;   // (bands); empty for an empty band
};

Styles assign_styles(const Chart& c, const Drawable& d) {
  Styles st;
  int next_color = 0;
  auto pick = [&](const std::string& explicit_color) {
    if (!explicit_color.empty()) return explicit_color;
    return std::string(kPalette[next_color++ % kPaletteSize]);
  };
  for (size_t l : d.stack.layer_of) {
    st.layer_color.push_back(pick(c.stacked[l].color));
    st.legend.push_back({c.stacked[l].name, st.layer_color.back(), LegendEntry::kArea});
  }
  st.line_color.resize(d.lines.size());
  for (size_t i = 0; i < d.lines.size(); ++i)
    if (!d.lines[i].empty()) st.line_color[i] = pick(c.lines[i].color);
  st.band_color.resize(d.bands.size());
  for (size_t i = 0; i < d.bands.size(); ++i) {
    if (d.bands[i].x.empty()) continue;
    st.band_color[i] = c.bands[i].color.empty() ? kPalette[0] : c.bands[i].color;
    st.legend.push_back({c.bands[i].name, st.band_color[i], LegendEntry::kBand});
  }
  for (size_t i = 0; i < d.lines.size(); ++i)
    if (!d.lines[i].empty())
      st.legend.push_back(
          {c.lines[i].name, st.line_color[i], c.lines[i].dashed ? LegendEntry::kDashed : LegendEntry::kLine});
  return st;
}

struct Placed {
  double x, y;
};

// Legend entries flow left to right below the plot, wrapping at the width.
std::vector<Placed> place_legend(const std::vector<LegendEntry>& legend, double legend_top) {
  std::vector<Placed> pos;
  double x = kLeft, y = legend_top;
  for (const auto& e : legend) {
    const double w = 26 + kCharW * double(e.name.size()) + 14;
    if (x > kLeft && x + w > kWidth - kRight) {
      x = kLeft;
      y += kLegendRow;
    }
    pos.push_back({x, y});
    x += w;
  }
  return pos;
}

// Data to pixel coordinates.
struct Frame {
  Ticks xt, yt;
  double plot_bottom = kTop + kPlotH;
  double plot_w = kWidth - kLeft - kRight;
  double sx(double x) const { return kLeft + (clamp_value(x) - xt.lo) / (xt.hi - xt.lo) * plot_w; }
  double sy(double y) const { return plot_bottom - (clamp_value(y) - yt.lo) / (yt.hi - yt.lo) * kPlotH; }
};

void draw_axes(std::string& s, const Chart& c, const Frame& f) {
  s += "<g class=\"grid\" stroke=\"#e6e6e6\" stroke-width=\"1\">";
  for (double v : f.yt.values)
    s += "<line x1=\"" + num(kLeft) + "\" x2=\"" + num(kWidth - kRight) + "\" y1=\"" + num(f.sy(v)) +
         "\" y2=\"" + num(f.sy(v)) + "\"/>";
  for (double v : f.xt.values)
    s += "<line x1=\"" + num(f.sx(v)) + "\" x2=\"" + num(f.sx(v)) + "\" y1=\"" + num(kTop) + "\" y2=\"" +
         num(f.plot_bottom) + "\"/>";
  s += "</g>";
  s += "<g class=\"axis\" fill=\"#444\">";
  const double y_abs = std::max(std::abs(f.yt.lo), std::abs(f.yt.hi));
  const double x_abs = std::max(std::abs(f.xt.lo), std::abs(f.xt.hi));
  for (double v : f.yt.values)
    s += "<text x=\"" + num(kLeft - 6) + "\" y=\"" + num(f.sy(v) + 4) + "\" text-anchor=\"end\">" +
         html_escape(format_tick(v, f.yt.step, y_abs)) + "</text>";
  for (double v : f.xt.values)
    s += "<text x=\"" + num(f.sx(v)) + "\" y=\"" + num(f.plot_bottom + 16) + "\" text-anchor=\"middle\">" +
         html_escape(format_tick(v, f.xt.step, x_abs)) + "</text>";
  s += "<text x=\"" + num(kLeft + f.plot_w / 2) + "\" y=\"" + num(f.plot_bottom + 33) +
       "\" text-anchor=\"middle\" fill=\"#222\">" + html_escape(c.x_label) + "</text>";
  const double ymid = kTop + kPlotH / 2;
  s += "<text x=\"14\" y=\"" + num(ymid) + "\" transform=\"rotate(-90 14 " + num(ymid) +
       ")\" text-anchor=\"middle\" fill=\"#222\">" + html_escape(c.y_label) + "</text>";
  s += "</g>";
  s += "<rect x=\"" + num(kLeft) + "\" y=\"" + num(kTop) + "\" width=\"" + num(f.plot_w) + "\" height=\"" +
       num(kPlotH) + "\" fill=\"none\" stroke=\"#999\"/>";
}

// Stacked areas (a lone x is drawn as a narrow bar, else it has no width).
void draw_stack(std::string& s, const Chart& c, const Drawable& d, const Styles& st, const Frame& f) {
  const Stack& stack = d.stack;
  for (size_t l = 0; l < stack.cum.size(); ++l) {
    std::vector<double> px;
    std::vector<size_t> idx;
    for (size_t i = 0; i < stack.x.size(); ++i) px.push_back(f.sx(stack.x[i])), idx.push_back(i);
    if (px.size() == 1) {
      px = {px[0] - 5, px[0] + 5};
      idx = {0, 0};
    }
    std::string path;
    for (size_t i = 0; i < px.size(); ++i)
      path += (i ? "L" : "M") + num(px[i]) + "," + num(f.sy(stack.cum[l][idx[i]]));
    for (size_t i = px.size(); i-- > 0;)
      path += "L" + num(px[i]) + "," + num(f.sy(l == 0 ? 0.0 : stack.cum[l - 1][idx[i]]));
    path += "Z";
    const auto& layer = c.stacked[stack.layer_of[l]];
    s += "<path class=\"series area\" d=\"" + path + "\" fill=\"" + st.layer_color[l] +
         "\" fill-opacity=\"0.75\" stroke=\"" + st.layer_color[l] + "\" stroke-width=\"0.5\"><title>" +
         html_escape(layer.name) + "</title></path>";
  }
}

void draw_bands(std::string& s, const Chart& c, const Drawable& d, const Styles& st, const Frame& f) {
  for (size_t b = 0; b < d.bands.size(); ++b) {
    const auto& bp = d.bands[b];
    if (bp.x.empty()) continue;
    std::string path;
    if (bp.x.size() == 1) {
      // One step: a short vertical bar from lo to hi.
      path = "M" + num(f.sx(bp.x[0]) - 4) + "," + num(f.sy(bp.hi[0])) + "L" + num(f.sx(bp.x[0]) + 4) + "," +
             num(f.sy(bp.hi[0])) + "L" + num(f.sx(bp.x[0]) + 4) + "," + num(f.sy(bp.lo[0])) + "L" +
             num(f.sx(bp.x[0]) - 4) + "," + num(f.sy(bp.lo[0])) + "Z";
    } else {
      for (size_t i = 0; i < bp.x.size(); ++i)
        path += (i ? "L" : "M") + num(f.sx(bp.x[i])) + "," + num(f.sy(bp.hi[i]));
      for (size_t i = bp.x.size(); i-- > 0;) path += "L" + num(f.sx(bp.x[i])) + "," + num(f.sy(bp.lo[i]));
      path += "Z";
    }
    s += "<path class=\"series band\" d=\"" + path + "\" fill=\"" + st.band_color[b] +
         "\" fill-opacity=\"0.2\" stroke=\"none\"><title>" + html_escape(c.bands[b].name) + "</title></path>";
  }
}

// Lines, with a tooltip per point when the series is short.
void draw_lines(std::string& s, const Chart& c, const Drawable& d, const Styles& st, const Frame& f) {
  for (size_t i = 0; i < d.lines.size(); ++i) {
    const auto& pts = d.lines[i];
    if (pts.empty()) continue;
    const auto& line = c.lines[i];
    const std::string name = html_escape(line.name);
    std::string path;
    for (size_t k = 0; k < pts.size(); ++k)
      path += (k ? "L" : "M") + num(f.sx(pts[k].x)) + "," + num(f.sy(pts[k].y));
    s += "<g class=\"series line\" data-name=\"" + name + "\" data-points=\"" + std::to_string(pts.size()) +
         "\">";
    s += "<path d=\"" + path + "\" fill=\"none\" stroke=\"" + st.line_color[i] + "\" stroke-width=\"1.8\"" +
         (line.dashed ? " stroke-dasharray=\"5 3\"" : "") + " stroke-linejoin=\"round\"><title>" + name +
         " (last: " + html_escape(format_value(pts.back().y)) + ")</title></path>";
    if (pts.size() <= kMaxMarkers) {
      const std::string r = pts.size() == 1 ? "3.5" : "2.4";
      for (const auto& p : pts)
        s += "<circle class=\"marker\" cx=\"" + num(f.sx(p.x)) + "\" cy=\"" + num(f.sy(p.y)) + "\" r=\"" + r +
             "\" fill=\"" + st.line_color[i] + "\"><title>" + name + " | " + html_escape(c.x_label) + " " +
             html_escape(format_value(p.x)) + ": " + html_escape(format_value(p.y)) + "</title></circle>";
    }
    s += "</g>";
  }
}

void draw_legend(std::string& s, const std::vector<LegendEntry>& legend, const std::vector<Placed>& pos) {
  s += "<g class=\"legend\">";
  for (size_t i = 0; i < legend.size(); ++i) {
    const auto& e = legend[i];
    const double x = pos[i].x, y = pos[i].y;
    if (e.kind == LegendEntry::kArea || e.kind == LegendEntry::kBand) {
      s += "<rect x=\"" + num(x) + "\" y=\"" + num(y - 8) + "\" width=\"20\" height=\"10\" fill=\"" +
           e.color + "\" fill-opacity=\"" + (e.kind == LegendEntry::kBand ? "0.3" : "0.75") + "\"/>";
    } else {
      s += "<line x1=\"" + num(x) + "\" x2=\"" + num(x + 20) + "\" y1=\"" + num(y - 3) + "\" y2=\"" +
           num(y - 3) + "\" stroke=\"" + e.color + "\" stroke-width=\"2.5\"" +
           (e.kind == LegendEntry::kDashed ? " stroke-dasharray=\"5 3\"" : "") + "/>";
    }
    s += "<text x=\"" + num(x + 26) + "\" y=\"" + num(y) + "\" fill=\"#333\">" + html_escape(e.name) +
         "</text>";
  }
  s += "</g>";
}

}  // namespace

RenderedChart render_chart(const Chart& c) {
  const Drawable d = collect_drawable(c);
  if (d.drawn == 0 || d.xr.empty() || d.yr.empty()) return render_no_data(c);
  const Styles st = assign_styles(c, d);
  Frame f;
  const std::vector<Placed> legend_pos = place_legend(st.legend, f.plot_bottom + 46);
  const double height = (legend_pos.empty() ? f.plot_bottom + 40 : legend_pos.back().y + 10);
  f.xt = nice_ticks(d.xr.lo, d.xr.hi, 6, c.integer_x);
  f.yt = nice_ticks(d.yr.lo, d.yr.hi, 5, false);

  std::string s = svg_open(c, height, "chart", d.drawn);
  s.reserve(4096);
  draw_axes(s, c, f);
  draw_stack(s, c, d, st, f);
  draw_bands(s, c, d, st, f);
  draw_lines(s, c, d, st, f);
  draw_legend(s, st.legend, legend_pos);
  s += "</svg>";
  return {s, d.drawn, true};
}

}  // namespace lockstep::report
