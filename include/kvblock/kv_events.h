// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// KV cache events: what entered and left the prefix cache, in order, so a
// fleet router can send each request to the replica that caches its prefix.
// They follow vLLM's (vllm/distributed/kv_events.py): BlockStored for pages
// newly registered (consecutive pages of one registration in one event, with
// the hash of the page before the first and the pages' tokens),
// BlockRemoved for cached pages evicted or uncached, AllBlocksCleared for a
// reset. A pool with a host tier (BlockPoolOptions::host_pages) also reports
// the pages stored into it and dropped from it, with medium kCpu, as vLLM's
// OffloadingConnector reports its CPU tier: hashes only, no chain, tokens or
// extra keys. BlockManager records them with BlockManagerOptions::
// enable_kv_events and hands them out with TakeKvEvents; a step that rolls
// back leaves none.
#ifndef KVBLOCK_KV_EVENTS_H_
#define KVBLOCK_KV_EVENTS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvblock/block_hash.h"
#include "kvblock/types.h"

namespace kvblock {

namespace internal {
class BlockManagerImpl;
class CacheEventLog;
// A place in a CacheEventLog (its sizes), what BlockPool::Savepoint keeps to
// truncate the log to.
struct CacheEventLogMark {
  size_t records = 0;
  size_t runs = 0;
  size_t hashes = 0;
};
}  // namespace internal
struct KvEventPublisherOptions;
class KvEventBatch;
std::string EncodeKvEventBatch(double ts, const KvEventBatch& batch,
                               const KvEventPublisherOptions& options);

struct KvCacheEvent {
  enum class Kind : uint8_t { kBlockStored, kBlockRemoved, kAllBlocksCleared };
  // Where the pages are: the device pool ("GPU") or its host tier ("CPU").
  enum class Medium : uint8_t { kGpu, kCpu };
  Kind kind = Kind::kBlockStored;
  Medium medium = Medium::kGpu;
  // kBlockStored and kBlockRemoved: the pages' hashes, in chain order for
  // kBlockStored.
  std::vector<BlockHash> block_hashes;
  // kBlockStored: the hash of the page before the first (none when the
  // first is a prompt's first page), its tokens (its group's page size a page),
  // and the extra keys the hashes include. Unset when the pool was called
  // directly.
  std::optional<BlockHash> parent_block_hash;
  std::vector<TokenId> token_ids;
  std::string cache_salt;
  int64_t adapter_id = 0;
  // kBlockStored and kBlockRemoved: the KV cache group of the pages (vLLM's
  // group_idx; 0 for a model of one group).
  int32_t group_idx = 0;

  friend bool operator==(const KvCacheEvent&, const KvCacheEvent&) = default;
};

// The events of one or more steps as the manager recorded them
// (BlockManager::TakeKvEvents): flat records in buffers that the batch, the
// manager and the publisher exchange rather than copy, so that taking and
// handing them over allocates nothing; built into KvCacheEvents only where
// asked (AppendTo), the publisher packing them straight from the records.
// Move-only.
class KvEventBatch {
 public:
  KvEventBatch();
  KvEventBatch(KvEventBatch&&) noexcept;
  KvEventBatch& operator=(KvEventBatch&&) noexcept;
  ~KvEventBatch();

  bool empty() const;
  // The cache's changes it records: pages stored, pages removed, resets.
  int64_t num_changes() const;
  // Appends its events to `out` (building them allocates).
  void AppendTo(std::vector<KvCacheEvent>& out) const;
  // Forgets its events, keeping the buffers.
  void Clear();

 private:
  friend class internal::BlockManagerImpl;
  friend class KvEventPublisher;
  friend std::string EncodeKvEventBatch(double ts, const KvEventBatch& batch,
                                        const KvEventPublisherOptions& options);
  std::unique_ptr<internal::CacheEventLog> log_;
};

}  // namespace kvblock

#endif  // KVBLOCK_KV_EVENTS_H_
