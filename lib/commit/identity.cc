// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "kvblock/identity.h"

#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvblock/status_macros.h"

namespace kvblock {
namespace {

// OK when the identity plan of `config` is valid: a valid config whose plan
// fits the pool.
absl::Status CheckIdentityConfig(const PagedKvConfig& config) {
  KVBLOCK_RETURN_IF_ERROR(config.Validate());
  const int64_t required = config.RequiredSingleSequencePages();
  if (required > config.num_pages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "identity plan: needs num_layers * max_pages_per_seq = ", required,
        " pages, num_pages is ", config.num_pages));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status FillIdentityBlockTable(const PagedKvConfig& config,
                                    absl::Span<PageId> out) {
  KVBLOCK_RETURN_IF_ERROR(CheckIdentityConfig(config));
  const int64_t required = config.RequiredSingleSequencePages();
  if (static_cast<int64_t>(out.size()) != required) {
    return absl::InvalidArgumentError(
        absl::StrCat("identity plan: output holds ", out.size(),
                     " entries, the plan has ", required));
  }
  std::iota(out.begin(), out.end(), PageId{0});
  return absl::OkStatus();
}

absl::StatusOr<GpuBlockTablePlan> GpuBlockTablePlan::Identity(
    const PagedKvConfig& config) {
  KVBLOCK_RETURN_IF_ERROR(CheckIdentityConfig(config));
  std::vector<PageId> entries(config.RequiredSingleSequencePages());
  KVBLOCK_RETURN_IF_ERROR(
      FillIdentityBlockTable(config, absl::MakeSpan(entries)));
  return GpuBlockTablePlan(config.num_layers, config.max_pages_per_seq,
                           std::move(entries));
}

GpuBlockTablePlan::GpuBlockTablePlan(int32_t num_layers,
                                     int32_t max_pages_per_seq,
                                     std::vector<PageId> entries)
    : num_layers_(num_layers),
      max_pages_per_seq_(max_pages_per_seq),
      entries_(std::move(entries)) {}

}  // namespace kvblock
