// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// kvblock-bench: Google Benchmark's main, plus --version as every kvblock
// tool has it; benchmarks register themselves from the *_bench.cc files
// linked into this binary.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstring>

#include "kvblock/version.h"

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--version") == 0) {
      std::printf("kvblock-bench %s\n", KVBLOCK_VERSION);
      return 0;
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
