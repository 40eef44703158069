// SVG line charts with a left and a right y axis (training curves).
#include "tg/plot.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "tg/error.hpp"

namespace tg::plot {

namespace {
const char* const kPalette[] = {"#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2"};

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else if (c == '"') o += "&quot;";
    else o += c;
  }
  return o;
}

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", v);
  return b;
}

std::string tick_label(double v, double step) {
  char b[32];
  int digits = step >= 1 ? 0 : int(std::ceil(-std::log10(step) - 1e-9));
  std::snprintf(b, sizeof b, "%.*f", std::min(digits, 6), v);
  return b;
}

struct Range {
  double lo = 0, hi = 0;
  bool any = false;
  std::vector<double> ticks;
};
}  // namespace

std::vector<double> nice_ticks(double lo, double hi, int n) {
  if (!(hi > lo)) hi = lo + 1;
  double raw = (hi - lo) / std::max(n, 1), mag = std::pow(10.0, std::floor(std::log10(raw))), step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw - 1e-12 * raw) {
      step = m * mag;
      break;
    }
  std::vector<double> t;
  for (double v = std::floor(lo / step + 1e-9) * step; v < hi + step * (1 - 1e-9); v += step) t.push_back(std::abs(v) < step * 1e-9 ? 0 : v);
  if (t.size() < 2) t.push_back(t.back() + step);
  return t;
}

std::string svg(const Chart& c) {
  Range ax[2];
  for (const Series& s : c.series)
    for (auto [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y))
        throw Error("[plot] series '" + s.name + "' has a point that is not finite (" + num(x) + ", " + num(y) + ")");
      Range& r = ax[s.right];
      r.lo = r.any ? std::min(r.lo, y) : y;
      r.hi = r.any ? std::max(r.hi, y) : y;
      r.any = true;
    }
  if (!ax[0].any && !ax[1].any) throw Error("[plot] chart '" + c.title + "' has no points");
  double x0 = 0, x1 = 0;
  bool xany = false;
  for (const Series& s : c.series)
    for (auto [x, y] : s.points) x0 = xany ? std::min(x0, x) : x, x1 = xany ? std::max(x1, x) : x, xany = true;
  std::vector<double> xt = nice_ticks(x0, x1, 7);
  for (Range& r : ax)
    if (r.any) r.ticks = nice_ticks(std::min(r.lo, 0.0), r.hi, 5);
  const double L = 64, R = c.width - (ax[1].any ? 64.0 : 20.0), T = 58, B = c.height - 48.0;  // the legend above T
  auto px = [&](double x) { return L + (x - xt.front()) / (xt.back() - xt.front()) * (R - L); };
  auto py = [&](const Range& r, double y) { return B - (y - r.ticks.front()) / (r.ticks.back() - r.ticks.front()) * (B - T); };

  std::string o = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(c.width) + "\" height=\"" +
                  std::to_string(c.height) + "\" viewBox=\"0 0 " + std::to_string(c.width) + " " + std::to_string(c.height) +
                  "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  o += "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  o += "<text x=\"" + num((L + R) / 2) + "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\">" + esc(c.title) + "</text>\n";
  for (double v : xt) {
    o += "<line x1=\"" + num(px(v)) + "\" x2=\"" + num(px(v)) + "\" y1=\"" + num(T) + "\" y2=\"" + num(B) + "\" stroke=\"#e5e7eb\"/>\n";
    o += "<text x=\"" + num(px(v)) + "\" y=\"" + num(B + 16) + "\" text-anchor=\"middle\">" + tick_label(v, xt[1] - xt[0]) + "</text>\n";
  }
  for (int side = 0; side < 2; side++) {
    const Range& r = ax[side];
    if (!r.any) continue;
    double xa = side ? R : L;
    for (double v : r.ticks) {
      if (side == 0 || !ax[0].any)
        o += "<line x1=\"" + num(L) + "\" x2=\"" + num(R) + "\" y1=\"" + num(py(r, v)) + "\" y2=\"" + num(py(r, v)) + "\" stroke=\"#e5e7eb\"/>\n";
      o += "<text x=\"" + num(side ? xa + 6 : xa - 6) + "\" y=\"" + num(py(r, v) + 4) + "\" text-anchor=\"" + (side ? "start" : "end") +
           "\">" + tick_label(v, r.ticks[1] - r.ticks[0]) + "</text>\n";
    }
    const std::string& label = side ? c.right_label : c.left_label;
    double lx = side ? c.width - 14.0 : 16.0, ly = (T + B) / 2;
    o += "<text transform=\"translate(" + num(lx) + "," + num(ly) + ") rotate(" + (side ? "90" : "-90") +
         ")\" text-anchor=\"middle\">" + esc(label) + "</text>\n";
  }
  o += "<rect x=\"" + num(L) + "\" y=\"" + num(T) + "\" width=\"" + num(R - L) + "\" height=\"" + num(B - T) +
       "\" fill=\"none\" stroke=\"#6b7280\"/>\n";
  o += "<text x=\"" + num((L + R) / 2) + "\" y=\"" + num(B + 36) + "\" text-anchor=\"middle\">" + esc(c.x_label) + "</text>\n";
  size_t k = 0;
  double legend_x = L;
  for (const Series& s : c.series) {
    std::string color = s.color.empty() ? kPalette[k++ % std::size(kPalette)] : s.color;
    if (s.points.empty()) continue;
    std::string pts;
    for (auto [x, y] : s.points) pts += (pts.empty() ? "" : " ") + num(px(x)) + "," + num(py(ax[s.right], y));
    o += "<polyline class=\"series\" data-name=\"" + esc(s.name) + "\" fill=\"none\" stroke=\"" + color +
         "\" stroke-width=\"2\" points=\"" + pts + "\"/>\n";
    if (s.points.size() <= 40)
      for (auto [x, y] : s.points)
        o += "<circle cx=\"" + num(px(x)) + "\" cy=\"" + num(py(ax[s.right], y)) + "\" r=\"3\" fill=\"" + color + "\"/>\n";
    std::string label = esc(s.name) + (s.right ? " (right axis)" : "");
    o += "<line x1=\"" + num(legend_x) + "\" x2=\"" + num(legend_x + 20) + "\" y1=\"" + num(T - 14) + "\" y2=\"" + num(T - 14) +
         "\" stroke=\"" + color + "\" stroke-width=\"2\"/>\n";
    o += "<text x=\"" + num(legend_x + 26) + "\" y=\"" + num(T - 10) + "\">" + label + "</text>\n";
    legend_x += 40 + 7.0 * double(s.name.size() + (s.right ? 13 : 0));
  }
  o += "</svg>\n";
  return o;
}

void write_svg(const std::string& path, const Chart& c) {
  std::string s = svg(c);
  std::ofstream f(path, std::ios::binary);
  if (!f || !f.write(s.data(), std::streamsize(s.size())))
    throw Error("[plot] cannot write " + path + ": expected a writable file path (e.g. --plot curves.svg)");
}

}  // namespace tg::plot
