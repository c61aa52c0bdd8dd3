// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "sim/step_histogram.h"

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>

namespace kvblock::sim {
namespace {

// Sub-buckets of each power of two at or above kExactBelow: 2^10.
constexpr int kSubBits = 10;
constexpr int kExactBits = 11;  // kExactBelow = 2^kExactBits.

size_t BucketOf(uint64_t value) {
  if (value < (uint64_t{1} << kExactBits)) return static_cast<size_t>(value);
  const int top = std::bit_width(value) - 1;  // >= kExactBits.
  const uint64_t sub = (value >> (top - kSubBits)) & ((1u << kSubBits) - 1);
  return (size_t{1} << kExactBits) +
         (static_cast<size_t>(top - kExactBits) << kSubBits) +
         static_cast<size_t>(sub);
}

// The lowest value of `bucket`.
int64_t LowestOf(size_t bucket) {
  constexpr size_t kExact = size_t{1} << kExactBits;
  if (bucket < kExact) return static_cast<int64_t>(bucket);
  const size_t octave = (bucket - kExact) >> kSubBits;
  const uint64_t sub = (bucket - kExact) & ((size_t{1} << kSubBits) - 1);
  const int top = kExactBits + static_cast<int>(octave);
  return static_cast<int64_t>(((uint64_t{1} << kSubBits) | sub)
                              << (top - kSubBits));
}

}  // namespace

void StepHistogram::Add(int64_t value) {
  value = std::max<int64_t>(value, 0);
  const size_t bucket = BucketOf(static_cast<uint64_t>(value));
  if (bucket >= counts_.size()) {
    // Whole octaves at once: a few growths over a run, at most 53.
    constexpr size_t kExact = size_t{1} << kExactBits;
    const size_t size =
        bucket < kExact
            ? kExact
            : kExact + ((((bucket - kExact) >> kSubBits) + 1) << kSubBits);
    counts_.resize(size, 0);
  }
  ++counts_[bucket];
  ++count_;
  sum_ += static_cast<double>(value);
  max_ = std::max(max_, value);
}

StepStats StepHistogram::Stats() const {
  StepStats stats;
  if (count_ == 0) return stats;
  stats.count = count_;
  stats.mean = sum_ / static_cast<double>(count_);
  stats.max = max_;
  // Nearest rank: the smallest value with at least p% of them at or below.
  const auto rank = [&](int64_t percent) {
    const int64_t want = (count_ * percent + 99) / 100;
    int64_t seen = 0;
    for (size_t bucket = 0; bucket < counts_.size(); ++bucket) {
      seen += counts_[bucket];
      if (seen >= want) return std::min(LowestOf(bucket), max_);
    }
    return max_;
  };
  stats.p50 = rank(50);
  stats.p99 = rank(99);
  return stats;
}

}  // namespace kvblock::sim
