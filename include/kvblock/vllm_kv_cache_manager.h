// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// VllmKvCacheManager: vLLM v1's KVCacheManager for one full-attention KV cache
// group (`vllm/v1/core/kv_cache_manager.py` with `FullAttentionManager` and
// `BlockPool`, followed at vllm-project/vllm commit
// 28be48fa944d8c58aeffd1ab1b56e27828c6b268), over a kvblock BlockPool, so that
// `kvblock.vllm.KVCacheManager` gives vLLM's scheduler vLLM's block ids call
// for call with each call one C++ call.
//
// The contract is vLLM's, by request id:
//   - `num_blocks` blocks; block 0 is the null block, held for ever, never
//     handed out, never cached (vLLM's worker points padding at it).
//   - FindLongestCacheHit takes no reference: the hit blocks are taken when
//     AllocateSlots admits the request with them.
//   - AllocateSlots checks first, and when the pool cannot hold the blocks it
//     returns `allocated = false` with nothing changed (vLLM's None);
//     otherwise it returns the NEW blocks only. A request's block list only
//     grows until Free.
//   - Blocks are cached as their tokens are computed, under the request's own
//     block hashes (vLLM's `request.block_hashes`: any digest of up to 32
//     bytes, zero-padded to a BlockHash), every full block, duplicates
//     included; with `eviction_order` kLeastRecentlyFreed (the default) the
//     pool is one free queue in vLLM's order, so ids equal vLLM's.
//   - Free releases a request's blocks last first (its tail is evicted first).
// Events: the hashes of the blocks evicted or uncached since the last
// TakeRemovedHashes, in order, when `enable_kv_cache_events`; the caller
// makes BlockStored from each call's `cached_from` / `cached_to` (it has the
// tokens and the extra keys).
//
// Complexity: every call is O(blocks it touches) (GetNumCommonPrefixBlocks:
// the request's blocks; ResetPrefixCache: num_blocks), and a request's
// lookup is one hash-map probe. Freed requests' block lists are kept for the
// next requests, so steady-state decoding does not allocate.
//
// Errors: InvalidArgument for arguments vLLM's code asserts on (zero new
// tokens, a hit block that is not cached, too few block hashes to cache the
// computed blocks); a failing call changes nothing.
//
// Thread safety: thread-compatible; one scheduler thread owns a manager.
#ifndef KVBLOCK_VLLM_KV_CACHE_MANAGER_H_
#define KVBLOCK_VLLM_KV_CACHE_MANAGER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kvblock/block_hash.h"
#include "kvblock/block_pool.h"
#include "kvblock/types.h"

namespace kvblock {

namespace internal {
class CacheEventLog;  // lib/cache/cache_event_log.h
}  // namespace internal

struct VllmKvCacheManagerOptions {
  // vLLM's kv_cache_config.num_blocks (the null block included), positive.
  int32_t num_blocks = 0;
  // Tokens per block (kv_cache_spec.block_size), positive.
  int32_t block_size = 0;
  // Slots beyond it are not allocated (vLLM caps at max_model_len).
  int64_t max_model_len = 0;
  bool enable_caching = true;
  // EAGLE drafting: a prefix hit leaves its last block to be recomputed.
  bool use_eagle = false;
  bool enable_kv_cache_events = false;
  // vLLM's order by default; kNeverCachedFirst is kvblock's own.
  EvictionOrder eviction_order = EvictionOrder::kLeastRecentlyFreed;
};

// One allocate_slots call, in vLLM's names and meanings.
struct VllmSlotRequest {
  absl::string_view request_id = {};
  // request.block_hashes: the hash of each full block of its tokens.
  absl::Span<const BlockHash> block_hashes = {};
  int64_t num_tokens = 0;           // request.num_tokens
  int64_t num_computed_tokens = 0;  // request.num_computed_tokens
  int64_t num_new_tokens = 0;
  int64_t num_new_computed_tokens = 0;
  // The blocks get_computed_blocks found (vLLM's new_computed_blocks).
  absl::Span<const PageId> new_computed_blocks = {};
  int64_t num_lookahead_tokens = 0;
  int64_t num_external_computed_tokens = 0;
  bool delay_cache_blocks = false;
  bool full_sequence_must_fit = false;
};

struct VllmSlotResult {
  // False: the pool cannot hold the blocks, nothing changed (vLLM's None).
  bool allocated = false;
  // The request's blocks [first_new_block, end) are new.
  int32_t first_new_block = 0;
  // The request's blocks [cached_from, cached_to) were cached by the call
  // (BlockStored).
  int32_t cached_from = 0;
  int32_t cached_to = 0;
};

class VllmKvCacheManager {
 public:
  // The null block's id.
  static constexpr PageId kNullBlock = 0;

  // InvalidArgument when an option is out of range.
  static absl::StatusOr<std::unique_ptr<VllmKvCacheManager>> Create(
      const VllmKvCacheManagerOptions& options);

  VllmKvCacheManager(const VllmKvCacheManager&) = delete;
  VllmKvCacheManager& operator=(const VllmKvCacheManager&) = delete;
  ~VllmKvCacheManager();

  // get_computed_blocks: the cached blocks of the longest prefix of
  // `block_hashes` within `max_length` tokens (vLLM passes num_tokens - 1),
  // less the last one with use_eagle; empty with caching off. Takes no
  // reference. The view lasts until the next call.
  absl::Span<const PageId> FindLongestCacheHit(
      absl::Span<const BlockHash> block_hashes, int64_t max_length);

  // Whether `hit`, what FindLongestCacheHit returned for the same arguments,
  // is still what it would return, so that a caller may keep it (a waiting
  // request's lookup is retried every step). O(hit) page reads and at most
  // two lookups; false when unsure (an empty hit with use_eagle).
  bool IsHitUnchanged(absl::Span<const BlockHash> block_hashes,
                      int64_t max_length, absl::Span<const PageId> hit) const;

  // allocate_slots (see VllmSlotResult); InvalidArgument as the header says.
  absl::StatusOr<VllmSlotResult> AllocateSlots(const VllmSlotRequest& request);

  // cache_blocks: caches the request's full blocks within `num_tokens`
  // tokens under `block_hashes`; returns [cached_from, cached_to) as
  // AllocateSlots does. As vLLM's, it counts blocks the request does not
  // hold (yet) as cached, so they are never cached later, and enters an
  // unknown request. InvalidArgument when the hashes are too few.
  absl::StatusOr<std::pair<int32_t, int32_t>> CacheBlocks(
      absl::string_view request_id, absl::Span<const BlockHash> block_hashes,
      int64_t num_tokens);

  // free: releases the request's blocks, last first. An unknown request
  // (aborted before its first allocation) frees nothing.
  void Free(absl::string_view request_id);

  // evict_blocks: drops each block's hash (used blocks stay used).
  // InvalidArgument, before any change, when an id is not in
  // [0, num_blocks).
  absl::Status EvictBlocks(absl::Span<const PageId> block_ids);

  // reset_prefix_cache: false, nothing changed, while a request holds a
  // block; else forgets every hash and returns true.
  bool ResetPrefixCache();

  // The request's blocks (empty for an unknown request). The view lasts
  // until the next change.
  absl::Span<const PageId> Blocks(absl::string_view request_id) const;

  // get_num_common_prefix_blocks: leading blocks of the request that every
  // request holding blocks holds. As vLLM's, an unknown request is entered
  // (with no blocks) until Free.
  int32_t GetNumCommonPrefixBlocks(absl::string_view request_id);

  // take_new_block_ids: the blocks handed out since the last call.
  std::vector<PageId> TakeNewBlockIds();

  // The hashes (zero-padded, as given) of the blocks evicted or uncached
  // since the last call, in order; always empty without events.
  std::vector<BlockHash> TakeRemovedHashes();

  // Blocks allocatable now (vLLM's get_num_free_blocks: the null block is not
  // free).
  int32_t NumFreeBlocks() const { return pool_->NumFree(); }
  // vLLM's get_usage: used blocks of the num_blocks - 1 real ones.
  double Usage() const;
  // References on a block (the null block: 0, as vLLM's).
  int32_t RefCount(PageId block) const {
    return block == kNullBlock ? 0 : pool_->RefCount(block);
  }
  // The hash a block is cached under, if it is.
  std::optional<BlockHash> CachedHash(PageId block) const {
    return pool_->CachedHash(block);
  }
  // Requests holding blocks (vLLM's len(req_to_blocks)).
  int32_t num_requests() const { return static_cast<int32_t>(by_id_.size()); }
  const VllmKvCacheManagerOptions& options() const { return options_; }
  const BlockPool& pool() const { return *pool_; }

  // The pool's invariants, and every block a request holds is used by it.
  absl::Status CheckInvariants() const;

 private:
  struct Request {
    std::vector<PageId> blocks;
    // vLLM's num_cached_block entry: -1 while the request has none.
    int32_t num_cached_blocks = -1;
  };

  VllmKvCacheManager(const VllmKvCacheManagerOptions& options,
                     std::unique_ptr<BlockPool> pool);
  int64_t CeilBlocks(int64_t tokens) const {
    return tokens / options_.block_size +
           (tokens % options_.block_size != 0 ? 1 : 0);
  }
  // An entry for a request not known yet (with a spare block list).
  Request& NewRequest(absl::string_view request_id);
  // get_num_blocks_to_allocate for `num_tokens` slots.
  int64_t BlocksToAllocate(const Request* request, int64_t num_tokens,
                           absl::Span<const PageId> hits) const;
  // Blocks [num_cached, full) that cache_blocks caches for `num_tokens`
  // tokens (`request_id` names the request in the error); InvalidArgument
  // when the hashes do not cover them.
  absl::StatusOr<std::pair<int32_t, int32_t>> BlocksToCache(
      absl::string_view request_id, int32_t num_cached,
      absl::Span<const BlockHash> block_hashes, int64_t num_tokens) const;
  // Caches blocks [from, to) of `request`, after BlocksToCache.
  void Cache(Request& request, int32_t from, int32_t to,
             absl::Span<const BlockHash> block_hashes);
  absl::Status Allocate(Request& request, int64_t count);

  const VllmKvCacheManagerOptions options_;
  std::unique_ptr<BlockPool> pool_;
  std::unique_ptr<internal::CacheEventLog> events_;
  absl::flat_hash_map<std::string, Request> by_id_;
  // Freed requests' block lists, their capacity kept.
  std::vector<std::vector<PageId>> spare_lists_;
  std::vector<PageId> hit_;         // FindLongestCacheHit's result.
  std::vector<PageId> new_blocks_;  // since TakeNewBlockIds.
};

}  // namespace kvblock

#endif  // KVBLOCK_VLLM_KV_CACHE_MANAGER_H_
