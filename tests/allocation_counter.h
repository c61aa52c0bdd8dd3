// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Heap allocations of a test binary: a binary that links
// allocation_counter.cc has every non-aligned form of the global operator
// new and delete replaced, so that a test can prove that a stretch of calls
// allocates nothing (the hot paths' contract). Counts allocations of every
// thread.
#ifndef KVBLOCK_TESTS_ALLOCATION_COUNTER_H_
#define KVBLOCK_TESTS_ALLOCATION_COUNTER_H_

#include <cstdint>

namespace kvblock::testing {

// Global operator new calls of this process so far.
int64_t HeapAllocations();

}  // namespace kvblock::testing

#endif  // KVBLOCK_TESTS_ALLOCATION_COUNTER_H_
