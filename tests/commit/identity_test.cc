// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "kvblock/identity.h"

#include <cstdint>
#include <vector>

#include "test_util.h"

namespace kvblock {
namespace {

PagedKvConfig Config(int32_t num_layers, int32_t max_pages_per_seq,
                     int32_t num_pages) {
  PagedKvConfig config;
  config.num_pages = num_pages;
  config.max_batch = 2;
  config.max_pages_per_seq = max_pages_per_seq;
  config.num_layers = num_layers;
  return config;
}

TEST_CASE("the identity plan maps each layer to its own contiguous pages") {
  const int32_t num_layers = GENERATE(1, 2, 5);
  const int32_t max_pages_per_seq = GENERATE(1, 3, 16);
  const int32_t spare = GENERATE(0, 7);
  CAPTURE(num_layers, max_pages_per_seq, spare);
  const PagedKvConfig config = Config(num_layers, max_pages_per_seq,
                                      num_layers * max_pages_per_seq + spare);

  std::vector<PageId> out(config.RequiredSingleSequencePages(), kNoPage);
  REQUIRE_OK(FillIdentityBlockTable(config, absl::MakeSpan(out)));
  auto plan = GpuBlockTablePlan::Identity(config);
  REQUIRE_OK(plan);
  REQUIRE(plan->num_layers() == num_layers);
  REQUIRE(plan->max_pages_per_seq() == max_pages_per_seq);
  REQUIRE(plan->entries().size() == out.size());
  for (int32_t layer = 0; layer < num_layers; ++layer) {
    for (int32_t page = 0; page < max_pages_per_seq; ++page) {
      const int32_t index = layer * max_pages_per_seq + page;
      REQUIRE(out[index] == index);
      REQUIRE(plan->entries()[index] == index);
    }
  }
}

TEST_CASE("the identity plan refuses bad configs and outputs") {
  std::vector<PageId> out(6, 42);
  const std::vector<PageId> untouched = out;

  PagedKvConfig invalid = Config(2, 3, 6);
  invalid.head_dim = 0;
  REQUIRE_STATUS_IS(FillIdentityBlockTable(invalid, absl::MakeSpan(out)),
                    kInvalidArgument);
  REQUIRE_STATUS_IS(GpuBlockTablePlan::Identity(invalid), kInvalidArgument);

  const PagedKvConfig too_big = Config(2, 3, 5);  // Needs 6 pages.
  REQUIRE_STATUS_IS(FillIdentityBlockTable(too_big, absl::MakeSpan(out)),
                    kInvalidArgument);
  REQUIRE_STATUS_IS(GpuBlockTablePlan::Identity(too_big), kInvalidArgument);

  const PagedKvConfig fits = Config(2, 3, 6);
  std::vector<PageId> shorter(5, 42);
  std::vector<PageId> longer(7, 42);
  REQUIRE_STATUS_IS(FillIdentityBlockTable(fits, absl::MakeSpan(shorter)),
                    kInvalidArgument);
  REQUIRE_STATUS_IS(FillIdentityBlockTable(fits, absl::MakeSpan(longer)),
                    kInvalidArgument);
  REQUIRE(shorter == std::vector<PageId>(5, 42));
  REQUIRE(longer == std::vector<PageId>(7, 42));
  REQUIRE(out == untouched);
}

}  // namespace
}  // namespace kvblock
