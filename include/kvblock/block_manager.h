// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
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
// dropped when the next SetDrafts (or a step's draft_counts) sets the new
// ones, and pages wholly past the new end are released. A sequence with
// prompt tokens left or drafts cannot be forked.
//
// Invariants (CheckInvariants): every page's refcount equals the number of
// sequence tables that hold it; a sequence holds the pages of its tokens and
// drafts; the reserved pages are the sum of the reservations left and are
// allocatable; free, evictable and used pages partition the pool; the prefix
// index and the LRU list agree (BlockPool's own checks).
//
// Steps: BatchCommit runs a scheduler step as one transaction on the
// manager; if the step fails, the manager is restored exactly (see
// batch_commit.h). The journal is reserved up front: steps allocate no memory
// in steady state.
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
// AppendPrompt, SetDrafts, Free and Preempt refuse it with
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
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvblock/admission.h"
#include "kvblock/block_hash.h"
#include "kvblock/block_manager_options.h"
#include "kvblock/block_manager_snapshot.h"
#include "kvblock/block_pool.h"
#include "kvblock/config.h"
#include "kvblock/kv_events.h"
#include "kvblock/types.h"

namespace kvblock {

namespace internal {
class BlockManagerImpl;
class GroupCoordinator;
}  // namespace internal

// One copy-on-write the KV copy kernel must run before the next attention:
// copy page `source` to page `destination` (K and V, every layer). With a
// host tier, both stay out of the pool's hands until their copy batch is
// taken (BlockPool::TakeHostCopies), so the copies of calls made between
// two steps run as one batch. Without one, a source whose last holder
// leaves is free at once: a later call may hand it out again, even as the
// destination of another copy, so run the copy before the calls after it
// (BatchCommit's steps do: their sequences release before they append).
struct PageCopy {
  PageId source = kNoPage;
  PageId destination = kNoPage;
  friend bool operator==(const PageCopy&, const PageCopy&) = default;
};

// A copy on write in one KV cache group of a model of several: its KV is
// that group's layers'.
struct GroupPageCopy {
  int32_t group = 0;
  PageCopy copy;
  friend bool operator==(const GroupPageCopy&, const GroupPageCopy&) = default;
};

struct AppendResult {
  int32_t new_pages = 0;         // pages allocated (for tokens or drafts).
  std::optional<PageCopy> copy;  // set when a shared partial page was copied.
  int32_t released_pages = 0;    // draft pages released (SetDrafts).
  // A model of several KV cache groups: every group's copy, in group order
  // (`copy` is group 0's); empty for one group.
  std::vector<GroupPageCopy> group_copies = {};
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
  // (HashChain under this manager's algorithm and page size; with KV cache
  // groups, of their hash blocks: pages of their page sizes' greatest
  // common divisor) into `out`;
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

  // Makes `child` a copy of `parent` sharing every page. NotFound for an
  // unknown parent; InvalidArgument for a negative child id; AlreadyExists
  // for a live child. On error, nothing changes.
  absl::Status Fork(SequenceId parent, SequenceId child);

  // Releases a finished sequence's pages (tail first). NotFound if unknown.
  absl::Status Free(SequenceId id);
  // Same as Free for a sequence the scheduler evicts to recompute later;
  // counted as a preemption. NotFound if unknown.
  absl::Status Preempt(SequenceId id);

  // KV cache groups (BlockManagerOptions::kv_cache_groups). With several,
  // every call runs in every group as one transaction, a sliding-window or
  // chunked-local group releases the pages its window has left behind as
  // the sequence advances (their entries point at null_page()), and prefix
  // hits are those every group can serve (kvblock/group_cache_hit.h); the
  // calls by sequence (Pages, NumTokens, ...) answer for group 0. An
  // AdmissionPlan's pages (hit, revived, new, reserved) are summed over the
  // groups; its hit_tokens are the hit every group serves. Pages are
  // hashed in blocks of the groups' greatest common page size, as vLLM
  // hashes them (BlockHasher's hash blocks; a page is named by its last
  // block's hash), and each group files its pages under keys of its own;
  // Admit's and AppendPrompt's prompt_hashes are that chain of blocks. KV
  // cache events name each page's group and hold its group's page of
  // tokens.
  int32_t num_groups() const;
  // Whether the manager keeps kv_cache_groups other than the default one
  // (a full-attention group of the config's page size).
  bool has_kv_cache_groups() const;
  // The null page window groups point skipped entries at: held by the
  // manager for ever, never handed out, cached or read. kNoPage without a
  // window group.
  PageId null_page() const;
  // The sequence's pages in group `group`, as Pages. NotFound if unknown;
  // InvalidArgument for a group out of range.
  absl::StatusOr<absl::Span<const PageId>> GroupPages(SequenceId id,
                                                      int32_t group) const;

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

  // Pages an allocation may take now for a sequence without a reservation:
  // free + evictable, less the pages reserved for chunked prompts.
  int32_t NumAllocatable() const;
  // Pages reserved for the rest of chunked prompts.
  int32_t reserved_pages() const;

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

  // With a host tier (BlockManagerOptions::host_pages): appends to `out` the
  // copies between the device and the host tier since the last call (the
  // open copy batch; see BlockPool::TakeHostCopies for the order they run
  // in) and opens the next batch. A scheduler that runs its steps through
  // BatchCommit gets them in each StepResult instead. FailedPrecondition
  // inside a step. Without a host tier, appends nothing.
  absl::Status TakeHostCopies(std::vector<HostCopy>& out);

  // Internal when any invariant of the header comment is broken.
  absl::Status CheckInvariants() const;

  // Counters since creation; pool-derived fields (evictions, CoW copies,
  // pages in use, peak) are read from the pool.
  BlockManagerStats stats() const;
  const BlockPool& pool() const;
  const PagedKvConfig& config() const;
  const BlockManagerOptions& options() const;

  // The exact observable state: pool snapshot, every live sequence (sorted by
  // id) and the stats. Two managers with equal snapshots behave the same
  // through the calls by id.
  // O(num_pages + pages of all sequences). For tests and debugging.
  BlockManagerSnapshot Snapshot() const;

 private:
  // The handle and step protocol BatchCommit runs steps with is the
  // implementation's (lib/manager/block_manager_impl.h), reached through
  // BlockManagerImpl::Of.
  friend class internal::BlockManagerImpl;
  friend class internal::GroupCoordinator;

  BlockManager(std::unique_ptr<internal::BlockManagerImpl> impl,
               std::unique_ptr<internal::GroupCoordinator> groups);

  // A model of several KV cache groups (else null): the pool and groups
  // 1, 2, ...; impl_ is group 0. Declared first, so that it goes last.
  std::unique_ptr<internal::GroupCoordinator> groups_;
  std::unique_ptr<internal::BlockManagerImpl> impl_;
};

}  // namespace kvblock

#endif  // KVBLOCK_BLOCK_MANAGER_H_
