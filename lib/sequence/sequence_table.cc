// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "kvblock/sequence_table.h"

#include <algorithm>
#include <cstdint>
#include <optional>

#include "absl/strings/str_cat.h"
#include "kvblock/status_macros.h"

namespace kvblock {
namespace {

// Applies `op` (Retain or Release) to `pages`, last first when `reverse`, in
// one pool transaction: all of them succeed or none has an effect.
absl::Status ApplyAll(BlockPool& pool, absl::Span<const PageId> pages,
                      bool reverse, absl::Status (BlockPool::*op)(PageId)) {
  const BlockPool::Savepoint savepoint = pool.BeginTransaction();
  for (size_t i = 0; i < pages.size(); ++i) {
    const PageId page = pages[reverse ? pages.size() - 1 - i : i];
    if (absl::Status status = (pool.*op)(page); !status.ok()) {
      // The savepoint is the innermost transaction's: this cannot fail.
      pool.RollbackTransaction(savepoint).IgnoreError();
      return status;
    }
  }
  return pool.CommitTransaction(savepoint);
}

}  // namespace

SequenceBlockTable::SequenceBlockTable(int32_t capacity)
    : entries_(std::max(capacity, 0), kNoPage) {}

std::optional<PageId> SequenceBlockTable::Get(int32_t logical_page) const {
  if (logical_page < 0 || logical_page >= num_pages_) return std::nullopt;
  return entries_[logical_page];
}

absl::StatusOr<CopyOnWrite> SequenceBlockTable::EnsureWritable(
    int32_t logical_page, BlockPool& pool) {
  if (logical_page < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sequence table: logical page ", logical_page, " is negative"));
  }
  if (logical_page >= capacity()) {
    return absl::OutOfRangeError(
        absl::StrCat("sequence table: logical page ", logical_page,
                     " is past the capacity of ", capacity(), " pages"));
  }
  if (logical_page > num_pages_) {
    return absl::OutOfRangeError(absl::StrCat(
        "sequence table: logical page ", logical_page,
        " would leave a hole after the ", num_pages_, " live pages"));
  }
  const PageId current =
      logical_page < num_pages_ ? entries_[logical_page] : kNoPage;
  KVBLOCK_ASSIGN_OR_RETURN(const CopyOnWrite cow, pool.Writable(current));
  entries_[logical_page] = cow.page;
  if (logical_page == num_pages_) ++num_pages_;
  return cow;
}

absl::Status SequenceBlockTable::ForkInto(SequenceBlockTable& target,
                                          BlockPool& pool) const {
  if (&target == this) {
    return absl::InvalidArgumentError(
        "sequence table: cannot fork a table into itself");
  }
  if (target.capacity() != capacity()) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence table: fork target has capacity ",
                     target.capacity(), ", source has ", capacity()));
  }
  if (target.num_pages_ != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("sequence table: fork target holds ", target.num_pages_,
                     " pages, must be empty"));
  }
  const absl::Span<const PageId> live = entries().first(num_pages_);
  KVBLOCK_RETURN_IF_ERROR(ApplyAll(pool, live, false, &BlockPool::Retain));
  std::copy(live.begin(), live.end(), target.entries_.begin());
  target.num_pages_ = num_pages_;
  return absl::OkStatus();
}

absl::Status SequenceBlockTable::InstallSharedPrefix(
    absl::Span<const PageId> pages, BlockPool& pool) {
  if (pages.size() > entries_.size()) {
    return absl::OutOfRangeError(
        absl::StrCat("sequence table: prefix of ", pages.size(),
                     " pages exceeds the capacity of ", capacity()));
  }
  if (num_pages_ != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("sequence table: holds ", num_pages_,
                     " pages, a shared prefix needs an empty table"));
  }
  KVBLOCK_RETURN_IF_ERROR(ApplyAll(pool, pages, false, &BlockPool::Retain));
  std::copy(pages.begin(), pages.end(), entries_.begin());
  num_pages_ = static_cast<int32_t>(pages.size());
  return absl::OkStatus();
}

absl::Status SequenceBlockTable::ReleaseAll(BlockPool& pool) {
  KVBLOCK_RETURN_IF_ERROR(
      ApplyAll(pool, entries().first(num_pages_), true, &BlockPool::Release));
  std::fill(entries_.begin(), entries_.begin() + num_pages_, kNoPage);
  num_pages_ = 0;
  return absl::OkStatus();
}

absl::Status SequenceBlockTable::AdoptPages(absl::Span<const PageId> pages) {
  if (pages.size() > static_cast<size_t>(capacity() - num_pages_)) {
    return absl::OutOfRangeError(
        absl::StrCat("sequence table: adopting ", pages.size(), " pages after ",
                     num_pages_, " exceeds the capacity of ", capacity()));
  }
  if (pages.size() == 1) {
    entries_[num_pages_] = pages[0];  // a new last page: no call into memmove.
  } else {
    std::copy(pages.begin(), pages.end(), entries_.begin() + num_pages_);
  }
  num_pages_ += static_cast<int32_t>(pages.size());
  return absl::OkStatus();
}

void SequenceBlockTable::ForgetFrom(int32_t logical_page) {
  const int32_t keep = std::clamp(logical_page, 0, num_pages_);
  std::fill(entries_.begin() + keep, entries_.begin() + num_pages_, kNoPage);
  num_pages_ = keep;
}

}  // namespace kvblock
