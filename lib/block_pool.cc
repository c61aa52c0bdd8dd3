// Copyright 2026 The kvblock Authors.
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
#include "cache_event_log.h"
#include "fault_injection.h"
#include "kvblock/status_macros.h"
#include "prefix_index.h"
#include "reservation.h"

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
      " peak_used=", stats.peak_used, "\n");
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
  internal::Reservation reservation("block pool");
  reservation.Add(int64_t{num_pages} + 1, sizeof(PageState));
  reservation.Add(1, PrefixIndex::ReservedBytes(num_pages));
  reservation.Add(num_pages, sizeof(PageId));  // the free stack.
  reservation.Add(options.journal_reserve, sizeof(UndoRecord));
  KVBLOCK_RETURN_IF_ERROR(reservation.Check());
  std::unique_ptr<BlockPool> pool;
  KVBLOCK_RETURN_IF_ERROR(
      reservation.Run([&] { pool.reset(new BlockPool(num_pages, options)); }));
  return pool;
}

BlockPool::BlockPool(int32_t num_pages, const BlockPoolOptions& options)
    : num_pages_(num_pages),
      max_refcount_(options.max_refcount),
      pages_(num_pages + 1),
      index_(std::make_unique<PrefixIndex>(num_pages)) {
  pages_[num_pages_].lru_prev = num_pages_;
  pages_[num_pages_].lru_next = num_pages_;
  free_stack_.reserve(num_pages_);
  for (PageId page = num_pages_ - 1; page >= 0; --page) {
    free_stack_.push_back(page);
  }
  journal_.reserve(options.journal_reserve);
}

BlockPool::~BlockPool() = default;

int32_t BlockPool::NumCached() const { return index_->size(); }

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
  return absl::FailedPreconditionError(
      absl::StrCat("block pool: page ", page, " is not in use (",
                   pages_[page].cached ? "evictable" : "free", ")"));
}

inline void BlockPool::Journal(UndoRecord::Op op, PageId page, PageId prev,
                               const BlockHash& hash) {
  if (depth_ == 0) return;
  // Written in place: a record built on the stack and copied out stalls on
  // store forwarding (its copy reads across the narrower stores).
  UndoRecord& record = journal_.emplace_back();
  record.op = op;
  record.page = page;
  record.prev = prev;
  record.hash = hash;
}

inline void BlockPool::LinkAfter(PageId prev, PageId page) {
  const PageId next = pages_[prev].lru_next;
  pages_[page].lru_prev = prev;
  pages_[page].lru_next = next;
  pages_[prev].lru_next = page;
  pages_[next].lru_prev = page;
  ++num_evictable_;
}

inline void BlockPool::Unlink(PageId page) {
  const PageId prev = pages_[page].lru_prev;
  const PageId next = pages_[page].lru_next;
  pages_[prev].lru_next = next;
  pages_[next].lru_prev = prev;
  pages_[page].lru_prev = kNoPage;
  pages_[page].lru_next = kNoPage;
  --num_evictable_;
}

inline void BlockPool::PrefetchNextEvictions(PageId victim) const {
  // The next victim's line came in at the eviction before this one: its
  // tag names the index bucket that eviction will erase from; the victim
  // after it is the line to bring in for the eviction after that. An LRU
  // change in between only wastes a prefetch.
  const PageState& next = pages_[pages_[victim].lru_next];
  index_->Prefetch(next.tag);
  __builtin_prefetch(&pages_[next.lru_next]);
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
    // Holds by construction: every cached page is indexed (CheckInvariants).
    [[maybe_unused]] const bool erased = index_->Erase(pages_[page].tag, page);
    assert(erased);
    pages_[page].cached = 0;
    ++stats_.evictions;
    Journal(UndoRecord::Op::kEvict, page, kNoPage, pages_[page].hash);
    if (events_ != nullptr) events_->Removed(pages_[page].hash);
  }
  pages_[page].refcount = 1;
  ++stats_.allocations;
  NoteUsed();
  return page;
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
  if (--pages_[page].refcount > 0) {
    Journal(UndoRecord::Op::kDropRef, page);
  } else if (pages_[page].cached) {
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
        [[maybe_unused]] const bool erased =
            index_->Erase(pages_[page].tag, page);
        assert(erased);
        pages_[page].cached = 0;
        Journal(UndoRecord::Op::kUncache, page, kNoPage, pages_[page].hash);
        if (events_ != nullptr) events_->Removed(pages_[page].hash);
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
  ++stats_.cow_copies;
  return CopyOnWrite{CopyOnWrite::Kind::kCopy, destination, page};
}

absl::StatusOr<PageId> BlockPool::RegisterCached(PageId page,
                                                 const BlockHash& hash) {
  if (!IsUsed(page)) return UnusedError(page);
  if (pages_[page].cached) {
    if (pages_[page].hash == hash) {
      if (events_ != nullptr) events_->Registered(hash, /*stored=*/false);
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
  if (events_ != nullptr) events_->Registered(hash, indexed == page);
  if (indexed != page) return indexed;
  pages_[page].cached = 1;
  pages_[page].hash = hash;
  pages_[page].tag = tag;
  ++stats_.cache_registrations;
  Journal(UndoRecord::Op::kRegister, page, kNoPage, hash);
  return page;
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
  while (num_evictable_ > 0) {
    const PageId page = pages_[num_pages_].lru_next;
    Unlink(page);
    free_stack_.push_back(page);
  }
  index_->ForEach([this](PageId page) { pages_[page].cached = 0; });
  index_->Clear();
  if (events_ != nullptr) events_->Cleared();
  return absl::OkStatus();
}

BlockPool::Savepoint BlockPool::BeginTransaction() {
  ++depth_;
  Savepoint savepoint{depth_, journal_.size(), stats_};
  if (events_ != nullptr) {
    const internal::CacheEventLog::Mark mark = events_->mark();
    savepoint.event_records = mark.records;
    savepoint.event_runs = mark.runs;
    savepoint.event_hashes = mark.hashes;
  }
  return savepoint;
}

absl::Status BlockPool::CommitTransaction(const Savepoint& savepoint) {
  if (savepoint.depth != depth_ || savepoint.journal_size > journal_.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "block pool: savepoint of depth ", savepoint.depth,
        " is not the innermost open transaction (depth ", depth_, ")"));
  }
  if (--depth_ == 0) journal_.clear();
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
  stats_ = savepoint.stats;
  if (events_ != nullptr) {
    events_->Truncate({savepoint.event_records, savepoint.event_runs,
                       savepoint.event_hashes});
  }
  --depth_;
  return absl::OkStatus();
}

void BlockPool::Recache(PageId page, const BlockHash& hash) {
  PageState& state = pages_[page];
  state.cached = 1;
  state.hash = hash;
  state.tag = PrefixIndex::Tag(hash);
  // Room by construction: the page was indexed before the change undone.
  [[maybe_unused]] const PageId indexed =
      index_->Insert(state.tag, hash, page, hash_of());
  assert(indexed == page);
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
      Recache(page, record.hash);
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
    case UndoRecord::Op::kRegister: {
      [[maybe_unused]] const bool erased =
          index_->Erase(pages_[page].tag, page);
      assert(erased);
      pages_[page].cached = 0;
      break;
    }
    case UndoRecord::Op::kUncache:
      Recache(page, record.hash);
      break;
  }
}

absl::Status BlockPool::CheckInvariants() const {
  auto broken = [](auto&&... parts) {
    return absl::InternalError(absl::StrCat("block pool: ", parts...));
  };
  // 0 = used, 1 = free, 2 = evictable, as seen from the lists.
  std::vector<uint8_t> listed(num_pages_, 0);
  for (PageId page : free_stack_) {
    if (page < 0 || page >= num_pages_) {
      return broken("free stack holds bad page ", page);
    }
    if (listed[page] != 0) return broken("page ", page, " is free twice");
    listed[page] = 1;
  }
  int32_t walked = 0;
  for (PageId prev = num_pages_, page = pages_[num_pages_].lru_next;
       page != num_pages_; prev = page, page = pages_[page].lru_next) {
    if (page < 0 || page >= num_pages_ || walked == num_pages_) {
      return broken("lru list is broken at page ", page);
    }
    if (pages_[page].lru_prev != prev) {
      return broken("lru page ", page, " links back to ", pages_[page].lru_prev,
                    ", not ", prev);
    }
    if (listed[page] != 0) {
      return broken("lru page ", page, " is also on another list");
    }
    listed[page] = 2;
    ++walked;
  }
  if (walked != num_evictable_) {
    return broken("lru list holds ", walked, " pages, counted ",
                  num_evictable_);
  }
  int32_t num_cached = 0;
  int32_t num_used = 0;
  for (PageId page = 0; page < num_pages_; ++page) {
    const int32_t refcount = pages_[page].refcount;
    if (refcount < 0 || refcount > max_refcount_) {
      return broken("page ", page, " has refcount ", refcount);
    }
    const uint8_t expected = refcount > 0 ? 0 : pages_[page].cached ? 2 : 1;
    if (listed[page] != expected) {
      return broken("page ", page, " (refcount ", refcount, ", cached ",
                    static_cast<int>(pages_[page].cached), ") is listed as ",
                    static_cast<int>(listed[page]), ", expected ",
                    static_cast<int>(expected));
    }
    if (listed[page] != 2 && (pages_[page].lru_prev != kNoPage ||
                              pages_[page].lru_next != kNoPage)) {
      return broken("page ", page, " is off the lru list but linked");
    }
    num_used += refcount > 0 ? 1 : 0;
    if (pages_[page].cached) {
      ++num_cached;
      if (index_->Find(pages_[page].hash, hash_of()) != page) {
        return broken("cached page ", page, " is not indexed under its hash");
      }
      if (pages_[page].tag != PrefixIndex::Tag(pages_[page].hash)) {
        return broken("cached page ", page, " keeps a tag not of its hash");
      }
    }
  }
  KVBLOCK_RETURN_IF_ERROR(index_->CheckInvariants(hash_of()));
  if (num_cached != NumCached()) {
    return broken("index holds ", NumCached(), " hashes for ", num_cached,
                  " cached pages");
  }
  if (num_used != NumUsed() || stats_.peak_used < num_used) {
    return broken(num_used, " pages used, counted ", NumUsed(), ", peak ",
                  stats_.peak_used);
  }
  if (depth_ < 0 || (depth_ == 0 && !journal_.empty())) {
    return broken("journal holds ", journal_.size(), " records at depth ",
                  depth_);
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
  snapshot.stats = stats_;
  return snapshot;
}

}  // namespace kvblock
