// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// KV cache events through BlockManager (BlockManagerOptions::
// enable_kv_events): scripted registrations, evictions, a reset and
// rolled-back steps with exact events; then random steps, after most of which
// the events are taken (else left pending over several): the set of cached
// hashes rebuilt from them alone equals the pool's, and every stored event's
// parent is in it and its hashes are its tokens' chain.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kvblock/block_hash.h"
#include "kvblock/block_manager.h"
#include "kvblock/kv_events.h"
#include "manager/block_manager_test_util.h"
#include "test_util.h"

namespace kvblock {
namespace {

using Kind = KvCacheEvent::Kind;
using Tokens = std::vector<TokenId>;

constexpr int32_t kPageSize = 4;

std::unique_ptr<BlockManager> MakeManager(int32_t num_pages,
                                          bool events = true) {
  PagedKvConfig config;
  config.num_pages = num_pages;
  config.page_size = kPageSize;
  config.max_pages_per_seq = 16;
  config.max_batch = 8;
  BlockManagerOptions options;
  options.enable_kv_events = events;
  auto manager = BlockManager::Create(config, options);
  REQUIRE_OK(manager);
  return *std::move(manager);
}

using testing::TokenRange;

std::vector<KvCacheEvent> Take(BlockManager& manager) {
  std::vector<KvCacheEvent> events;
  REQUIRE_OK(manager.TakeKvEvents(events));
  return events;
}

std::vector<BlockHash> HashesOf(BlockManager& manager, const Tokens& tokens,
                                const HashExtraKeys& extra = {}) {
  std::vector<BlockHash> hashes(tokens.size() / kPageSize);
  REQUIRE_OK(manager.HashPrompt(tokens, extra, absl::MakeSpan(hashes)));
  return hashes;
}

TEST_CASE("an admission stores its full pages in one event") {
  auto manager = MakeManager(16);
  const Tokens prompt =
      TokenRange(100, 10);  // two full pages, two tokens more.
  REQUIRE_OK(
      manager->Admit(1, prompt, {.cache_salt = "tenant", .adapter_id = 7}));
  const std::vector<KvCacheEvent> events = Take(*manager);
  REQUIRE(events.size() == 1);
  const KvCacheEvent& stored = events[0];
  REQUIRE(stored.kind == Kind::kBlockStored);
  REQUIRE(
      stored.block_hashes ==
      HashesOf(*manager, prompt, {.cache_salt = "tenant", .adapter_id = 7}));
  REQUIRE_FALSE(stored.parent_block_hash.has_value());  // a prompt's first.
  REQUIRE(stored.token_ids == TokenRange(100, 8));
  REQUIRE(stored.cache_salt == "tenant");
  REQUIRE(stored.adapter_id == 7);
  REQUIRE(Take(*manager).empty());  // taken once.
}

TEST_CASE("a page that fills is stored after its chain") {
  auto manager = MakeManager(16);
  const Tokens prompt = TokenRange(100, 6);
  REQUIRE_OK(manager->Admit(1, prompt));
  const BlockHash first = HashesOf(*manager, prompt)[0];
  Take(*manager);
  REQUIRE_OK(manager->Append(1, {7}));  // 7 tokens: page 1 not full yet.
  REQUIRE(Take(*manager).empty());
  REQUIRE_OK(manager->Append(1, {8}));
  const std::vector<KvCacheEvent> events = Take(*manager);
  REQUIRE(events.size() == 1);
  REQUIRE(events[0].parent_block_hash == first);
  REQUIRE(events[0].token_ids == Tokens{104, 105, 7, 8});
  Tokens verified = prompt;
  verified.insert(verified.end(), {7, 8});
  REQUIRE(events[0].block_hashes ==
          std::vector<BlockHash>{HashesOf(*manager, verified)[1]});
}

TEST_CASE("an eviction is removed before the page is stored again") {
  auto manager = MakeManager(2);
  const Tokens a = TokenRange(100, 8);  // two full pages: the whole pool.
  REQUIRE_OK(manager->Admit(1, a));
  REQUIRE_OK(manager->Free(1));  // both cached, evictable.
  Take(*manager);
  const Tokens b = TokenRange(500, 4);
  // Evicts the LRU head: a's page 1 (a free releases the last page first).
  REQUIRE_OK(manager->Admit(2, b));
  const std::vector<KvCacheEvent> events = Take(*manager);
  REQUIRE(events.size() == 2);
  REQUIRE(events[0].kind == Kind::kBlockRemoved);
  REQUIRE(events[0].block_hashes ==
          std::vector<BlockHash>{HashesOf(*manager, a)[1]});
  REQUIRE(events[1].kind == Kind::kBlockStored);
  REQUIRE(events[1].block_hashes == HashesOf(*manager, b));
}

// A radix-tree index (Dynamo's KV router, llm-d's) places a stored page under
// its parent: the parent must be cached when the page is stored.
TEST_CASE("a page's parent stays cached while a sequence holds a copy") {
  auto manager = MakeManager(6);
  REQUIRE_OK(manager->Admit(1, TokenRange(100, 9)));  // pages 0, 1 full.
  const std::vector<BlockHash> chain = HashesOf(*manager, TokenRange(100, 12));
  // Sequence 2 hits page 0 and computes its own copy of page 1: cached
  // behind sequence 1's, silently.
  REQUIRE_OK(manager->Admit(2, TokenRange(100, 5)));
  REQUIRE_OK(manager->Append(2, TokenRange(105, 3)));
  REQUIRE(Take(*manager).size() == 1);
  const PageId first_copy = manager->pool().Lookup(chain[1]).value();
  REQUIRE_OK(manager->Free(1));
  REQUIRE_OK(manager->Admit(3, TokenRange(500, 16)));  // evicts first_copy.
  REQUIRE(manager->pool().stats().evictions == 1);
  const std::vector<KvCacheEvent> admitted = Take(*manager);
  REQUIRE(admitted.size() == 1);
  REQUIRE(admitted[0].kind == Kind::kBlockStored);
  const PageId second_copy = manager->pool().Lookup(chain[1]).value();
  REQUIRE(second_copy != first_copy);
  REQUIRE(manager->pool().RefCount(second_copy) == 1);

  // Its next page is stored under the hash still cached; what is evicted
  // for it is sequence 3's.
  REQUIRE_OK(manager->Free(3));
  REQUIRE_OK(manager->Append(2, TokenRange(108, 4)));
  const std::vector<KvCacheEvent> events = Take(*manager);
  REQUIRE(events.size() == 2);
  REQUIRE(events[0].kind == Kind::kBlockRemoved);
  REQUIRE(events[0].block_hashes != std::vector<BlockHash>{chain[1]});
  REQUIRE(events[1].kind == Kind::kBlockStored);
  REQUIRE(events[1].parent_block_hash == chain[1]);
  REQUIRE(events[1].block_hashes == std::vector<BlockHash>{chain[2]});

  // Freed, the copy is kept as the hash's only one: removed when evicted.
  REQUIRE_OK(manager->Free(2));
  REQUIRE_OK(manager->Admit(4, TokenRange(900, 24)));
  bool removed = false;
  for (const KvCacheEvent& event : Take(*manager)) {
    for (const BlockHash& hash : event.block_hashes) {
      removed |= event.kind == Kind::kBlockRemoved && hash == chain[1];
    }
  }
  REQUIRE(removed);
  REQUIRE_OK(manager->CheckInvariants());
}

// After a reset a live sequence's chain is not cached: its next pages are
// not stored (no event would have a parent) until another sequence caches
// that chain again.
TEST_CASE("after a reset a page is stored only once its parent is") {
  auto manager = MakeManager(16);
  REQUIRE_OK(manager->Admit(1, TokenRange(100, 6)));
  REQUIRE_OK(manager->ResetPrefixCache());
  Take(*manager);
  REQUIRE_OK(manager->Append(1, TokenRange(106, 2)));  // fills page 1.
  REQUIRE(Take(*manager).empty());
  REQUIRE(manager->pool().NumCached() == 0);

  REQUIRE_OK(manager->Admit(2, TokenRange(100, 9)));  // caches pages 0, 1.
  REQUIRE(Take(*manager).size() == 1);
  REQUIRE_OK(manager->Append(1, TokenRange(108, 4)));  // fills page 2.
  const std::vector<KvCacheEvent> events = Take(*manager);
  REQUIRE(events.size() == 1);
  const std::vector<BlockHash> chain = HashesOf(*manager, TokenRange(100, 12));
  REQUIRE(events[0].parent_block_hash == chain[1]);
  REQUIRE(events[0].block_hashes == std::vector<BlockHash>{chain[2]});
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("a rolled-back step leaves no event, a committed one its own") {
  auto manager = MakeManager(16);
  REQUIRE_OK(Impl(*manager).BeginStep());
  REQUIRE_OK(manager->Admit(1, TokenRange(100, 8)));
  std::vector<KvCacheEvent> early;
  REQUIRE_STATUS_IS(manager->TakeKvEvents(early), kFailedPrecondition);
  REQUIRE(early.empty());
  REQUIRE_OK(Impl(*manager).RollbackStep());
  REQUIRE(Take(*manager).empty());

  // Refused inside a step, the step's events stay for after its commit.
  REQUIRE_OK(Impl(*manager).BeginStep());
  REQUIRE_OK(manager->Admit(1, TokenRange(100, 8)));
  KvEventBatch batch;
  REQUIRE_STATUS_IS(manager->TakeKvEvents(batch), kFailedPrecondition);
  REQUIRE(batch.empty());
  REQUIRE_OK(Impl(*manager).CommitStep());
  REQUIRE(Take(*manager).size() == 1);

  // A call that fails changes nothing, events included.
  REQUIRE_STATUS_IS(manager->Admit(2, TokenRange(0, 400)), kOutOfRange);
  REQUIRE(Take(*manager).empty());
}

TEST_CASE("a reset clears all, and events can be off") {
  auto manager = MakeManager(16);
  REQUIRE_OK(manager->Admit(1, TokenRange(100, 8)));
  REQUIRE_OK(manager->ResetPrefixCache());
  const std::vector<KvCacheEvent> events = Take(*manager);
  REQUIRE(events.size() == 2);
  REQUIRE(events[1].kind == Kind::kAllBlocksCleared);

  auto off = MakeManager(16, /*events=*/false);
  REQUIRE_OK(off->Admit(1, TokenRange(100, 8)));
  const BlockManagerSnapshot before = off->Snapshot();
  std::vector<KvCacheEvent> none;
  auto status = off->TakeKvEvents(none);
  REQUIRE(none.empty());
  REQUIRE(off->Snapshot() == before);
  REQUIRE(status.code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(std::string(status.message()).find("enable_kv_events") !=
          std::string::npos);
}

// Random steps: admissions (shared prefixes, two salts), appends, forks,
// frees and now and then a reset, in steps that commit or roll back.
TEST_CASE("the cached set rebuilt from the events is the pool's") {
  for (const uint32_t seed : {1u, 2u, 3u}) {
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    const auto uniform = [&](int lo, int hi) {
      return std::uniform_int_distribution<int>(lo, hi)(rng);
    };
    auto manager = MakeManager(24);
    auto hasher = BlockHasher::Create(HashAlgorithm::kSha256, kPageSize);
    REQUIRE_OK(hasher);
    std::set<std::string> cached;  // hashes, as bytes, from the events.
    const auto key = [](const BlockHash& hash) {
      return std::string(hash.bytes.begin(), hash.bytes.end());
    };
    std::vector<SequenceId> live;
    SequenceId next_id = 0;
    int64_t stored = 0;
    int64_t removed = 0;
    for (int64_t op = 0; op < testing::RandomRunLength(3000); ++op) {
      INFO("op " << op);
      const bool step = uniform(0, 3) == 0;
      const std::vector<SequenceId> live_before = live;
      if (step) REQUIRE_OK(Impl(*manager).BeginStep());
      for (int n = step ? uniform(1, 4) : 1; n > 0; --n) {
        const int dice = uniform(0, 99);
        if (dice < 30 || live.empty()) {
          Tokens prompt = TokenRange(1000 * uniform(0, 2), uniform(1, 10));
          for (TokenId& t : prompt) t += uniform(0, 3) == 0 ? uniform(0, 2) : 0;
          const std::string salt = uniform(0, 1) ? "a" : "";
          if (manager->Admit(next_id, prompt, {.cache_salt = salt}).ok()) {
            live.push_back(next_id);
          }
          ++next_id;
        } else if (dice < 70) {
          const SequenceId id = live[uniform(0, live.size() - 1)];
          (void)manager->Append(id, TokenRange(uniform(0, 50), uniform(1, 5)));
        } else if (dice < 78) {
          const SequenceId id = live[uniform(0, live.size() - 1)];
          if (manager->Fork(id, next_id).ok()) live.push_back(next_id);
          ++next_id;
        } else if (dice < 97 || step) {
          const size_t i = uniform(0, live.size() - 1);
          REQUIRE_OK(manager->Free(live[i]));
          live.erase(live.begin() + i);
        } else {
          REQUIRE_OK(manager->ResetPrefixCache());
        }
      }
      const bool rollback = step && uniform(0, 2) == 0;
      if (rollback) {
        // The step's admissions, forks and frees are undone.
        REQUIRE_OK(Impl(*manager).RollbackStep());
        live = live_before;
      } else if (step) {
        REQUIRE_OK(Impl(*manager).CommitStep());
      }
      // Taken after most ops, or left pending over several, as a
      // scheduler that hands them over at a publisher's looks does.
      REQUIRE_OK(manager->CheckInvariants());
      const bool last = op + 1 == testing::RandomRunLength(3000);
      if (!last && uniform(0, 2) == 0) continue;
      const int64_t pending = manager->pending_kv_changes();
      int64_t changes = 0;
      for (const KvCacheEvent& event : Take(*manager)) {
        changes += event.kind == Kind::kAllBlocksCleared
                       ? 1
                       : static_cast<int64_t>(event.block_hashes.size());
        switch (event.kind) {
          case Kind::kAllBlocksCleared:
            cached.clear();
            break;
          case Kind::kBlockRemoved:
            for (const BlockHash& hash : event.block_hashes) {
              REQUIRE(cached.erase(key(hash)) == 1);
              ++removed;
            }
            break;
          case Kind::kBlockStored: {
            // The parent is cached, as a radix-tree index needs it; the
            // hashes are the tokens' chain after it (the extra keys' root
            // for a prompt's first page).
            if (event.parent_block_hash) {
              REQUIRE(cached.contains(key(*event.parent_block_hash)));
            }
            REQUIRE(event.token_ids.size() ==
                    event.block_hashes.size() * kPageSize);
            BlockHash parent = event.parent_block_hash.value_or(
                hasher->RootHash({.cache_salt = event.cache_salt,
                                  .adapter_id = event.adapter_id}));
            for (size_t i = 0; i < event.block_hashes.size(); ++i) {
              parent = hasher->HashPage(parent,
                                        absl::MakeConstSpan(event.token_ids)
                                            .subspan(i * kPageSize, kPageSize));
              REQUIRE(parent == event.block_hashes[i]);
              REQUIRE(cached.insert(key(parent)).second);
              ++stored;
            }
            break;
          }
        }
      }
      REQUIRE(changes == pending);
      REQUIRE(manager->pending_kv_changes() == 0);
      std::set<std::string> pool_cached;
      for (const auto& [page, hash] : manager->pool().Snapshot().cached) {
        pool_cached.insert(key(hash));
      }
      REQUIRE(cached == pool_cached);
    }
    CHECK(stored >= testing::RandomRunLength(300));
    CHECK(removed >= testing::RandomRunLength(100));
  }
}

}  // namespace
}  // namespace kvblock
