// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Deterministic failure injection for the rollback tests (internal).
//
// Sites that can fail in principle but not in a given test (an allocation the
// caller pre-checked, a retain, a page-table row) ask ShouldFail(); a test
// arms the N-th such call to fail and checks that the failure is rolled back.
// Disarmed, which is the default, a site costs one well-predicted branch.
//
// Thread safety: one process-wide counter, not synchronized: arm it only in
// single-threaded tests.
#ifndef KVBLOCK_LIB_BASE_FAULT_INJECTION_H_
#define KVBLOCK_LIB_BASE_FAULT_INJECTION_H_

#include <cstdint>

#include "absl/base/optimization.h"

namespace kvblock::internal {

class FaultInjection {
 public:
  // The `n`-th ShouldFail() call from now on (n >= 1) returns true, once.
  static void FailNth(int64_t n) { countdown_ = n; }
  // Counts ShouldFail() calls without failing any: see calls_since_armed().
  static void Count() { countdown_ = kCountOnly; }
  static void Disarm() { countdown_ = 0; }
  // ShouldFail() calls since Count() (only meaningful after Count()).
  static int64_t calls_since_armed() { return kCountOnly - countdown_; }

  static bool ShouldFail() {
    if (ABSL_PREDICT_TRUE(countdown_ == 0)) return false;
    return --countdown_ == 0;
  }

 private:
  static constexpr int64_t kCountOnly = int64_t{1} << 62;
  static inline int64_t countdown_ = 0;
};

}  // namespace kvblock::internal

#endif  // KVBLOCK_LIB_BASE_FAULT_INJECTION_H_
