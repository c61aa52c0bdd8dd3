// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// The device the benchmarks run on, and the page size of their pools. The
// device: CUDA device 0 when the build has CUDA
// and a GPU is present, else the host device. Created on first use and never
// deleted (benchmarks of one binary share it). Not thread-safe beyond the
// first call's static initialization; Google Benchmark runs one at a time.
#ifndef KVBLOCK_TOOLS_BENCH_BENCH_DEVICE_H_
#define KVBLOCK_TOOLS_BENCH_BENCH_DEVICE_H_

#include <cstdint>

#include "kvblock/device.h"

namespace kvblock {

Device& BenchDevice();

// Tokens a page of the benchmarks' pools: vLLM's default block size.
inline constexpr int32_t kPageSize = 16;

}  // namespace kvblock

#endif  // KVBLOCK_TOOLS_BENCH_BENCH_DEVICE_H_
