// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// SequenceBlockTable: one sequence's map from logical page (position / page
// size) to physical page of a BlockPool, with a capacity fixed at
// construction.
//
// Invariants: `entries()` has `capacity()` ids; the first `num_pages()` are
// live pages, the rest kNoPage (no hole). The table holds one pool reference
// on each live entry; it does not release them by itself (it does not know
// its pool): call ReleaseAll() before dropping a table. Copying a table copies
// the ids only, not references: a copy serves to save and restore a table
// around a pool transaction (BlockPool::BeginTransaction); share pages with
// ForkInto() instead.
//
// Complexity: Get and EnsureWritable are O(1); ForkInto, InstallSharedPrefix
// and ReleaseAll are O(pages). Nothing allocates after construction (the
// multi-page operations may grow the pool's journal, see block_pool.h).
//
// Errors: a failing call changes neither the table nor the pool.
//
// Thread safety: thread-compatible, like the pool it works on.
#ifndef KVBLOCK_SEQUENCE_TABLE_H_
#define KVBLOCK_SEQUENCE_TABLE_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvblock/block_pool.h"
#include "kvblock/types.h"

namespace kvblock {

class SequenceBlockTable {
 public:
  // An empty table of `capacity` logical pages (a negative capacity counts as
  // 0).
  explicit SequenceBlockTable(int32_t capacity);

  // All `capacity()` entries: live ids first, then kNoPage. Valid until the
  // next call that changes the table.
  absl::Span<const PageId> entries() const { return entries_; }
  // The page at `logical_page`; empty when it is unused or out of range.
  std::optional<PageId> Get(int32_t logical_page) const;
  int32_t capacity() const { return static_cast<int32_t>(entries_.size()); }
  // Live entries (they form the prefix of entries()).
  int32_t num_pages() const { return num_pages_; }

  // Makes `logical_page` writable through `pool.Writable`: the next unused
  // page gets a new page (kAllocated); a live page shared with others is
  // replaced by its copy (kCopy); a page held only here is kept (kExisting).
  // Returns the pool's decision, for the caller to copy and write KV data.
  // InvalidArgument when `logical_page` is negative; OutOfRange when it is at
  // or past capacity() or past num_pages() (it would leave a hole); the
  // pool's errors (ResourceExhausted, FailedPrecondition) as they come. On
  // error, nothing changes.
  absl::StatusOr<CopyOnWrite> EnsureWritable(int32_t logical_page,
                                             BlockPool& pool);

  // Makes the empty `target` share every live page of this table (one more
  // reference on each). InvalidArgument when `target` is this table or has a
  // different capacity; FailedPrecondition when it is not empty or the pool
  // refuses a Retain (a page at its maximum refcount or not in use). On
  // error, nothing changes (references already taken are dropped again).
  absl::Status ForkInto(SequenceBlockTable& target, BlockPool& pool) const;

  // Makes the empty table start with `pages` (e.g. a cached prefix), taking
  // one reference on each. OutOfRange when there are more than capacity();
  // FailedPrecondition when the table is not empty; the pool's Retain errors
  // (InvalidArgument for a bad id, FailedPrecondition) as they come. On
  // error, nothing changes.
  absl::Status InstallSharedPrefix(absl::Span<const PageId> pages,
                                   BlockPool& pool);

  // Drops the table's reference on every live page, last page first (so in
  // the pool's LRU list a prefix outlives its continuation), and empties the
  // table. The pool's Release errors when the table and the pool disagree
  // (a page released behind the table's back). On error, nothing changes.
  absl::Status ReleaseAll(BlockPool& pool);

  // Reference transfer, without any pool call. Used where the references are
  // already accounted for: pages just allocated or acquired from the prefix
  // cache (the caller hands its references to the table), and transaction
  // rollback (BlockPool::RollbackTransaction restores the references).

  // Appends `pages`, taking over the caller's reference on each. OutOfRange
  // when the table would exceed capacity(). On error, nothing changes.
  absl::Status AdoptPages(absl::Span<const PageId> pages);

  // Drops the entries from `logical_page` on (clamped to [0, num_pages()])
  // without releasing them: their references pass to the caller.
  void ForgetFrom(int32_t logical_page);

  // Points live entry `logical_page` at `page` instead, moving no reference:
  // a sliding-window group's skipped page becomes the null page (the caller
  // took a reference on it and releases the old one), and a rollback puts
  // the old page back. REQUIRES: logical_page < num_pages().
  void Repoint(int32_t logical_page, PageId page) {
    entries_[static_cast<size_t>(logical_page)] = page;
  }

 private:
  std::vector<PageId> entries_;
  int32_t num_pages_ = 0;
};

}  // namespace kvblock

#endif  // KVBLOCK_SEQUENCE_TABLE_H_
