// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "kvblock/block_pool.h"

#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "allocation_counter.h"
#include "kvblock/kv_cache_groups.h"
#include "pool_test_util.h"
#include "test_util.h"

namespace kvblock {
namespace {

using ::kvblock::testing::NewPool;
using ::kvblock::testing::TestHash;
using Kind = CopyOnWrite::Kind;

PageId MustAllocate(BlockPool& pool) {
  auto page = pool.Allocate();
  REQUIRE_OK(page);
  return *page;
}

// Allocates `n` pages, caches page i under TestHash(first_hash + i) and
// returns them.
std::vector<PageId> CachedPages(BlockPool& pool, int n, uint32_t first_hash) {
  std::vector<PageId> pages(n);
  REQUIRE_OK(pool.AllocateN(absl::MakeSpan(pages)));
  for (int i = 0; i < n; ++i) {
    auto registered = pool.RegisterCached(pages[i], TestHash(first_hash + i));
    REQUIRE_OK(registered);
    REQUIRE(*registered == pages[i]);
  }
  return pages;
}

TEST_CASE("create rejects bad sizes and options") {
  REQUIRE_STATUS_IS(BlockPool::Create(0), kInvalidArgument);
  REQUIRE_STATUS_IS(BlockPool::Create(-3), kInvalidArgument);
  REQUIRE_STATUS_IS(BlockPool::Create(1 << 30), kInvalidArgument);
  REQUIRE_STATUS_IS(BlockPool::Create(4, {.max_refcount = 0}),
                    kInvalidArgument);
  REQUIRE_STATUS_IS(BlockPool::Create(4, {.journal_reserve = -1}),
                    kInvalidArgument);
  // Enums named by their values only (they were taken as the defaults).
  const auto order =
      BlockPool::Create(4, {.eviction_order = static_cast<EvictionOrder>(7)});
  REQUIRE_STATUS_IS(order, kInvalidArgument);
  REQUIRE(order.status().message().find("eviction_order 7") !=
          std::string::npos);
  const auto policy = BlockPool::Create(
      4,
      {.host_pages = 4, .host_write_policy = static_cast<HostWritePolicy>(77)});
  REQUIRE_STATUS_IS(policy, kInvalidArgument);
  REQUIRE(policy.status().message().find("host_write_policy 77") !=
          std::string::npos);
  auto pool = NewPool(4);
  REQUIRE(pool->num_pages() == 4);
  REQUIRE(pool->NumFree() == 4);
  REQUIRE(pool->NumUsed() == 0);
  REQUIRE(pool->NumEvictable() == 0);
  REQUIRE(pool->NumCached() == 0);
  REQUIRE(pool->max_refcount() == std::numeric_limits<int32_t>::max());
  REQUIRE_OK(pool->CheckInvariants());
  const BlockPoolSnapshot snapshot = pool->Snapshot();
  REQUIRE(snapshot.free_stack == std::vector<PageId>{3, 2, 1, 0});
  REQUIRE(snapshot.refcounts == std::vector<int32_t>{0, 0, 0, 0});
}

TEST_CASE("allocate hands out pages in order and reuses the last released") {
  auto pool = NewPool(3);
  REQUIRE(MustAllocate(*pool) == 0);
  REQUIRE(MustAllocate(*pool) == 1);
  REQUIRE_OK(pool->Release(0));
  REQUIRE(MustAllocate(*pool) == 0);
  REQUIRE(MustAllocate(*pool) == 2);
  REQUIRE(pool->RefCount(2) == 1);
  REQUIRE(pool->NumFree() == 0);

  const BlockPoolSnapshot before = pool->Snapshot();
  REQUIRE_STATUS_IS(pool->Allocate(), kResourceExhausted);
  REQUIRE(pool->Snapshot() == before);
  REQUIRE(pool->stats().allocations == 4);
  REQUIRE(pool->stats().peak_used == 3);
  REQUIRE_OK(pool->CheckInvariants());
}

TEST_CASE("allocate n is all or nothing") {
  auto pool = NewPool(4);
  std::vector<PageId> three(3, kNoPage);
  REQUIRE_OK(pool->AllocateN(absl::MakeSpan(three)));
  REQUIRE(three == std::vector<PageId>{0, 1, 2});

  std::vector<PageId> two(2, 77);
  const BlockPoolSnapshot before = pool->Snapshot();
  REQUIRE_STATUS_IS(pool->AllocateN(absl::MakeSpan(two)), kResourceExhausted);
  REQUIRE(pool->Snapshot() == before);
  REQUIRE(two == std::vector<PageId>{77, 77});

  REQUIRE_OK(pool->AllocateN(absl::Span<PageId>()));
  REQUIRE(pool->Snapshot() == before);
  REQUIRE_OK(pool->CheckInvariants());
}

TEST_CASE("retain and release refuse bad, free and saturated pages") {
  auto pool = NewPool(4, {.max_refcount = 3});
  const PageId page = MustAllocate(*pool);
  const BlockPoolSnapshot fresh = pool->Snapshot();

  for (PageId bad : {kNoPage, -7, 4, 100}) {
    CAPTURE(bad);
    REQUIRE_STATUS_IS(pool->Retain(bad), kInvalidArgument);
    REQUIRE_STATUS_IS(pool->Release(bad), kInvalidArgument);
    REQUIRE(pool->RefCount(bad) == 0);
  }
  REQUIRE_STATUS_IS(pool->Retain(2), kFailedPrecondition);
  REQUIRE_STATUS_IS(pool->Release(2), kFailedPrecondition);
  REQUIRE(pool->Snapshot() == fresh);

  REQUIRE_OK(pool->Retain(page));
  REQUIRE_OK(pool->Retain(page));
  REQUIRE(pool->RefCount(page) == 3);
  const BlockPoolSnapshot full = pool->Snapshot();
  REQUIRE_STATUS_IS(pool->Retain(page), kFailedPrecondition);
  REQUIRE(pool->Snapshot() == full);

  for (int i = 0; i < 3; ++i) REQUIRE_OK(pool->Release(page));
  REQUIRE(pool->RefCount(page) == 0);
  const BlockPoolSnapshot released = pool->Snapshot();
  REQUIRE_STATUS_IS(pool->Release(page), kFailedPrecondition);  // Double.
  REQUIRE(pool->Snapshot() == released);
  REQUIRE(released.free_stack.back() == page);
  REQUIRE_OK(pool->CheckInvariants());
}

TEST_CASE("writable allocates, keeps or copies") {
  auto pool = NewPool(4);

  SECTION("no page: a new page") {
    auto cow = pool->Writable(kNoPage);
    REQUIRE_OK(cow);
    REQUIRE(*cow == CopyOnWrite{Kind::kAllocated, 0, kNoPage});
    REQUIRE(pool->RefCount(0) == 1);
  }
  SECTION("sole reference: the page itself") {
    const PageId page = MustAllocate(*pool);
    const BlockPoolSnapshot before = pool->Snapshot();
    auto cow = pool->Writable(page);
    REQUIRE_OK(cow);
    REQUIRE(*cow == CopyOnWrite{Kind::kExisting, page, kNoPage});
    REQUIRE(pool->Snapshot() == before);
  }
  SECTION("shared: a copy, and the source loses one reference") {
    const PageId page = MustAllocate(*pool);
    REQUIRE_OK(pool->Retain(page));
    auto cow = pool->Writable(page);
    REQUIRE_OK(cow);
    REQUIRE(*cow == CopyOnWrite{Kind::kCopy, 1, page});
    REQUIRE(pool->RefCount(page) == 1);
    REQUIRE(pool->RefCount(1) == 1);
    REQUIRE(pool->stats().cow_copies == 1);
  }
  REQUIRE_OK(pool->CheckInvariants());
}

TEST_CASE("writable fails without a change") {
  auto pool = NewPool(2);
  const PageId shared = MustAllocate(*pool);
  REQUIRE_OK(pool->Retain(shared));
  const BlockPoolSnapshot before = pool->Snapshot();

  REQUIRE_STATUS_IS(pool->Writable(-2), kInvalidArgument);
  REQUIRE_STATUS_IS(pool->Writable(2), kInvalidArgument);
  REQUIRE_STATUS_IS(pool->Writable(1), kFailedPrecondition);  // Free.
  REQUIRE(pool->Snapshot() == before);

  MustAllocate(*pool);
  const BlockPoolSnapshot full = pool->Snapshot();
  // The destination is allocated before the source reference is dropped: a
  // full pool refuses the copy and the source keeps both references.
  REQUIRE_STATUS_IS(pool->Writable(shared), kResourceExhausted);
  REQUIRE_STATUS_IS(pool->Writable(kNoPage), kResourceExhausted);
  REQUIRE(pool->Snapshot() == full);
  REQUIRE(pool->RefCount(shared) == 2);
  REQUIRE_OK(pool->CheckInvariants());
}

TEST_CASE("a released cached page becomes evictable and is found again") {
  auto pool = NewPool(4);
  const PageId page = CachedPages(*pool, 1, 7)[0];
  REQUIRE(pool->NumCached() == 1);
  REQUIRE(pool->Lookup(TestHash(7)) == page);
  REQUIRE(pool->Lookup(TestHash(8)) == std::nullopt);

  REQUIRE_OK(pool->Release(page));
  REQUIRE(pool->RefCount(page) == 0);
  REQUIRE(pool->NumEvictable() == 1);
  REQUIRE(pool->NumFree() == 4);
  REQUIRE(pool->NumUsed() == 0);
  REQUIRE(pool->Lookup(TestHash(7)) == page);
  REQUIRE(pool->Snapshot().lru == std::vector<PageId>{page});

  // Retain refuses it: only a cache hit revives an evictable page.
  REQUIRE_STATUS_IS(pool->Retain(page), kFailedPrecondition);
  REQUIRE_STATUS_IS(pool->Writable(page), kFailedPrecondition);

  const BlockHash chain[] = {TestHash(7)};
  PageId hits[1] = {kNoPage};
  auto n = pool->AcquireCachedPrefix(chain, absl::MakeSpan(hits));
  REQUIRE_OK(n);
  REQUIRE(*n == 1);
  REQUIRE(hits[0] == page);
  REQUIRE(pool->RefCount(page) == 1);
  REQUIRE(pool->NumEvictable() == 0);
  REQUIRE(pool->stats().cache_hits == 1);
  REQUIRE(pool->stats().cache_revivals == 1);
  REQUIRE_OK(pool->CheckInvariants());
}

TEST_CASE("the prefix index finds every cached page after any removals") {
  // 8 pages in 16 index slots: every state has long probe runs, and pages
  // leave the index in every order (eviction, uncaching, rollback).
  auto pool = NewPool(8);
  std::mt19937 rng(3);
  uint32_t next_hash = 0;
  std::vector<PageId> used;
  for (int step = 0; step < 4000; ++step) {
    INFO("step " << step);
    const uint32_t dice = rng() % 4;
    if (dice == 0 && pool->NumFree() > 0) {
      used.push_back(MustAllocate(*pool));  // may evict the LRU head.
    } else if (dice == 1 && !used.empty()) {
      // Refused (FailedPrecondition) when the page is already cached.
      const absl::Status status =
          pool->RegisterCached(used[rng() % used.size()], TestHash(next_hash++))
              .status();
      REQUIRE((status.ok() || absl::IsFailedPrecondition(status)));
    } else if (dice == 2 && !used.empty()) {
      const size_t i = rng() % used.size();
      if (rng() % 2 == 0) {
        REQUIRE_OK(pool->Release(used[i]));  // cached pages turn evictable.
        used.erase(used.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        REQUIRE_OK(pool->Writable(used[i]).status());  // drops its hash.
      }
    } else if (dice == 3) {
      // Rolled-back evictions and registrations put pages back.
      const BlockPoolSnapshot before = pool->Snapshot();
      const BlockPool::Savepoint savepoint = pool->BeginTransaction();
      for (int k = 0; k < 3 && pool->NumFree() > 0; ++k) {
        auto page = pool->Allocate();
        REQUIRE_OK(page);
        REQUIRE_OK(pool->RegisterCached(*page, TestHash(next_hash++)).status());
      }
      REQUIRE_OK(pool->RollbackTransaction(savepoint));
      REQUIRE(pool->Snapshot() == before);
    }
    // CheckInvariants looks every cached page up by its hash.
    REQUIRE_OK(pool->CheckInvariants());
  }
  REQUIRE(pool->stats().evictions > 100);
}

// Without index_duplicates a second copy of a hash is cached only while it
// is used: it keeps the hash cached when the first copy is evicted (a
// router's chain through the hash stays whole), and it is freed, uncached,
// when it is released while the first copy is still cached.
TEST_CASE("a held second copy keeps its hash cached") {
  auto pool = NewPool(3);
  const PageId first = CachedPages(*pool, 1, 1)[0];
  const PageId second = MustAllocate(*pool);
  REQUIRE_OK(pool->RegisterCached(second, TestHash(1)));

  SECTION("the first copy is evicted: the second answers") {
    REQUIRE_OK(pool->Release(first));
    REQUIRE(MustAllocate(*pool) == 2);
    const BlockPoolSnapshot before = pool->Snapshot();
    const BlockPool::Savepoint savepoint = pool->BeginTransaction();
    REQUIRE(MustAllocate(*pool) == first);  // evicts it
    REQUIRE(pool->stats().evictions == 1);
    REQUIRE(pool->Lookup(TestHash(1)) == second);
    REQUIRE(pool->IsIndexedAs(second, TestHash(1)));
    REQUIRE(pool->Snapshot().duplicates.empty());
    REQUIRE_OK(pool->CheckInvariants());
    REQUIRE_OK(pool->RollbackTransaction(savepoint));
    REQUIRE(pool->Snapshot() == before);
    REQUIRE(MustAllocate(*pool) == first);
    // Now the only copy, it is kept when released.
    REQUIRE_OK(pool->Release(second));
    REQUIRE(pool->Snapshot().lru == std::vector<PageId>{second});
    REQUIRE(pool->NumCached() == 1);
  }
  SECTION("the second copy is released: it is freed") {
    const BlockPoolSnapshot before = pool->Snapshot();
    const BlockPool::Savepoint savepoint = pool->BeginTransaction();
    REQUIRE_OK(pool->Release(second));
    const BlockPoolSnapshot released = pool->Snapshot();
    REQUIRE(released.free_stack == std::vector<PageId>{2, second});
    REQUIRE(released.lru.empty());
    REQUIRE(released.duplicates.empty());
    REQUIRE(pool->CachedHash(second) == std::nullopt);
    REQUIRE(pool->Lookup(TestHash(1)) == first);
    REQUIRE_OK(pool->CheckInvariants());
    REQUIRE_OK(pool->RollbackTransaction(savepoint));
    REQUIRE(pool->Snapshot() == before);
  }
  SECTION("writing the first copy leaves the hash on the second") {
    auto cow = pool->Writable(first);
    REQUIRE_OK(cow);
    REQUIRE(cow->kind == Kind::kExisting);
    REQUIRE(pool->Lookup(TestHash(1)) == second);
    REQUIRE(pool->NumCached() == 1);
  }
  REQUIRE_OK(pool->CheckInvariants());
}

TEST_CASE("register cached keeps the first page of a hash") {
  auto pool = NewPool(4);
  const PageId first = CachedPages(*pool, 1, 1)[0];
  const PageId second = MustAllocate(*pool);
  const BlockPoolSnapshot before = pool->Snapshot();

  auto again = pool->RegisterCached(first, TestHash(1));
  REQUIRE_OK(again);
  REQUIRE(*again == first);
  REQUIRE(pool->Snapshot() == before);
  auto duplicate = pool->RegisterCached(second, TestHash(1));
  REQUIRE_OK(duplicate);
  REQUIRE(*duplicate == first);
  // `second` is linked behind `first` while it is held; no registration.
  const BlockPoolSnapshot behind = pool->Snapshot();
  REQUIRE(behind.duplicates == std::vector<std::vector<PageId>>{{0, 1}});
  REQUIRE(behind.stats == before.stats);
  REQUIRE(pool->Lookup(TestHash(1)) == first);

  REQUIRE_STATUS_IS(pool->RegisterCached(first, TestHash(2)),
                    kFailedPrecondition);
  REQUIRE_STATUS_IS(pool->RegisterCached(3, TestHash(2)), kFailedPrecondition);
  REQUIRE_STATUS_IS(pool->RegisterCached(kNoPage, TestHash(2)),
                    kInvalidArgument);
  REQUIRE_STATUS_IS(pool->RegisterCached(4, TestHash(2)), kInvalidArgument);
  REQUIRE(pool->Snapshot() == behind);
  REQUIRE(pool->stats().cache_registrations == 1);

  // An evictable page is not in use either.
  REQUIRE_OK(pool->Release(first));
  const BlockPoolSnapshot evictable = pool->Snapshot();
  REQUIRE_STATUS_IS(pool->RegisterCached(first, TestHash(1)),
                    kFailedPrecondition);
  REQUIRE(pool->Snapshot() == evictable);
  REQUIRE_OK(pool->CheckInvariants());
}

// vLLM's BlockPool: one free queue and every full block cached.
constexpr BlockPoolOptions kVllmOptions = {
    .eviction_order = EvictionOrder::kLeastRecentlyFreed,
    .index_duplicates = true};

TEST_CASE("vllm's order takes the least recently freed page, cached or not") {
  auto pool = NewPool(4, kVllmOptions);
  REQUIRE(pool->Snapshot().lru == std::vector<PageId>{0, 1, 2, 3});
  REQUIRE(pool->Snapshot().free_stack.empty());
  std::vector<PageId> pages(4);
  REQUIRE_OK(pool->AllocateN(absl::MakeSpan(pages)));
  REQUIRE(pages == std::vector<PageId>{0, 1, 2, 3});
  REQUIRE_OK(pool->RegisterCached(1, TestHash(1)));
  for (PageId page : {3, 1, 2}) REQUIRE_OK(pool->Release(page));
  REQUIRE(pool->NumFree() == 3);
  REQUIRE(pool->NumEvictable() == 3);  // The whole queue.
  REQUIRE(MustAllocate(*pool) == 3);   // Never cached, but freed first.
  REQUIRE(pool->Lookup(TestHash(1)) == 1);
  REQUIRE(MustAllocate(*pool) == 1);  // Evicted.
  REQUIRE(pool->stats().evictions == 1);
  REQUIRE_FALSE(pool->Lookup(TestHash(1)).has_value());
  REQUIRE(MustAllocate(*pool) == 2);
  REQUIRE_STATUS_IS(pool->Allocate(), kResourceExhausted);
  REQUIRE_OK(pool->CheckInvariants());
}

TEST_CASE("vllm's reset forgets the hashes and keeps the queue's order") {
  auto pool = NewPool(4, kVllmOptions);
  const std::vector<PageId> pages = CachedPages(*pool, 4, 1);
  for (PageId page : {2, 0, 3, 1}) REQUIRE_OK(pool->Release(page));
  REQUIRE_OK(pool->ResetPrefixCache());
  REQUIRE(pool->NumCached() == 0);
  REQUIRE(pool->Snapshot().lru == std::vector<PageId>{2, 0, 3, 1});
  REQUIRE(MustAllocate(*pool) == 2);
  REQUIRE(pool->stats().evictions == 0);
  REQUIRE_OK(pool->CheckInvariants());
}

TEST_CASE("duplicates are cached behind the first page of their hash") {
  auto pool = NewPool(6, kVllmOptions);
  std::vector<PageId> pages(3);
  REQUIRE_OK(pool->AllocateN(absl::MakeSpan(pages)));
  for (PageId page : pages) {
    auto first = pool->RegisterCached(page, TestHash(7));
    REQUIRE_OK(first);
    REQUIRE(*first == pages[0]);
  }
  REQUIRE(pool->NumCached() == 3);
  REQUIRE(pool->stats().cache_registrations == 3);
  REQUIRE(pool->Snapshot().duplicates ==
          std::vector<std::vector<PageId>>{{0, 1, 2}});
  REQUIRE(pool->Lookup(TestHash(7)) == 0);

  SECTION("the next one answers when the first leaves") {
    REQUIRE_OK(pool->Writable(0));  // Sole holder: uncached in place.
    REQUIRE(pool->Lookup(TestHash(7)) == 1);
    auto dropped = pool->Uncache(1);
    REQUIRE_OK(dropped);
    REQUIRE(*dropped);
    REQUIRE(pool->Lookup(TestHash(7)) == 2);
    REQUIRE(pool->Snapshot().duplicates.empty());
    REQUIRE(pool->NumCached() == 1);
  }
  SECTION("a rollback puts each page back in its place") {
    const BlockPoolSnapshot before = pool->Snapshot();
    const BlockPool::Savepoint savepoint = pool->BeginTransaction();
    REQUIRE_OK(pool->Uncache(1));
    REQUIRE_OK(pool->Uncache(0));
    for (PageId page : pages) REQUIRE_OK(pool->Release(page));
    REQUIRE(MustAllocate(*pool) == 3);
    REQUIRE_OK(pool->RegisterCached(3, TestHash(7)));
    REQUIRE(pool->Lookup(TestHash(7)) == 2);
    REQUIRE_OK(pool->CheckInvariants());
    REQUIRE_OK(pool->RollbackTransaction(savepoint));
    REQUIRE(pool->Snapshot() == before);
  }
  SECTION("eviction drops one page of the hash at a time") {
    for (PageId page : {1, 0, 2}) REQUIRE_OK(pool->Release(page));
    std::vector<PageId> more(3);
    REQUIRE_OK(pool->AllocateN(absl::MakeSpan(more)));  // 3, 4, 5: uncached.
    REQUIRE(pool->Lookup(TestHash(7)) == 0);
    REQUIRE(MustAllocate(*pool) == 1);
    REQUIRE(pool->Lookup(TestHash(7)) == 0);
    REQUIRE(MustAllocate(*pool) == 0);
    REQUIRE(pool->Lookup(TestHash(7)) == 2);
    REQUIRE(pool->stats().evictions == 2);
  }
  REQUIRE_OK(pool->CheckInvariants());
}

TEST_CASE("uncache drops a hash, used or evictable, and refuses bad pages") {
  const bool one_queue = GENERATE(false, true);
  auto pool = NewPool(
      4, {.eviction_order = one_queue ? EvictionOrder::kLeastRecentlyFreed
                                      : EvictionOrder::kNeverCachedFirst});
  const std::vector<PageId> pages = CachedPages(*pool, 2, 1);
  REQUIRE_OK(pool->Release(pages[1]));
  const BlockPoolSnapshot before = pool->Snapshot();
  REQUIRE_STATUS_IS(pool->Uncache(kNoPage), kInvalidArgument);
  REQUIRE_STATUS_IS(pool->Uncache(4), kInvalidArgument);
  REQUIRE(pool->Snapshot() == before);
  auto not_cached = pool->Uncache(2);
  REQUIRE_OK(not_cached);
  REQUIRE_FALSE(*not_cached);
  REQUIRE(pool->Snapshot() == before);

  const BlockPool::Savepoint savepoint = pool->BeginTransaction();
  REQUIRE_OK(pool->Uncache(pages[0]));  // Used: stays used.
  REQUIRE(pool->RefCount(pages[0]) == 1);
  REQUIRE_OK(pool->Uncache(pages[1]));  // Evictable: free now.
  REQUIRE(pool->NumCached() == 0);
  REQUIRE(pool->NumFree() == 3);
  REQUIRE(pool->Snapshot().lru.size() == (one_queue ? 3u : 0u));
  REQUIRE_OK(pool->CheckInvariants());
  REQUIRE_OK(pool->RollbackTransaction(savepoint));
  REQUIRE(pool->Snapshot() == before);
  REQUIRE_OK(pool->CheckInvariants());
}

TEST_CASE("acquire cached prefix stops at the first miss") {
  auto pool = NewPool(8);
  const std::vector<PageId> pages = CachedPages(*pool, 3, 10);
  REQUIRE_OK(pool->Release(pages[1]));  // Evictable; the others stay used.

  const BlockHash chain[] = {TestHash(10), TestHash(11), TestHash(99),
                             TestHash(12)};
  std::vector<PageId> hits(4, kNoPage);
  auto n = pool->AcquireCachedPrefix(chain, absl::MakeSpan(hits));
  REQUIRE_OK(n);
  REQUIRE(*n == 2);
  REQUIRE(hits[0] == pages[0]);
  REQUIRE(hits[1] == pages[1]);
  REQUIRE(pool->RefCount(pages[0]) == 2);
  REQUIRE(pool->RefCount(pages[1]) == 1);
  REQUIRE(pool->RefCount(pages[2]) == 1);  // After the miss: untouched.
  REQUIRE(pool->stats().cache_hits == 2);
  REQUIRE(pool->stats().cache_revivals == 1);

  const BlockHash miss[] = {TestHash(50)};
  auto none = pool->AcquireCachedPrefix(miss, absl::MakeSpan(hits));
  REQUIRE_OK(none);
  REQUIRE(*none == 0);
  REQUIRE_OK(pool->CheckInvariants());
}

TEST_CASE("acquiring cached pages fails without a change") {
  auto pool = NewPool(8, {.max_refcount = 2});
  const std::vector<PageId> pages = CachedPages(*pool, 3, 10);
  REQUIRE_OK(pool->Release(pages[0]));  // Evictable.
  REQUIRE_OK(pool->Retain(pages[2]));   // At the maximum.
  auto uncached = pool->Allocate();     // Used, never cached.
  REQUIRE_OK(uncached);
  const BlockPoolSnapshot before = pool->Snapshot();

  // AcquireCached: each refusal comes after an accepted page (a revival, a
  // reference) that it undoes.
  const PageId at_maximum[] = {pages[0], pages[1], pages[2]};
  REQUIRE_STATUS_IS(pool->AcquireCached(at_maximum), kFailedPrecondition);
  REQUIRE(pool->Snapshot() == before);
  const PageId repeated_page[] = {pages[1], pages[1]};
  REQUIRE_STATUS_IS(pool->AcquireCached(repeated_page), kFailedPrecondition);
  REQUIRE(pool->Snapshot() == before);
  const PageId not_cached[] = {pages[0], *uncached};
  REQUIRE_STATUS_IS(pool->AcquireCached(not_cached), kFailedPrecondition);
  REQUIRE(pool->Snapshot() == before);
  const PageId free_page[] = {pages[1], 7};
  REQUIRE_STATUS_IS(pool->AcquireCached(free_page), kFailedPrecondition);
  REQUIRE(pool->Snapshot() == before);
  const PageId out_of_range[] = {pages[0], 8};
  REQUIRE_STATUS_IS(pool->AcquireCached(out_of_range), kInvalidArgument);
  const PageId negative[] = {kNoPage};
  REQUIRE_STATUS_IS(pool->AcquireCached(negative), kInvalidArgument);
  REQUIRE(pool->Snapshot() == before);

  // AcquireCachedPrefix.
  const BlockHash chain[] = {TestHash(10), TestHash(11), TestHash(12)};
  std::vector<PageId> short_out(2);
  REQUIRE_STATUS_IS(pool->AcquireCachedPrefix(chain, absl::MakeSpan(short_out)),
                    kInvalidArgument);
  std::vector<PageId> out(3);
  REQUIRE_STATUS_IS(pool->AcquireCachedPrefix(chain, absl::MakeSpan(out)),
                    kFailedPrecondition);
  REQUIRE(pool->Snapshot() == before);

  // A repeated hash takes one reference per occurrence: the second one would
  // pass the maximum.
  const BlockHash repeated[] = {TestHash(11), TestHash(11), TestHash(11)};
  REQUIRE_STATUS_IS(pool->AcquireCachedPrefix(repeated, absl::MakeSpan(out)),
                    kFailedPrecondition);
  REQUIRE(pool->Snapshot() == before);
  REQUIRE_OK(pool->CheckInvariants());
}

TEST_CASE("acquire cached takes found pages, reviving evictable ones") {
  auto pool = NewPool(8);
  const std::vector<PageId> pages = CachedPages(*pool, 3, 10);
  REQUIRE_OK(pool->Release(pages[1]));  // Evictable.
  REQUIRE_OK(pool->Release(pages[2]));  // Evictable, LRU tail.

  // A repeated page takes one reference per occurrence.
  const PageId take[] = {pages[0], pages[1], pages[1]};
  REQUIRE_OK(pool->AcquireCached(take));
  REQUIRE(pool->RefCount(pages[0]) == 2);
  REQUIRE(pool->RefCount(pages[1]) == 2);
  REQUIRE(pool->RefCount(pages[2]) == 0);
  REQUIRE(pool->NumEvictable() == 1);
  REQUIRE(pool->stats().cache_hits == 3);
  REQUIRE(pool->stats().cache_revivals == 1);
  REQUIRE(pool->Lookup(TestHash(11)) == pages[1]);  // Still cached.
  REQUIRE_OK(pool->AcquireCached({}));
  REQUIRE_OK(pool->CheckInvariants());
}

TEST_CASE("allocate evicts the least recently released cached page last") {
  auto pool = NewPool(4);
  // One sequence of three cached pages, released last page first: the
  // continuation is evicted before the prefix.
  const std::vector<PageId> seq = CachedPages(*pool, 3, 0);
  const PageId plain = MustAllocate(*pool);
  for (int i = 2; i >= 0; --i) REQUIRE_OK(pool->Release(seq[i]));
  REQUIRE(pool->Snapshot().lru == std::vector<PageId>{seq[2], seq[1], seq[0]});
  REQUIRE_OK(pool->Release(plain));

  REQUIRE(MustAllocate(*pool) == plain);  // Plain free pages go first.
  REQUIRE(pool->stats().evictions == 0);
  REQUIRE(MustAllocate(*pool) == seq[2]);
  REQUIRE(pool->stats().evictions == 1);
  REQUIRE(pool->Lookup(TestHash(2)) == std::nullopt);
  REQUIRE(pool->Lookup(TestHash(0)) == seq[0]);
  REQUIRE(pool->NumCached() == 2);
  REQUIRE(MustAllocate(*pool) == seq[1]);
  REQUIRE(MustAllocate(*pool) == seq[0]);
  REQUIRE(pool->NumCached() == 0);
  REQUIRE(pool->stats().evictions == 3);
  REQUIRE_STATUS_IS(pool->Allocate(), kResourceExhausted);
  REQUIRE_OK(pool->CheckInvariants());
}

TEST_CASE("a cache hit moves a page out of the lru list, not to its end") {
  auto pool = NewPool(3);
  const std::vector<PageId> pages = CachedPages(*pool, 3, 0);
  for (PageId page : pages) REQUIRE_OK(pool->Release(page));
  const BlockHash middle[] = {TestHash(1)};
  PageId hit = kNoPage;
  REQUIRE_OK(pool->AcquireCachedPrefix(middle, absl::MakeSpan(&hit, 1)));
  REQUIRE(pool->Snapshot().lru == std::vector<PageId>{pages[0], pages[2]});
  REQUIRE_OK(pool->Release(hit));
  REQUIRE(pool->Snapshot().lru ==
          std::vector<PageId>{pages[0], pages[2], pages[1]});
  REQUIRE_OK(pool->CheckInvariants());
}

TEST_CASE("writable uncaches a sole page and copies a shared one") {
  auto pool = NewPool(4);
  const std::vector<PageId> pages = CachedPages(*pool, 2, 0);

  REQUIRE_OK(pool->Retain(pages[1]));
  auto copy = pool->Writable(pages[1]);
  REQUIRE_OK(copy);
  REQUIRE(copy->kind == Kind::kCopy);
  REQUIRE(pool->Lookup(TestHash(1)) == pages[1]);  // Its content is intact.

  auto in_place = pool->Writable(pages[0]);
  REQUIRE_OK(in_place);
  REQUIRE(*in_place == CopyOnWrite{Kind::kExisting, pages[0], kNoPage});
  REQUIRE(pool->Lookup(TestHash(0)) == std::nullopt);
  REQUIRE(pool->NumCached() == 1);
  REQUIRE_OK(pool->Release(pages[0]));
  REQUIRE(pool->Snapshot().free_stack.back() == pages[0]);
  REQUIRE_OK(pool->CheckInvariants());
}

TEST_CASE("reset prefix cache frees evictable pages and forgets used ones") {
  auto pool = NewPool(5);
  const std::vector<PageId> pages = CachedPages(*pool, 4, 0);
  REQUIRE_OK(pool->Release(pages[2]));
  REQUIRE_OK(pool->Release(pages[0]));
  // LRU: pages[2], pages[0]. Free stack: [4].

  SECTION("outside a transaction") {
    REQUIRE_OK(pool->ResetPrefixCache());
    REQUIRE(pool->NumCached() == 0);
    REQUIRE(pool->NumEvictable() == 0);
    REQUIRE(pool->NumFree() == 3);
    REQUIRE(pool->Snapshot().free_stack ==
            std::vector<PageId>{4, pages[2], pages[0]});
    REQUIRE(pool->Lookup(TestHash(1)) == std::nullopt);
    REQUIRE(pool->RefCount(pages[1]) == 1);
    REQUIRE_OK(pool->Release(pages[1]));  // Now a plain free page.
    REQUIRE(pool->Snapshot().free_stack.back() == pages[1]);
    // The index works as before.
    REQUIRE_OK(pool->RegisterCached(pages[3], TestHash(9)));
    REQUIRE(pool->Lookup(TestHash(9)) == pages[3]);
  }
  SECTION("refused inside a transaction") {
    const BlockPoolSnapshot before = pool->Snapshot();
    const BlockPool::Savepoint savepoint = pool->BeginTransaction();
    REQUIRE_STATUS_IS(pool->ResetPrefixCache(), kFailedPrecondition);
    REQUIRE(pool->Snapshot() == before);
    REQUIRE_OK(pool->CommitTransaction(savepoint));
  }
  REQUIRE_OK(pool->CheckInvariants());
}

TEST_CASE("rollback restores the exact state") {
  auto pool = NewPool(6, {.journal_reserve = 2});  // The journal must grow.
  const std::vector<PageId> cached = CachedPages(*pool, 4, 0);
  const PageId shared = MustAllocate(*pool);
  REQUIRE_OK(pool->Retain(shared));
  REQUIRE_OK(pool->Release(cached[3]));
  REQUIRE_OK(pool->Release(cached[1]));
  REQUIRE_OK(pool->Release(cached[0]));
  // Used: cached[2] (cached), shared x2. LRU: cached[3], cached[1], cached[0].
  const BlockPoolSnapshot before = pool->Snapshot();

  const BlockPool::Savepoint savepoint = pool->BeginTransaction();
  REQUIRE(pool->transaction_depth() == 1);
  MustAllocate(*pool);  // The last plain free page.
  MustAllocate(*pool);  // Evicts cached[3].
  const BlockHash middle[] = {TestHash(1)};
  PageId hit = kNoPage;
  REQUIRE_OK(pool->AcquireCachedPrefix(middle, absl::MakeSpan(&hit, 1)));
  REQUIRE_OK(pool->Writable(cached[2]));  // Uncaches it.
  REQUIRE_OK(pool->RegisterCached(cached[2], TestHash(20)));
  REQUIRE_OK(pool->Writable(shared));  // Copies, evicting cached[0].
  REQUIRE_OK(pool->Release(hit));      // Back to the LRU tail.
  REQUIRE_OK(pool->Retain(cached[2]));
  REQUIRE_OK(pool->Release(cached[2]));
  REQUIRE_OK(pool->Release(shared));  // To the free stack.
  REQUIRE_OK(pool->CheckInvariants());
  REQUIRE(pool->stats().evictions == 2);
  REQUIRE(!(pool->Snapshot() == before));

  REQUIRE_OK(pool->RollbackTransaction(savepoint));
  REQUIRE(pool->transaction_depth() == 0);
  REQUIRE(pool->Snapshot() == before);
  REQUIRE_OK(pool->CheckInvariants());
  // The rolled-back pool behaves as before: the same evictions in order.
  REQUIRE(MustAllocate(*pool) == 5);
  REQUIRE(MustAllocate(*pool) == cached[3]);
  REQUIRE(MustAllocate(*pool) == cached[1]);
}

TEST_CASE("transactions nest and commit keeps the changes") {
  auto pool = NewPool(4);
  const BlockPool::Savepoint outer = pool->BeginTransaction();
  const PageId a = MustAllocate(*pool);
  const BlockPoolSnapshot after_a = pool->Snapshot();

  const BlockPool::Savepoint inner = pool->BeginTransaction();
  REQUIRE(pool->transaction_depth() == 2);
  MustAllocate(*pool);
  // Only the innermost transaction can be closed.
  const BlockPoolSnapshot inside = pool->Snapshot();
  REQUIRE_STATUS_IS(pool->CommitTransaction(outer), kFailedPrecondition);
  REQUIRE_STATUS_IS(pool->RollbackTransaction(outer), kFailedPrecondition);
  REQUIRE(pool->Snapshot() == inside);
  REQUIRE(pool->transaction_depth() == 2);
  REQUIRE_OK(pool->RollbackTransaction(inner));
  REQUIRE(pool->Snapshot() == after_a);

  const BlockPool::Savepoint kept = pool->BeginTransaction();
  const PageId b = MustAllocate(*pool);
  REQUIRE_OK(pool->CommitTransaction(kept));
  REQUIRE_OK(pool->CommitTransaction(outer));
  REQUIRE(pool->transaction_depth() == 0);
  REQUIRE(pool->RefCount(a) == 1);
  REQUIRE(pool->RefCount(b) == 1);
  REQUIRE_STATUS_IS(pool->CommitTransaction(outer), kFailedPrecondition);
  REQUIRE_STATUS_IS(pool->RollbackTransaction(outer), kFailedPrecondition);
  REQUIRE_OK(pool->CheckInvariants());
}

TEST_CASE("stats count allocations, copies, hits and the peak") {
  auto pool = NewPool(4);
  const std::vector<PageId> pages = CachedPages(*pool, 2, 0);
  REQUIRE_OK(pool->Retain(pages[0]));
  REQUIRE_OK(pool->Writable(pages[0]));
  REQUIRE_OK(pool->Release(pages[1]));
  const BlockHash chain[] = {TestHash(0), TestHash(1)};
  PageId hits[2];
  REQUIRE_OK(pool->AcquireCachedPrefix(chain, absl::MakeSpan(hits)));
  const BlockPoolStats expected{.allocations = 3,
                                .evictions = 0,
                                .cow_copies = 1,
                                .cache_hits = 2,
                                .cache_revivals = 1,
                                .cache_registrations = 2,
                                .peak_used = 3};
  REQUIRE(pool->stats() == expected);
}

TEST_CASE("snapshot debug string shows every part") {
  auto pool = NewPool(3);
  CachedPages(*pool, 1, 0x01020304);
  const std::string text = pool->Snapshot().DebugString();
  REQUIRE(text.find("refcounts: [1 0 0]") != std::string::npos);
  REQUIRE(text.find("free_stack: [2 1]") != std::string::npos);
  REQUIRE(text.find("cached: [0:04030201]") != std::string::npos);
  REQUIRE(text.find("peak_used=1") != std::string::npos);
}

TEST_CASE("steady-state operations do not allocate memory") {
  for (int32_t num_pages : {64, 100000}) {
    CAPTURE(num_pages);
    auto pool = NewPool(num_pages);
    std::vector<PageId> pages(num_pages);
    std::vector<PageId> hits(8);
    std::vector<BlockHash> chain(8);
    bool ok = true;
    const int64_t before = testing::HeapAllocations();
    for (int round = 0; round < 4; ++round) {
      // Fill the pool but one page (for the copy below), caching most pages
      // under fresh hashes so the index keeps erasing (eviction) and
      // inserting (registration).
      ok &= pool->AllocateN(absl::MakeSpan(pages).first(num_pages - 1)).ok();
      for (int32_t i = 0; i < num_pages - 1; ++i) {
        if (i % 8 != 7) {
          const uint32_t id = static_cast<uint32_t>(round * num_pages + i);
          ok &= pool->RegisterCached(pages[i], TestHash(id)).ok();
        }
      }
      const BlockPool::Savepoint savepoint = pool->BeginTransaction();
      ok &= pool->Retain(pages[0]).ok();
      ok &= pool->Writable(pages[0]).ok();
      ok &= pool->RollbackTransaction(savepoint).ok();
      for (int32_t i = num_pages - 2; i >= 0; --i) {
        ok &= pool->Release(pages[i]).ok();
      }
      for (int i = 0; i < 8; ++i) {
        chain[i] = TestHash(static_cast<uint32_t>(round * num_pages + i));
      }
      ok &= pool->AcquireCachedPrefix(chain, absl::MakeSpan(hits)).ok();
      for (int i = 0; i < 7; ++i) ok &= pool->Release(hits[i]).ok();
    }
    const int64_t allocated = testing::HeapAllocations() - before;
    REQUIRE(ok);
    REQUIRE(allocated == 0);
    REQUIRE(pool->stats().evictions > 0);
    REQUIRE_OK(pool->CheckInvariants());
  }
}

// Host tier ------------------------------------------------------------------

using Direction = HostCopy::Direction;

HostCopy Store(PageId device, HostPageId host) {
  return {device, host, Direction::kDeviceToHost};
}
HostCopy Load(HostPageId host, PageId device) {
  return {device, host, Direction::kHostToDevice};
}

std::vector<HostCopy> TakeCopies(BlockPool& pool) {
  std::vector<HostCopy> copies;
  REQUIRE_OK(pool.TakeHostCopies(copies));
  return copies;
}

// A pool of `num_pages` with a host tier of `host_pages`, every page cached
// under TestHash(100 + page), evictable in LRU order 0, 1, ..., in a closed
// copy batch (so their KV counts as computed).
std::unique_ptr<BlockPool> CachedPoolWithHost(
    int32_t num_pages, int32_t host_pages,
    HostWritePolicy policy = HostWritePolicy::kWriteBack) {
  auto pool = NewPool(num_pages,
                      {.host_pages = host_pages, .host_write_policy = policy});
  const std::vector<PageId> pages = CachedPages(*pool, num_pages, 100);
  for (const PageId page : pages) REQUIRE_OK(pool->Release(page));
  TakeCopies(*pool);
  TakeCopies(*pool);  // the stores written through, if any.
  REQUIRE(pool->host_copies().empty());
  return pool;
}

TEST_CASE("create rejects a host tier out of range") {
  REQUIRE_STATUS_IS(BlockPool::Create(4, {.host_pages = -1}), kInvalidArgument);
  const auto big = BlockPool::Create(4, {.host_pages = kMaxNumPages + 1});
  REQUIRE_STATUS_IS(big, kInvalidArgument);
  REQUIRE(std::string(big.status().message()).find("host_pages") !=
          std::string::npos);
  auto pool = NewPool(4, {.host_pages = 8});
  REQUIRE(pool->host_pages() == 8);
  REQUIRE(pool->NumHostCached() == 0);
  REQUIRE(NewPool(4)->host_pages() == 0);
  REQUIRE_OK(pool->CheckInvariants());
}

TEST_CASE("an evicted cached page is stored in the host tier, then loaded") {
  auto pool = CachedPoolWithHost(2, 4);
  // Page 0, the LRU head, is evicted: its KV goes to host page 0.
  REQUIRE(MustAllocate(*pool) == 0);
  REQUIRE(pool->HostLookup(TestHash(100)) == 0);
  REQUIRE(!pool->Lookup(TestHash(100)).has_value());
  REQUIRE(pool->stats().host_stores == 1);
  REQUIRE(TakeCopies(*pool) == std::vector<HostCopy>{Store(0, 0)});
  REQUIRE_OK(pool->Release(0));  // uncached: back on the free stack.

  // A hit in the host tier loads the page into a new device page, cached.
  auto loaded = pool->LoadFromHost(TestHash(100));
  REQUIRE_OK(loaded);
  REQUIRE(*loaded == 0);
  REQUIRE(pool->RefCount(0) == 1);
  REQUIRE(pool->Lookup(TestHash(100)) == 0);
  REQUIRE(pool->HostLookup(TestHash(100)) == 0);  // the host copy stays.
  REQUIRE(pool->stats().host_loads == 1);
  REQUIRE(std::vector<HostCopy>(pool->host_copies().begin(),
                                pool->host_copies().end()) ==
          std::vector<HostCopy>{Load(0, 0)});
  REQUIRE_OK(pool->CheckInvariants());
}

TEST_CASE("a load that evicts lists the store before it") {
  auto pool = CachedPoolWithHost(2, 4);
  REQUIRE_OK(pool->Release(MustAllocate(*pool)));  // evicts and stores 0.
  TakeCopies(*pool);
  REQUIRE(MustAllocate(*pool) == 0);  // the free page: the load must evict.
  auto loaded = pool->LoadFromHost(TestHash(100));
  REQUIRE_OK(loaded);
  REQUIRE(*loaded == 1);
  REQUIRE(TakeCopies(*pool) == std::vector<HostCopy>{Store(1, 1), Load(0, 1)});
  REQUIRE(pool->HostLookup(TestHash(101)) == 1);
  REQUIRE_OK(pool->CheckInvariants());
}

TEST_CASE("a page cached in the open batch is not stored when evicted") {
  auto pool = NewPool(1, {.host_pages = 2});
  const PageId page = MustAllocate(*pool);
  REQUIRE_OK(pool->RegisterCached(page, TestHash(1)));
  REQUIRE_OK(pool->Release(page));
  // Its KV is computed by this batch's forward pass, which has not run.
  REQUIRE(MustAllocate(*pool) == page);
  REQUIRE(pool->NumHostCached() == 0);
  REQUIRE(pool->stats().host_store_skips == 1);
  REQUIRE(pool->host_copies().empty());
  // Cached in one batch and evicted in the next, it is stored.
  REQUIRE_OK(pool->RegisterCached(page, TestHash(2)));
  REQUIRE_OK(pool->Release(page));
  TakeCopies(*pool);
  REQUIRE(MustAllocate(*pool) == page);
  REQUIRE(TakeCopies(*pool) == std::vector<HostCopy>{Store(page, 0)});
  REQUIRE(pool->HostLookup(TestHash(2)) == 0);
  REQUIRE_OK(pool->CheckInvariants());
}

TEST_CASE("copy batch numbers start again with no stamp of the old ones") {
  using internal::BlockPoolPeer;
  SECTION("a device page cached in the old batch 1 is stored in the new one") {
    auto pool = CachedPoolWithHost(2, 2);  // batch 1 cached pages 0 and 1.
    BlockPoolPeer::SetCopyBatch(*pool, BlockPoolPeer::kLastCopyBatch);
    TakeCopies(*pool);  // batch 1 again.
    REQUIRE(MustAllocate(*pool) == 0);
    REQUIRE(pool->stats().host_store_skips == 0);
    REQUIRE(TakeCopies(*pool) == std::vector<HostCopy>{Store(0, 0)});
  }
  SECTION("a host page stored into by the old batch 3 is evicted in the new") {
    auto pool = CachedPoolWithHost(2, 1);
    REQUIRE(MustAllocate(*pool) == 0);  // batch 3 stores 100 in host page 0.
    REQUIRE(TakeCopies(*pool) == std::vector<HostCopy>{Store(0, 0)});
    BlockPoolPeer::SetCopyBatch(*pool, BlockPoolPeer::kLastCopyBatch);
    for (int batch = 1; batch <= 3; ++batch) TakeCopies(*pool);
    REQUIRE(MustAllocate(*pool) == 1);
    REQUIRE(pool->stats().host_store_skips == 0);
    REQUIRE(pool->stats().host_evictions == 1);
    REQUIRE(pool->HostLookup(TestHash(101)) == 0);
    REQUIRE(TakeCopies(*pool) == std::vector<HostCopy>{Store(1, 0)});
  }
}

TEST_CASE("a key the host tier holds is not stored again, nor moved") {
  auto pool = CachedPoolWithHost(2, 2);
  REQUIRE_OK(pool->Release(MustAllocate(*pool)));  // stores 100 in host 0.
  TakeCopies(*pool);
  auto loaded = pool->LoadFromHost(TestHash(100));  // into free page 0.
  REQUIRE_OK(loaded);
  REQUIRE(*loaded == 0);
  REQUIRE_OK(pool->Release(*loaded));
  REQUIRE(TakeCopies(*pool) == std::vector<HostCopy>{Load(0, 0)});
  // Evicting page 1 stores 101 in host page 1; evicting page 0 again finds
  // its key in host page 0: no copy, and the host LRU order stays.
  PageId pages[2];
  REQUIRE_OK(pool->AllocateN(absl::MakeSpan(pages)));
  REQUIRE(pages[0] == 1);
  REQUIRE(pages[1] == 0);
  REQUIRE(TakeCopies(*pool) == std::vector<HostCopy>{Store(1, 1)});
  REQUIRE(pool->stats().host_stores == 2);
  REQUIRE(pool->Snapshot().host_lru == std::vector<HostPageId>{0, 1});
  REQUIRE_OK(pool->CheckInvariants());
}

TEST_CASE("a store evicts a host page the batch does not use, if any") {
  // Host pages 0, 1 and 2 hold 100, 101 and 102; 101 is loaded back and
  // released (batch taken), then 103 and 104 are cached on the device.
  auto pool = CachedPoolWithHost(3, 3);
  PageId pages[3];
  REQUIRE_OK(pool->AllocateN(absl::MakeSpan(pages)));
  for (const PageId page : pages) REQUIRE_OK(pool->Release(page));
  TakeCopies(*pool);
  auto loaded = pool->LoadFromHost(TestHash(101));
  REQUIRE_OK(loaded);
  REQUIRE_OK(pool->Release(*loaded));
  TakeCopies(*pool);
  const std::vector<PageId> cached = CachedPages(*pool, 2, 103);
  for (const PageId page : cached) REQUIRE_OK(pool->Release(page));
  TakeCopies(*pool);
  REQUIRE(pool->Snapshot().host_lru == std::vector<HostPageId>{0, 2, 1});
  // The batch uses 100's host page for a load. Evicting 101 (held) moves
  // nothing; 103 and 104 take the host pages of 102 and 101, which the
  // batch does not use, and none is skipped.
  REQUIRE_OK(pool->UseHostPages(std::vector<BlockHash>{TestHash(100)}));
  REQUIRE_OK(pool->AllocateN(absl::MakeSpan(pages)));
  REQUIRE(pool->stats().host_store_skips == 0);
  REQUIRE(pool->HostLookup(TestHash(100)) == 0);
  REQUIRE(pool->HostLookup(TestHash(103)) == 2);
  REQUIRE(pool->HostLookup(TestHash(104)) == 1);
  REQUIRE(pool->Snapshot().host_used == std::vector<HostPageId>{0, 1, 2});
  REQUIRE_OK(pool->CheckInvariants());
}

TEST_CASE("a host tier full of the open batch's pages evicts none of them") {
  auto pool = CachedPoolWithHost(3, 2);
  PageId pages[3];
  REQUIRE_OK(pool->AllocateN(absl::MakeSpan(pages)));  // evicts 0, 1, 2.
  // Both host pages hold this batch's stores: 102 finds no room.
  REQUIRE(pool->HostLookup(TestHash(100)) == 0);
  REQUIRE(pool->HostLookup(TestHash(101)) == 1);
  REQUIRE(!pool->HostLookup(TestHash(102)).has_value());
  REQUIRE(pool->stats().host_store_skips == 1);
  REQUIRE(pool->stats().host_evictions == 0);
  // In the next batch the host LRU head (100) makes room.
  REQUIRE_OK(pool->RegisterCached(pages[2], TestHash(103)));
  REQUIRE_OK(pool->Release(pages[2]));
  TakeCopies(*pool);
  REQUIRE(MustAllocate(*pool) == pages[2]);
  REQUIRE(!pool->HostLookup(TestHash(100)).has_value());
  REQUIRE(pool->HostLookup(TestHash(103)) == 0);
  REQUIRE(pool->stats().host_evictions == 1);
  REQUIRE(TakeCopies(*pool) == std::vector<HostCopy>{Store(pages[2], 0)});
  REQUIRE_OK(pool->CheckInvariants());
}

TEST_CASE("a page loaded in the open batch is parked when released") {
  auto pool = CachedPoolWithHost(2, 2);
  REQUIRE_OK(pool->Release(MustAllocate(*pool)));  // stores 100.
  TakeCopies(*pool);
  auto loaded = pool->LoadFromHost(TestHash(100));
  REQUIRE_OK(loaded);
  const int32_t free_before = pool->NumFree();
  // Its load is still to run: released, it is not handed out in the batch.
  REQUIRE_OK(pool->Release(*loaded));
  REQUIRE(pool->RefCount(*loaded) == 1);
  REQUIRE(pool->NumFree() == free_before);
  REQUIRE(pool->parked_pages() ==
          absl::MakeConstSpan(std::vector<PageId>{*loaded}));
  // A hit may still take it.
  REQUIRE_OK(pool->AcquireCached(absl::MakeConstSpan(&*loaded, 1)));
  REQUIRE(pool->RefCount(*loaded) == 2);
  REQUIRE_OK(pool->Release(*loaded));
  REQUIRE_OK(pool->CheckInvariants());
  REQUIRE_STATUS_IS(pool->ResetPrefixCache(), kFailedPrecondition);
  // Taking the batch releases the pool's reference: evictable now.
  TakeCopies(*pool);
  REQUIRE(pool->RefCount(*loaded) == 0);
  REQUIRE(pool->parked_pages().empty());
  REQUIRE(pool->NumFree() == free_before + 1);
  REQUIRE_OK(pool->CheckInvariants());
}

TEST_CASE("a copy-on-write source released in the open batch is parked") {
  // The batch's loads run before its copies on write: a load into the
  // source would overwrite the KV its copy is still to read.
  auto pool = CachedPoolWithHost(4, 4);
  const PageId source = MustAllocate(*pool);  // evicts 100 to the host.
  TakeCopies(*pool);
  REQUIRE_OK(pool->Retain(source));
  auto cow = pool->Writable(source);
  REQUIRE_OK(cow);
  REQUIRE(cow->kind == CopyOnWrite::Kind::kCopy);
  REQUIRE(cow->source == source);
  const int32_t free_before = pool->NumFree();
  REQUIRE_OK(pool->Release(source));  // its last holder leaves.
  REQUIRE(pool->RefCount(source) == 1);
  REQUIRE(pool->NumFree() == free_before);
  REQUIRE(pool->parked_pages() ==
          absl::MakeConstSpan(std::vector<PageId>{source}));
  REQUIRE_OK(pool->CheckInvariants());
  auto loaded = pool->LoadFromHost(TestHash(100));
  REQUIRE_OK(loaded);
  REQUIRE(*loaded != source);
  // Taken, the batch's copies are the caller's to run: the source is free.
  TakeCopies(*pool);
  REQUIRE(pool->RefCount(source) == 0);
  REQUIRE(pool->parked_pages().empty());
  REQUIRE_OK(pool->CheckInvariants());
  // Without a host tier there are no loads and no batches to wait for.
  auto plain = NewPool(2);
  const PageId shared = MustAllocate(*plain);
  REQUIRE_OK(plain->Retain(shared));
  REQUIRE_OK(plain->Writable(shared));
  REQUIRE_OK(plain->Release(shared));
  REQUIRE(plain->RefCount(shared) == 0);
  REQUIRE(plain->parked_pages().empty());
}

TEST_CASE("write-through stores a page in the batch after it is cached") {
  auto pool = NewPool(2, {.host_pages = 4,
                          .host_write_policy = HostWritePolicy::kWriteThrough});
  const PageId page = MustAllocate(*pool);
  REQUIRE_OK(pool->RegisterCached(page, TestHash(1)));
  REQUIRE(pool->Snapshot().write_through == std::vector<PageId>{page});
  // Its KV is computed by the forward pass after this batch's copies: the
  // store goes into the next batch.
  REQUIRE(TakeCopies(*pool).empty());
  REQUIRE(pool->HostLookup(TestHash(1)) == 0);
  REQUIRE(TakeCopies(*pool) == std::vector<HostCopy>{Store(page, 0)});
  // Evicting it then moves nothing.
  REQUIRE_OK(pool->Release(page));
  PageId pages[2];
  REQUIRE_OK(pool->AllocateN(absl::MakeSpan(pages)));
  REQUIRE(pool->host_copies().empty());
  REQUIRE(pool->stats().host_stores == 1);
  REQUIRE_OK(pool->CheckInvariants());
}

TEST_CASE("a rolled-back transaction undoes its tier moves") {
  for (const HostWritePolicy policy :
       {HostWritePolicy::kWriteBack, HostWritePolicy::kWriteThrough}) {
    auto pool = CachedPoolWithHost(3, 2, policy);
    REQUIRE_OK(pool->Release(MustAllocate(*pool)));  // 100 in the tier.
    TakeCopies(*pool);
    REQUIRE(pool->HostLookup(TestHash(100)).has_value());
    const BlockPoolSnapshot before = pool->Snapshot();
    const BlockPool::Savepoint savepoint = pool->BeginTransaction();
    auto loaded = pool->LoadFromHost(TestHash(100));
    REQUIRE_OK(loaded);
    PageId pages[2];
    REQUIRE_OK(pool->AllocateN(absl::MakeSpan(pages)));  // evicts 1 and 2.
    REQUIRE_OK(pool->RegisterCached(pages[0], TestHash(7)));
    REQUIRE_OK(pool->Release(*loaded));  // parked.
    REQUIRE(!pool->host_copies().empty());
    REQUIRE(pool->parked_pages().size() == 1);
    REQUIRE_OK(pool->CheckInvariants());
    REQUIRE_OK(pool->RollbackTransaction(savepoint));
    REQUIRE(pool->Snapshot() == before);
    REQUIRE_OK(pool->CheckInvariants());
  }
}

TEST_CASE("LoadFromHost refuses what it cannot load, changing nothing") {
  REQUIRE_STATUS_IS(NewPool(2)->LoadFromHost(TestHash(1)), kFailedPrecondition);
  auto pool = CachedPoolWithHost(2, 2);
  REQUIRE_OK(pool->Release(MustAllocate(*pool)));  // stores 100.
  TakeCopies(*pool);
  const BlockPoolSnapshot before = pool->Snapshot();
  const auto missing = pool->LoadFromHost(TestHash(5));
  REQUIRE_STATUS_IS(missing, kFailedPrecondition);
  REQUIRE(std::string(missing.status().message()).find("does not hold") !=
          std::string::npos);
  REQUIRE_STATUS_IS(pool->LoadFromHost(TestHash(100), -1), kInvalidArgument);
  REQUIRE_STATUS_IS(pool->LoadFromHost(TestHash(100), kMaxKvCacheGroups),
                    kInvalidArgument);
  REQUIRE(pool->Snapshot() == before);
  // 101 is cached on device page 1 and held by the host tier once stored.
  PageId pages[2];
  REQUIRE_OK(pool->AllocateN(absl::MakeSpan(pages)));  // every page used.
  TakeCopies(*pool);
  const BlockPoolSnapshot full = pool->Snapshot();
  const auto exhausted = pool->LoadFromHost(TestHash(100));
  REQUIRE_STATUS_IS(exhausted, kResourceExhausted);
  REQUIRE(pool->Snapshot() == full);
  REQUIRE_OK(pool->Release(pages[0]));
  REQUIRE_OK(pool->RegisterCached(pages[1], TestHash(101)));
  const auto on_device = pool->LoadFromHost(TestHash(101));
  REQUIRE_STATUS_IS(on_device, kFailedPrecondition);
  REQUIRE(std::string(on_device.status().message()).find("device page") !=
          std::string::npos);
  REQUIRE_OK(pool->CheckInvariants());
}

TEST_CASE("host pages used by the batch are kept from its stores") {
  auto pool = CachedPoolWithHost(4, 2);
  PageId pages[2];
  REQUIRE_OK(pool->AllocateN(absl::MakeSpan(pages)));  // stores 100, 101.
  for (const PageId page : pages) REQUIRE_OK(pool->Release(page));
  TakeCopies(*pool);
  const BlockPoolSnapshot before = pool->Snapshot();
  const std::vector<BlockHash> missing = {TestHash(100), TestHash(7)};
  const absl::Status refused = pool->UseHostPages(missing);
  REQUIRE_STATUS_IS(refused, kFailedPrecondition);
  REQUIRE(std::string(refused.message()).find("key 1") != std::string::npos);
  REQUIRE(pool->Snapshot() == before);
  REQUIRE_STATUS_IS(NewPool(2)->UseHostPages(missing), kFailedPrecondition);
  // Both used: an eviction (of 102, after the two free pages) now stores
  // nothing rather than drop one.
  const std::vector<BlockHash> both = {TestHash(101), TestHash(100)};
  REQUIRE_OK(pool->UseHostPages(both));
  REQUIRE(pool->Snapshot().host_used == std::vector<HostPageId>{0, 1});
  REQUIRE(pool->Snapshot().host_lru == std::vector<HostPageId>{1, 0});
  PageId three[3];
  REQUIRE_OK(pool->AllocateN(absl::MakeSpan(three)));
  REQUIRE(pool->stats().evictions == 3);
  REQUIRE(pool->host_copies().empty());
  REQUIRE(pool->stats().host_store_skips == 1);
  REQUIRE(pool->HostLookup(TestHash(100)).has_value());
  REQUIRE(pool->HostLookup(TestHash(101)).has_value());
  REQUIRE_OK(pool->CheckInvariants());
}

TEST_CASE("host copies are taken outside transactions; reset clears the tier") {
  auto pool = CachedPoolWithHost(2, 2);
  const PageId page = MustAllocate(*pool);  // stores 100.
  const BlockPool::Savepoint savepoint = pool->BeginTransaction();
  std::vector<HostCopy> copies;
  REQUIRE_STATUS_IS(pool->TakeHostCopies(copies), kFailedPrecondition);
  REQUIRE(copies.empty());
  REQUIRE_OK(pool->CommitTransaction(savepoint));
  const auto refused = pool->ResetPrefixCache();
  REQUIRE_STATUS_IS(refused, kFailedPrecondition);
  REQUIRE(std::string(refused.message()).find("1 host copies") !=
          std::string::npos);
  REQUIRE_OK(pool->TakeHostCopies(copies));
  REQUIRE(copies == std::vector<HostCopy>{Store(page, 0)});
  REQUIRE_OK(pool->ResetPrefixCache());
  REQUIRE(pool->NumHostCached() == 0);
  REQUIRE(!pool->HostLookup(TestHash(100)).has_value());
  REQUIRE(pool->Snapshot().host_free == std::vector<HostPageId>{1, 0});
  REQUIRE_OK(pool->CheckInvariants());
}

}  // namespace
TEST_CASE("a cached page's group names its event hash, and rolls back") {
  auto pool = BlockPool::Create(2).value();
  const PageId page = pool->Allocate().value();
  const BlockHash key = TestHash(7);
  const BlockPoolSnapshot before = pool->Snapshot();
  const auto bad = pool->RegisterCached(page, key, kMaxKvCacheGroups);
  REQUIRE_STATUS_IS(bad, kInvalidArgument);
  REQUIRE(std::string(bad.status().message()).find("group 64") !=
          std::string::npos);
  REQUIRE(pool->Snapshot() == before);
  REQUIRE(!pool->EventHash(page).has_value());
  // Group 0's key is its hash; a later group's key is salted, its event
  // hash the key unsalted: the same key in two groups names two hashes.
  REQUIRE_OK(pool->RegisterCached(page, key, 0));
  REQUIRE(pool->EventHash(page) == key);
  REQUIRE_OK(pool->Uncache(page));
  const BlockPool::Savepoint savepoint = pool->BeginTransaction();
  REQUIRE_OK(pool->RegisterCached(page, key, 3));
  REQUIRE(pool->EventHash(page).has_value());
  REQUIRE(*pool->EventHash(page) != key);
  REQUIRE_OK(pool->RollbackTransaction(savepoint));
  REQUIRE(!pool->EventHash(page).has_value());
  REQUIRE_OK(pool->RegisterCached(page, key, 0));
  REQUIRE(pool->EventHash(page) == key);
  REQUIRE_OK(pool->CheckInvariants());
}

}  // namespace kvblock
