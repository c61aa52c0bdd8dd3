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
#include "manager/group_coordinator.h"

namespace kvblock {

// The commit's state: the running batch by slot and the step's scratch,
// and the step's parts.
class BatchCommit::Impl {
 public:
  // `coordinator`: the manager's KV cache groups, or null for one group.
  Impl(internal::BlockManagerImpl& manager,
       internal::GroupCoordinator* coordinator, KVPageTable& table);
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
  KVPageTable& table() { return table_; }
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
  // page `first` on (the row holds the ones before), to page `end` (-1: to
  // the row's end; see KVPageTableRowUpdate).
  absl::Status AddRow(SlotId slot, absl::Span<const PageId> pages,
                      int32_t first, int32_t end = -1);
  // In every window group, releases the pages that no token computed from
  // this step on attends to, in the survivors that compute tokens: before
  // anything of the step allocates, as the coordinator's Append and vLLM's
  // allocate_slots remove skipped blocks first.
  absl::Status ReleaseSkipped(const StepPlan& plan);
  // Forgets the skips ReleaseSkipped noted (the step ended).
  void ClearSkips();
  // The appends of group `g` (survivors', then prompt chunks') and the rows
  // they, and its skips, change.
  absl::Status AppendGroup(int32_t g, const StepPlan& plan);
  // The rows of group `g`'s survivors whose appends or skips changed them,
  // when its window skipped pages this step.
  absl::Status MergeSkippedRows(int32_t g);
  // The first page group `g`'s skip changed at `slot` this step (-1: none).
  int32_t& skip_first(int32_t g, SlotId slot) {
    return skip_first_[static_cast<size_t>(g) * max_batch_ + slot];
  }
  // The handle of group `g` at `slot`.
  SequenceHandle& handle(int32_t g, SlotId slot) {
    return handles_[static_cast<size_t>(g) * max_batch_ + slot];
  }

  internal::BlockManagerImpl& manager_;  // group 0's.
  internal::GroupCoordinator* const coordinator_;
  // Every group's manager, group 0 first.
  std::vector<internal::BlockManagerImpl*> groups_;
  KVPageTable& table_;
  // Rows a group has: group g's slot s is row g * max_batch_ + s.
  int32_t max_batch_ = 0;
  // Running sequences by slot (the first batch_ entries of max_batch): ids
  // and manager handles (each group's, by row); and by group 0's handle
  // index, the slot of the sequence that holds it (or kNoSlot): a lookup by
  // id is a hash lookup in the manager and two loads.
  int32_t batch_ = 0;
  std::vector<SequenceId> slots_;
  std::vector<SequenceHandle> handles_;
  std::vector<SlotId> slot_of_handle_;

  // Step scratch, sized max_batch at construction.
  std::vector<uint8_t> leaving_;       // by old slot.
  std::vector<SlotId> leaving_slots_;  // sorted by Apply.
  int32_t survivors_ = 0;
  std::vector<KVPageTableRowMove> moves_;  // {mover's slot, hole}.
  // With groups: moves_ in every group's rows, for the table.
  std::vector<KVPageTableRowMove> row_moves_;
  // By row: the first page a window group's skip changed this step (-1:
  // none); skipped_slots_[g] lists group g's slots set, in slot order.
  std::vector<int32_t> skip_first_;
  std::vector<std::vector<SlotId>> skipped_slots_;
  std::vector<int32_t> copy_groups_;  // with groups: copies_' groups.
  // What the leaving slots held (by leaving_slots_ entry), while handles_
  // holds empty handles there (handles_blanked_).
  std::vector<SequenceHandle> leaving_handles_;
  bool handles_blanked_ = false;
  std::vector<SequenceHandle> joined_handles_;  // by join, then group.
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
  std::vector<HostCopy> host_copies_;  // the step's copy batch.
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
  const PagedKvConfig& config = manager.config();
  internal::GroupCoordinator* coordinator =
      internal::GroupCoordinator::Of(manager);
  int64_t rows = config.max_batch;
  int32_t width = config.max_pages_per_seq;
  if (coordinator != nullptr) {
    rows *= manager.num_groups();
    for (const internal::BlockManagerImpl* group :
         coordinator->group_managers()) {
      width = std::max(width, group->config().max_pages_per_seq);
    }
  }
  if (table.max_batch() != rows || table.max_pages_per_seq() != width ||
      table.num_pages() != config.num_pages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch commit: page table geometry (max_batch ", table.max_batch(),
        ", max_pages_per_seq ", table.max_pages_per_seq(), ", num_pages ",
        table.num_pages(), ") differs from the manager's (", rows, ", ", width,
        ", ", config.num_pages, ")",
        coordinator != nullptr ? absl::StrCat(": ", manager.num_groups(),
                                              " KV cache groups of max_batch ",
                                              config.max_batch, " rows each")
                               : ""));
  }
  // Claimed here, given back if Create fails below: two Creates over one
  // table cannot both pass.
  if (table.in_commit_.exchange(true)) {
    return absl::FailedPreconditionError(
        "batch commit: the page table's rows are another BatchCommit's (one "
        "table serves one commit at a time)");
  }
  absl::Cleanup give_back = [&table] { table.in_commit_.store(false); };
  // The batch starts empty: so do the rows (a commit before may have left
  // its sequences' pages there).
  for (SlotId row = 0; row < table.max_batch(); ++row) {
    KVBLOCK_ASSIGN_OR_RETURN(const absl::Span<const PageId> pages,
                             table.HostRow(row));
    if (pages[0] != kNoPage) KVBLOCK_RETURN_IF_ERROR(table.SetRow(row, {}));
  }
  auto commit =
      std::unique_ptr<BatchCommit>(new BatchCommit(std::make_unique<Impl>(
          internal::BlockManagerImpl::Of(manager), coordinator, table)));
  std::move(give_back).Cancel();
  return commit;
}

BatchCommit::Impl::~Impl() {
  // The manager outlives the commit: its sequences are the caller's again.
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (SlotId slot = 0; slot < batch_; ++slot) {
      groups_[g]->SetRunByCommit(handle(static_cast<int32_t>(g), slot), false);
    }
  }
}

BatchCommit::Impl::Impl(internal::BlockManagerImpl& manager,
                        internal::GroupCoordinator* coordinator,
                        KVPageTable& table)
    : manager_(manager), coordinator_(coordinator), table_(table) {
  if (coordinator != nullptr) {
    const auto managers = coordinator->group_managers();
    groups_.assign(managers.begin(), managers.end());
  } else {
    groups_.push_back(&manager);
  }
  max_batch_ = table.max_batch() / static_cast<int32_t>(groups_.size());
  const size_t max_batch = static_cast<size_t>(max_batch_);
  const size_t groups = groups_.size();
  slots_.resize(max_batch, kNoSequence);
  handles_.resize(max_batch * groups);
  skip_first_.assign(max_batch * groups, -1);
  skipped_slots_.resize(groups);
  for (std::vector<SlotId>& slots : skipped_slots_) slots.reserve(max_batch);
  if (groups > 1) {
    row_moves_.reserve(max_batch * groups);
    copy_groups_.reserve(max_batch * groups);
  }
  slot_of_handle_.assign(manager.handle_limit(), kNoSlot);
  leaving_.assign(max_batch, 0);
  leaving_slots_.reserve(max_batch);
  moves_.reserve(max_batch);
  leaving_handles_.reserve(max_batch * groups);
  joined_handles_.reserve(max_batch * groups);
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
  copies_.reserve(max_batch * groups);
  rows_.reserve(max_batch * groups);
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
  // Every group's step opens together; the last opened closes first.
  for (internal::BlockManagerImpl* group : groups_) {
    KVBLOCK_RETURN_IF_ERROR(group->BeginStep());
    group->set_commit_applying(true);
  }
  absl::Status applied = Apply(plan);
  for (internal::BlockManagerImpl* group : groups_) {
    group->set_commit_applying(false);
  }
  if (absl::Status status = std::move(applied); !status.ok()) {
    RestoreHandles();
    for (size_t g = groups_.size(); g-- > 0;) {
      KVBLOCK_RETURN_IF_ERROR(groups_[g]->RollbackStep());
    }
    return status;
  }
  for (size_t g = groups_.size(); g-- > 0;) {
    KVBLOCK_RETURN_IF_ERROR(groups_[g]->CommitStep());
  }
  Adopt(plan);
  host_copies_.clear();
  // Cannot fail: the step is closed. (Without a host tier, nothing.)
  KVBLOCK_RETURN_IF_ERROR(manager_.pool().TakeHostCopies(host_copies_));
  return StepResult{
      .old_to_new = absl::MakeConstSpan(old_to_new_),
      .batch = batch_,
      .moves = moves_,
      .changed_slots = changed_slots_,
      .copies = copies_,
      .copy_groups = copy_groups_,
      .new_pages = new_pages_,
      .draft_copies = draft_copies_,
      .host_copies = host_copies_,
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
  if (next_batch > max_batch_) {
    return absl::FailedPreconditionError(
        absl::StrCat("batch commit: the step would run ", next_batch,
                     " sequences, more than max_batch = ", max_batch_));
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
                                       int32_t first, int32_t end) {
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
  row.end = end;
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
  copy_groups_.clear();
  rows_.clear();
  changed_slots_.clear();
  moves_.clear();
  row_moves_.clear();
  leaving_handles_.clear();
  joined_handles_.clear();
  new_pages_ = 0;
  draft_copies_ = 0;
  ResetSlotMap();
  const int32_t num_groups = static_cast<int32_t>(groups_.size());

  // Each part's time is added when it ends, or fails.
  int64_t mark = PhaseClock();
  const auto lap = [&](int64_t& phase) {
    const int64_t now = PhaseClock();
    phase += now - mark;
    mark = now;
  };
  // A sequence's removal, admission and fork run in every group.
  const auto remove = [&](SequenceId id, bool preempted) {
    return coordinator_ != nullptr ? coordinator_->Remove(id, preempted)
                                   : manager_.Remove(id, preempted);
  };
  absl::Cleanup frees_timed = [&] { lap(phase_times_.frees_ns); };
  for (const SequenceId id : plan.finished) {
    KVBLOCK_RETURN_IF_ERROR(remove(id, /*preempted=*/false));
  }
  for (const SequenceId id : plan.preempted) {
    KVBLOCK_RETURN_IF_ERROR(remove(id, /*preempted=*/true));
  }
  std::move(frees_timed).Invoke();
  absl::Cleanup admissions_timed = [&] { lap(phase_times_.admissions_ns); };
  const auto fork = [&](const JoinRequest& join) {
    return coordinator_ != nullptr ? coordinator_->Fork(join.fork_of, join.id)
                                   : manager_.Fork(join.fork_of, join.id);
  };
  // Forks of running parents first: they share the parent's pages as at
  // the start of the step, before its window groups release any. (They
  // allocate nothing, so the releases still come before every allocation.)
  const auto forks_running = [&](const JoinRequest& join) {
    return join.fork_of != kNoSequence && !joining_.contains(join.fork_of);
  };
  for (const JoinRequest& join : plan.joins) {
    if (forks_running(join)) KVBLOCK_RETURN_IF_ERROR(fork(join));
  }
  lap(phase_times_.admissions_ns);
  const absl::Cleanup clear_skips = [&] { ClearSkips(); };
  {
    absl::Cleanup releases_timed = [&] { lap(phase_times_.frees_ns); };
    KVBLOCK_RETURN_IF_ERROR(ReleaseSkipped(plan));
  }
  for (const JoinRequest& join : plan.joins) {
    if (forks_running(join)) continue;
    if (join.fork_of == kNoSequence) {
      KVBLOCK_ASSIGN_OR_RETURN(
          const AdmissionPlan admitted,
          coordinator_ != nullptr
              ? coordinator_->Admit(join.id, join.tokens, join.extra,
                                    join.prompt_hashes, join.admit)
              : manager_.Admit(join.id, join.tokens, join.extra,
                               join.prompt_hashes, join.admit));
      new_pages_ += admitted.new_pages;
    } else {
      KVBLOCK_RETURN_IF_ERROR(fork(join));
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
  for (int32_t g = 0; g < num_groups; ++g) {
    for (const SlotId slot : leaving_slots_) {
      leaving_handles_.push_back(handle(g, slot));
      handle(g, slot) = {};
    }
  }
  handles_blanked_ = true;
  mark = PhaseClock();  // the slot assignment: bookkeeping.
  absl::Cleanup appends_timed = [&] { lap(phase_times_.appends_ns); };
  for (int32_t g = 0; g < num_groups; ++g) {
    KVBLOCK_RETURN_IF_ERROR(AppendGroup(g, plan));
  }

  // Joins take the next slots; forks append after every survivor did.
  SlotId next = survivors;
  for (const JoinRequest& join : plan.joins) {
    ++next;
    for (internal::BlockManagerImpl* group : groups_) {
      KVBLOCK_ASSIGN_OR_RETURN(const SequenceHandle joined,
                               group->HandleOf(join.id));
      joined_handles_.push_back(joined);
    }
    if (join.fork_of != kNoSequence && !join.tokens.empty()) {
      KVBLOCK_ASSIGN_OR_RETURN(const AppendResult result,
                               coordinator_ != nullptr
                                   ? coordinator_->Append(join.id, join.tokens)
                                   : manager_.Append(join.id, join.tokens));
      if (coordinator_ != nullptr) {
        for (const GroupPageCopy& copy : result.group_copies) {
          copies_.push_back(copy.copy);
          copy_groups_.push_back(copy.group);
        }
      } else if (result.copy.has_value()) {
        copies_.push_back(*result.copy);
      }
      new_pages_ += result.new_pages;
    }
  }
  for (int32_t g = 0; g < num_groups; ++g) {
    const absl::Span<const SequenceHandle> joined =
        absl::MakeConstSpan(joined_handles_);
    for (size_t i = 0; i < plan.joins.size(); ++i) {
      KVBLOCK_ASSIGN_OR_RETURN(
          const absl::Span<const PageId> pages,
          groups_[g]->PagesAt(joined[i * groups_.size() + g]));
      KVBLOCK_RETURN_IF_ERROR(AddRow(
          g * max_batch_ + survivors + static_cast<SlotId>(i), pages, 0));
    }
  }
  std::move(appends_timed).Invoke();
  // Leaving rows past the joins are emptied (a moved row's old slot is
  // emptied by its move, or rewritten by a join).
  for (int32_t g = 0; g < num_groups; ++g) {
    for (const SlotId slot : leaving_slots_) {
      if (slot >= next) rows_.push_back({.slot = g * max_batch_ + slot});
    }
  }
  if (num_groups > 1) {
    for (int32_t g = 0; g < num_groups; ++g) {
      for (const KVPageTableRowMove& move : moves_) {
        row_moves_.push_back(
            {g * max_batch_ + move.from, g * max_batch_ + move.to});
      }
    }
  }

  // The table validates the whole edit before it changes anything.
  if (internal::FaultInjection::ShouldFail()) {
    return absl::InternalError(
        "batch commit: injected fault before the page table edit");
  }
  mark = PhaseClock();
  absl::Status edited = table_.Apply(
      {.moves = num_groups > 1 ? row_moves_ : moves_, .rows = rows_});
  lap(phase_times_.page_table_ns);
  return edited;
}

absl::Status BatchCommit::Impl::ReleaseSkipped(const StepPlan& plan) {
  for (int32_t g = 0; g < static_cast<int32_t>(groups_.size()); ++g) {
    internal::BlockManagerImpl& group = *groups_[g];
    if (!group.skips_pages()) continue;
    for (SlotId slot = 0; slot < batch_; ++slot) {
      const bool computes = chunked_[slot] || (!plan.append_counts.empty() &&
                                               plan.append_counts[slot] > 0);
      if (!computes || leaving_[slot]) continue;
      KVBLOCK_ASSIGN_OR_RETURN(const int32_t first,
                               group.SkipAt(handle(g, slot)));
      if (first < 0) continue;
      skip_first(g, slot) = first;
      skipped_slots_[g].push_back(slot);
    }
  }
  return absl::OkStatus();
}

void BatchCommit::Impl::ClearSkips() {
  for (int32_t g = 0; g < static_cast<int32_t>(groups_.size()); ++g) {
    for (const SlotId slot : skipped_slots_[g]) skip_first(g, slot) = -1;
    skipped_slots_[g].clear();
  }
}

absl::Status BatchCommit::Impl::AppendGroup(int32_t g, const StepPlan& plan) {
  internal::BlockManagerImpl& group = *groups_[g];
  const SlotId first_row = g * max_batch_;
  const absl::Span<SequenceHandle> handles =
      absl::MakeSpan(handles_).subspan(first_row, batch_);
  KVBLOCK_RETURN_IF_ERROR(
      group.AppendMany(handles,
                       plan.append_counts.empty()
                           ? absl::MakeConstSpan(zero_counts_).first(batch_)
                           : plan.append_counts,
                       plan.append_tokens, appended_, plan.draft_counts));
  copies_.insert(copies_.end(), appended_.copies.begin(),
                 appended_.copies.end());
  if (coordinator_ != nullptr) {
    copy_groups_.insert(copy_groups_.end(), appended_.copies.size(), g);
  }
  new_pages_ += appended_.new_pages;
  draft_copies_ += appended_.draft_copies;
  // A survivor's row moved with it: it changes from its first changed page
  // (or its first skipped one).
  if (skipped_slots_[g].empty()) {
    for (size_t i = 0; i < appended_.changed.size(); ++i) {
      KVBLOCK_RETURN_IF_ERROR(
          AddRow(first_row + old_to_new_[appended_.changed[i]],
                 appended_.pages[i], appended_.first_changed_page[i]));
    }
  } else {
    KVBLOCK_RETURN_IF_ERROR(MergeSkippedRows(g));
  }
  for (const PromptChunk& chunk : plan.prompt_chunks) {
    const SlotId slot = RunningSlot(chunk.id);  // its old slot.
    const int32_t pages_before =
        static_cast<int32_t>(group.PagesAt(handles[slot])->size());
    absl::Span<const BlockHash> hashes = chunk.prompt_hashes;
    if (coordinator_ != nullptr) {
      KVBLOCK_ASSIGN_OR_RETURN(
          hashes, coordinator_->ChunkHashes(g, chunk.id, chunk.prompt_hashes));
    }
    KVBLOCK_ASSIGN_OR_RETURN(
        const AppendResult result,
        group.AppendPrompt(chunk.id, chunk.tokens, hashes));
    new_pages_ += result.new_pages;
    const int32_t skipped_from = skip_first(g, slot);
    if (result.new_pages == 0 && skipped_from < 0) continue;
    KVBLOCK_ASSIGN_OR_RETURN(const absl::Span<const PageId> pages,
                             group.PagesAt(handles[slot]));
    KVBLOCK_RETURN_IF_ERROR(AddRow(first_row + old_to_new_[slot], pages,
                                   skipped_from < 0
                                       ? pages_before
                                       : std::min(pages_before, skipped_from)));
  }
  return absl::OkStatus();
}

absl::Status BatchCommit::Impl::MergeSkippedRows(int32_t g) {
  internal::BlockManagerImpl& group = *groups_[g];
  const SlotId first_row = g * max_batch_;
  // Both lists are in slot order: a slot in both changes from the first of
  // its two pages; a chunk's slot gets its row with the chunk's.
  const std::vector<SlotId>& skipped_in = skipped_slots_[g];
  size_t skipped = 0;
  const auto skipped_only_before = [&](SlotId slot) -> absl::Status {
    for (; skipped < skipped_in.size() && skipped_in[skipped] < slot;
         ++skipped) {
      const SlotId only = skipped_in[skipped];
      if (chunked_[only]) continue;
      KVBLOCK_ASSIGN_OR_RETURN(const absl::Span<const PageId> pages,
                               group.PagesAt(handle(g, only)));
      // Only the released pages changed: the null page's run from the
      // first of them (a window's pages after it are live).
      int32_t end = skip_first(g, only);
      const PageId null_page = group.null_page();
      while (end < static_cast<int32_t>(pages.size()) &&
             pages[end] == null_page) {
        ++end;
      }
      KVBLOCK_RETURN_IF_ERROR(AddRow(first_row + old_to_new_[only], pages,
                                     skip_first(g, only), end));
    }
    return absl::OkStatus();
  };
  for (size_t i = 0; i < appended_.changed.size(); ++i) {
    const SlotId slot = appended_.changed[i];
    KVBLOCK_RETURN_IF_ERROR(skipped_only_before(slot));
    int32_t first = appended_.first_changed_page[i];
    if (skipped < skipped_in.size() && skipped_in[skipped] == slot) {
      first = std::min(first, skip_first(g, slot));
      ++skipped;
    }
    KVBLOCK_RETURN_IF_ERROR(
        AddRow(first_row + old_to_new_[slot], appended_.pages[i], first));
  }
  return skipped_only_before(batch_);
}

void BatchCommit::Impl::RestoreHandles() {
  if (!handles_blanked_) return;
  size_t i = 0;
  for (int32_t g = 0; g < static_cast<int32_t>(groups_.size()); ++g) {
    for (const SlotId slot : leaving_slots_) {
      handle(g, slot) = leaving_handles_[i++];
    }
  }
  handles_blanked_ = false;
}

void BatchCommit::Impl::Adopt(const StepPlan& plan) {
  handles_blanked_ = false;
  const int32_t num_groups = static_cast<int32_t>(groups_.size());
  // Leaving sequences first: their handle indexes may come back. Group 0's
  // handles lead leaving_handles_.
  for (size_t i = 0; i < leaving_slots_.size(); ++i) {
    slot_of_handle_[leaving_handles_[i].index] = kNoSlot;
  }
  for (const KVPageTableRowMove& move : moves_) {
    slots_[move.to] = slots_[move.from];
    for (int32_t g = 0; g < num_groups; ++g) {
      handle(g, move.to) = handle(g, move.from);
    }
    slot_of_handle_[handles_[move.to].index] = move.to;
  }
  // Joins may have grown the manager's slab (allocation only then).
  if (slot_of_handle_.size() < static_cast<size_t>(manager_.handle_limit())) {
    slot_of_handle_.resize(manager_.handle_limit(), kNoSlot);
  }
  SlotId slot = survivors_;
  for (size_t i = 0; i < plan.joins.size(); ++i, ++slot) {
    slots_[slot] = plan.joins[i].id;
    for (int32_t g = 0; g < num_groups; ++g) {
      const SequenceHandle joined = joined_handles_[i * num_groups + g];
      handle(g, slot) = joined;
      groups_[g]->SetRunByCommit(joined, true);
    }
    slot_of_handle_[handles_[slot].index] = slot;
  }
  for (; slot < batch_; ++slot) {
    slots_[slot] = kNoSequence;
    for (int32_t g = 0; g < num_groups; ++g) handle(g, slot) = {};
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
  // Named by slot, as Commit names them (the manager's message would name
  // an internal handle).
  for (SlotId slot = 0; slot < batch_; ++slot) {
    const int32_t drafts = draft_counts.empty() ? 0 : draft_counts[slot];
    if (append_counts[slot] < 0 || drafts < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch commit: append_counts[", slot,
                       "] = ", append_counts[slot], " and draft_counts[", slot,
                       "] = ", drafts, ": counts are non-negative"));
    }
  }
  int64_t pages = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (SlotId slot = 0; slot < batch_; ++slot) {
      KVBLOCK_ASSIGN_OR_RETURN(
          const int64_t more,
          groups_[g]->PagesForAppend(
              handles_[g * max_batch_ + slot], append_counts[slot],
              draft_counts.empty() ? 0 : draft_counts[slot]));
      pages += more;
    }
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
  KVBLOCK_RETURN_IF_ERROR(coordinator_ != nullptr
                              ? coordinator_->CheckInvariants()
                              : manager_.CheckInvariants());
  KVBLOCK_RETURN_IF_ERROR(table_.CheckInvariants());
  for (SlotId row_index = 0; row_index < table_.max_batch(); ++row_index) {
    const int32_t g = row_index / max_batch_;
    const SlotId slot = row_index % max_batch_;
    KVBLOCK_ASSIGN_OR_RETURN(const absl::Span<const PageId> row,
                             table_.HostRow(row_index));
    absl::Span<const PageId> expected;
    if (slot < batch_) {
      const SequenceId id = slots_[slot];
      const absl::StatusOr<SequenceHandle> handle = groups_[g]->HandleOf(id);
      if (!handle.ok() || *handle != handles_[row_index] ||
          RunningSlot(id) != slot) {
        return absl::InternalError(absl::StrCat(
            "batch commit: slot ", slot, " of group ", g, " holds sequence ",
            id, " whose index entry disagrees"));
      }
      KVBLOCK_ASSIGN_OR_RETURN(expected, groups_[g]->Pages(id));
    }
    const bool same =
        std::equal(expected.begin(), expected.end(), row.begin()) &&
        (expected.size() == row.size() || row[expected.size()] == kNoPage);
    if (!same) {
      return absl::InternalError(
          absl::StrCat("batch commit: row ", row_index,
                       " differs from its sequence's pages"));
    }
  }
  return absl::OkStatus();
}

BatchCommit::BatchCommit(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

BatchCommit::~BatchCommit() { impl_->table().in_commit_.store(false); }

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
