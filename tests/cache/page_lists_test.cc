// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "cache/page_lists.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "test_util.h"

namespace kvblock::internal {
namespace {

struct Links {
  int32_t lru_prev = -1;
  int32_t lru_next = -1;
};

// Four pages and the sentinel (entry 4); `lru` linked head to tail.
std::vector<Links> PagesWithLru(const std::vector<int32_t>& lru) {
  std::vector<Links> pages(5);
  int32_t prev = 4;
  for (const int32_t page : lru) {
    pages[prev].lru_next = page;
    pages[page].lru_prev = prev;
    prev = page;
  }
  pages[prev].lru_next = 4;
  pages[4].lru_prev = prev;
  return pages;
}

absl::Status List(const std::vector<int32_t>& free,
                  const std::vector<Links>& pages, std::vector<Listed>& listed,
                  int32_t& lru_pages) {
  return ListPages<Links>("pool", free, pages, listed, lru_pages);
}

// The LRU list head to tail, walked from the sentinel (entry 4).
std::vector<int32_t> LruOf(const std::vector<Links>& pages) {
  std::vector<int32_t> order;
  for (int32_t page = pages[4].lru_next; page != 4 && order.size() < 5;
       page = pages[page].lru_next) {
    order.push_back(page);
  }
  return order;
}

TEST_CASE("page lists: pages linked after another, and unlinked") {
  std::vector<Links> pages = PagesWithLru({});
  LinkAfter(pages, 4, 0);  // after the sentinel: the head.
  LinkAfter(pages, 0, 2);
  LinkAfter(pages, 4, 1);
  REQUIRE(LruOf(pages) == std::vector<int32_t>{1, 0, 2});
  LinkAfter(pages, pages[4].lru_prev, 3);  // after the tail.
  REQUIRE(LruOf(pages) == std::vector<int32_t>{1, 0, 2, 3});
  Unlink(pages, 0);
  Unlink(pages, 3);
  REQUIRE(LruOf(pages) == std::vector<int32_t>{1, 2});
  REQUIRE(pages[0].lru_prev == -1);
  REQUIRE(pages[0].lru_next == -1);
  REQUIRE(pages[3].lru_prev == -1);
  std::vector<Listed> listed;
  int32_t lru_pages = 0;
  REQUIRE_OK(ListPages<Links>("pool", {0, 3}, pages, listed, lru_pages));
  REQUIRE(lru_pages == 2);
}

TEST_CASE("page lists: each page marked by its list") {
  std::vector<Listed> listed;
  int32_t lru_pages = -1;
  REQUIRE_OK(List({3, 0}, PagesWithLru({2}), listed, lru_pages));
  REQUIRE(listed == std::vector<Listed>{Listed::kFree, Listed::kOnNone,
                                        Listed::kLru, Listed::kFree});
  REQUIRE(lru_pages == 1);
  REQUIRE_OK(List({}, PagesWithLru({}), listed, lru_pages));
  REQUIRE(listed == std::vector<Listed>(4, Listed::kOnNone));
  REQUIRE(lru_pages == 0);
}

TEST_CASE("page lists: the first break is named") {
  std::vector<Listed> listed;
  int32_t lru_pages = 0;
  struct Case {
    std::vector<int32_t> free;
    std::vector<Links> pages;
    std::string message;
  };
  std::vector<Links> bad_back_link = PagesWithLru({0, 1});
  bad_back_link[1].lru_prev = 2;
  std::vector<Links> out_of_range = PagesWithLru({0});
  out_of_range[0].lru_next = 7;
  std::vector<Links> cycle = PagesWithLru({0, 1});
  cycle[1].lru_next = 0;
  cycle[0].lru_prev = 1;
  const std::vector<Case> cases = {
      {{5}, PagesWithLru({}), "pool: free stack holds bad page 5"},
      {{-1}, PagesWithLru({}), "free stack holds bad page -1"},
      {{1, 1}, PagesWithLru({}), "page 1 is free twice"},
      {{2}, PagesWithLru({0, 2}), "lru page 2 is also free"},
      {{}, bad_back_link, "lru page 1 links back to 2, not 0"},
      {{}, out_of_range, "lru list is broken at page 7"},
      {{}, cycle, "lru page 0 links back to 1, not 4"},
  };
  for (const Case& c : cases) {
    const absl::Status status = List(c.free, c.pages, listed, lru_pages);
    INFO(status.message());
    REQUIRE(status.code() == absl::StatusCode::kInternal);
    REQUIRE(absl::StrContains(status.message(), c.message));
  }
}

TEST_CASE("page lists: a cycle that never returns is caught") {
  // 0 -> 1 -> 0 -> ... with back links that agree after the first page.
  std::vector<Links> pages = PagesWithLru({0, 1, 2, 3});
  pages[3].lru_next = 0;
  pages[0].lru_prev = 3;
  pages[4].lru_next = 1;  // enters at 1: 1 2 3 0 1 ...
  pages[1].lru_prev = 4;
  std::vector<Listed> listed;
  int32_t lru_pages = 0;
  const absl::Status status =
      ListPages<Links>("pool", {}, pages, listed, lru_pages);
  REQUIRE(status.code() == absl::StatusCode::kInternal);
  REQUIRE(absl::StrContains(status.message(), "lru list is broken at page 1"));
}

}  // namespace
}  // namespace kvblock::internal
