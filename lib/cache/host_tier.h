// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Internal: HostTier, the prefix cache's second tier. Its pages are pinned
// host memory that keeps cached pages the device pool evicts, so that a
// later prefix hit copies a page back instead of computing it again
// (BlockPool with BlockPoolOptions::host_pages). HostTier keeps the
// bookkeeping only; the bytes are the caller's (kvblock/kernels.h's
// HostKvPool), moved by the copies BlockPool lists.
//
// Every host page is free (on a LIFO stack; initially 0, 1, 2, ... in that
// order) or cached under one key, on the LRU list (head = least recently
// stored or used, evicted first). A host page has no references: any cached
// page may be evicted, except one that the open copy batch uses (stored into
// or loaded from, its `batch` stamp): a copy of that batch still reads or
// writes it. Only Store and Use move a page to the LRU tail, and both stamp
// it, so the head is one the batch uses only when the batch uses every
// page; Store then finds no room.
// The index (PrefixIndex, its keys kept here) maps a key to its page.
//
// Transactions: every change is journaled; Rollback(mark) undoes the changes
// made after `mark`, newest first, and restores the free stack, the LRU
// order, the stamps and the keys exactly.
//
// Complexity: O(1) expected per operation; CheckInvariants and the snapshot
// helpers are O(pages). Everything is reserved at construction (the journal
// grows once past `journal_reserve` records and keeps its capacity).
//
// Thread safety: thread-compatible, owned by one BlockPool.
#ifndef KVBLOCK_LIB_CACHE_HOST_TIER_H_
#define KVBLOCK_LIB_CACHE_HOST_TIER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "cache/prefix_index.h"
#include "kvblock/block_hash.h"
#include "kvblock/types.h"

namespace kvblock::internal {

class HostTier {
 public:
  // `num_pages` in [1, kMaxNumPages]; `journal_reserve` records reserved.
  HostTier(int32_t num_pages, int32_t journal_reserve);
  ~HostTier();
  HostTier(const HostTier&) = delete;
  HostTier& operator=(const HostTier&) = delete;

  // Bytes a tier of `num_pages` pages and `journal_reserve` records
  // allocates.
  static int64_t ReservedBytes(int32_t num_pages, int32_t journal_reserve);

  int32_t num_pages() const { return num_pages_; }
  int32_t num_cached() const { return num_cached_; }
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }

  // The page cached under `key`, or kNoHostPage; `tag` is the key's
  // PrefixIndex::Tag, which a caller that keeps it passes. O(1) expected.
  HostPageId Find(const BlockHash& key) const;
  HostPageId Find(const BlockHash& key, uint32_t tag) const;
  // The key and KV cache group of cached `page`.
  const BlockHash& key(HostPageId page) const { return pages_[page].key; }
  int32_t group(HostPageId page) const { return pages_[page].group; }
  // Whether copy batch `batch` stored into or loaded from `page`.
  bool UsedBy(HostPageId page, uint32_t batch) const {
    return pages_[page].batch == batch;
  }

  // The key Store dropped to make room, if any.
  struct Evicted {
    bool any = false;
    BlockHash key;
    int32_t group = 0;
  };
  // What Store did: `page` caches the key, newly (`is_new`, stored into by
  // the batch) or from before; kNoHostPage when there was no room.
  struct Stored {
    HostPageId page = kNoHostPage;
    bool is_new = false;
    Evicted evicted;
  };
  // Caches `key`, a key of KV cache group `group` whose index tag is `tag`
  // (PrefixIndex::Tag, which the caller keeps), unless it is cached
  // already: then returns its page, changing nothing. Else in a page that
  // copy batch `batch` stores into: the top of the free stack, else the LRU
  // head, whose key is dropped; that page goes to the LRU tail, stamped
  // with `batch`. No room, changing nothing, when no page is free and the
  // head is used by `batch`. One index search either way.
  Stored Store(const BlockHash& key, uint32_t tag, int32_t group,
               uint32_t batch);
  Stored Store(const BlockHash& key, int32_t group, uint32_t batch) {
    return Store(key, PrefixIndex::Tag(key), group, batch);
  }
  // Moves cached `page` to the LRU tail, stamped as used by copy batch
  // `batch` (not 0): a load from it.
  void Use(HostPageId page, uint32_t batch);
  // Starts loading what a Find and Store of a key whose index tag is `tag`
  // (PrefixIndex::Tag) will read: its home bucket. (The LRU heads a store
  // drops, and their buckets, each store asks for ahead: PrefetchAfter.)
  void PrefetchStore(uint32_t tag) const;

  // Journal: records are kept only while a transaction is open
  // (set_journaling, from BlockPool's outermost Begin to its end); a mark to
  // roll back to, the rollback, and forgetting the records once the
  // outermost transaction commits.
  void set_journaling(bool on) { journaling_ = on; }
  size_t journal_size() const { return journal_.size(); }
  void Rollback(size_t mark);
  void ForgetJournal() { journal_.clear(); }

  // Drops every key and stamp: every page free again, in the initial order.
  // Not journaled (BlockPool refuses it inside a transaction).
  void Clear();
  // Drops every stamp (no page is used by a copy batch), when batch numbers
  // start again. Not journaled (BlockPool calls it between transactions).
  void ClearStamps();

  // Internal naming the first disagreement between the free stack, the LRU
  // list, the cached pages and the index. O(pages).
  absl::Status CheckInvariants() const;
  // Snapshot parts: the LRU list head to tail; the cached pages with their
  // keys, by page; the free stack bottom to top; the pages `batch` uses.
  std::vector<HostPageId> LruOrder() const;
  std::vector<std::pair<HostPageId, BlockHash>> Cached() const;
  std::vector<HostPageId> FreeStack() const { return free_; }
  std::vector<HostPageId> UsedBy(uint32_t batch) const;

 private:
  // One cache line a page: a store or eviction touches one.
  struct alignas(64) PageState {
    BlockHash key;  // while cached.
    uint32_t tag = 0;
    // LRU links of cached pages (kNoHostPage otherwise); entry num_pages_ is
    // the sentinel: its next is the head, its prev the tail.
    HostPageId lru_prev = kNoHostPage;
    HostPageId lru_next = kNoHostPage;
    uint32_t batch = 0;  // the last copy batch that used it (0: none).
    uint8_t cached = 0;
    uint8_t group = 0;
  };
  struct UndoRecord {
    enum class Op : uint8_t {
      kStoreFree,   // popped `page` off the free stack and cached it.
      kStoreEvict,  // evicted `page` (cached as `key` of `group`), the LRU
                    // head, and cached it anew.
      kUse,         // moved `page` from after `lru_prev` to the tail.
    };
    Op op;
    uint8_t group;
    HostPageId page;
    HostPageId lru_prev;
    uint32_t batch;  // the page's stamp before.
    BlockHash key;
  };

  // Dropping LRU head `dropped`: prefetches the line of the head three
  // stores on and the bucket of the one two stores on.
  void PrefetchAfter(HostPageId dropped) const;
  HostPageId tail() const { return pages_[num_pages_].lru_prev; }
  // The index's view of a page: its key.
  auto key_of() const {
    return [this](PageId page) -> const BlockHash& { return pages_[page].key; };
  }
  // Caches `key` in `page`, indexed at `place` (PrefixIndex::Locate).
  void Index(HostPageId page, const BlockHash& key, uint32_t tag, int32_t group,
             const PrefixIndex::Place& place);
  void Unindex(HostPageId page);

  const int32_t num_pages_;
  std::vector<PageState> pages_;  // num_pages_ + 1: the sentinel last.
  std::vector<HostPageId> free_;  // top = back().
  int32_t num_cached_ = 0;
  std::unique_ptr<PrefixIndex> index_;
  bool journaling_ = false;
  std::vector<UndoRecord> journal_;
};

}  // namespace kvblock::internal

#endif  // KVBLOCK_LIB_CACHE_HOST_TIER_H_
