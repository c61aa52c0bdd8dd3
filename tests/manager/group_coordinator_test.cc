// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// A BlockManager of several KV cache groups (lib/manager/group_coordinator.h):
// the window groups' skipped pages released to the null page, prefix hits
// every group serves, one transaction over all groups, and the errors.
#include "manager/group_coordinator.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/group_spec_test_util.h"
#include "kvblock/batch_commit.h"
#include "kvblock/block_manager.h"
#include "kvblock/device.h"
#include "kvblock/page_table.h"
#include "test_util.h"

namespace kvblock {
namespace {

using testing::TokenRange;
using Tokens = std::vector<TokenId>;

constexpr KvCacheGroupSpec Full(int32_t page_size = 4) {
  return testing::GroupSpec(AttentionKind::kFull, page_size);
}
constexpr KvCacheGroupSpec Window(int32_t window, int32_t page_size = 4) {
  return testing::GroupSpec(AttentionKind::kSlidingWindow, page_size, window);
}
constexpr KvCacheGroupSpec Chunked(int32_t chunk, int32_t page_size = 4) {
  return testing::GroupSpec(AttentionKind::kChunkedLocal, page_size, chunk);
}

PagedKvConfig Config(int32_t num_pages, int32_t max_pages_per_seq = 64) {
  return {.num_pages = num_pages,
          .max_batch = 8,
          .max_pages_per_seq = max_pages_per_seq,
          .page_size = 4};
}

std::unique_ptr<BlockManager> MakeManager(const PagedKvConfig& config,
                                          std::vector<KvCacheGroupSpec> groups,
                                          BlockManagerOptions options = {}) {
  options.kv_cache_groups = std::move(groups);
  auto manager = BlockManager::Create(config, options);
  REQUIRE_OK(manager);
  return std::move(manager).value();
}

std::vector<PageId> GroupPages(const BlockManager& manager, SequenceId id,
                               int32_t group) {
  auto pages = manager.GroupPages(id, group);
  REQUIRE_OK(pages);
  return {pages->begin(), pages->end()};
}

// The leading entries of `pages` that are the null page.
int64_t LeadingNull(const std::vector<PageId>& pages, PageId null_page) {
  return std::find_if(pages.begin(), pages.end(),
                      [&](PageId p) { return p != null_page; }) -
         pages.begin();
}

TEST_CASE("an append of no tokens releases nothing") {
  // At a chunk's end the next token reads nothing before it, but the last
  // token's page stays until a token is computed.
  auto manager = MakeManager(Config(64), {Full(), Chunked(8)});
  REQUIRE_OK(manager->Admit(1, TokenRange(1, 16)));
  REQUIRE_OK(manager->Append(1, {}));
  REQUIRE(LeadingNull(GroupPages(*manager, 1, 1), manager->null_page()) == 0);
  REQUIRE_OK(manager->CheckInvariants());
  REQUIRE_OK(manager->Append(1, TokenRange(100, 1)));
  REQUIRE(LeadingNull(GroupPages(*manager, 1, 1), manager->null_page()) == 4);
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("a sliding-window group holds only its window's pages") {
  // gpt-oss's shape: full attention and a window, here of 8 tokens.
  auto manager = MakeManager(Config(256), {Full(), Window(8)});
  REQUIRE(manager->num_groups() == 2);
  REQUIRE(manager->null_page() == 0);
  REQUIRE(manager->pool().RefCount(0) == 1);
  REQUIRE_OK(manager->Admit(1, TokenRange(1, 30)));
  // The admission computes all 30 tokens: every page is held.
  REQUIRE(GroupPages(*manager, 1, 1).size() == 8);
  REQUIRE(LeadingNull(GroupPages(*manager, 1, 1), 0) == 0);
  for (int step = 0; step < 100; ++step) {
    const int64_t computed = 30 + step;
    REQUIRE_OK(manager->Append(1, {TokenId{1000 + step}}));
    const std::vector<PageId> window = GroupPages(*manager, 1, 1);
    REQUIRE(window.size() ==
            static_cast<size_t>(PagesForTokens(computed + 1, 4)));
    // The pages before the window of the tokens computed so far are the
    // null page: (computed - 8 + 1) / 4 of them.
    REQUIRE(LeadingNull(window, 0) == std::max<int64_t>(0, computed - 7) / 4);
    // The window's own pages stay: at most ceil(8 / 4) + 1 live ones.
    REQUIRE(window.size() - LeadingNull(window, 0) <= 4);
    // Full attention keeps every page.
    REQUIRE(LeadingNull(GroupPages(*manager, 1, 0), 0) == 0);
    REQUIRE_OK(manager->CheckInvariants());
  }
  // The null page is held once per null entry, and once by the manager.
  const std::vector<PageId> window = GroupPages(*manager, 1, 1);
  REQUIRE(manager->pool().RefCount(0) == 1 + LeadingNull(window, 0));
  // Pages used: the full group's 33, the window's live ones, the null page.
  REQUIRE(manager->pool().NumUsed() ==
          33 + static_cast<int32_t>(window.size() - LeadingNull(window, 0)) +
              1);
  REQUIRE_OK(manager->Free(1));
  REQUIRE(manager->pool().NumUsed() == 1);
  REQUIRE(manager->pool().RefCount(0) == 1);
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE(
    "KV cache events of groups of two page sizes name pages in one chain") {
  auto manager =
      MakeManager(Config(64), {Full(4), Full(8)}, {.enable_kv_events = true});
  const Tokens prompt = TokenRange(1, 21);
  std::vector<BlockHash> chain(5);
  REQUIRE(*manager->HashPrompt(prompt, {}, absl::MakeSpan(chain)) == 5);
  REQUIRE_OK(manager->Admit(1, prompt));
  // Two more tokens fill group 1's third page (tokens 16 to 23).
  REQUIRE_OK(manager->Append(1, {TokenId{900}, TokenId{901}, TokenId{902}}));
  std::vector<KvCacheEvent> events;
  REQUIRE_OK(manager->TakeKvEvents(events));
  std::vector<BlockHash> stored[2];
  std::vector<TokenId> tokens[2];
  for (const KvCacheEvent& event : events) {
    REQUIRE(event.kind == KvCacheEvent::Kind::kBlockStored);
    const auto g = static_cast<size_t>(event.group_idx);
    // Each event's tokens are its group's pages.
    REQUIRE(event.token_ids.size() ==
            (g == 0 ? 4 : 8) * event.block_hashes.size());
    stored[g].insert(stored[g].end(), event.block_hashes.begin(),
                     event.block_hashes.end());
    tokens[g].insert(tokens[g].end(), event.token_ids.begin(),
                     event.token_ids.end());
  }
  // Group 0's pages are the prompt's blocks and the appended one; group
  // 1's are every second block, a router hashing blocks of 4 tokens finds
  // both groups' pages in its one chain.
  REQUIRE(stored[0].size() == 6);
  REQUIRE(std::equal(chain.begin(), chain.end(), stored[0].begin()));
  REQUIRE(stored[1].size() == 3);
  REQUIRE(stored[1][0] == chain[1]);
  REQUIRE(stored[1][1] == chain[3]);
  REQUIRE(stored[1][2] == stored[0][5]);
  REQUIRE(tokens[1] == tokens[0]);
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("a window group that caches some pages of a run names those") {
  // Full attention on pages of 8 and a 4-token window on pages of 4: hits
  // come in units of 8, and the window group caches the second page of
  // each (the one a hit reads), pages 1, 3 and 5 of the prompt's 6. Their
  // events used to name the run's first pages, 0, 1 and 2, whose removals
  // then came for hashes never stored.
  auto manager =
      MakeManager(Config(64), {Full(8), Window(4)}, {.enable_kv_events = true});
  const Tokens prompt = TokenRange(1, 25);
  std::vector<BlockHash> chain(6);
  REQUIRE(*manager->HashPrompt(prompt, {}, absl::MakeSpan(chain)) == 6);
  REQUIRE_OK(manager->Admit(1, prompt));
  std::vector<KvCacheEvent> events;
  REQUIRE_OK(manager->TakeKvEvents(events));
  std::vector<BlockHash> window_hashes;
  for (const KvCacheEvent& event : events) {
    if (event.group_idx != 1) continue;
    REQUIRE(event.kind == KvCacheEvent::Kind::kBlockStored);
    for (size_t i = 0; i < event.block_hashes.size(); ++i) {
      const auto page = static_cast<size_t>(
          std::find(chain.begin(), chain.end(), event.block_hashes[i]) -
          chain.begin());
      REQUIRE(page < chain.size());
      // Each page's tokens are its own.
      REQUIRE(std::equal(event.token_ids.begin() + 4 * i,
                         event.token_ids.begin() + 4 * (i + 1),
                         prompt.begin() + 4 * page));
      window_hashes.push_back(event.block_hashes[i]);
    }
  }
  REQUIRE(window_hashes ==
          std::vector<BlockHash>{chain[1], chain[3], chain[5]});
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("KV cache events name each page's group, with vLLM's hashes") {
  auto manager =
      MakeManager(Config(24), {Full(), Window(8)}, {.enable_kv_events = true});
  const Tokens prompt = TokenRange(1, 30);
  std::vector<BlockHash> hashes(7);
  REQUIRE_OK(manager->HashPrompt(prompt, {}, absl::MakeSpan(hashes)));
  REQUIRE_OK(manager->Admit(1, prompt));
  std::vector<KvCacheEvent> events;
  REQUIRE_OK(manager->TakeKvEvents(events));
  // Both groups stored the prompt's 7 full pages, under the same hashes.
  REQUIRE(events.size() == 2);
  for (int32_t g = 0; g < 2; ++g) {
    REQUIRE(events[g].kind == KvCacheEvent::Kind::kBlockStored);
    REQUIRE(events[g].group_idx == g);
    REQUIRE(events[g].block_hashes == hashes);
    REQUIRE(events[g].token_ids.size() == 28);
  }
  // The window's released pages stay cached: no removal.
  for (int step = 0; step < 8; ++step) {
    REQUIRE_OK(manager->Append(1, {TokenId{100 + step}}));
  }
  REQUIRE(LeadingNull(GroupPages(*manager, 1, 1), 0) > 0);
  events.clear();
  REQUIRE_OK(manager->TakeKvEvents(events));
  for (const KvCacheEvent& event : events) {
    REQUIRE(event.kind == KvCacheEvent::Kind::kBlockStored);
  }
  // A second prompt needs more pages than are free: the window's released
  // pages are evicted first (group 1), under the prompt's own hashes.
  REQUIRE_OK(manager->Admit(2, TokenRange(500, 8)));
  events.clear();
  REQUIRE_OK(manager->TakeKvEvents(events));
  bool removed_window_page = false;
  for (const KvCacheEvent& event : events) {
    if (event.kind != KvCacheEvent::Kind::kBlockRemoved) continue;
    REQUIRE(event.group_idx == 1);
    for (const BlockHash& hash : event.block_hashes) {
      REQUIRE(std::find(hashes.begin(), hashes.end(), hash) != hashes.end());
      removed_window_page = true;
    }
  }
  REQUIRE(removed_window_page);
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("a chunked-local group frees the chunks before the current one") {
  auto manager = MakeManager(Config(256), {Full(), Chunked(8)});
  REQUIRE_OK(manager->Admit(1, TokenRange(1, 5)));
  for (int step = 0; step < 40; ++step) {
    const int64_t computed = 5 + step;
    REQUIRE_OK(manager->Append(1, {TokenId{100 + step}}));
    // Chunks of 8 tokens, two pages each: whole chunks before the one
    // `computed` is in are skipped.
    REQUIRE(LeadingNull(GroupPages(*manager, 1, 1), 0) == computed / 8 * 2);
    REQUIRE_OK(manager->CheckInvariants());
  }
}

TEST_CASE(
    "without prefix caching a chunked-local group needs nothing of hits") {
  // Pages of 4 tokens beside pages of 8: prefix hits would need the chunked
  // group's to be their multiple; without caching none is looked up.
  const std::vector<KvCacheGroupSpec> groups = {Chunked(8), Full(8)};
  const auto refused =
      BlockManager::Create(Config(256), {.kv_cache_groups = groups});
  REQUIRE_STATUS_IS(refused, kInvalidArgument);
  REQUIRE(std::string(refused.status().message())
              .find("chunked local attention needs") != std::string::npos);
  auto manager =
      MakeManager(Config(256), groups, {.enable_prefix_caching = false});
  REQUIRE_OK(manager->Admit(1, TokenRange(1, 5)));
  for (int step = 0; step < 20; ++step) {
    REQUIRE_OK(manager->Append(1, {TokenId{100 + step}}));
    REQUIRE(LeadingNull(GroupPages(*manager, 1, 0), 0) == (5 + step) / 8 * 2);
    REQUIRE_OK(manager->CheckInvariants());
  }
}

TEST_CASE("a prefix hit is what every group serves") {
  auto manager = MakeManager(Config(256), {Full(), Window(8)});
  const Tokens prompt = TokenRange(1, 30);
  REQUIRE_OK(manager->Admit(1, prompt));
  REQUIRE_OK(manager->Free(1));
  // The same prompt: 7 full pages within 29 tokens; the window group needs
  // the pages of the last 7 tokens before the hit's end, and has all.
  auto plan = manager->Admit(2, prompt);
  REQUIRE_OK(plan);
  REQUIRE(plan->hit_tokens == 28);
  const std::vector<PageId> window = GroupPages(*manager, 2, 1);
  // ceil((8 - 1) / 4) = 2 pages of window, the rest null.
  REQUIRE(LeadingNull(window, 0) == 5);
  REQUIRE(manager->stats().prefix_hit_tokens == 28);
  REQUIRE_OK(manager->CheckInvariants());
  // A prompt that shares only 12 tokens hits 12 in both groups: the window
  // group's pages 1 and 2 were released by sequence 1 but stay cached.
  Tokens other = prompt;
  other[13] = 9999;
  auto hit = manager->PlanAdmission(other);
  REQUIRE_OK(hit);
  REQUIRE(hit->hit_tokens == 12);
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("an EAGLE group's hit leaves its last page to recompute") {
  KvCacheGroupSpec drafting = Full();
  drafting.eagle = true;
  auto manager = MakeManager(Config(256), {drafting, Window(8)});
  const Tokens prompt = TokenRange(1, 30);
  REQUIRE_OK(manager->Admit(1, prompt));
  // 7 full pages within 29 tokens, less the drafting group's last one.
  auto plan = manager->PlanAdmission(prompt);
  REQUIRE_OK(plan);
  REQUIRE(plan->hit_tokens == 24);
  REQUIRE_OK(manager->Admit(2, prompt));
  REQUIRE(LeadingNull(GroupPages(*manager, 2, 1), 0) == 4);
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("an EAGLE window group of pages below the hit unit hits") {
  // Hits come in units of 16 tokens; the window group (pages of 4, window
  // 5) caches only the pages its hits read, which for EAGLE include the
  // first page of the next unit (vLLM 28be48fa's mask left it out, and such
  // a group never hit).
  KvCacheGroupSpec full = Full(16);
  full.eagle = true;
  KvCacheGroupSpec window = Window(5);
  window.eagle = true;
  auto manager = MakeManager(Config(256), {full, window});
  const Tokens prompt = TokenRange(1, 40);
  REQUIRE_OK(manager->Admit(1, prompt));
  REQUIRE_OK(manager->Free(1));
  Tokens turn = prompt;
  for (TokenId t = 0; t < 6; ++t) turn.push_back(9000 + t);
  auto plan = manager->PlanAdmission(turn);
  REQUIRE_OK(plan);
  // The full group's two pages less EAGLE's last: 16 tokens, for which the
  // window group reads its pages 3 and 4 (and recomputes page 4).
  REQUIRE(plan->hit_tokens == 16);
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("a window group's released pages stay cached for the next turn") {
  auto manager = MakeManager(Config(64), {Full(), Window(8)});
  const Tokens prompt = TokenRange(1, 30);
  REQUIRE_OK(manager->Admit(1, prompt));
  for (int step = 0; step < 40; ++step) {
    REQUIRE_OK(manager->Append(1, {TokenId{500 + step}}));
  }
  const Tokens history = [&] {
    Tokens tokens = prompt;
    for (int step = 0; step < 40; ++step) tokens.push_back(500 + step);
    return tokens;
  }();
  REQUIRE_OK(manager->Free(1));
  // The next turn: the history and a new question. Full attention hits
  // every full page; the window group has the last window cached (its
  // released pages were cached and stay evictable).
  Tokens turn = history;
  for (TokenId t = 0; t < 6; ++t) turn.push_back(7000 + t);
  auto plan = manager->Admit(2, turn);
  REQUIRE_OK(plan);
  REQUIRE(plan->hit_tokens == 68);
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("a manager of groups of two page sizes hits in their multiple") {
  // vLLM's test_different_block_size shape: full pages of 4 and 8.
  auto manager = MakeManager(Config(256), {Full(4), Full(8)});
  const Tokens prompt = TokenRange(1, 29);
  REQUIRE_OK(manager->Admit(1, prompt));
  REQUIRE(GroupPages(*manager, 1, 0).size() == 8);
  REQUIRE(GroupPages(*manager, 1, 1).size() == 4);
  auto plan = manager->PlanAdmission(prompt);
  REQUIRE_OK(plan);
  REQUIRE(plan->hit_tokens == 24);  // 28 would leave the 8-page group short.
  REQUIRE(plan->hit_pages == 6 + 3);
  // Pages are hashed in blocks of 4 tokens, as vLLM hashes them: an
  // 8-token page is named by its second block's hash, and prompt_hashes
  // are the chain of blocks.
  std::vector<BlockHash> hashes(7);
  REQUIRE(*manager->HashPrompt(prompt, {}, absl::MakeSpan(hashes)) == 7);
  std::vector<BlockHash> expected(7);
  auto blocks = BlockHasher::Create(HashAlgorithm::kSha256, 4);
  REQUIRE_OK(blocks);
  REQUIRE_OK(HashChain(*blocks, prompt, {}, absl::MakeSpan(expected)));
  REQUIRE(hashes == expected);
  // Group 1's keys are salted: its pages' hashes, as events name them, are
  // the chain's every second one.
  for (int i = 0; i < 3; ++i) {
    REQUIRE(manager->pool().EventHash(GroupPages(*manager, 1, 1)[i]) ==
            expected[2 * i + 1]);
  }
  auto hinted = manager->PlanAdmission(prompt, {}, hashes);
  REQUIRE_OK(hinted);
  REQUIRE(hinted->hit_tokens == 24);
  // A chain of the wrong length names the hash block.
  const BlockManagerSnapshot before = manager->Snapshot();
  const auto refused =
      manager->Admit(2, prompt, {}, absl::MakeConstSpan(hashes).first(6));
  REQUIRE_STATUS_IS(refused, kInvalidArgument);
  REQUIRE(std::string(refused.status().message())
              .find("6 prompt hashes for a prompt of 7 full pages of 4 "
                    "tokens") != std::string::npos);
  REQUIRE(manager->Snapshot() == before);
  REQUIRE_OK(manager->Admit(2, prompt, {}, hashes));
  const std::vector<PageId> first = GroupPages(*manager, 1, 1);
  const std::vector<PageId> second = GroupPages(*manager, 2, 1);
  REQUIRE(std::equal(first.begin(), first.begin() + 3, second.begin()));
}

TEST_CASE("a prompt chunk's hashes serve groups of two page sizes") {
  // Two managers take the same chunks, one with the prompt's chain of hash
  // blocks and one hashing them itself: they end the same.
  const Tokens prompt = TokenRange(1, 29);
  auto hinted = MakeManager(Config(256), {Full(4), Full(8)});
  auto plain = MakeManager(Config(256), {Full(4), Full(8)});
  std::vector<BlockHash> hashes(7);
  REQUIRE(*hinted->HashPrompt(prompt, {}, absl::MakeSpan(hashes)) == 7);
  for (auto* manager : {hinted.get(), plain.get()}) {
    REQUIRE_OK(manager->Admit(1, prompt, {}, {}, {.prefill_tokens = 4}));
  }
  const Tokens chunk(prompt.begin() + 4, prompt.begin() + 20);
  // A chain of the wrong length names the hash block, changing nothing.
  const BlockManagerSnapshot before = hinted->Snapshot();
  const auto refused =
      hinted->AppendPrompt(1, chunk, absl::MakeConstSpan(hashes).first(3));
  REQUIRE_STATUS_IS(refused, kInvalidArgument);
  REQUIRE(std::string(refused.status().message())
              .find("the 3 prompt hashes of a chunk of sequence 1 are not its "
                    "prompt's (7 full pages of 4 tokens") != std::string::npos);
  REQUIRE(hinted->Snapshot() == before);
  REQUIRE_OK(hinted->AppendPrompt(1, chunk, hashes));
  REQUIRE_OK(plain->AppendPrompt(1, chunk));
  REQUIRE(hinted->Snapshot() == plain->Snapshot());
  // The 8-token group's second page (tokens 8 to 15) is named by the
  // fourth block's hash.
  REQUIRE(hinted->pool().EventHash(GroupPages(*hinted, 1, 1)[1]) == hashes[3]);
  const Tokens rest(prompt.begin() + 20, prompt.end());
  REQUIRE_OK(hinted->AppendPrompt(1, rest, hashes));
  REQUIRE_OK(plain->AppendPrompt(1, rest));
  REQUIRE(hinted->Snapshot() == plain->Snapshot());
  REQUIRE_OK(hinted->CheckInvariants());
}

TEST_CASE("prompt hashes are checked at their first block") {
  // Group 0's pages are two hash blocks: a prompt of 6 tokens fills no page
  // of it and one block.
  auto manager = MakeManager(Config(256), {Full(8), Full(4)});
  const Tokens prompt = TokenRange(1, 6);
  std::vector<BlockHash> hashes(1);
  REQUIRE(*manager->HashPrompt(prompt, {}, absl::MakeSpan(hashes)) == 1);
  const BlockManagerSnapshot before = manager->Snapshot();
  const auto salted =
      manager->Admit(1, prompt, {.cache_salt = "other"}, hashes);
  REQUIRE_STATUS_IS(salted, kInvalidArgument);
  REQUIRE(std::string(salted.status().message())
              .find("do not start from its prompt and extra keys") !=
          std::string::npos);
  REQUIRE(manager->Snapshot() == before);
  REQUIRE_OK(manager->Admit(1, prompt, {}, hashes));
  // A longer prompt: group 0's page is named by the second block's hash.
  const Tokens longer = TokenRange(1, 20);
  std::vector<BlockHash> chain(5);
  REQUIRE(*manager->HashPrompt(longer, {}, absl::MakeSpan(chain)) == 5);
  REQUIRE(chain[0] == hashes[0]);
  REQUIRE_OK(manager->Admit(2, longer, {}, chain));
  REQUIRE(manager->pool().EventHash(GroupPages(*manager, 2, 0)[1]) == chain[3]);
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("prompt hashes serve groups of one page size") {
  auto manager = MakeManager(Config(256), {Full(), Window(8)});
  const Tokens prompt = TokenRange(1, 30);
  std::vector<BlockHash> hashes(7);
  REQUIRE_OK(manager->HashPrompt(prompt, {}, absl::MakeSpan(hashes)));
  REQUIRE_OK(manager->Admit(1, prompt, {}, hashes));
  auto plan = manager->PlanAdmission(prompt, {}, hashes);
  REQUIRE_OK(plan);
  REQUIRE(plan->hit_tokens == 28);
  // Another prompt's hashes are caught at its first page.
  const BlockManagerSnapshot before = manager->Snapshot();
  REQUIRE_STATUS_IS(manager->Admit(2, TokenRange(100, 30), {}, hashes),
                    kInvalidArgument);
  REQUIRE(manager->Snapshot() == before);
}

TEST_CASE("a step that fails in one group changes no group") {
  // 19 pages besides the null page.
  auto manager = MakeManager(Config(20), {Full(), Window(8)});
  REQUIRE_OK(manager->Admit(1, TokenRange(1, 32)));  // 8 + 8 pages.
  REQUIRE(manager->NumAllocatable() == 3);
  // 12 more tokens take 3 pages in each group: the window group releases
  // the (32 - 7) / 4 = 6 pages before its window first.
  REQUIRE_OK(manager->Append(1, TokenRange(100, 12)));
  REQUIRE(manager->NumAllocatable() == 3);
  REQUIRE_OK(manager->CheckInvariants());
  const BlockManagerSnapshot before = manager->Snapshot();
  const auto plan = manager->Admit(2, TokenRange(500, 20));  // 5 + 5 pages.
  REQUIRE_STATUS_IS(plan, kResourceExhausted);
  REQUIRE(std::string(plan.status().message()).find("2 KV cache groups") !=
          std::string::npos);
  REQUIRE(manager->Snapshot() == before);
  // 16 more tokens: the window releases 3 more pages (6 allocatable), the
  // full group takes 4 and the window group cannot take its 4.
  REQUIRE_STATUS_IS(manager->Append(1, TokenRange(200, 16)),
                    kResourceExhausted);
  REQUIRE(manager->Snapshot() == before);
  REQUIRE_OK(manager->CheckInvariants());
  REQUIRE_OK(manager->Append(1, TokenRange(200, 4)));
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("forks share pages in every group and copy on write in each") {
  auto manager = MakeManager(Config(256), {Full(), Window(8)});
  REQUIRE_OK(manager->Admit(1, TokenRange(1, 30)));
  REQUIRE_OK(manager->Fork(1, 2));
  REQUIRE(GroupPages(*manager, 1, 1) == GroupPages(*manager, 2, 1));
  auto appended = manager->Append(2, {TokenId{77}});
  REQUIRE_OK(appended);
  // The shared partial page is copied in both groups.
  REQUIRE(appended->group_copies.size() == 2);
  REQUIRE(appended->group_copies[0].group == 0);
  REQUIRE(appended->group_copies[1].group == 1);
  REQUIRE(appended->copy == appended->group_copies[0].copy);
  REQUIRE(GroupPages(*manager, 2, 1).back() ==
          appended->group_copies[1].copy.destination);
  REQUIRE_OK(manager->CheckInvariants());
  for (int step = 0; step < 20; ++step) {
    REQUIRE_OK(manager->Append(1, {TokenId{300 + step}}));
    REQUIRE_OK(manager->Append(2, {TokenId{400 + step}}));
    REQUIRE_OK(manager->CheckInvariants());
  }
  REQUIRE_OK(manager->Preempt(1));
  REQUIRE_OK(manager->Free(2));
  REQUIRE(manager->pool().NumUsed() == 1);
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("chunked prefill and drafts run in every group") {
  auto manager = MakeManager(Config(256), {Full(), Window(8)});
  const Tokens prompt = TokenRange(1, 40);
  auto plan = manager->Admit(1, prompt, {}, {}, {.prefill_tokens = 16});
  REQUIRE_OK(plan);
  REQUIRE(plan->reserved_pages == 2 * 6);
  REQUIRE(manager->reserved_pages() == 12);
  REQUIRE_OK(manager->AppendPrompt(
      1, Tokens(prompt.begin() + 16, prompt.begin() + 32)));
  // The window moved past the first chunk's pages: (16 - 7) / 4 = 2.
  REQUIRE(LeadingNull(GroupPages(*manager, 1, 1), 0) == 2);
  REQUIRE(manager->reserved_pages() == 4);
  REQUIRE_OK(
      manager->AppendPrompt(1, Tokens(prompt.begin() + 32, prompt.end())));
  REQUIRE(manager->reserved_pages() == 0);
  auto drafted = manager->SetDrafts(1, 5);
  REQUIRE_OK(drafted);
  REQUIRE(drafted->new_pages == 2 * 2);
  REQUIRE(GroupPages(*manager, 1, 1).size() == 12);
  REQUIRE_OK(manager->CheckInvariants());
  REQUIRE_OK(manager->Append(1, TokenRange(900, 3)));
  REQUIRE_OK(manager->SetDrafts(1, 0));
  REQUIRE(GroupPages(*manager, 1, 0).size() == 11);
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("a model of one window group works alone") {
  auto manager = MakeManager(Config(64), {Window(8)});
  REQUIRE(manager->num_groups() == 1);
  REQUIRE(manager->has_kv_cache_groups());
  REQUIRE_OK(manager->Admit(1, TokenRange(1, 20)));
  for (int step = 0; step < 30; ++step) {
    REQUIRE_OK(manager->Append(1, {TokenId{100 + step}}));
  }
  auto pages = manager->Pages(1);
  REQUIRE_OK(pages);
  REQUIRE(pages->size() == 13);
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("groups: errors name the bad value and change nothing") {
  REQUIRE_STATUS_IS(BlockManager::Create(
                        Config(64), {.kv_cache_groups = {Full(), Window(0)}}),
                    kInvalidArgument);
  REQUIRE_STATUS_IS(
      BlockManager::Create(Config(1), {.kv_cache_groups = {Window(8)}}),
      kInvalidArgument);
  auto manager = MakeManager(Config(64), {Full(), Window(8)});
  REQUIRE_OK(manager->Admit(1, TokenRange(1, 9)));
  const BlockManagerSnapshot before = manager->Snapshot();
  const auto bad_group = manager->GroupPages(1, 2);
  REQUIRE_STATUS_IS(bad_group, kInvalidArgument);
  REQUIRE(std::string(bad_group.status().message()).find("group 2") !=
          std::string::npos);
  REQUIRE_STATUS_IS(manager->GroupPages(7, 0), kNotFound);
  REQUIRE_STATUS_IS(manager->Append(7, {TokenId{1}}), kNotFound);
  REQUIRE_STATUS_IS(manager->Admit(1, TokenRange(1, 9)), kAlreadyExists);
  REQUIRE_STATUS_IS(manager->Admit(2, {}), kInvalidArgument);
  REQUIRE_STATUS_IS(manager->Admit(2, TokenRange(1, 64 * 4 + 1)), kOutOfRange);
  REQUIRE_STATUS_IS(manager->Fork(7, 8), kNotFound);
  REQUIRE_STATUS_IS(manager->Free(7), kNotFound);
  REQUIRE_STATUS_IS(manager->SetDrafts(1, -1), kInvalidArgument);
  REQUIRE(manager->Snapshot() == before);
  // A BatchCommit needs a table of both groups' rows.
  std::unique_ptr<Device> device = Device::Host();
  auto table = KVPageTable::Create(8, 64, 64, *device);
  REQUIRE_OK(table);
  const auto commit = BatchCommit::Create(*manager, **table);
  REQUIRE_STATUS_IS(commit, kInvalidArgument);
  REQUIRE(std::string(commit.status().message()).find("2 KV cache groups") !=
          std::string::npos);
}

}  // namespace
}  // namespace kvblock
