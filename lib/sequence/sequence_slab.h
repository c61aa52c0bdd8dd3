// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Internal: SequenceSlab, BlockManager's live sequences. Each has an entry
// (its handle's index) in flat arrays reserved up front: its Sequence, what
// every append reads (length, drafts, the shared-tail flag, its page table),
// kept apart from a cold record (id, chain hash, cache salt, adapter), and
// its partial page's tokens in one flat array. Ids map to
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
#include "kvblock/types.h"
#include "sequence/sequence.h"

namespace kvblock::internal {

// What appends read only when a page fills, and the ids.
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
           static_cast<size_t>(handle.index) < sequences_.size() &&
           sequences_[handle.index].live_ &&
           sequences_[handle.index].generation_ == handle.generation;
  }
  SequenceHandle HandleAt(int32_t entry) const {
    return {entry, sequences_[entry].generation_};
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

  Sequence& sequence(int32_t entry) { return sequences_[entry]; }
  const Sequence& sequence(int32_t entry) const { return sequences_[entry]; }
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
  Sequence* sequence_data() { return sequences_.data(); }
  TokenId* partial_data() { return partial_.data(); }

  // Entries in use or not: every handle's index is below it.
  int32_t limit() const { return static_cast<int32_t>(sequences_.size()); }
  int32_t num_live() const { return static_cast<int32_t>(handle_of_.size()); }
  // Live ids and their entries, in no particular order.
  const absl::flat_hash_map<SequenceId, int32_t>& live() const {
    return handle_of_;
  }

 private:
  const int32_t max_pages_per_seq_;
  const int32_t page_size_;
  std::vector<Sequence> sequences_;
  std::vector<SequenceCold> cold_;
  std::vector<TokenId> partial_;
  std::vector<int32_t> free_;     // LIFO: the next Create takes back().
  std::vector<int32_t> removed_;  // pending until ReleaseRemoved.
  absl::flat_hash_map<SequenceId, int32_t> handle_of_;
};

}  // namespace kvblock::internal

#endif  // KVBLOCK_LIB_SEQUENCE_SEQUENCE_SLAB_H_
