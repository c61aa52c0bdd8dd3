// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// BlockManagerOptions: how a BlockManager (kvblock/block_manager.h) shares
// pages, hashes them, admits and records cache events.
#ifndef KVBLOCK_BLOCK_MANAGER_OPTIONS_H_
#define KVBLOCK_BLOCK_MANAGER_OPTIONS_H_

#include <cstdint>
#include <vector>

#include "kvblock/block_hash.h"
#include "kvblock/block_pool.h"
#include "kvblock/kv_cache_groups.h"

namespace kvblock {

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
  // The model's KV cache groups (kvblock/kv_cache_groups.h), each with its
  // attention kind and page size, all drawing on the config's num_pages; a
  // sequence's tables hold max_pages_per_seq * page_size tokens in every
  // group. Empty: one full-attention group of the config's page size.
  std::vector<KvCacheGroupSpec> kv_cache_groups = {};
  // The host tier (kvblock/block_pool.h): pages of pinned host memory that
  // keep the cached pages the pool evicts, so that a prefix hit on them is a
  // copy back rather than a recomputation (0: none). Needs prefix caching;
  // one KV cache group only, for now. With a host tier, Admit takes hits
  // from it after the device's, and the copies are taken every step
  // (BatchCommit's StepResult::host_copies, or TakeHostCopies).
  int32_t host_pages = 0;
  HostWritePolicy host_write_policy = HostWritePolicy::kWriteBack;
};

// The most BlockManagerOptions::reserved_kv_changes may ask for.
inline constexpr int32_t kMaxReservedKvChanges = 1 << 22;

}  // namespace kvblock

#endif  // KVBLOCK_BLOCK_MANAGER_OPTIONS_H_
