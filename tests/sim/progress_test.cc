// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "sim/progress.h"

#include <chrono>
#include <sstream>
#include <string>

#include "test_util.h"

namespace kvblock::sim {
namespace {

constexpr Progress kHalfway{
    .step = 120, .running = 7, .waiting = 3, .finished = 50, .total = 100};

TEST_CASE("a disabled progress line writes nothing") {
  std::ostringstream out;
  ProgressLine line(out, /*enabled=*/false, std::chrono::seconds(0));
  line.Update(kHalfway);
  line.Finish();
  REQUIRE(out.str().empty());
}

TEST_CASE("a progress line redraws in place and is erased at the end") {
  std::ostringstream out;
  ProgressLine line(out, /*enabled=*/true, std::chrono::seconds(0));
  line.Update(kHalfway);
  const std::string first =
      "\rstep 120  running 7  waiting 3  done 50/100 (50%)";
  REQUIRE(out.str() == first);
  line.Update(
      {.step = 9, .running = 1, .waiting = 0, .finished = 100, .total = 100});
  // The shorter line is padded over the longer one.
  const std::string second =
      "\rstep 9  running 1  waiting 0  done 100/100 (100%)";
  REQUIRE(out.str() ==
          first + second + std::string(first.size() - second.size(), ' '));
  const size_t before = out.str().size();
  line.Finish();
  REQUIRE(out.str().substr(before) ==
          "\r" + std::string(first.size() - 1, ' ') + "\r");
}

TEST_CASE("a progress line draws at most once per interval") {
  std::ostringstream out;
  ProgressLine line(out, /*enabled=*/true, std::chrono::hours(1));
  line.Update(kHalfway);
  const std::string drawn = out.str();
  line.Update(
      {.step = 121, .running = 7, .waiting = 3, .finished = 51, .total = 100});
  REQUIRE(out.str() == drawn);
}

}  // namespace
}  // namespace kvblock::sim
