// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// VllmKvCacheManager against vLLM v1's KVCacheManager contract (the cases of
// vLLM's tests/v1/core/test_prefix_caching.py that the Python adapter's
// conformance tests do not reach, and every error path). The block ids are
// the ones vLLM's manager hands out for the same calls. The host tier: the
// OffloadingConnector's count, the loads, their copies and events.
#include "kvblock/vllm_kv_cache_manager.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/strings/match.h"
#include "base/fault_injection.h"
#include "pool_test_util.h"
#include "test_util.h"

namespace kvblock {
namespace {

using ::kvblock::testing::TestHash;
using Ids = std::vector<PageId>;

std::unique_ptr<VllmKvCacheManager> NewManager(
    VllmKvCacheManagerOptions options) {
  auto manager = VllmKvCacheManager::Create(options);
  REQUIRE_OK(manager);
  return std::move(manager).value();
}

// A request's block hashes: one chain per `seed`, `count` long.
std::vector<BlockHash> Chain(uint32_t seed, int count) {
  std::vector<BlockHash> hashes;
  for (int i = 0; i < count; ++i) hashes.push_back(TestHash(seed * 1000 + i));
  return hashes;
}

// new_computed_blocks for a manager of one group (`ids` outlives it).
class OneGroup {
 public:
  explicit OneGroup(const Ids& ids) : lists_{absl::MakeConstSpan(ids)} {}
  operator absl::Span<const absl::Span<const PageId>>() const { return lists_; }

 private:
  std::array<absl::Span<const PageId>, 1> lists_;
};

// Group 0's blocks of the longest hit.
Ids HitOf(VllmKvCacheManager& manager, absl::Span<const BlockHash> hashes,
          int64_t max_length) {
  return manager.FindLongestCacheHit(hashes, max_length).pages[0];
}

bool Unchanged(const VllmKvCacheManager& manager,
               absl::Span<const BlockHash> hashes, int64_t max_length,
               const Ids& hit) {
  GroupCacheHit found{.hit_tokens = static_cast<int64_t>(hit.size()) *
                                    manager.options().block_size,
                      .pages = {hit}};
  return manager.IsHitUnchanged(hashes, max_length, found);
}

// Group 0's range of a CacheBlocks result.
std::pair<int32_t, int32_t> RangeOf(absl::Span<const VllmGroupSlots> slots) {
  return {slots[0].cached_from, slots[0].cached_to};
}

// The last hash of each block removed since the last call.
std::vector<BlockHash> Removed(VllmKvCacheManager& manager) {
  std::vector<BlockHash> hashes;
  for (const auto& block : manager.TakeRemovedHashes()) {
    hashes.push_back(block.hashes.back());
  }
  return hashes;
}

Ids Held(const VllmKvCacheManager& manager, absl::string_view id) {
  const auto blocks = manager.Blocks(id);
  return Ids(blocks.begin(), blocks.end());
}

// Everything a failed call must leave as it was.
struct State {
  BlockPoolSnapshot pool;
  Ids blocks;
  int32_t requests;
  friend bool operator==(const State&, const State&) = default;
};
State StateOf(const VllmKvCacheManager& manager, absl::string_view id) {
  return {manager.pool().Snapshot(), Held(manager, id), manager.num_requests()};
}

const VllmKvCacheManagerOptions kOptions = {
    .num_blocks = 11, .block_size = 16, .max_model_len = 8192};

TEST_CASE("create refuses bad options") {
  REQUIRE_STATUS_IS(
      VllmKvCacheManager::Create(
          {.num_blocks = 0, .block_size = 16, .max_model_len = 64}),
      kInvalidArgument);
  REQUIRE_STATUS_IS(
      VllmKvCacheManager::Create(
          {.num_blocks = 8, .block_size = 0, .max_model_len = 64}),
      kInvalidArgument);
  REQUIRE_STATUS_IS(VllmKvCacheManager::Create(
                        {.num_blocks = 8, .block_size = 4, .max_model_len = 0}),
                    kInvalidArgument);
  // Past the pool's limit: refused as such, on any machine (not as more
  // memory than this one has).
  for (const int32_t num_blocks :
       {kMaxNumPages + 1, std::numeric_limits<int32_t>::max()}) {
    const auto manager = VllmKvCacheManager::Create(
        {.num_blocks = num_blocks, .block_size = 16, .max_model_len = 64});
    REQUIRE_STATUS_IS(manager, kInvalidArgument);
    REQUIRE(manager.status().message().find(absl::StrCat(
                "num_blocks must be in [1, 1073741823] (block 0 is the null "
                "block), got ",
                num_blocks)) != absl::string_view::npos);
  }
}

TEST_CASE("block 0 is the null block, never handed out") {
  auto manager = NewManager(kOptions);
  REQUIRE(manager->NumFreeBlocks() == 10);
  REQUIRE(manager->Usage() == 0.0);
  REQUIRE(manager->RefCount(VllmKvCacheManager::kNullBlock) == 0);
  const std::vector<BlockHash> hashes = Chain(1, 3);
  // vLLM's test_prefill: 55 tokens, 3 full blocks and a partial one.
  auto result = manager->AllocateSlots({.request_id = "0",
                                        .block_hashes = hashes,
                                        .num_tokens = 55,
                                        .num_new_tokens = 55});
  REQUIRE_OK(result);
  REQUIRE(result->allocated);
  REQUIRE(result->groups[0].first_new_block == 0);
  REQUIRE(Held(*manager, "0") == Ids{1, 2, 3, 4});
  REQUIRE(result->groups[0].cached_from == 0);
  REQUIRE(result->groups[0].cached_to == 3);
  REQUIRE(manager->CachedHash(3) == hashes[2]);
  REQUIRE_FALSE(manager->CachedHash(4).has_value());
  REQUIRE(manager->Usage() == 0.4);
  REQUIRE(manager->TakeNewBlockIds()[0] == Ids{1, 2, 3, 4});
  REQUIRE(manager->TakeNewBlockIds()[0].empty());
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("a hit is found without a reference and taken at allocation") {
  auto manager = NewManager(kOptions);
  const std::vector<BlockHash> hashes = Chain(1, 3);
  REQUIRE_OK(manager->AllocateSlots({.request_id = "0",
                                     .block_hashes = hashes,
                                     .num_tokens = 55,
                                     .num_new_tokens = 55}));
  // A second prompt shares the first three blocks and has 5 tokens more.
  std::vector<BlockHash> second = hashes;
  const auto hit = HitOf(*manager, second, 52 - 1);
  REQUIRE(hit == Ids{1, 2, 3});
  REQUIRE(manager->RefCount(1) == 1);
  const Ids hit_ids = hit;
  auto result =
      manager->AllocateSlots({.request_id = "1",
                              .block_hashes = second,
                              .num_tokens = 52,
                              .num_new_tokens = 4,
                              .num_new_computed_tokens = 48,
                              .new_computed_blocks = OneGroup(hit_ids)});
  REQUIRE_OK(result);
  REQUIRE(Held(*manager, "1") == Ids{1, 2, 3, 5});
  REQUIRE(result->groups[0].first_new_block == 3);
  REQUIRE(manager->RefCount(1) == 2);
  REQUIRE(manager->GetNumCommonPrefixBlocks("0")[0] == 3);

  // Freed last block first: the queue is 5 (r1's tail) ... then r0's.
  manager->Free("0");
  manager->Free("1");
  REQUIRE(manager->num_requests() == 0);
  REQUIRE(manager->pool().Snapshot().lru == Ids{6, 7, 8, 9, 10, 4, 5, 3, 2, 1});
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("a short pool allocates nothing and changes nothing") {
  auto manager = NewManager(kOptions);
  const std::vector<BlockHash> hashes = Chain(1, 10);
  REQUIRE_OK(manager->AllocateSlots({.request_id = "a",
                                     .block_hashes = hashes,
                                     .num_tokens = 100,
                                     .num_new_tokens = 100}));  // 7 blocks.
  const State before = StateOf(*manager, "b");
  auto result = manager->AllocateSlots({.request_id = "b",
                                        .block_hashes = Chain(2, 4),
                                        .num_tokens = 64,
                                        .num_new_tokens = 64});
  REQUIRE_OK(result);
  REQUIRE_FALSE(result->allocated);
  REQUIRE(StateOf(*manager, "b") == before);

  SECTION("full_sequence_must_fit gates on the whole prompt") {
    // 32 of 160 tokens scheduled: two blocks fit, the prompt's ten do not.
    const std::vector<BlockHash> chain = Chain(3, 10);
    auto gated = manager->AllocateSlots({.request_id = "c",
                                         .block_hashes = chain,
                                         .num_tokens = 160,
                                         .num_new_tokens = 32,
                                         .full_sequence_must_fit = true});
    REQUIRE_OK(gated);
    REQUIRE_FALSE(gated->allocated);
    REQUIRE(StateOf(*manager, "c") == before);
    auto chunk = manager->AllocateSlots({.request_id = "c",
                                         .block_hashes = chain,
                                         .num_tokens = 160,
                                         .num_new_tokens = 32});
    REQUIRE_OK(chunk);
    REQUIRE(chunk->allocated);
    REQUIRE(Held(*manager, "c") == Ids{8, 9});
  }
  SECTION("a lookahead slot that does not fit fails the call") {
    auto result = manager->AllocateSlots({.request_id = "a",
                                          .block_hashes = hashes,
                                          .num_tokens = 100,
                                          .num_computed_tokens = 100,
                                          .num_new_tokens = 1,
                                          .num_lookahead_tokens = 64});
    REQUIRE_OK(result);
    REQUIRE_FALSE(result->allocated);
  }
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("bad arguments are refused, naming the value, with nothing changed") {
  auto manager = NewManager(kOptions);
  const std::vector<BlockHash> hashes = Chain(1, 3);
  REQUIRE_OK(manager->AllocateSlots({.request_id = "a",
                                     .block_hashes = hashes,
                                     .num_tokens = 55,
                                     .num_new_tokens = 55}));
  const State before = StateOf(*manager, "a");
  const Ids hit_ids = {1, 2};
  const Ids null_ids = {0};
  const Ids uncached_ids = {4};
  const OneGroup hit(hit_ids), null_hit(null_ids), uncached_hit(uncached_ids);
  const std::vector<BlockHash> one = Chain(1, 1);
  const struct {
    VllmSlotRequest request;
    const char* message;
  } cases[] = {
      {{.request_id = "b", .num_tokens = 8}, "num_new_tokens must be greater"},
      {{.request_id = "b", .num_tokens = 8, .num_new_tokens = -1},
       "num_new_tokens -1"},
      {{.request_id = "a",
        .num_tokens = 60,
        .num_computed_tokens = 55,
        .num_new_tokens = 5,
        .new_computed_blocks = hit},
       "holds 4 blocks"},
      {{.request_id = "b",
        .num_tokens = 40,
        .num_new_tokens = 8,
        .num_new_computed_tokens = 16,
        .new_computed_blocks = null_hit},
       "(id 0) is not cached"},
      {{.request_id = "b",
        .num_tokens = 40,
        .num_new_tokens = 8,
        .num_new_computed_tokens = 16,
        .new_computed_blocks = uncached_hit},
       "(id 4) is not cached"},
      {{.request_id = "b",
        .block_hashes = one,
        .num_tokens = 40,
        .num_new_tokens = 40},
       "has 1 block hashes; caching its 40 computed tokens needs 2"},
  };
  for (const auto& c : cases) {
    auto result = manager->AllocateSlots(c.request);
    INFO(result.status());
    REQUIRE(result.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(absl::StrContains(result.status().message(), c.message));
    REQUIRE(StateOf(*manager, "a") == before);
    REQUIRE(manager->Blocks("b").empty());
  }
  REQUIRE_STATUS_IS(manager->EvictBlocks(Ids{1, 11}), kInvalidArgument);
  REQUIRE_STATUS_IS(manager->CacheBlocks("a", one, 64), kInvalidArgument);
  REQUIRE(StateOf(*manager, "a") == before);
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("a pool of the null block alone allocates nothing") {
  auto manager =
      NewManager({.num_blocks = 1, .block_size = 16, .max_model_len = 64});
  REQUIRE(manager->NumFreeBlocks() == 0);
  REQUIRE(manager->Usage() == 0.0);
  const std::vector<BlockHash> hashes = Chain(1, 1);
  auto result = manager->AllocateSlots({.request_id = "a",
                                        .block_hashes = hashes,
                                        .num_tokens = 16,
                                        .num_new_tokens = 16});
  REQUIRE_OK(result);
  REQUIRE_FALSE(result->allocated);
}

TEST_CASE("unknown requests are entered where vLLM's defaultdict enters them") {
  auto manager = NewManager(kOptions);
  const std::vector<BlockHash> hashes = Chain(1, 4);
  REQUIRE_OK(manager->AllocateSlots({.request_id = "a",
                                     .block_hashes = hashes,
                                     .num_tokens = 40,
                                     .num_new_tokens = 40}));
  REQUIRE(manager->GetNumCommonPrefixBlocks("a")[0] == 3);
  // cache_blocks of a request that holds no block counts its blocks as
  // cached; get_num_common_prefix_blocks of an unknown id enters it.
  auto cached = manager->CacheBlocks("b", hashes, 48);
  REQUIRE_OK(cached);
  REQUIRE(RangeOf(*cached) == std::pair{0, 0});
  REQUIRE(manager->num_requests() == 2);
  REQUIRE(manager->GetNumCommonPrefixBlocks("a")[0] == 0);
  REQUIRE(manager->GetNumCommonPrefixBlocks("c")[0] == 0);
  REQUIRE(manager->num_requests() == 3);
  manager->Free("b");
  manager->Free("c");
  REQUIRE(manager->GetNumCommonPrefixBlocks("a")[0] == 3);
  // Blocks past the ones held count as cached, and are not cached later.
  auto ahead = manager->CacheBlocks("a", hashes, 64);
  REQUIRE_OK(ahead);
  REQUIRE(RangeOf(*ahead) ==
          std::pair{2, 3});  // the third block; the fourth is not held.
  REQUIRE_OK(manager->AllocateSlots({.request_id = "a",
                                     .block_hashes = hashes,
                                     .num_tokens = 64,
                                     .num_computed_tokens = 40,
                                     .num_new_tokens = 24}));
  REQUIRE(Held(*manager, "a").size() == 4);
  REQUIRE(manager->CachedHash(Held(*manager, "a")[2]) == hashes[2]);
  REQUIRE_FALSE(manager->CachedHash(Held(*manager, "a")[3]).has_value());
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("tokens past the hits are new blocks unless they are external") {
  auto manager = NewManager(kOptions);
  const std::vector<BlockHash> hashes = Chain(1, 3);
  REQUIRE_OK(manager->AllocateSlots({.request_id = "a",
                                     .block_hashes = hashes,
                                     .num_tokens = 48,
                                     .num_new_tokens = 48}));
  const Ids hit_ids = {1, 2};
  const OneGroup hit(hit_ids);
  auto result = manager->AllocateSlots({.request_id = "b",
                                        .block_hashes = hashes,
                                        .num_tokens = 60,
                                        .num_computed_tokens = 4,
                                        .num_new_tokens = 1,
                                        .num_new_computed_tokens = 32,
                                        .new_computed_blocks = hit});
  REQUIRE_OK(result);
  REQUIRE(result->groups[0].first_new_block ==
          2);  // vLLM returns block 3 as new.
  REQUIRE(Held(*manager, "b") == Ids{1, 2, 4});
  auto external = manager->AllocateSlots({.request_id = "c",
                                          .block_hashes = hashes,
                                          .num_tokens = 60,
                                          .num_new_tokens = 1,
                                          .num_new_computed_tokens = 32,
                                          .new_computed_blocks = hit,
                                          .num_external_computed_tokens = 16});
  REQUIRE_OK(external);
  REQUIRE(external->groups[0].first_new_block ==
          3);  // block 3 holds external KV.
  REQUIRE(Held(*manager, "c") == Ids{1, 2, 5, 6});
}

TEST_CASE("token counts near int64's limit do not overflow") {
  auto manager = NewManager(kOptions);
  const std::vector<BlockHash> hashes = Chain(1, 3);
  auto result =
      manager->AllocateSlots({.request_id = "a",
                              .block_hashes = hashes,
                              .num_tokens = 48,
                              .num_computed_tokens = int64_t{1} << 62,
                              .num_new_tokens = 1,
                              .num_new_computed_tokens = int64_t{1} << 62,
                              .num_lookahead_tokens = INT64_MAX});
  REQUIRE_OK(result);
  REQUIRE_FALSE(result->allocated);  // max_model_len's 512 blocks: too many.
  REQUIRE(manager->num_requests() == 0);
}

TEST_CASE("blocks are evicted least recently freed first, removals reported") {
  VllmKvCacheManagerOptions options = kOptions;
  options.num_blocks = 6;
  options.enable_kv_cache_events = true;
  auto manager = NewManager(options);
  const std::vector<BlockHash> a = Chain(1, 2);
  const std::vector<BlockHash> b = Chain(2, 2);
  REQUIRE_OK(manager->AllocateSlots({.request_id = "a",
                                     .block_hashes = a,
                                     .num_tokens = 32,
                                     .num_new_tokens = 32}));
  REQUIRE_OK(manager->AllocateSlots({.request_id = "b",
                                     .block_hashes = b,
                                     .num_tokens = 32,
                                     .num_new_tokens = 32}));
  manager->Free("a");  // Queue: 5, 2, 1.
  manager->Free("b");  // Queue: 5, 2, 1, 4, 3.
  REQUIRE(Removed(*manager).empty());
  auto result = manager->AllocateSlots({.request_id = "c",
                                        .block_hashes = Chain(3, 2),
                                        .num_tokens = 40,
                                        .num_new_tokens = 40});
  REQUIRE_OK(result);
  REQUIRE(Held(*manager, "c") == Ids{5, 2, 1});
  // a's chain was evicted tail first.
  REQUIRE(Removed(*manager) == std::vector<BlockHash>{a[1], a[0]});
  REQUIRE(HitOf(*manager, a, 100).empty());
  const auto hit = HitOf(*manager, b, 100);
  REQUIRE(hit == Ids{3, 4});

  SECTION("evict_blocks drops hashes of used and free blocks alike") {
    // 4: b's, free; 1: c's third block, uncached; 2: c's second.
    REQUIRE_OK(manager->EvictBlocks(Ids{4, 1, 2, 0}));
    REQUIRE(Removed(*manager) == std::vector<BlockHash>{b[1], Chain(3, 2)[1]});
    REQUIRE(manager->RefCount(2) == 1);
    const auto after = HitOf(*manager, b, 100);
    REQUIRE(after == Ids{3});
  }
  SECTION("reset refuses while a request holds blocks") {
    REQUIRE_FALSE(manager->ResetPrefixCache());
    REQUIRE(HitOf(*manager, b, 100).size() == 2);
    manager->Free("c");
    REQUIRE(manager->ResetPrefixCache());
    REQUIRE(HitOf(*manager, b, 100).empty());
    REQUIRE(manager->pool().NumCached() == 0);
  }
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("eagle leaves the last hit block to be computed again") {
  VllmKvCacheManagerOptions options = kOptions;
  options.use_eagle = true;
  auto manager = NewManager(options);
  const std::vector<BlockHash> hashes = Chain(1, 3);
  REQUIRE_OK(manager->AllocateSlots({.request_id = "a",
                                     .block_hashes = hashes,
                                     .num_tokens = 48,
                                     .num_new_tokens = 48}));
  const auto hit = HitOf(*manager, hashes, 100);
  REQUIRE(hit == Ids{1, 2});
  // Within num_tokens - 1 = 47 tokens two blocks match; eagle keeps one.
  REQUIRE(HitOf(*manager, hashes, 47).size() == 1);
}

TEST_CASE("lookahead and draft slots get blocks that are never cached") {
  auto manager = NewManager(kOptions);
  const std::vector<BlockHash> hashes = Chain(1, 2);
  // 20 prompt tokens, 3 draft tokens scheduled with them, 4 lookahead.
  auto result = manager->AllocateSlots({.request_id = "a",
                                        .block_hashes = hashes,
                                        .num_tokens = 20,
                                        .num_new_tokens = 23,
                                        .num_lookahead_tokens = 4});
  REQUIRE_OK(result);
  REQUIRE(Held(*manager, "a") == Ids{1, 2});
  REQUIRE(result->groups[0].cached_to == 1);  // min(23, num_tokens 20) / 16.
  REQUIRE_FALSE(manager->CachedHash(2).has_value());
  // A later call that needs fewer slots (drafts rejected) keeps the blocks.
  auto next = manager->AllocateSlots({.request_id = "a",
                                      .block_hashes = hashes,
                                      .num_tokens = 21,
                                      .num_computed_tokens = 20,
                                      .num_new_tokens = 1});
  REQUIRE_OK(next);
  REQUIRE(next->groups[0].first_new_block == 2);
  REQUIRE(Held(*manager, "a") == Ids{1, 2});
}

TEST_CASE("caching off: no hits, no hashes needed") {
  VllmKvCacheManagerOptions options = kOptions;
  options.enable_caching = false;
  auto manager = NewManager(options);
  REQUIRE_OK(manager->AllocateSlots(
      {.request_id = "a", .num_tokens = 40, .num_new_tokens = 40}));
  REQUIRE(manager->pool().NumCached() == 0);
  REQUIRE(HitOf(*manager, Chain(1, 2), 100).empty());
  REQUIRE(Held(*manager, "a") == Ids{1, 2, 3});
}

TEST_CASE("a kept hit is known unchanged until the cache changes under it") {
  VllmKvCacheManagerOptions options = kOptions;
  options.num_blocks = 8;
  const bool eagle = GENERATE(false, true);
  options.use_eagle = eagle;
  auto manager = NewManager(options);
  const std::vector<BlockHash> hashes = Chain(1, 4);
  REQUIRE_OK(manager->AllocateSlots({.request_id = "a",
                                     .block_hashes = hashes,
                                     .num_tokens = 48,
                                     .num_new_tokens = 48}));
  const Ids hit = HitOf(*manager, hashes, 63);
  REQUIRE(hit == (eagle ? Ids{1, 2} : Ids{1, 2, 3}));
  REQUIRE(Unchanged(*manager, hashes, 63, hit));
  REQUIRE_FALSE(Unchanged(*manager, hashes, 47, hit));  // other bound.
  // Another request's blocks change nothing the hit depends on.
  REQUIRE_OK(manager->AllocateSlots({.request_id = "b",
                                     .block_hashes = Chain(2, 1),
                                     .num_tokens = 16,
                                     .num_new_tokens = 16}));
  REQUIRE(Unchanged(*manager, hashes, 63, hit));
  SECTION("a hit block evicted") {
    REQUIRE_OK(manager->EvictBlocks(Ids{eagle ? 3 : 2}));
    REQUIRE_FALSE(Unchanged(*manager, hashes, 63, hit));
  }
  SECTION("the next block cached: the hit grows") {
    REQUIRE_OK(manager->CacheBlocks("a", hashes, 48));  // cached already.
    REQUIRE(Unchanged(*manager, hashes, 100, HitOf(*manager, hashes, 100)));
    const Ids kept = HitOf(*manager, hashes, 100);
    REQUIRE_OK(manager->AllocateSlots({.request_id = "a",
                                       .block_hashes = hashes,
                                       .num_tokens = 64,
                                       .num_computed_tokens = 48,
                                       .num_new_tokens = 16}));
    REQUIRE_FALSE(Unchanged(*manager, hashes, 100, kept));
  }
}

// Hybrid models: a full-attention group and a 32-token sliding window, both
// of 16-token blocks (vLLM's test_prefill_hybrid_model shape).
VllmKvCacheManagerOptions HybridOptions() {
  VllmKvCacheManagerOptions options = kOptions;
  options.num_blocks = 21;
  options.kv_cache_groups = {{.page_size = 16},
                             {.kind = AttentionKind::kSlidingWindow,
                              .page_size = 16,
                              .sliding_window = 32}};
  return options;
}

TEST_CASE("create refuses hybrid configs vLLM cannot serve") {
  const struct {
    std::vector<KvCacheGroupSpec> groups;
    bool use_eagle;
    const char* message;
  } cases[] = {
      {{{.kind = AttentionKind::kSlidingWindow, .page_size = 16}},
       false,
       "sliding_window must be positive"},
      {{{.page_size = 16}, {.page_size = 24}},
       false,
       "block size 24 is not a multiple of the hash block size 16"},
      {{{.page_size = 16},
        {.kind = AttentionKind::kChunkedLocal,
         .page_size = 16,
         .attention_chunk_size = 64}},
       true,
       "EAGLE drafting is not supported with chunked local attention"},
      {{{.kind = AttentionKind::kChunkedLocal,
         .page_size = 16,
         .attention_chunk_size = 64},
        {.page_size = 32}},
       false,
       "chunked local attention needs the pages of every group to divide "
       "its own (page_size 16, least common multiple 32)"},
  };
  for (const auto& c : cases) {
    VllmKvCacheManagerOptions options = kOptions;
    options.kv_cache_groups = c.groups;
    options.use_eagle = c.use_eagle;
    const auto made = VllmKvCacheManager::Create(options);
    INFO(made.status());
    REQUIRE(made.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(absl::StrContains(made.status().message(), c.message));
  }
  VllmKvCacheManagerOptions options = kOptions;
  options.max_num_batched_tokens = -1;
  REQUIRE_STATUS_IS(VllmKvCacheManager::Create(options), kInvalidArgument);
}

// vLLM's coordinator without prefix caching (KVCacheCoordinatorNoPrefixCache)
// never looks a hit up, so it serves the chunked-local groups whose lookups
// it asserts against: pages other than the multiple, and EAGLE.
TEST_CASE("without caching, chunked-local groups need nothing of hits") {
  const auto chunked = [](int32_t page_size, int32_t chunk) {
    return KvCacheGroupSpec{.kind = AttentionKind::kChunkedLocal,
                            .page_size = page_size,
                            .attention_chunk_size = chunk};
  };
  const struct {
    std::vector<KvCacheGroupSpec> groups;
    bool use_eagle;
    std::vector<Ids> blocks;  // vLLM 28be48fa's for 29 tokens.
  } cases[] = {
      {{chunked(6, 12), {.page_size = 4}},
       false,
       {{1, 2, 3, 4, 5}, {6, 7, 8, 9, 10, 11, 12, 13}}},
      {{chunked(4, 8), {.page_size = 8}},
       false,
       {{1, 2, 3, 4, 5, 6, 7, 8}, {9, 10, 11, 12}}},
      {{{.page_size = 4}, chunked(4, 8)},
       true,
       {{1, 2, 3, 4, 5, 6, 7, 8}, {9, 10, 11, 12, 13, 14, 15, 16}}},
  };
  for (const auto& c : cases) {
    VllmKvCacheManagerOptions options = {.num_blocks = 20,
                                         .block_size = 4,
                                         .max_model_len = 64,
                                         .enable_caching = false,
                                         .use_eagle = c.use_eagle};
    options.kv_cache_groups = c.groups;
    auto manager = NewManager(options);
    // No finder without caching: an empty hit for every group.
    const std::vector<BlockHash> hashes = Chain(1, 4);
    const GroupCacheHit& hit = manager->FindLongestCacheHit(hashes, 16);
    REQUIRE(hit.hit_tokens == 0);
    REQUIRE(hit.pages == std::vector<std::vector<PageId>>(2));
    REQUIRE_OK(manager->AllocateSlots(
        {.request_id = "a", .num_tokens = 29, .num_new_tokens = 29}));
    for (int32_t g = 0; g < 2; ++g) {
      const auto blocks = manager->Blocks("a", g);
      REQUIRE(Ids(blocks.begin(), blocks.end()) == c.blocks[g]);
    }
    options.enable_caching = true;
    REQUIRE_STATUS_IS(VllmKvCacheManager::Create(options), kInvalidArgument);
  }
}

TEST_CASE("create refuses groups whose hash prefixes no machine can hold") {
  // 1,000 blocks, each keeping the hashes of its 2^29 one-token blocks: 17
  // TB, which the constructor tried to allocate (an abort).
  VllmKvCacheManagerOptions options = {
      .num_blocks = 1000, .block_size = 1, .max_model_len = 1 << 20};
  options.kv_cache_groups = {{.page_size = 1 << 29}};
  const auto manager = VllmKvCacheManager::Create(options);
  REQUIRE_STATUS_IS(manager, kResourceExhausted);
  REQUIRE(absl::StrContains(manager.status().message(),
                            "vllm kv cache manager: reserving"));
}

TEST_CASE("computed tokens past a request's blocks are refused unchanged") {
  // A window would skip blocks the request never held: vLLM's check counts
  // them as null blocks and its allocation takes them from the pool. The
  // call passed the check, failed in the pool (ResourceExhausted, not
  // allocated=false), and had freed the request's window blocks first.
  VllmKvCacheManagerOptions options = {
      .num_blocks = 25, .block_size = 4, .max_model_len = 64};
  options.kv_cache_groups = {{.page_size = 4},
                             {.kind = AttentionKind::kSlidingWindow,
                              .page_size = 4,
                              .sliding_window = 4}};
  const std::vector<BlockHash> hashes = Chain(1, 16);
  auto fresh = NewManager(options);
  const auto first = fresh->AllocateSlots({.request_id = "a",
                                           .block_hashes = hashes,
                                           .num_tokens = 64,
                                           .num_computed_tokens = 60,
                                           .num_new_tokens = 4});
  REQUIRE_STATUS_IS(first, kInvalidArgument);
  REQUIRE(absl::StrContains(first.status().message(),
                            "computed tokens past the request's blocks"));
  REQUIRE(fresh->num_requests() == 0);

  auto manager = NewManager(options);
  REQUIRE_OK(manager->AllocateSlots({.request_id = "a",
                                     .block_hashes = hashes,
                                     .num_tokens = 16,
                                     .num_new_tokens = 16,
                                     .delay_cache_blocks = true}));
  const State before = StateOf(*manager, "a");
  const auto jumped = manager->AllocateSlots({.request_id = "a",
                                              .block_hashes = hashes,
                                              .num_tokens = 20,
                                              .num_computed_tokens = 1000,
                                              .num_new_tokens = 4});
  REQUIRE_STATUS_IS(jumped, kInvalidArgument);
  REQUIRE(
      absl::StrContains(jumped.status().message(), "num_computed_tokens 1000"));
  REQUIRE(StateOf(*manager, "a") == before);
  const auto window = manager->Blocks("a", 1);
  REQUIRE(std::find(window.begin(), window.end(), 0) == window.end());
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("remove_skipped_blocks with no or a negative count changes nothing") {
  auto manager = NewManager(HybridOptions());
  REQUIRE_OK(manager->AllocateSlots({.request_id = "a",
                                     .block_hashes = Chain(1, 6),
                                     .num_tokens = 100,
                                     .num_new_tokens = 100}));
  const auto before = manager->pool().Snapshot();
  const auto window = manager->Blocks("a", 1);
  const Ids blocks(window.begin(), window.end());
  // INT64_MIN overflowed the window's count (UBSan).
  for (const int64_t tokens : {int64_t{0}, int64_t{-1}, INT64_MIN}) {
    manager->RemoveSkippedBlocks("a", tokens);
    REQUIRE(manager->pool().Snapshot() == before);
    const auto after = manager->Blocks("a", 1);
    REQUIRE(Ids(after.begin(), after.end()) == blocks);
  }
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("a hybrid request holds a list a group, the window's nulled") {
  auto manager = NewManager(HybridOptions());
  REQUIRE(manager->num_groups() == 2);
  const std::vector<BlockHash> hashes = Chain(1, 6);
  auto first = manager->AllocateSlots({.request_id = "a",
                                       .block_hashes = hashes,
                                       .num_tokens = 100,
                                       .num_new_tokens = 100});
  REQUIRE_OK(first);
  REQUIRE(first->groups.size() == 2);
  REQUIRE(Held(*manager, "a") == Ids{1, 2, 3, 4, 5, 6, 7});
  const auto window = manager->Blocks("a", 1);
  REQUIRE(Ids(window.begin(), window.end()) == Ids{8, 9, 10, 11, 12, 13, 14});
  REQUIRE(first->groups[1].cached_to == 6);
  REQUIRE(manager->CachedGroup(8) == 1);
  REQUIRE(manager->CachedHash(8) == hashes[0]);  // the group's own key.
  REQUIRE(manager->TakeNewBlockIds() ==
          std::vector<Ids>{{1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14}});
  REQUIRE(manager->GetNumCommonPrefixBlocks("a") == std::vector<int32_t>{7, 0});

  // The next token's window (tokens 69..100) starts in block 4: blocks 0-3
  // of the window group go, newest first, before the check.
  const int32_t free_before = manager->NumFreeBlocks();
  auto decode = manager->AllocateSlots({.request_id = "a",
                                        .block_hashes = hashes,
                                        .num_tokens = 101,
                                        .num_computed_tokens = 100,
                                        .num_new_tokens = 1});
  REQUIRE_OK(decode);
  const auto skipped = manager->Blocks("a", 1);
  REQUIRE(Ids(skipped.begin(), skipped.end()) == Ids{0, 0, 0, 0, 12, 13, 14});
  REQUIRE(manager->NumFreeBlocks() == free_before + 4);
  // Cached, they stay evictable: a hit for another prompt finds the
  // window's last two blocks, the ones before are null.
  const auto& hit = manager->FindLongestCacheHit(hashes, 99);
  REQUIRE(hit.hit_tokens == 96);
  REQUIRE(hit.pages[0] == Ids{1, 2, 3, 4, 5, 6});
  REQUIRE(hit.pages[1] == Ids{0, 0, 0, 0, 12, 13});
  const std::array<absl::Span<const PageId>, 2> lists = {hit.pages[0],
                                                         hit.pages[1]};
  const std::vector<Ids> kept = {hit.pages[0], hit.pages[1]};
  auto second = manager->AllocateSlots({.request_id = "b",
                                        .block_hashes = hashes,
                                        .num_tokens = 100,
                                        .num_new_tokens = 4,
                                        .num_new_computed_tokens = 96,
                                        .new_computed_blocks = lists});
  REQUIRE_OK(second);
  // Its 96 computed tokens skip window blocks 0-3 (the next token reads
  // tokens 65..96): they are null in its list too.
  const auto b_window = manager->Blocks("b", 1);
  REQUIRE(Ids(b_window.begin(), b_window.end()) == Ids{0, 0, 0, 0, 12, 13, 16});
  REQUIRE(Held(*manager, "b") ==
          Ids{1, 2, 3, 4, 5, 6, 15});  // group 0's first.
  REQUIRE(manager->RefCount(12) == 2);
  REQUIRE_OK(manager->CheckInvariants());
  manager->Free("a");
  manager->Free("b");
  REQUIRE(manager->NumFreeBlocks() == 20);
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("a hybrid call that cannot allocate keeps the window's frees") {
  VllmKvCacheManagerOptions options = HybridOptions();
  options.num_blocks = 15;  // 14 real blocks: a's 7 + 7.
  auto manager = NewManager(options);
  const std::vector<BlockHash> hashes = Chain(1, 12);
  REQUIRE_OK(manager->AllocateSlots({.request_id = "a",
                                     .block_hashes = hashes,
                                     .num_tokens = 100,
                                     .num_new_tokens = 100}));
  REQUIRE(manager->NumFreeBlocks() == 0);
  // 100 computed tokens and 30 more need blocks 7 and 8 of both groups: 4
  // blocks; the window frees 4 of its own first, as vLLM's
  // remove_skipped_blocks does, and then 4 fit.
  auto longer = manager->AllocateSlots({.request_id = "a",
                                        .block_hashes = hashes,
                                        .num_tokens = 130,
                                        .num_computed_tokens = 100,
                                        .num_new_tokens = 30});
  REQUIRE_OK(longer);
  REQUIRE(longer->allocated);
  // One block more than the pool holds: nothing allocated, the skip kept.
  auto too_long = manager->AllocateSlots({.request_id = "a",
                                          .block_hashes = hashes,
                                          .num_tokens = 200,
                                          .num_computed_tokens = 130,
                                          .num_new_tokens = 70});
  REQUIRE_OK(too_long);
  REQUIRE_FALSE(too_long->allocated);
  const auto window = manager->Blocks("a", 1);
  REQUIRE(std::count(window.begin(), window.end(), 0) == 6);
  REQUIRE(manager->NumFreeBlocks() == 2);
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("hybrid hits must come a list a group, none null in full groups") {
  auto manager = NewManager(HybridOptions());
  const std::vector<BlockHash> hashes = Chain(1, 3);
  REQUIRE_OK(manager->AllocateSlots({.request_id = "a",
                                     .block_hashes = hashes,
                                     .num_tokens = 48,
                                     .num_new_tokens = 48}));
  const State before = StateOf(*manager, "b");
  const Ids full = {1, 2}, window = {0, 6}, null_full = {0, 2};
  const std::array<absl::Span<const PageId>, 1> one = {full};
  const std::array<absl::Span<const PageId>, 2> bad_null = {null_full, window};
  const struct {
    absl::Span<const absl::Span<const PageId>> hits;
    const char* message;
  } cases[] = {
      {one, "new_computed_blocks has 1 lists, one a kv cache group (2)"},
      {bad_null, "computed block 0 of kv cache group 0 (id 0) is not cached"},
  };
  for (const auto& c : cases) {
    auto result = manager->AllocateSlots({.request_id = "b",
                                          .block_hashes = hashes,
                                          .num_tokens = 40,
                                          .num_new_tokens = 8,
                                          .num_new_computed_tokens = 32,
                                          .new_computed_blocks = c.hits});
    INFO(result.status());
    REQUIRE(result.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(absl::StrContains(result.status().message(), c.message));
    REQUIRE(StateOf(*manager, "b") == before);
  }
}

TEST_CASE("a group of twice the hash block size keys a block by two hashes") {
  VllmKvCacheManagerOptions options = kOptions;
  options.num_blocks = 20;
  options.enable_kv_cache_events = true;
  options.kv_cache_groups = {{.page_size = 32},
                             {.kind = AttentionKind::kSlidingWindow,
                              .page_size = 16,
                              .sliding_window = 32}};
  auto manager = NewManager(options);
  const std::vector<BlockHash> hashes = Chain(1, 4);
  auto result = manager->AllocateSlots({.request_id = "a",
                                        .block_hashes = hashes,
                                        .num_tokens = 64,
                                        .num_new_tokens = 64});
  REQUIRE_OK(result);
  REQUIRE(Held(*manager, "a") == Ids{1, 2});
  REQUIRE(manager->CachedHash(2) == hashes[3]);
  const auto prefix = manager->CachedHashPrefix(2);
  REQUIRE(std::vector<BlockHash>(prefix.begin(), prefix.end()) ==
          std::vector<BlockHash>{hashes[2]});
  REQUIRE(manager->CachedHashPrefix(3).empty());  // a 16-token block.
  const auto& hit = manager->FindLongestCacheHit(hashes, 63);
  REQUIRE(hit.hit_tokens == 32);
  REQUIRE(hit.pages[0] == Ids{1});
  REQUIRE(hit.pages[1] == Ids{3, 4});
  // Evicted, block 2 is reported under both of its hashes.
  REQUIRE_OK(manager->EvictBlocks(Ids{2}));
  const auto removed = manager->TakeRemovedHashes();
  REQUIRE(removed.size() == 1);
  REQUIRE(removed[0].group == 0);
  REQUIRE(removed[0].hashes == std::vector<BlockHash>{hashes[2], hashes[3]});
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("computed tokens past max_model_len ask a window for no more nulls") {
  auto manager = NewManager(HybridOptions());
  // External tokens near int64's limit: the window would skip 2^58 blocks.
  auto result = manager->AllocateSlots(
      {.request_id = "a",
       .num_tokens = 64,
       .num_new_tokens = 1,
       .num_external_computed_tokens = int64_t{1} << 62});
  REQUIRE_OK(result);
  REQUIRE_FALSE(result->allocated);  // max_model_len's 512 blocks: too many.
  REQUIRE(manager->num_requests() == 0);
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("hits and external tokens: every group's hits are taken first") {
  // Two prompts cached and freed (13 of 20 blocks cached), then a prompt
  // of 64 cached tokens and 48 from a connector: group 0's blocks for the
  // external tokens must not evict group 1's hits (vLLM's order, group by
  // group, hands one block to both groups here).
  auto manager = NewManager(HybridOptions());
  REQUIRE(manager->options().kv_cache_groups[1].sliding_window == 32);
  VllmKvCacheManagerOptions options = HybridOptions();
  options.kv_cache_groups[1].sliding_window = 128;
  options.max_model_len = 4096;
  manager = NewManager(options);
  const std::vector<BlockHash> a = Chain(1, 4), d = Chain(2, 4);
  for (const auto& [id, hashes] : {std::pair{"a", &a}, std::pair{"d", &d}}) {
    REQUIRE_OK(manager->AllocateSlots({.request_id = id,
                                       .block_hashes = *hashes,
                                       .num_tokens = 65,
                                       .num_new_tokens = 65}));
  }
  manager->Free("a");
  manager->Free("d");
  std::vector<BlockHash> b = Chain(1, 4);
  for (const BlockHash& hash : Chain(3, 4)) b.push_back(hash);
  // An entry made before the call (vLLM's defaultdict does so too).
  REQUIRE(manager->GetNumCommonPrefixBlocks("b") == std::vector<int32_t>{0, 0});
  const GroupCacheHit hit = manager->FindLongestCacheHit(b, 127);
  REQUIRE(hit.hit_tokens == 64);
  const std::array<absl::Span<const PageId>, 2> lists = {hit.pages[0],
                                                         hit.pages[1]};
  const VllmSlotRequest slots = {.request_id = "b",
                                 .block_hashes = b,
                                 .num_tokens = 128,
                                 .num_new_tokens = 16,
                                 .num_new_computed_tokens = 64,
                                 .new_computed_blocks = lists,
                                 .num_external_computed_tokens = 48};
  // Every allocation failure on the way undoes the whole call, the entry
  // made before included.
  const State before = StateOf(*manager, "b");
  int64_t faults = 0;
  for (int64_t n = 1;; ++n) {
    CAPTURE(n);
    REQUIRE(n < 64);  // the call goes through once no fault is left.
    internal::FaultInjection::FailNth(n);
    auto failed = manager->AllocateSlots(slots);
    internal::FaultInjection::Disarm();
    if (failed.ok()) break;
    ++faults;
    REQUIRE(StateOf(*manager, "b") == before);
    REQUIRE(manager->Blocks("b", 1).empty());
    REQUIRE_OK(manager->CheckInvariants());
    manager->Free("b");  // the undone call left the entry as it was.
    REQUIRE(manager->GetNumCommonPrefixBlocks("b") ==
            std::vector<int32_t>{0, 0});
  }
  REQUIRE(faults >= 2);
  // The call that went through: both groups' hits held once each.
  const auto full = manager->Blocks("b", 0);
  const auto window = manager->Blocks("b", 1);
  REQUIRE(full.size() == 8);
  REQUIRE(window.size() == 8);
  for (PageId block : full) {
    REQUIRE(std::find(window.begin(), window.end(), block) == window.end());
  }
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE(
    "external tokens past max_model_len that no pool could hold are "
    "refused with nothing changed") {
  // The capacity check counts max_model_len's blocks; vLLM would then fail
  // in get_new_blocks (or on a list of that many null blocks).
  VllmKvCacheManagerOptions one = kOptions;
  one.max_model_len = 64;
  VllmKvCacheManagerOptions hybrid = HybridOptions();
  hybrid.max_model_len = 64;
  const struct {
    VllmKvCacheManagerOptions options;
    const char* message;
  } cases[] = {
      {one,
       "1000 computed tokens need 63 blocks for external tokens; 10 "
       "are free"},
      {hybrid, "1000 computed tokens skip 60 blocks of kv cache group 1"},
  };
  for (const auto& c : cases) {
    auto manager = NewManager(c.options);
    REQUIRE(manager->GetNumCommonPrefixBlocks("a").size() ==
            static_cast<size_t>(manager->num_groups()));  // an entry.
    const State before = StateOf(*manager, "a");
    auto result =
        manager->AllocateSlots({.request_id = "a",
                                .num_tokens = 1001,
                                .num_new_tokens = 1,
                                .num_external_computed_tokens = 1000});
    INFO(result.status());
    REQUIRE(result.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(absl::StrContains(result.status().message(), c.message));
    REQUIRE(StateOf(*manager, "a") == before);
    REQUIRE_OK(manager->CheckInvariants());
  }
}

// Host tier
// --------------------------------------------------------------------

// 10 blocks of 16 tokens and a host tier of `host_pages`, events on.
VllmKvCacheManagerOptions HostOptions(int32_t host_pages) {
  VllmKvCacheManagerOptions options = kOptions;
  options.enable_kv_cache_events = true;
  options.host_pages = host_pages;
  return options;
}

std::vector<HostCopy> TakeCopies(VllmKvCacheManager& manager) {
  std::vector<HostCopy> copies;
  REQUIRE_OK(manager.TakeHostCopies(copies));
  return copies;
}

// The copies of `copies` in `direction`, in order.
std::vector<HostCopy> OfDirection(const std::vector<HostCopy>& copies,
                                  HostCopy::Direction direction) {
  std::vector<HostCopy> found;
  for (const HostCopy& copy : copies) {
    if (copy.direction == direction) found.push_back(copy);
  }
  return found;
}

// The hashes of the host tier's stores (or drops) since the last call.
std::vector<BlockHash> HostEvents(VllmKvCacheManager& manager, bool removed) {
  std::vector<BlockHash> hashes;
  for (const auto& event : manager.TakeHostEvents()) {
    if (event.removed == removed) hashes.push_back(event.hash);
  }
  return hashes;
}

// Request `id` of `num_tokens` tokens, all new, computed and cached.
void Prefill(VllmKvCacheManager& manager, absl::string_view id,
             const std::vector<BlockHash>& hashes, int64_t num_tokens) {
  auto result = manager.AllocateSlots({.request_id = id,
                                       .block_hashes = hashes,
                                       .num_tokens = num_tokens,
                                       .num_new_tokens = num_tokens});
  REQUIRE_OK(result);
  REQUIRE(result->allocated);
}

// Prompt a (4 full blocks and a token) computed and freed, then evicted
// into the host tier by prompt b, which takes all 10 blocks and is freed;
// every copy batch and event taken.
const std::vector<BlockHash> kA = Chain(1, 4);
std::unique_ptr<VllmKvCacheManager> ManagerWithAInHost(int32_t host_pages) {
  auto manager = NewManager(HostOptions(host_pages));
  Prefill(*manager, "a", kA, 65);
  manager->Free("a");
  REQUIRE(TakeCopies(*manager).empty());  // write-back: nothing moved yet.
  Prefill(*manager, "b", Chain(2, 10), 160);
  manager->Free("b");
  const std::vector<HostCopy> stores = TakeCopies(*manager);
  REQUIRE(stores.size() == 4);
  REQUIRE(OfDirection(stores, HostCopy::Direction::kDeviceToHost).size() == 4);
  // Evicted continuation first (vLLM's queue: a freed request's tail
  // first), each a CPU store under its request hash.
  REQUIRE(HostEvents(*manager, false) ==
          std::vector<BlockHash>{kA[3], kA[2], kA[1], kA[0]});
  REQUIRE(manager->NumHostCached() == 4);
  REQUIRE(Removed(*manager).size() == 4);  // the GPU's removals, apart.
  manager->TakeNewBlockIds();
  return manager;
}

TEST_CASE("create refuses a host tier it cannot serve") {
  VllmKvCacheManagerOptions options = HostOptions(-1);
  REQUIRE_STATUS_IS(VllmKvCacheManager::Create(options), kInvalidArgument);
  options.host_pages = 4;
  options.enable_caching = false;
  auto uncached = VllmKvCacheManager::Create(options);
  REQUIRE_STATUS_IS(uncached, kInvalidArgument);
  REQUIRE(absl::StrContains(uncached.status().message(),
                            "host_pages = 4 needs caching on"));
  VllmKvCacheManagerOptions hybrid = HybridOptions();
  hybrid.host_pages = 4;
  auto two = VllmKvCacheManager::Create(hybrid);
  REQUIRE_STATUS_IS(two, kInvalidArgument);
  REQUIRE(
      absl::StrContains(two.status().message(),
                        "with 2 kv cache groups, the first full_attention"));
  hybrid.kv_cache_groups.erase(hybrid.kv_cache_groups.begin());
  auto window = VllmKvCacheManager::Create(hybrid);
  REQUIRE_STATUS_IS(window, kInvalidArgument);
  REQUIRE(absl::StrContains(window.status().message(),
                            "1 kv cache group of sliding_window"));
  // Without a host tier: nothing to match, copy or report.
  auto manager = NewManager(kOptions);
  Prefill(*manager, "a", kA, 65);
  manager->Free("a");
  REQUIRE(manager->GetNumNewMatchedTokens(kA, 65, 0) == 0);
  REQUIRE(TakeCopies(*manager).empty());
  REQUIRE(manager->TakeHostEvents().empty());
  REQUIRE(manager->host_pages() == 0);
}

TEST_CASE("a prompt evicted to the host tier is loaded back on its turn") {
  auto manager = ManagerWithAInHost(8);
  // The scheduler's calls for a waiting request: the device hit (none),
  // the connector's count, then allocate_slots with it as external tokens.
  REQUIRE(HitOf(*manager, kA, 64).empty());
  const State before = StateOf(*manager, "a");
  REQUIRE(manager->GetNumNewMatchedTokens(kA, 65, 0) == 64);
  REQUIRE(StateOf(*manager, "a") == before);
  auto result = manager->AllocateSlots({.request_id = "a",
                                        .block_hashes = kA,
                                        .num_tokens = 65,
                                        .num_new_tokens = 1,
                                        .num_external_computed_tokens = 64});
  REQUIRE_OK(result);
  REQUIRE(result->allocated);
  const Ids held = Held(*manager, "a");
  REQUIRE(held.size() == 5);
  // The loaded blocks are not new (vLLM's external blocks are not); they
  // are cached again under their hashes, [0, 4) for BlockStored.
  REQUIRE(result->groups[0].first_new_block == 4);
  REQUIRE(result->groups[0].cached_from == 0);
  REQUIRE(result->groups[0].cached_to == 4);
  for (int i = 0; i < 4; ++i) REQUIRE(manager->CachedHash(held[i]) == kA[i]);
  REQUIRE(HitOf(*manager, kA, 64) == Ids(held.begin(), held.begin() + 4));
  // Not blocks to zero: the loads write them whole.
  REQUIRE(manager->TakeNewBlockIds()[0] == Ids{held[4]});
  // The batch: the four loads into a's blocks, and each block taken
  // evicted one of b's: four stored in the host tier's free pages; the
  // fifth found every host page used by the batch (stored into or loaded
  // from) and was not stored.
  const std::vector<HostCopy> copies = TakeCopies(*manager);
  const auto loads = OfDirection(copies, HostCopy::Direction::kHostToDevice);
  REQUIRE(OfDirection(copies, HostCopy::Direction::kDeviceToHost).size() == 4);
  REQUIRE(manager->pool().stats().host_store_skips == 1);
  REQUIRE(loads.size() == 4);
  for (int i = 0; i < 4; ++i) REQUIRE(loads[i].device_page == held[i]);
  REQUIRE(HostEvents(*manager, false).size() == 4);
  REQUIRE(manager->TakeHostEvents().empty());
  REQUIRE(Removed(*manager).size() == 5);  // b's five, on the GPU.
  REQUIRE(manager->pool().stats().host_loads == 4);
  // A second prompt of a's blocks is a device hit now.
  REQUIRE(manager->GetNumNewMatchedTokens(kA, 65, 64) == 0);
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("a failure anywhere in a call with loads undoes the loads too") {
  auto manager = ManagerWithAInHost(4);  // full: the loads drop pages.
  const State before = StateOf(*manager, "a");
  const VllmSlotRequest slots = {.request_id = "a",
                                 .block_hashes = kA,
                                 .num_tokens = 65,
                                 .num_new_tokens = 33,
                                 .num_external_computed_tokens = 32};
  int64_t faults = 0;
  for (int64_t n = 1;; ++n) {
    CAPTURE(n);
    REQUIRE(n < 16);
    internal::FaultInjection::FailNth(n);
    auto failed = manager->AllocateSlots(slots);
    internal::FaultInjection::Disarm();
    if (failed.ok()) break;
    ++faults;
    REQUIRE(StateOf(*manager, "a") == before);
    REQUIRE(manager->TakeHostEvents().empty());
    REQUIRE(TakeCopies(*manager).empty());
    REQUIRE_OK(manager->CheckInvariants());
  }
  REQUIRE(faults >= 3);  // two loads and the new blocks.
  REQUIRE(OfDirection(TakeCopies(*manager), HostCopy::Direction::kHostToDevice)
              .size() == 2);
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("a prompt of whole blocks loads them all and computes its last") {
  auto manager = NewManager(HostOptions(8));
  Prefill(*manager, "a", kA, 64);
  manager->Free("a");
  TakeCopies(*manager);
  Prefill(*manager, "b", Chain(2, 10), 160);
  manager->Free("b");
  TakeCopies(*manager);
  // The connector would load all 64 tokens and vLLM compute the 64th
  // again: 63 here, the last block loaded all the same.
  REQUIRE(manager->GetNumNewMatchedTokens(kA, 64, 0) == 63);
  auto result = manager->AllocateSlots({.request_id = "a",
                                        .block_hashes = kA,
                                        .num_tokens = 64,
                                        .num_new_tokens = 1,
                                        .num_external_computed_tokens = 63});
  REQUIRE_OK(result);
  REQUIRE(Held(*manager, "a").size() == 4);
  REQUIRE(result->groups[0].first_new_block == 4);  // no block to compute.
  REQUIRE(result->groups[0].cached_to == 4);
  REQUIRE(OfDirection(TakeCopies(*manager), HostCopy::Direction::kHostToDevice)
              .size() == 4);
  // Less than a block past the hit is no match, as the connector's.
  REQUIRE(manager->GetNumNewMatchedTokens(Chain(2, 10), 160, 150) == 0);
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("a device hit continues into the host tier") {
  auto manager = NewManager(HostOptions(8));
  Prefill(*manager, "a", kA, 65);
  manager->Free("a");  // queue: 6..10, then a's 5, 4, 3, 2, 1.
  TakeCopies(*manager);
  Prefill(*manager, "c", Chain(3, 8), 128);  // evicts a's 4 and 3.
  manager->Free("c");
  TakeCopies(*manager);
  REQUIRE(HostEvents(*manager, false) == std::vector<BlockHash>{kA[3], kA[2]});
  const Ids hit = HitOf(*manager, kA, 64);
  REQUIRE(hit == Ids{1, 2});
  REQUIRE(manager->GetNumNewMatchedTokens(kA, 65, 32) == 32);
  // From block 0 the device holds the first: the connector's run starts
  // after the hit it is given.
  REQUIRE(manager->GetNumNewMatchedTokens(kA, 65, 0) == 0);
  auto result = manager->AllocateSlots({.request_id = "a",
                                        .block_hashes = kA,
                                        .num_tokens = 65,
                                        .num_new_tokens = 1,
                                        .num_new_computed_tokens = 32,
                                        .new_computed_blocks = OneGroup(hit),
                                        .num_external_computed_tokens = 32});
  REQUIRE_OK(result);
  const Ids held = Held(*manager, "a");
  REQUIRE(Ids(held.begin(), held.begin() + 2) == hit);
  REQUIRE(result->groups[0].cached_from == 2);
  REQUIRE(result->groups[0].cached_to == 4);
  const auto loads =
      OfDirection(TakeCopies(*manager), HostCopy::Direction::kHostToDevice);
  REQUIRE(loads.size() == 2);
  REQUIRE(loads[0].device_page == held[2]);
  REQUIRE(loads[1].device_page == held[3]);
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("loads pin their run: none drops a later block of it") {
  // A host tier of 4 holds a's blocks alone, a[3] at its LRU head. Each
  // load's new block evicts one of b's cached blocks, whose store would
  // drop the host tier's head; the run is pinned first (as the
  // connector's prepare_load pins it), so those stores are skipped.
  auto manager = ManagerWithAInHost(4);
  const State before = StateOf(*manager, "a");
  REQUIRE(manager->GetNumNewMatchedTokens(kA, 65, 0) == 64);
  REQUIRE(StateOf(*manager, "a") == before);  // a query changes nothing.
  auto result = manager->AllocateSlots({.request_id = "a",
                                        .block_hashes = kA,
                                        .num_tokens = 65,
                                        .num_new_tokens = 1,
                                        .num_external_computed_tokens = 64});
  REQUIRE_OK(result);
  REQUIRE(Held(*manager, "a").size() == 5);
  const std::vector<HostCopy> copies = TakeCopies(*manager);
  const auto loads = OfDirection(copies, HostCopy::Direction::kHostToDevice);
  REQUIRE(loads.size() == 4);
  // Every host page was pinned by the loads: b's evicted blocks were not
  // stored, and the host tier still holds all of a's.
  REQUIRE(OfDirection(copies, HostCopy::Direction::kDeviceToHost).empty());
  REQUIRE(manager->TakeHostEvents().empty());
  REQUIRE(Removed(*manager).size() == 5);  // a's 5 blocks each evicted b's.
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("a host tier's external tokens must be its blocks") {
  auto manager = ManagerWithAInHost(8);
  const State before = StateOf(*manager, "c");
  // Prompt b's blocks are on the device.
  const std::vector<BlockHash> b = Chain(2, 10);
  auto cached = manager->AllocateSlots({.request_id = "c",
                                        .block_hashes = b,
                                        .num_tokens = 100,
                                        .num_new_tokens = 1,
                                        .num_external_computed_tokens = 32});
  REQUIRE_STATUS_IS(cached, kInvalidArgument);
  REQUIRE(absl::StrContains(cached.status().message(),
                            "block 0 is cached on the device"));
  REQUIRE(StateOf(*manager, "c") == before);
  const std::vector<BlockHash> unknown = Chain(7, 4);
  auto missing = manager->AllocateSlots({.request_id = "c",
                                         .block_hashes = unknown,
                                         .num_tokens = 65,
                                         .num_new_tokens = 1,
                                         .num_external_computed_tokens = 64});
  REQUIRE_STATUS_IS(missing, kInvalidArgument);
  REQUIRE(absl::StrContains(missing.status().message(),
                            "the host tier does not hold block 0"));
  auto short_chain =
      manager->AllocateSlots({.request_id = "c",
                              .block_hashes = absl::MakeConstSpan(kA).first(2),
                              .num_tokens = 65,
                              .num_new_tokens = 1,
                              .num_external_computed_tokens = 64});
  REQUIRE_STATUS_IS(short_chain, kInvalidArgument);
  REQUIRE(absl::StrContains(short_chain.status().message(),
                            "has 2 block hashes; loading block 2"));
  REQUIRE(StateOf(*manager, "c") == before);
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("a loaded block its request frees before the batch is held") {
  auto manager = ManagerWithAInHost(8);
  REQUIRE_OK(manager->AllocateSlots({.request_id = "a",
                                     .block_hashes = kA,
                                     .num_tokens = 65,
                                     .num_new_tokens = 1,
                                     .num_external_computed_tokens = 64}));
  const Ids held = Held(*manager, "a");
  const int32_t free_before = manager->NumFreeBlocks();
  manager->Free("a");  // e.g. aborted in the step that scheduled it.
  // Its four loads have not landed: the pool holds those blocks, which no
  // request does (ref_cnt 0), until the batch is taken.
  REQUIRE(manager->NumFreeBlocks() == free_before + 1);
  for (int i = 0; i < 4; ++i) REQUIRE(manager->RefCount(held[i]) == 0);
  REQUIRE(manager->pool().parked_pages().size() == 4);
  REQUIRE_OK(manager->CheckInvariants());
  REQUIRE_FALSE(manager->ResetPrefixCache());  // copies not taken.
  REQUIRE(TakeCopies(*manager).size() == 8);   // 4 loads, 4 stores.
  REQUIRE(manager->NumFreeBlocks() == free_before + 5);
  REQUIRE_OK(manager->CheckInvariants());
  REQUIRE(manager->ResetPrefixCache());
  REQUIRE(manager->NumHostCached() == 0);
}

TEST_CASE("write-through stores every block in the batch after it is cached") {
  VllmKvCacheManagerOptions options = HostOptions(16);
  options.host_write_policy = HostWritePolicy::kWriteThrough;
  auto manager = NewManager(options);
  Prefill(*manager, "a", kA, 65);
  REQUIRE(TakeCopies(*manager).empty());  // its KV computed in this step.
  const std::vector<HostCopy> stores = TakeCopies(*manager);
  REQUIRE(stores.size() == 4);
  for (int i = 0; i < 4; ++i)
    REQUIRE(stores[i].device_page == Held(*manager, "a")[i]);
  REQUIRE(HostEvents(*manager, false) == kA);
  manager->Free("a");
  // Evicted later, a's blocks move nothing: the host tier has them.
  Prefill(*manager, "b", Chain(2, 10), 160);
  REQUIRE(TakeCopies(*manager).empty());
  REQUIRE(manager->NumHostCached() == 14);  // b's, stored in this batch.
  // The count is the host tier's, as the connector's; while b holds every
  // block the loads find no block to go to: allocate_slots says so (vLLM's
  // None), changing nothing.
  REQUIRE(manager->GetNumNewMatchedTokens(kA, 65, 0) == 64);
  auto full = manager->AllocateSlots({.request_id = "a",
                                      .block_hashes = kA,
                                      .num_tokens = 65,
                                      .num_new_tokens = 1,
                                      .num_external_computed_tokens = 64});
  REQUIRE_OK(full);
  REQUIRE(!full->allocated);
  REQUIRE(OfDirection(TakeCopies(*manager), HostCopy::Direction::kHostToDevice)
              .empty());
  manager->Free("b");
  REQUIRE(manager->GetNumNewMatchedTokens(kA, 65, 0) == 64);
  REQUIRE_OK(manager->CheckInvariants());
}

}  // namespace
}  // namespace kvblock
