// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
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
//      shares its parent's pages as they were at the start of the step
//      (a running parent's forks are made first, before its window groups
//      release the pages its appends leave behind);
//   3. appends: survivors in slot order (each then setting its draft slots,
//      speculative decoding), the prompt chunks of running sequences
//      (chunked prefill), then joined forks' tokens, in order; a shared
//      partial page is copied on write. A survivor's pages for its tokens
//      and drafts are all allocated before the pages its tokens fill are
//      cached, as vLLM's allocate_slots does; the same calls one at a time
//      (Append, then SetDrafts) cache first, so an eviction for a draft
//      page can make the KV events and cache_registrations differ (never
//      the pages, the cache or the LRU order).
// Slot policy. The batch stays dense in [0, batch): survivors keep slots in
// [0, survivors), where survivors = batch - leaving; a slot a leaving
// sequence held below that is filled by the last surviving row (the highest
// survivor at or past `survivors`, taken in order of the holes, as vLLM's
// input batch condenses), so at most one row moves per leaving sequence and
// survivors do NOT keep their relative order. Joins take the slots
// [survivors, batch), in order: a step's prefills come after its decodes.
// The page table gets one edit (KVPageTable::Apply): the moves, then only
// the rows whose pages changed (from their first changed page); Commit
// returns the slot map, the moves and the (source, destination) copies the
// copy-on-write kernel must run before the step's attention.
//
// Rollback: if any part fails (pool exhausted half-way through the appends, a
// bad id, a page-table invariant), every change of the step is undone:
// refcounts, free list, prefix index and LRU order, sequence tables, slot
// assignment and page-table rows. The state is then bit-identical to the
// state before the step, so the scheduler can preempt a sequence and retry.
//
// Complexity: O(batch) to read the append counts, plus O(leaving pages +
// joined pages + appended tokens + pages of moved rows); nothing depends on
// max_pages_per_seq or on where in the batch the leaving slots are. Buffers
// are reserved for max_batch so steady-state steps allocate no memory.
// Ownership: the running sequences change only through Commit. The manager
// refuses to append to, set the drafts of, free or preempt one directly
// (FailedPrecondition, nothing changed), so the page table's row of a
// running sequence always holds its pages; when the commit is destroyed its
// running sequences are the manager's caller's again.
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
// empty). `id` is non-negative. `fork_of` is running at the start of the step
// and not leaving in it, or joined earlier in the same step. Every fork is
// made before any sequence appends, so it shares its parent's pages as they
// were before this step's appends: a running parent's as at the start of the
// step, a parent joining in this step's as it joined (a fork of a fork that
// appends does not see the tokens that fork appends in this step). A fork of
// a sequence joining in the same step appends nothing in that step (a
// prompt's pages are prefilled by the step: nothing to copy yet).
struct JoinRequest {
  SequenceId id = kNoSequence;
  SequenceId fork_of = kNoSequence;
  absl::Span<const TokenId> tokens = {};
  HashExtraKeys extra = {};  // prompts only: cache salt and adapter id.
  // Prompts only: BlockManager::HashPrompt(tokens, extra), or empty to hash
  // the prompt in the step.
  absl::Span<const BlockHash> prompt_hashes = {};
  // Prompts only: how much of the prompt this step computes (chunked
  // prefill; the rest comes as PromptChunks) and whether it reads the
  // prefix cache.
  AdmitOptions admit = {};
};

// The next part of the prompt of a running sequence admitted with part of it
// (chunked prefill): BlockManager::AppendPrompt(id, tokens, prompt_hashes).
struct PromptChunk {
  SequenceId id = kNoSequence;
  absl::Span<const TokenId> tokens = {};
  absl::Span<const BlockHash> prompt_hashes = {};  // the whole prompt's.
};

// One step. `append_counts[s]` tokens of `append_tokens` (consumed in slot
// order) are appended to the sequence in slot `s` at the start of the step;
// `append_counts` is empty (no appends) or has one entry per running slot.
// `draft_counts` is empty or has one entry per running slot: after its
// appends, the sequence in slot `s` holds `draft_counts[s]` draft slots
// (speculative decoding, BlockManager::SetDrafts; 0 drops its drafts). With
// it empty, the drafts held stay, less those the appends took. A sequence
// with a prompt chunk has no appends or drafts in the same step.
struct StepPlan {
  absl::Span<const SequenceId> finished = {};
  absl::Span<const SequenceId> preempted = {};
  absl::Span<const JoinRequest> joins = {};
  absl::Span<const int32_t> append_counts = {};
  absl::Span<const TokenId> append_tokens = {};
  absl::Span<const PromptChunk> prompt_chunks = {};
  absl::Span<const int32_t> draft_counts = {};
};

// What a committed step did. Views into BatchCommit's buffers, valid until the
// next Commit.
struct StepResult {
  // Per old slot (max_batch entries): its sequence's new slot, or -1 when it
  // left (or held none).
  absl::Span<const SlotId> old_to_new;
  int32_t batch = 0;  // running sequences after the step.
  // The rows that moved, {old slot, new slot}: one per hole filled.
  absl::Span<const KVPageTableRowMove> moves;
  // New slots whose rows were rewritten (after the moves): survivors whose
  // pages changed, in the order of their old slots, then every join; with
  // KV cache groups, table rows (group * max_batch + slot), group by group.
  absl::Span<const SlotId> changed_slots;
  absl::Span<const PageCopy> copies;  // CoW copies to run, in order.
  // With KV cache groups: the group of each of `copies` (its KV is that
  // group's layers'); empty for one group.
  absl::Span<const int32_t> copy_groups = {};
  // Pages the step allocated for tokens: the admitted prompts' pages that
  // were not prefix hits, and the pages appends, prompt chunks and drafts
  // started. Copy-on-write destinations (one per entry of `copies`) and
  // revived cached pages are not counted.
  int32_t new_pages = 0;
  // Of `copies`, those made for drafts (a shared partial page under new
  // draft slots).
  int32_t draft_copies = 0;
  // With a host tier (BlockManagerOptions::host_pages): the step's copy
  // batch (BlockPool::TakeHostCopies; with the copies of any calls made on
  // the manager since the last step). Run every kDeviceToHost copy, then
  // every kHostToDevice copy, after the last step's forward pass and before
  // `copies` and this step's.
  absl::Span<const HostCopy> host_copies = {};
};

// Host time of Commit's parts, summed over the calls made while phase timing
// is on (BatchCommit::set_time_phases); failed steps count too.
struct CommitPhaseTimes {
  // Free and Preempt of the leaving sequences, and the window groups'
  // release of the pages the survivors' windows left.
  int64_t frees_ns = 0;
  int64_t admissions_ns = 0;  // Admit of prompts (hashing included), Fork.
  int64_t appends_ns = 0;     // AppendMany, the forks' appends, and
                              // queueing the rows they change.
  int64_t page_table_ns = 0;  // the table's edit (KVPageTable::Apply).
  // All of Commit; what the parts leave is bookkeeping: validation, slot
  // assignment, row updates and the manager's transaction.
  int64_t total_ns = 0;

  friend bool operator==(const CommitPhaseTimes&,
                         const CommitPhaseTimes&) = default;
};

class BatchCommit {
 public:
  // Both must outlive the BatchCommit. InvalidArgument when the table's
  // geometry does not match the manager's config: max_batch rows of
  // max_pages_per_seq pages; FailedPrecondition while another BatchCommit
  // writes the table's rows (one table, one commit). The batch starts empty,
  // and so do the table's rows: Create empties any a commit before left. With
  // KV cache groups (BlockManager::has_kv_cache_groups) the table holds every
  // group's batched table, one after the other, in one device tensor uploaded
  // as one patch: group g's slot s is row g * max_batch + s, and the table has
  // num_groups * max_batch rows as wide as the widest group's (a group's
  // max_pages_per_seq is that of the config's tokens at its page size).
  // Window groups release the pages their window left (their entries the
  // null page) before each step's appends, and the rows show it.
  static absl::StatusOr<std::unique_ptr<BatchCommit>> Create(
      BlockManager& manager, KVPageTable& table);
  ~BatchCommit();
  BatchCommit(const BatchCommit&) = delete;
  BatchCommit& operator=(const BatchCommit&) = delete;

  // Applies `plan` as one transaction. Errors: InvalidArgument (a sequence
  // named twice, an unknown fork parent, append_counts of the wrong length or
  // not matching append_tokens, prompt_hashes that do not fit their prompt),
  // NotFound (a leaving sequence not running),
  // AlreadyExists (a joining id already live), ResourceExhausted (pages ran
  // out), OutOfRange (a sequence past max_pages_per_seq), FailedPrecondition
  // (the batch would exceed max_batch); and any error of the page table. On
  // error, everything is rolled back.
  //
  // The first error found is returned, in this order. Before any change:
  // append_counts' length, a negative count, the counts' sum against
  // append_tokens; draft_counts' length, a negative one; then each leaving
  // sequence, finished before preempted, in order (not running: NotFound;
  // leaving twice, or given appends or drafts: InvalidArgument); then each
  // prompt chunk in order (its sequence not running: NotFound; leaving,
  // chunked twice, or given appends or drafts: InvalidArgument); then each
  // join in order (a negative id, an id already live: AlreadyExists, a fork
  // parent neither running nor joined before it (a leaving one included), a
  // fork of a same-step join that appends, an id joining twice); then the
  // batch size (FailedPrecondition). Then, applying: the frees, the forks
  // of running sequences in join order, then the other admissions and
  // forks in join order (the manager's errors: a prompt too
  // long is OutOfRange, pages running out ResourceExhausted, a fork of a
  // sequence with prompt left or drafts FailedPrecondition), the appends
  // and drafts in slot order, the prompt chunks, then the forks' appends,
  // and last the page table's edit.
  absl::StatusOr<StepResult> Commit(const StepPlan& plan);

  // At most the allocatable pages (BlockManager::NumAllocatable) a step
  // whose appends are `append_counts` and drafts `draft_counts` (one per
  // running slot each, as StepPlan's; a prompt chunk counts as an append
  // here) takes for them, copies on write included: what a scheduler keeps
  // free for them before it admits (forks and admissions not counted).
  // Exact but for sequences sharing a partial page that all append: each is
  // counted as copying it, and the last to append does not. InvalidArgument
  // when the counts are not one per running slot, or one is negative.
  // O(batch).
  absl::StatusOr<int64_t> AppendPages(
      absl::Span<const int32_t> append_counts,
      absl::Span<const int32_t> draft_counts = {}) const;

  // Running sequences in slot order.
  absl::Span<const SequenceId> slots() const;
  // The slot of a running sequence; NotFound otherwise.
  absl::StatusOr<SlotId> SlotOf(SequenceId id) const;
  int32_t batch() const;

  // Turns timing of Commit's parts on or off (off at creation): eight clock
  // reads a step while on.
  void set_time_phases(bool on);
  bool time_phases() const;
  const CommitPhaseTimes& phase_times() const;

  // Internal when the slot map and the manager or the table disagree: every
  // slot's row equals its sequence's pages, rows past the batch are empty.
  absl::Status CheckInvariants() const;

 private:
  // Its state and the step's parts (lib/commit/batch_commit.cc).
  class Impl;
  explicit BatchCommit(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
};

}  // namespace kvblock

#endif  // KVBLOCK_BATCH_COMMIT_H_
