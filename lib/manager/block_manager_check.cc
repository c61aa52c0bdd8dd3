// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// BlockManagerImpl's checks: CheckInvariants (every invariant of
// kvblock/block_manager.h's header comment) and Snapshot, its exact
// observable state. For tests and debugging.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvblock/status_macros.h"
#include "manager/block_manager_impl.h"

namespace kvblock::internal {

absl::Status BlockManagerImpl::CheckInvariants() const {
  KVBLOCK_RETURN_IF_ERROR(pool_->CheckInvariants());
  std::vector<int32_t> references(config_.num_pages, 0);
  int64_t reserved = 0;
  KVBLOCK_RETURN_IF_ERROR(CheckSequences(absl::MakeSpan(references), reserved));
  // A parked page's last reference is the pool's (BlockPool::parked_pages).
  for (const PageId page : pool_->parked_pages()) ++references[page];
  for (PageId page = 0; page < config_.num_pages; ++page) {
    if (pool_->RefCount(page) != references[page]) {
      return absl::InternalError(absl::StrCat(
          "block manager: page ", page, " has refcount ", pool_->RefCount(page),
          " but ", references[page], " sequence references"));
    }
  }
  if (reserved != reserved_pages_ || reserved_pages_ > pool_->NumFree()) {
    return absl::InternalError(absl::StrCat("block manager: ", reserved_pages_,
                                            " pages reserved, the sequences' "
                                            "reservations add up to ",
                                            reserved, ", ", pool_->NumFree(),
                                            " are allocatable"));
  }
  return absl::OkStatus();
}

absl::Status BlockManagerImpl::CheckSequences(absl::Span<int32_t> references,
                                              int64_t& reserved) const {
  for (const auto& [id, entry] : slab_.live()) {
    const Sequence& seq = slab_.sequence(entry);
    const SequenceBlockTable& table = seq.table();
    if (slab_.cold(entry).id != id || !seq.live()) {
      return absl::InternalError(
          absl::StrCat("block manager: entry ", entry, " holds sequence ",
                       slab_.cold(entry).id, (seq.live() ? "" : " (not live)"),
                       ", indexed as ", id));
    }
    if (seq.offset() != seq.num_tokens() % config_.page_size) {
      return absl::InternalError(
          absl::StrCat("block manager: sequence ", id, " has offset ",
                       seq.offset(), " with ", seq.num_tokens(), " tokens"));
    }
    const int32_t partial_page =
        static_cast<int32_t>(seq.num_tokens() / config_.page_size);
    if (!seq.tail_maybe_shared() && seq.offset() != 0 &&
        pool_->RefCount(*table.Get(partial_page)) != 1) {
      return absl::InternalError(
          absl::StrCat("block manager: sequence ", id,
                       "'s partial page is shared but not flagged"));
    }
    if (seq.drafts() < 0 ||
        (seq.drafts() > 0 &&
         (seq.tail_maybe_shared() || seq.num_tokens() < seq.prompt_end()))) {
      return absl::InternalError(absl::StrCat(
          "block manager: sequence ", id, " holds ", seq.drafts(),
          " drafts with ", seq.prompt_end() - seq.num_tokens(),
          " prompt tokens left", (seq.tail_maybe_shared() ? ", shared" : "")));
    }
    const int64_t pages = config_.PagesFor(seq.num_tokens() + seq.drafts());
    if (table.num_pages() != pages) {
      return absl::InternalError(absl::StrCat(
          "block manager: sequence ", id, " holds ", seq.num_tokens(),
          " tokens and ", seq.drafts(), " drafts in ", table.num_pages(),
          " pages, expected ", pages));
    }
    reserved += ReservationOf(entry);
    const absl::Span<const PageId> held = table.entries().first(pages);
    for (int64_t page = 0; page < pages; ++page) {
      // A window group's skipped pages are the null page's, and lead.
      const bool skipped = held[page] == scope_.null_page;
      if (skipped && page > 0 && held[page - 1] != scope_.null_page) {
        return absl::InternalError(absl::StrCat(
            "block manager: sequence ", id, " of group ", scope_.index,
            " has the null page at page ", page, " after a live page"));
      }
      // Skips follow the tokens computed before the last append: the last
      // token's page is always live.
      if (skipped && (page + 1) * config_.page_size >= seq.num_tokens()) {
        return absl::InternalError(
            absl::StrCat("block manager: sequence ", id, " of group ",
                         scope_.index, " has the null page at page ", page,
                         ", which holds its last token"));
      }
      ++references[held[page]];
    }
  }
  if (journal_.depth() == 0 && !journal_.empty()) {
    return absl::InternalError("block manager: journal outside a transaction");
  }
  return absl::OkStatus();
}

BlockManagerSnapshot BlockManagerImpl::Snapshot() const {
  BlockManagerSnapshot snapshot;
  snapshot.pool = pool_->Snapshot();
  for (const auto& [id, entry] : slab_.live()) {
    const Sequence& seq = slab_.sequence(entry);
    const SequenceCold& cold = slab_.cold(entry);
    const auto pages = seq.table().entries().first(seq.table().num_pages());
    const TokenId* const partial = slab_.partial(entry);
    snapshot.sequences.push_back(BlockManagerSnapshot::SequenceState{
        .id = id,
        .pages = {pages.begin(), pages.end()},
        .num_tokens = seq.num_tokens(),
        .last_full_hash = cold.last_full_hash,
        .partial_tokens = {partial, partial + seq.offset()},
        .cache_salt = cold.cache_salt,
        .adapter_id = cold.adapter_id,
        .prompt_tokens = seq.prompt_end(),
        .drafts = seq.drafts()});
  }
  std::sort(snapshot.sequences.begin(), snapshot.sequences.end(),
            [](const auto& a, const auto& b) { return a.id < b.id; });
  snapshot.stats = stats();
  return snapshot;
}

}  // namespace kvblock::internal
