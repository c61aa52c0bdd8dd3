// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "cache/host_tier.h"

#include <utility>
#include <vector>

#include "pool_test_util.h"
#include "test_util.h"

namespace kvblock::internal {
namespace {

using ::kvblock::testing::TestHash;

HostPageId MustStore(HostTier& tier, uint32_t key, uint32_t batch) {
  const HostTier::Stored stored = tier.Store(TestHash(key), 0, batch);
  REQUIRE(stored.page != kNoHostPage);
  REQUIRE(stored.is_new);
  return stored.page;
}

TEST_CASE("host tier: stores take free pages in order, then the LRU head") {
  HostTier tier(3, 4);
  REQUIRE(tier.num_free() == 3);
  REQUIRE(MustStore(tier, 1, 1) == 0);
  REQUIRE(MustStore(tier, 2, 1) == 1);
  REQUIRE(MustStore(tier, 3, 1) == 2);
  REQUIRE(tier.Find(TestHash(2)) == 1);
  REQUIRE(tier.Find(TestHash(9)) == kNoHostPage);
  REQUIRE(tier.LruOrder() == std::vector<HostPageId>{0, 1, 2});
  // Page 0 loaded from in batch 2: page 1 is the head, and a store of
  // batch 2 drops it.
  tier.Use(0, 2);
  const HostTier::Stored stored = tier.Store(TestHash(4), 5, 2);
  REQUIRE(stored.page == 1);
  REQUIRE(stored.evicted.any);
  REQUIRE(stored.evicted.key == TestHash(2));
  REQUIRE(stored.evicted.group == 0);
  REQUIRE(tier.group(1) == 5);
  REQUIRE(tier.Find(TestHash(2)) == kNoHostPage);
  REQUIRE(tier.LruOrder() == std::vector<HostPageId>{2, 0, 1});
  REQUIRE(tier.num_cached() == 3);
  REQUIRE_OK(tier.CheckInvariants());
}

TEST_CASE("host tier: pages a batch uses are never evicted in it") {
  HostTier tier(2, 4);
  MustStore(tier, 1, 7);
  MustStore(tier, 2, 7);
  const HostTier::Stored none = tier.Store(TestHash(3), 0, 7);
  REQUIRE(none.page == kNoHostPage);
  REQUIRE(!none.evicted.any);
  REQUIRE(tier.num_cached() == 2);
  REQUIRE(tier.LruOrder() == std::vector<HostPageId>{0, 1});
  // A load of batch 8 stamps its page: only the other one can go.
  tier.Use(0, 8);
  REQUIRE(tier.UsedBy(0, 8));
  REQUIRE(tier.Store(TestHash(3), 0, 8).page == 1);
  REQUIRE(tier.Store(TestHash(4), 0, 8).page == kNoHostPage);
  REQUIRE(tier.UsedBy(8) == std::vector<HostPageId>{0, 1});
  REQUIRE_OK(tier.CheckInvariants());
}

TEST_CASE("host tier: a key cached already is found, nothing changed") {
  HostTier tier(2, 4);
  tier.set_journaling(true);
  MustStore(tier, 1, 1);
  MustStore(tier, 2, 1);
  const size_t journal = tier.journal_size();
  // Found even when no page has room (both used by batch 1).
  const HostTier::Stored stored = tier.Store(TestHash(1), 3, 1);
  REQUIRE(stored.page == 0);
  REQUIRE(!stored.is_new);
  REQUIRE(!stored.evicted.any);
  REQUIRE(tier.group(0) == 0);
  REQUIRE(tier.LruOrder() == std::vector<HostPageId>{0, 1});
  REQUIRE(tier.journal_size() == journal);
  REQUIRE(tier.num_cached() == 2);
  REQUIRE_OK(tier.CheckInvariants());
}

TEST_CASE("host tier: a rollback restores keys, order, stamps and free pages") {
  HostTier tier(3, 1);
  MustStore(tier, 1, 1);
  MustStore(tier, 2, 1);
  REQUIRE(tier.journal_size() == 0);  // not journaling: nothing kept.
  tier.set_journaling(true);
  const auto lru = tier.LruOrder();
  const auto cached = tier.Cached();
  const auto free = tier.FreeStack();
  const size_t mark = tier.journal_size();
  MustStore(tier, 3, 2);  // the free page.
  tier.Use(0, 2);
  MustStore(tier, 4, 2);  // evicts key 2, the head.
  tier.Use(2, 3);
  REQUIRE(tier.Find(TestHash(2)) == kNoHostPage);
  tier.Rollback(mark);
  REQUIRE(tier.LruOrder() == lru);
  REQUIRE(tier.Cached() == cached);
  REQUIRE(tier.FreeStack() == free);
  REQUIRE(tier.UsedBy(1) == std::vector<HostPageId>{0, 1});
  REQUIRE(tier.UsedBy(2).empty());
  REQUIRE(tier.UsedBy(3).empty());
  REQUIRE(tier.Find(TestHash(2)) == 1);
  REQUIRE_OK(tier.CheckInvariants());
}

TEST_CASE("host tier: clear frees every page in the initial order") {
  HostTier tier(2, 0);
  MustStore(tier, 1, 1);
  tier.Clear();
  REQUIRE(tier.num_cached() == 0);
  REQUIRE(tier.FreeStack() == std::vector<HostPageId>{1, 0});
  REQUIRE(tier.Find(TestHash(1)) == kNoHostPage);
  REQUIRE(tier.UsedBy(1).empty());
  REQUIRE_OK(tier.CheckInvariants());
}

}  // namespace
}  // namespace kvblock::internal
