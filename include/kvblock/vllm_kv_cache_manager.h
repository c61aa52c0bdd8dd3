// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// VllmKvCacheManager: vLLM v1's KVCacheManager (`vllm/v1/core/
// kv_cache_manager.py` with its coordinators in `kv_cache_coordinator.py`,
// the `FullAttentionManager`, `SlidingWindowManager` and
// `ChunkedLocalAttentionManager` of `single_type_kv_cache_manager.py` and
// `block_pool.py`, followed at vllm-project/vllm commit
// 28be48fa944d8c58aeffd1ab1b56e27828c6b268), over a kvblock BlockPool, so
// that `kvblock.vllm.KVCacheManager` gives vLLM's scheduler vLLM's block ids
// call for call with each call one C++ call.
//
// The contract is vLLM's, by request id:
//   - `num_blocks` blocks shared by every KV cache group; block 0 is the null
//     block, held for ever, never handed out, never cached (vLLM's worker
//     points padding at it, and a window group's skipped blocks are it).
//   - A request holds one block list per group. FindLongestCacheHit takes no
//     reference: the hit blocks are taken when AllocateSlots admits the
//     request with them. Hits are vLLM's per kind (kvblock/group_cache_hit.h:
//     full attention left to right, sliding window right to left, chunked
//     local from the chunk start, the hybrid fixed point, EAGLE's drop).
//   - AllocateSlots first frees the blocks the request's windows skip
//     (vLLM's remove_skipped_blocks, which stands even when the call then
//     allocates nothing), then checks, and when the pool cannot hold the
//     blocks it returns `allocated = false` with nothing else changed
//     (vLLM's None); otherwise it reports the NEW blocks only. A request's
//     block lists only grow until Free (skipped blocks become null).
//   - Blocks are cached as their tokens are computed, under the request's own
//     block hashes (vLLM's `request.block_hashes`, computed every
//     `block_size` tokens: any digest of up to 32 bytes, zero-padded to a
//     BlockHash), every full block of every group, duplicates included; a
//     group of k times block_size keys a block by the k hashes it spans
//     (vLLM's BlockHashListWithBlockSize), its last one identifying them.
//     With several groups, caching stops at the last multiple of the
//     page sizes' least common multiple, and a sliding-window group caches
//     only the blocks a hit can use (vLLM's _cache_block_mask). With
//     `eviction_order` kLeastRecentlyFreed (the default) the pool is one free
//     queue in vLLM's order, so ids equal vLLM's.
//   - Free releases a request's blocks group by group, last first.
// Events: the hashes of the blocks evicted or uncached since the last
// TakeRemovedHashes, in order, when `enable_kv_cache_events`; the caller
// makes BlockStored from each call's per-group `cached_from` / `cached_to`
// (it has the tokens and the extra keys).
//
// The host tier (`host_pages`; one full-attention group), as vLLM's
// OffloadingConnector serves its CPU tier to vLLM's scheduler: the pool's
// host tier (kvblock/block_pool.h) keeps the cached blocks the pool evicts
// (write-back) or every block once cached (write-through).
// FindLongestCacheHit stays vLLM's (device blocks only);
// GetNumNewMatchedTokens is the connector's get_num_new_matched_tokens: the
// tokens of the full blocks after the device hit that the host tier can
// load; AllocateSlots with that many `num_external_computed_tokens` loads
// those blocks (cached again, under their hashes) instead of allocating
// blank ones. The copies (block id, host page, direction) are the caller's
// to run, in batches it takes with TakeHostCopies, before the forward pass
// of the step that scheduled them; TakeHostEvents hands out the host tier's
// stores and drops. Loaded blocks are not new blocks to zero
// (TakeNewBlockIds): the load writes them whole. A loaded block that its
// request frees before the batch is taken stays held by the pool until
// then (so that no one else writes it before its load lands).
//
// Where kvblock differs: with two full-attention groups of different block
// sizes and a third kind that cuts the hit, vLLM leaves the second full
// group's hit longer than the hit; here every group's hit is exactly the
// hit's (see group_cache_hit.h). Groups of the same attention (kind, block
// size, window) are looked up together, as vLLM looks up equal specs.
//
// Complexity: every call is O(blocks it touches) (GetNumCommonPrefixBlocks:
// the request's blocks; ResetPrefixCache: num_blocks), a lookup is one
// hash-map probe a block. Freed requests' block lists are kept for the next
// requests, so steady-state decoding does not allocate.
//
// Errors: InvalidArgument for arguments vLLM's code asserts on (zero new
// tokens, a hit block that is not cached, too few block hashes to cache the
// computed blocks); a failing call changes nothing.
//
// Thread safety: thread-compatible; one scheduler thread owns a manager.
#ifndef KVBLOCK_VLLM_KV_CACHE_MANAGER_H_
#define KVBLOCK_VLLM_KV_CACHE_MANAGER_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kvblock/block_hash.h"
#include "kvblock/block_pool.h"
#include "kvblock/group_cache_hit.h"
#include "kvblock/kv_cache_groups.h"
#include "kvblock/types.h"

namespace kvblock {

namespace internal {
class CacheEventLog;  // lib/cache/cache_event_log.h
}  // namespace internal

struct VllmKvCacheManagerOptions {
  // vLLM's kv_cache_config.num_blocks (the null block included), positive.
  int32_t num_blocks = 0;
  // Tokens a request block hash covers (vLLM's hash_block_size), positive;
  // with no kv_cache_groups, the one full-attention group's block size.
  int32_t block_size = 0;
  // vLLM's kv_cache_config.kv_cache_groups in order, each group's attention
  // and block size (`page_size`: with caching on, a multiple of block_size;
  // `eagle`: vLLM's is_eagle_group). Empty: one full-attention group of
  // block_size.
  std::vector<KvCacheGroupSpec> kv_cache_groups = {};
  // Slots beyond it are not allocated (vLLM caps at max_model_len).
  int64_t max_model_len = 0;
  // The scheduler's token budget a step (vLLM's max_num_batched_tokens);
  // 0: max_model_len, as vLLM. It bounds what full_sequence_must_fit counts
  // for a window group (vLLM's max_admission_blocks_per_request).
  int64_t max_num_batched_tokens = 0;
  bool enable_caching = true;
  // EAGLE drafting: a prefix hit leaves its last block to be recomputed, in
  // the groups marked `eagle`, or in all of them when none is (vLLM's).
  bool use_eagle = false;
  bool enable_kv_cache_events = false;
  // vLLM's order by default; kNeverCachedFirst is kvblock's own.
  EvictionOrder eviction_order = EvictionOrder::kLeastRecentlyFreed;
  // Pages of the host tier (0: none), in [0, kMaxNumPages]; with caching on
  // and one full-attention group only, as BlockManager's host tier (a
  // hybrid model's hit across groups would need the connector's fixed
  // point over the host tier too).
  int32_t host_pages = 0;
  HostWritePolicy host_write_policy = HostWritePolicy::kWriteBack;
};

// One allocate_slots call, in vLLM's names and meanings.
struct VllmSlotRequest {
  absl::string_view request_id = {};
  // request.block_hashes: the hash of each full block_size tokens.
  absl::Span<const BlockHash> block_hashes = {};
  int64_t num_tokens = 0;           // request.num_tokens
  int64_t num_computed_tokens = 0;  // request.num_computed_tokens
  int64_t num_new_tokens = 0;
  int64_t num_new_computed_tokens = 0;
  // The blocks get_computed_blocks found (vLLM's new_computed_blocks), one
  // list a group (the null block where a window skips); empty: none.
  absl::Span<const absl::Span<const PageId>> new_computed_blocks = {};
  int64_t num_lookahead_tokens = 0;
  int64_t num_external_computed_tokens = 0;
  bool delay_cache_blocks = false;
  bool full_sequence_must_fit = false;
};

// What a call did to one group's block list of the request.
struct VllmGroupSlots {
  // Blocks [first_new_block, end) are new.
  int32_t first_new_block = 0;
  // Blocks [cached_from, cached_to) were cached by the call (BlockStored;
  // null blocks and the ones a window group does not cache left out, see
  // CachesBlock).
  int32_t cached_from = 0;
  int32_t cached_to = 0;
  // The group's blocks after the call (the view lasts until the next
  // change).
  absl::Span<const PageId> blocks = {};
};

struct VllmSlotResult {
  // False: the pool cannot hold the blocks, nothing changed (vLLM's None).
  bool allocated = false;
  // One a group; the view lasts until the next call.
  absl::Span<const VllmGroupSlots> groups = {};
};

class VllmKvCacheManager {
 public:
  // The null block's id.
  static constexpr PageId kNullBlock = 0;

  // InvalidArgument when an option is out of range (the groups as
  // ValidateKvCacheGroups says, and with caching on as
  // ValidateGroupCacheHits says, where vLLM asserts at its first lookup; a
  // page size that is not a multiple of block_size with caching on; host
  // pages out of range or without caching or with other than one
  // full-attention group).
  static absl::StatusOr<std::unique_ptr<VllmKvCacheManager>> Create(
      const VllmKvCacheManagerOptions& options);

  VllmKvCacheManager(const VllmKvCacheManager&) = delete;
  VllmKvCacheManager& operator=(const VllmKvCacheManager&) = delete;
  ~VllmKvCacheManager();

  // get_computed_blocks: the longest prefix of `block_hashes` within
  // `max_length` tokens (vLLM passes num_tokens - 1) every group can serve
  // from the cache, and each group's blocks for it; empty with caching off.
  // Takes no reference. The result lasts until the next call.
  const GroupCacheHit& FindLongestCacheHit(
      absl::Span<const BlockHash> block_hashes, int64_t max_length);

  // Whether `hit`, what FindLongestCacheHit returned for the same arguments,
  // is still what it would return, so that a caller may keep it (a waiting
  // request's lookup is retried every step). One full-attention group:
  // O(hit) page reads and at most two lookups; false when unsure (an empty
  // hit with EAGLE, a window group, several groups).
  bool IsHitUnchanged(absl::Span<const BlockHash> block_hashes,
                      int64_t max_length, const GroupCacheHit& hit) const;

  // allocate_slots (see VllmSlotResult); InvalidArgument as the header says.
  // With a host tier, the blocks of `num_external_computed_tokens` are
  // loaded from it (each block past the hits that the computed tokens
  // reach): InvalidArgument, before any change, when the host tier lacks
  // one or it is cached on the device. The run's host pages are pinned to
  // the step's copy batch before the first load, so that no store a load
  // makes (its new block evicting a cached one) drops a later one.
  absl::StatusOr<VllmSlotResult> AllocateSlots(const VllmSlotRequest& request);

  // The OffloadingConnector's get_num_new_matched_tokens, for a request not
  // yet allocated whose first `num_computed_tokens` tokens are its device
  // hit (FindLongestCacheHit's): the tokens after them that
  // AllocateSlots(num_external_computed_tokens = that) loads from the host
  // tier. They end at a block boundary: the consecutive full blocks from
  // block num_computed_tokens / block_size on that the host tier holds (and
  // the device does not); 0 when that is less than a block. When they reach the
  // prompt's end (a prompt of whole blocks) the count is one less: the
  // connector loads the last block and vLLM recomputes the last token, and so
  // does AllocateSlots with this count, in the same step (vLLM's connector
  // loads asynchronously and steps back afterwards). 0 without a host tier.
  // Changes nothing. O(blocks counted).
  int64_t GetNumNewMatchedTokens(absl::Span<const BlockHash> block_hashes,
                                 int64_t num_tokens,
                                 int64_t num_computed_tokens);

  // cache_blocks: caches the request's full blocks within `num_tokens`
  // tokens under `block_hashes`; returns each group's [cached_from,
  // cached_to) as AllocateSlots does (the view lasts until the next call).
  // As vLLM's, it counts blocks the request does not hold (yet) as cached,
  // so they are never cached later, and enters an unknown request.
  // InvalidArgument when the hashes are too few.
  absl::StatusOr<absl::Span<const VllmGroupSlots>> CacheBlocks(
      absl::string_view request_id, absl::Span<const BlockHash> block_hashes,
      int64_t num_tokens);

  // remove_skipped_blocks: frees the blocks of the request's window groups
  // that no token after `total_computed_tokens` reads, newest first, and
  // puts the null block in their place. Nothing for an unknown request.
  void RemoveSkippedBlocks(absl::string_view request_id,
                           int64_t total_computed_tokens);

  // free: releases the request's blocks, group by group, last first. An
  // unknown request (aborted before its first allocation) frees nothing.
  void Free(absl::string_view request_id);

  // evict_blocks: drops each block's hash (used blocks stay used).
  // InvalidArgument, before any change, when an id is not in
  // [0, num_blocks).
  absl::Status EvictBlocks(absl::Span<const PageId> block_ids);

  // reset_prefix_cache: false, nothing changed, while a request holds a
  // block; else forgets every hash and returns true.
  bool ResetPrefixCache();

  // The request's blocks in `group` (empty for an unknown request). The
  // view lasts until the next change.
  absl::Span<const PageId> Blocks(absl::string_view request_id,
                                  int32_t group = 0) const;

  // get_num_common_prefix_blocks, a count a group: a full-attention group's
  // leading blocks of the request that every request holding blocks holds,
  // 0 for a window group (vLLM's). As vLLM's, an unknown request is entered
  // (with no blocks) until Free.
  std::vector<int32_t> GetNumCommonPrefixBlocks(absl::string_view request_id);

  // take_new_block_ids: the blocks handed out since the last call, a list a
  // group.
  std::vector<std::vector<PageId>> TakeNewBlockIds();

  // A block evicted or uncached: its KV cache group and its hashes (vLLM's
  // BlockHashListWithBlockSize entry: one for a group of block_size, k for
  // one of k times it).
  struct RemovedBlock {
    int32_t group = 0;
    std::vector<BlockHash> hashes;
  };
  // The blocks evicted or uncached since the last call, in order; always
  // empty without events.
  std::vector<RemovedBlock> TakeRemovedHashes();

  // A change of the host tier: a block stored into it, or dropped from it
  // to make room, named by its request hash (one full-attention group).
  struct HostEvent {
    bool removed = false;
    BlockHash hash;
    friend bool operator==(const HostEvent&, const HostEvent&) = default;
  };
  // The host tier's changes since the last call, in order; always empty
  // without events or a host tier.
  std::vector<HostEvent> TakeHostEvents();

  // Appends the copies listed since the last call (the open copy batch:
  // loads for AllocateSlots, stores of evicted blocks; `device_page` is the
  // block id) to `out` and opens the next batch (BlockPool::TakeHostCopies:
  // run every store, then every load, after the last step's forward pass
  // and before the next). Appends nothing without a host tier.
  absl::Status TakeHostCopies(std::vector<HostCopy>& out);

  // Blocks allocatable now (vLLM's get_num_free_blocks: the null block is not
  // free).
  int32_t NumFreeBlocks() const { return pool_->NumFree(); }
  // vLLM's get_usage: used blocks of the num_blocks - 1 real ones.
  double Usage() const;
  // References on a block (the null block: 0, as vLLM's); the pool's own
  // on a loaded block parked until its copy batch is taken is left out.
  int32_t RefCount(PageId block) const {
    if (block == kNullBlock) return 0;
    return pool_->RefCount(block) - (Parked(block) ? 1 : 0);
  }
  // The last request hash a cached block is keyed by, if it is cached.
  std::optional<BlockHash> CachedHash(PageId block) const {
    return pool_->EventHash(block);
  }
  // The KV cache group a block is cached in (-1 when it is not cached).
  int32_t CachedGroup(PageId block) const { return pool_->CachedGroup(block); }
  // The hashes before CachedHash that a cached block of a group of k times
  // block_size spans (k - 1 of them; none for a group of block_size).
  absl::Span<const BlockHash> CachedHashPrefix(PageId block) const;
  // Whether a full block at `index` of `group` is cached as its tokens are
  // computed (a sliding-window group of a hybrid model caches only the ones
  // a hit can use). REQUIRES: group in [0, num_groups()).
  bool CachesBlock(int32_t group, int64_t index) const {
    return CachesFullPage(groups_[group], index, alignment_tokens_);
  }
  // The host tier's pages (0 without one) and those holding a block.
  int32_t host_pages() const { return pool_->host_pages(); }
  int32_t NumHostCached() const { return pool_->NumHostCached(); }
  // Requests holding blocks (vLLM's len(req_to_blocks)).
  int32_t num_requests() const { return static_cast<int32_t>(by_id_.size()); }
  int32_t num_groups() const { return static_cast<int32_t>(groups_.size()); }
  // The groups, as the options give them or the one default group.
  absl::Span<const KvCacheGroupSpec> groups() const { return groups_; }
  const VllmKvCacheManagerOptions& options() const { return options_; }
  const BlockPool& pool() const { return *pool_; }

  // The pool's invariants, and every block a request holds is used by it
  // (the pool's parked blocks besides).
  absl::Status CheckInvariants() const;

 private:
  struct GroupBlocks {
    std::vector<PageId> blocks;
    // vLLM's num_cached_block entry: -1 while the request has none.
    int32_t num_cached = -1;
  };
  struct Request {
    // Inline for up to two groups: no pointer to chase to a request's
    // blocks (most models have one or two groups).
    absl::InlinedVector<GroupBlocks, 2> groups;
  };

  VllmKvCacheManager(const VllmKvCacheManagerOptions& options,
                     std::vector<KvCacheGroupSpec> groups,
                     std::optional<GroupCacheHitFinder> finder,
                     std::unique_ptr<BlockPool> pool);
  // Whether the pool holds `block` until the copy batch is taken.
  bool Parked(PageId block) const {
    const absl::Span<const PageId> parked = pool_->parked_pages();
    return !parked.empty() &&
           std::find(parked.begin(), parked.end(), block) != parked.end();
  }
  // Moves the event log's records into removed_ and host_events_.
  void DrainEvents();
  // Loads blocks [first, first + count) of `block_hashes` (their keys)
  // from the host tier, in order, appending each to `blocks`; stops at the
  // first load that fails and returns its error.
  absl::Status LoadFromHost(std::vector<PageId>& blocks,
                            absl::Span<const BlockHash> block_hashes,
                            int64_t first, int64_t count);
  int64_t CeilBlocks(int32_t group, int64_t tokens) const {
    const int64_t size = groups_[group].page_size;
    return tokens / size + (tokens % size != 0 ? 1 : 0);
  }
  // Request hashes a block of `group` spans.
  int64_t Scale(int32_t group) const { return scales_[group]; }
  // The pool key of block `index` of `group` (its hashes present).
  BlockHash Key(int32_t group, absl::Span<const BlockHash> hashes,
                int64_t index) const;
  // An entry for a request not known yet (with spare block lists).
  Request& NewRequest(absl::string_view request_id);
  // get_num_blocks_to_allocate, summed over the groups, for `num_tokens`
  // slots; `capped`: vLLM's apply_admission_cap.
  int64_t BlocksToAllocate(const Request* request, int64_t num_tokens,
                           const VllmSlotRequest& slots, int64_t total_computed,
                           bool capped) const;
  // Frees the skipped blocks of `request`'s window groups.
  void RemoveSkipped(Request& request, int64_t total_computed_tokens);
  // The blocks RemoveSkipped would free (the ones no other request holds).
  int64_t SkippedFrees(const Request& request,
                       int64_t total_computed_tokens) const;
  // Each group's blocks [num_cached, full) that cache_blocks caches for
  // `num_tokens` tokens, into plan_ranges_, from plans_ (`request_id` names
  // the request in the error); InvalidArgument when the hashes do not cover
  // the blocks the group will hold.
  absl::Status BlocksToCache(absl::string_view request_id,
                             absl::Span<const BlockHash> block_hashes,
                             int64_t num_tokens);
  // Caches each group's range of plan_ranges_, after BlocksToCache, and
  // writes the ranges into slots_.
  void Cache(Request& request, absl::Span<const BlockHash> block_hashes);
  absl::Status Allocate(int32_t group, GroupBlocks& blocks, int64_t count);

  const VllmKvCacheManagerOptions options_;
  const std::vector<KvCacheGroupSpec> groups_;
  const int64_t alignment_tokens_;  // AlignmentTokens(groups_).
  // With caching (options_.enable_caching).
  const std::optional<GroupCacheHitFinder> finder_;
  // Per group: the key salt (cache/group_key.h), Scale, whether
  // CachesBlock leaves some of its blocks out.
  std::vector<BlockHash> salts_;
  std::vector<int64_t> scales_;
  std::vector<bool> masked_;
  // Whether a group skips blocks (a window or a chunk).
  bool windowed_ = false;
  int64_t max_scale_ = 1;
  // The admission cap of each group (vLLM's max_admission_blocks_per_
  // request; INT64_MAX for full attention).
  std::vector<int64_t> admission_caps_;
  std::unique_ptr<BlockPool> pool_;
  std::unique_ptr<internal::CacheEventLog> events_;
  absl::flat_hash_map<std::string, Request> by_id_;
  // Freed requests' block lists, their capacity kept.
  std::vector<Request> spare_requests_;
  GroupCacheHit hit_;  // FindLongestCacheHit's result.
  std::vector<std::vector<PageId>> new_blocks_;  // since TakeNewBlockIds.
  // Events drained from the log, until taken.
  std::vector<RemovedBlock> removed_;
  std::vector<HostEvent> host_events_;
  // For groups of several hashes a block: block * (max_scale_ - 1) on, the
  // hashes before its key of the block's cached hash list.
  std::vector<BlockHash> hash_prefixes_;
  // With events and such groups: the hashes before the key of each key
  // cached (and how many blocks are cached under it), for removal events.
  struct KeyPrefix {
    std::vector<BlockHash> hashes;
    int32_t blocks = 0;
  };
  absl::flat_hash_map<BlockHash, KeyPrefix> key_prefixes_;
  // A call's plan for one group of the request.
  struct GroupPlan {
    int64_t skipped = 0;          // hits the window skips: null blocks.
    int64_t after_hits = 0;       // blocks held once the hits are in.
    int64_t external_blocks = 0;  // allocated for external tokens.
    int64_t held_after = 0;       // blocks held after the call.
    int32_t num_cached = 0;       // blocks cached (or counted so) before.
    // The request's entry before the call, for the undo.
    size_t held_before = 0;
    int32_t num_cached_before = -1;
  };
  // Reused by the calls, a group each.
  std::vector<GroupPlan> plans_;
  std::vector<std::pair<int32_t, int32_t>> plan_ranges_;
  std::vector<VllmGroupSlots> slots_;
  std::vector<size_t> new_blocks_before_;
  std::vector<PageId> acquired_;
  std::vector<BlockHash> host_keys_;  // a run of loads' keys (LoadFromHost).
};

}  // namespace kvblock

#endif  // KVBLOCK_VLLM_KV_CACHE_MANAGER_H_
