// Copyright 2026 The kvblock Authors.
//
// BlockManager: the sequence-level API a serving scheduler calls. It owns the
// BlockPool (with its prefix cache) and one SequenceBlockTable per live
// sequence, addressed by the scheduler's SequenceId.
//
//   Admit    a prompt: whole-page prefix hits first (walking the prompt's hash
//            chain until the first miss), then fresh pages; all or nothing.
//            As in vLLM, when the whole prompt is cached its last page is
//            recomputed (not taken from the cache) so the model has a token
//            to run. Full prompt pages are registered in the prefix cache.
//   Append   generated tokens: a new page when the last one is full; a
//            copy-on-write when the last, partial page is shared with a fork.
//            Every page that becomes full is registered in the prefix cache.
//   Fork     a child that shares every page of its parent (beam search,
//            parallel sampling); the shared partial page is copied on the
//            first write of either.
//   Free / Preempt a sequence: its pages are released tail first, so cached
//            prefixes outlive their continuations in the LRU.
//
// Invariants (CheckInvariants): every page's refcount equals the number of
// sequence tables that hold it; free, evictable and used pages partition the
// pool; the prefix index and the LRU list agree (BlockPool's own checks).
//
// Transactions: between BeginStep() and CommitStep() every change is journaled
// and RollbackStep() restores the manager and its pool: Snapshot() compares
// equal to the one taken at BeginStep() (refcounts, free-list and LRU order,
// prefix index, every sequence, stats), and the handles the same calls
// return next are the same (generations are restored). Only handle_limit()
// may stay larger (the slab keeps entries it grew). The journal is reserved
// up front: steps allocate no memory in steady state.
//
// Complexity: Append is O(1) per token plus one page hash per page that fills;
// Admit is O(prompt pages) hashes and lookups; Fork, Free and Preempt are
// O(pages of the sequence). Sequence state lives in a slab reserved for
// `max_sequences`, so no call allocates in steady state.
//
// Every failing call leaves the manager unchanged (strong guarantee).
//
// Thread safety: thread-compatible; one scheduler thread owns a manager.
// HashPrompt, PlanAdmission and CanAdmit use internal scratch: not even const
// calls may run concurrently (hash prompts on another thread with a
// BlockHasher of its own and HashChain).
#ifndef KVBLOCK_BLOCK_MANAGER_H_
#define KVBLOCK_BLOCK_MANAGER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kvblock/block_hash.h"
#include "kvblock/block_pool.h"
#include "kvblock/config.h"
#include "kvblock/sequence_table.h"
#include "kvblock/types.h"

namespace kvblock {

namespace internal {
class AdmissionPlanner;
struct InPlaceAppend;
class SequenceSlab;
class StepJournal;
}  // namespace internal

struct BlockManagerOptions {
  // Share full prompt and generated pages across sequences by hash.
  bool enable_prefix_caching = true;
  HashAlgorithm hash_algorithm = HashAlgorithm::kSha256;
  // Admission leaves at least this many allocatable pages for the appends of
  // running sequences (vLLM's watermark). Appends may use them.
  int32_t watermark_pages = 0;
  // Sequence slots reserved up front (0: 4 * max_batch, at most INT32_MAX).
  // More sequences still work, at the cost of allocation.
  int32_t max_sequences = 0;
};

// One copy-on-write the KV copy kernel must run before the next attention:
// copy page `source` to page `destination` (K and V, every layer).
struct PageCopy {
  PageId source = kNoPage;
  PageId destination = kNoPage;
  friend bool operator==(const PageCopy&, const PageCopy&) = default;
};

// What admitting a prompt takes, computed without changing anything.
struct AdmissionPlan {
  int32_t hit_pages = 0;      // whole pages served from the prefix cache.
  int64_t hit_tokens = 0;     // hit_pages * page_size.
  int32_t revived_pages = 0;  // of the hits, pages now evictable.
  int32_t new_pages = 0;      // fresh pages to allocate.
  // Allocatable pages the admission consumes: revived + new.
  int32_t pages_consumed() const { return revived_pages + new_pages; }
};

struct AppendResult {
  int32_t new_pages = 0;         // pages allocated because one filled.
  std::optional<PageCopy> copy;  // set when a shared last page was copied.
};

// A live sequence's place in the manager's slab, what the per-step paths
// (BatchCommit) use to address many sequences without a lookup by id. The
// generation tells the sequences that take the same entry in turn apart, so
// the handle of a sequence that left never reaches the next one.
struct SequenceHandle {
  int32_t index = -1;
  uint32_t generation = 0;
  friend bool operator==(const SequenceHandle&,
                         const SequenceHandle&) = default;
};

// What an AppendMany call did. The caller keeps one and reuses it, so that
// steady-state calls allocate nothing.
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
  int32_t new_pages = 0;         // pages allocated because one filled.
};

struct BlockManagerStats {
  int64_t admitted = 0;  // Admit calls that succeeded.
  int64_t forks = 0;
  int64_t freed = 0;              // Free calls (finished sequences).
  int64_t preemptions = 0;        // Preempt calls.
  int64_t prompt_tokens = 0;      // tokens of admitted prompts.
  int64_t prefix_hit_tokens = 0;  // of those, served from the cache.
  int64_t appended_tokens = 0;    // tokens added by Append.
  int64_t cow_copies = 0;
  int64_t evictions = 0;     // cached pages reused for other content.
  int32_t pages_in_use = 0;  // pages with refcount > 0.
  int32_t peak_pages_in_use = 0;
  friend bool operator==(const BlockManagerStats&,
                         const BlockManagerStats&) = default;
};

// See BlockManager::Snapshot().
struct BlockManagerSnapshot {
  struct SequenceState {
    SequenceId id = kNoSequence;
    std::vector<PageId> pages;
    int64_t num_tokens = 0;
    BlockHash last_full_hash;
    std::vector<TokenId> partial_tokens;
    std::string cache_salt;
    int64_t adapter_id = 0;
    friend bool operator==(const SequenceState&,
                           const SequenceState&) = default;
  };
  BlockPoolSnapshot pool;
  std::vector<SequenceState> sequences;
  BlockManagerStats stats;
  friend bool operator==(const BlockManagerSnapshot&,
                         const BlockManagerSnapshot&) = default;
};

class BlockManager {
 public:
  // InvalidArgument when `config` fails Validate() or an option is negative.
  // ResourceExhausted when what the manager reserves up front (a slab entry
  // per reserved sequence, each with a page table of max_pages_per_seq ids
  // and page_size partial tokens, and journals sized for max_batch) is more
  // than the machine's memory, or cannot be allocated.
  static absl::StatusOr<std::unique_ptr<BlockManager>> Create(
      const PagedKvConfig& config, const BlockManagerOptions& options = {});

  BlockManager(const BlockManager&) = delete;
  BlockManager& operator=(const BlockManager&) = delete;
  ~BlockManager();

  // The prefix-cache hashes of the full pages of `prompt` with `extra`
  // (HashChain under this manager's algorithm and page size) into `out`;
  // returns how many. A scheduler computes them once per request, on
  // arrival as vLLM does, and passes them as `prompt_hashes` below, so that
  // planning a waiting request every step hashes nothing and admitting it
  // hashes only its first page (the check that the hashes are this
  // prompt's, under these extra keys).
  // Errors: HashChain's (`out` too short). O(prompt tokens).
  absl::StatusOr<int64_t> HashPrompt(absl::Span<const TokenId> prompt,
                                     const HashExtraKeys& extra,
                                     absl::Span<BlockHash> out) const;

  // What Admit would take now. `prompt_hashes` is empty (the prompt is hashed
  // here) or HashPrompt's output for this prompt and `extra` (trusted: other
  // hashes would file pages under wrong keys); ignored without prefix
  // caching. InvalidArgument for an empty prompt or prompt_hashes of the
  // wrong length; OutOfRange when the prompt needs more than
  // max_pages_per_seq pages. Changes nothing.
  absl::StatusOr<AdmissionPlan> PlanAdmission(
      absl::Span<const TokenId> prompt, const HashExtraKeys& extra = {},
      absl::Span<const BlockHash> prompt_hashes = {}) const;

  // True when Admit would succeed now, watermark included.
  bool CanAdmit(absl::Span<const TokenId> prompt,
                const HashExtraKeys& extra = {},
                absl::Span<const BlockHash> prompt_hashes = {}) const;

  // Admits sequence `id` with `prompt`, taking prefix hits first;
  // `prompt_hashes` as for PlanAdmission, its first hash checked against the
  // prompt's first page and `extra`. Errors: InvalidArgument for a negative
  // id (kNoSequence names no sequence); AlreadyExists for a live id;
  // InvalidArgument / OutOfRange as PlanAdmission, and for a first hash that
  // does not match; ResourceExhausted when the pages (after eviction) would
  // leave fewer than the watermark free. On error, nothing changes.
  absl::StatusOr<AdmissionPlan> Admit(
      SequenceId id, absl::Span<const TokenId> prompt,
      const HashExtraKeys& extra = {},
      absl::Span<const BlockHash> prompt_hashes = {});

  // Appends `tokens` to sequence `id`. Errors: NotFound for an unknown id;
  // OutOfRange past max_pages_per_seq pages; ResourceExhausted when the pool
  // (after eviction) has too few pages. On error, nothing changes.
  absl::StatusOr<AppendResult> Append(SequenceId id,
                                      absl::Span<const TokenId> tokens);

  // Appends to many sequences in one transaction, without lookups by id:
  // entry i appends the next `counts[i]` tokens of `tokens` to the sequence
  // at `handles[i]` (a handle may repeat; its appends run in order). An
  // entry whose handle is the empty SequenceHandle{} (index -1) is a gap: it
  // must have count 0 and is skipped (BatchCommit passes its batch in slot
  // order, leaving slots as gaps). Fills `result` (cleared first). Errors:
  // InvalidArgument when the spans' lengths disagree, a count is negative, a
  // gap has a count, or another handle is not live; and the errors of
  // Append. On error, nothing changes and `result` is cleared.
  // O(entries + tokens), plus a page hash per page that fills.
  absl::Status AppendMany(absl::Span<const SequenceHandle> handles,
                          absl::Span<const int32_t> counts,
                          absl::Span<const TokenId> tokens,
                          AppendManyResult& result);

  // Makes `child` a copy of `parent` sharing every page. NotFound for an
  // unknown parent; InvalidArgument for a negative child id; AlreadyExists
  // for a live child. On error, nothing changes.
  absl::Status Fork(SequenceId parent, SequenceId child);

  // Releases a finished sequence's pages (tail first). NotFound if unknown.
  absl::Status Free(SequenceId id);
  // Same as Free for a sequence the scheduler evicts to recompute later;
  // counted as a preemption. NotFound if unknown.
  absl::Status Preempt(SequenceId id);

  bool Contains(SequenceId id) const;
  int32_t num_sequences() const;
  // The sequence's physical pages in logical order (a view that stays valid
  // until the sequence changes). NotFound if unknown.
  absl::StatusOr<absl::Span<const PageId>> Pages(SequenceId id) const;
  // Tokens the sequence holds (prompt + appended). NotFound if unknown.
  absl::StatusOr<int64_t> NumTokens(SequenceId id) const;

  // The handle of live sequence `id`, valid while it lives (its index is
  // handed out again, with another generation, once its removal commits).
  // NotFound if unknown.
  absl::StatusOr<SequenceHandle> HandleOf(SequenceId id) const;
  // Every handle's index is below this bound.
  int32_t handle_limit() const;
  // Pages(id) by handle (BatchCommit reads a row's pages this way);
  // InvalidArgument when `handle` is not live.
  absl::StatusOr<absl::Span<const PageId>> PagesAt(SequenceHandle handle) const;
  // The pages appending `count` tokens to the sequence at `handle` would
  // allocate now: the new pages, and the copy of a shared partial last page.
  // InvalidArgument when `handle` is not live or `count` is negative.
  absl::StatusOr<int64_t> PagesForAppend(SequenceHandle handle,
                                         int64_t count) const;

  // Drops every cached prefix; see BlockPool::ResetPrefixCache.
  absl::Status ResetPrefixCache();

  // Step transactions (used by BatchCommit). BeginStep starts journaling;
  // CommitStep forgets the journal; RollbackStep undoes every change since
  // BeginStep. FailedPrecondition when called out of order.
  absl::Status BeginStep();
  absl::Status CommitStep();
  absl::Status RollbackStep();
  bool in_step() const;

  // Internal when any invariant of the header comment is broken.
  absl::Status CheckInvariants() const;

  // Counters since creation; pool-derived fields (evictions, CoW copies,
  // pages in use, peak) are read from the pool.
  BlockManagerStats stats() const;
  const BlockPool& pool() const { return *pool_; }
  const PagedKvConfig& config() const { return config_; }
  const BlockManagerOptions& options() const { return options_; }

  // The exact observable state: pool snapshot, every live sequence (sorted by
  // id) and the stats. Two managers with equal snapshots behave the same
  // through the calls by id (handles may differ, unless one is the other
  // rolled back).
  // O(num_pages + pages of all sequences). For tests and debugging.
  BlockManagerSnapshot Snapshot() const;

 private:
  struct Transaction;

  BlockManager(const PagedKvConfig& config, const BlockManagerOptions& options,
               std::unique_ptr<BlockPool> pool, BlockHasher hasher);
  // Slab entries reserved up front: options.max_sequences, or 4 * max_batch
  // (at most INT32_MAX).
  static int32_t MaxSequences(const PagedKvConfig& config,
                              const BlockManagerOptions& options);

  // Runs `change` in a transaction: kept when it returns OK, undone else
  // (lib/block_manager_transact.h).
  template <typename Change>
  absl::Status Transact(Change&& change);
  Transaction BeginTransaction();
  void CommitTransaction(const Transaction& transaction);
  void RollbackTransaction(const Transaction& transaction);
  // CommitStep and RollbackStep.
  absl::Status EndStep(bool commit);
  // InvalidArgument for a negative id, AlreadyExists for a live one; `what`
  // names it in the message.
  absl::Status CheckNewId(SequenceId id, absl::string_view what) const;

  // The append paths (block_manager_append.cc): AppendInPlace takes the
  // common case for Append and AppendDecodeRun for AppendMany (tokens that
  // stay in a partial page held here alone, the one check both share);
  // AppendSlow the rest.
  bool AppendInPlace(int32_t entry, absl::Span<const TokenId> tokens);
  size_t AppendDecodeRun(absl::Span<const SequenceHandle> handles,
                         absl::Span<const int32_t> counts,
                         absl::Span<const TokenId> tokens, size_t i,
                         size_t& next, internal::InPlaceAppend*& notes);
  absl::Status AppendSlow(int32_t entry, absl::Span<const TokenId> tokens,
                          AppendResult& result);
  absl::Status RegisterFullPage(int32_t entry);
  absl::Status Remove(SequenceId id, bool preempted);

  const PagedKvConfig config_;
  const BlockManagerOptions options_;
  std::unique_ptr<BlockPool> pool_;
  // Hashes pages that fill; the planner hashes prompts with it too. Its
  // scratch changes in const calls (see Thread safety).
  mutable BlockHasher hasher_;
  // Scratch of the const planning calls (see Thread safety).
  std::unique_ptr<internal::AdmissionPlanner> planner_;
  std::unique_ptr<internal::SequenceSlab> slab_;
  std::unique_ptr<internal::StepJournal> journal_;
  // Admit's fresh pages, and a removed sequence's pages.
  std::vector<PageId> page_scratch_;
  // The step's transaction (allocated once), open while in_step_.
  std::unique_ptr<Transaction> step_;
  bool in_step_ = false;
  // Manager-owned counters (pool-derived ones are filled in by stats()).
  BlockManagerStats stats_;
};

}  // namespace kvblock

#endif  // KVBLOCK_BLOCK_MANAGER_H_
