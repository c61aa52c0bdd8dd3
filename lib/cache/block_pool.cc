// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "kvblock/block_pool.h"

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/fault_injection.h"
#include "base/reservation.h"
#include "cache/cache_event_log.h"
#include "cache/group_key.h"
#include "cache/host_tier.h"
#include "cache/page_lists.h"
#include "cache/prefix_index.h"
#include "kvblock/kv_cache_groups.h"
#include "kvblock/status_macros.h"

namespace kvblock {
namespace {

std::string ShortHash(const BlockHash& hash) {
  return absl::StrFormat("%02x%02x%02x%02x", hash.bytes[0], hash.bytes[1],
                         hash.bytes[2], hash.bytes[3]);
}

}  // namespace

std::string BlockPoolSnapshot::DebugString() const {
  std::string cached_text;
  for (const auto& [page, hash] : cached) {
    absl::StrAppend(&cached_text, cached_text.empty() ? "" : " ", page, ":",
                    ShortHash(hash));
  }
  return absl::StrCat(
      "refcounts: [", absl::StrJoin(refcounts, " "), "]\nfree_stack: [",
      absl::StrJoin(free_stack, " "), "]\nlru: [", absl::StrJoin(lru, " "),
      "]\ncached: [", cached_text, "]\nstats: allocations=", stats.allocations,
      " evictions=", stats.evictions, " cow_copies=", stats.cow_copies,
      " cache_hits=", stats.cache_hits,
      " cache_revivals=", stats.cache_revivals,
      " cache_registrations=", stats.cache_registrations,
      " peak_used=", stats.peak_used, "\nduplicates: [",
      absl::StrJoin(duplicates, " ",
                    [](std::string* out, const std::vector<PageId>& ring) {
                      absl::StrAppend(out, "(", absl::StrJoin(ring, " "), ")");
                    }),
      "]\n", HostDebugString());
}

std::string BlockPoolSnapshot::HostDebugString() const {
  if (host_lru.empty() && host_free.empty()) return "";
  std::string cached_text;
  for (const auto& [page, hash] : host_cached) {
    absl::StrAppend(&cached_text, cached_text.empty() ? "" : " ", page, ":",
                    ShortHash(hash));
  }
  return absl::StrCat(
      "host_lru: [", absl::StrJoin(host_lru, " "), "]\nhost_cached: [",
      cached_text, "]\nhost_free: [", absl::StrJoin(host_free, " "),
      "]\nhost_used: [", absl::StrJoin(host_used, " "), "]\nhost_copies: [",
      absl::StrJoin(host_copies, " ",
                    [](std::string* out, const HostCopy& copy) {
                      const bool load =
                          copy.direction == HostCopy::Direction::kHostToDevice;
                      absl::StrAppend(out, load ? "h" : "d",
                                      load ? copy.host_page : copy.device_page,
                                      ">", load ? "d" : "h",
                                      load ? copy.device_page : copy.host_page);
                    }),
      "]\nfresh: [", absl::StrJoin(fresh_pages, " "), "] loaded: [",
      absl::StrJoin(loaded_pages, " "), "] parked: [",
      absl::StrJoin(parked, " "), "] write_through: [",
      absl::StrJoin(write_through, " "),
      "]\nhost stats: stores=", stats.host_stores, " loads=", stats.host_loads,
      " evictions=", stats.host_evictions, " skips=", stats.host_store_skips,
      "\n");
}

absl::StatusOr<std::unique_ptr<BlockPool>> BlockPool::Create(
    int32_t num_pages, BlockPoolOptions options) {
  if (num_pages < 1 || num_pages > kMaxNumPages) {
    return absl::InvalidArgumentError(
        absl::StrCat("block pool: num_pages must be in [1, ", kMaxNumPages,
                     "], got ", num_pages));
  }
  if (options.max_refcount < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("block pool: max_refcount must be positive, got ",
                     options.max_refcount));
  }
  if (options.journal_reserve < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("block pool: journal_reserve must be non-negative, got ",
                     options.journal_reserve));
  }
  if (options.host_pages < 0 || options.host_pages > kMaxNumPages) {
    return absl::InvalidArgumentError(
        absl::StrCat("block pool: host_pages must be in [0, ", kMaxNumPages,
                     "], got ", options.host_pages));
  }
  // Enums from callers' integers (Python's, a config file's): only the
  // values they name.
  if (options.eviction_order != EvictionOrder::kNeverCachedFirst &&
      options.eviction_order != EvictionOrder::kLeastRecentlyFreed) {
    return absl::InvalidArgumentError(
        absl::StrCat("block pool: eviction_order ",
                     static_cast<int32_t>(options.eviction_order),
                     " is not one of EvictionOrder's"));
  }
  if (options.host_write_policy != HostWritePolicy::kWriteBack &&
      options.host_write_policy != HostWritePolicy::kWriteThrough) {
    return absl::InvalidArgumentError(
        absl::StrCat("block pool: host_write_policy ",
                     static_cast<int32_t>(options.host_write_policy),
                     " is not one of HostWritePolicy's"));
  }
  internal::Reservation reservation("block pool");
  reservation.Add(1, ReservedBytes(num_pages, options));
  KVBLOCK_RETURN_IF_ERROR(reservation.Check());
  std::unique_ptr<BlockPool> pool;
  KVBLOCK_RETURN_IF_ERROR(
      reservation.Run([&] { pool.reset(new BlockPool(num_pages, options)); }));
  return pool;
}

int64_t BlockPool::ReservedBytes(int32_t num_pages,
                                 const BlockPoolOptions& options) {
  internal::Reservation reservation("block pool");
  reservation.Add(int64_t{num_pages} + 1, sizeof(PageState));
  reservation.Add(1, PrefixIndex::ReservedBytes(num_pages));
  reservation.Add(num_pages, sizeof(PageId));  // the free stack.
  reservation.Add(options.journal_reserve, sizeof(UndoRecord));
  if (options.host_pages > 0) {
    reservation.Add(1, internal::HostTier::ReservedBytes(
                           options.host_pages, options.journal_reserve));
    // The open batch's copies, and its parked and written-through pages.
    reservation.Add(options.journal_reserve, sizeof(HostCopy));
    reservation.Add(2 * int64_t{options.journal_reserve}, sizeof(PageId));
  }
  return reservation.bytes();
}

BlockPool::BlockPool(int32_t num_pages, const BlockPoolOptions& options)
    : num_pages_(num_pages),
      max_refcount_(options.max_refcount),
      eviction_order_(options.eviction_order),
      index_duplicates_(options.index_duplicates),
      pages_(num_pages + 1),
      index_(std::make_unique<PrefixIndex>(num_pages)),
      host_write_policy_(options.host_write_policy) {
  if (options.host_pages > 0) {
    host_ = std::make_unique<internal::HostTier>(options.host_pages,
                                                 options.journal_reserve);
    host_copies_.reserve(options.journal_reserve);
    parked_.reserve(options.journal_reserve);
    write_through_.reserve(options.journal_reserve);
  }
  pages_[num_pages_].lru_prev = num_pages_;
  pages_[num_pages_].lru_next = num_pages_;
  free_stack_.reserve(num_pages_);
  if (lru_holds_free()) {
    for (PageId page = 0; page < num_pages_; ++page) {
      LinkAfter(pages_[num_pages_].lru_prev, page);
    }
  } else {
    for (PageId page = num_pages_ - 1; page >= 0; --page) {
      free_stack_.push_back(page);
    }
  }
  journal_.reserve(options.journal_reserve);
}

BlockPool::~BlockPool() = default;

absl::Status BlockPool::InjectedAllocationFault() const {
  return absl::ResourceExhaustedError(absl::StrCat(
      "block pool: injected allocation fault (", NumFree(), " pages free)"));
}

absl::Status BlockPool::RangeError(PageId page) const {
  return absl::InvalidArgumentError(absl::StrCat(
      "block pool: page ", page, " is not in [0, ", num_pages_, ")"));
}

absl::Status BlockPool::UnusedError(PageId page) const {
  if (!InRange(page)) return RangeError(page);
  return absl::FailedPreconditionError(absl::StrCat(
      "block pool: page ", page, " is not in use (",
      pages_[page].refcount > 0 ? "parked until its copy batch is taken"
      : pages_[page].cached     ? "evictable"
                                : "free",
      ")"));
}

inline void BlockPool::Journal(UndoRecord::Op op, PageId page, PageId prev,
                               const BlockHash& hash, uint8_t group) {
  if (depth_ == 0) return;
  // Written in place: a record built on the stack and copied out stalls on
  // store forwarding (its copy reads across the narrower stores).
  UndoRecord& record = journal_.emplace_back();
  record.op = op;
  record.group = group;
  record.page = page;
  record.prev = prev;
  record.lru_prev = kNoPage;
  record.hash = hash;
}

void BlockPool::LinkDuplicate(PageId head, PageId page) {
  PageState& first = pages_[head];
  if (first.dup_next == kNoPage) first.dup_next = first.dup_prev = head;
  const PageId last = first.dup_prev;
  pages_[page].dup_prev = last;
  pages_[page].dup_next = head;
  pages_[last].dup_next = page;
  first.dup_prev = page;
}

PageId BlockPool::Unindex(PageId page) {
  PageState& state = pages_[page];
  PageId prev = kNoPage;
  if (state.dup_next == kNoPage) {
    // Holds by construction: every kIndexed page is indexed
    // (CheckInvariants).
    [[maybe_unused]] const bool erased = index_->Erase(state.tag, page);
    assert(erased);
  } else {
    const PageId next = state.dup_next;
    const PageId before = state.dup_prev;
    if (state.cached == kIndexed) {
      // The page cached longest after it answers lookups now.
      [[maybe_unused]] const bool replaced =
          index_->Replace(state.tag, page, next);
      assert(replaced);
      pages_[next].cached = kIndexed;
    } else {
      prev = before;
    }
    pages_[before].dup_next = next;
    pages_[next].dup_prev = before;
    if (next == before) pages_[next].dup_next = pages_[next].dup_prev = kNoPage;
    state.dup_next = state.dup_prev = kNoPage;
  }
  state.cached = 0;
  --num_cached_;
  return prev;
}

inline void BlockPool::LinkAfter(PageId prev, PageId page) {
  internal::LinkAfter(pages_, prev, page);
  ++num_evictable_;
}

inline void BlockPool::Unlink(PageId page) {
  internal::Unlink(pages_, page);
  --num_evictable_;
}

inline void BlockPool::PrefetchNextEvictions(PageId victim) const {
  // The next victim's line came in at the eviction before this one: its
  // tag names the index bucket that eviction will erase from; the victim
  // after it is the line to bring in for the eviction after that. An LRU
  // change in between only wastes a prefetch.
  const PageState& next = pages_[pages_[victim].lru_next];
  index_->Prefetch(next.tag);
  if (host_ == nullptr) {
    __builtin_prefetch(&pages_[next.lru_next]);
    return;
  }
  // With a host tier each eviction also looks its key up there (the same
  // tag, the host index's bucket) and may drop the host LRU head: those
  // come two evictions ahead, from the line that came in at the last one,
  // and the line after it is asked for now.
  const PageState& after = pages_[next.lru_next];
  host_->PrefetchStore(after.tag);
  __builtin_prefetch(&pages_[after.lru_next]);
}

PageId BlockPool::AllocateUnchecked() {
  PageId page;
  if (!free_stack_.empty()) {
    page = free_stack_.back();
    free_stack_.pop_back();
    Journal(UndoRecord::Op::kPopFree, page);
  } else {
    page = pages_[num_pages_].lru_next;
    PrefetchNextEvictions(page);
    Unlink(page);
    if (pages_[page].cached) {
      const bool reported = RemovalReported(page);
      const PageId prev = Unindex(page);
      ++stats_.evictions;
      Journal(UndoRecord::Op::kEvict, page, prev, pages_[page].hash);
      if (events_ != nullptr && reported) {
        events_->Removed(pages_[page].hash, pages_[page].group);
      }
      if (host_ != nullptr) WriteBack(page);
    } else {
      Journal(UndoRecord::Op::kPopLru, page);
    }
  }
  pages_[page].refcount = 1;
  ++stats_.allocations;
  NoteUsed();
  return page;
}

uint32_t BlockPool::StampFor(PageId page, uint32_t flags) const {
  const uint32_t old = pages_[page].batch;
  const uint32_t kept = (old & kBatchMask) == batch_ ? old & kFlags : 0;
  return batch_ | kept | flags;
}

void BlockPool::Stamp(PageId page, uint32_t flags) {
  Journal(UndoRecord::Op::kStamp, page,
          static_cast<PageId>(pages_[page].batch));
  pages_[page].batch = StampFor(page, flags);
}

void BlockPool::WriteBack(PageId page) {
  // Cached in the open batch, its KV is not all computed yet.
  if (CachedInBatch(page)) {
    ++stats_.host_store_skips;
    return;
  }
  StoreToHost(page);
}

void BlockPool::StoreToHost(PageId page) {
  const PageState& state = pages_[page];
  // The page's index tag is the host index's too (one Tag function).
  const internal::HostTier::Stored stored =
      host_->Store(state.hash, state.tag, state.group, batch_);
  if (stored.page == kNoHostPage) {
    ++stats_.host_store_skips;
    return;
  }
  if (!stored.is_new) return;
  if (stored.evicted.any) {
    ++stats_.host_evictions;
    if (events_ != nullptr) {
      events_->HostRemoved(stored.evicted.key, stored.evicted.group);
    }
  }
  if (events_ != nullptr) events_->HostStored(state.hash, state.group);
  host_copies_.push_back(
      {page, stored.page, HostCopy::Direction::kDeviceToHost});
  ++stats_.host_stores;
}

absl::StatusOr<PageId> BlockPool::Allocate() {
  if (NumFree() == 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("block pool: all ", num_pages_, " pages are in use"));
  }
  if (internal::FaultInjection::ShouldFail()) return InjectedAllocationFault();
  return AllocateUnchecked();
}

absl::Status BlockPool::AllocateN(absl::Span<PageId> pages) {
  if (pages.size() > static_cast<size_t>(NumFree())) {
    return absl::ResourceExhaustedError(
        absl::StrCat("block pool: ", pages.size(), " pages requested, ",
                     NumFree(), " of ", num_pages_, " allocatable"));
  }
  for (size_t i = 0; i < pages.size(); ++i) {
    if (internal::FaultInjection::ShouldFail())
      return InjectedAllocationFault();
  }
  for (PageId& page : pages) page = AllocateUnchecked();
  return absl::OkStatus();
}

absl::Status BlockPool::Retain(PageId page) {
  if (!IsUsed(page)) return UnusedError(page);
  if (internal::FaultInjection::ShouldFail()) {
    return absl::FailedPreconditionError(
        absl::StrCat("block pool: injected fault retaining page ", page));
  }
  if (pages_[page].refcount == max_refcount_) {
    return absl::FailedPreconditionError(
        absl::StrCat("block pool: page ", page, " refcount is at the maximum ",
                     max_refcount_));
  }
  ++pages_[page].refcount;
  Journal(UndoRecord::Op::kAddRef, page);
  return absl::OkStatus();
}

absl::Status BlockPool::Release(PageId page) {
  if (!IsUsed(page)) return UnusedError(page);
  PageState& state = pages_[page];
  if (state.refcount == 1 && host_ != nullptr && CopiedInBatch(page)) {
    // Its load, or the copy on write that reads it, is not run yet: the
    // pool keeps the reference until the batch is taken, so that the page
    // is not handed out in it.
    Stamp(page, kParked);
    parked_.push_back(page);
    return absl::OkStatus();
  }
  if (--state.refcount > 0) {
    Journal(UndoRecord::Op::kDropRef, page);
    return absl::OkStatus();
  }
  if (state.cached == kDuplicate && !index_duplicates_) {
    // It stayed cached only so that its hash outlives the indexed page
    // while it is held; unused, it is a second copy the cache keeps none of.
    const PageId prev = Unindex(page);
    Journal(UndoRecord::Op::kUncache, page, prev, state.hash);
  }
  if (state.cached || lru_holds_free()) {
    LinkAfter(pages_[num_pages_].lru_prev, page);
    Journal(UndoRecord::Op::kAppendLru, page);
  } else {
    free_stack_.push_back(page);
    Journal(UndoRecord::Op::kPushFree, page);
  }
  return absl::OkStatus();
}

absl::StatusOr<CopyOnWrite> BlockPool::Writable(PageId page) {
  if (page != kNoPage) {
    if (!IsUsed(page)) return UnusedError(page);
    if (pages_[page].refcount == 1) {
      if (pages_[page].cached) {
        const bool reported = RemovalReported(page);
        const PageId prev = Unindex(page);
        Journal(UndoRecord::Op::kUncache, page, prev, pages_[page].hash);
        if (events_ != nullptr && reported) {
          events_->Removed(pages_[page].hash, pages_[page].group);
        }
      }
      return CopyOnWrite{CopyOnWrite::Kind::kExisting, page, kNoPage};
    }
  }
  if (NumFree() == 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "block pool: no page to ",
        page == kNoPage ? "allocate" : absl::StrCat("copy page ", page, " to"),
        ", all ", num_pages_, " pages are in use"));
  }
  if (internal::FaultInjection::ShouldFail()) return InjectedAllocationFault();
  const PageId destination = AllocateUnchecked();
  if (page == kNoPage) {
    return CopyOnWrite{CopyOnWrite::Kind::kAllocated, destination, kNoPage};
  }
  --pages_[page].refcount;  // Stays > 0: it was above 1.
  Journal(UndoRecord::Op::kDropRef, page);
  // The copy runs after the batch's loads: none may load into its source or
  // its destination. (Stamped, they count as cached in the batch too, which
  // matters only to an eviction's store, and neither can be evicted in the
  // batch: held, or parked once released.)
  if (host_ != nullptr) {
    Stamp(page, kCopied);
    Stamp(destination, kCopied);
  }
  ++stats_.cow_copies;
  return CopyOnWrite{CopyOnWrite::Kind::kCopy, destination, page};
}

absl::StatusOr<PageId> BlockPool::RegisterCached(PageId page,
                                                 const BlockHash& hash,
                                                 int32_t group) {
  if (!IsUsed(page)) return UnusedError(page);
  if (group < 0 || group >= kMaxKvCacheGroups) {
    return absl::InvalidArgumentError(absl::StrCat("block pool: group ", group,
                                                   " is not in [0, ",
                                                   kMaxKvCacheGroups, ")"));
  }
  if (pages_[page].cached) {
    if (pages_[page].hash == hash) {
      if (events_ != nullptr) {
        events_->Registered(hash, /*stored=*/false, pages_[page].group);
      }
      return page;
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "block pool: page ", page, " is cached as ",
        ShortHash(pages_[page].hash), "..., not ", ShortHash(hash), "..."));
  }
  const uint32_t tag = PrefixIndex::Tag(hash);
  const PageId indexed = index_->Insert(tag, hash, page, hash_of());
  if (indexed == kNoPage) {
    // Cannot happen: the index has room for every page of the pool.
    return absl::InternalError(
        absl::StrCat("block pool: the prefix index is full with ",
                     index_->size(), " pages (a broken invariant)"));
  }
  const bool duplicate = indexed != page;
  // Without index_duplicates the hash was cached already: no event, no
  // registration counted, but the page is linked behind the indexed one so
  // that the hash stays cached while the page is held.
  const bool stored = !duplicate || index_duplicates_;
  if (events_ != nullptr) events_->Registered(hash, stored, group);
  PageState& state = pages_[page];
  const uint8_t group_before = state.group;
  state.group = static_cast<uint8_t>(group);
  state.cached = duplicate ? kDuplicate : kIndexed;
  state.hash = hash;
  state.tag = tag;
  if (duplicate) LinkDuplicate(indexed, page);
  ++num_cached_;
  if (stored) ++stats_.cache_registrations;
  // Its stamp before rides in the record (`prev`), undone with it.
  const uint32_t stamp_before = state.batch;
  if (host_ != nullptr) {
    state.batch = StampFor(page, 0);
    if (stored && host_write_policy_ == HostWritePolicy::kWriteThrough) {
      write_through_.push_back(page);
    }
  }
  Journal(UndoRecord::Op::kRegister, page, static_cast<PageId>(stamp_before),
          hash, group_before);
  return indexed;
}

absl::StatusOr<bool> BlockPool::Uncache(PageId page) {
  if (!InRange(page)) return RangeError(page);
  PageState& state = pages_[page];
  if (!state.cached) return false;
  if (events_ != nullptr && RemovalReported(page)) {
    events_->Removed(state.hash, state.group);
  }
  if (state.refcount > 0 || lru_holds_free()) {
    const PageId prev = Unindex(page);
    Journal(UndoRecord::Op::kUncache, page, prev, state.hash);
    return true;
  }
  const PageId lru_prev = state.lru_prev;
  Unlink(page);
  const PageId prev = Unindex(page);
  free_stack_.push_back(page);
  Journal(UndoRecord::Op::kUncacheFree, page, prev, state.hash);
  if (depth_ > 0) journal_.back().lru_prev = lru_prev;
  return true;
}

std::optional<BlockHash> BlockPool::EventHash(PageId page) const {
  if (!InRange(page) || !pages_[page].cached) return std::nullopt;
  return internal::SaltKey(pages_[page].hash,
                           internal::GroupKeySalt(pages_[page].group));
}

std::optional<PageId> BlockPool::Lookup(const BlockHash& hash) const {
  const PageId page = index_->Find(hash, hash_of());
  if (page == kNoPage) return std::nullopt;
  return page;
}

absl::StatusOr<int32_t> BlockPool::AcquireCachedPrefix(
    absl::Span<const BlockHash> chain, absl::Span<PageId> pages) {
  if (pages.size() < chain.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("block pool: ", pages.size(),
                     " output slots for a chain of ", chain.size(), " hashes"));
  }
  int32_t hits = 0;
  for (const BlockHash& hash : chain) {
    const PageId page = index_->Find(hash, hash_of());
    if (page == kNoPage) break;
    pages[hits++] = page;
  }
  KVBLOCK_RETURN_IF_ERROR(AcquireCached(pages.first(hits)));
  return hits;
}

absl::Status BlockPool::AcquireCached(absl::Span<const PageId> pages) {
  // A page may repeat: take the references one by one in a transaction and
  // undo them all if one is refused.
  const Savepoint savepoint = BeginTransaction();
  for (size_t i = 0; i < pages.size(); ++i) {
    const PageId page = pages[i];
    absl::Status refused;
    if (!InRange(page)) {
      refused = RangeError(page);
    } else if (!pages_[page].cached) {
      refused = absl::FailedPreconditionError(absl::StrCat(
          "block pool: page ", page, " (position ", i, ") is not cached"));
    } else if (internal::FaultInjection::ShouldFail()) {
      refused = absl::FailedPreconditionError(absl::StrCat(
          "block pool: injected fault acquiring cached page ", page));
    } else if (pages_[page].refcount == max_refcount_) {
      refused = absl::FailedPreconditionError(
          absl::StrCat("block pool: cached page ", page, " (position ", i,
                       ") refcount is at the maximum ", max_refcount_));
    }
    if (!refused.ok()) {
      RollbackTransaction(savepoint).IgnoreError();  // Innermost: cannot fail.
      return refused;
    }
    if (pages_[page].refcount == 0) {
      const PageId prev = pages_[page].lru_prev;
      Unlink(page);
      pages_[page].refcount = 1;
      Journal(UndoRecord::Op::kRevive, page, prev);
      ++stats_.cache_revivals;
      NoteUsed();
    } else {
      ++pages_[page].refcount;
      Journal(UndoRecord::Op::kAddRef, page);
    }
  }
  stats_.cache_hits += static_cast<int64_t>(pages.size());
  return CommitTransaction(savepoint);
}

absl::Status BlockPool::ResetPrefixCache() {
  if (depth_ > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "block pool: cannot reset the prefix cache inside a transaction "
        "(depth ",
        depth_, ")"));
  }
  if (!host_copies_.empty() || !parked_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("block pool: cannot reset the prefix cache with ",
                     host_copies_.size(), " host copies and ", parked_.size(),
                     " parked pages not taken (TakeHostCopies)"));
  }
  while (!lru_holds_free() && num_evictable_ > 0) {
    const PageId page = pages_[num_pages_].lru_next;
    Unlink(page);
    free_stack_.push_back(page);
  }
  for (PageId page = 0; page < num_pages_; ++page) {
    PageState& state = pages_[page];
    state.cached = 0;
    state.dup_prev = state.dup_next = kNoPage;
  }
  index_->Clear();
  num_cached_ = 0;
  if (host_ != nullptr) host_->Clear();
  write_through_.clear();
  if (events_ != nullptr) events_->Cleared();
  return absl::OkStatus();
}

int32_t BlockPool::host_pages() const {
  return host_ != nullptr ? host_->num_pages() : 0;
}

int32_t BlockPool::NumHostCached() const {
  return host_ != nullptr ? host_->num_cached() : 0;
}

std::optional<HostPageId> BlockPool::HostLookup(const BlockHash& key) const {
  if (host_ == nullptr) return std::nullopt;
  const HostPageId page = host_->Find(key);
  if (page == kNoHostPage) return std::nullopt;
  return page;
}

absl::StatusOr<PageId> BlockPool::LoadFromHost(const BlockHash& key,
                                               int32_t group) {
  if (host_ == nullptr) {
    return absl::FailedPreconditionError(
        "block pool: LoadFromHost without a host tier (host_pages is 0)");
  }
  if (group < 0 || group >= kMaxKvCacheGroups) {
    return absl::InvalidArgumentError(absl::StrCat("block pool: group ", group,
                                                   " is not in [0, ",
                                                   kMaxKvCacheGroups, ")"));
  }
  const HostPageId host_page = host_->Find(key);
  if (host_page == kNoHostPage) {
    return absl::FailedPreconditionError(absl::StrCat(
        "block pool: the host tier does not hold ", ShortHash(key), "..."));
  }
  if (const std::optional<PageId> cached = Lookup(key)) {
    return absl::FailedPreconditionError(
        absl::StrCat("block pool: ", ShortHash(key),
                     "... is cached on device page ", *cached));
  }
  if (NumFree() == 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("block pool: no page to load into, all ", num_pages_,
                     " pages are in use"));
  }
  if (internal::FaultInjection::ShouldFail()) return InjectedAllocationFault();
  // Used by the batch first: the allocation may store an evicted page,
  // which never evicts a host page the batch uses.
  host_->Use(host_page, batch_);
  const PageId page = AllocateUnchecked();
  host_copies_.push_back({page, host_page, HostCopy::Direction::kHostToDevice});
  ++stats_.host_loads;
  // Cannot fail: `page` is used and uncached, `group` checked, and no page
  // is indexed under `key`.
  KVBLOCK_RETURN_IF_ERROR(RegisterCached(page, key, group).status());
  Stamp(page, kLoaded);
  return page;
}

absl::Status BlockPool::UseHostPages(absl::Span<const BlockHash> keys) {
  if (host_ == nullptr && !keys.empty()) {
    return absl::FailedPreconditionError(
        "block pool: UseHostPages without a host tier (host_pages is 0)");
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    if (host_->Find(keys[i]) == kNoHostPage) {
      return absl::FailedPreconditionError(
          absl::StrCat("block pool: the host tier does not hold key ", i, " (",
                       ShortHash(keys[i]), "...)"));
    }
  }
  for (const BlockHash& key : keys) host_->Use(host_->Find(key), batch_);
  return absl::OkStatus();
}

absl::Status BlockPool::TakeHostCopies(std::vector<HostCopy>& out) {
  if (depth_ > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "block pool: cannot take host copies inside a transaction (depth ",
        depth_, ")"));
  }
  out.insert(out.end(), host_copies_.begin(), host_copies_.end());
  host_copies_.clear();
  if (host_ == nullptr) return absl::OkStatus();
  if (batch_ == kBatchMask) {
    // Numbers start again at 1 (0 stamps nothing): no page may keep a stamp
    // of the batch that had it 2^29 - 1 batches ago.
    for (PageState& state : pages_) state.batch = 0;
    host_->ClearStamps();
    batch_ = 1;
  } else {
    ++batch_;
  }
  for (const PageId page : parked_) {
    pages_[page].batch &= ~kParked;
    KVBLOCK_RETURN_IF_ERROR(Release(page));  // cannot fail: it is used.
  }
  parked_.clear();
  for (const PageId page : write_through_) {
    // Computed by the batch's forward pass: stored in the next batch,
    // unless it left the cache or the host tier has its key.
    if (pages_[page].cached) StoreToHost(page);
  }
  write_through_.clear();
  return absl::OkStatus();
}

BlockPool::Savepoint BlockPool::BeginTransaction() {
  if (++depth_ == 1 && host_ != nullptr) host_->set_journaling(true);
  return Savepoint{
      .depth = depth_,
      .journal_size = journal_.size(),
      .stats = stats_,
      .events =
          events_ != nullptr ? events_->mark() : internal::CacheEventLogMark{},
      .host_journal_size = host_ != nullptr ? host_->journal_size() : 0,
      .host_copies = host_copies_.size(),
      .parked = parked_.size(),
      .write_through = write_through_.size()};
}

absl::Status BlockPool::CommitTransaction(const Savepoint& savepoint) {
  if (savepoint.depth != depth_ || savepoint.journal_size > journal_.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "block pool: savepoint of depth ", savepoint.depth,
        " is not the innermost open transaction (depth ", depth_, ")"));
  }
  if (--depth_ == 0) {
    journal_.clear();
    if (host_ != nullptr) {
      host_->ForgetJournal();
      host_->set_journaling(false);
    }
  }
  return absl::OkStatus();
}

absl::Status BlockPool::RollbackTransaction(const Savepoint& savepoint) {
  if (savepoint.depth != depth_ || savepoint.journal_size > journal_.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "block pool: savepoint of depth ", savepoint.depth,
        " is not the innermost open transaction (depth ", depth_, ")"));
  }
  while (journal_.size() > savepoint.journal_size) {
    Undo(journal_.back());
    journal_.pop_back();
  }
  if (host_ != nullptr) {
    host_->Rollback(savepoint.host_journal_size);
    host_copies_.resize(savepoint.host_copies);
    parked_.resize(savepoint.parked);
    write_through_.resize(savepoint.write_through);
  }
  stats_ = savepoint.stats;
  if (events_ != nullptr) events_->Truncate(savepoint.events);
  if (--depth_ == 0 && host_ != nullptr) host_->set_journaling(false);
  return absl::OkStatus();
}

void BlockPool::Recache(PageId page, const BlockHash& hash, PageId prev) {
  PageState& state = pages_[page];
  state.hash = hash;
  state.tag = PrefixIndex::Tag(hash);
  ++num_cached_;
  if (prev != kNoPage) {
    // Back behind `prev`: link it in as the last page after `prev`'s.
    state.cached = kDuplicate;
    PageState& before = pages_[prev];
    if (before.dup_next == kNoPage) before.dup_next = before.dup_prev = prev;
    const PageId next = before.dup_next;
    state.dup_prev = prev;
    state.dup_next = next;
    before.dup_next = page;
    pages_[next].dup_prev = page;
    return;
  }
  state.cached = kIndexed;
  // Room by construction: the page was indexed before the change undone.
  const PageId indexed = index_->Insert(state.tag, hash, page, hash_of());
  assert(indexed != kNoPage);
  if (indexed != page) {
    // It answered lookups before the page now indexed: first again.
    [[maybe_unused]] const bool replaced =
        index_->Replace(state.tag, indexed, page);
    assert(replaced);
    pages_[indexed].cached = kDuplicate;
    LinkDuplicate(indexed, page);
  }
}

// Records are undone newest first, so the pool is exactly as it was right
// after the recorded change: the free-stack top, the LRU head and tail, and a
// revived page's old neighbour are where the change left them.
void BlockPool::Undo(const UndoRecord& record) {
  const PageId page = record.page;
  switch (record.op) {
    case UndoRecord::Op::kPopFree:
      pages_[page].refcount = 0;
      free_stack_.push_back(page);
      break;
    case UndoRecord::Op::kEvict:
      pages_[page].refcount = 0;
      Recache(page, record.hash, record.prev);
      LinkAfter(num_pages_, page);
      break;
    case UndoRecord::Op::kPopLru:
      pages_[page].refcount = 0;
      LinkAfter(num_pages_, page);
      break;
    case UndoRecord::Op::kAddRef:
      --pages_[page].refcount;
      break;
    case UndoRecord::Op::kDropRef:
      ++pages_[page].refcount;
      break;
    case UndoRecord::Op::kPushFree:
      free_stack_.pop_back();
      pages_[page].refcount = 1;
      break;
    case UndoRecord::Op::kAppendLru:
      Unlink(page);
      pages_[page].refcount = 1;
      break;
    case UndoRecord::Op::kRevive:
      pages_[page].refcount = 0;
      LinkAfter(record.prev, page);
      break;
    case UndoRecord::Op::kRegister:
      Unindex(page);
      pages_[page].group = record.group;
      pages_[page].batch = static_cast<uint32_t>(record.prev);
      break;
    case UndoRecord::Op::kUncache:
      Recache(page, record.hash, record.prev);
      break;
    case UndoRecord::Op::kUncacheFree:
      free_stack_.pop_back();
      Recache(page, record.hash, record.prev);
      LinkAfter(record.lru_prev, page);
      break;
    case UndoRecord::Op::kStamp:
      pages_[page].batch = static_cast<uint32_t>(record.prev);
      break;
  }
}

absl::Status BlockPool::CheckInvariants() const {
  auto broken = [](auto&&... parts) {
    return absl::InternalError(absl::StrCat("block pool: ", parts...));
  };
  // Used pages are on no list, evictable ones on the LRU list.
  std::vector<internal::Listed> listed;
  int32_t walked = 0;
  KVBLOCK_RETURN_IF_ERROR(internal::ListPages<PageState>(
      "block pool", free_stack_, pages_, listed, walked));
  if (walked != num_evictable_) {
    return broken("lru list holds ", walked, " pages, counted ",
                  num_evictable_);
  }
  int32_t num_cached = 0;
  int32_t num_indexed = 0;
  int32_t num_used = 0;
  for (PageId page = 0; page < num_pages_; ++page) {
    const int32_t refcount = pages_[page].refcount;
    if (refcount < 0 || refcount > max_refcount_) {
      return broken("page ", page, " has refcount ", refcount);
    }
    using internal::Listed;
    const Listed expected = refcount > 0 ? Listed::kOnNone
                            : (pages_[page].cached || lru_holds_free())
                                ? Listed::kLru
                                : Listed::kFree;
    if (listed[page] != expected) {
      return broken("page ", page, " (refcount ", refcount, ", cached ",
                    static_cast<int>(pages_[page].cached), ") is listed as ",
                    static_cast<int>(listed[page]), ", expected ",
                    static_cast<int>(expected));
    }
    if (listed[page] != Listed::kLru && (pages_[page].lru_prev != kNoPage ||
                                         pages_[page].lru_next != kNoPage)) {
      return broken("page ", page, " is off the lru list but linked");
    }
    num_used += refcount > 0 ? 1 : 0;
    KVBLOCK_RETURN_IF_ERROR(CheckCachedPage(page));
    if (pages_[page].cached == kIndexed) ++num_indexed;
    if (pages_[page].cached) ++num_cached;
  }
  KVBLOCK_RETURN_IF_ERROR(index_->CheckInvariants(hash_of()));
  if (num_indexed != index_->size() || num_cached != NumCached()) {
    return broken("index holds ", index_->size(), " hashes for ", num_indexed,
                  " indexed pages; ", num_cached, " cached pages, counted ",
                  NumCached());
  }
  if (num_used != NumUsed() || stats_.peak_used < num_used) {
    return broken(num_used, " pages used, counted ", NumUsed(), ", peak ",
                  stats_.peak_used);
  }
  if (depth_ < 0 || (depth_ == 0 && !journal_.empty())) {
    return broken("journal holds ", journal_.size(), " records at depth ",
                  depth_);
  }
  if (host_ != nullptr) return CheckHostTier();
  if (!host_copies_.empty() || !parked_.empty() || !write_through_.empty()) {
    return broken("host copies or pages listed without a host tier");
  }
  return absl::OkStatus();
}

absl::Status BlockPool::CheckHostTier() const {
  auto broken = [](auto&&... parts) {
    return absl::InternalError(absl::StrCat("block pool: ", parts...));
  };
  KVBLOCK_RETURN_IF_ERROR(host_->CheckInvariants());
  std::vector<int32_t> parked(num_pages_, 0);
  for (const PageId page : parked_) {
    if (!InRange(page) || !CopiedInBatch(page) ||
        (pages_[page].batch & kParked) == 0) {
      return broken("parked page ", page,
                    " is not stamped as copied and parked in the open batch");
    }
    if (++parked[page] > 1 || pages_[page].refcount < 1) {
      return broken("parked page ", page, " is parked ", parked[page],
                    " times with refcount ", pages_[page].refcount);
    }
  }
  for (PageId page = 0; page < num_pages_; ++page) {
    if ((pages_[page].batch & kParked) != 0 && parked[page] == 0) {
      return broken("page ", page, " is stamped parked but not parked");
    }
  }
  std::vector<uint8_t> loaded(num_pages_, 0);
  std::vector<uint8_t> stored(host_->num_pages(), 0);
  std::vector<uint8_t> loaded_from(host_->num_pages(), 0);
  for (const HostCopy& copy : host_copies_) {
    if (!InRange(copy.device_page) || copy.host_page < 0 ||
        copy.host_page >= host_->num_pages()) {
      return broken("host copy of device page ", copy.device_page,
                    " and host page ", copy.host_page, " is out of range");
    }
    if (!host_->UsedBy(copy.host_page, batch_)) {
      return broken("host page ", copy.host_page,
                    " is copied but not stamped with the open batch");
    }
    const bool load = copy.direction == HostCopy::Direction::kHostToDevice;
    // A load's page stays the batch's until the batch is taken: held (or
    // parked) and stamped loaded. The stores run first, so a store listed
    // after a load from its host page would overwrite what the load reads.
    if (load) {
      if (pages_[copy.device_page].refcount < 1 ||
          !LoadedInBatch(copy.device_page)) {
        return broken("device page ", copy.device_page, " (refcount ",
                      pages_[copy.device_page].refcount,
                      ") loaded from host page ", copy.host_page,
                      " is not held and stamped loaded");
      }
      loaded_from[copy.host_page] = 1;
    } else if (loaded_from[copy.host_page] != 0) {
      return broken("host page ", copy.host_page,
                    " is stored into after a load from it");
    }
    uint8_t& written = load ? loaded[copy.device_page] : stored[copy.host_page];
    if (written++ != 0) {
      return broken(load ? "device page " : "host page ",
                    load ? copy.device_page : copy.host_page,
                    " is written twice in the open batch");
    }
  }
  for (const PageId page : write_through_) {
    if (!InRange(page)) return broken("write-through page ", page);
  }
  return absl::OkStatus();
}

absl::Status BlockPool::CheckCachedPage(PageId page) const {
  auto broken = [page](auto&&... parts) {
    return absl::InternalError(
        absl::StrCat("block pool: cached page ", page, parts...));
  };
  const PageState& state = pages_[page];
  if (!state.cached) {
    if (state.dup_next != kNoPage || state.dup_prev != kNoPage) {
      return absl::InternalError(absl::StrCat(
          "block pool: page ", page, " is not cached but has duplicates"));
    }
    return absl::OkStatus();
  }
  if (state.tag != PrefixIndex::Tag(state.hash)) {
    return broken(" keeps a tag not of its hash");
  }
  const PageId indexed = index_->Find(state.hash, hash_of());
  if (state.cached == kIndexed ? indexed != page
                               : indexed == kNoPage || indexed == page ||
                                     pages_[indexed].cached != kIndexed) {
    return broken(" (state ", static_cast<int>(state.cached),
                  ") is not indexed under its hash as its state says (the "
                  "index finds ",
                  indexed, ")");
  }
  if ((state.dup_next == kNoPage) != (state.dup_prev == kNoPage) ||
      (state.dup_next == kNoPage && state.cached != kIndexed)) {
    return broken(" is half linked among its duplicates");
  }
  if (state.dup_next == kNoPage) return absl::OkStatus();
  if (!index_duplicates_ && state.cached == kDuplicate && state.refcount == 0) {
    return broken(" is an unused duplicate without index_duplicates");
  }
  const PageState& next = pages_[state.dup_next];
  if (next.dup_prev != page || !next.cached || !(next.hash == state.hash) ||
      state.dup_next == page) {
    return broken(" links to duplicate ", state.dup_next,
                  ", which does not link back or is cached otherwise");
  }
  return absl::OkStatus();
}

BlockPoolSnapshot BlockPool::Snapshot() const {
  BlockPoolSnapshot snapshot;
  snapshot.refcounts.reserve(num_pages_);
  for (PageId page = 0; page < num_pages_; ++page) {
    snapshot.refcounts.push_back(pages_[page].refcount);
  }
  snapshot.free_stack = free_stack_;
  snapshot.lru.reserve(num_evictable_);
  for (PageId page = pages_[num_pages_].lru_next; page != num_pages_;
       page = pages_[page].lru_next) {
    snapshot.lru.push_back(page);
  }
  for (PageId page = 0; page < num_pages_; ++page) {
    if (pages_[page].cached)
      snapshot.cached.emplace_back(page, pages_[page].hash);
  }
  // Each ring from its indexed page, the rings by their smallest page id.
  for (PageId page = 0; page < num_pages_; ++page) {
    if (pages_[page].cached != kIndexed || pages_[page].dup_next == kNoPage) {
      continue;
    }
    std::vector<PageId>& ring = snapshot.duplicates.emplace_back();
    PageId member = page;
    do {
      ring.push_back(member);
      member = pages_[member].dup_next;
    } while (member != page && ring.size() <= static_cast<size_t>(num_pages_));
  }
  std::sort(snapshot.duplicates.begin(), snapshot.duplicates.end(),
            [](const std::vector<PageId>& a, const std::vector<PageId>& b) {
              return *std::min_element(a.begin(), a.end()) <
                     *std::min_element(b.begin(), b.end());
            });
  snapshot.stats = stats_;
  if (host_ != nullptr) {
    snapshot.host_lru = host_->LruOrder();
    snapshot.host_cached = host_->Cached();
    snapshot.host_free = host_->FreeStack();
    snapshot.host_used = host_->UsedBy(batch_);
    snapshot.host_copies = host_copies_;
    for (PageId page = 0; page < num_pages_; ++page) {
      if (CachedInBatch(page)) snapshot.fresh_pages.push_back(page);
      if (LoadedInBatch(page)) snapshot.loaded_pages.push_back(page);
    }
    snapshot.parked = parked_;
    snapshot.write_through = write_through_;
  }
  return snapshot;
}

}  // namespace kvblock
