// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// StepHistogram: the distribution of a count of steps (a request's queue
// wait, time to first token, prompt steps) over the requests of a run, in
// memory bounded by the range of the values, not by how many there are: a
// --serve replica that runs for days keeps its report's percentiles without
// keeping a value per request.
//
// Buckets are log-linear (HdrHistogram's layout): a value below 2^11 = 2048
// has a bucket of its own, so its percentiles are exact; a larger one shares
// a bucket with values within 1/1024 of it (1,024 buckets per power of two)
// and a percentile falling there reads the bucket's lowest value, at most
// 0.1% below the true one. The count and max are exact, the mean too while
// the values' sum is below 2^53.
//
// Memory: one int64 per bucket up to the largest value's, at most 55,296
// (442 KB) for values up to 2^63 - 1, 16 KB below 2048.
// Complexity: Add is O(1) (amortized: the buckets grow to the largest value
// once); Stats is O(buckets).
// Thread safety: thread-compatible.
#ifndef KVBLOCK_TOOLS_SIM_STEP_HISTOGRAM_H_
#define KVBLOCK_TOOLS_SIM_STEP_HISTOGRAM_H_

#include <cstdint>
#include <vector>

namespace kvblock::sim {

// A distribution of steps over completed requests (all zero when none).
struct StepStats {
  int64_t count = 0;
  double mean = 0;
  int64_t p50 = 0;  // nearest-rank percentiles.
  int64_t p99 = 0;
  int64_t max = 0;
  friend bool operator==(const StepStats&, const StepStats&) = default;
};

class StepHistogram {
 public:
  // Values below this have a bucket each: their percentiles are exact.
  static constexpr int64_t kExactBelow = int64_t{1} << 11;

  // Counts `value`. REQUIRES: value >= 0 (a negative value counts as 0).
  void Add(int64_t value);

  // The count, mean, nearest-rank p50 and p99, and max of the values added.
  StepStats Stats() const;

 private:
  std::vector<int64_t> counts_;  // by bucket (BucketOf).
  int64_t count_ = 0;
  double sum_ = 0;  // exact while below 2^53.
  int64_t max_ = 0;
};

}  // namespace kvblock::sim

#endif  // KVBLOCK_TOOLS_SIM_STEP_HISTOGRAM_H_
