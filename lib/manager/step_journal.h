// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Internal: StepJournal, BlockManager's undo log. Every change a transaction
// makes to the manager's sequences (in the SequenceSlab) is recorded as its
// inverse, in order; a rollback undoes the records newest first, a commit of
// the outermost transaction forgets them. (The pool journals its own changes;
// see BlockPool's transactions: it takes back pages allocated and restores
// references, so an inverse here only restores the sequence's own fields and
// table ids.) Each kind's writer and its inverse (Undo) are side by side
// below.
//
// Log format. A transaction's journal is a sequence of records, oldest
// first. Each record is a kind and its own payload:
//
//   created      entry (the sequence's slab entry, its handle's index),
//                the parent's entry (-1: a prompt) and its
//                tail_maybe_shared before the fork
//   removed      entry, its pages: pages[offset, offset + count)
//   appended     entry, count, drafts before: tokens written into the
//                partial page, the drafts set, and nothing else changed
//   appended_run runs[offset, offset + count): AppendMany's decode run, one
//                12-byte {entry, count, drafts} note per sequence instead of
//                a record
//   changed      entry, tail_maybe_shared, num_tokens and num_pages
//                before, the last page before, the chain hash before
//                (hashes[index]), the partial tokens before when saved
//                (tokens[offset, offset + n), n = num_tokens % page_size, a
//                page when that is 0; offset -1: not saved)
//   drafted      entry, its drafts, num_pages, last page and
//                tail_maybe_shared before, and the pages it released:
//                pages[offset, offset + count) (count 0: it kept or added
//                pages, or copied its partial page); written when a
//                sequence's drafts change, before the records of the same
//                change
//   skipped      entry, the first page it pointed at the null page and the
//                pages it held there: pages[offset, offset + count) (a KV
//                cache group's window moved past them), its skip_due_at
//                before
//   edge_step    entry, its num_tokens, num_pages, drafts and
//                tail_maybe_shared before, the chain hash before when a page
//                filled (hashes[index], else -1), and the partial tokens it
//                overwrote when saved (tokens[offset, offset + n), n =
//                num_tokens % page_size, a page when that is 0; -1: none): an
//                append past a page edge that took at most one page
//                (BlockManagerImpl::StepPastEdge)
//
// The payloads point into four arenas (pages, tokens, hashes, runs), so a
// record has a fixed size and is written in place (a record built on the
// stack and copied out stalls on store forwarding). A Mark is the size of
// the records and of each arena when a transaction began; a rollback to it
// truncates all five.
//
// Capacity: reserved at construction for a step of every reserved sequence,
// so steady-state transactions allocate nothing.
//
// Thread safety: thread-compatible, owned by one BlockManager.
#ifndef KVBLOCK_LIB_MANAGER_STEP_JOURNAL_H_
#define KVBLOCK_LIB_MANAGER_STEP_JOURNAL_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/types/span.h"
#include "kvblock/block_hash.h"
#include "kvblock/sequence_table.h"
#include "kvblock/types.h"
#include "sequence/sequence_slab.h"

namespace kvblock::internal {

// One entry of an appended_run record: `count` tokens appended in place to
// the sequence at `entry`, which held `drafts` draft slots before.
struct InPlaceAppend {
  int32_t entry;
  int32_t count;
  int32_t drafts;
};

struct JournalRecord {
  enum class Kind : uint8_t {
    kCreated,
    kRemoved,
    kAppended,
    kAppendedRun,
    kChanged,
    kDrafted,
    kEdgeStep,
    kSkipped,
  };
  struct Created {
    int32_t entry;
    int32_t parent;  // -1 for a prompt.
    bool parent_tail_maybe_shared;
  };
  struct Removed {
    int32_t entry;
    int32_t pages_offset;
    int32_t num_pages;
  };
  struct Appended {
    int32_t entry;
    int32_t count;
    int32_t drafts;  // before.
  };
  struct AppendedRun {
    int32_t runs_offset;
    int32_t count;
  };
  struct Changed {
    int32_t entry;
    int32_t num_pages;
    int64_t num_tokens;
    PageId last_page;
    int32_t hash_index;
    // The partial tokens before, when saved (else -1): num_tokens %
    // page_size of them, or a whole page at offset 0.
    int32_t tokens_offset;
    bool tail_maybe_shared;
  };

  struct Drafted {
    int32_t entry;
    int32_t drafts;
    int32_t num_pages;
    PageId last_page;
    int32_t pages_offset;
    int32_t num_released;
    bool tail_maybe_shared;
  };
  struct Skipped {
    int32_t entry;
    int32_t first;
    int32_t pages_offset;
    int32_t count;
    int64_t skip_due_at;
  };
  struct EdgeStep {
    int32_t entry;
    int32_t num_pages;
    int64_t num_tokens;
    int32_t drafts;
    // -1 when no page filled.
    int32_t hash_index;
    int32_t tokens_offset;  // -1: none saved.
    bool tail_maybe_shared;
  };

  // Written in place, field by field: no zeroing first.
  JournalRecord() {}

  Kind kind;
  union {
    Created created;
    Removed removed;
    Appended appended;
    AppendedRun appended_run;
    Changed changed;
    Drafted drafted;
    EdgeStep edge_step;
    Skipped skipped;
  };
};

// One record per running sequence a step: keep it small.
static_assert(sizeof(JournalRecord) == 40);

class StepJournal {
 public:
  // Where a transaction began: the sizes of the records and the arenas.
  struct Mark {
    size_t records = 0;
    size_t runs = 0;
    size_t tokens = 0;
    size_t pages = 0;
    size_t hashes = 0;
  };

  // Room for a step of `sequences` sequences of pages of `page_size`
  // tokens, removing at most `pages` pages.
  StepJournal(size_t sequences, int32_t page_size, size_t pages);

  // Opens a transaction (nested in the open one, if any).
  Mark Begin() {
    if (depth_++ == 0) ++serial_;
    return {records_.size(), runs_size_, tokens_.size(), pages_.size(),
            hashes_.size()};
  }
  // Closes the innermost transaction, keeping its records for the
  // transaction around it; returns true when it was the outermost, and then
  // forgets every record.
  bool Commit() {
    if (--depth_ > 0) return false;
    records_.clear();
    runs_size_ = 0;
    tokens_.clear();
    pages_.clear();
    hashes_.clear();
    return true;
  }
  // Undoes every record since `mark` in `slab`, newest first, drops them,
  // and closes the innermost transaction. REQUIRES: `mark` is that
  // transaction's, and the pool is rolled back after this.
  void Rollback(const Mark& mark, SequenceSlab& slab);

  // Open transactions, and the serial number of the outermost one (counting
  // from 1; the last one's while none is open).
  int32_t depth() const { return depth_; }
  uint64_t serial() const { return serial_; }
  bool empty() const { return records_.empty(); }

  // The writers, one per kind, each followed by its inverse.

  void Created(int32_t entry, int32_t parent, bool parent_tail_maybe_shared) {
    JournalRecord& record = Add(JournalRecord::Kind::kCreated);
    record.created = {entry, parent, parent_tail_maybe_shared};
  }
  static void Undo(const JournalRecord::Created& r, SequenceSlab& slab) {
    if (r.parent >= 0) {
      slab.sequence(r.parent).RestoreTail(r.parent_tail_maybe_shared);
    }
    slab.UndoCreate(r.entry);
  }

  void Removed(int32_t entry, absl::Span<const PageId> pages) {
    JournalRecord& record = Add(JournalRecord::Kind::kRemoved);
    record.removed = {entry, static_cast<int32_t>(pages_.size()),
                      static_cast<int32_t>(pages.size())};
    pages_.insert(pages_.end(), pages.begin(), pages.end());
  }
  void Undo(const JournalRecord::Removed& r, SequenceSlab& slab) const {
    slab.sequence(r.entry).RestoreDropped(pages(r));
    slab.UndoRemove(r.entry);
  }

  void Appended(int32_t entry, int32_t count, int32_t drafts) {
    JournalRecord& record = Add(JournalRecord::Kind::kAppended);
    record.appended = {entry, count, drafts};
  }
  static void Undo(const JournalRecord::Appended& r, SequenceSlab& slab) {
    slab.sequence(r.entry).UndoAppendInPlace(r.count, r.drafts);
  }

  // Decode runs (AppendMany): RunSpace(n) makes room for n entries at the
  // end of the runs arena and returns it; Run records entries [begin, end)
  // written there as one appended_run record (nothing for an empty run);
  // EndRuns drops the room left unused past `end`. One RunSpace per call of
  // AppendMany, for every run it makes.
  InPlaceAppend* RunSpace(size_t n) {
    if (runs_size_ + n > runs_capacity_) GrowRuns(runs_size_ + n);
    InPlaceAppend* const space = runs_.get() + runs_size_;
    runs_size_ += n;  // not initialized: each entry is written before use.
    return space;
  }
  void Run(const InPlaceAppend* begin, const InPlaceAppend* end) {
    if (begin == end) return;
    JournalRecord& record = Add(JournalRecord::Kind::kAppendedRun);
    record.appended_run = {static_cast<int32_t>(begin - runs_.get()),
                           static_cast<int32_t>(end - begin)};
  }
  void EndRuns(const InPlaceAppend* end) {
    runs_size_ = static_cast<size_t>(end - runs_.get());
  }
  void Undo(const JournalRecord::AppendedRun& r, SequenceSlab& slab) const {
    const absl::Span<const InPlaceAppend> run = runs(r);
    for (auto it = run.rbegin(); it != run.rend(); ++it) {
      slab.sequence(it->entry).UndoAppendInPlace(it->count, it->drafts);
    }
  }

  // `partial` are the tokens to restore (num_tokens % page_size of them, a
  // page at 0), or empty when none need restoring.
  // `chain_before`: null when no page fills (the chain stays).
  void Changed(int32_t entry, bool tail_maybe_shared, int64_t num_tokens,
               int32_t num_pages, PageId last_page,
               const BlockHash* chain_before,
               absl::Span<const TokenId> partial) {
    JournalRecord& record = Add(JournalRecord::Kind::kChanged);
    record.changed = {.entry = entry,
                      .num_pages = num_pages,
                      .num_tokens = num_tokens,
                      .last_page = last_page,
                      .hash_index = SaveHash(chain_before),
                      .tokens_offset = SaveTokens(partial),
                      .tail_maybe_shared = tail_maybe_shared};
  }
  void Undo(const JournalRecord::Changed& r, SequenceSlab& slab) const {
    Sequence& seq = slab.sequence(r.entry);
    seq.RestorePages(r.num_pages, r.last_page);
    seq.RestoreLength(r.num_tokens, seq.drafts());
    seq.RestoreTail(r.tail_maybe_shared);
    RestoreSaved(r.entry, r.hash_index, r.tokens_offset, slab);
  }

  // `released` are the pages a change of drafts released (last first), or
  // empty.
  void Drafted(int32_t entry, int32_t drafts, int32_t num_pages,
               PageId last_page, bool tail_maybe_shared,
               absl::Span<const PageId> released) {
    JournalRecord& record = Add(JournalRecord::Kind::kDrafted);
    record.drafted = {.entry = entry,
                      .drafts = drafts,
                      .num_pages = num_pages,
                      .last_page = last_page,
                      .pages_offset = static_cast<int32_t>(pages_.size()),
                      .num_released = static_cast<int32_t>(released.size()),
                      .tail_maybe_shared = tail_maybe_shared};
    pages_.insert(pages_.end(), released.begin(), released.end());
  }
  void Undo(const JournalRecord::Drafted& r, SequenceSlab& slab) const {
    Sequence& seq = slab.sequence(r.entry);
    // The released pages, last first, come back in table order.
    const absl::Span<const PageId> released = pages(r);
    for (auto it = released.rbegin(); it != released.rend(); ++it) {
      seq.RestoreDropped(absl::MakeConstSpan(&*it, 1));
    }
    seq.RestorePages(r.num_pages, r.last_page);
    seq.RestoreLength(seq.num_tokens(), r.drafts);
    seq.RestoreTail(r.tail_maybe_shared);
  }

  // `chain_before`: null when no page fills; `partial`: the tokens to
  // restore (as for Changed), or empty.
  ABSL_ATTRIBUTE_ALWAYS_INLINE void EdgeStep(
      int32_t entry, int64_t num_tokens, int32_t num_pages, int32_t drafts,
      bool tail_maybe_shared, const BlockHash* chain_before,
      absl::Span<const TokenId> partial) {
    JournalRecord& record = Add(JournalRecord::Kind::kEdgeStep);
    JournalRecord::EdgeStep& r = record.edge_step;
    r.entry = entry;
    r.num_pages = num_pages;
    r.num_tokens = num_tokens;
    r.drafts = drafts;
    r.hash_index = SaveHash(chain_before);
    r.tokens_offset = SaveTokens(partial);
    r.tail_maybe_shared = tail_maybe_shared;
  }
  void Undo(const JournalRecord::EdgeStep& r, SequenceSlab& slab) const {
    Sequence& seq = slab.sequence(r.entry);
    seq.DropPagesFrom(r.num_pages);
    seq.RestoreLength(r.num_tokens, r.drafts);
    seq.RestoreTail(r.tail_maybe_shared);
    RestoreSaved(r.entry, r.hash_index, r.tokens_offset, slab);
  }

  // `pages`: the pages [first, first + pages.size()) the sequence held
  // before SkipPages pointed them at the null page; `skip_due_at`: its
  // skip_due_at before.
  void Skipped(int32_t entry, int32_t first, absl::Span<const PageId> pages,
               int64_t skip_due_at) {
    JournalRecord& record = Add(JournalRecord::Kind::kSkipped);
    record.skipped = {entry, first, static_cast<int32_t>(pages_.size()),
                      static_cast<int32_t>(pages.size()), skip_due_at};
    pages_.insert(pages_.end(), pages.begin(), pages.end());
  }
  void Undo(const JournalRecord::Skipped& r, SequenceSlab& slab) const {
    slab.sequence(r.entry).RestoreSkipped(
        r.first, absl::MakeConstSpan(pages_).subspan(r.pages_offset, r.count),
        r.skip_due_at);
  }

 private:
  // Undoes `record`, by its kind.
  void Undo(const JournalRecord& record, SequenceSlab& slab) const;

  // Save a chain hash (null: none) or partial tokens (empty: none) for a
  // record: their index in the arena, or -1.
  ABSL_ATTRIBUTE_ALWAYS_INLINE int32_t SaveHash(const BlockHash* hash) {
    if (hash == nullptr) return -1;
    hashes_.push_back(*hash);
    return static_cast<int32_t>(hashes_.size() - 1);
  }
  ABSL_ATTRIBUTE_ALWAYS_INLINE int32_t
  SaveTokens(absl::Span<const TokenId> tokens) {
    if (tokens.empty()) return -1;  // no call into the insert.
    const auto offset = static_cast<int32_t>(tokens_.size());
    tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
    return offset;
  }
  // Puts back what SaveHash and SaveTokens saved for the sequence at
  // `entry`, once its length is restored: its chain hash, and its partial
  // tokens (num_tokens % page_size of them, a page at 0).
  void RestoreSaved(int32_t entry, int32_t hash_index, int32_t tokens_offset,
                    SequenceSlab& slab) const {
    if (hash_index >= 0) slab.cold(entry).last_full_hash = hashes_[hash_index];
    if (tokens_offset < 0) return;
    const int32_t offset = slab.sequence(entry).offset();
    std::copy_n(tokens_.data() + tokens_offset,
                offset == 0 ? page_size_ : offset, slab.partial(entry));
  }

  // The arenas' parts a record names.
  absl::Span<const PageId> pages(const JournalRecord::Removed& r) const {
    return absl::MakeConstSpan(pages_).subspan(r.pages_offset, r.num_pages);
  }
  absl::Span<const PageId> pages(const JournalRecord::Drafted& r) const {
    return absl::MakeConstSpan(pages_).subspan(r.pages_offset, r.num_released);
  }
  absl::Span<const InPlaceAppend> runs(
      const JournalRecord::AppendedRun& r) const {
    return absl::MakeConstSpan(runs_.get() + r.runs_offset, r.count);
  }

  JournalRecord& Add(JournalRecord::Kind kind) {
    JournalRecord& record = records_.emplace_back();
    record.kind = kind;
    return record;
  }

  // Keeps the first `size` entries of the runs arena in a new buffer of at
  // least `capacity` entries.
  void GrowRuns(size_t capacity);

  std::vector<JournalRecord> records_;
  // The runs arena: a buffer whose entries RunSpace hands out unwritten
  // (a vector would zero each one first).
  std::unique_ptr<InPlaceAppend[]> runs_;
  size_t runs_size_ = 0;
  size_t runs_capacity_ = 0;
  std::vector<TokenId> tokens_;
  std::vector<PageId> pages_;
  std::vector<BlockHash> hashes_;
  int32_t depth_ = 0;
  uint64_t serial_ = 0;
  const int32_t page_size_;
};

}  // namespace kvblock::internal

#endif  // KVBLOCK_LIB_MANAGER_STEP_JOURNAL_H_
