// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// BlockPool: the physical pages of the paged KV cache, their reference counts,
// copy-on-write decisions, and the prefix cache (hash -> page) with LRU
// eviction of cached pages nobody uses.
//
// Every page is in exactly one of three states:
//   - used:      refcount > 0 (it may also be cached);
//   - free:      refcount 0, not cached, on the LIFO free stack;
//   - evictable: refcount 0, cached, on the LRU list (head = least recently
//                released, evicted first; tail = most recently released).
// The prefix index (lib/cache/prefix_index.h: buckets of one cache line, the
// keys stay with the pages) maps a BlockHash to the cached pages, one hash per
// page. `Allocate` pops the free stack first and evicts the LRU head
// (dropping its hash) only when the stack is empty. Initially the stack hands
// out pages 0, 1, 2, ... in that order.
//
// Two options give vLLM v1's BlockPool behaviour instead
// (`vllm/v1/core/block_pool.py`):
//   - EvictionOrder::kLeastRecentlyFreed: one queue. Every page with
//     refcount 0, cached or not, is on the LRU list (the free stack stays
//     empty), initially pages 0, 1, 2, ... in order; a release appends at the
//     tail and `Allocate` takes the head, evicting it if it is cached.
//     kvblock's default (never-cached pages first) keeps more hits under
//     pressure.
//   - `index_duplicates`: a page whose hash is cached on another page is
//     cached too, behind it (vLLM caches every full block), and reports its
//     own store and removal events. A lookup finds the page of the hash
//     cached longest; when it leaves, the next one answers. Without it, one
//     copy per hash is kept: a second page RegisterCached is given is linked
//     behind the first, silently, only while it is used, so the hash stays
//     cached (and no BlockRemoved is sent) as long as any copy is held; a
//     router's chain through it never breaks.
//
// Releasing a sequence's pages last page first (SequenceBlockTable::ReleaseAll
// does) puts its continuation nearer the LRU head than its prefix, so a shared
// prefix outlives the continuations that extend it.
//
// The host tier (BlockPoolOptions::host_pages; lib/cache/host_tier.h): pages
// of pinned host memory that keep cached pages the pool evicts, with an LRU
// list of their own. When Allocate evicts a cached page whose key the host
// tier lacks, the page is stored there (write-back; with
// HostWritePolicy::kWriteThrough every newly cached page is stored after the
// step that computes it, and an eviction moves nothing); a prefix hit that
// continues in the host tier loads a page back (LoadFromHost). The pool
// moves no bytes: it lists each move as a HostCopy, in copy batches that the
// caller takes (TakeHostCopies; BatchCommit's StepResult::host_copies) and
// runs:
//   - after the forward pass of the batch before (a store reads KV that pass
//     computed) and before its own step's forward pass and copy-on-write
//     copies;
//   - every kDeviceToHost copy first, then every kHostToDevice copy; within
//     a direction in any order (one batched call): no two copies of a batch
//     write the same page, and a device page a batch loads into, or that a
//     copy on write made in the batch reads or writes, is not handed out
//     again before the batch is taken (released, it stays parked with a
//     reference of the pool's until then), so that no load of the batch
//     writes a page one of its copy-on-write copies reads or writes. A host
//     page a batch loads from may be one that a store of the same batch writes
//     (a key evicted and hit again within the batch): the load reads what the
//     store wrote only because the stores run first.
// A page cached in the open batch may not hold all its KV yet (the batch's
// forward pass computes it): evicted in that batch, it is not stored. A key
// the host tier holds already is not stored again, nor moved in the host
// LRU (as vLLM's offloading manager leaves stored blocks out of
// prepare_store). Host pages that the open batch uses are not evicted; when
// every host page is so used, an evicted page is not stored. KV cache events
// report host stores and host evictions as medium "CPU".
//
// Transactions: between `BeginTransaction()` and `CommitTransaction()` the pool
// journals the inverse of every change; `RollbackTransaction()` replays the
// journal backwards and restores refcounts, free-stack order, LRU order, the
// index and the stats exactly (`Snapshot()` compares equal to the one taken at
// `BeginTransaction()`). Transactions nest; the innermost one is closed first.
//
// Complexity: every operation is O(1) per page it touches (AllocateN,
// AcquireCached and AcquireCachedPrefix: O(pages)); CheckInvariants, Snapshot
// and ResetPrefixCache are O(num_pages). Arrays, the free stack, the prefix
// index and the journal are reserved at construction: steady-state operations
// do not allocate memory (a transaction journaling more than `journal_reserve`
// records grows the journal once; its capacity is kept).
//
// Errors: a failing call changes nothing (not even stats).
//
// Thread safety: thread-compatible. No internal locking; one thread (the
// scheduler's) owns a pool; const methods may run concurrently with each
// other only.
#ifndef KVBLOCK_BLOCK_POOL_H_
#define KVBLOCK_BLOCK_POOL_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvblock/block_hash.h"
#include "kvblock/kv_events.h"
#include "kvblock/types.h"

namespace kvblock {

class PrefixIndex;  // internal: lib/cache/prefix_index.h
namespace internal {
class CacheEventLog;  // lib/cache/cache_event_log.h
class HostTier;       // lib/cache/host_tier.h
class BlockPoolPeer;  // tests/pool_test_util.h: sets the copy batch number.
}  // namespace internal

// What `BlockPool::Writable` decided.
struct CopyOnWrite {
  enum class Kind : int32_t {
    // Write `page` in place: the caller held its only reference.
    kExisting = 0,
    // `page` is a new page (the caller had none).
    kAllocated = 1,
    // Copy `source` into the new `page` first, then write it: the caller's
    // reference moved from `source` to `page`.
    kCopy = 2,
  };
  Kind kind = Kind::kExisting;
  PageId page = kNoPage;
  PageId source = kNoPage;  // kCopy only; kNoPage otherwise.

  friend bool operator==(const CopyOnWrite&, const CopyOnWrite&) = default;
};

// A page moved between the pool and its host tier: the K and V of device
// page `device_page` in every layer, and host page `host_page`.
struct HostCopy {
  enum class Direction : uint8_t {
    kDeviceToHost = 0,  // a store: the device page's KV into the host page.
    kHostToDevice = 1,  // a load: the host page's KV into the device page.
  };
  PageId device_page = kNoPage;
  HostPageId host_page = kNoHostPage;
  Direction direction = Direction::kDeviceToHost;

  friend bool operator==(const HostCopy&, const HostCopy&) = default;
};

// When the host tier stores a cached page (see the BlockPool comment).
enum class HostWritePolicy : int32_t {
  // When the pool evicts it: only pages that leave the device move.
  kWriteBack = 0,
  // In the copy batch after the step that cached it (its KV computed), so
  // that an eviction moves nothing: more stores, none on the eviction path.
  kWriteThrough = 1,
};

// Which page with refcount 0 Allocate takes (see the BlockPool comment).
enum class EvictionOrder : int32_t {
  // The free stack's top, and the least recently released cached page only
  // when no never-cached page is left.
  kNeverCachedFirst = 0,
  // The least recently released page, cached or not (vLLM's order).
  kLeastRecentlyFreed = 1,
};

struct BlockPoolOptions {
  // Highest refcount a page may reach; Retain beyond it is refused. Positive.
  int32_t max_refcount = std::numeric_limits<int32_t>::max();
  // Journal records reserved for transactions (each change is 1 record).
  int32_t journal_reserve = 4096;
  EvictionOrder eviction_order = EvictionOrder::kNeverCachedFirst;
  // Cache a page under a hash another page is cached under (behind it).
  bool index_duplicates = false;
  // Pages of the host tier (0: none), in [0, kMaxNumPages].
  int32_t host_pages = 0;
  HostWritePolicy host_write_policy = HostWritePolicy::kWriteBack;
};

// Counters since creation. A rolled-back transaction restores them too.
struct BlockPoolStats {
  // Pages handed out by Allocate, AllocateN and Writable.
  int64_t allocations = 0;
  // Cached pages evicted to allocate.
  int64_t evictions = 0;
  // Writable results of kind kCopy.
  int64_t cow_copies = 0;
  // Pages taken by AcquireCached(Prefix); `cache_revivals` of them were
  // evictable.
  int64_t cache_hits = 0;
  int64_t cache_revivals = 0;
  // Pages RegisterCached reported stored: newly cached, and without
  // `index_duplicates` under a hash no other page is cached under.
  int64_t cache_registrations = 0;
  // Most pages used at once.
  int32_t peak_used = 0;
  // Host tier: cached pages stored into it; pages loaded back from it
  // (LoadFromHost); host pages whose key was dropped to make room; cached
  // pages evicted without a store (allocated in the open copy batch, or
  // every host page used by it).
  int64_t host_stores = 0;
  int64_t host_loads = 0;
  int64_t host_evictions = 0;
  int64_t host_store_skips = 0;

  friend bool operator==(const BlockPoolStats&,
                         const BlockPoolStats&) = default;
};

// The observable state of a pool, canonical and exact: two pools that behave
// the same from now on have equal snapshots. For tests and debugging.
struct BlockPoolSnapshot {
  // By page id.
  std::vector<int32_t> refcounts;
  // Bottom to top: the next Allocate's page is last.
  std::vector<PageId> free_stack;
  // Head (evicted first) to tail.
  std::vector<PageId> lru;
  // Every cached page with its hash, by page id.
  std::vector<std::pair<PageId, BlockHash>> cached;
  // Pages cached under one hash, for each hash cached on more than one page:
  // the page a lookup finds first, then the others in the order they answer
  // next; by first page id. Without `index_duplicates`, every page but the
  // first of a ring is used.
  std::vector<std::vector<PageId>> duplicates;
  BlockPoolStats stats;
  // The host tier (all empty without one): its LRU list head to tail, its
  // cached pages with their keys by host page, its free stack bottom to
  // top, the host pages the open copy batch uses; the open batch's copies
  // in order; the device pages it stamped (cached, loaded, or read by a
  // copy on write in it) and, of those, loaded in it;
  // the pages parked until it is taken, and the pages waiting to be written
  // through, in order.
  std::vector<HostPageId> host_lru;
  std::vector<std::pair<HostPageId, BlockHash>> host_cached;
  std::vector<HostPageId> host_free;
  std::vector<HostPageId> host_used;
  std::vector<HostCopy> host_copies;
  std::vector<PageId> fresh_pages;
  std::vector<PageId> loaded_pages;
  std::vector<PageId> parked;
  std::vector<PageId> write_through;

  friend bool operator==(const BlockPoolSnapshot&,
                         const BlockPoolSnapshot&) = default;
  // A readable multi-line dump (hashes shortened to their first 4 bytes).
  std::string DebugString() const;

 private:
  // DebugString's host tier lines (none without one).
  std::string HostDebugString() const;
};

class BlockPool {
 public:
  // A position in the transaction journal; see BeginTransaction().
  struct Savepoint {
    int32_t depth = 0;
    size_t journal_size = 0;
    BlockPoolStats stats;
    internal::CacheEventLogMark events;  // see set_event_log.
    // The host tier's journal, and the open batch's lists.
    size_t host_journal_size = 0;
    size_t host_copies = 0;
    size_t parked = 0;
    size_t write_through = 0;
  };

  // A pool of `num_pages` free pages. InvalidArgument when `num_pages` is not
  // in [1, kMaxNumPages] (V page ids `p + num_pages` must fit int32) or an
  // option is out of range (`max_refcount` < 1, `journal_reserve` < 0,
  // `host_pages` outside [0, kMaxNumPages]).
  static absl::StatusOr<std::unique_ptr<BlockPool>> Create(
      int32_t num_pages, BlockPoolOptions options = {});
  // The bytes Create reserves for such a pool (saturating at INT64_MAX), for
  // an owner that checks its memory and the pool's as one sum. REQUIRES:
  // arguments Create accepts.
  static int64_t ReservedBytes(int32_t num_pages,
                               const BlockPoolOptions& options = {});

  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;
  ~BlockPool();

  // A page with refcount 1: the top of the free stack, else the evicted LRU
  // head (its hash leaves the index). ResourceExhausted when every page is
  // used. On error, nothing changes.
  absl::StatusOr<PageId> Allocate();

  // Fills `pages` with as many new pages, each as by Allocate(), in order; all
  // or nothing. ResourceExhausted when fewer than `pages.size()` pages are
  // allocatable (NumFree()). On error, nothing changes (`pages` included).
  absl::Status AllocateN(absl::Span<PageId> pages);

  // Adds a reference to a used page. InvalidArgument when `page` is not in
  // [0, num_pages); FailedPrecondition when it is free or evictable (revive a
  // cached page with AcquireCached) or its refcount is at
  // `max_refcount`. On error, nothing changes.
  absl::Status Retain(PageId page);

  // Drops a reference. At refcount 0 a cached page becomes the LRU tail and
  // any other page the top of the free stack (a page cached behind another
  // without `index_duplicates` leaves the cache first). InvalidArgument when
  // `page` is not in [0, num_pages); FailedPrecondition when it is not used
  // (double release). On error, nothing changes.
  absl::Status Release(PageId page);

  // Makes the caller's reference to `page` writable:
  //   kNoPage      -> kAllocated: a new page;
  //   refcount 1   -> kExisting: `page` itself; if it was cached its hash
  //                   leaves the index (its content is about to change);
  //   refcount > 1 -> kCopy: a new page (allocated first), then one reference
  //                   on `source` = `page` is dropped.
  // InvalidArgument when `page` is neither kNoPage nor in [0, num_pages);
  // FailedPrecondition when it is not used; ResourceExhausted when a new page
  // is needed and none is allocatable. On error, nothing changes.
  absl::StatusOr<CopyOnWrite> Writable(PageId page);

  // Prefix cache ------------------------------------------------------------

  // Caches the used, full page `page` under `hash` and returns `page`. If
  // `hash` is already cached on another page, that page stays cached and its
  // id is returned: `page` is cached behind it (see `index_duplicates` for
  // how long and with which events; the caller keeps using `page`). If `page`
  // is already cached under `hash`, nothing changes. InvalidArgument
  // when `page` is not in [0, num_pages); FailedPrecondition when it is not
  // used or is cached under a different hash. On error, nothing changes.
  // `group`: the KV cache group of a manager of several whose key `hash`
  // is (kvblock/kv_cache_groups.h; 0 for one group), in [0,
  // kMaxKvCacheGroups): KV cache events name it. InvalidArgument out of
  // that range.
  absl::StatusOr<PageId> RegisterCached(PageId page, const BlockHash& hash,
                                        int32_t group = 0);

  // The page cached under `hash`, used or evictable. Changes nothing.
  std::optional<PageId> Lookup(const BlockHash& hash) const;

  // Walks `chain` (a prompt's page hashes, first page first), stops at the
  // first hash that is not cached, writes the hits to `pages[0, hits)`, takes
  // them as AcquireCached does and returns `hits`. InvalidArgument when
  // `pages` is shorter than `chain`; AcquireCached's errors. On error,
  // nothing changes in the pool (`pages` may be partly overwritten).
  absl::StatusOr<int32_t> AcquireCachedPrefix(absl::Span<const BlockHash> chain,
                                              absl::Span<PageId> pages);

  // Takes one reference on each of `pages`, cached pages (used or evictable)
  // that the caller found with Lookup, in order; an evictable page is revived
  // (it leaves the LRU list with refcount 1). A page may repeat. All or
  // nothing. InvalidArgument when a page is not in [0, num_pages);
  // FailedPrecondition when it is not cached or its refcount is at
  // `max_refcount`. On error, nothing changes.
  absl::Status AcquireCached(absl::Span<const PageId> pages);

  // Drops `page`'s hash, if it is cached (used or evictable), and returns
  // whether it was; an evictable page becomes free (with kLeastRecentlyFreed
  // it keeps its place in the queue). vLLM's `evict_blocks`.
  // InvalidArgument when `page` is not in [0, num_pages). On error, nothing
  // changes.
  absl::StatusOr<bool> Uncache(PageId page);

  // Forgets every hash. Evictable pages become free, pushed in LRU order (so
  // the most recently released is allocated first; with kLeastRecentlyFreed
  // they keep their places in the queue); cached used pages stay used but are
  // no longer found. The host tier forgets every key too. FailedPrecondition
  // inside a transaction (the reset is not journaled), and while host copies
  // are not taken (their pages would be reused in their batch). On error,
  // nothing changes. O(num_pages + host_pages).
  absl::Status ResetPrefixCache();

  // Host tier ---------------------------------------------------------------

  // The host page cached under `key` (a hash or a group's key, as
  // RegisterCached took it); none without a host tier. Changes nothing.
  std::optional<HostPageId> HostLookup(const BlockHash& key) const;

  // Loads the host tier's page of `key` into a new device page (allocated as
  // by Allocate, refcount 1), caches that page under `key` for KV cache group
  // `group` and returns it; the load is listed in the open copy batch.
  // FailedPrecondition without a host tier, when the tier lacks `key`, or
  // when `key` is already cached on a device page; InvalidArgument for a
  // group out of range; ResourceExhausted when every page is in use. On
  // error, nothing changes.
  absl::StatusOr<PageId> LoadFromHost(const BlockHash& key, int32_t group = 0);

  // Marks the host pages of `keys` used by the open copy batch (each most
  // recently used, in order), so that no store of the batch drops one: a
  // caller that loads several keys uses them all first, since each load's
  // page may evict a device page whose store would drop the next key.
  // FailedPrecondition without a host tier or when it lacks a key. On
  // error, nothing changes.
  absl::Status UseHostPages(absl::Span<const BlockHash> keys);

  // Appends the open copy batch's copies to `out`, in the order they were
  // listed, and opens the next batch: the pages parked for the batch are
  // released, and (kWriteThrough) the pages cached in it that the host tier
  // lacks are stored in the new batch. FailedPrecondition inside a
  // transaction. O(copies + parked + written-through pages), and once in
  // 2^29 - 1 batches O(pages + host pages), when batch numbers start again.
  absl::Status TakeHostCopies(std::vector<HostCopy>& out);
  // The open copy batch's copies so far.
  absl::Span<const HostCopy> host_copies() const { return host_copies_; }
  // The device pages parked until the open batch is taken (each holds one
  // reference of the pool's, besides any of the callers').
  absl::Span<const PageId> parked_pages() const { return parked_; }

  // Transactions ------------------------------------------------------------

  // Opens a transaction (nested in any open one) and returns its savepoint.
  // Every open transaction must be closed by CommitTransaction or
  // RollbackTransaction, innermost first. The pool checks a savepoint's depth
  // only: REQUIRES a savepoint returned by the still-open BeginTransaction.
  Savepoint BeginTransaction();

  // Keeps the changes since `savepoint`; they belong to the enclosing
  // transaction, if any. FailedPrecondition when `savepoint` is not the
  // innermost open transaction's. On error, nothing changes.
  absl::Status CommitTransaction(const Savepoint& savepoint);

  // Undoes every change since `savepoint` and closes its transaction: the
  // pool's Snapshot() equals the one at BeginTransaction(). FailedPrecondition
  // when `savepoint` is not the innermost open transaction's. On error,
  // nothing changes.
  absl::Status RollbackTransaction(const Savepoint& savepoint);

  // Open transactions (0 outside any).
  int32_t transaction_depth() const { return depth_; }

  // KV cache events: with a log set (null: none, the default), every
  // RegisterCached, every page evicted or uncached and every reset is
  // recorded in it, and a rollback truncates it to its savepoint.
  // BlockManager sets one for BlockManagerOptions::enable_kv_events.
  void set_event_log(internal::CacheEventLog* log) { events_ = log; }

  // Observers ----------------------------------------------------------------

  // References on `page`; 0 for a free or evictable page and for an id outside
  // [0, num_pages).
  int32_t RefCount(PageId page) const {
    return InRange(page) ? pages_[page].refcount : 0;
  }
  // The hash `page` is cached under; none when it is not cached or not in
  // [0, num_pages).
  std::optional<BlockHash> CachedHash(PageId page) const {
    if (!InRange(page) || !pages_[page].cached) return std::nullopt;
    return pages_[page].hash;
  }
  // The hash KV cache events name cached `page` by: the key it is cached
  // under, taken out of its KV cache group's keys (RegisterCached's `group`;
  // the key itself for group 0). None when it is not cached.
  std::optional<BlockHash> EventHash(PageId page) const;
  // The KV cache group `page` is cached in (RegisterCached's `group`); -1
  // when it is not cached or not in [0, num_pages).
  int32_t CachedGroup(PageId page) const {
    if (!InRange(page) || !pages_[page].cached) return -1;
    return pages_[page].group;
  }
  // Whether Lookup(hash) finds `page` (a page cached behind another one under
  // `hash` is not found). O(1): one page's state, no index probe.
  bool IsIndexedAs(PageId page, const BlockHash& hash) const {
    return InRange(page) && pages_[page].cached == kIndexed &&
           pages_[page].hash == hash;
  }
  // Pages Allocate can hand out now: free + evictable.
  int32_t NumFree() const {
    return static_cast<int32_t>(free_stack_.size()) + num_evictable_;
  }
  // Pages on the LRU list: cached pages with refcount 0 (with
  // kLeastRecentlyFreed, every page with refcount 0).
  int32_t NumEvictable() const { return num_evictable_; }
  // Cached pages, used or evictable.
  int32_t NumCached() const { return num_cached_; }
  EvictionOrder eviction_order() const { return eviction_order_; }
  // Pages with refcount > 0.
  int32_t NumUsed() const { return num_pages_ - NumFree(); }
  int32_t num_pages() const { return num_pages_; }
  // The host tier's pages (0 without one) and those holding a cached page.
  int32_t host_pages() const;
  int32_t NumHostCached() const;
  int32_t max_refcount() const { return max_refcount_; }
  const BlockPoolStats& stats() const { return stats_; }

  // OK when the free stack, the LRU list, the refcounts, the cached flags and
  // the index agree (see the states above); Internal naming the first
  // disagreement otherwise. O(num_pages).
  absl::Status CheckInvariants() const;

  // The exact observable state. O(num_pages).
  BlockPoolSnapshot Snapshot() const;

 private:
  // One inverse change, replayed by RollbackTransaction.
  struct UndoRecord {
    enum class Op : uint8_t {
      kPopFree,    // popped `page` off the free stack (refcount 0 -> 1).
      kEvict,      // evicted `page`, the LRU head, cached as `hash`.
      kAddRef,     // refcount += 1 on a used page.
      kDropRef,    // refcount -= 1, still used.
      kPushFree,   // pushed `page` onto the free stack (refcount 1 -> 0).
      kAppendLru,  // appended `page` at the LRU tail (refcount 1 -> 0).
      kRevive,     // unlinked evictable `page` after `prev` (refcount 0 -> 1).
      kRegister,   // cached `page` under `hash`.
      kUncache,    // dropped `page`'s `hash` (Writable, refcount 1; Uncache).
      kPopLru,     // took uncached `page`, the LRU head (refcount 0 -> 1).
      // Uncache of evictable `page`: off the LRU list after `lru_prev`, its
      // `hash` dropped, pushed onto the free stack.
      kUncacheFree,
      // With a host tier: `page`'s copy batch stamp was `prev` (before it
      // was cached).
      kStamp,
    };
    Op op;
    // kRegister: the group the page was cached for before (its group while
    // uncached is the last one's).
    uint8_t group;
    PageId page;
    // kRevive: the LRU neighbour before `page`. kEvict, kUncache and
    // kUncacheFree: the page before `page` among the pages cached under
    // `hash`, kNoPage when `page` was the one a lookup found. kStamp and
    // kRegister: the page's copy batch stamp before, as uint32_t.
    PageId prev;
    PageId lru_prev;  // kUncacheFree only.
    BlockHash hash;
  };

  BlockPool(int32_t num_pages, const BlockPoolOptions& options);

  // CheckInvariants of the host tier and the open copy batch.
  absl::Status CheckHostTier() const;
  // CheckInvariants for one page: its cached state agrees with the index and
  // its duplicates' ring.
  absl::Status CheckCachedPage(PageId page) const;
  // The ResourceExhausted a rollback test injects where a page would be
  // allocated (lib/base/fault_injection.h).
  absl::Status InjectedAllocationFault() const;
  // The page checks of the hot paths are inline; their errors are built out
  // of line, only when a check fails.
  bool InRange(PageId page) const { return page >= 0 && page < num_pages_; }
  // Used by a caller: a parked page's last reference is the pool's.
  bool IsUsed(PageId page) const {
    return InRange(page) &&
           pages_[page].refcount >
               static_cast<int32_t>((pages_[page].batch & kParked) >> 30);
  }
  // InvalidArgument naming `page`, which is not InRange.
  absl::Status RangeError(PageId page) const;
  // For a page that is not IsUsed: RangeError, or FailedPrecondition saying
  // whether it is free or evictable.
  absl::Status UnusedError(PageId page) const;
  // Allocate() after the caller checked NumFree() > 0.
  PageId AllocateUnchecked();
  // With a host tier: stores cached `page`, which Allocate is evicting, unless
  // the tier holds its key already or the page holds no KV yet.
  void WriteBack(PageId page);
  // Stores cached `page` into the open batch, listing its copy, unless the
  // host tier holds its key already (then nothing changes, not even the
  // LRU order, as vLLM's offloading manager leaves a stored block out of
  // prepare_store), or every host page is used by the batch (a skip,
  // counted).
  void StoreToHost(PageId page);
  // A page's copy batch stamp (PageState::batch): the batch that last
  // cached it, and three flags of that batch: the page was loaded in it, is
  // the source or destination of a copy on write made in it, and is parked
  // (the pool holds its last reference until the batch is taken). Batch
  // numbers start again at 1 after kBatchMask (2^29 - 1) batches; every
  // stamp, device and host, is cleared then, so that none names the new
  // batch 1 (a pool serving 100 steps a second gets there in 62 days).
  static constexpr uint32_t kLoaded = 1u << 31;
  static constexpr uint32_t kParked = 1u << 30;
  static constexpr uint32_t kCopied = 1u << 29;
  static constexpr uint32_t kBatchMask = kCopied - 1;
  static constexpr uint32_t kFlags = kLoaded | kParked | kCopied;
  bool CachedInBatch(PageId page) const {
    return (pages_[page].batch & kBatchMask) == batch_;
  }
  bool LoadedInBatch(PageId page) const {
    return (pages_[page].batch & (kBatchMask | kLoaded)) == (batch_ | kLoaded);
  }
  // Whether a copy of the open batch writes `page` (a load) or reads or
  // writes it after the batch's loads (a copy on write): handed out again
  // before the batch is taken, a load into it would run before that copy.
  bool CopiedInBatch(PageId page) const {
    return CachedInBatch(page) &&
           (pages_[page].batch & (kLoaded | kCopied)) != 0;
  }
  // `page`'s stamp with the open batch and `flags`, keeping the flags it has
  // from that batch; Stamp sets it, journaled.
  uint32_t StampFor(PageId page, uint32_t flags) const;
  void Stamp(PageId page, uint32_t flags = 0);
  // Evicting `victim`: prefetches for the evictions after it.
  void PrefetchNextEvictions(PageId victim) const;
  void Journal(UndoRecord::Op op, PageId page, PageId prev = kNoPage,
               const BlockHash& hash = BlockHash{}, uint8_t group = 0);
  void Undo(const UndoRecord& record);
  // Drops cached `page` from the index, or from behind the page it
  // duplicates, and returns the page before it among its hash's pages
  // (kNoPage when a lookup found `page`).
  PageId Unindex(PageId page);
  // Indexes `page` under `hash` again where Unindex took it from, `prev` being
  // what Unindex returned (undoing an eviction or an uncache).
  void Recache(PageId page, const BlockHash& hash, PageId prev);
  // Whether uncaching cached `page` is a BlockRemoved: every copy's with
  // `index_duplicates`, else only the hash's last copy's.
  bool RemovalReported(PageId page) const {
    return index_duplicates_ || pages_[page].dup_next == kNoPage;
  }
  // Links cached `page` behind the last page cached under `head`'s hash.
  void LinkDuplicate(PageId head, PageId page);
  void NoteUsed() { stats_.peak_used = std::max(stats_.peak_used, NumUsed()); }
  // Intrusive LRU list: the sentinel `num_pages_` links head and tail.
  void LinkAfter(PageId prev, PageId page);
  void Unlink(PageId page);

  const int32_t num_pages_;
  const int32_t max_refcount_;
  const EvictionOrder eviction_order_;
  const bool index_duplicates_;
  // Whether a page with refcount 0 that is not cached goes on the LRU list.
  bool lru_holds_free() const {
    return eviction_order_ == EvictionOrder::kLeastRecentlyFreed;
  }

  // What the pool keeps of one page, in one cache line: a page operation
  // touches one line instead of one per field.
  struct alignas(64) PageState {
    BlockHash hash;        // the index key while `cached`.
    uint32_t tag = 0;      // PrefixIndex::Tag(hash) while `cached`.
    int32_t refcount = 0;  // in [0, max_refcount_].
    // Pages on the LRU list only (others hold kNoPage).
    PageId lru_prev = kNoPage;
    PageId lru_next = kNoPage;
    // Pages cached under one hash form a ring in the order a lookup finds
    // them, the indexed page first; a page cached alone holds kNoPage.
    PageId dup_prev = kNoPage;
    PageId dup_next = kNoPage;
    // kIndexed when the index holds the page under `hash`; kDuplicate when
    // it is cached behind the indexed page of `hash`.
    uint8_t cached = 0;
    // The KV cache group `hash` is a key of (RegisterCached's), for events.
    uint8_t group = 0;
    // With a host tier: its copy batch stamp (kLoaded, kCopied, kParked
    // below).
    uint32_t batch = 0;
  };
  static_assert(sizeof(PageState) == 64);
  static constexpr uint8_t kIndexed = 1;
  static constexpr uint8_t kDuplicate = 2;
  // By page id; entry num_pages_ is the LRU sentinel: its lru_next is the
  // head, its lru_prev the tail.
  std::vector<PageState> pages_;
  int32_t num_evictable_ = 0;
  int32_t num_cached_ = 0;
  // Exactly the free pages not on the LRU list, top = back(); capacity
  // num_pages_.
  std::vector<PageId> free_stack_;
  // Exactly the kIndexed pages, each under pages_[p].hash (which HashOf
  // reads).
  std::unique_ptr<PrefixIndex> index_;
  struct HashOf {
    const std::vector<PageState>* pages;
    const BlockHash& operator()(PageId page) const {
      return (*pages)[page].hash;
    }
  };
  HashOf hash_of() const { return HashOf{&pages_}; }

  BlockPoolStats stats_;

  // Inverse changes since the outermost open transaction began; empty when
  // depth_ == 0.
  std::vector<UndoRecord> journal_;
  int32_t depth_ = 0;
  internal::CacheEventLog* events_ = nullptr;

  friend class internal::BlockPoolPeer;

  // The host tier (null without one), its policy, the open copy batch's
  // number (in [1, kBatchMask]) and lists: its copies, the pages parked until
  // it is taken (see TakeHostCopies), and (kWriteThrough) the pages cached in
  // it.
  std::unique_ptr<internal::HostTier> host_;
  const HostWritePolicy host_write_policy_;
  uint32_t batch_ = 1;
  std::vector<HostCopy> host_copies_;
  std::vector<PageId> parked_;
  std::vector<PageId> write_through_;
};

}  // namespace kvblock

#endif  // KVBLOCK_BLOCK_POOL_H_
