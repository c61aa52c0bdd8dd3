// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "sequence/sequence.h"

#include <cstdint>
#include <vector>

#include "pool_test_util.h"
#include "test_util.h"

namespace kvblock::internal {
namespace {

using ::kvblock::testing::NewPool;

constexpr int32_t kPageSize = 4;

std::vector<PageId> Pages(const Sequence& seq) {
  return {seq.pages().begin(), seq.pages().end()};
}

// `n` pages allocated from `pool`, their references the caller's.
std::vector<PageId> Allocate(BlockPool& pool, int n) {
  std::vector<PageId> pages(n);
  REQUIRE_OK(pool.AllocateN(absl::MakeSpan(pages)));
  return pages;
}

TEST_CASE("grow takes pages and sets the length they complete") {
  auto pool = NewPool(8);
  Sequence seq(/*max_pages_per_seq=*/4, kPageSize);
  seq.StartPrompt(6);
  REQUIRE_FALSE(seq.prompt_done());
  REQUIRE(seq.prompt_left() == 6);

  const std::vector<PageId> pages = Allocate(*pool, 2);
  REQUIRE_OK(seq.Grow(pages, 6, 0));
  REQUIRE(Pages(seq) == pages);
  REQUIRE(seq.num_tokens() == 6);
  REQUIRE(seq.offset() == 2);
  REQUIRE(seq.prompt_done());
  REQUIRE(seq.last_page() == pages[1]);

  // Drafts on the page held, then in one more page.
  REQUIRE_OK(seq.Grow({}, 6, 2));
  REQUIRE(seq.drafts() == 2);
  REQUIRE(seq.num_pages() == 2);
  const std::vector<PageId> more = Allocate(*pool, 1);
  REQUIRE_OK(seq.Grow(more, 7, 3, /*serial=*/5));
  REQUIRE(seq.num_pages() == 3);
  REQUIRE(seq.offset() == 3);
  REQUIRE(seq.filled_in_transaction() == 5);
}

TEST_CASE("grow past the table's capacity changes nothing") {
  auto pool = NewPool(8);
  Sequence seq(/*max_pages_per_seq=*/2, kPageSize);
  REQUIRE_OK(seq.Grow(Allocate(*pool, 1), 3, 0));
  const std::vector<PageId> too_many = Allocate(*pool, 2);
  const absl::Status status = seq.Grow(too_many, 11, 0);
  REQUIRE(status.code() == absl::StatusCode::kOutOfRange);
  REQUIRE(seq.num_pages() == 1);
  REQUIRE(seq.num_tokens() == 3);
  REQUIRE(seq.offset() == 3);
}

TEST_CASE("appends in place move the length only, and undo restores it") {
  auto pool = NewPool(4);
  Sequence seq(4, kPageSize);
  REQUIRE_OK(seq.Grow(Allocate(*pool, 1), 1, 0));
  seq.AppendInPlace(2);
  REQUIRE(seq.num_tokens() == 3);
  REQUIRE(seq.offset() == 3);
  REQUIRE(seq.drafts() == 0);

  Sequence drafting(4, kPageSize);
  REQUIRE_OK(drafting.Grow(Allocate(*pool, 2), 1, 6));
  drafting.AppendInPlace(2, 4);  // two drafts taken, then four set.
  REQUIRE(drafting.num_tokens() == 3);
  REQUIRE(drafting.drafts() == 4);
  drafting.UndoAppendInPlace(2, 6);
  REQUIRE(drafting.num_tokens() == 1);
  REQUIRE(drafting.offset() == 1);
  REQUIRE(drafting.drafts() == 6);
}

TEST_CASE("shrinking drafts hands back the pages past them") {
  auto pool = NewPool(8);
  Sequence seq(4, kPageSize);
  const std::vector<PageId> pages = Allocate(*pool, 3);
  REQUIRE_OK(seq.Grow(pages, 2, 9));  // 11 slots: three pages.
  seq.ShrinkDrafts(1);
  REQUIRE(seq.drafts() == 1);
  REQUIRE(Pages(seq) == std::vector<PageId>{pages[0]});
  // The dropped pages' references are the caller's: they are still held.
  REQUIRE(pool->RefCount(pages[1]) == 1);
  REQUIRE(pool->RefCount(pages[2]) == 1);

  seq.RestoreDropped(absl::MakeConstSpan(pages).subspan(1));
  seq.RestoreLength(2, 9);
  REQUIRE(Pages(seq) == pages);
  REQUIRE(seq.drafts() == 9);
}

TEST_CASE("a fork shares every page and flags both partial pages") {
  auto pool = NewPool(8);
  Sequence parent(4, kPageSize);
  parent.StartPrompt(5);
  const std::vector<PageId> pages = Allocate(*pool, 2);
  REQUIRE_OK(parent.Grow(pages, 5, 0));
  REQUIRE_FALSE(parent.tail_maybe_shared());

  Sequence child(4, kPageSize);
  REQUIRE_OK(child.ForkFrom(parent, *pool));
  REQUIRE(Pages(child) == pages);
  REQUIRE(child.num_tokens() == 5);
  REQUIRE(child.prompt_end() == 5);
  REQUIRE(parent.tail_maybe_shared());
  REQUIRE(child.tail_maybe_shared());
  REQUIRE(pool->RefCount(pages[0]) == 2);
  REQUIRE(child.TailNeedsCopy(*pool));

  // The child's copy on write leaves the parent the shared page alone.
  auto cow = child.CopyTail(*pool);
  REQUIRE_OK(cow);
  REQUIRE(cow->source == pages[1]);
  REQUIRE(child.last_page() == cow->page);
  REQUIRE_FALSE(child.tail_maybe_shared());
  REQUIRE_FALSE(parent.TailNeedsCopy(*pool));  // refcount 1 again.
  parent.OwnTail();
  REQUIRE_FALSE(parent.tail_maybe_shared());

  // Undone, the child holds the shared page again (the pool's rollback
  // would restore its reference).
  child.RestorePages(2, pages[1]);
  child.RestoreTail(true);
  REQUIRE(Pages(child) == pages);
  REQUIRE(child.tail_maybe_shared());

  REQUIRE_OK(parent.ReleasePages(*pool));
  REQUIRE(parent.num_pages() == 0);
}

TEST_CASE("restoring pages drops the ones added since") {
  auto pool = NewPool(8);
  Sequence seq(4, kPageSize);
  const std::vector<PageId> pages = Allocate(*pool, 3);
  REQUIRE_OK(seq.Grow(absl::MakeConstSpan(pages).first(1), 4, 0));
  REQUIRE_OK(seq.Grow(absl::MakeConstSpan(pages).subspan(1), 9, 0));
  seq.RestorePages(1, pages[0]);
  seq.RestoreLength(4, 0);
  REQUIRE(Pages(seq) == std::vector<PageId>{pages[0]});
  REQUIRE(seq.offset() == 0);
  seq.DropPagesFrom(0);
  REQUIRE(seq.num_pages() == 0);
}

}  // namespace
}  // namespace kvblock::internal
