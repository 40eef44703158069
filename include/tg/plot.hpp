#pragma once
// Line charts as SVG files (training curves: loss and accuracy over steps), for the examples' --plot flags.
// Two y axes: series on the left axis and series on the right axis are scaled separately.
// Thread-safety: plain functions of their arguments.
#include <string>
#include <utility>
#include <vector>

namespace tg::plot {

/** One line: (x, y) points in order; `right` puts it on the right-hand axis. */
struct Series {
  /// the legend's label
  std::string name;
  /// the (x, y) points, drawn joined in this order
  std::vector<std::pair<double, double>> points;
  /// plot against the right-hand y axis (its own scale)
  bool right = false;
  std::string color = "";  ///< empty: the next colour of the palette
};

/** A chart: a title, axis labels and its lines. */
struct Chart {
  /// the chart's title and the labels of the x, left y and right y axes ("" for none)
  ///@{
  std::string title, x_label, left_label, right_label;
  ///@}
  /// the lines, drawn in order
  std::vector<Series> series;
  /// size of the SVG in pixels
  ///@{
  int width = 720, height = 400;
  ///@}
};

/** Tick values for [lo, hi]: about `n` steps of 1, 2 or 5 times a power of ten, covering the range. */
std::vector<double> nice_ticks(double lo, double hi, int n = 5);
/** The chart as an SVG document. Throws tg::Error when it has no points or a point is not finite. */
std::string svg(const Chart& c);
/** svg(c) written to `path`; throws tg::Error naming the file when it cannot be written. */
void write_svg(const std::string& path, const Chart& c);

}  // namespace tg::plot
