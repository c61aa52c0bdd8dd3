// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// The hit search against the cases of vLLM's tests (tests/v1/core/
// test_single_type_kv_cache_manager.py and test_prefix_caching.py at
// vllm-project/vllm 28be48fa), each with its cache laid out as there, and
// against a brute-force definition of the hit on random caches.
#include "kvblock/group_cache_hit.h"

#include <cstdint>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "kvblock/kv_cache_groups.h"
#include "test_util.h"

namespace kvblock {
namespace {

constexpr PageId kNull = 0;  // vLLM's null block.

KvCacheGroupSpec Full(int32_t page_size) {
  return {.kind = AttentionKind::kFull, .page_size = page_size};
}
KvCacheGroupSpec Window(int32_t page_size, int32_t window) {
  return {.kind = AttentionKind::kSlidingWindow,
          .page_size = page_size,
          .sliding_window = window};
}
KvCacheGroupSpec Chunked(int32_t page_size, int32_t chunk) {
  return {.kind = AttentionKind::kChunkedLocal,
          .page_size = page_size,
          .attention_chunk_size = chunk};
}
KvCacheGroupSpec Eagle(KvCacheGroupSpec spec) {
  spec.eagle = true;
  return spec;
}

// A prefix cache: (group, page index at the group's page size) -> page.
class FakeCache {
 public:
  void Put(int32_t group, int64_t page, PageId id) {
    pages_[{group, page}] = id;
  }
  void Evict(int32_t group, int64_t page) { pages_.erase({group, page}); }
  PageId Lookup(int32_t group, int64_t page) const {
    const auto it = pages_.find({group, page});
    return it == pages_.end() ? kNoPage : it->second;
  }

 private:
  std::map<std::pair<int32_t, int64_t>, PageId> pages_;
};

GroupCacheHit Find(const std::vector<KvCacheGroupSpec>& groups,
                   const FakeCache& cache, int64_t max_length) {
  absl::StatusOr<GroupCacheHitFinder> finder =
      GroupCacheHitFinder::Create(groups, kNull);
  REQUIRE_OK(finder);
  GroupCacheHit hit;
  finder->Find(
      max_length,
      [&](int32_t group, int64_t page) { return cache.Lookup(group, page); },
      hit);
  REQUIRE(hit.pages.size() == groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    REQUIRE(static_cast<int64_t>(hit.pages[g].size()) * groups[g].page_size ==
            hit.hit_tokens);
  }
  return hit;
}

TEST_CASE("sliding window: the last window's pages, right to left") {
  // test_sliding_window_possible_cached_prefix: pages of 2, window 4; page
  // i is cached as id i + 10; the hit is the whole prompt.
  const std::vector<KvCacheGroupSpec> groups = {Window(2, 4)};
  const auto run = [&](const std::vector<bool>& cached, int64_t expect) {
    FakeCache cache;
    for (size_t i = 0; i < cached.size(); ++i) {
      if (cached[i]) cache.Put(0, i, static_cast<PageId>(i + 10));
    }
    const GroupCacheHit hit = Find(groups, cache, 2 * cached.size());
    const std::vector<PageId>& pages = hit.pages[0];
    REQUIRE(static_cast<int64_t>(pages.size()) == expect);
    for (int64_t i = 0; i < expect - 2; ++i) REQUIRE(pages[i] == kNull);
    for (int64_t i = std::max<int64_t>(0, expect - 2); i < expect; ++i) {
      REQUIRE(pages[i] == i + 10);
    }
  };
  run(std::vector<bool>(10, false), 0);
  run({true}, 1);
  run({true, false}, 1);
  run({true, true}, 2);
  run({true, true, false}, 2);
  run({true, true, true}, 3);
  run({true, true, true, false}, 3);
  run({true, true, false, true, false, false, true, true, false, true, true,
       true},
      12);
  run({true, true, false, true, false, false, true, true, false, false, false},
      8);
  run({true, true, false, true, false, false, true, true, false, false, false,
       true},
      8);
}

TEST_CASE("chunked local: null before the last chunk, then its cached pages") {
  // test_chunked_local_attention_possible_cached_prefix: pages of 2, chunk
  // 4; the prompt is the pages plus `tail` tokens. vLLM draws the first
  // eight pages at random: both draws here.
  const std::vector<KvCacheGroupSpec> groups = {Chunked(2, 4)};
  const auto run = [&](const std::vector<bool>& cached, int64_t tail,
                       int64_t expect) {
    FakeCache cache;
    for (size_t i = 0; i < cached.size(); ++i) {
      if (cached[i]) cache.Put(0, i, static_cast<PageId>(i + 10));
    }
    const GroupCacheHit hit = Find(groups, cache, 2 * cached.size() + tail);
    const std::vector<PageId>& pages = hit.pages[0];
    REQUIRE(static_cast<int64_t>(pages.size()) == expect);
    for (int64_t i = 0; i < (expect - 1) / 2; ++i) REQUIRE(pages[i] == kNull);
  };
  for (int64_t tail : {0, 1}) {
    run({true}, tail, 1);
    run({true, false}, tail, 2);
    run({true, true}, tail, 2);
    run({true, true, false}, tail, 2);
    run({true, true, true}, tail, 3);
    run({true, true, true, false}, tail, 4);
  }
  for (bool first_eight : {false, true}) {
    const auto prompt = [&](std::vector<bool> last) {
      std::vector<bool> cached(8, first_eight);
      cached.insert(cached.end(), last.begin(), last.end());
      return cached;
    };
    run(prompt({true}), 1, 9);
    run(prompt({false}), 1, 8);
    run(prompt({true, true}), 1, 10);
    for (int64_t tail : {0, 1}) {
      run(prompt({true, false}), tail, 10);
      run(prompt({false, true}), tail, 10);
      run(prompt({false, false}), tail, 10);
    }
  }
}

// test_prefill_hybrid_model: full attention and two sliding-window groups
// of two pages' window, pages of 16; a 53-token prompt whose three full
// pages are cached (ids as vLLM hands them out), searched within 52 tokens.
struct HybridCase {
  std::vector<std::pair<int32_t, int64_t>> evicted;
  int64_t expect_pages;
};

TEST_CASE("hybrid: full attention and sliding windows, as vLLM's prefill") {
  const std::vector<KvCacheGroupSpec> groups = {Full(16), Window(16, 32),
                                                Window(16, 32)};
  FakeCache cache;
  for (int32_t g = 0; g < 3; ++g) {
    for (int64_t page = 0; page < 3; ++page) {
      cache.Put(g, page, static_cast<PageId>(1 + 4 * g + page));
    }
  }
  const GroupCacheHit hit = Find(groups, cache, 52);
  REQUIRE(hit.hit_tokens == 48);
  REQUIRE(hit.pages ==
          std::vector<std::vector<PageId>>{{1, 2, 3}, {0, 6, 7}, {0, 10, 11}});
  for (const HybridCase& c : std::vector<HybridCase>{
           {{{1, 0}, {2, 0}}, 3},          // outside the window: no loss.
           {{{0, 0}}, 0},                  // full attention's first page.
           {{{0, 2}, {1, 2}, {2, 2}}, 2},  // the last page everywhere.
           {{{0, 2}}, 2},
           {{{1, 2}}, 2},
           {{{2, 2}}, 2},
           // Full attention reaches 1 page, the windows 2 at the most
           // (their page 0 gone): no length both serve.
           {{{0, 2}, {1, 0}, {2, 0}}, 0},
       }) {
    FakeCache partial = cache;
    for (const auto& [group, page] : c.evicted) partial.Evict(group, page);
    INFO("evicted " << c.evicted.size() << " pages, expect " << c.expect_pages);
    REQUIRE(Find(groups, partial, 52).hit_tokens == 16 * c.expect_pages);
  }
}

TEST_CASE("hybrid with EAGLE: the last page dropped once") {
  // test_prefill_hybrid_model_eagle: windows of three pages, six cached
  // pages, a 101-token prompt.
  const std::vector<KvCacheGroupSpec> groups = {
      Eagle(Full(16)), Eagle(Window(16, 48)), Eagle(Window(16, 48))};
  FakeCache cache;
  for (int32_t g = 0; g < 3; ++g) {
    for (int64_t page = 0; page < 6; ++page) {
      cache.Put(g, page, static_cast<PageId>(1 + 7 * g + page));
    }
  }
  const GroupCacheHit hit = Find(groups, cache, 100);
  REQUIRE(hit.hit_tokens == 80);
  REQUIRE(hit.pages == std::vector<std::vector<PageId>>{{1, 2, 3, 4, 5},
                                                        {0, 0, 10, 11, 12},
                                                        {0, 0, 17, 18, 19}});
  for (const HybridCase& c : std::vector<HybridCase>{
           {{{1, 0}, {2, 0}}, 5},
           {{{0, 0}}, 0},
           {{{0, 5}, {1, 5}, {2, 5}}, 4},
           {{{0, 5}}, 4},
           {{{1, 4}}, 3},
           {{{2, 4}}, 3},
           {{{0, 5}, {1, 0}, {2, 0}}, 4},
       }) {
    FakeCache partial = cache;
    for (const auto& [group, page] : c.evicted) partial.Evict(group, page);
    INFO("evicted " << c.evicted.size() << " pages, expect " << c.expect_pages);
    REQUIRE(Find(groups, partial, 100).hit_tokens == 16 * c.expect_pages);
  }
}

TEST_CASE("one sliding-window group with EAGLE") {
  // test_eagle_with_sliding_window: window 16, pages of 16, two cached
  // pages of a 37-token prompt.
  const std::vector<KvCacheGroupSpec> groups = {Eagle(Window(16, 16))};
  FakeCache cache;
  cache.Put(0, 0, 1);
  cache.Put(0, 1, 2);
  REQUIRE(Find(groups, cache, 36).hit_tokens == 16);
  // Page 0 gone: [null, 2] would serve without EAGLE; with it, nothing.
  cache.Evict(0, 0);
  REQUIRE(Find(groups, cache, 36).hit_tokens == 0);
}

TEST_CASE("groups of different page sizes hit in their common multiple") {
  // test_different_block_size: full attention on pages of 32, a window of
  // 32 on pages of 16; 96 tokens cached (3 and 6 pages).
  const std::vector<KvCacheGroupSpec> groups = {Full(32), Window(16, 32)};
  FakeCache cache;
  for (int64_t page = 0; page < 3; ++page) cache.Put(0, page, 1 + page);
  for (int64_t page = 0; page < 6; ++page) cache.Put(1, page, 5 + page);
  for (int64_t max_length : {112, 96}) {
    const GroupCacheHit hit = Find(groups, cache, max_length);
    REQUIRE(hit.hit_tokens == 96);
    REQUIRE(hit.pages[0].size() == 3);
    REQUIRE(hit.pages[1].size() == 6);
  }
  // The window's page 5 gone: it serves 80 tokens, but full attention's
  // pages of 32 cut that to 64.
  cache.Evict(1, 5);
  const GroupCacheHit hit = Find(groups, cache, 112);
  REQUIRE(hit.hit_tokens == 64);
  REQUIRE(hit.pages ==
          std::vector<std::vector<PageId>>{{1, 2}, {kNull, kNull, 7, 8}});
}

TEST_CASE("every combination of vLLM's hybrid tests hits the common prefix") {
  // test_prefill_hybrid_model_combinations (its groups without Mamba):
  // three cached pages of 16 of a 53-token prompt.
  const KvCacheGroupSpec full = Full(16);
  const KvCacheGroupSpec window = Window(16, 32);
  const KvCacheGroupSpec large = Window(16, 64);
  for (const std::vector<KvCacheGroupSpec>& groups :
       std::vector<std::vector<KvCacheGroupSpec>>{
           {full, window},
           {window, large},
           {full, window, window},
           {full, window, large},
           {full, full, window},
           {full, window, full, large},
       }) {
    FakeCache cache;
    for (int32_t g = 0; g < static_cast<int32_t>(groups.size()); ++g) {
      for (int64_t page = 0; page < 3; ++page) {
        cache.Put(g, page, static_cast<PageId>(1 + 10 * g + page));
      }
    }
    INFO(groups.size() << " groups");
    REQUIRE(Find(groups, cache, 52).hit_tokens == 48);
  }
  // test_prefill_hybrid_model_combinations_eagle: four cached pages of a
  // 69-token prompt, EAGLE leaves three.
  FakeCache cache;
  for (int32_t g = 0; g < 2; ++g) {
    for (int64_t page = 0; page < 4; ++page)
      cache.Put(g, page, 1 + 10 * g + page);
  }
  const GroupCacheHit hit = Find({Eagle(full), Eagle(window)}, cache, 68);
  REQUIRE(hit.hit_tokens == 48);
}

TEST_CASE("nothing is found within no tokens") {
  FakeCache cache;
  cache.Put(0, 0, 1);
  cache.Put(1, 0, 2);
  for (int64_t max_length : {-5, 0, 15}) {
    const GroupCacheHit hit =
        Find({Full(16), Window(16, 32)}, cache, max_length);
    REQUIRE(hit.hit_tokens == 0);
  }
}

// The hit by definition: the longest length L within max_length, a multiple
// of the page sizes' common multiple, at which every group has cached the
// pages its next token reads (full attention: all before L; a window: the
// ceil((W - 1) / page) before L; chunked local: those of L's chunk).
int64_t BruteForceHit(const std::vector<KvCacheGroupSpec>& groups,
                      const FakeCache& cache, int64_t max_length) {
  const int64_t unit = AlignmentTokens(groups);
  for (int64_t length = max_length / unit * unit; length > 0; length -= unit) {
    bool served = true;
    for (int32_t g = 0; served && g < static_cast<int32_t>(groups.size());
         ++g) {
      const KvCacheGroupSpec& spec = groups[g];
      const int64_t end = length / spec.page_size;
      int64_t first = 0;
      if (spec.kind == AttentionKind::kSlidingWindow) {
        first = std::max<int64_t>(
            0, end - (spec.sliding_window - 1 + spec.page_size - 1) /
                         spec.page_size);
      } else if (spec.kind == AttentionKind::kChunkedLocal) {
        first = length / spec.attention_chunk_size * spec.attention_chunk_size /
                spec.page_size;
      }
      for (int64_t page = first; served && page < end; ++page) {
        served = cache.Lookup(g, page) != kNoPage;
      }
    }
    if (served) return length;
  }
  return 0;
}

TEST_CASE("random caches: the hit is the longest every group serves") {
  for (uint32_t seed = 1; seed <= 300; ++seed) {
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    const auto uniform = [&](int32_t lo, int32_t hi) {
      return std::uniform_int_distribution<int32_t>(lo, hi)(rng);
    };
    const int32_t base = 1 << uniform(0, 2);  // the hash page size.
    std::vector<KvCacheGroupSpec> groups;
    const int32_t num_groups = uniform(1, 4);
    const bool chunked = uniform(0, 3) == 0;
    for (int32_t g = 0; g < num_groups; ++g) {
      const int32_t page_size = chunked ? base : base * uniform(1, 3);
      switch (chunked ? uniform(0, 2) : uniform(0, 1)) {
        case 0:
          groups.push_back(Full(page_size));
          break;
        case 1:
          groups.push_back(Window(page_size, uniform(2, 6 * page_size)));
          break;
        default:
          groups.push_back(Chunked(page_size, page_size * uniform(1, 4)));
      }
    }
    REQUIRE_OK(ValidateKvCacheGroups(groups));
    const int64_t max_length = uniform(0, 40 * base);
    const double density = uniform(50, 100) / 100.0;
    FakeCache cache;
    for (int32_t g = 0; g < num_groups; ++g) {
      for (int64_t page = 0; page * groups[g].page_size <= max_length; ++page) {
        if (std::bernoulli_distribution(density)(rng)) {
          cache.Put(g, page, static_cast<PageId>(100 + 50 * g + page));
        }
      }
    }
    const GroupCacheHit hit = Find(groups, cache, max_length);
    REQUIRE(hit.hit_tokens == BruteForceHit(groups, cache, max_length));
    // Each page is the cached one or null, and every page a group reads
    // at the hit is the cached one.
    for (int32_t g = 0; g < num_groups; ++g) {
      for (size_t page = 0; page < hit.pages[g].size(); ++page) {
        const PageId id = hit.pages[g][page];
        REQUIRE((id == kNull || id == cache.Lookup(g, page)));
      }
      const int64_t read_from =
          NumSkippedTokens(groups[g], hit.hit_tokens) / groups[g].page_size;
      for (size_t page = read_from; page < hit.pages[g].size(); ++page) {
        REQUIRE(hit.pages[g][page] != kNull);
      }
    }
  }
}

TEST_CASE("a bad config is refused") {
  REQUIRE_STATUS_IS(GroupCacheHitFinder::Create({}, kNull), kInvalidArgument);
  REQUIRE_STATUS_IS(GroupCacheHitFinder::Create({Full(0)}, kNull),
                    kInvalidArgument);
}

}  // namespace
}  // namespace kvblock
