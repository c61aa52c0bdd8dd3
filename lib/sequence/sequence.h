// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Internal: Sequence, one live sequence's length and pages: what every
// append reads, kept in SequenceSlab's flat array (its cold fields and
// partial-page tokens are beside it there). Its methods are the only writers
// of its fields, and each forward change keeps the invariant:
//
//   the table holds the pages of num_tokens + drafts (PagedKvConfig::PagesFor),
//   offset == num_tokens % page_size, and drafts are held only by a sequence
//   whose prompt is done.
//
// The pool is the caller's: a method that takes pages takes the references
// the caller got for them (allocated, acquired from the cache), and one that
// drops pages hands their references back. Debug builds assert the invariant
// after each forward change; the Restore methods, which the step journal
// undoes changes with newest first, put back fields one record at a time and
// leave the invariant to hold once the whole transaction is undone
// (BlockManager::CheckInvariants checks it).
//
// Thread safety: thread-compatible, owned by one BlockManager.
#ifndef KVBLOCK_LIB_SEQUENCE_SEQUENCE_H_
#define KVBLOCK_LIB_SEQUENCE_SEQUENCE_H_

#include <algorithm>
#include <cassert>
#include <cstdint>

#include "absl/base/attributes.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvblock/block_pool.h"
#include "kvblock/config.h"
#include "kvblock/sequence_table.h"
#include "kvblock/types.h"

namespace kvblock::internal {

class Sequence {
 public:
  // An empty sequence of at most `max_pages_per_seq` pages of `page_size`
  // tokens.
  Sequence(int32_t max_pages_per_seq, int32_t page_size)
      : page_size_(page_size), table_(max_pages_per_seq) {}

  int64_t num_tokens() const { return num_tokens_; }
  // Tokens of the partial (last) page: num_tokens % page_size.
  int32_t offset() const { return offset_; }
  // Draft slots after num_tokens (speculative decoding).
  int32_t drafts() const { return drafts_; }
  // The prompt's length: the tokens below it come from the admission and
  // prompt chunks only; appends wait until it is reached.
  int64_t prompt_end() const { return prompt_end_; }
  bool prompt_done() const { return num_tokens_ >= prompt_end_; }
  int64_t prompt_left() const {
    return std::max<int64_t>(0, prompt_end_ - num_tokens_);
  }
  // False only while the partial last page is known to be held by this
  // sequence alone; true sends the next append to check its refcount (a
  // fork shares it; either side's copy on write may end the sharing).
  bool tail_maybe_shared() const { return tail_maybe_shared_; }
  // Whether the partial page must be copied before it is written.
  bool TailNeedsCopy(const BlockPool& pool) const {
    return offset_ != 0 && tail_maybe_shared_ && pool.RefCount(last_page()) > 1;
  }

  const SequenceBlockTable& table() const { return table_; }
  int32_t num_pages() const { return table_.num_pages(); }
  absl::Span<const PageId> pages() const {
    return table_.entries().first(static_cast<size_t>(table_.num_pages()));
  }
  PageId last_page() const {
    return table_.num_pages() > 0 ? table_.entries()[table_.num_pages() - 1]
                                  : kNoPage;
  }

  // Slab bookkeeping (SequenceSlab writes them).
  bool live() const { return live_; }
  uint32_t generation() const { return generation_; }
  // A BatchCommit runs it: only that commit's step may change it.
  bool run_by_commit() const { return run_by_commit_; }
  void set_run_by_commit(bool on) { run_by_commit_ = on; }
  // A window group's sequence: the tokens from which its next page may leave
  // the window (NextSkipTokens of the pages it skipped; 0 until first
  // asked). Below it, no page is due to be released.
  int64_t skip_due_at() const { return skip_due_at_; }
  void set_skip_due_at(int64_t tokens) { skip_due_at_ = tokens; }
  // StepJournal::serial() of the transaction that last filled a page here
  // (a new page saves that page's tokens only in the same transaction).
  uint64_t filled_in_transaction() const { return filled_in_transaction_; }

  // Forward changes ----------------------------------------------------------

  // A fresh sequence's prompt of `prompt_end` tokens.
  void StartPrompt(int64_t prompt_end) { prompt_end_ = prompt_end; }

  // `count` tokens, then `drafts` draft slots, on the pages held. REQUIRES:
  // they stay in the partial page (offset + count < page_size) and end on
  // the pages held.
  void AppendInPlace(int32_t count, int32_t drafts) {
    drafts_ = drafts;
    AppendInPlace(count);
  }
  // The same, holding no drafts before or after (decode).
  void AppendInPlace(int32_t count) {
    num_tokens_ += count;
    offset_ += count;
    AssertInvariant();
  }

  // Takes `pages` (the caller's references) after the pages held and grows
  // to `num_tokens` tokens and `drafts` drafts, which they complete;
  // `serial`, when not 0, is the transaction's that filled a page here.
  // OutOfRange past the table's capacity, changing nothing.
  ABSL_ATTRIBUTE_ALWAYS_INLINE absl::Status Grow(absl::Span<const PageId> pages,
                                                 int64_t num_tokens,
                                                 int32_t drafts,
                                                 uint64_t serial = 0) {
    if (!pages.empty()) {
      if (absl::Status status = table_.AdoptPages(pages); !status.ok()) {
        return status;
      }
    }
    if (serial != 0) filled_in_transaction_ = serial;
    num_tokens_ = num_tokens;
    offset_ = static_cast<int32_t>(num_tokens % page_size_);
    drafts_ = drafts;
    AssertInvariant();
    return absl::OkStatus();
  }

  // Holds `drafts` draft slots, fewer pages' worth than now: the pages
  // wholly past them leave the table, their references the caller's to
  // release.
  void ShrinkDrafts(int32_t drafts) {
    table_.ForgetFrom(
        static_cast<int32_t>(PagesForTokens(num_tokens_ + drafts, page_size_)));
    drafts_ = drafts;
    AssertInvariant();
  }

  // Replaces the shared partial page by its copy (TailNeedsCopy), and
  // returns the copy for the KV copy kernel. The pool's errors, changing
  // nothing.
  absl::StatusOr<CopyOnWrite> CopyTail(BlockPool& pool) {
    absl::StatusOr<CopyOnWrite> cow =
        table_.EnsureWritable(num_pages() - 1, pool);
    if (cow.ok()) tail_maybe_shared_ = false;
    return cow;
  }
  // Notes that the partial page is held here alone (fresh, copied, or its
  // refcount seen to be 1).
  void OwnTail() { tail_maybe_shared_ = false; }

  // Makes this fresh sequence a fork of `parent`, sharing every page (and
  // marking the partial page shared on both sides). ForkInto's errors,
  // changing nothing.
  absl::Status ForkFrom(Sequence& parent, BlockPool& pool) {
    if (absl::Status status = parent.table_.ForkInto(table_, pool);
        !status.ok()) {
      return status;
    }
    num_tokens_ = parent.num_tokens_;
    offset_ = parent.offset_;
    prompt_end_ = parent.prompt_end_;
    skip_due_at_ = parent.skip_due_at_;
    parent.tail_maybe_shared_ = true;
    tail_maybe_shared_ = true;
    AssertInvariant();
    return absl::OkStatus();
  }

  // Points the entries of pages [first, first + count), which the caller
  // released, at `null_page`, which it took a reference on for each: a
  // KV cache group's window no longer reaches them.
  void SkipPages(int32_t first, int32_t count, PageId null_page) {
    for (int32_t page = first; page < first + count; ++page) {
      table_.Repoint(page, null_page);
    }
  }

  // Releases every page, last first (the sequence is leaving). The pool's
  // errors, changing nothing.
  absl::Status ReleasePages(BlockPool& pool) { return table_.ReleaseAll(pool); }

  // Undo (the step journal's) ------------------------------------------------

  // Undoes AppendInPlace(count, ...) from `drafts` drafts.
  void UndoAppendInPlace(int32_t count, int32_t drafts) {
    num_tokens_ -= count;
    offset_ -= count;
    drafts_ = drafts;
  }
  // Puts back `num_tokens` and `drafts`.
  void RestoreLength(int64_t num_tokens, int32_t drafts) {
    num_tokens_ = num_tokens;
    offset_ = static_cast<int32_t>(num_tokens % page_size_);
    drafts_ = drafts;
  }
  // Puts back a table of `num_pages` pages whose last was `last_page`: drops
  // the pages added since, then puts the last page back if a copy replaced
  // it (the pool's rollback restores the references).
  void RestorePages(int32_t num_pages, PageId last_page) {
    int32_t keep = num_pages;
    if (keep > 0 && table_.Get(keep - 1) != last_page) --keep;
    table_.ForgetFrom(keep);
    if (keep < num_pages) {
      (void)table_.AdoptPages(absl::MakeConstSpan(&last_page, 1));
    }
  }
  // Drops the pages from `num_pages` on (added since; the pool's rollback
  // takes them back).
  void DropPagesFrom(int32_t num_pages) { table_.ForgetFrom(num_pages); }
  // Puts back pages dropped from the end (`dropped`, in table order).
  void RestoreDropped(absl::Span<const PageId> dropped) {
    (void)table_.AdoptPages(dropped);
  }
  // Puts back the pages SkipPages replaced, `pages` from `first` on, and
  // the skip_due_at before.
  void RestoreSkipped(int32_t first, absl::Span<const PageId> pages,
                      int64_t skip_due_at) {
    skip_due_at_ = skip_due_at;
    for (size_t i = 0; i < pages.size(); ++i) {
      table_.Repoint(first + static_cast<int32_t>(i), pages[i]);
    }
  }
  void RestoreTail(bool tail_maybe_shared) {
    tail_maybe_shared_ = tail_maybe_shared;
  }

 private:
  friend class SequenceSlab;

  void AssertInvariant() const {
    assert(table_.num_pages() ==
           PagesForTokens(num_tokens_ + drafts_, page_size_));
    assert(offset_ == num_tokens_ % page_size_);
    assert(drafts_ == 0 || prompt_done());
  }

  int64_t num_tokens_ = 0;
  int32_t offset_ = 0;
  int32_t drafts_ = 0;
  int64_t prompt_end_ = 0;
  int64_t skip_due_at_ = 0;
  uint64_t filled_in_transaction_ = 0;
  uint32_t generation_ = 0;
  int32_t page_size_;
  bool tail_maybe_shared_ = false;
  bool live_ = false;
  bool run_by_commit_ = false;
  SequenceBlockTable table_;
};

}  // namespace kvblock::internal

#endif  // KVBLOCK_LIB_SEQUENCE_SEQUENCE_H_
