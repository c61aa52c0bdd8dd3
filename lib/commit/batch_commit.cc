// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "kvblock/batch_commit.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "base/fault_injection.h"
#include "kvblock/status_macros.h"
#include "manager/block_manager_impl.h"

namespace kvblock {

// The commit's state: the running batch by slot and the step's scratch,
// and the step's parts.
class BatchCommit::Impl {
 public:
  Impl(internal::BlockManagerImpl& manager, KVPageTable& table);
  ~Impl();

  // BatchCommit's calls, as documented there.
  absl::StatusOr<StepResult> Commit(const StepPlan& plan);
  absl::StatusOr<int64_t> AppendPages(
      absl::Span<const int32_t> append_counts,
      absl::Span<const int32_t> draft_counts) const;
  absl::Span<const SequenceId> slots() const {
    return absl::MakeConstSpan(slots_).first(batch_);
  }
  absl::StatusOr<SlotId> SlotOf(SequenceId id) const;
  int32_t batch() const { return batch_; }
  void set_time_phases(bool on) { time_phases_ = on; }
  bool time_phases() const { return time_phases_; }
  const CommitPhaseTimes& phase_times() const { return phase_times_; }
  absl::Status CheckInvariants() const;

 private:
  // Checks everything that can be checked before changing anything; marks the
  // leaving slots.
  absl::Status Validate(const StepPlan& plan);
  // Runs the step inside an open manager step, up to and including the page
  // table's edit; the slot arrays change only in Adopt, once it succeeded
  // (and the leaving slots' handles, blanked for AppendMany, are restored).
  absl::Status Apply(const StepPlan& plan);
  // Makes the committed step's slots the running ones.
  void Adopt(const StepPlan& plan);
  // Undoes what Apply did to handles_ (the leaving slots it blanked).
  void RestoreHandles();
  // Returns old_to_new_ to its resting state for batch_: identity below it,
  // -1 past it.
  void ResetSlotMap();
  // The slot of running sequence `id`, or kNoSlot.
  SlotId RunningSlot(SequenceId id) const;
  // Now, in nanoseconds of the steady clock, while phase timing is on; 0
  // (with no clock read) otherwise.
  int64_t PhaseClock() const;
  // Queues slot `slot`'s row update: `pages` (a sequence's), rewritten from
  // page `first` on (the row holds the ones before).
  absl::Status AddRow(SlotId slot, absl::Span<const PageId> pages,
                      int32_t first);

  internal::BlockManagerImpl& manager_;
  KVPageTable& table_;
  // Running sequences by slot (the first batch_ entries of max_batch): ids
  // and manager handles; and by manager handle index, the slot of the
  // sequence that holds it (or kNoSlot): a lookup by id is a hash lookup in
  // the manager and two loads.
  int32_t batch_ = 0;
  std::vector<SequenceId> slots_;
  std::vector<SequenceHandle> handles_;
  std::vector<SlotId> slot_of_handle_;

  // Step scratch, sized max_batch at construction.
  std::vector<uint8_t> leaving_;       // by old slot.
  std::vector<SlotId> leaving_slots_;  // sorted by Apply.
  int32_t survivors_ = 0;
  std::vector<KVPageTableRowMove> moves_;  // {mover's slot, hole}.
  // What the leaving slots held (by leaving_slots_ entry), while handles_
  // holds empty handles there (handles_blanked_).
  std::vector<SequenceHandle> leaving_handles_;
  bool handles_blanked_ = false;
  std::vector<SequenceHandle> joined_handles_;  // by join.
  // The slot map, at rest identity in [0, batch_) and -1 past it; a step
  // marks its leaving and moving slots, listed in map_marks_, and the next
  // step puts them back (with the slots between the two batch sizes).
  std::vector<SlotId> old_to_new_;
  std::vector<SlotId> map_marks_;
  int32_t map_batch_ = 0;
  std::vector<int32_t> zero_counts_;  // max_batch zeros: no appends.
  std::vector<uint8_t> chunked_;      // by old slot: has a prompt chunk.
  std::vector<SlotId> chunked_slots_;
  internal::AppendManyResult appended_;
  std::vector<SlotId> changed_slots_;
  std::vector<PageCopy> copies_;
  std::vector<KVPageTableRowUpdate> rows_;
  absl::flat_hash_set<SequenceId> joining_;
  std::vector<SequenceId> joined_ids_;  // what joining_ holds.
  int32_t new_pages_ = 0;
  int32_t draft_copies_ = 0;

  bool time_phases_ = false;
  CommitPhaseTimes phase_times_;
};

absl::StatusOr<std::unique_ptr<BatchCommit>> BatchCommit::Create(
    BlockManager& manager, KVPageTable& table) {
  if (manager.has_kv_cache_groups()) {
    return absl::UnimplementedError(absl::StrCat(
        "batch commit: the manager keeps ", manager.num_groups(),
        " KV cache groups of their own; a commit keeps the table of one "
        "full-attention group of the config's page size"));
  }
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
  return std::unique_ptr<BatchCommit>(new BatchCommit(
      std::make_unique<Impl>(internal::BlockManagerImpl::Of(manager), table)));
}

BatchCommit::Impl::~Impl() {
  // The manager outlives the commit: its sequences are the caller's again.
  for (SlotId slot = 0; slot < batch_; ++slot) {
    manager_.SetRunByCommit(handles_[slot], false);
  }
}

BatchCommit::Impl::Impl(internal::BlockManagerImpl& manager, KVPageTable& table)
    : manager_(manager), table_(table) {
  const size_t max_batch = static_cast<size_t>(table.max_batch());
  slots_.resize(max_batch, kNoSequence);
  handles_.resize(max_batch);
  slot_of_handle_.assign(manager.handle_limit(), kNoSlot);
  leaving_.assign(max_batch, 0);
  leaving_slots_.reserve(max_batch);
  moves_.reserve(max_batch);
  leaving_handles_.reserve(max_batch);
  joined_handles_.reserve(max_batch);
  old_to_new_.assign(max_batch, kNoSlot);
  map_marks_.reserve(2 * max_batch);
  zero_counts_.assign(max_batch, 0);
  chunked_.assign(max_batch, 0);
  chunked_slots_.reserve(max_batch);
  appended_.changed.reserve(max_batch);
  appended_.pages.reserve(max_batch);
  appended_.first_changed_page.reserve(max_batch);
  appended_.copies.reserve(max_batch);
  changed_slots_.reserve(max_batch);
  copies_.reserve(max_batch);
  rows_.reserve(max_batch);
  joining_.reserve(max_batch);
  joined_ids_.reserve(max_batch);
}

int64_t BatchCommit::Impl::PhaseClock() const {
  if (!time_phases_) return 0;
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

absl::StatusOr<StepResult> BatchCommit::Impl::Commit(const StepPlan& plan) {
  const int64_t start = PhaseClock();
  absl::Cleanup timed = [&] { phase_times_.total_ns += PhaseClock() - start; };
  KVBLOCK_RETURN_IF_ERROR(Validate(plan));
  KVBLOCK_RETURN_IF_ERROR(manager_.BeginStep());
  manager_.set_commit_applying(true);
  absl::Status applied = Apply(plan);
  manager_.set_commit_applying(false);
  if (absl::Status status = std::move(applied); !status.ok()) {
    RestoreHandles();
    KVBLOCK_RETURN_IF_ERROR(manager_.RollbackStep());
    return status;
  }
  KVBLOCK_RETURN_IF_ERROR(manager_.CommitStep());
  Adopt(plan);
  return StepResult{
      .old_to_new = absl::MakeConstSpan(old_to_new_),
      .batch = batch_,
      .moves = moves_,
      .changed_slots = changed_slots_,
      .copies = copies_,
      .new_pages = new_pages_,
      .draft_copies = draft_copies_,
  };
}

absl::Status BatchCommit::Impl::Validate(const StepPlan& plan) {
  const SlotId batch = batch_;
  for (const SlotId slot : leaving_slots_) leaving_[slot] = 0;
  leaving_slots_.clear();
  for (const SlotId slot : chunked_slots_) chunked_[slot] = 0;
  chunked_slots_.clear();
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
  if (!plan.draft_counts.empty()) {
    if (plan.draft_counts.size() != static_cast<size_t>(batch)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch commit: draft_counts has ", plan.draft_counts.size(),
          " entries, the batch has ", batch, " sequences"));
    }
    const auto negative =
        std::find_if(plan.draft_counts.begin(), plan.draft_counts.end(),
                     [](int32_t count) { return count < 0; });
    if (negative != plan.draft_counts.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch commit: draft_counts[", negative - plan.draft_counts.begin(),
          "] is ", *negative));
    }
  }
  // A slot's appends and drafts, when the plan gives any.
  const auto appends_of = [&](SlotId slot) {
    return plan.append_counts.empty() ? 0 : plan.append_counts[slot];
  };
  const auto drafts_of = [&](SlotId slot) {
    return plan.draft_counts.empty() ? 0 : plan.draft_counts[slot];
  };

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
      if (appends_of(slot) != 0 || drafts_of(slot) != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "batch commit: leaving sequence ", id, " appends ",
            appends_of(slot), " tokens and ", drafts_of(slot), " drafts"));
      }
      leaving_[slot] = 1;
      leaving_slots_.push_back(slot);
      ++leaving;
    }
  }

  for (const PromptChunk& chunk : plan.prompt_chunks) {
    const SlotId slot = RunningSlot(chunk.id);
    if (slot == kNoSlot) {
      return absl::NotFoundError(
          absl::StrCat("batch commit: prompt chunk of sequence ", chunk.id,
                       ", which is not running"));
    }
    if (leaving_[slot] || chunked_[slot] || appends_of(slot) != 0 ||
        drafts_of(slot) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch commit: prompt chunk of sequence ", chunk.id,
                       leaving_[slot]   ? ", which leaves"
                       : chunked_[slot] ? ", which has another chunk"
                                        : ", which also appends or drafts",
                       " in this step"));
    }
    chunked_[slot] = 1;
    chunked_slots_.push_back(slot);
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

SlotId BatchCommit::Impl::RunningSlot(SequenceId id) const {
  const absl::StatusOr<SequenceHandle> handle = manager_.HandleOf(id);
  if (!handle.ok() ||
      static_cast<size_t>(handle->index) >= slot_of_handle_.size()) {
    return kNoSlot;
  }
  const SlotId slot = slot_of_handle_[handle->index];
  if (slot == kNoSlot || slot >= batch_ || handles_[slot] != *handle) {
    return kNoSlot;
  }
  return slot;
}

absl::Status BatchCommit::Impl::AddRow(SlotId slot,
                                       absl::Span<const PageId> pages,
                                       int32_t first) {
  if (internal::FaultInjection::ShouldFail()) {
    return absl::InternalError(
        absl::StrCat("batch commit: injected fault at the row of slot ", slot));
  }
  // Written in place (see BlockManager's journal): no store-forwarding stall.
  KVPageTableRowUpdate& row = rows_.emplace_back();
  row.slot = slot;
  row.k_page_ids = pages.data();
  row.count = static_cast<int32_t>(pages.size());
  row.first = first;
  changed_slots_.push_back(slot);
  return absl::OkStatus();
}

void BatchCommit::Impl::ResetSlotMap() {
  for (const SlotId slot : map_marks_) {
    old_to_new_[slot] = slot < batch_ ? slot : kNoSlot;
  }
  map_marks_.clear();
  for (SlotId slot = std::min(map_batch_, batch_);
       slot < std::max(map_batch_, batch_); ++slot) {
    old_to_new_[slot] = slot < batch_ ? slot : kNoSlot;
  }
  map_batch_ = batch_;
}

absl::Status BatchCommit::Impl::Apply(const StepPlan& plan) {
  copies_.clear();
  rows_.clear();
  changed_slots_.clear();
  moves_.clear();
  leaving_handles_.clear();
  joined_handles_.clear();
  new_pages_ = 0;
  draft_copies_ = 0;
  ResetSlotMap();

  // Each part's time is added when it ends, or fails.
  int64_t mark = PhaseClock();
  const auto lap = [&](int64_t& phase) {
    const int64_t now = PhaseClock();
    phase += now - mark;
    mark = now;
  };
  absl::Cleanup frees_timed = [&] { lap(phase_times_.frees_ns); };
  for (const SequenceId id : plan.finished) {
    KVBLOCK_RETURN_IF_ERROR(manager_.Remove(id, /*preempted=*/false));
  }
  for (const SequenceId id : plan.preempted) {
    KVBLOCK_RETURN_IF_ERROR(manager_.Remove(id, /*preempted=*/true));
  }
  std::move(frees_timed).Invoke();
  absl::Cleanup admissions_timed = [&] { lap(phase_times_.admissions_ns); };
  for (const JoinRequest& join : plan.joins) {
    if (join.fork_of == kNoSequence) {
      KVBLOCK_ASSIGN_OR_RETURN(const AdmissionPlan admitted,
                               manager_.Admit(join.id, join.tokens, join.extra,
                                              join.prompt_hashes, join.admit));
      new_pages_ += admitted.new_pages;
    } else {
      KVBLOCK_RETURN_IF_ERROR(manager_.Fork(join.fork_of, join.id));
    }
  }
  std::move(admissions_timed).Invoke();

  // Holes below the survivors take the last surviving rows, in order.
  std::sort(leaving_slots_.begin(), leaving_slots_.end());
  const SlotId survivors = batch_ - static_cast<int32_t>(leaving_slots_.size());
  survivors_ = survivors;
  SlotId tail = batch_;
  for (const SlotId hole : leaving_slots_) {
    old_to_new_[hole] = kNoSlot;
    map_marks_.push_back(hole);
    if (hole >= survivors) continue;
    do {
      --tail;
    } while (leaving_[tail]);
    moves_.push_back({tail, hole});
    old_to_new_[tail] = hole;
    map_marks_.push_back(tail);
  }
  // AppendMany reads the batch in slot order, as the plan's tokens are, with
  // the leaving slots as empty handles (until the step fails: RestoreHandles).
  for (const SlotId slot : leaving_slots_) {
    leaving_handles_.push_back(handles_[slot]);
    handles_[slot] = {};
  }
  handles_blanked_ = true;
  mark = PhaseClock();  // the slot assignment: bookkeeping.
  absl::Cleanup appends_timed = [&] { lap(phase_times_.appends_ns); };
  KVBLOCK_RETURN_IF_ERROR(
      manager_.AppendMany(absl::MakeConstSpan(handles_).first(batch_),
                          plan.append_counts.empty()
                              ? absl::MakeConstSpan(zero_counts_).first(batch_)
                              : plan.append_counts,
                          plan.append_tokens, appended_, plan.draft_counts));
  copies_.insert(copies_.end(), appended_.copies.begin(),
                 appended_.copies.end());
  new_pages_ += appended_.new_pages;
  draft_copies_ += appended_.draft_copies;
  // A survivor's row moved with it: it changes from its first changed page.
  for (size_t i = 0; i < appended_.changed.size(); ++i) {
    KVBLOCK_RETURN_IF_ERROR(AddRow(old_to_new_[appended_.changed[i]],
                                   appended_.pages[i],
                                   appended_.first_changed_page[i]));
  }
  for (const PromptChunk& chunk : plan.prompt_chunks) {
    const SlotId slot = RunningSlot(chunk.id);  // its old slot.
    const int32_t pages_before =
        static_cast<int32_t>(manager_.PagesAt(handles_[slot])->size());
    KVBLOCK_ASSIGN_OR_RETURN(
        const AppendResult result,
        manager_.AppendPrompt(chunk.id, chunk.tokens, chunk.prompt_hashes));
    new_pages_ += result.new_pages;
    if (result.new_pages == 0) continue;
    KVBLOCK_ASSIGN_OR_RETURN(const absl::Span<const PageId> pages,
                             manager_.PagesAt(handles_[slot]));
    KVBLOCK_RETURN_IF_ERROR(AddRow(old_to_new_[slot], pages, pages_before));
  }

  // Joins take the next slots; forks append after every survivor did.
  SlotId next = survivors;
  for (const JoinRequest& join : plan.joins) {
    const SlotId slot = next++;
    KVBLOCK_ASSIGN_OR_RETURN(const SequenceHandle handle,
                             manager_.HandleOf(join.id));
    joined_handles_.push_back(handle);
    if (join.fork_of != kNoSequence && !join.tokens.empty()) {
      KVBLOCK_ASSIGN_OR_RETURN(const AppendResult result,
                               manager_.Append(join.id, join.tokens));
      if (result.copy.has_value()) copies_.push_back(*result.copy);
      new_pages_ += result.new_pages;
    }
    KVBLOCK_ASSIGN_OR_RETURN(const absl::Span<const PageId> pages,
                             manager_.PagesAt(handle));
    KVBLOCK_RETURN_IF_ERROR(AddRow(slot, pages, 0));
  }
  std::move(appends_timed).Invoke();
  // Leaving rows past the joins are emptied (a moved row's old slot is
  // emptied by its move, or rewritten by a join).
  for (const SlotId slot : leaving_slots_) {
    if (slot >= next) rows_.push_back({.slot = slot});
  }

  // The table validates the whole edit before it changes anything.
  if (internal::FaultInjection::ShouldFail()) {
    return absl::InternalError(
        "batch commit: injected fault before the page table edit");
  }
  mark = PhaseClock();
  absl::Status edited = table_.Apply({.moves = moves_, .rows = rows_});
  lap(phase_times_.page_table_ns);
  return edited;
}

void BatchCommit::Impl::RestoreHandles() {
  if (!handles_blanked_) return;
  for (size_t i = 0; i < leaving_handles_.size(); ++i) {
    handles_[leaving_slots_[i]] = leaving_handles_[i];
  }
  handles_blanked_ = false;
}

void BatchCommit::Impl::Adopt(const StepPlan& plan) {
  handles_blanked_ = false;
  // Leaving sequences first: their handle indexes may come back.
  for (const SequenceHandle& left : leaving_handles_) {
    slot_of_handle_[left.index] = kNoSlot;
  }
  for (const KVPageTableRowMove& move : moves_) {
    slots_[move.to] = slots_[move.from];
    handles_[move.to] = handles_[move.from];
    slot_of_handle_[handles_[move.to].index] = move.to;
  }
  // Joins may have grown the manager's slab (allocation only then).
  if (slot_of_handle_.size() < static_cast<size_t>(manager_.handle_limit())) {
    slot_of_handle_.resize(manager_.handle_limit(), kNoSlot);
  }
  SlotId slot = survivors_;
  for (size_t i = 0; i < plan.joins.size(); ++i, ++slot) {
    slots_[slot] = plan.joins[i].id;
    handles_[slot] = joined_handles_[i];
    slot_of_handle_[joined_handles_[i].index] = slot;
    manager_.SetRunByCommit(joined_handles_[i], true);
  }
  for (; slot < batch_; ++slot) {
    slots_[slot] = kNoSequence;
    handles_[slot] = {};
  }
  batch_ = survivors_ + static_cast<int32_t>(plan.joins.size());
}

absl::StatusOr<int64_t> BatchCommit::Impl::AppendPages(
    absl::Span<const int32_t> append_counts,
    absl::Span<const int32_t> draft_counts) const {
  if (append_counts.size() != static_cast<size_t>(batch_) ||
      (!draft_counts.empty() &&
       draft_counts.size() != static_cast<size_t>(batch_))) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch commit: append_counts has ", append_counts.size(),
                     " entries and draft_counts ", draft_counts.size(),
                     ", the batch has ", batch_, " sequences"));
  }
  int64_t pages = 0;
  for (SlotId slot = 0; slot < batch_; ++slot) {
    KVBLOCK_ASSIGN_OR_RETURN(
        const int64_t more,
        manager_.PagesForAppend(handles_[slot], append_counts[slot],
                                draft_counts.empty() ? 0 : draft_counts[slot]));
    pages += more;
  }
  return pages;
}

absl::StatusOr<SlotId> BatchCommit::Impl::SlotOf(SequenceId id) const {
  const SlotId slot = RunningSlot(id);
  if (slot == kNoSlot) {
    return absl::NotFoundError(
        absl::StrCat("batch commit: sequence ", id, " is not running"));
  }
  return slot;
}

absl::Status BatchCommit::Impl::CheckInvariants() const {
  KVBLOCK_RETURN_IF_ERROR(manager_.CheckInvariants());
  KVBLOCK_RETURN_IF_ERROR(table_.CheckInvariants());
  for (SlotId slot = 0; slot < table_.max_batch(); ++slot) {
    KVBLOCK_ASSIGN_OR_RETURN(const absl::Span<const PageId> row,
                             table_.HostRow(slot));
    absl::Span<const PageId> expected;
    if (slot < batch_) {
      const SequenceId id = slots_[slot];
      const absl::StatusOr<SequenceHandle> handle = manager_.HandleOf(id);
      if (!handle.ok() || *handle != handles_[slot] ||
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

BatchCommit::BatchCommit(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

BatchCommit::~BatchCommit() = default;

absl::StatusOr<StepResult> BatchCommit::Commit(const StepPlan& plan) {
  return impl_->Commit(plan);
}

absl::StatusOr<int64_t> BatchCommit::AppendPages(
    absl::Span<const int32_t> append_counts,
    absl::Span<const int32_t> draft_counts) const {
  return impl_->AppendPages(append_counts, draft_counts);
}

absl::Span<const SequenceId> BatchCommit::slots() const {
  return impl_->slots();
}

absl::StatusOr<SlotId> BatchCommit::SlotOf(SequenceId id) const {
  return impl_->SlotOf(id);
}

int32_t BatchCommit::batch() const { return impl_->batch(); }

void BatchCommit::set_time_phases(bool on) { impl_->set_time_phases(on); }

bool BatchCommit::time_phases() const { return impl_->time_phases(); }

const CommitPhaseTimes& BatchCommit::phase_times() const {
  return impl_->phase_times();
}

absl::Status BatchCommit::CheckInvariants() const {
  return impl_->CheckInvariants();
}

}  // namespace kvblock
