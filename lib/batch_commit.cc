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
  slots_.resize(max_batch, kNoSequence);
  handles_.resize(max_batch);
  join_numbers_.resize(max_batch, -1);
  join_number_of_handle_.assign(manager.handle_limit(), -1);
  leaving_.assign(max_batch, 0);
  leaving_slots_.reserve(max_batch);
  old_to_new_.assign(max_batch, kNoSlot);
  next_slots_.resize(max_batch, kNoSequence);
  next_handles_.resize(max_batch);
  next_join_numbers_.resize(max_batch, -1);
  survivor_counts_.resize(max_batch, 0);
  appended_.changed.reserve(max_batch);
  appended_.first_changed_page.reserve(max_batch);
  appended_.copies.reserve(max_batch);
  changed_slots_.reserve(max_batch);
  copies_.reserve(max_batch);
  rows_.reserve(max_batch);
  joining_.reserve(max_batch);
  joined_ids_.reserve(max_batch);
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

  const int32_t survivors =
      next_batch_ - static_cast<int32_t>(plan.joins.size());
  slots_.swap(next_slots_);
  handles_.swap(next_handles_);
  join_numbers_.swap(next_join_numbers_);
  batch_ = next_batch_;
  // Joins may have grown the manager's slab (allocation only then).
  if (join_number_of_handle_.size() <
      static_cast<size_t>(manager_.handle_limit())) {
    join_number_of_handle_.resize(manager_.handle_limit(), -1);
  }
  for (SlotId slot = survivors; slot < batch_; ++slot) {
    join_number_of_handle_[handles_[slot].index] = join_numbers_[slot];
  }
  joins_ += static_cast<int64_t>(plan.joins.size());
  return StepResult{
      .old_to_new = absl::MakeConstSpan(old_to_new_),
      .batch = batch_,
      .changed_slots = changed_slots_,
      .copies = copies_,
      .new_pages = new_pages_,
  };
}

absl::Status BatchCommit::Validate(const StepPlan& plan) {
  const SlotId batch = batch_;
  for (const SlotId slot : leaving_slots_) leaving_[slot] = 0;
  leaving_slots_.clear();
  // Erased one by one: Abseil's clear() frees a large table, and the next
  // insert would allocate it again.
  for (const SequenceId id : joined_ids_) joining_.erase(id);
  joined_ids_.clear();

  if (!plan.append_counts.empty() &&
      plan.append_counts.size() != static_cast<size_t>(batch)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch commit: append_counts has ", plan.append_counts.size(),
        " entries, the batch has ", batch, " sequences"));
  }
  // Branch-free, so it vectorizes; the negative count is found only when
  // there is one.
  int64_t appended = 0;
  int32_t any_negative = 0;
  for (const int32_t count : plan.append_counts) {
    appended += count;
    any_negative |= count;
  }
  if (any_negative < 0) {
    const auto negative =
        std::find_if(plan.append_counts.begin(), plan.append_counts.end(),
                     [](int32_t count) { return count < 0; });
    return absl::InvalidArgumentError(absl::StrCat(
        "batch commit: append_counts[", negative - plan.append_counts.begin(),
        "] is ", *negative));
  }
  if (appended != static_cast<int64_t>(plan.append_tokens.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch commit: append_counts add up to ", appended,
                     " tokens, append_tokens has ", plan.append_tokens.size()));
  }

  int32_t leaving = 0;
  for (const absl::Span<const SequenceId> ids :
       {plan.finished, plan.preempted}) {
    for (const SequenceId id : ids) {
      const SlotId slot = RunningSlot(id);
      if (slot == kNoSlot) {
        return absl::NotFoundError(absl::StrCat(
            "batch commit: leaving sequence ", id, " is not running"));
      }
      if (leaving_[slot]) {
        return absl::InvalidArgumentError(
            absl::StrCat("batch commit: sequence ", id, " leaves twice"));
      }
      if (!plan.append_counts.empty() && plan.append_counts[slot] != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("batch commit: leaving sequence ", id, " appends ",
                         plan.append_counts[slot], " tokens"));
      }
      leaving_[slot] = 1;
      leaving_slots_.push_back(slot);
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
            "batch commit: joining sequence ", join.id, " forks ", join.fork_of,
            ", which is neither running nor joined before it"));
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
    joined_ids_.push_back(join.id);
    if (!joining_.insert(join.id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch commit: sequence ", join.id, " joins twice"));
    }
  }

  const int64_t next_batch =
      int64_t{batch} - leaving + static_cast<int64_t>(plan.joins.size());
  if (next_batch > table_.max_batch()) {
    return absl::FailedPreconditionError(
        absl::StrCat("batch commit: the step would run ", next_batch,
                     " sequences, more than max_batch = ", table_.max_batch()));
  }
  return absl::OkStatus();
}

SlotId BatchCommit::RunningSlot(SequenceId id) const {
  const absl::StatusOr<SequenceHandle> handle = manager_.HandleOf(id);
  if (!handle.ok() ||
      static_cast<size_t>(handle->index) >= join_number_of_handle_.size()) {
    return kNoSlot;
  }
  const int64_t number = join_number_of_handle_[handle->index];
  const auto begin = join_numbers_.begin();
  const auto it = std::lower_bound(begin, begin + batch_, number);
  if (it == begin + batch_ || *it != number) return kNoSlot;
  const SlotId slot = static_cast<SlotId>(it - begin);
  return slots_[slot] == id ? slot : kNoSlot;
}

absl::Status BatchCommit::AddRow(SlotId slot, SequenceHandle handle,
                                 int32_t first) {
  if (internal::FaultInjection::ShouldFail()) {
    return absl::InternalError(
        absl::StrCat("batch commit: injected fault at the row of slot ", slot));
  }
  KVBLOCK_ASSIGN_OR_RETURN(const absl::Span<const PageId> pages,
                           manager_.PagesAt(handle));
  // Written in place (see BlockManager's journal): no store-forwarding stall.
  KVPageTableRowUpdate& row = rows_.emplace_back();
  row.slot = slot;
  row.k_page_ids = pages.data();
  row.count = static_cast<int32_t>(pages.size());
  row.first = first;
  changed_slots_.push_back(slot);
  return absl::OkStatus();
}

absl::Status BatchCommit::Apply(const StepPlan& plan, bool& table_changed) {
  const SlotId batch = batch_;
  copies_.clear();
  rows_.clear();
  changed_slots_.clear();
  new_pages_ = 0;

  for (const SequenceId id : plan.finished) {
    KVBLOCK_RETURN_IF_ERROR(manager_.Free(id));
  }
  for (const SequenceId id : plan.preempted) {
    KVBLOCK_RETURN_IF_ERROR(manager_.Preempt(id));
  }
  for (const JoinRequest& join : plan.joins) {
    if (join.fork_of == kNoSequence) {
      KVBLOCK_ASSIGN_OR_RETURN(
          const AdmissionPlan admitted,
          manager_.Admit(join.id, join.tokens, join.extra, join.prompt_hashes));
      new_pages_ += admitted.new_pages;
    } else {
      KVBLOCK_RETURN_IF_ERROR(manager_.Fork(join.fork_of, join.id));
    }
  }

  // Survivors: each run between leaving slots moves down as a block.
  std::sort(leaving_slots_.begin(), leaving_slots_.end());
  SlotId survivors = 0;
  for (size_t i = 0, begin = 0; i <= leaving_slots_.size(); ++i) {
    const SlotId end = i < leaving_slots_.size() ? leaving_slots_[i] : batch;
    const SlotId first = static_cast<SlotId>(begin);
    const int32_t run = end - first;
    std::copy_n(slots_.begin() + first, run, next_slots_.begin() + survivors);
    std::copy_n(handles_.begin() + first, run,
                next_handles_.begin() + survivors);
    std::copy_n(join_numbers_.begin() + first, run,
                next_join_numbers_.begin() + survivors);
    if (plan.append_counts.empty()) {
      std::fill_n(survivor_counts_.begin() + survivors, run, 0);
    } else {
      std::copy_n(plan.append_counts.begin() + first, run,
                  survivor_counts_.begin() + survivors);
    }
    for (SlotId slot = first; slot < end; ++slot) {
      old_to_new_[slot] = slot - first + survivors;
    }
    survivors += run;
    if (end < batch) old_to_new_[end] = kNoSlot;
    begin = static_cast<size_t>(end) + 1;
  }
  std::fill(old_to_new_.begin() + batch, old_to_new_.end(), kNoSlot);
  KVBLOCK_RETURN_IF_ERROR(manager_.AppendMany(
      absl::MakeConstSpan(next_handles_).first(survivors),
      absl::MakeConstSpan(survivor_counts_).first(survivors),
      plan.append_tokens, appended_));
  copies_.insert(copies_.end(), appended_.copies.begin(),
                 appended_.copies.end());
  new_pages_ += appended_.new_pages;
  // A survivor's row moved with it: it changes from its first changed page.
  for (size_t i = 0; i < appended_.changed.size(); ++i) {
    const SlotId slot = appended_.changed[i];
    KVBLOCK_RETURN_IF_ERROR(
        AddRow(slot, next_handles_[slot], appended_.first_changed_page[i]));
  }

  // Joins take the next slots; forks append after every survivor did.
  next_batch_ = survivors;
  for (const JoinRequest& join : plan.joins) {
    const SlotId new_slot = next_batch_++;
    KVBLOCK_ASSIGN_OR_RETURN(const SequenceHandle handle,
                             manager_.HandleOf(join.id));
    next_slots_[new_slot] = join.id;
    next_handles_[new_slot] = handle;
    next_join_numbers_[new_slot] = joins_ + (new_slot - survivors);
    if (join.fork_of != kNoSequence && !join.tokens.empty()) {
      KVBLOCK_ASSIGN_OR_RETURN(const AppendResult result,
                               manager_.Append(join.id, join.tokens));
      if (result.copy.has_value()) copies_.push_back(*result.copy);
      new_pages_ += result.new_pages;
    }
    KVBLOCK_RETURN_IF_ERROR(AddRow(new_slot, handle, 0));
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
    if (slot < batch_) {
      KVBLOCK_ASSIGN_OR_RETURN(const absl::Span<const PageId> pages,
                               manager_.Pages(slots_[slot]));
      rows_.push_back({slot, pages.data(), static_cast<int32_t>(pages.size())});
    } else {
      rows_.push_back({slot, nullptr, 0});
    }
  }
  return table_.SetRows(rows_);
}

absl::Span<const SequenceId> BatchCommit::slots() const {
  return absl::MakeConstSpan(slots_).first(batch_);
}

absl::StatusOr<SlotId> BatchCommit::SlotOf(SequenceId id) const {
  const SlotId slot = RunningSlot(id);
  if (slot == kNoSlot) {
    return absl::NotFoundError(
        absl::StrCat("batch commit: sequence ", id, " is not running"));
  }
  return slot;
}

int32_t BatchCommit::batch() const { return batch_; }

absl::Status BatchCommit::CheckInvariants() const {
  KVBLOCK_RETURN_IF_ERROR(manager_.CheckInvariants());
  KVBLOCK_RETURN_IF_ERROR(table_.CheckInvariants());
  for (SlotId slot = 1; slot < batch_; ++slot) {
    if (join_numbers_[slot - 1] >= join_numbers_[slot]) {
      return absl::InternalError(absl::StrCat(
          "batch commit: join numbers do not increase at slot ", slot));
    }
  }
  for (SlotId slot = 0; slot < table_.max_batch(); ++slot) {
    KVBLOCK_ASSIGN_OR_RETURN(const absl::Span<const PageId> row,
                             table_.HostRow(slot));
    absl::Span<const PageId> expected;
    if (slot < batch_) {
      const SequenceId id = slots_[slot];
      const absl::StatusOr<SequenceHandle> handle = manager_.HandleOf(id);
      if (!handle.ok() || *handle != handles_[slot] ||
          static_cast<size_t>(handle->index) >= join_number_of_handle_.size() ||
          join_number_of_handle_[handle->index] != join_numbers_[slot] ||
          RunningSlot(id) != slot) {
        return absl::InternalError(
            absl::StrCat("batch commit: slot ", slot, " holds sequence ", id,
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
