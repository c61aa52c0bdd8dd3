// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "sequence/sequence_slab.h"

namespace kvblock::internal {

SequenceSlab::SequenceSlab(int32_t reserved, int32_t max_pages_per_seq,
                           int32_t page_size)
    : max_pages_per_seq_(max_pages_per_seq), page_size_(page_size) {
  sequences_.reserve(reserved);
  cold_.reserve(reserved);
  for (int32_t entry = 0; entry < reserved; ++entry) {
    sequences_.emplace_back(max_pages_per_seq, page_size);
  }
  cold_.resize(reserved);
  partial_.resize(static_cast<size_t>(reserved) * page_size);
  free_.reserve(reserved);
  removed_.reserve(reserved);
  handle_of_.reserve(reserved);
  // LIFO: entry 0 is handed out first.
  for (int32_t entry = reserved - 1; entry >= 0; --entry) {
    free_.push_back(entry);
  }
}

int32_t SequenceSlab::Create(SequenceId id) {
  if (free_.empty()) {
    // Grown entries join the free list, so that an undone Create leaves the
    // next one to take the same entry.
    free_.push_back(static_cast<int32_t>(sequences_.size()));
    sequences_.emplace_back(max_pages_per_seq_, page_size_);
    cold_.emplace_back();
    partial_.resize(partial_.size() + page_size_);
  }
  const int32_t entry = free_.back();
  free_.pop_back();
  Sequence& sequence = sequences_[entry];
  sequence.num_tokens_ = 0;
  sequence.offset_ = 0;
  sequence.drafts_ = 0;
  sequence.prompt_end_ = 0;
  sequence.skip_due_at_ = 0;
  sequence.tail_maybe_shared_ = false;
  sequence.live_ = true;
  sequence.run_by_commit_ = false;
  ++sequence.generation_;
  SequenceCold& cold = cold_[entry];
  cold.id = id;
  cold.last_full_hash = BlockHash{};
  cold.cache_salt.clear();
  cold.adapter_id = 0;
  cold.reserves = false;
  handle_of_.emplace(id, entry);
  return entry;
}

void SequenceSlab::UndoCreate(int32_t entry) {
  Sequence& sequence = sequences_[entry];
  // The pool's rollback takes back the references the table held.
  sequence.table_.ForgetFrom(0);
  sequence.live_ = false;
  --sequence.generation_;
  handle_of_.erase(cold_[entry].id);
  cold_[entry].id = kNoSequence;
  free_.push_back(entry);
}

void SequenceSlab::Remove(int32_t entry) {
  handle_of_.erase(cold_[entry].id);
  sequences_[entry].live_ = false;
  removed_.push_back(entry);
}

void SequenceSlab::UndoRemove(int32_t entry) {
  handle_of_[cold_[entry].id] = entry;
  sequences_[entry].live_ = true;
  removed_.pop_back();
}

}  // namespace kvblock::internal
