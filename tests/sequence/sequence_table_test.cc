// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "kvblock/sequence_table.h"

#include <cstdint>
#include <vector>

#include "pool_test_util.h"
#include "test_util.h"

namespace kvblock {
namespace {

using ::kvblock::testing::NewPool;
using ::kvblock::testing::TestHash;
using Kind = CopyOnWrite::Kind;

std::vector<PageId> Entries(const SequenceBlockTable& table) {
  return {table.entries().begin(), table.entries().end()};
}

// Fills the first `n` logical pages of `table` with new pages.
void Grow(SequenceBlockTable& table, int n, BlockPool& pool) {
  for (int i = table.num_pages(); i < n; ++i) {
    auto cow = table.EnsureWritable(i, pool);
    REQUIRE_OK(cow);
    REQUIRE(cow->kind == Kind::kAllocated);
  }
}

TEST_CASE("a new table is empty") {
  SequenceBlockTable table(3);
  REQUIRE(table.capacity() == 3);
  REQUIRE(table.num_pages() == 0);
  REQUIRE(Entries(table) == std::vector<PageId>{kNoPage, kNoPage, kNoPage});
  for (int32_t i : {-1, 0, 2, 3}) REQUIRE(table.Get(i) == std::nullopt);
  REQUIRE(SequenceBlockTable(-4).capacity() == 0);
}

TEST_CASE("ensure writable fills pages in order") {
  auto pool = NewPool(8);
  SequenceBlockTable table(3);
  auto first = table.EnsureWritable(0, *pool);
  REQUIRE_OK(first);
  REQUIRE(*first == CopyOnWrite{Kind::kAllocated, 0, kNoPage});
  REQUIRE(table.Get(0) == 0);
  REQUIRE(table.num_pages() == 1);

  auto again = table.EnsureWritable(0, *pool);
  REQUIRE_OK(again);
  REQUIRE(*again == CopyOnWrite{Kind::kExisting, 0, kNoPage});
  REQUIRE(table.num_pages() == 1);

  Grow(table, 3, *pool);
  REQUIRE(Entries(table) == std::vector<PageId>{0, 1, 2});
  REQUIRE(table.Get(2) == 2);
  REQUIRE_OK(pool->CheckInvariants());
}

TEST_CASE("ensure writable refuses bad logical pages without a change") {
  auto pool = NewPool(2);
  SequenceBlockTable table(4);
  Grow(table, 1, *pool);
  const SequenceBlockTable table_before = table;
  const BlockPoolSnapshot pool_before = pool->Snapshot();

  REQUIRE_STATUS_IS(table.EnsureWritable(-1, *pool), kInvalidArgument);
  REQUIRE_STATUS_IS(table.EnsureWritable(4, *pool), kOutOfRange);
  REQUIRE_STATUS_IS(table.EnsureWritable(2, *pool), kOutOfRange);  // A hole.
  REQUIRE(Entries(table) == Entries(table_before));
  REQUIRE(pool->Snapshot() == pool_before);

  Grow(table, 2, *pool);
  const SequenceBlockTable full_table = table;
  const BlockPoolSnapshot full_pool = pool->Snapshot();
  REQUIRE_STATUS_IS(table.EnsureWritable(2, *pool), kResourceExhausted);
  REQUIRE(Entries(table) == Entries(full_table));
  REQUIRE(pool->Snapshot() == full_pool);

  // A page released behind the table's back is refused by the pool.
  REQUIRE_OK(pool->Release(*table.Get(1)));
  const BlockPoolSnapshot dangling = pool->Snapshot();
  REQUIRE_STATUS_IS(table.EnsureWritable(1, *pool), kFailedPrecondition);
  REQUIRE(pool->Snapshot() == dangling);
  REQUIRE(Entries(table) == Entries(full_table));
}

TEST_CASE("a fork shares every page and copies on the first write") {
  auto pool = NewPool(8);
  SequenceBlockTable parent(4);
  Grow(parent, 3, *pool);
  SequenceBlockTable child(4);
  REQUIRE_OK(parent.ForkInto(child, *pool));
  REQUIRE(Entries(child) == Entries(parent));
  for (PageId page : {0, 1, 2}) REQUIRE(pool->RefCount(page) == 2);

  auto cow = child.EnsureWritable(2, *pool);
  REQUIRE_OK(cow);
  REQUIRE(*cow == CopyOnWrite{Kind::kCopy, 3, 2});
  REQUIRE(child.Get(2) == 3);
  REQUIRE(parent.Get(2) == 2);
  REQUIRE(pool->RefCount(2) == 1);

  auto parent_cow = parent.EnsureWritable(2, *pool);
  REQUIRE_OK(parent_cow);
  REQUIRE(parent_cow->kind == Kind::kExisting);

  auto appended = child.EnsureWritable(3, *pool);
  REQUIRE_OK(appended);
  REQUIRE(appended->kind == Kind::kAllocated);
  REQUIRE(parent.num_pages() == 3);
  REQUIRE_OK(pool->CheckInvariants());

  SequenceBlockTable empty(4);
  SequenceBlockTable empty_child(4);
  REQUIRE_OK(empty.ForkInto(empty_child, *pool));
  REQUIRE(empty_child.num_pages() == 0);
}

TEST_CASE("fork refuses bad targets and rolls back a refused retain") {
  auto pool = NewPool(8, {.max_refcount = 2});
  SequenceBlockTable parent(3);
  Grow(parent, 3, *pool);
  REQUIRE_OK(pool->Retain(2));  // At the maximum: the third retain fails.

  SequenceBlockTable other_capacity(4);
  REQUIRE_STATUS_IS(parent.ForkInto(other_capacity, *pool), kInvalidArgument);
  REQUIRE_STATUS_IS(parent.ForkInto(parent, *pool), kInvalidArgument);
  SequenceBlockTable busy(3);
  Grow(busy, 1, *pool);
  const BlockPoolSnapshot with_busy = pool->Snapshot();
  REQUIRE_STATUS_IS(parent.ForkInto(busy, *pool), kFailedPrecondition);
  REQUIRE(Entries(busy) == std::vector<PageId>{3, kNoPage, kNoPage});
  REQUIRE(pool->Snapshot() == with_busy);
  REQUIRE_OK(busy.ReleaseAll(*pool));

  const BlockPoolSnapshot ready = pool->Snapshot();
  SequenceBlockTable child(3);
  REQUIRE_STATUS_IS(parent.ForkInto(child, *pool), kFailedPrecondition);
  REQUIRE(pool->Snapshot() == ready);
  REQUIRE(child.num_pages() == 0);
  REQUIRE(Entries(child) == std::vector<PageId>{kNoPage, kNoPage, kNoPage});
  REQUIRE_OK(pool->CheckInvariants());
}

TEST_CASE("install shared prefix retains every page") {
  auto pool = NewPool(8);
  std::vector<PageId> prefix(2);
  REQUIRE_OK(pool->AllocateN(absl::MakeSpan(prefix)));
  SequenceBlockTable table(4);
  REQUIRE_OK(table.InstallSharedPrefix(prefix, *pool));
  REQUIRE(Entries(table) == std::vector<PageId>{0, 1, kNoPage, kNoPage});
  REQUIRE(pool->RefCount(0) == 2);
  REQUIRE(pool->RefCount(1) == 2);

  // The table then grows past the prefix and copies a shared page on write.
  Grow(table, 3, *pool);
  auto cow = table.EnsureWritable(1, *pool);
  REQUIRE_OK(cow);
  REQUIRE(cow->kind == Kind::kCopy);
  REQUIRE_OK(pool->CheckInvariants());
}

TEST_CASE("install shared prefix fails without a change") {
  auto pool = NewPool(8, {.max_refcount = 2});
  std::vector<PageId> pages(3);
  REQUIRE_OK(pool->AllocateN(absl::MakeSpan(pages)));
  REQUIRE_OK(pool->Retain(pages[2]));
  const BlockPoolSnapshot before = pool->Snapshot();
  SequenceBlockTable table(3);

  const std::vector<PageId> too_long = {0, 1, 0, 1};
  REQUIRE_STATUS_IS(table.InstallSharedPrefix(too_long, *pool), kOutOfRange);
  const std::vector<PageId> bad_id = {0, 1, 9};
  REQUIRE_STATUS_IS(table.InstallSharedPrefix(bad_id, *pool), kInvalidArgument);
  const std::vector<PageId> no_page = {0, kNoPage};
  REQUIRE_STATUS_IS(table.InstallSharedPrefix(no_page, *pool),
                    kInvalidArgument);
  const std::vector<PageId> free_page = {0, 5};
  REQUIRE_STATUS_IS(table.InstallSharedPrefix(free_page, *pool),
                    kFailedPrecondition);
  REQUIRE_STATUS_IS(table.InstallSharedPrefix(pages, *pool),
                    kFailedPrecondition);  // pages[2] is at the maximum.
  const std::vector<PageId> twice = {0, 0};
  REQUIRE_STATUS_IS(table.InstallSharedPrefix(twice, *pool),
                    kFailedPrecondition);  // The second retain of 0.
  REQUIRE(pool->Snapshot() == before);
  REQUIRE(table.num_pages() == 0);

  Grow(table, 1, *pool);
  const BlockPoolSnapshot busy = pool->Snapshot();
  const std::vector<PageId> one = {0};
  REQUIRE_STATUS_IS(table.InstallSharedPrefix(one, *pool), kFailedPrecondition);
  REQUIRE(pool->Snapshot() == busy);
  REQUIRE(Entries(table) == std::vector<PageId>{3, kNoPage, kNoPage});
  REQUIRE_OK(pool->CheckInvariants());
}

TEST_CASE("release all releases the last page first") {
  auto pool = NewPool(8);
  SequenceBlockTable table(4);
  Grow(table, 3, *pool);
  for (int32_t i = 0; i < 3; ++i) {
    REQUIRE_OK(pool->RegisterCached(*table.Get(i), TestHash(i)));
  }
  SequenceBlockTable fork(4);
  REQUIRE_OK(table.ForkInto(fork, *pool));

  REQUIRE_OK(fork.ReleaseAll(*pool));
  REQUIRE(fork.num_pages() == 0);
  REQUIRE(Entries(fork) == std::vector<PageId>(4, kNoPage));
  REQUIRE(pool->NumEvictable() == 0);

  REQUIRE_OK(table.ReleaseAll(*pool));
  // The continuation is nearest the LRU head: evicted before the prefix.
  REQUIRE(pool->Snapshot().lru == std::vector<PageId>{2, 1, 0});
  REQUIRE_OK(table.ReleaseAll(*pool));  // Empty: nothing to do.
  REQUIRE_OK(pool->CheckInvariants());
}

TEST_CASE("release all fails without a change when the pool disagrees") {
  auto pool = NewPool(4);
  SequenceBlockTable table(3);
  Grow(table, 3, *pool);
  REQUIRE_OK(pool->Release(0));  // Behind the table's back.
  const BlockPoolSnapshot before = pool->Snapshot();
  REQUIRE_STATUS_IS(table.ReleaseAll(*pool), kFailedPrecondition);
  REQUIRE(pool->Snapshot() == before);
  REQUIRE(Entries(table) == std::vector<PageId>{0, 1, 2});
  REQUIRE_OK(pool->CheckInvariants());
}

TEST_CASE("a copied table restores a table around a rolled-back transaction") {
  auto pool = NewPool(4);
  SequenceBlockTable table(4);
  Grow(table, 2, *pool);
  const SequenceBlockTable saved = table;
  const BlockPoolSnapshot before = pool->Snapshot();

  const BlockPool::Savepoint savepoint = pool->BeginTransaction();
  Grow(table, 4, *pool);
  REQUIRE_OK(pool->RollbackTransaction(savepoint));
  table = saved;
  REQUIRE(pool->Snapshot() == before);
  REQUIRE(Entries(table) == std::vector<PageId>{0, 1, kNoPage, kNoPage});
  REQUIRE_OK(table.ReleaseAll(*pool));
  REQUIRE(pool->NumFree() == 4);
}

}  // namespace
}  // namespace kvblock
