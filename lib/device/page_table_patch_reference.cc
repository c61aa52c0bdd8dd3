// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "device/page_table_patch_reference.h"

#include <algorithm>
#include <cstdint>

#include "kvblock/types.h"

namespace kvblock::internal {

void ApplyPageTablePatchReference(const PageTablePatch& patch) {
  const int64_t width = patch.max_pages_per_seq;
  for (int32_t r = 0; r < patch.num_ranges; ++r) {
    const PageTablePatchRange& range = patch.ranges[r];
    const int64_t slot = range.entry / width;
    const int64_t first = range.entry % width;
    if (range.entry < 0 || slot >= patch.max_batch || range.count < 0 ||
        range.clear < 0 || range.ids_offset < 0 ||
        first + range.count + range.clear > width) {
      continue;
    }
    int32_t* const k = patch.table + slot * 2 * width + first;
    int32_t* const v = k + width;
    const int32_t* const ids = patch.ids + range.ids_offset;
    for (int32_t i = 0; i < range.count; ++i) {
      k[i] = ids[i];
      // Wrapped as int32 (as the CUDA kernel's sum is) for an id that is not
      // a page id, which the caller must not send: defined, not UB.
      v[i] = static_cast<int32_t>(static_cast<uint32_t>(ids[i]) +
                                  static_cast<uint32_t>(patch.num_pages));
    }
    std::fill_n(k + range.count, range.clear, kNoPage);
    std::fill_n(v + range.count, range.clear, kNoPage);
  }
}

}  // namespace kvblock::internal
