// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Test helper: a KV cache group spec in one line.
#ifndef KVBLOCK_TESTS_BASE_GROUP_SPEC_TEST_UTIL_H_
#define KVBLOCK_TESTS_BASE_GROUP_SPEC_TEST_UTIL_H_

#include <cstdint>

#include "kvblock/kv_cache_groups.h"

namespace kvblock::testing {

// A group of `kind` with pages of `page_size` tokens; `span` is the window
// (kSlidingWindow) or the chunk (kChunkedLocal), ignored for kFull.
constexpr KvCacheGroupSpec GroupSpec(AttentionKind kind, int32_t page_size,
                                     int32_t span = 0, bool eagle = false) {
  return {
      .kind = kind,
      .page_size = page_size,
      .sliding_window = kind == AttentionKind::kSlidingWindow ? span : 0,
      .attention_chunk_size = kind == AttentionKind::kChunkedLocal ? span : 0,
      .eagle = eagle};
}

}  // namespace kvblock::testing

#endif  // KVBLOCK_TESTS_BASE_GROUP_SPEC_TEST_UTIL_H_
