// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "kvblock/config.h"

#include <cstdint>
#include <limits>
#include <memory>

#include "kvblock/block_pool.h"
#include "kvblock/device.h"
#include "kvblock/page_table.h"
#include "test_util.h"

namespace kvblock {
namespace {

PagedKvConfig SmallConfig() {
  PagedKvConfig config;
  config.num_pages = 64;
  config.max_batch = 4;
  config.max_pages_per_seq = 8;
  return config;
}

TEST_CASE("default config needs its counts chosen") {
  PagedKvConfig config;
  REQUIRE_STATUS_IS(config.Validate(), kInvalidArgument);
  REQUIRE(config.dtype == DType::kBf16);
  REQUIRE_OK(SmallConfig().Validate());
}

TEST_CASE("every non-positive count is rejected with its name") {
  int32_t PagedKvConfig::*fields[] = {
      &PagedKvConfig::num_pages,         &PagedKvConfig::max_batch,
      &PagedKvConfig::max_pages_per_seq, &PagedKvConfig::page_size,
      &PagedKvConfig::num_layers,        &PagedKvConfig::num_kv_heads,
      &PagedKvConfig::head_dim,
  };
  const char* names[] = {"num_pages", "max_batch",  "max_pages_per_seq",
                         "page_size", "num_layers", "num_kv_heads",
                         "head_dim"};
  for (int i = 0; i < 7; ++i) {
    for (int32_t bad : {0, -1}) {
      PagedKvConfig config = SmallConfig();
      config.*fields[i] = bad;
      const absl::Status status = config.Validate();
      INFO(status.ToString());
      REQUIRE(status.code() == absl::StatusCode::kInvalidArgument);
      REQUIRE(status.message().find(names[i]) != absl::string_view::npos);
    }
  }
}

TEST_CASE("num_pages whose V ids overflow int32 is rejected") {
  PagedKvConfig config = SmallConfig();
  config.num_pages = std::numeric_limits<int32_t>::max() / 2 + 1;
  REQUIRE_STATUS_IS(config.Validate(), kInvalidArgument);
  config.num_pages = std::numeric_limits<int32_t>::max() / 2;
  config.num_kv_heads = 1;
  config.head_dim = 1;
  config.page_size = 1;
  REQUIRE_OK(config.Validate());
}

TEST_CASE("config, pool and page table agree on the largest pool") {
  // kMaxNumPages, 2^30 - 1, is accepted by all three; one more by none.
  PagedKvConfig config = SmallConfig();
  config.num_kv_heads = 1;
  config.head_dim = 1;
  config.page_size = 1;
  config.num_pages = kMaxNumPages;
  REQUIRE_OK(config.Validate());
  std::unique_ptr<Device> device = Device::Host();
  REQUIRE_OK(KVPageTable::Create(1, 1, kMaxNumPages, *device));
  config.num_pages = kMaxNumPages + 1;
  REQUIRE_STATUS_IS(config.Validate(), kInvalidArgument);
  REQUIRE_STATUS_IS(KVPageTable::Create(1, 1, kMaxNumPages + 1, *device),
                    kInvalidArgument);
  const auto pool = BlockPool::Create(kMaxNumPages + 1);
  REQUIRE_STATUS_IS(pool, kInvalidArgument);
  REQUIRE(pool.status().message().find("1073741823") !=
          absl::string_view::npos);
}

TEST_CASE("pool sizes that overflow int64 are rejected") {
  // Each value is accepted on its own: only the products overflow.
  PagedKvConfig config = SmallConfig();
  config.num_pages = kMaxNumPages;
  config.page_size = 1 << 20;
  config.num_kv_heads = 1 << 10;
  config.head_dim = 1 << 10;
  const absl::Status pool = config.Validate();
  REQUIRE_STATUS_IS(pool, kInvalidArgument);
  REQUIRE(pool.message().find("overflows int64 bytes") !=
          absl::string_view::npos);
  config = SmallConfig();
  config.head_dim = 1 << 20;
  config.num_layers = std::numeric_limits<int32_t>::max();
  const absl::Status layers = config.Validate();
  REQUIRE_STATUS_IS(layers, kInvalidArgument);
  REQUIRE(layers.message().find("num_layers 2147483647 x layer pool bytes") !=
          absl::string_view::npos);
}

TEST_CASE("unknown dtype is rejected") {
  PagedKvConfig config = SmallConfig();
  config.dtype = static_cast<DType>(7);
  REQUIRE_STATUS_IS(config.Validate(), kInvalidArgument);
}

TEST_CASE("derived sizes") {
  PagedKvConfig config = SmallConfig();
  config.num_layers = 3;
  REQUIRE(config.RequiredSingleSequencePages() == 24);
  REQUIRE(config.MaxTokensPerSeq() == 8 * 16);
  REQUIRE(config.PageElements() == 16 * 8 * 128);
  REQUIRE(config.PageBytes() == 16 * 8 * 128 * 2);
  REQUIRE(config.LayerPoolBytes() == 2 * 64 * config.PageBytes());
  REQUIRE(config.PageTableEntries() == 4 * 2 * 8);
  config.dtype = DType::kF32;
  REQUIRE(config.PageBytes() == 16 * 8 * 128 * 4);
  REQUIRE(DTypeName(DType::kF16) == "f16");
  REQUIRE(DTypeName(DType::kBf16) == "bf16");
  REQUIRE(DTypeName(DType::kF32) == "f32");
}

}  // namespace
}  // namespace kvblock
