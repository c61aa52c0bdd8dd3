// Copyright 2026 The kvblock Authors.
#include "kvblock/batch_commit.h"

#include <algorithm>
#include <cstdint>
#include <memory>

#include "absl/strings/str_cat.h"
#include "fault_injection.h"
#include "status_macros.h"

namespace kvblock {

absl::StatusOr<std::unique_ptr<BatchCommit>> BatchCommit::Create(
    BlockManager& manager, KVPageTable& table) {
  const PagedKvConfig& config = manager.config();
  if (table.max_batch() != config.max_batch ||
      table.max_pages_per_seq() != config.max_pages_per_seq ||
      table.num_pages() != config.num_pages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch commit: page table geometry (max_batch ", table.max_batch(),
        ", max_pages_per_seq ", table.max_pages_per_seq(), ", num_pages ",
        table.num_pages(), ") differs from the manager's config (",
        config.max_batch, ", ", config.max_pages_per_seq, ", ",
        config.num_pages, ")"));
  }
  return std::unique_ptr<BatchCommit>(new BatchCommit(manager, table));
}

BatchCommit::BatchCommit(BlockManager& manager, KVPageTable& table)
    : manager_(manager), table_(table) {
  const size_t max_batch = static_cast<size_t>(table.max_batch());
  slots_.reserve(max_batch);
  handles_.reserve(max_batch);
  slot_of_handle_.assign(manager.handle_limit(), kNoSlot);
  leaving_.assign(max_batch, 0);
  old_to_new_.assign(max_batch, kNoSlot);
  next_slots_.reserve(max_batch);
  next_handles_.reserve(max_batch);
  survivor_counts_.reserve(max_batch);
  appended_.changed.reserve(max_batch);
  appended_.copies.reserve(max_batch);
  changed_slots_.reserve(max_batch);
  copies_.reserve(max_batch);
  rows_.reserve(max_batch);
  joining_.reserve(max_batch);
}

absl::StatusOr<StepResult> BatchCommit::Commit(const StepPlan& plan) {
  KVBLOCK_RETURN_IF_ERROR(Validate(plan));
  KVBLOCK_RETURN_IF_ERROR(manager_.BeginStep());
  bool table_changed = false;
  if (absl::Status status = Apply(plan, table_changed); !status.ok()) {
    KVBLOCK_RETURN_IF_ERROR(manager_.RollbackStep());
    if (table_changed) KVBLOCK_RETURN_IF_ERROR(RestoreTable());
    return status;
  }
  KVBLOCK_RETURN_IF_ERROR(manager_.CommitStep());

  // Survivors before the first leaving slot keep their slots; only the
  // moved survivors and the joins are reindexed.
  const SlotId old_batch = static_cast<SlotId>(slots_.size());
  SlotId first_moved = old_batch;
  for (SlotId slot = 0; slot < old_batch; ++slot) {
    if (!leaving_[slot]) continue;
    slot_of_handle_[handles_[slot]] = kNoSlot;
    first_moved = std::min(first_moved, slot);
  }
  slots_.swap(next_slots_);
  handles_.swap(next_handles_);
  // Joins may have grown the manager's slab (allocation only then).
  if (slot_of_handle_.size() < static_cast<size_t>(manager_.handle_limit())) {
    slot_of_handle_.resize(manager_.handle_limit(), kNoSlot);
  }
  for (SlotId slot = first_moved; slot < static_cast<SlotId>(slots_.size());
       ++slot) {
    slot_of_handle_[handles_[slot]] = slot;
  }
  return StepResult{
      .old_to_new = absl::MakeConstSpan(old_to_new_),
      .batch = static_cast<int32_t>(slots_.size()),
      .changed_slots = changed_slots_,
      .copies = copies_,
      .new_pages = new_pages_,
  };
}

absl::Status BatchCommit::Validate(const StepPlan& plan) {
  const SlotId batch = static_cast<SlotId>(slots_.size());
  std::fill(leaving_.begin(), leaving_.end(), 0);
  joining_.clear();

  if (!plan.append_counts.empty() &&
      plan.append_counts.size() != static_cast<size_t>(batch)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch commit: append_counts has ", plan.append_counts.size(),
        " entries, the batch has ", batch, " sequences"));
  }
  int64_t appended = 0;
  for (size_t slot = 0; slot < plan.append_counts.size(); ++slot) {
    if (plan.append_counts[slot] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch commit: append_counts[", slot, "] is ",
                       plan.append_counts[slot]));
    }
    appended += plan.append_counts[slot];
  }
  if (appended != static_cast<int64_t>(plan.append_tokens.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch commit: append_counts add up to ", appended,
        " tokens, append_tokens has ", plan.append_tokens.size()));
  }

  int32_t leaving = 0;
  for (const absl::Span<const SequenceId> ids : {plan.finished, plan.preempted}) {
    for (const SequenceId id : ids) {
      const SlotId slot = RunningSlot(id);
      if (slot == kNoSlot) {
        return absl::NotFoundError(absl::StrCat(
            "batch commit: leaving sequence ", id, " is not running"));
      }
      if (leaving_[slot]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "batch commit: sequence ", id, " leaves twice"));
      }
      if (!plan.append_counts.empty() && plan.append_counts[slot] != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "batch commit: leaving sequence ", id, " appends ",
            plan.append_counts[slot], " tokens"));
      }
      leaving_[slot] = 1;
      ++leaving;
    }
  }

  for (size_t i = 0; i < plan.joins.size(); ++i) {
    const JoinRequest& join = plan.joins[i];
    if (join.id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch commit: joins[", i, "] has id ", join.id));
    }
    if (manager_.Contains(join.id)) {
      return absl::AlreadyExistsError(absl::StrCat(
          "batch commit: joining sequence ", join.id, " is already live"));
    }
    if (join.fork_of != kNoSequence) {
      const SlotId parent = RunningSlot(join.fork_of);
      const bool running = parent != kNoSlot && !leaving_[parent];
      const bool joined = joining_.contains(join.fork_of);
      if (!running && !joined) {
        return absl::InvalidArgumentError(absl::StrCat(
            "batch commit: joining sequence ", join.id, " forks ",
            join.fork_of, ", which is neither running nor joined before it"));
      }
      // The parent's prompt is prefilled by this very step: a copy of its
      // partial page would run before that page holds any KV.
      if (joined && !join.tokens.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "batch commit: sequence ", join.id, " forks ", join.fork_of,
            ", which joins in the same step, and appends ", join.tokens.size(),
            " tokens: append them in the next step"));
      }
    }
    if (!joining_.insert(join.id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch commit: sequence ", join.id, " joins twice"));
    }
  }

  const int64_t next_batch =
      int64_t{batch} - leaving + static_cast<int64_t>(plan.joins.size());
  if (next_batch > table_.max_batch()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "batch commit: the step would run ", next_batch,
        " sequences, more than max_batch = ", table_.max_batch()));
  }
  return absl::OkStatus();
}

SlotId BatchCommit::RunningSlot(SequenceId id) const {
  const absl::StatusOr<SequenceHandle> handle = manager_.HandleOf(id);
  if (!handle.ok() || static_cast<size_t>(*handle) >= slot_of_handle_.size()) {
    return kNoSlot;
  }
  return slot_of_handle_[*handle];
}

absl::Status BatchCommit::AddRow(SlotId slot, SequenceHandle handle) {
  if (internal::FaultInjection::ShouldFail()) {
    return absl::InternalError(
        absl::StrCat("batch commit: injected fault at the row of slot ", slot));
  }
  KVBLOCK_ASSIGN_OR_RETURN(const absl::Span<const PageId> pages,
                           manager_.PagesAt(handle));
  rows_.push_back({slot, pages.data(), static_cast<int32_t>(pages.size())});
  changed_slots_.push_back(slot);
  return absl::OkStatus();
}

absl::Status BatchCommit::Apply(const StepPlan& plan, bool& table_changed) {
  const SlotId batch = static_cast<SlotId>(slots_.size());
  copies_.clear();
  rows_.clear();
  changed_slots_.clear();
  next_slots_.clear();
  next_handles_.clear();
  survivor_counts_.clear();
  new_pages_ = 0;

  for (const SequenceId id : plan.finished) {
    KVBLOCK_RETURN_IF_ERROR(manager_.Free(id));
  }
  for (const SequenceId id : plan.preempted) {
    KVBLOCK_RETURN_IF_ERROR(manager_.Preempt(id));
  }
  for (const JoinRequest& join : plan.joins) {
    if (join.fork_of == kNoSequence) {
      KVBLOCK_ASSIGN_OR_RETURN(const AdmissionPlan admitted,
                               manager_.Admit(join.id, join.tokens, join.extra));
      new_pages_ += admitted.new_pages;
    } else {
      KVBLOCK_RETURN_IF_ERROR(manager_.Fork(join.fork_of, join.id));
    }
  }

  // Survivors take the next dense slots, then append in one batch (the
  // tokens of leaving slots are none, so append_tokens stays in order).
  for (SlotId slot = 0; slot < batch; ++slot) {
    if (leaving_[slot]) {
      old_to_new_[slot] = kNoSlot;
      continue;
    }
    old_to_new_[slot] = static_cast<SlotId>(next_slots_.size());
    next_slots_.push_back(slots_[slot]);
    next_handles_.push_back(handles_[slot]);
    survivor_counts_.push_back(
        plan.append_counts.empty() ? 0 : plan.append_counts[slot]);
  }
  std::fill(old_to_new_.begin() + batch, old_to_new_.end(), kNoSlot);
  const int32_t survivors = static_cast<int32_t>(next_slots_.size());
  KVBLOCK_RETURN_IF_ERROR(manager_.AppendMany(
      next_handles_, survivor_counts_, plan.append_tokens, appended_));
  copies_.insert(copies_.end(), appended_.copies.begin(),
                 appended_.copies.end());
  new_pages_ += appended_.new_pages;
  for (const int32_t slot : appended_.changed) {
    KVBLOCK_RETURN_IF_ERROR(AddRow(slot, next_handles_[slot]));
  }

  // Joins take the next slots; forks append after every survivor did.
  for (const JoinRequest& join : plan.joins) {
    const SlotId new_slot = static_cast<SlotId>(next_slots_.size());
    KVBLOCK_ASSIGN_OR_RETURN(const SequenceHandle handle,
                             manager_.HandleOf(join.id));
    next_slots_.push_back(join.id);
    next_handles_.push_back(handle);
    if (join.fork_of != kNoSequence && !join.tokens.empty()) {
      KVBLOCK_ASSIGN_OR_RETURN(const AppendResult result,
                               manager_.Append(join.id, join.tokens));
      if (result.copy.has_value()) copies_.push_back(*result.copy);
      new_pages_ += result.new_pages;
    }
    KVBLOCK_RETURN_IF_ERROR(AddRow(new_slot, handle));
  }

  // Compaction packs the survivors and clears the rows the joins will take.
  // Both calls validate before they change anything; only a failing SetRows
  // after a successful CompactRows leaves the table to restore.
  KVBLOCK_RETURN_IF_ERROR(table_.CompactRows(old_to_new_, survivors));
  table_changed = true;
  if (internal::FaultInjection::ShouldFail()) {
    return absl::InternalError("batch commit: injected fault before SetRows");
  }
  return table_.SetRows(rows_);
}

absl::Status BatchCommit::RestoreTable() {
  rows_.clear();
  for (SlotId slot = 0; slot < table_.max_batch(); ++slot) {
    if (slot < static_cast<SlotId>(slots_.size())) {
      KVBLOCK_ASSIGN_OR_RETURN(const absl::Span<const PageId> pages,
                               manager_.Pages(slots_[slot]));
      rows_.push_back({slot, pages.data(), static_cast<int32_t>(pages.size())});
    } else {
      rows_.push_back({slot, nullptr, 0});
    }
  }
  return table_.SetRows(rows_);
}

absl::Span<const SequenceId> BatchCommit::slots() const { return slots_; }

absl::StatusOr<SlotId> BatchCommit::SlotOf(SequenceId id) const {
  const SlotId slot = RunningSlot(id);
  if (slot == kNoSlot) {
    return absl::NotFoundError(
        absl::StrCat("batch commit: sequence ", id, " is not running"));
  }
  return slot;
}

int32_t BatchCommit::batch() const { return static_cast<int32_t>(slots_.size()); }

absl::Status BatchCommit::CheckInvariants() const {
  KVBLOCK_RETURN_IF_ERROR(manager_.CheckInvariants());
  KVBLOCK_RETURN_IF_ERROR(table_.CheckInvariants());
  const auto indexed = std::count_if(
      slot_of_handle_.begin(), slot_of_handle_.end(),
      [](SlotId slot) { return slot != kNoSlot; });
  if (static_cast<size_t>(indexed) != slots_.size() ||
      handles_.size() != slots_.size()) {
    return absl::InternalError(absl::StrCat(
        "batch commit: ", slots_.size(), " slots, ", handles_.size(),
        " handles and ", indexed, " indexed handles"));
  }
  for (SlotId slot = 0; slot < table_.max_batch(); ++slot) {
    KVBLOCK_ASSIGN_OR_RETURN(const absl::Span<const PageId> row,
                             table_.HostRow(slot));
    absl::Span<const PageId> expected;
    if (slot < static_cast<SlotId>(slots_.size())) {
      const SequenceId id = slots_[slot];
      const absl::StatusOr<SequenceHandle> handle = manager_.HandleOf(id);
      if (!handle.ok() || *handle != handles_[slot] ||
          static_cast<size_t>(*handle) >= slot_of_handle_.size() ||
          slot_of_handle_[*handle] != slot) {
        return absl::InternalError(absl::StrCat(
            "batch commit: slot ", slot, " holds sequence ", id,
            " whose index entry disagrees"));
      }
      KVBLOCK_ASSIGN_OR_RETURN(expected, manager_.Pages(id));
    }
    const bool same =
        std::equal(expected.begin(), expected.end(), row.begin()) &&
        (expected.size() == row.size() || row[expected.size()] == kNoPage);
    if (!same) {
      return absl::InternalError(absl::StrCat(
          "batch commit: row ", slot, " differs from its sequence's pages"));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvblock
