// Copyright 2026 The kvblock Authors.
#include "manager/step_journal.h"

#include <algorithm>
#include <utility>

namespace kvblock::internal {

StepJournal::StepJournal(size_t sequences, int32_t page_size, size_t pages) {
  // A step journals about one record per running sequence, and saves at
  // most a page of tokens and a hash for each.
  records_.reserve(2 * sequences);
  GrowRuns(sequences);
  tokens_.reserve(sequences * static_cast<size_t>(page_size));
  pages_.reserve(pages);
  hashes_.reserve(sequences);
}

void StepJournal::GrowRuns(size_t capacity) {
  capacity = std::max(capacity, 2 * runs_capacity_);
  std::unique_ptr<InPlaceAppend[]> runs(new InPlaceAppend[capacity]);
  std::copy_n(runs_.get(), runs_size_, runs.get());
  runs_ = std::move(runs);
  runs_capacity_ = capacity;
}

}  // namespace kvblock::internal
