// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "cache/host_tier.h"

#include <cassert>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/page_lists.h"
#include "kvblock/status_macros.h"

namespace kvblock::internal {

HostTier::HostTier(int32_t num_pages, int32_t journal_reserve)
    : num_pages_(num_pages),
      pages_(static_cast<size_t>(num_pages) + 1),
      // The index's room: one entry a page, as the device pool's. Twice
      // that would stop more of a store's searches (which mostly miss) in
      // the home bucket, but each store's random bucket then comes from an
      // index twice as large, out of the cache sooner: on the serving
      // workload one entry a page is 0.4 to 0.6 us a step faster.
      index_(std::make_unique<PrefixIndex>(num_pages)) {
  free_.reserve(num_pages);
  Clear();
  journal_.reserve(journal_reserve);
}

HostTier::~HostTier() = default;

int64_t HostTier::ReservedBytes(int32_t num_pages, int32_t journal_reserve) {
  return (int64_t{num_pages} + 1) * int64_t{sizeof(PageState)} +
         int64_t{num_pages} * int64_t{sizeof(HostPageId)} +
         PrefixIndex::ReservedBytes(num_pages) +
         int64_t{journal_reserve} * int64_t{sizeof(UndoRecord)};
}

HostPageId HostTier::Find(const BlockHash& key) const {
  return Find(key, PrefixIndex::Tag(key));
}

HostPageId HostTier::Find(const BlockHash& key, uint32_t tag) const {
  return index_->Find(tag, key, key_of());
}

void HostTier::Index(HostPageId page, const BlockHash& key, uint32_t tag,
                     int32_t group, const PrefixIndex::Place& place) {
  PageState& state = pages_[page];
  state.key = key;
  state.tag = tag;
  state.group = static_cast<uint8_t>(group);
  state.cached = 1;
  index_->InsertAt(place, tag, page);
  ++num_cached_;
}

void HostTier::Unindex(HostPageId page) {
  [[maybe_unused]] const bool erased = index_->Erase(pages_[page].tag, page);
  assert(erased);
  pages_[page].cached = 0;
  --num_cached_;
}

HostTier::Stored HostTier::Store(const BlockHash& key, uint32_t tag,
                                 int32_t group, uint32_t batch) {
  Stored stored;
  const PrefixIndex::Place place = index_->Locate(tag, key, key_of());
  if (place.found != kNoPage) {
    stored.page = place.found;
    return stored;
  }
  // Room by construction: at most num_pages_ keys, each cached once.
  assert(place.bucket != PrefixIndex::kNoBucket);
  HostPageId page;
  UndoRecord record{};
  if (!free_.empty()) {
    page = free_.back();
    free_.pop_back();
    record.op = UndoRecord::Op::kStoreFree;
  } else {
    page = pages_[num_pages_].lru_next;
    if (page == num_pages_ || pages_[page].batch == batch) return stored;
    PrefetchAfter(page);
    record.op = UndoRecord::Op::kStoreEvict;
    record.key = pages_[page].key;
    record.group = pages_[page].group;
    stored.evicted = {true, pages_[page].key, pages_[page].group};
    Unlink(pages_, page);
    // An erase leaves the free entry `place` names free.
    Unindex(page);
  }
  record.page = page;
  record.batch = pages_[page].batch;
  if (journaling_) journal_.push_back(record);
  Index(page, key, tag, group, place);
  pages_[page].batch = batch;
  LinkAfter(pages_, tail(), page);
  stored.page = page;
  stored.is_new = true;
  return stored;
}

void HostTier::Use(HostPageId page, uint32_t batch) {
  PageState& state = pages_[page];
  if (journaling_) {
    journal_.push_back({.op = UndoRecord::Op::kUse,
                        .group = 0,
                        .page = page,
                        .lru_prev = state.lru_prev,
                        .batch = state.batch,
                        .key = {}});
  }
  assert(batch != 0);
  Unlink(pages_, page);
  LinkAfter(pages_, tail(), page);
  state.batch = batch;
}

void HostTier::PrefetchStore(uint32_t tag) const {
  index_->Prefetch(tag);
  // The head's own line and bucket: Store asked for them when it dropped
  // the heads before it (PrefetchAfter).
}

void HostTier::PrefetchAfter(HostPageId dropped) const {
  // Two stores ahead: the head after next came in at the store before this
  // one, its tag names its bucket; the line after it is asked for now.
  const PageState& next = pages_[pages_[dropped].lru_next];
  const PageState& after = pages_[next.lru_next];
  index_->Prefetch(after.tag);
  __builtin_prefetch(&pages_[after.lru_next]);
}

void HostTier::Rollback(size_t mark) {
  while (journal_.size() > mark) {
    const UndoRecord& record = journal_.back();
    const HostPageId page = record.page;
    switch (record.op) {
      case UndoRecord::Op::kStoreFree:
        Unlink(pages_, page);
        Unindex(page);
        free_.push_back(page);
        break;
      case UndoRecord::Op::kStoreEvict:
        // It was the head when it was evicted.
        Unlink(pages_, page);
        Unindex(page);
        {
          const uint32_t tag = PrefixIndex::Tag(record.key);
          Index(page, record.key, tag, record.group,
                index_->Locate(tag, record.key, key_of()));
        }
        LinkAfter(pages_, num_pages_, page);
        break;
      case UndoRecord::Op::kUse:
        Unlink(pages_, page);
        LinkAfter(pages_, record.lru_prev, page);
        break;
    }
    pages_[page].batch = record.batch;
    journal_.pop_back();
  }
}

void HostTier::ClearStamps() {
  for (PageState& state : pages_) state.batch = 0;
}

void HostTier::Clear() {
  for (PageState& state : pages_) state = PageState{};
  pages_[num_pages_].lru_prev = num_pages_;
  pages_[num_pages_].lru_next = num_pages_;
  free_.clear();
  for (HostPageId page = num_pages_ - 1; page >= 0; --page) {
    free_.push_back(page);
  }
  index_->Clear();
  num_cached_ = 0;
  journal_.clear();
}

absl::Status HostTier::CheckInvariants() const {
  auto broken = [](auto&&... parts) {
    return absl::InternalError(absl::StrCat("host tier: ", parts...));
  };
  std::vector<Listed> listed;
  int32_t lru_pages = 0;
  KVBLOCK_RETURN_IF_ERROR(
      ListPages<PageState>("host tier", free_, pages_, listed, lru_pages));
  int32_t cached = 0;
  for (HostPageId page = 0; page < num_pages_; ++page) {
    const PageState& state = pages_[page];
    if (listed[page] == Listed::kOnNone) {
      return broken("page ", page, " is on no list");
    }
    if ((listed[page] == Listed::kLru) != (state.cached != 0)) {
      return broken("page ", page, " (cached ", static_cast<int>(state.cached),
                    ") is on the wrong list");
    }
    if (!state.cached) continue;
    ++cached;
    if (state.tag != PrefixIndex::Tag(state.key) || Find(state.key) != page) {
      return broken("cached page ", page, " is not indexed under its key");
    }
  }
  if (cached != num_cached_ || index_->size() != num_cached_) {
    return broken(cached, " cached pages, counted ", num_cached_, ", indexed ",
                  index_->size());
  }
  return index_->CheckInvariants(key_of());
}

std::vector<HostPageId> HostTier::LruOrder() const {
  std::vector<HostPageId> order;
  order.reserve(num_cached_);
  for (HostPageId page = pages_[num_pages_].lru_next; page != num_pages_;
       page = pages_[page].lru_next) {
    order.push_back(page);
  }
  return order;
}

std::vector<std::pair<HostPageId, BlockHash>> HostTier::Cached() const {
  std::vector<std::pair<HostPageId, BlockHash>> cached;
  cached.reserve(num_cached_);
  for (HostPageId page = 0; page < num_pages_; ++page) {
    if (pages_[page].cached) cached.emplace_back(page, pages_[page].key);
  }
  return cached;
}

std::vector<HostPageId> HostTier::UsedBy(uint32_t batch) const {
  std::vector<HostPageId> used;
  for (HostPageId page = 0; page < num_pages_; ++page) {
    if (pages_[page].batch == batch) used.push_back(page);
  }
  return used;
}

}  // namespace kvblock::internal
