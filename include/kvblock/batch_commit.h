// Copyright 2026 The kvblock Authors.
//
// BatchCommit: one scheduler step as a transaction over a BlockManager and the
// batched KVPageTable, in the manner of LevelDB's WriteBatch: the step is
// described, validated, applied as a unit, or not at all.
//
// A step (StepPlan) says which running sequences leave (finished or
// preempted), which sequences join (new prompts, or forks of a running
// sequence for beam search / parallel sampling), and which tokens each
// sequence appends. Commit applies, in this order:
//   1. leaving sequences release their pages (tail first);
//   2. joins, in order: a prompt is admitted (prefix hits first), a fork
//      shares its parent's pages as they were at the start of the step;
//   3. appends: survivors in slot order, then joined sequences, in order; a
//      shared partial last page is copied on write.
// Then it assigns slots so the batch stays dense in [0, batch): survivors keep
// their relative order, joins take the next slots. It compacts the page table
// (one old-to-new map), rewrites only the rows whose pages changed, and
// returns the (source, destination) copies the copy-on-write kernel must run
// before the step's attention.
//
// Rollback: if any part fails (pool exhausted half-way through the appends, a
// bad id, a page-table invariant), every change of the step is undone:
// refcounts, free list, prefix index and LRU order, sequence tables, slot
// assignment and page-table rows. The state is then bit-identical to the
// state before the step, so the scheduler can preempt a sequence and retry.
//
// Complexity: O(leaving pages + joined pages + appended tokens + batch) per
// step; buffers are reserved for max_batch so steady-state steps allocate no
// memory.
// Ownership: the running sequences change only through Commit. One freed
// through the manager directly leaves the commit holding a stale handle, and
// the next Commit fails with InvalidArgument (it never writes into another
// sequence).
//
// Thread safety: thread-compatible; one scheduler thread owns it.
#ifndef KVBLOCK_BATCH_COMMIT_H_
#define KVBLOCK_BATCH_COMMIT_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvblock/block_hash.h"
#include "kvblock/block_manager.h"
#include "kvblock/page_table.h"
#include "kvblock/types.h"

namespace kvblock {

// A sequence joining the batch: a prompt (fork_of == kNoSequence; `tokens` is
// the prompt), or a fork of `fork_of` that then appends `tokens` (may be
// empty). `fork_of` is running at the start of the step or joined earlier in
// the same step; a fork of a prompt joining in the same step appends nothing
// in that step (its prompt is prefilled by the step: nothing to copy yet).
struct JoinRequest {
  SequenceId id = kNoSequence;
  SequenceId fork_of = kNoSequence;
  absl::Span<const TokenId> tokens = {};
  HashExtraKeys extra = {};  // prompts only: cache salt and adapter id.
  // Prompts only: BlockManager::HashPrompt(tokens, extra), or empty to hash
  // the prompt in the step.
  absl::Span<const BlockHash> prompt_hashes = {};
};

// One step. `append_counts[s]` tokens of `append_tokens` (consumed in slot
// order) are appended to the sequence in slot `s` at the start of the step;
// `append_counts` is empty (no appends) or has one entry per running slot.
struct StepPlan {
  absl::Span<const SequenceId> finished = {};
  absl::Span<const SequenceId> preempted = {};
  absl::Span<const JoinRequest> joins = {};
  absl::Span<const int32_t> append_counts = {};
  absl::Span<const TokenId> append_tokens = {};
};

// What a committed step did. Views into BatchCommit's buffers, valid until the
// next Commit.
struct StepResult {
  absl::Span<const int32_t> old_to_new;    // per old slot: new slot or -1.
  int32_t batch = 0;                       // running sequences after the step.
  absl::Span<const SlotId> changed_slots;  // rows rewritten by SetRows.
  absl::Span<const PageCopy> copies;       // CoW copies to run, in order.
  int32_t new_pages = 0;                   // pages allocated by the step.
};

class BatchCommit {
 public:
  // Both must outlive the BatchCommit. InvalidArgument when the table's
  // geometry does not match the manager's config.
  static absl::StatusOr<std::unique_ptr<BatchCommit>> Create(
      BlockManager& manager, KVPageTable& table);

  // Applies `plan` as one transaction. Errors: InvalidArgument (a sequence
  // named twice, an unknown fork parent, append_counts of the wrong length or
  // not matching append_tokens, prompt_hashes that do not fit their prompt, a
  // running sequence changed through the manager behind the commit's back),
  // NotFound (a leaving sequence not running),
  // AlreadyExists (a joining id already live), ResourceExhausted (pages ran
  // out), OutOfRange (a sequence past max_pages_per_seq), FailedPrecondition
  // (the batch would exceed max_batch); and any error of the page table. On
  // error, everything is rolled back.
  absl::StatusOr<StepResult> Commit(const StepPlan& plan);

  // Running sequences in slot order.
  absl::Span<const SequenceId> slots() const;
  // The slot of a running sequence; NotFound otherwise.
  absl::StatusOr<SlotId> SlotOf(SequenceId id) const;
  int32_t batch() const;

  // Internal when the slot map and the manager or the table disagree: every
  // slot's row equals its sequence's pages, rows past the batch are empty.
  absl::Status CheckInvariants() const;

 private:
  BatchCommit(BlockManager& manager, KVPageTable& table);

  // Checks everything that can be checked before changing anything; marks the
  // leaving slots.
  absl::Status Validate(const StepPlan& plan);
  // Runs the step inside an open manager step; `table_changed` tells whether
  // the page table was touched.
  absl::Status Apply(const StepPlan& plan, bool& table_changed);
  // The slot of running sequence `id`, or kNoSlot.
  SlotId RunningSlot(SequenceId id) const;
  // Queues slot `slot`'s row update: the pages of `handle`, rewritten from
  // page `first` on (the row holds the ones before).
  absl::Status AddRow(SlotId slot, SequenceHandle handle, int32_t first);
  // Rewrites every row from the manager (after its rollback).
  absl::Status RestoreTable();

  BlockManager& manager_;
  KVPageTable& table_;
  // Running sequences by slot (the first batch_ entries of max_batch): ids,
  // manager handles, and join numbers. Join numbers count joins since
  // creation; survivors keep their order and joins take the last slots, so
  // they increase with the slot, and a lookup by id is a binary search.
  // A step moves these arrays by runs; nothing is reindexed per slot.
  int32_t batch_ = 0;
  std::vector<SequenceId> slots_;
  std::vector<SequenceHandle> handles_;
  std::vector<int64_t> join_numbers_;
  // By manager handle index: the join number of the sequence that last
  // joined with it (-1 before any).
  std::vector<int64_t> join_number_of_handle_;
  int64_t joins_ = 0;

  // Step scratch, sized max_batch at construction.
  std::vector<uint8_t> leaving_;       // by old slot.
  std::vector<SlotId> leaving_slots_;  // sorted by Apply.
  std::vector<SlotId> old_to_new_;
  int32_t next_batch_ = 0;
  std::vector<SequenceId> next_slots_;
  std::vector<SequenceHandle> next_handles_;
  std::vector<int64_t> next_join_numbers_;
  std::vector<int32_t> survivor_counts_;  // by new slot.
  AppendManyResult appended_;
  std::vector<SlotId> changed_slots_;
  std::vector<PageCopy> copies_;
  std::vector<KVPageTableRowUpdate> rows_;
  absl::flat_hash_set<SequenceId> joining_;
  std::vector<SequenceId> joined_ids_;  // what joining_ holds.
  int32_t new_pages_ = 0;
};

}  // namespace kvblock

#endif  // KVBLOCK_BATCH_COMMIT_H_
