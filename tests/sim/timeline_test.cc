// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "sim/timeline.h"

#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace kvblock::sim {
namespace {

int Count(const std::string& text, const std::string& what) {
  int count = 0;
  for (size_t at = text.find(what); at != std::string::npos;
       at = text.find(what, at + 1)) {
    ++count;
  }
  return count;
}

TEST_CASE("the CSV timeline has a header and one row per step") {
  const std::vector<StepRecord> steps = {
      {.step = 0,
       .batch = 2,
       .pages_used = 9,
       .hit_tokens = 16,
       .prompt_tokens = 40,
       .preemptions = 0,
       .cow_copies = 1,
       .evictions = 0,
       .waiting = 4,
       .limit = StepLimit::kPages},
      {.step = 5,
       .batch = 1,
       .pages_used = 7,
       .hit_tokens = 0,
       .prompt_tokens = 0,
       .preemptions = 1,
       .cow_copies = 0,
       .evictions = 3,
       .waiting = 0,
       .limit = StepLimit::kNone,
       .host_hit_tokens = 32,
       .host_stores = 3,
       .host_loads = 2,
       .host_copy_ns = 1500},
  };
  std::ostringstream out;
  WriteTimelineCsv(steps, out);
  REQUIRE(out.str() ==
          "step,batch,pages_used,hit_tokens,prompt_tokens,preemptions,"
          "cow_copies,evictions,waiting,limit,host_hit_tokens,host_stores,"
          "host_loads,host_copy_us\n"
          "0,2,9,16,40,0,1,0,4,pages,0,0,0,0.000\n"
          "5,1,7,0,0,1,0,3,0,none,32,3,2,1.500\n");
}

TEST_CASE("the SVG chart draws four bounded lines under its title") {
  std::vector<StepRecord> steps;
  for (int64_t i = 0; i < 5000; ++i) {
    steps.push_back({.step = i,
                     .batch = static_cast<int32_t>(i % 30),
                     .pages_used = static_cast<int32_t>(i % 200),
                     .hit_tokens = i % 3 == 0 ? 16 : 0,
                     .prompt_tokens = 32,
                     .preemptions = i % 1000 == 0 ? 1 : 0,
                     .cow_copies = 0,
                     .evictions = 0});
  }
  std::ostringstream out;
  WriteSvgChart(steps, 256, "a <b> & \"c\"", out);
  const std::string svg = out.str();
  REQUIRE(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0) == 0);
  REQUIRE(svg.size() >= 7);
  REQUIRE(svg.substr(svg.size() - 7) == "</svg>\n");
  REQUIRE(Count(svg, "<polyline") == 4);
  REQUIRE(svg.find("a &lt;b&gt; &amp; &quot;c&quot;") != std::string::npos);
  // Bucketed: at most kChartPoints points a line ("x,y " each).
  const size_t begin = svg.find("points=\"");
  const std::string points =
      svg.substr(begin, svg.find('"', begin + 8) - begin);
  REQUIRE(Count(points, ",") <= kChartPoints);
  REQUIRE(svg.find("pages in use (peak 199 of 256)") != std::string::npos);
  REQUIRE(svg.find("batch size (peak 29)") != std::string::npos);
  REQUIRE(svg.find("(16.7% at the end)") != std::string::npos);
  REQUIRE(svg.find("preemptions, cumulative (5 in all)") != std::string::npos);
}

TEST_CASE("a title of bytes XML cannot hold is written as U+FFFD") {
  // A path's stray byte, an overlong '/', a surrogate, a control character
  // and a cut character; well-formed UTF-8 stays.
  std::ostringstream out;
  WriteSvgChart({}, 16,
                "r/bad\xffname \xc0\xaf \xed\xa0\x80 a\x01"
                "b \xc3\xa9 \xe2\x82 \xef\xbf\xbf",
                out);
  const std::string replaced = "\xef\xbf\xbd";
  REQUIRE(out.str().find("r/bad" + replaced + "name " + replaced + replaced +
                         " " + replaced + replaced + replaced + " a" +
                         replaced + "b \xc3\xa9 " + replaced + replaced + " " +
                         replaced + replaced + replaced) != std::string::npos);
}

TEST_CASE("an SVG chart of no steps says so") {
  std::ostringstream out;
  WriteSvgChart({}, 16, "title", out);
  REQUIRE(out.str().find("no steps were run") != std::string::npos);
  REQUIRE(out.str().find("<polyline") == std::string::npos);
}

}  // namespace
}  // namespace kvblock::sim
