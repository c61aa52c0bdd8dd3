// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "kvblock/group_cache_hit.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "kvblock/kv_cache_groups.h"
#include "kvblock/status_macros.h"

namespace kvblock {
namespace {

// One bit per kind (at most kMaxKvCacheGroups of them).
using KindMask = uint64_t;
static_assert(kMaxKvCacheGroups <= 64);

}  // namespace

absl::StatusOr<GroupCacheHitFinder> GroupCacheHitFinder::Create(
    absl::Span<const KvCacheGroupSpec> groups, PageId null_page) {
  KVBLOCK_RETURN_IF_ERROR(ValidateKvCacheGroups(groups));
  KVBLOCK_RETURN_IF_ERROR(ValidateGroupCacheHits(groups));
  GroupCacheHitFinder finder;
  finder.num_groups_ = static_cast<int32_t>(groups.size());
  finder.null_page_ = null_page;
  finder.alignment_tokens_ = AlignmentTokens(groups);
  for (int32_t g = 0; g < finder.num_groups_; ++g) {
    auto same = std::find_if(
        finder.kinds_.begin(), finder.kinds_.end(),
        [&](const Kind& kind) { return SameAttention(kind.spec, groups[g]); });
    if (same == finder.kinds_.end()) {
      finder.kinds_.push_back(Kind{.spec = groups[g], .groups = {}});
      same = finder.kinds_.end() - 1;
    }
    same->groups.push_back(g);
    same->eagle = same->eagle || groups[g].eagle;
  }
  // Full attention first: its left-to-right scan bounds the others.
  std::stable_partition(
      finder.kinds_.begin(), finder.kinds_.end(),
      [](const Kind& kind) { return kind.spec.kind == AttentionKind::kFull; });
  return finder;
}

void GroupCacheHitFinder::Find(int64_t max_length, GroupPageLookup lookup,
                               GroupCacheHit& hit) const {
  hit.pages.resize(num_groups_);
  for (std::vector<PageId>& pages : hit.pages) pages.clear();
  hit.hit_tokens = 0;
  if (max_length <= 0) return;
  if (num_groups_ == 1) {
    const Kind& kind = kinds_[0];
    hit.hit_tokens = FindKind(kind, max_length, kind.eagle, lookup, hit) *
                     kind.spec.page_size;
    return;
  }
  const bool one_round =
      kinds_.size() == 2 && kinds_[0].spec.kind == AttentionKind::kFull;
  KindMask looked_up = 0;
  // Kinds whose EAGLE drop holds at the current candidate length.
  KindMask eagle_verified = 0;
  int64_t hit_length = max_length;
  while (true) {
    int64_t length = hit_length;
    for (size_t k = 0; k < kinds_.size(); ++k) {
      const Kind& kind = kinds_[k];
      const int32_t page_size = kind.spec.page_size;
      const KindMask bit = KindMask{1} << k;
      if (kind.spec.kind == AttentionKind::kFull && (looked_up & bit) != 0) {
        length = length / page_size * page_size;  // downward closed.
        continue;
      }
      const bool eagle = kind.eagle && (eagle_verified & bit) == 0;
      // EAGLE matches one page more, then drops it.
      const int64_t search =
          eagle ? (length > max_length - page_size ? max_length
                                                   : length + page_size)
                : length;
      const int64_t found =
          FindKind(kind, search, eagle, lookup, hit) * page_size;
      if (eagle) {
        eagle_verified |= bit;
      } else if (found < length) {
        eagle_verified = 0;
      }
      length = found;
      looked_up |= bit;
    }
    if (length >= hit_length) break;
    hit_length = length;
    if (one_round) break;
  }
  for (const Kind& kind : kinds_) {
    if (kind.spec.kind == AttentionKind::kFull) {
      Resize(kind, hit_length / kind.spec.page_size, null_page_, hit);
    }
  }
  hit.hit_tokens = hit_length;
}

int64_t GroupCacheHitFinder::FindKind(const Kind& kind, int64_t max_length,
                                      bool eagle, GroupPageLookup lookup,
                                      GroupCacheHit& hit) const {
  switch (kind.spec.kind) {
    case AttentionKind::kFull:
      return FindFull(kind, max_length, eagle, lookup, hit);
    case AttentionKind::kSlidingWindow:
      return FindSlidingWindow(kind, max_length, eagle, lookup, hit);
    case AttentionKind::kChunkedLocal:
      return FindChunkedLocal(kind, max_length, lookup, hit);
  }
  return 0;
}

int64_t GroupCacheHitFinder::FindFull(const Kind& kind, int64_t max_length,
                                      bool eagle, GroupPageLookup lookup,
                                      GroupCacheHit& hit) const {
  Resize(kind, 0, null_page_, hit);
  int64_t pages = Extend(kind, max_length / kind.spec.page_size, lookup, hit);
  if (eagle && pages > 0) --pages;
  Resize(kind, pages, null_page_, hit);
  return Align(kind, pages, hit);
}

int64_t GroupCacheHitFinder::FindSlidingWindow(const Kind& kind,
                                               int64_t max_length, bool eagle,
                                               GroupPageLookup lookup,
                                               GroupCacheHit& hit) const {
  const int64_t page_size = kind.spec.page_size;
  // The pages before a hit's end its window reads (the token after the hit
  // is in its own window); EAGLE needs one more, then drops it.
  const int64_t needed =
      (kind.spec.sliding_window - 1 + page_size - 1) / page_size +
      (eagle ? 1 : 0);
  const int64_t max_pages = max_length / page_size;
  for (int32_t g : kind.groups) hit.pages[g].assign(max_pages, null_page_);
  int64_t run = 0;  // cached pages from `page` on.
  int64_t pages = -1;
  for (int64_t page = max_pages - 1; page >= 0; --page) {
    // A run may end only where the hit it gives is aligned.
    if (run == 0 && page_size != alignment_tokens_ &&
        ((eagle ? page : page + 1) * page_size) % alignment_tokens_ != 0) {
      continue;
    }
    if (!Probe(kind, page, lookup, hit)) {
      run = 0;
      continue;
    }
    if (++run >= needed) {
      pages = page + run;
      break;
    }
  }
  if (pages < 0) {
    // No run as long as the window: the run from page 0 is a hit.
    Resize(kind, run, null_page_, hit);
    pages = Align(kind, run, hit);
  } else {
    Resize(kind, pages, null_page_, hit);
  }
  if (eagle && pages > 0) {
    Resize(kind, --pages, null_page_, hit);
    pages = Align(kind, pages, hit);
  }
  return pages;
}

int64_t GroupCacheHitFinder::FindChunkedLocal(const Kind& kind,
                                              int64_t max_length,
                                              GroupPageLookup lookup,
                                              GroupCacheHit& hit) const {
  const int64_t page_size = kind.spec.page_size;
  const int64_t chunk = kind.spec.attention_chunk_size;
  const int64_t max_pages = max_length / page_size;
  // The pages wholly before the chunk of the token after the hit are null.
  int64_t pages = max_length / chunk * chunk / page_size;
  for (int32_t g : kind.groups) hit.pages[g].assign(pages, null_page_);
  return Extend(kind, max_pages, lookup, hit);
}

int64_t GroupCacheHitFinder::Extend(const Kind& kind, int64_t max_pages,
                                    GroupPageLookup lookup,
                                    GroupCacheHit& hit) const {
  std::vector<PageId>& first = hit.pages[kind.groups[0]];
  int64_t pages = static_cast<int64_t>(first.size());
  if (kind.groups.size() == 1) {
    // The common case, a page a lookup.
    for (; pages < max_pages; ++pages) {
      const PageId cached = lookup(kind.groups[0], pages);
      if (cached == kNoPage) break;
      first.push_back(cached);
    }
    return pages;
  }
  for (; pages < max_pages; ++pages) {
    Resize(kind, pages + 1, null_page_, hit);
    if (!Probe(kind, pages, lookup, hit)) {
      Resize(kind, pages, null_page_, hit);
      break;
    }
  }
  return pages;
}

int64_t GroupCacheHitFinder::Align(const Kind& kind, int64_t pages,
                                   GroupCacheHit& hit) const {
  const int64_t page_size = kind.spec.page_size;
  const int64_t aligned =
      pages * page_size / alignment_tokens_ * alignment_tokens_ / page_size;
  Resize(kind, aligned, null_page_, hit);
  return aligned;
}

bool GroupCacheHitFinder::Probe(const Kind& kind, int64_t page,
                                GroupPageLookup lookup,
                                GroupCacheHit& hit) const {
  for (size_t k = 0; k < kind.groups.size(); ++k) {
    const PageId cached = lookup(kind.groups[k], page);
    if (cached == kNoPage) {
      for (size_t j = 0; j < k; ++j)
        hit.pages[kind.groups[j]][page] = null_page_;
      return false;
    }
    hit.pages[kind.groups[k]][page] = cached;
  }
  return true;
}

void GroupCacheHitFinder::Resize(const Kind& kind, int64_t pages, PageId fill,
                                 GroupCacheHit& hit) {
  for (int32_t g : kind.groups) hit.pages[g].resize(pages, fill);
}

}  // namespace kvblock
