// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "evict_caches.h"

#include <benchmark/benchmark.h>

#include <cstddef>
#include <vector>

namespace kvblock {

void EvictCaches() {
  constexpr size_t kColdBytes = size_t{4} << 20;
  static std::vector<char> lines(kColdBytes);
  for (size_t i = 0; i < lines.size(); i += 64) ++lines[i];
  benchmark::DoNotOptimize(lines.data());
}

}  // namespace kvblock
