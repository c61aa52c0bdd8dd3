// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "kvblock/kv_cache_groups.h"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "test_util.h"

namespace kvblock {
namespace {

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

// InvalidArgument with `part` in the message.
void RequireInvalid(const std::vector<KvCacheGroupSpec>& groups,
                    const std::string& part) {
  const absl::Status status = ValidateKvCacheGroups(groups);
  INFO(status.ToString());
  REQUIRE(status.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(std::string(status.message()).find(part) != std::string::npos);
}

TEST_CASE("hybrid models' groups are valid") {
  REQUIRE_OK(ValidateKvCacheGroups({Full(16)}));
  REQUIRE_OK(ValidateKvCacheGroups({Full(16), Window(16, 128)}));
  REQUIRE_OK(ValidateKvCacheGroups({Full(32), Window(16, 32)}));
  REQUIRE_OK(ValidateKvCacheGroups({Full(16), Chunked(16, 8192)}));
  KvCacheGroupSpec eagle = Window(16, 128);
  eagle.eagle = true;
  REQUIRE_OK(ValidateKvCacheGroups({Full(16), eagle}));
}

TEST_CASE("invalid groups are rejected naming the group and the value") {
  RequireInvalid({}, "got 0");
  RequireInvalid(std::vector<KvCacheGroupSpec>(kMaxKvCacheGroups + 1, Full(16)),
                 "got 65");
  RequireInvalid({Full(16), Full(0)},
                 "kv cache group 1: page_size must be "
                 "positive, got 0");
  RequireInvalid({Full(-3)}, "got -3");
  RequireInvalid({Window(16, 0)},
                 "sliding_window must be positive for "
                 "sliding_window, got 0");
  RequireInvalid({Chunked(16, -1)}, "attention_chunk_size must be positive");
  KvCacheGroupSpec full_with_window = Full(16);
  full_with_window.sliding_window = 128;
  RequireInvalid({full_with_window},
                 "sliding_window must be 0 for "
                 "full_attention, got 128");
  KvCacheGroupSpec unknown = Full(16);
  unknown.kind = static_cast<AttentionKind>(7);
  RequireInvalid({unknown}, "unknown attention kind 7");
  // Pages of coprime sizes near 2^16 each: their multiple passes 2^30.
  RequireInvalid({Full(65521), Window(65519, 8)}, "least common multiple");
}

TEST_CASE("prefix hits need chunked-local pages of the multiple, no EAGLE") {
  KvCacheGroupSpec eagle = Chunked(16, 64);
  eagle.eagle = true;
  const struct {
    std::vector<KvCacheGroupSpec> groups;
    const char* part;
  } cases[] = {
      {{Full(32), Chunked(16, 64)},
       "kv cache group 1: chunked local attention needs the pages of every "
       "group to divide its own (page_size 16, least common multiple 32)"},
      {{Full(16), eagle},
       "kv cache group 1: EAGLE drafting is not supported with chunked"},
  };
  for (const auto& c : cases) {
    // A model without prefix caching serves them.
    REQUIRE_OK(ValidateKvCacheGroups(c.groups));
    const absl::Status status = ValidateGroupCacheHits(c.groups);
    INFO(status.ToString());
    REQUIRE(status.code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(std::string(status.message()).find(c.part) != std::string::npos);
  }
  REQUIRE_OK(ValidateGroupCacheHits({Full(16), Chunked(16, 64)}));
  REQUIRE_OK(ValidateGroupCacheHits({Full(8), Chunked(16, 64)}));
}

TEST_CASE("prompts hash at the common page size, hits come in the multiple") {
  const std::vector<KvCacheGroupSpec> groups = {Full(32), Window(16, 32),
                                                Window(48, 128)};
  REQUIRE_OK(ValidateKvCacheGroups(groups));
  REQUIRE(HashPageSize(groups) == 16);
  REQUIRE(AlignmentTokens(groups) == 96);
  REQUIRE(HashPageSize({Full(16)}) == 16);
  REQUIRE(AlignmentTokens({Full(16)}) == 16);
}

TEST_CASE("skipped tokens are vLLM's get_num_skipped_tokens") {
  REQUIRE(NumSkippedTokens(Full(16), 100000) == 0);
  // vLLM's docstring: window 4, 7 computed: tokens 0-3 skipped.
  REQUIRE(NumSkippedTokens(Window(16, 4), 7) == 4);
  REQUIRE(NumSkippedTokens(Window(16, 4), 3) == 0);
  REQUIRE(NumSkippedTokens(Window(16, 4), 0) == 0);
  // Chunk 8: 13 computed skips 8, 8 skips 8, 7 skips none.
  REQUIRE(NumSkippedTokens(Chunked(16, 8), 13) == 8);
  REQUIRE(NumSkippedTokens(Chunked(16, 8), 8) == 8);
  REQUIRE(NumSkippedTokens(Chunked(16, 8), 7) == 0);
}

TEST_CASE("skipped pages follow vLLM's remove_skipped_blocks cases") {
  // test_sliding_window_remove_skipped_blocks: pages of 2, window 4.
  const KvCacheGroupSpec window = Window(2, 4);
  for (const auto& [computed, pages] : std::vector<std::pair<int64_t, int64_t>>{
           {0, 0}, {4, 0}, {5, 1}, {6, 1}, {7, 2}, {11, 4}}) {
    INFO("computed " << computed);
    REQUIRE(NumSkippedPages(window, computed) == pages);
  }
  // test_chunked_local_attention_remove_skipped_blocks: pages of 2, chunk 4.
  const KvCacheGroupSpec chunked = Chunked(2, 4);
  for (const auto& [computed, pages] : std::vector<std::pair<int64_t, int64_t>>{
           {0, 0}, {4, 2}, {6, 2}, {12, 6}}) {
    INFO("computed " << computed);
    REQUIRE(NumSkippedPages(chunked, computed) == pages);
  }
}

TEST_CASE("a short window caches only the pages at each unit's end") {
  // test_hybrid_cache_blocks_swa_tail_window_only: full pages of 32, window
  // pages of 8 and window 8: only the last page of each 32 tokens.
  const KvCacheGroupSpec window = Window(8, 8);
  std::vector<int64_t> cached;
  for (int64_t page = 0; page < 8; ++page) {
    if (CachesFullPage(window, page, 32)) cached.push_back(page);
  }
  REQUIRE(cached == std::vector<int64_t>{3, 7});
  // An EAGLE group's hit ends a page later and drops it: the two pages
  // before each unit's end, shifted by one.
  KvCacheGroupSpec eagle = window;
  eagle.eagle = true;
  cached.clear();
  for (int64_t page = 0; page < 9; ++page) {
    if (CachesFullPage(eagle, page, 32)) cached.push_back(page);
  }
  REQUIRE(cached == std::vector<int64_t>{3, 4, 7, 8});
  // test_hybrid_cache_blocks_clamped_to_lcm: window 32 on pages of 16 reads
  // back two pages, a whole unit of 32: every page.
  for (int64_t page = 0; page < 6; ++page) {
    REQUIRE(CachesFullPage(Window(16, 32), page, 32));
  }
  REQUIRE(CachesFullPage(Window(8, 8), 0, 8));
  REQUIRE(CachesFullPage(Full(8), 0, 32));
}

TEST_CASE("attention kinds carry vLLM's names") {
  REQUIRE(AttentionKindName(AttentionKind::kFull) == "full_attention");
  REQUIRE(AttentionKindName(AttentionKind::kSlidingWindow) == "sliding_window");
  REQUIRE(AttentionKindName(AttentionKind::kChunkedLocal) ==
          "chunked_local_attention");
  REQUIRE(SameAttention(Window(16, 128), Window(16, 128)));
  KvCacheGroupSpec eagle = Window(16, 128);
  eagle.eagle = true;
  REQUIRE(SameAttention(Window(16, 128), eagle));
  REQUIRE_FALSE(SameAttention(Window(16, 128), Window(16, 64)));
  REQUIRE_FALSE(SameAttention(Full(16), Full(32)));
}

TEST_CASE("the next skip is the first length that skips one more page") {
  for (const KvCacheGroupSpec& group :
       {Window(16, 128), Window(4, 1), Window(4, 6), Window(5, 17),
        Chunked(8, 8), Chunked(4, 10), Chunked(16, 8192)}) {
    INFO(group.page_size << " " << group.sliding_window << " "
                         << group.attention_chunk_size);
    for (int64_t pages = 0; pages < 40; ++pages) {
      const int64_t next = NextSkipTokens(group, pages);
      REQUIRE(NumSkippedPages(group, next) > pages);
      REQUIRE(NumSkippedPages(group, next - 1) <= pages);
    }
  }
  REQUIRE(NextSkipTokens(Full(16), 3) == std::numeric_limits<int64_t>::max());
}

}  // namespace
}  // namespace kvblock
