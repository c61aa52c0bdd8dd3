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
// Chunked prefill: Admit with AdmitOptions::prefill_tokens takes the prefix
// hits of the whole prompt but pages only for them and the tokens the
// admitting step computes; AppendPrompt adds the rest of the prompt in chunks
// of any size, in later steps. A page is registered when the tokens that fill
// it are scheduled (admitted or appended), never earlier. With
// reserve_prompt_pages the admission also needs the rest of the prompt's
// pages allocatable, and reserves them: other sequences' allocations leave
// them, the chunks take them, leaving (Free, Preempt) returns what is left.
//
// Speculative decoding: SetDrafts gives a decoding sequence draft slots after
// its tokens: pages the kernels write the drafts' KV into (a shared partial
// page is copied on write first), never hashed, registered or shared. The
// tokens appended next take the draft slots first (an accepted draft's KV is
// in place; pages they fill are registered); the drafts left over are
// dropped when the next SetDrafts (or AppendMany's draft_counts) sets the new
// ones, and pages wholly past the new end are released. A sequence with
// prompt tokens left or drafts cannot be forked.
//
// Invariants (CheckInvariants): every page's refcount equals the number of
// sequence tables that hold it; a sequence holds the pages of its tokens and
// drafts; the reserved pages are the sum of the reservations left and are
// allocatable; free, evictable and used pages partition the pool; the prefix
// index and the LRU list agree (BlockPool's own checks).
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
// Ownership: a sequence a BatchCommit runs (from the step it joins until the
// step it leaves) changes only through that commit's Commit. Append,
// AppendPrompt, SetDrafts, AppendMany, Free and Preempt refuse it with
// FailedPrecondition, so its row in the page table never falls behind its
// pages. Reading it, and forking it (the child is the caller's), stay open.
//
// Thread safety: thread-compatible; one scheduler thread owns a manager.
// HashPrompt, PlanAdmission and CanAdmit use internal scratch: not even const
// calls may run concurrently (hash prompts on another thread with a
// BlockHasher of its own and HashChain).
#ifndef KVBLOCK_BLOCK_MANAGER_H_
#define KVBLOCK_BLOCK_MANAGER_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kvblock/admission.h"
#include "kvblock/block_hash.h"
#include "kvblock/block_pool.h"
#include "kvblock/config.h"
#include "kvblock/kv_events.h"
#include "kvblock/sequence_table.h"
#include "kvblock/types.h"

namespace kvblock {

namespace internal {
class AdmissionPlanner;
class CacheEventLog;
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
  // Chunked prefill: an admission that leaves part of its prompt for later
  // chunks reserves that part's pages (vLLM's "the whole prompt must fit");
  // false admits on the first chunk's pages alone.
  bool reserve_prompt_pages = true;
  // Record KV cache events (kvblock/kv_events.h) for TakeKvEvents. They
  // accumulate until taken: every step, or at each look of a publisher's
  // thread (KvEventPublisher::idle()).
  bool enable_kv_events = false;
  // With events on, the cache changes (pages stored or removed) the log
  // holds before its buffers grow, in [0, 2^22]: allocated and written at
  // Create (about 200 bytes a change), and as much for the batch that
  // TakeKvEvents first fills, so that recording the steps between takes
  // neither allocates nor faults pages in.
  int32_t reserved_kv_changes = 4096;
};

// The most BlockManagerOptions::reserved_kv_changes may ask for.
inline constexpr int32_t kMaxReservedKvChanges = 1 << 22;

// One copy-on-write the KV copy kernel must run before the next attention:
// copy page `source` to page `destination` (K and V, every layer).
struct PageCopy {
  PageId source = kNoPage;
  PageId destination = kNoPage;
  friend bool operator==(const PageCopy&, const PageCopy&) = default;
};

struct AppendResult {
  int32_t new_pages = 0;         // pages allocated (for tokens or drafts).
  std::optional<PageCopy> copy;  // set when a shared partial page was copied.
  int32_t released_pages = 0;    // draft pages released (SetDrafts).
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
  int32_t new_pages = 0;         // pages allocated (for tokens or drafts).
  int32_t draft_copies = 0;      // of `copies`, those made for drafts.
};

struct BlockManagerStats {
  int64_t admitted = 0;  // Admit calls that succeeded.
  int64_t forks = 0;
  int64_t freed = 0;              // Free calls (finished sequences).
  int64_t preemptions = 0;        // Preempt calls.
  int64_t prompt_tokens = 0;      // tokens of admitted prompts (whole).
  int64_t prefix_hit_tokens = 0;  // of those, served from the cache.
  int64_t prompt_chunks = 0;      // AppendPrompt calls.
  int64_t appended_tokens = 0;    // tokens added by Append (not prompts).
  int64_t draft_slots = 0;        // draft slots set by SetDrafts.
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
    int64_t prompt_tokens = 0;  // the prompt's length.
    int32_t drafts = 0;
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
  // here, up to its first miss) or HashPrompt's output for this prompt and
  // `extra` (trusted: other hashes would file pages under wrong keys);
  // ignored without prefix caching. InvalidArgument for an empty prompt,
  // prompt_hashes of the wrong length or a prefill_tokens below 1;
  // OutOfRange when the prompt needs more than max_pages_per_seq pages.
  // Changes nothing.
  absl::StatusOr<AdmissionPlan> PlanAdmission(
      absl::Span<const TokenId> prompt, const HashExtraKeys& extra = {},
      absl::Span<const BlockHash> prompt_hashes = {},
      const AdmitOptions& admit = {}) const;

  // True when Admit would succeed now, watermark included.
  bool CanAdmit(absl::Span<const TokenId> prompt,
                const HashExtraKeys& extra = {},
                absl::Span<const BlockHash> prompt_hashes = {},
                const AdmitOptions& admit = {}) const;

  // Admits sequence `id` with `prompt`, taking prefix hits first (unless
  // `admit` says not to) and computing at most admit.prefill_tokens of the
  // rest; `prompt_hashes` as for PlanAdmission, its first hash checked
  // against the prompt's first page and `extra`. Errors: InvalidArgument for
  // a negative id (kNoSequence names no sequence); AlreadyExists for a live
  // id; InvalidArgument / OutOfRange as PlanAdmission, and for a first hash
  // that does not match; ResourceExhausted when the pages consumed and
  // reserved would leave fewer than the watermark allocatable. On error,
  // nothing changes.
  absl::StatusOr<AdmissionPlan> Admit(
      SequenceId id, absl::Span<const TokenId> prompt,
      const HashExtraKeys& extra = {},
      absl::Span<const BlockHash> prompt_hashes = {},
      const AdmitOptions& admit = {});

  // Chunked prefill: appends `tokens`, the next part of the prompt of
  // sequence `id`. The pages they fill are registered, filed under
  // `prompt_hashes` (HashPrompt's output for the whole prompt, trusted once
  // it continues this sequence's chain) or hashed here when it is empty.
  // Errors: NotFound for an unknown id; InvalidArgument for an empty chunk,
  // more tokens than the prompt has left, or prompt_hashes of the wrong
  // length or another chain; ResourceExhausted when the pool (after
  // eviction, less other sequences' reservations) has too few pages. On
  // error, nothing changes.
  absl::StatusOr<AppendResult> AppendPrompt(
      SequenceId id, absl::Span<const TokenId> tokens,
      absl::Span<const BlockHash> prompt_hashes = {});

  // Speculative decoding: sequence `id` holds `count` draft slots (0 or
  // more) after its tokens, in place of the ones it held. Pages are
  // allocated to cover them (its shared partial page copied first) and
  // pages wholly past them released, last first. Errors: NotFound;
  // InvalidArgument for a negative count; FailedPrecondition while prompt
  // tokens are left; OutOfRange past max_pages_per_seq; ResourceExhausted. On
  // error, nothing changes.
  absl::StatusOr<AppendResult> SetDrafts(SequenceId id, int32_t count);

  // Appends `tokens` to sequence `id` (taking its draft slots first).
  // Errors: NotFound for an unknown id; FailedPrecondition while prompt
  // tokens are left (they come through AppendPrompt); OutOfRange past
  // max_pages_per_seq pages; ResourceExhausted when the pool (after
  // eviction, less other sequences' reservations) has too few pages. On
  // error, nothing changes.
  absl::StatusOr<AppendResult> Append(SequenceId id,
                                      absl::Span<const TokenId> tokens);

  // Appends to many sequences in one transaction, without lookups by id:
  // entry i appends the next `counts[i]` tokens of `tokens` to the sequence
  // at `handles[i]` (a handle may repeat; its appends run in order), then,
  // when `draft_counts` is not empty, sets its draft slots to
  // `draft_counts[i]` as SetDrafts does. An entry whose handle is the empty
  // SequenceHandle{} (index -1) is a gap: it must have count 0 (and no
  // drafts) and is skipped (BatchCommit passes its batch in slot order,
  // leaving slots as gaps). Fills `result` (cleared first). Errors:
  // InvalidArgument when the spans' lengths disagree, a count is negative, a
  // gap has a count, or another handle is not live; and the errors of Append
  // and SetDrafts. On error, nothing changes and `result` is cleared.
  // O(entries + tokens), plus a page hash per page that fills.
  absl::Status AppendMany(absl::Span<const SequenceHandle> handles,
                          absl::Span<const int32_t> counts,
                          absl::Span<const TokenId> tokens,
                          AppendManyResult& result,
                          absl::Span<const int32_t> draft_counts = {});

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
  // Tokens the sequence holds (prompt + appended; not drafts). NotFound if
  // unknown.
  absl::StatusOr<int64_t> NumTokens(SequenceId id) const;
  // Prompt tokens not yet computed (chunked prefill). NotFound if unknown.
  absl::StatusOr<int64_t> PromptTokensLeft(SequenceId id) const;
  // Draft slots held. NotFound if unknown.
  absl::StatusOr<int32_t> NumDrafts(SequenceId id) const;

  // The handle of live sequence `id`, valid while it lives (its index is
  // handed out again, with another generation, once its removal commits).
  // NotFound if unknown.
  absl::StatusOr<SequenceHandle> HandleOf(SequenceId id) const;
  // Every handle's index is below this bound.
  int32_t handle_limit() const;
  // Pages(id) by handle (BatchCommit reads a row's pages this way);
  // InvalidArgument when `handle` is not live.
  absl::StatusOr<absl::Span<const PageId>> PagesAt(SequenceHandle handle) const;
  // The allocatable pages appending `count` tokens to the sequence at
  // `handle`, then holding `drafts` draft slots, would take now: the new
  // pages and the copy of a shared partial page, less what its own
  // reservation covers (prompt chunks). InvalidArgument when `handle` is not
  // live or a count is negative.
  absl::StatusOr<int64_t> PagesForAppend(SequenceHandle handle, int64_t count,
                                         int32_t drafts = 0) const;

  // Pages an allocation may take now for a sequence without a reservation:
  // free + evictable, less the pages reserved for chunked prompts.
  int32_t NumAllocatable() const;
  // Pages reserved for the rest of chunked prompts.
  int32_t reserved_pages() const { return reserved_pages_; }

  // Drops every cached prefix; see BlockPool::ResetPrefixCache. A live
  // sequence's later pages are cached only if their chain is cached again (by
  // another sequence): a page is cached only behind its parent.
  absl::Status ResetPrefixCache();

  // Appends to `out` the KV cache events since the last call, in order,
  // and forgets them. FailedPrecondition when events are off
  // (BlockManagerOptions::enable_kv_events) or inside a step (its events
  // come when it commits; a rolled-back one has none).
  absl::Status TakeKvEvents(std::vector<KvCacheEvent>& out);
  // The same into `batch` (its events replaced), without building them:
  // the log's buffers and the batch's (emptied) are exchanged, so that
  // taking copies and allocates nothing (see KvEventPublisher::Publish).
  absl::Status TakeKvEvents(KvEventBatch& batch);
  // The cache changes (pages stored and removed, resets) recorded since the
  // last TakeKvEvents; 0 with events off. A caller that takes them less
  // often than every step bounds them with this.
  int64_t pending_kv_changes() const;

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
  // Marks the sequences it runs, and opens them to its own step.
  friend class BatchCommit;

  BlockManager(const PagedKvConfig& config, const BlockManagerOptions& options,
               std::unique_ptr<BlockPool> pool, BlockHasher hasher);
  // Slab entries reserved up front: options.max_sequences, or 4 * max_batch
  // (at most INT32_MAX).
  static int32_t MaxSequences(const PagedKvConfig& config,
                              const BlockManagerOptions& options);

  // Runs `change` in a transaction: kept when it returns OK, undone else
  // (lib/manager/block_manager_transact.h).
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
  // AppendDraftStep a speculative step past a page edge; AppendSlow the
  // rest.
  bool AppendInPlace(int32_t entry, absl::Span<const TokenId> tokens);
  // `prompt_hashes`: the whole prompt's hashes for a prompt chunk (pages
  // that fill take theirs), else empty (they are hashed).
  size_t AppendDecodeRun(absl::Span<const SequenceHandle> handles,
                         absl::Span<const int32_t> counts,
                         absl::Span<const TokenId> tokens,
                         absl::Span<const int32_t> draft_counts, size_t i,
                         size_t& next, internal::InPlaceAppend*& notes);
  // `drafts_after`: the draft slots the sequence then holds, whose end must
  // not fall short of the pages it holds (no page is released); -1: those
  // left after the tokens take theirs.
  absl::Status AppendSlow(int32_t entry, absl::Span<const TokenId> tokens,
                          AppendResult& result,
                          absl::Span<const BlockHash> prompt_hashes = {},
                          int32_t drafts_after = -1);
  absl::Status SetDraftsAt(int32_t entry, int32_t count, AppendResult& result);
  // AppendMany's speculative step past a page edge, for the sequence of
  // `handle` at index `i`: sets `taken` when it was one (else changes
  // nothing), and records a changed table in `result`.
  absl::Status AppendDraftStep(SequenceHandle handle, size_t i,
                               absl::Span<const TokenId> tokens, int32_t drafts,
                               AppendManyResult& result, bool& taken);
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
  int64_t AllocatableFor(int32_t entry) const;
  // The pages the sequence at `entry` still has reserved.
  int32_t ReservationOf(int32_t entry) const;
  // Takes `pages` just allocated for `entry` out of its reservation.
  void DrawReservation(int32_t entry, int32_t pages);
  absl::Status Remove(SequenceId id, bool preempted);
  // FailedPrecondition when sequence `id` at `entry` is run by a BatchCommit
  // and that commit is not applying its step.
  absl::Status CheckNotRunByCommit(int32_t entry, SequenceId id) const;
  // BatchCommit: whether it runs the live sequence at `handle`.
  void SetRunByCommit(SequenceHandle handle, bool on);

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
  // The hashes of an append's whole pages (HashPages).
  std::vector<BlockHash> hash_scratch_;
  // The step's transaction (allocated once), open while in_step_.
  std::unique_ptr<Transaction> step_;
  bool in_step_ = false;
  // With enable_kv_events: the pool's and the registrations' record.
  std::unique_ptr<internal::CacheEventLog> events_;
  // Reserved with it, for the first batch TakeKvEvents fills: its pages are
  // faulted in at Create, not in a step.
  std::unique_ptr<internal::CacheEventLog> spare_events_;
  // Manager-owned counters (pool-derived ones are filled in by stats()).
  BlockManagerStats stats_;
  // Pages reserved for the rest of chunked prompts, the sum of
  // ReservationOf over the live sequences.
  int32_t reserved_pages_ = 0;
  // True while a BatchCommit applies its step: the sequences commits run are
  // open to it (its Validate keeps it to its own).
  bool commit_applying_ = false;
};

}  // namespace kvblock

#endif  // KVBLOCK_BLOCK_MANAGER_H_
