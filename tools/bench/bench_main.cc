// Copyright 2026 The kvblock Authors.
//
// kvblock-bench: Google Benchmark's main; benchmarks register themselves from
// the *_bench.cc files linked into this binary.
#include <benchmark/benchmark.h>

BENCHMARK_MAIN();
