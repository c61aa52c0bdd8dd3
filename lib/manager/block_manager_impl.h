// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Internal: BlockManagerImpl, what a BlockManager is. The public class
// (kvblock/block_manager.h) holds one and forwards its calls by sequence id;
// this class also speaks the protocol BatchCommit runs steps with: handles
// (a live sequence's slab entry and generation, so that a step of a whole
// batch does no lookup by id), AppendMany over a batch of handles, and the
// step transaction. BatchCommit and the tests reach it through Of(), as
// LevelDB's WriteBatchInternal reaches a WriteBatch.
//
// Its sources: block_manager.cc (creation, the public class's forwarding,
// transactions, events, observers), block_manager_lifecycle.cc (admission,
// fork, removal), block_manager_append.cc (the append paths),
// block_manager_check.cc (CheckInvariants, Snapshot); the undo of every
// change is in step_journal.h, a sequence's own fields in
// sequence/sequence.h.
//
// Thread safety: as BlockManager.
#ifndef KVBLOCK_LIB_MANAGER_BLOCK_MANAGER_IMPL_H_
#define KVBLOCK_LIB_MANAGER_BLOCK_MANAGER_IMPL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/optimization.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "cache/group_key.h"
#include "kvblock/admission.h"
#include "kvblock/block_hash.h"
#include "kvblock/block_manager.h"
#include "kvblock/block_pool.h"
#include "kvblock/config.h"
#include "kvblock/kv_cache_groups.h"
#include "kvblock/kv_events.h"
#include "kvblock/status_macros.h"
#include "kvblock/types.h"
#include "manager/admission_planner.h"
#include "manager/page_hash_memo.h"
#include "manager/step_journal.h"
#include "sequence/sequence_slab.h"

namespace kvblock::internal {

class CacheEventLog;
class GroupCoordinator;
class Reservation;

// Where a manager sits in a model of several KV cache groups: each group is
// one BlockManagerImpl, all sharing one pool (see GroupCoordinator). A
// manager of group `index` > 0 files its pages under keys of its own (a
// group's pages hold other layers' KV), and one of a window kind (sliding or
// chunked local) points its skipped pages at `null_page`, caches only the
// pages a hit can use (CachesFullPage), and caches a page whether or not its
// parent is (its parent may be skipped, as vLLM caches every block).
struct GroupScope {
  int32_t index = 0;
  KvCacheGroupSpec spec;
  int64_t alignment_tokens = 1;
  PageId null_page = kNoPage;
  // The pages reserved for chunked prompts in every group, which each
  // group's allocations leave.
  int32_t* reserved_pages = nullptr;
  // The page hashes of the groups of this one's page size (null: hash
  // every page here).
  PageHashMemo* hash_memo = nullptr;
  // With KV cache events: the log group 0 keeps, which every group records
  // into (null: this manager keeps its own).
  CacheEventLog* events = nullptr;
  // The tokens of the largest page recorded into the log this manager
  // keeps, which it reserves for (0: its own page size).
  int32_t event_page_size = 0;
};

struct AppendManyResult {
  // Indexes (into the call's `handles`, ascending) of the entries whose page
  // list changed: a page was allocated, or the last one was copied.
  std::vector<int32_t> changed;
  // Per entry of `changed`: the sequence's pages after that entry (a view
  // valid until the sequence changes again).
  std::vector<absl::Span<const PageId>> pages;
  // Per entry of `changed`: the first logical page whose id that entry
  // changed; the pages before it are the ones the sequence held before the
  // entry (so a page table row needs rewriting from there only).
  std::vector<int32_t> first_changed_page;
  std::vector<PageCopy> copies;  // copies on write, in entry order.
  int32_t new_pages = 0;         // pages allocated (for tokens or drafts).
  int32_t draft_copies = 0;      // of `copies`, those made for drafts.

  // Empties it, keeping the vectors' capacity.
  void Clear() {
    changed.clear();
    pages.clear();
    first_changed_page.clear();
    copies.clear();
    new_pages = 0;
    draft_copies = 0;
  }
};

class BlockManagerImpl {
 public:
  // REQUIRES: `config` and `options` passed BlockManager::Create's checks.
  BlockManagerImpl(const PagedKvConfig& config,
                   const BlockManagerOptions& options,
                   std::unique_ptr<BlockPool> pool, BlockHasher hasher);
  // Group `scope.index` of a model of several groups, on `pool` (the
  // coordinator's, which must outlive it); `config` is the group's (its page
  // size and table width). REQUIRES: options without KV events.
  BlockManagerImpl(const PagedKvConfig& config,
                   const BlockManagerOptions& options, BlockPool& pool,
                   BlockHasher hasher, const GroupScope& scope);
  ~BlockManagerImpl();
  BlockManagerImpl(const BlockManagerImpl&) = delete;
  BlockManagerImpl& operator=(const BlockManagerImpl&) = delete;

  // The manager's implementation, for BatchCommit and the tests.
  static BlockManagerImpl& Of(BlockManager& manager) { return *manager.impl_; }
  static const BlockManagerImpl& Of(const BlockManager& manager) {
    return *manager.impl_;
  }

  // Slab entries reserved up front: options.max_sequences, or 4 * max_batch
  // (at most INT32_MAX).
  static int32_t MaxSequences(const PagedKvConfig& config,
                              const BlockManagerOptions& options);
  // Adds what a manager under `config` and `options` reserves up front.
  static void Reserve(const PagedKvConfig& config,
                      const BlockManagerOptions& options,
                      Reservation& reservation);

  // BlockManager's calls, as documented there.
  absl::StatusOr<int64_t> HashPrompt(absl::Span<const TokenId> prompt,
                                     const HashExtraKeys& extra,
                                     absl::Span<BlockHash> out) const;
  absl::StatusOr<AdmissionPlan> PlanAdmission(
      absl::Span<const TokenId> prompt, const HashExtraKeys& extra,
      absl::Span<const BlockHash> prompt_hashes,
      const AdmitOptions& admit) const;
  bool CanAdmit(absl::Span<const TokenId> prompt, const HashExtraKeys& extra,
                absl::Span<const BlockHash> prompt_hashes,
                const AdmitOptions& admit) const;
  absl::StatusOr<AdmissionPlan> Admit(SequenceId id,
                                      absl::Span<const TokenId> prompt,
                                      const HashExtraKeys& extra,
                                      absl::Span<const BlockHash> prompt_hashes,
                                      const AdmitOptions& admit);
  absl::StatusOr<AppendResult> AppendPrompt(
      SequenceId id, absl::Span<const TokenId> tokens,
      absl::Span<const BlockHash> prompt_hashes);
  absl::StatusOr<AppendResult> SetDrafts(SequenceId id, int32_t count);
  absl::StatusOr<AppendResult> Append(SequenceId id,
                                      absl::Span<const TokenId> tokens);
  absl::Status Fork(SequenceId parent, SequenceId child);
  absl::Status Remove(SequenceId id, bool preempted);
  bool Contains(SequenceId id) const { return slab_.Find(id) >= 0; }
  absl::StatusOr<absl::Span<const PageId>> Pages(SequenceId id) const;
  absl::StatusOr<int64_t> NumTokens(SequenceId id) const;
  absl::StatusOr<int64_t> PromptTokensLeft(SequenceId id) const;
  absl::StatusOr<int32_t> NumDrafts(SequenceId id) const;
  int32_t NumAllocatable() const;
  int32_t reserved_pages() const { return reserved_pages_; }
  absl::Status TakeKvEvents(std::vector<KvCacheEvent>& out);
  absl::Status TakeKvEvents(KvEventBatch& batch);
  int64_t pending_kv_changes() const;
  absl::Status CheckInvariants() const;
  // CheckInvariants' checks of each sequence, adding the references its
  // tables hold to `references` (by page id) and its reservations to
  // `reserved`; the pool's refcounts are the caller's to compare.
  absl::Status CheckSequences(absl::Span<int32_t> references,
                              int64_t& reserved) const;
  BlockManagerStats stats() const;
  BlockManagerSnapshot Snapshot() const;
  const SequenceSlab& slab() const { return slab_; }
  BlockPool& pool() { return *pool_; }
  const BlockPool& pool() const { return *pool_; }
  const PagedKvConfig& config() const { return config_; }
  const BlockManagerOptions& options() const { return options_; }

  // The handle protocol. A live sequence's handle is valid while it lives
  // (its index is handed out again, with another generation, once its
  // removal commits); every handle's index is below handle_limit().

  // NotFound if `id` is not live.
  absl::StatusOr<SequenceHandle> HandleOf(SequenceId id) const;
  int32_t handle_limit() const { return slab_.limit(); }
  // Pages(id) by handle; InvalidArgument when `handle` is not live.
  absl::StatusOr<absl::Span<const PageId>> PagesAt(SequenceHandle handle) const;
  // The allocatable pages appending `count` tokens to the sequence at
  // `handle`, then holding `drafts` draft slots, would take now: the new
  // pages and the copy of a shared partial page, less what its own
  // reservation covers (prompt chunks). InvalidArgument when `handle` is not
  // live or a count is negative.
  absl::StatusOr<int64_t> PagesForAppend(SequenceHandle handle, int64_t count,
                                         int32_t drafts = 0) const;

  // Appends to many sequences in one transaction, without lookups by id:
  // entry i appends the next `counts[i]` tokens of `tokens` to the sequence
  // at `handles[i]` (a handle may repeat; its appends run in order), then,
  // when `draft_counts` is not empty, sets its draft slots to
  // `draft_counts[i]` as SetDrafts does. An entry whose handle is the empty
  // SequenceHandle{} (index -1) is a gap: it must have count 0 (and no
  // drafts) and is skipped (BatchCommit passes its batch in slot order,
  // leaving slots as gaps). Fills `result` (cleared first). Errors:
  // InvalidArgument when the spans' lengths disagree, a count is negative, a
  // gap has a count, or another handle is not live; FailedPrecondition for a
  // sequence a BatchCommit runs, outside that commit's step; and the errors
  // of Append and SetDrafts. On error, nothing changes and `result` is
  // cleared. O(entries + tokens), plus a page hash per page that fills.
  absl::Status AppendMany(absl::Span<const SequenceHandle> handles,
                          absl::Span<const int32_t> counts,
                          absl::Span<const TokenId> tokens,
                          AppendManyResult& result,
                          absl::Span<const int32_t> draft_counts = {});

  // Whether this manager's group skips pages (a window kind).
  bool skips_pages() const { return scope_.spec.kind != AttentionKind::kFull; }
  // The page a skipped page's entry holds.
  PageId null_page() const { return scope_.null_page; }
  // A window group: releases the pages of the live sequence at `handle`
  // that no token it computes from now on attends to (see
  // ReleaseSkippedPages) and returns the first page it changed, or -1 when
  // none (and for any other group). InvalidArgument when `handle` is not
  // live. Inline, and one comparison while no page is due: a step asks it
  // for every running sequence.
  absl::StatusOr<int32_t> SkipAt(SequenceHandle handle) {
    if (ABSL_PREDICT_FALSE(!slab_.IsLive(handle))) {
      return NotLiveHandleError(handle);
    }
    return SkipEntry(handle.index);
  }

  // The step transaction BatchCommit runs a step in: BeginStep starts
  // journaling; CommitStep forgets the journal; RollbackStep undoes every
  // change since BeginStep, so that Snapshot() compares equal to the one
  // taken at BeginStep() and the handles the same calls return next are the
  // same (generations are restored; only handle_limit() may stay larger).
  // FailedPrecondition when called out of order.
  absl::Status BeginStep();
  absl::Status CommitStep();
  absl::Status RollbackStep();
  bool in_step() const { return in_step_; }

  // Ownership: a sequence a BatchCommit runs changes only through that
  // commit's step. SetRunByCommit marks the live sequence at `handle`;
  // set_commit_applying opens the marked sequences while the commit applies
  // its step (its own checks keep it to its sequences).
  void SetRunByCommit(SequenceHandle handle, bool on) {
    slab_.sequence(handle.index).set_run_by_commit(on);
  }
  void set_commit_applying(bool on) { commit_applying_ = on; }

 private:
  friend class GroupCoordinator;

  // A nested transaction: the pool's savepoint, the journal's mark, and the
  // stats and reserved pages when it began.
  struct Transaction {
    BlockPool::Savepoint pool;
    StepJournal::Mark journal;
    BlockManagerStats stats;
    int32_t reserved_pages = 0;
  };

  // Runs `change` in a transaction: kept when it returns OK, undone else. A
  // template, so the change inlines into it.
  template <typename Change>
  absl::Status Transact(Change&& change) {
    const Transaction transaction = BeginTransaction();
    absl::Status status = change();
    if (status.ok()) {
      CommitTransaction(transaction);
    } else {
      RollbackTransaction(transaction);
    }
    return status;
  }
  Transaction BeginTransaction();
  void CommitTransaction(const Transaction& transaction);
  void RollbackTransaction(const Transaction& transaction);
  // CommitStep and RollbackStep.
  absl::Status EndStep(bool commit);
  // InvalidArgument for a negative id, AlreadyExists for a live one; `what`
  // names it in the message.
  absl::Status CheckNewId(SequenceId id, absl::string_view what) const;

  // The append paths (block_manager_append.cc, whose top says how they
  // split): the decode fast path, AppendDecodeStep for one sequence and
  // AppendDecodeRun for AppendMany's runs of sequences in place; and
  // AppendGeneral.
  // `drafts_after`: the draft slots the sequence then holds, whose end must
  // not fall short of the pages it holds (no page is released); -1: those
  // left after the tokens take theirs. Sets `taken` when the step was one
  // it takes (else changes nothing, and AppendGeneral does it).
  absl::Status AppendDecodeStep(int32_t entry, absl::Span<const TokenId> tokens,
                                int32_t drafts_after, AppendResult& result,
                                bool& taken);
  // AppendDecodeStep past a page edge: 0 < count < page_size tokens that
  // fill at most the partial page, held here alone, and take at most one
  // new page: a decode token that fills or starts a page, a speculative
  // step.
  absl::Status StepPastEdge(int32_t entry, absl::Span<const TokenId> tokens,
                            int32_t drafts_after, AppendResult& result,
                            bool& taken);
  size_t AppendDecodeRun(absl::Span<const SequenceHandle> handles,
                         absl::Span<const int32_t> counts,
                         absl::Span<const TokenId> tokens,
                         absl::Span<const int32_t> draft_counts, size_t i,
                         size_t& next, InPlaceAppend*& notes);
  // The one general append: any number of tokens, across pages (draft
  // slots' pages first), copying a shared partial page first; then the new
  // drafts (`drafts_after` as for AppendDecodeStep). `prompt_hashes`: the
  // whole prompt's hashes for a prompt chunk (pages that fill take theirs),
  // else empty (they are hashed).
  absl::Status AppendGeneral(int32_t entry, absl::Span<const TokenId> tokens,
                             AppendResult& result,
                             absl::Span<const BlockHash> prompt_hashes,
                             int32_t drafts_after);
  // OutOfRange or ResourceExhausted when the sequence at `entry` cannot hold
  // `new_tokens` tokens, nor then `drafts` drafts, copying its partial page
  // first when `copy`.
  absl::Status CheckGrowth(int32_t entry, int64_t new_tokens, int64_t drafts,
                           bool copy) const;
  // Writes `tokens`, which the sequence at `entry` grew by from
  // `old_tokens`, into its partial page, registering every page they fill
  // (under `prompt_hashes` when given, else hashed) as its chain advances.
  absl::Status WriteTokens(int32_t entry, int64_t old_tokens,
                           absl::Span<const TokenId> tokens,
                           absl::Span<const BlockHash> prompt_hashes);
  // Registers the sequence's full page `page`, holding `page_tokens`, that
  // WriteTokens filled: under prompt_hashes[page] when given (page 0 is
  // hashed, and InvalidArgument when that is not prompt_hashes[0]), else
  // hashed.
  absl::Status RegisterChunkPage(int32_t entry, int32_t page,
                                 absl::Span<const BlockHash> prompt_hashes,
                                 absl::Span<const TokenId> page_tokens);
  // SetDraftsAt's checks of `count` drafts for `seq` (sequence `id`): the
  // errors SetDrafts documents but ResourceExhausted.
  absl::Status CheckDrafts(const Sequence& seq, SequenceId id,
                           int32_t count) const;
  absl::Status SetDraftsAt(int32_t entry, int32_t count, AppendResult& result);
  // AppendMany's checks before any change: the spans' lengths, and (outside
  // a commit's step) no sequence a BatchCommit runs.
  absl::Status CheckAppendMany(absl::Span<const SequenceHandle> handles,
                               absl::Span<const int32_t> counts,
                               absl::Span<const int32_t> draft_counts) const;
  // AppendMany's entry `i` past the decode runs: `tokens` for the sequence
  // at `entry`, then `*drafts` draft slots unless null; records a changed
  // table in `result`.
  absl::Status AppendEntry(size_t i, int32_t entry,
                           absl::Span<const TokenId> tokens,
                           const int32_t* drafts, AppendManyResult& result);
  // The chain hashes of `tokens`' whole pages after `parent`, in
  // hash_scratch_.
  absl::Span<const BlockHash> HashPages(BlockHash parent,
                                        absl::Span<const TokenId> tokens);
  // FailedPrecondition when events are off or a step is open.
  absl::Status CheckKvEventsTakeable() const;
  // Whether `parent`, the chain before a page whose predecessor in its
  // sequence is `parent_page`, is cached. A page is cached only behind its
  // parent, so that a radix-tree index built from the KV events (Dynamo's,
  // llm-d's) never gets a page whose parent it does not hold. The sequence's
  // own parent page keeps the hash cached while it is held (see
  // BlockPoolOptions::index_duplicates); only a reset drops it.
  bool ParentCached(PageId parent_page, const BlockHash& parent) const;
  // Registers the sequence's pages [first, first + hashes.size()), which
  // hold `tokens` and follow `parent` in its chain, under `hashes`, when
  // ParentCached (the chain is the caller's to advance).
  absl::Status RegisterPages(int32_t entry, int32_t first,
                             const BlockHash& parent,
                             absl::Span<const BlockHash> hashes,
                             absl::Span<const TokenId> tokens);
  // Registers the sequence's full page `page` (the one its last token
  // filled, holding `page_tokens`) under `hash`, or hashes it when null,
  // when ParentCached; the sequence's chain advances either way.
  absl::Status RegisterFullPage(int32_t entry, int32_t page,
                                const BlockHash* hash,
                                absl::Span<const TokenId> page_tokens);
  // What allocations for the sequence at `entry` may take now: free +
  // evictable, less the other sequences' reservations.
  int64_t AllocatableFor(int32_t entry) const {
    if (reserved_pages_ == 0) return pool_->NumFree();  // inline: appends ask.
    return int64_t{pool_->NumFree()} - reserved_pages_ + ReservationOf(entry);
  }
  // The pages the sequence at `entry` still has reserved.
  int32_t ReservationOf(int32_t entry) const;
  // Takes `pages` just allocated for `entry` out of its reservation.
  void DrawReservation(int32_t entry, int32_t pages);
  // The entry of live sequence `id`; NotFound when it is not live.
  absl::StatusOr<int32_t> LiveEntry(SequenceId id) const {
    const int32_t entry = slab_.Find(id);
    if (ABSL_PREDICT_FALSE(entry < 0)) return NotLiveError(id);
    return entry;
  }
  // NotFound naming `id`.
  static absl::Status NotLiveError(SequenceId id);
  // The entry of live sequence `id`, for a call that changes it: NotFound
  // when it is not live, CheckNotRunByCommit's error.
  // Inline, with the errors out of line: Append asks it every call.
  absl::StatusOr<int32_t> EntryToChange(SequenceId id) const {
    const int32_t entry = slab_.Find(id);
    if (ABSL_PREDICT_FALSE(entry < 0)) return NotLiveError(id);
    if (ABSL_PREDICT_FALSE(slab_.sequence(entry).run_by_commit())) {
      KVBLOCK_RETURN_IF_ERROR(CheckNotRunByCommit(entry, id));
    }
    return entry;
  }
  // FailedPrecondition when sequence `id` at `entry` is run by a BatchCommit
  // and that commit is not applying its step.
  absl::Status CheckNotRunByCommit(int32_t entry, SequenceId id) const;

  // The hash of the page holding `tokens` after `parent` (through the
  // scope's memo, when it has one).
  BlockHash HashPage(const BlockHash& parent,
                     absl::Span<const TokenId> tokens) {
    return scope_.hash_memo != nullptr
               ? scope_.hash_memo->Hash(hasher_, parent, tokens)
               : hasher_.HashPage(parent, tokens);
  }
  // The key `hash` is cached under in this manager's group.
  // Inline: group 0's key is the hash itself; another group's is built in
  // `salted`.
  const BlockHash& Key(const BlockHash& hash, BlockHash& salted) const {
    if (ABSL_PREDICT_TRUE(scope_.index == 0)) return hash;
    salted = SaltKey(hash, key_salt_);
    return salted;
  }
  // SkipAt for the live sequence at `entry`.
  absl::StatusOr<int32_t> SkipEntry(int32_t entry) {
    if (!skips_pages() || slab_.sequence(entry).num_tokens() <
                              slab_.sequence(entry).skip_due_at()) {
      return -1;
    }
    return ReleaseSkippedPages(entry);
  }
  // A window group: releases the pages wholly before the window of the
  // sequence at `entry` (NumSkippedPages of its tokens) that it still holds,
  // newest first (vLLM's remove_skipped_blocks), pointing their entries at
  // the null page, and sets its skip_due_at; returns the first page
  // released, or -1 when none was.
  absl::StatusOr<int32_t> ReleaseSkippedPages(int32_t entry);
  // InvalidArgument naming `handle`, which is not live.
  static absl::Status NotLiveHandleError(SequenceHandle handle);
  // Admit after planning: `plan` and `hashes` are the planner's, for
  // `prompt` with `extra`; the hit pages are its hits().
  absl::Status AdmitPlanned(SequenceId id, absl::Span<const TokenId> prompt,
                            const HashExtraKeys& extra,
                            const AdmissionPlan& plan,
                            absl::Span<const BlockHash> hashes);
  // AdmitPlanned's hits when some are the host tier's: takes the device's
  // hits, loads the host tier's (each a registration of its own) and adds
  // them all to the sequence at `entry`.
  absl::Status TakeHits(int32_t entry, absl::Span<const TokenId> prompt,
                        const HashExtraKeys& extra, const AdmissionPlan& plan,
                        absl::Span<const BlockHash> hashes);

  const PagedKvConfig config_;
  const BlockManagerOptions options_;
  const GroupScope scope_;
  // The salt of Key for a group after the first.
  BlockHash key_salt_;
  // The pool: owned (one group) or the coordinator's.
  std::unique_ptr<BlockPool> owned_pool_;
  BlockPool* pool_;
  // Hashes pages that fill; the planner hashes prompts with it too. Its
  // scratch changes in const calls (see Thread safety).
  mutable BlockHasher hasher_;
  // Scratch of the const planning calls (see Thread safety).
  mutable AdmissionPlanner planner_;
  SequenceSlab slab_;
  StepJournal journal_;
  // Admit's fresh pages, and a removed sequence's pages.
  std::vector<PageId> page_scratch_;
  // The hashes of an append's whole pages (HashPages).
  std::vector<BlockHash> hash_scratch_;
  // The step's transaction, open while in_step_.
  Transaction step_;
  bool in_step_ = false;
  // With enable_kv_events: the pool's and the registrations' record.
  // (A group after the first records into group 0's: `events_` is that
  // log, `owned_events_` null.)
  std::unique_ptr<CacheEventLog> owned_events_;
  CacheEventLog* events_ = nullptr;
  // Reserved with it, for the first batch TakeKvEvents fills: its pages are
  // faulted in at Create, not in a step.
  std::unique_ptr<CacheEventLog> spare_events_;
  // Manager-owned counters (pool-derived ones are filled in by stats()).
  BlockManagerStats stats_;
  // Pages reserved for the rest of chunked prompts, the sum of
  // ReservationOf over the live sequences (of every group: the scope's
  // count, else own_reserved_pages_).
  int32_t own_reserved_pages_ = 0;
  int32_t& reserved_pages_;
  // True while a BatchCommit applies its step: the sequences commits run are
  // open to it (its Validate keeps it to its own).
  bool commit_applying_ = false;
};

}  // namespace kvblock::internal

#endif  // KVBLOCK_LIB_MANAGER_BLOCK_MANAGER_IMPL_H_
