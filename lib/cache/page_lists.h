// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Internal: a pool's two page lists, which BlockPool and HostTier keep
// alike: a free stack of page ids, and a doubly linked LRU list threaded
// through the pages' `lru_prev` / `lru_next`, whose sentinel is the entry
// after the last page (its next the head, its prev the tail). Its link
// operations, and the check of both lists.
#ifndef KVBLOCK_LIB_CACHE_PAGE_LISTS_H_
#define KVBLOCK_LIB_CACHE_PAGE_LISTS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace kvblock::internal {

// Links `page` into the LRU list of `pages` after `prev` (a page on it, or
// the sentinel: then `page` is the head).
template <typename PageState>
inline void LinkAfter(std::vector<PageState>& pages, int32_t prev,
                      int32_t page) {
  const int32_t next = pages[prev].lru_next;
  pages[page].lru_prev = prev;
  pages[page].lru_next = next;
  pages[prev].lru_next = page;
  pages[next].lru_prev = page;
}

// Takes `page` off the LRU list of `pages`, its links cleared (-1).
template <typename PageState>
inline void Unlink(std::vector<PageState>& pages, int32_t page) {
  const int32_t prev = pages[page].lru_prev;
  const int32_t next = pages[page].lru_next;
  pages[prev].lru_next = next;
  pages[next].lru_prev = prev;
  pages[page].lru_prev = -1;
  pages[page].lru_next = -1;
}

// Where a page stands on the lists.
enum class Listed : uint8_t { kOnNone, kFree, kLru };

// Marks in `listed` (resized to the pages, the sentinel left out) each
// page of `free` and of the LRU list of `pages`, and counts the LRU list's
// pages in `lru_pages`. Internal, prefixed "`who`: ", naming the first page
// that is out of range, free twice, on both lists, or whose back link
// disagrees, or a list that does not come back to the sentinel. O(pages).
template <typename PageState>
absl::Status ListPages(absl::string_view who, absl::Span<const int32_t> free,
                       absl::Span<const PageState> pages,
                       std::vector<Listed>& listed, int32_t& lru_pages) {
  const int32_t num_pages = static_cast<int32_t>(pages.size()) - 1;
  auto broken = [who](auto&&... parts) {
    return absl::InternalError(absl::StrCat(who, ": ", parts...));
  };
  listed.assign(num_pages, Listed::kOnNone);
  for (const int32_t page : free) {
    if (page < 0 || page >= num_pages) {
      return broken("free stack holds bad page ", page);
    }
    if (listed[page] != Listed::kOnNone) {
      return broken("page ", page, " is free twice");
    }
    listed[page] = Listed::kFree;
  }
  lru_pages = 0;
  for (int32_t prev = num_pages, page = pages[num_pages].lru_next;
       page != num_pages; prev = page, page = pages[page].lru_next) {
    if (page < 0 || page >= num_pages || lru_pages == num_pages) {
      return broken("lru list is broken at page ", page);
    }
    if (pages[page].lru_prev != prev) {
      return broken("lru page ", page, " links back to ", pages[page].lru_prev,
                    ", not ", prev);
    }
    if (listed[page] != Listed::kOnNone) {
      return broken("lru page ", page, " is also free");
    }
    listed[page] = Listed::kLru;
    ++lru_pages;
  }
  return absl::OkStatus();
}

}  // namespace kvblock::internal

#endif  // KVBLOCK_LIB_CACHE_PAGE_LISTS_H_
