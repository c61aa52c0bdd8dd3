// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Helpers for tests of the block pool and the layers above it: distinct
// block hashes, a pool factory, and readable snapshots in Catch2 messages.
#ifndef KVBLOCK_TESTS_POOL_TEST_UTIL_H_
#define KVBLOCK_TESTS_POOL_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <string>

#include "kvblock/block_hash.h"
#include "kvblock/block_pool.h"
#include "test_util.h"

namespace kvblock::testing {

// A block hash distinct for every `i` (its bytes spell `i` twice).
inline BlockHash TestHash(uint32_t i) {
  BlockHash hash;
  for (int b = 0; b < 4; ++b) {
    hash.bytes[b] = static_cast<uint8_t>(i >> (8 * b));
    hash.bytes[31 - b] = static_cast<uint8_t>(~i >> (8 * b));
  }
  return hash;
}

// A new pool of `num_pages` pages; the test fails if creation does.
inline std::unique_ptr<BlockPool> NewPool(int32_t num_pages,
                                          BlockPoolOptions options = {}) {
  auto pool = BlockPool::Create(num_pages, options);
  REQUIRE_OK(pool);
  return std::move(pool).value();
}

}  // namespace kvblock::testing

namespace kvblock::internal {

// What a test needs of a pool's private state: the copy batch number, which
// reaches its wrap only after 2^30 - 1 batches.
class BlockPoolPeer {
 public:
  static constexpr uint32_t kLastCopyBatch = BlockPool::kBatchMask;
  static void SetCopyBatch(BlockPool& pool, uint32_t batch) {
    pool.batch_ = batch;
  }
};

}  // namespace kvblock::internal

namespace Catch {
template <>
struct StringMaker<kvblock::BlockPoolSnapshot> {
  static std::string convert(const kvblock::BlockPoolSnapshot& snapshot) {
    return "\n" + snapshot.DebugString();
  }
};
}  // namespace Catch

#endif  // KVBLOCK_TESTS_POOL_TEST_UTIL_H_
