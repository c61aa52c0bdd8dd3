// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "manager/step_journal.h"

#include <algorithm>
#include <utility>

namespace kvblock::internal {

StepJournal::StepJournal(size_t sequences, int32_t page_size, size_t pages)
    : page_size_(page_size) {
  // A step journals about one record per running sequence, and saves at
  // most a page of tokens and a hash for each.
  records_.reserve(2 * sequences);
  GrowRuns(sequences);
  tokens_.reserve(sequences * static_cast<size_t>(page_size));
  pages_.reserve(pages);
  hashes_.reserve(sequences);
}

void StepJournal::Rollback(const Mark& mark, SequenceSlab& slab) {
  while (records_.size() > mark.records) {
    Undo(records_.back(), slab);
    records_.pop_back();
  }
  runs_size_ = mark.runs;
  tokens_.resize(mark.tokens);
  pages_.resize(mark.pages);
  hashes_.resize(mark.hashes);
  --depth_;
}

void StepJournal::Undo(const JournalRecord& record, SequenceSlab& slab) const {
  switch (record.kind) {
    case JournalRecord::Kind::kCreated:
      return Undo(record.created, slab);
    case JournalRecord::Kind::kRemoved:
      return Undo(record.removed, slab);
    case JournalRecord::Kind::kAppended:
      return Undo(record.appended, slab);
    case JournalRecord::Kind::kAppendedRun:
      return Undo(record.appended_run, slab);
    case JournalRecord::Kind::kChanged:
      return Undo(record.changed, slab);
    case JournalRecord::Kind::kDrafted:
      return Undo(record.drafted, slab);
    case JournalRecord::Kind::kEdgeStep:
      return Undo(record.edge_step, slab);
    case JournalRecord::Kind::kSkipped:
      return Undo(record.skipped, slab);
  }
}

void StepJournal::GrowRuns(size_t capacity) {
  capacity = std::max(capacity, 2 * runs_capacity_);
  std::unique_ptr<InPlaceAppend[]> runs(new InPlaceAppend[capacity]);
  std::copy_n(runs_.get(), runs_size_, runs.get());
  runs_ = std::move(runs);
  runs_capacity_ = capacity;
}

}  // namespace kvblock::internal
