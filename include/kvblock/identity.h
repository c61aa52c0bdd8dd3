// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// The identity plan: the static block table of a single sequence of maximal
// length that owns the whole pool, laid out flat as [layer][logical_page].
// Entry `layer * max_pages_per_seq + page` holds that same index, so layer `l`
// reads the contiguous pages [l * max_pages_per_seq, (l + 1) *
// max_pages_per_seq). It needs `RequiredSingleSequencePages()` pages, which
// must fit the pool (`num_pages`).
//
// Complexity: O(RequiredSingleSequencePages()).
// Thread safety: FillIdentityBlockTable has no state; a GpuBlockTablePlan is
// an immutable value, safe to read concurrently.
#ifndef KVBLOCK_IDENTITY_H_
#define KVBLOCK_IDENTITY_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvblock/config.h"
#include "kvblock/types.h"

namespace kvblock {

// Writes the identity plan of `config` into `out`, which must hold exactly
// `config.RequiredSingleSequencePages()` entries. InvalidArgument when the
// config is invalid (Validate()), the plan needs more pages than
// `config.num_pages`, or `out` has another size. On error, `out` is
// unchanged.
absl::Status FillIdentityBlockTable(const PagedKvConfig& config,
                                    absl::Span<PageId> out);

// An owned identity plan.
class GpuBlockTablePlan {
 public:
  // The identity plan of `config`; the errors of FillIdentityBlockTable.
  static absl::StatusOr<GpuBlockTablePlan> Identity(
      const PagedKvConfig& config);

  // `num_layers() * max_pages_per_seq()` entries, [layer][logical_page].
  absl::Span<const PageId> entries() const { return entries_; }
  int32_t num_layers() const { return num_layers_; }
  int32_t max_pages_per_seq() const { return max_pages_per_seq_; }

 private:
  GpuBlockTablePlan(int32_t num_layers, int32_t max_pages_per_seq,
                    std::vector<PageId> entries);

  int32_t num_layers_;
  int32_t max_pages_per_seq_;
  std::vector<PageId> entries_;
};

}  // namespace kvblock

#endif  // KVBLOCK_IDENTITY_H_
