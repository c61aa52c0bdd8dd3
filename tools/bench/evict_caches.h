// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Cold caches for benchmarks: in serving, the scheduler's own work and the
// model's launch run between two steps, and a step finds the CPU's caches
// holding their data, not its own. EvictCaches writes a byte in every cache
// line of a 4 MiB buffer (twice this machine's L2), which a benchmark calls
// between steps, outside the time.
#ifndef KVBLOCK_TOOLS_BENCH_EVICT_CACHES_H_
#define KVBLOCK_TOOLS_BENCH_EVICT_CACHES_H_

namespace kvblock {

void EvictCaches();

}  // namespace kvblock

#endif  // KVBLOCK_TOOLS_BENCH_EVICT_CACHES_H_
