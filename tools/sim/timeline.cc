// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "sim/timeline.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace kvblock::sim {
namespace {

// Chart geometry, in SVG user units.
constexpr double kWidth = 800;
constexpr double kLeft = 64;  // room for the y labels.
constexpr double kRight = 16;
constexpr double kHeader = 24;  // the run's description, above the panels.
constexpr double kTitle = 28;   // above each panel.
constexpr double kPanel = 110;  // plot height of a panel.
constexpr double kBottom = 40;  // x labels under the last panel.
constexpr int kPanels = 4;

// One chart point: a bucket of consecutive steps.
struct Point {
  int64_t step = 0;        // the bucket's last step.
  double pages = 0;        // maximum in the bucket.
  double hit_rate = 0;     // cumulative, percent, at the bucket's end.
  double batch = 0;        // maximum in the bucket.
  double preemptions = 0;  // cumulative, at the bucket's end.
};

std::vector<Point> Bucket(absl::Span<const StepRecord> steps) {
  const size_t per_point =
      (steps.size() + kChartPoints - 1) / static_cast<size_t>(kChartPoints);
  std::vector<Point> points;
  points.reserve(std::min(steps.size(), static_cast<size_t>(kChartPoints)));
  int64_t hits = 0;
  int64_t prompts = 0;
  int64_t preemptions = 0;
  for (size_t begin = 0; begin < steps.size(); begin += per_point) {
    Point point;
    const size_t end = std::min(steps.size(), begin + per_point);
    for (size_t i = begin; i < end; ++i) {
      point.pages = std::max<double>(point.pages, steps[i].pages_used);
      point.batch = std::max<double>(point.batch, steps[i].batch);
      hits += steps[i].hit_tokens;
      prompts += steps[i].prompt_tokens;
      preemptions += steps[i].preemptions;
    }
    point.preemptions = static_cast<double>(preemptions);
    point.step = steps[end - 1].step;
    point.hit_rate = prompts > 0 ? 100.0 * hits / prompts : 0;
    points.push_back(point);
  }
  return points;
}

// The bytes of the well-formed UTF-8 character `text` starts with, or 0.
size_t Utf8Length(absl::string_view text) {
  const auto byte = [&](size_t i) {
    return static_cast<unsigned char>(text[i]);
  };
  const unsigned char lead = byte(0);
  if (lead < 0x80) return 1;
  // The second byte's range excludes overlong forms, surrogates and code
  // points past U+10FFFF; later ones are 0x80 to 0xbf.
  size_t length = 2;
  unsigned char low = 0x80;
  unsigned char high = 0xbf;
  if (lead >= 0xe0 && lead <= 0xef) {
    length = 3;
    if (lead == 0xe0) low = 0xa0;
    if (lead == 0xed) high = 0x9f;
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    length = 4;
    if (lead == 0xf0) low = 0x90;
    if (lead == 0xf4) high = 0x8f;
  } else if (lead < 0xc2 || lead > 0xdf) {
    return 0;
  }
  if (text.size() < length || byte(1) < low || byte(1) > high) return 0;
  for (size_t i = 2; i < length; ++i) {
    if (byte(i) < 0x80 || byte(i) > 0xbf) return 0;
  }
  // U+FFFE and U+FFFF are UTF-8 but not XML characters.
  if (lead == 0xef && byte(1) == 0xbf && byte(2) >= 0xbe) return 0;
  return length;
}

// `text` with XML's special characters escaped, and what XML cannot hold
// (a byte that is not UTF-8, a control character) written as U+FFFD: a
// title holds a trace's path, which is bytes.
std::string EscapeXml(absl::string_view text) {
  std::string out;
  while (!text.empty()) {
    const size_t length = Utf8Length(text);
    const char c = text[0];
    if (length == 0 || (length == 1 && static_cast<unsigned char>(c) < 0x20 &&
                        c != '\t' && c != '\n' && c != '\r')) {
      out += "\xef\xbf\xbd";
      text.remove_prefix(1);
      continue;
    }
    if (length > 1) {
      out.append(text.data(), length);
      text.remove_prefix(length);
      continue;
    }
    text.remove_prefix(1);
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// One panel: a frame, its title and y range, and one line of `value` over
// steps [first, last].
void DrawPanel(std::ostream& out, int index, const std::string& title,
               const char* color, double y_max, const std::string& y_max_label,
               int64_t first, int64_t last, const std::vector<Point>& points,
               double Point::*value) {
  const double top = kHeader + index * (kTitle + kPanel) + kTitle;
  const double plot_width = kWidth - kLeft - kRight;
  out << absl::StrFormat(
      "<text x=\"%.0f\" y=\"%.0f\" font-weight=\"bold\">%s</text>\n", kLeft,
      top - 8, title);
  out << absl::StrFormat(
      "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" "
      "fill=\"none\" stroke=\"#999\"/>\n",
      kLeft, top, plot_width, kPanel);
  out << absl::StrFormat(
      "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"end\">%s</text>\n", kLeft - 6,
      top + 10, y_max_label);
  out << absl::StrFormat(
      "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"end\">0</text>\n", kLeft - 6,
      top + kPanel);
  const double x_span = std::max<double>(1, last - first);
  out << absl::StrFormat(
      "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"",
      color);
  for (const Point& point : points) {
    const double x = kLeft + plot_width * (point.step - first) / x_span;
    const double y =
        top + kPanel -
        kPanel * std::min(1.0, point.*value / std::max(1.0, y_max));
    out << absl::StrFormat("%.1f,%.1f ", x, y);
  }
  out << "\"/>\n";
}

}  // namespace

void WriteTimelineCsv(absl::Span<const StepRecord> steps, std::ostream& out) {
  out << "step,batch,pages_used,hit_tokens,prompt_tokens,preemptions,"
         "cow_copies,evictions,waiting,limit,host_hit_tokens,host_stores,"
         "host_loads,host_copy_us\n";
  for (const StepRecord& s : steps) {
    out << absl::StrFormat("%d,%d,%d,%d,%d,%d,%d,%d,%d,%s,%d,%d,%d,%.3f\n",
                           s.step, s.batch, s.pages_used, s.hit_tokens,
                           s.prompt_tokens, s.preemptions, s.cow_copies,
                           s.evictions, s.waiting, StepLimitName(s.limit),
                           s.host_hit_tokens, s.host_stores, s.host_loads,
                           static_cast<double>(s.host_copy_ns) / 1e3);
  }
}

void WriteSvgChart(absl::Span<const StepRecord> steps, int32_t num_pages,
                   absl::string_view title, std::ostream& out) {
  const double height = kHeader + kPanels * (kTitle + kPanel) + kBottom;
  out << absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" "
      "height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" "
      "font-size=\"12\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
      kWidth, height, kWidth, height);
  out << absl::StrFormat("<text x=\"16\" y=\"16\">%s</text>\n",
                         EscapeXml(title));
  if (steps.empty()) {
    out << "<text x=\"16\" y=\"48\">kvblock-sim: no steps were run</text>\n"
        << "</svg>\n";
    return;
  }
  const std::vector<Point> points = Bucket(steps);
  const int64_t first = steps.front().step;
  const int64_t last = steps.back().step;
  double peak_pages = 0;
  double peak_batch = 0;
  for (const Point& point : points) {
    peak_pages = std::max(peak_pages, point.pages);
    peak_batch = std::max(peak_batch, point.batch);
  }
  DrawPanel(
      out, 0,
      absl::StrFormat("pages in use (peak %.0f of %d)", peak_pages, num_pages),
      "#1f77b4", num_pages, absl::StrFormat("%d", num_pages), first, last,
      points, &Point::pages);
  DrawPanel(out, 1,
            absl::StrFormat("prefix hit rate, cumulative (%.1f%% at the end)",
                            points.back().hit_rate),
            "#2ca02c", 100, "100%", first, last, points, &Point::hit_rate);
  DrawPanel(out, 2, absl::StrFormat("batch size (peak %.0f)", peak_batch),
            "#d62728", peak_batch, absl::StrFormat("%.0f", peak_batch), first,
            last, points, &Point::batch);
  const double preempted = points.back().preemptions;
  DrawPanel(out, 3,
            absl::StrFormat("preemptions, cumulative (%.0f in all)", preempted),
            "#9467bd", std::max(1.0, preempted),
            absl::StrFormat("%.0f", std::max(1.0, preempted)), first, last,
            points, &Point::preemptions);
  const double axis_y = kHeader + kPanels * (kTitle + kPanel) + 16;
  out << absl::StrFormat(
      "<text x=\"%.0f\" y=\"%.0f\">%d</text>\n"
      "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">step</text>\n"
      "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"end\">%d</text>\n",
      kLeft, axis_y, first, (kWidth + kLeft - kRight) / 2, axis_y,
      kWidth - kRight, axis_y, last);
  out << "</svg>\n";
}

}  // namespace kvblock::sim
