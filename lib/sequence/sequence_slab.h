// Copyright 2026 The kvblock Authors.
//
// Internal: SequenceSlab, BlockManager's live sequences. Each has an entry
// (its handle's index) in flat arrays reserved up front: a hot record, what
// every append reads (token count, partial-page offset, the shared-tail flag,
// its page table), kept apart from a cold one (id, chain hash, cache salt,
// adapter), and its partial page's tokens in one flat array. Ids map to
// entries through one hash map.
//
// Entries are handed out LIFO from a free list; a removed entry waits
// (pending) until the outermost transaction commits, because its state is
// needed to undo the removal. A generation, bumped by every Create of the
// entry and restored by UndoCreate, tells the sequences that take one entry
// in turn apart, so a stale handle never reaches the next sequence, and a
// rolled-back transaction's replay gets the same handles. When no entry is
// free the slab grows (an allocation; handle_limit() grows and stays grown).
//
// Thread safety: thread-compatible, owned by one BlockManager.
#ifndef KVBLOCK_LIB_SEQUENCE_SEQUENCE_SLAB_H_
#define KVBLOCK_LIB_SEQUENCE_SEQUENCE_SLAB_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "kvblock/block_hash.h"
#include "kvblock/sequence_table.h"
#include "kvblock/types.h"

namespace kvblock::internal {

// What every append reads.
struct SequenceHot {
  explicit SequenceHot(int32_t max_pages_per_seq) : table(max_pages_per_seq) {}

  int64_t num_tokens = 0;
  int32_t offset = 0;  // num_tokens % page_size: tokens of the partial page.
  // Draft slots after num_tokens (speculative decoding): the table holds
  // the pages of num_tokens + drafts. Appends with drafts take the slow
  // path.
  int32_t drafts = 0;
  // The prompt's length: the tokens below it come from the admission and
  // AppendPrompt (chunked prefill) only; appends wait until it is reached.
  int64_t prompt_end = 0;
  // False only while the partial last page is known to be held by this
  // sequence alone; true sends the next append to check its refcount (a
  // fork shares it; either side's copy on write may end the sharing).
  bool tail_maybe_shared = false;
  bool live = false;
  // A BatchCommit runs it: only that commit's step may change it
  // (BlockManager::SetRunByCommit).
  bool run_by_commit = false;
  uint32_t generation = 0;
  // StepJournal::serial() of the transaction that last filled a page here
  // (a new page saves that page's tokens only in the same transaction).
  uint64_t filled_in_transaction = 0;
  SequenceBlockTable table;
};

// The rest.
struct SequenceCold {
  SequenceId id = kNoSequence;
  // Prefix-cache chain: the hash of the last full page (the root hash of the
  // sequence's extra keys before the first; unset without prefix caching).
  BlockHash last_full_hash;
  std::string cache_salt;
  int64_t adapter_id = 0;
  // Whether its admission reserved the pages of its prompt's rest.
  bool reserves = false;
};

class SequenceSlab {
 public:
  // `reserved` entries, each with a table of `max_pages_per_seq` pages and
  // `page_size` partial tokens.
  SequenceSlab(int32_t reserved, int32_t max_pages_per_seq, int32_t page_size);

  // The entry of live sequence `id`, or -1.
  int32_t Find(SequenceId id) const {
    const auto it = handle_of_.find(id);
    return it == handle_of_.end() ? -1 : it->second;
  }
  bool IsLive(SequenceHandle handle) const {
    return handle.index >= 0 &&
           static_cast<size_t>(handle.index) < hot_.size() &&
           hot_[handle.index].live &&
           hot_[handle.index].generation == handle.generation;
  }
  SequenceHandle HandleAt(int32_t entry) const {
    return {entry, hot_[entry].generation};
  }

  // A fresh entry for new sequence `id` (REQUIRES: not live): zeroed
  // fields, an empty table, the next generation.
  int32_t Create(SequenceId id);
  // Undoes the Create that returned `entry`, generation included.
  void UndoCreate(int32_t entry);
  // Unmaps the live sequence at `entry` and marks it not live (its pages
  // are the caller's); the entry is reused after ReleaseRemoved.
  void Remove(int32_t entry);
  // Undoes the newest Remove, which removed `entry`.
  void UndoRemove(int32_t entry);
  // Makes the removed entries free (at the outermost commit).
  void ReleaseRemoved() {
    for (const int32_t entry : removed_) free_.push_back(entry);
    removed_.clear();
  }

  SequenceHot& hot(int32_t entry) { return hot_[entry]; }
  const SequenceHot& hot(int32_t entry) const { return hot_[entry]; }
  SequenceCold& cold(int32_t entry) { return cold_[entry]; }
  const SequenceCold& cold(int32_t entry) const { return cold_[entry]; }
  // The partial page's tokens of `entry` (page_size entries).
  TokenId* partial(int32_t entry) {
    return partial_.data() + static_cast<size_t>(entry) * page_size_;
  }
  const TokenId* partial(int32_t entry) const {
    return partial_.data() + static_cast<size_t>(entry) * page_size_;
  }
  // For loops over many entries: the arrays themselves (valid until the
  // next Create, which may grow them).
  SequenceHot* hot_data() { return hot_.data(); }
  TokenId* partial_data() { return partial_.data(); }

  // Entries in use or not: every handle's index is below it.
  int32_t limit() const { return static_cast<int32_t>(hot_.size()); }
  int32_t num_live() const { return static_cast<int32_t>(handle_of_.size()); }
  // Live ids and their entries, in no particular order.
  const absl::flat_hash_map<SequenceId, int32_t>& live() const {
    return handle_of_;
  }

 private:
  const int32_t max_pages_per_seq_;
  const int32_t page_size_;
  std::vector<SequenceHot> hot_;
  std::vector<SequenceCold> cold_;
  std::vector<TokenId> partial_;
  std::vector<int32_t> free_;     // LIFO: the next Create takes back().
  std::vector<int32_t> removed_;  // pending until ReleaseRemoved.
  absl::flat_hash_map<SequenceId, int32_t> handle_of_;
};

}  // namespace kvblock::internal

#endif  // KVBLOCK_LIB_SEQUENCE_SEQUENCE_SLAB_H_
