// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Main of sha256_page_step_test: runs its Catch2 tests only on a CPU with
// the SHA extensions, and otherwise exits 77, which Meson reports as SKIP
// (never as a pass).
#include <cstdio>

#include "cache/sha256_page_step.h"
#include "catch_session.h"

int main(int argc, char** argv) {
  constexpr int kSkipped = 77;
  if (!kvblock::internal::CpuHasSha256Ni()) {
    std::printf(
        "sha256_page_step skipped: this CPU lacks the SHA extensions\n");
    return kSkipped;
  }
  return kvblock::testing::RunCatchSession(argc, argv);
}
