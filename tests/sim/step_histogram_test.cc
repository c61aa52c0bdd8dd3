// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "sim/step_histogram.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "test_util.h"

namespace kvblock::sim {
namespace {

StepStats StatsOf(const std::vector<int64_t>& values) {
  StepHistogram histogram;
  for (const int64_t value : values) histogram.Add(value);
  return histogram.Stats();
}

TEST_CASE("a histogram gives the mean and nearest-rank percentiles") {
  REQUIRE(StatsOf({}) == StepStats{});
  REQUIRE(StatsOf({5, 1, 3, 2, 4}) ==
          StepStats{.count = 5, .mean = 3, .p50 = 3, .p99 = 5, .max = 5});
  std::vector<int64_t> hundred;
  for (int64_t i = 100; i >= 1; --i) hundred.push_back(i);
  REQUIRE(
      StatsOf(hundred) ==
      StepStats{.count = 100, .mean = 50.5, .p50 = 50, .p99 = 99, .max = 100});
  REQUIRE(StatsOf({0, 0, 7}) ==
          StepStats{.count = 3, .mean = 7.0 / 3, .p50 = 0, .p99 = 7, .max = 7});
}

TEST_CASE("percentiles are exact below 2048, within 1/1024 above") {
  // Values below kExactBelow: every percentile is one of them, exactly.
  std::vector<int64_t> small;
  for (int64_t i = 0; i < StepHistogram::kExactBelow; i += 3) {
    small.push_back(i);
  }
  std::vector<int64_t> sorted = small;
  std::sort(sorted.begin(), sorted.end());
  const auto rank = [&](const std::vector<int64_t>& v, size_t percent) {
    return v[(v.size() * percent + 99) / 100 - 1];
  };
  const StepStats exact = StatsOf(small);
  REQUIRE(exact.p50 == rank(sorted, 50));
  REQUIRE(exact.p99 == rank(sorted, 99));
  REQUIRE(exact.max == sorted.back());

  // Larger values up to 2^62: the percentile read is at most 1/1024 below
  // the true one, never above; the count, mean and max stay exact.
  std::vector<int64_t> large;
  for (int64_t v = 2047; v < (int64_t{1} << 62); v = v + v / 3 + 1) {
    large.push_back(v);
  }
  sorted = large;
  std::sort(sorted.begin(), sorted.end());
  const StepStats stats = StatsOf(large);
  REQUIRE(stats.count == static_cast<int64_t>(large.size()));
  REQUIRE(stats.max == sorted.back());
  for (const auto& [read, percent] :
       {std::pair{stats.p50, size_t{50}}, std::pair{stats.p99, size_t{99}}}) {
    const int64_t truth = rank(sorted, percent);
    REQUIRE(read <= truth);
    REQUIRE(read >= truth - truth / 1024);
  }
  REQUIRE(stats.mean > 0);
  // A negative value counts as 0; the largest int64 has a bucket.
  REQUIRE(StatsOf({-5}).max == 0);
  const int64_t most = std::numeric_limits<int64_t>::max();
  const StepStats top = StatsOf({most});
  REQUIRE(top.max == most);
  REQUIRE(top.p50 >= most - most / 1024);
}

}  // namespace
}  // namespace kvblock::sim
