// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// BlockManagerStats and BlockManagerSnapshot: a BlockManager's counters and
// its exact observable state (BlockManager::stats, Snapshot).
#ifndef KVBLOCK_BLOCK_MANAGER_SNAPSHOT_H_
#define KVBLOCK_BLOCK_MANAGER_SNAPSHOT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kvblock/block_hash.h"
#include "kvblock/block_pool.h"
#include "kvblock/types.h"

namespace kvblock {

struct BlockManagerStats {
  int64_t admitted = 0;  // Admit calls that succeeded.
  int64_t forks = 0;
  int64_t freed = 0;              // Free calls (finished sequences).
  int64_t preemptions = 0;        // Preempt calls.
  int64_t prompt_tokens = 0;      // tokens of admitted prompts (whole).
  int64_t prefix_hit_tokens = 0;  // of those, served from the cache.
  int64_t host_hit_tokens = 0;    // of those, loaded from the host tier.
  int64_t prompt_chunks = 0;      // AppendPrompt calls.
  int64_t appended_tokens = 0;    // tokens added by Append (not prompts).
  int64_t draft_slots = 0;        // draft slots set by SetDrafts.
  int64_t cow_copies = 0;
  int64_t evictions = 0;  // cached pages reused for other content.
  // The host tier's: cached pages stored into it and loaded back from it,
  // and host pages whose key it dropped to make room (BlockPoolStats).
  int64_t host_stores = 0;
  int64_t host_loads = 0;
  int64_t host_evictions = 0;
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
    // A model of several KV cache groups: the pages of groups 1, 2, ...
    std::vector<std::vector<PageId>> group_pages = {};
    friend bool operator==(const SequenceState&,
                           const SequenceState&) = default;
  };
  BlockPoolSnapshot pool;
  std::vector<SequenceState> sequences;
  BlockManagerStats stats;
  friend bool operator==(const BlockManagerSnapshot&,
                         const BlockManagerSnapshot&) = default;
};

}  // namespace kvblock

#endif  // KVBLOCK_BLOCK_MANAGER_SNAPSHOT_H_
