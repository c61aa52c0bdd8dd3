// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "kvblock/block_manager.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "manager/block_manager_test_util.h"
#include "test_util.h"

namespace kvblock {
namespace {

using Pages = std::vector<PageId>;

PagedKvConfig Config(int32_t num_pages, int32_t page_size = 4,
                     int32_t max_pages_per_seq = 8) {
  PagedKvConfig config;
  config.num_pages = num_pages;
  config.page_size = page_size;
  config.max_pages_per_seq = max_pages_per_seq;
  config.max_batch = 4;
  return config;
}

std::unique_ptr<BlockManager> MakeManager(const PagedKvConfig& config,
                                          BlockManagerOptions options = {}) {
  auto manager = BlockManager::Create(config, options);
  REQUIRE_OK(manager);
  return *std::move(manager);
}

// Tokens first, first + 1, ..., first + count - 1.
using testing::TokenRange;

std::vector<TokenId> Concat(std::vector<TokenId> a,
                            const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

Pages PagesOf(const BlockManager& manager, SequenceId id) {
  auto pages = manager.Pages(id);
  REQUIRE_OK(pages);
  return Pages(pages->begin(), pages->end());
}

AdmissionPlan AdmitOk(BlockManager& manager, SequenceId id,
                      const std::vector<TokenId>& prompt,
                      const HashExtraKeys& extra = {}) {
  auto plan = manager.Admit(id, prompt, extra);
  REQUIRE_OK(plan);
  REQUIRE_OK(manager.CheckInvariants());
  return *plan;
}

AppendResult AppendOk(BlockManager& manager, SequenceId id,
                      const std::vector<TokenId>& tokens) {
  auto result = manager.Append(id, tokens);
  REQUIRE_OK(result);
  REQUIRE_OK(manager.CheckInvariants());
  return *result;
}

TEST_CASE("a config no machine can hold is ResourceExhausted, not a crash") {
  // Each passes Validate(); before, 4 * max_batch overflowed int32 (at
  // 2^30 + 1 it wrapped to 4) and the huge reservations aborted the process.
  constexpr int32_t kMax = std::numeric_limits<int32_t>::max();
  struct Case {
    int32_t max_batch, page_size, max_pages_per_seq;
  };
  for (const Case& c :
       {Case{1 << 29, 16, 8}, Case{(1 << 30) + 1, 16, 8}, Case{kMax, 16, 8},
        Case{4, kMax, 8}, Case{4, 16, kMax}, Case{1 << 20, 16, 1 << 20}}) {
    PagedKvConfig config = Config(64, c.page_size, c.max_pages_per_seq);
    config.max_batch = c.max_batch;
    INFO(c.max_batch << " " << c.page_size << " " << c.max_pages_per_seq);
    REQUIRE_OK(config.Validate());
    const auto manager = BlockManager::Create(config);
    REQUIRE_STATUS_IS(manager, kResourceExhausted);
    REQUIRE(manager.status().message().find("block manager: reserving ") !=
            absl::string_view::npos);
  }
  // An explicit max_sequences is honoured the same way.
  BlockManagerOptions options;
  options.max_sequences = kMax;
  REQUIRE_STATUS_IS(BlockManager::Create(Config(64), options),
                    kResourceExhausted);
}

// The bytes a refused BlockManager::Create says it would reserve.
int64_t RefusedReservation(const PagedKvConfig& config,
                           const BlockManagerOptions& options) {
  const auto manager = BlockManager::Create(config, options);
  REQUIRE_STATUS_IS(manager, kResourceExhausted);
  const std::string message(manager.status().message());
  const std::string said = "block manager: reserving ";
  REQUIRE(message.rfind(said, 0) == 0);
  return std::stoll(message.substr(said.size()));
}

TEST_CASE("the manager checks its memory and its pool's as one sum") {
  // A host tier and sequences that each fit the machine's memory, and
  // together exceed it by a twentieth: refused before either is built (the
  // pool used to be built first, and the manager's check then saw its own
  // part alone).
  const int64_t memory =
      int64_t{sysconf(_SC_PHYS_PAGES)} * int64_t{sysconf(_SC_PAGESIZE)};
  REQUIRE(memory > 0);
  // Rows of 4,096 pages: a sequence's bytes are many, so that int32
  // sequences reach any machine's memory.
  const PagedKvConfig config = Config(64, 16, 4096);
  const int64_t plain_pool = BlockPool::ReservedBytes(64);
  const int64_t host_page_bytes =
      (BlockPool::ReservedBytes(64, {.host_pages = 1 << 20}) - plain_pool) /
      (1 << 20);
  BlockManagerOptions options;
  options.host_pages = static_cast<int32_t>(
      std::min<int64_t>(kMaxNumPages, memory / 100 * 55 / host_page_bytes));
  const int64_t host_tier =
      BlockPool::ReservedBytes(64, {.host_pages = options.host_pages}) -
      plain_pool;
  // Two refused sizes, far past the machine, give a sequence's bytes: the
  // manager's reservation is fixed + per_sequence x max_sequences.
  const auto refused = [&](int32_t sequences) {
    BlockManagerOptions alone;
    alone.max_sequences = sequences;
    return RefusedReservation(config, alone);
  };
  constexpr int32_t kFar = 1 << 30;
  const int64_t per_sequence = (refused(kFar) - refused(kFar / 2)) / (kFar / 2);
  const int64_t fixed = refused(kFar) - per_sequence * kFar;
  const int64_t manager = memory - host_tier + memory / 20;
  options.max_sequences =
      static_cast<int32_t>((manager - fixed) / per_sequence + 1);
  INFO(memory << " bytes of memory; the host tier's " << host_tier
              << ", the manager's " << manager);
  REQUIRE(host_tier < memory);
  REQUIRE(manager < memory);
  const auto created = BlockManager::Create(config, options);
  REQUIRE_STATUS_IS(created, kResourceExhausted);
  REQUIRE(created.status().message().find("block manager: reserving ") !=
          absl::string_view::npos);
}

TEST_CASE("negative sequence ids are refused; kNoSequence names none") {
  auto manager = MakeManager(Config(16));
  REQUIRE_OK(manager->Admit(1, TokenRange(0, 5)).status());
  const BlockManagerSnapshot before = manager->Snapshot();
  for (const SequenceId id :
       {kNoSequence, SequenceId{-7}, std::numeric_limits<SequenceId>::min()}) {
    const auto admitted = manager->Admit(id, TokenRange(0, 5));
    REQUIRE_STATUS_IS(admitted, kInvalidArgument);
    REQUIRE(admitted.status().message().find("is negative") !=
            absl::string_view::npos);
    const absl::Status forked = manager->Fork(1, id);
    REQUIRE_STATUS_IS(forked, kInvalidArgument);
    REQUIRE(forked.message().find("is negative") != absl::string_view::npos);
    REQUIRE(manager->Snapshot() == before);
  }
}

TEST_CASE("a rolled-back step replays to the same results, handles included") {
  BlockManagerOptions options;
  options.max_sequences = 2;  // the step below grows the slab.
  auto manager = MakeManager(Config(24), options);
  REQUIRE_OK(manager->Admit(1, TokenRange(0, 6)).status());
  REQUIRE_OK(manager->Fork(1, 2));
  const BlockManagerSnapshot before = manager->Snapshot();

  // Everything the calls return, handles of every live sequence included.
  struct Results {
    std::vector<int64_t> values;
    std::vector<SequenceHandle> handles;
    BlockManagerSnapshot snapshot;
    bool operator==(const Results&) const = default;
  };
  const auto step = [&] {
    Results r;
    const auto plan = manager->Admit(3, TokenRange(40, 9));
    REQUIRE_OK(plan);
    r.values.push_back(plan->new_pages);
    REQUIRE_OK(manager->Fork(1, 4));  // 1's tail is shared again.
    const auto appended = manager->Append(1, TokenRange(70, 5));
    REQUIRE_OK(appended);
    r.values.push_back(appended->new_pages);
    r.values.push_back(appended->copy.has_value() ? appended->copy->destination
                                                  : -1);
    REQUIRE_OK(manager->Free(2));
    REQUIRE_OK(manager->Admit(5, TokenRange(90, 3)).status());
    for (const SequenceId id : {1, 3, 4, 5}) {
      r.handles.push_back(*Impl(*manager).HandleOf(id));
    }
    r.snapshot = manager->Snapshot();
    return r;
  };
  REQUIRE_OK(Impl(*manager).BeginStep());
  const Results first = step();
  REQUIRE(Impl(*manager).handle_limit() > 2);
  REQUIRE_OK(Impl(*manager).RollbackStep());
  REQUIRE(manager->Snapshot() == before);
  REQUIRE_OK(manager->CheckInvariants());
  REQUIRE_OK(Impl(*manager).BeginStep());
  REQUIRE(step() == first);
  REQUIRE_OK(Impl(*manager).CommitStep());
  REQUIRE_OK(manager->CheckInvariants());
  // The parent's shared tail came back with the rollback: 1's next append
  // after the replayed fork copies, as it did the first time.
  REQUIRE(first.values[2] != -1);
}

TEST_CASE("pages for an append count new pages and the copy of a shared tail") {
  auto manager = MakeManager(Config(16));  // 4 tokens a page.
  REQUIRE_OK(
      manager->Admit(1, TokenRange(0, 6)).status());  // 2 pages, 2 spare.
  const SequenceHandle one = *Impl(*manager).HandleOf(1);
  REQUIRE(*Impl(*manager).PagesForAppend(one, 0) == 0);
  REQUIRE(*Impl(*manager).PagesForAppend(one, 2) == 0);
  REQUIRE(*Impl(*manager).PagesForAppend(one, 3) == 1);
  REQUIRE(*Impl(*manager).PagesForAppend(one, 11) == 3);
  // A fork shares the partial page: either side's first append copies it.
  REQUIRE_OK(manager->Fork(1, 2));
  REQUIRE(*Impl(*manager).PagesForAppend(one, 1) == 1);
  REQUIRE(*Impl(*manager).PagesForAppend(one, 3) == 2);
  const auto appended = manager->Append(1, TokenRange(50, 3));
  REQUIRE_OK(appended);
  REQUIRE(appended->new_pages + (appended->copy.has_value() ? 1 : 0) == 2);
  // The copy ended the sharing: the other side appends in place.
  REQUIRE(*Impl(*manager).PagesForAppend(*Impl(*manager).HandleOf(2), 1) == 0);
  const BlockManagerSnapshot before = manager->Snapshot();
  REQUIRE_STATUS_IS(Impl(*manager).PagesForAppend(one, -1), kInvalidArgument);
  REQUIRE_STATUS_IS(Impl(*manager).PagesForAppend(SequenceHandle{}, 1),
                    kInvalidArgument);
  REQUIRE(manager->Snapshot() == before);
  REQUIRE_OK(manager->Free(1));
  const auto stale = Impl(*manager).PagesForAppend(one, 1);
  REQUIRE_STATUS_IS(stale, kInvalidArgument);
  REQUIRE(stale.status().message().find("pages for appending 1 tokens") !=
          absl::string_view::npos);
}

TEST_CASE("shared system prompt is served from the cache in whole pages") {
  auto manager = MakeManager(Config(16));
  const std::vector<TokenId> system = TokenRange(1, 8);  // two full pages

  const AdmissionPlan a = AdmitOk(*manager, 1, Concat(system, {100, 101, 102}));
  REQUIRE(a.hit_pages == 0);
  REQUIRE(a.new_pages == 3);
  REQUIRE(PagesOf(*manager, 1) == Pages{0, 1, 2});

  const AdmissionPlan b = AdmitOk(*manager, 2, Concat(system, {200, 201}));
  REQUIRE(b.hit_pages == 2);
  REQUIRE(b.hit_tokens == 8);
  REQUIRE(b.revived_pages == 0);
  REQUIRE(b.new_pages == 1);
  REQUIRE(PagesOf(*manager, 2) == Pages{0, 1, 3});
  REQUIRE(manager->pool().RefCount(0) == 2);
  REQUIRE(manager->pool().RefCount(1) == 2);

  SECTION("a prompt that is entirely cached recomputes its last page") {
    const AdmissionPlan c = AdmitOk(*manager, 3, system);
    REQUIRE(c.hit_pages == 1);
    REQUIRE(c.new_pages == 1);
    REQUIRE(PagesOf(*manager, 3) == Pages{0, 4});
    // The recomputed page duplicates cached page 1, which stays the one
    // lookups find; page 4 is cached behind it while it is held.
    REQUIRE(manager->pool().NumCached() == 3);
    REQUIRE(manager->pool().Snapshot().duplicates ==
            std::vector<std::vector<PageId>>{{1, 4}});
    REQUIRE(manager->pool().Lookup(manager->pool().CachedHash(4).value()) == 1);
  }
  const BlockManagerStats stats = manager->stats();
  REQUIRE(stats.prefix_hit_tokens >= 8);
  REQUIRE(stats.prompt_tokens >= 21);
}

TEST_CASE("next chat turn hits the previous prompt and answer") {
  auto manager = MakeManager(Config(16));
  AdmitOk(*manager, 1, TokenRange(1, 6));  // page 0 full, page 1 holds 5, 6
  REQUIRE(PagesOf(*manager, 1) == Pages{0, 1});
  const AppendResult answer = AppendOk(*manager, 1, TokenRange(7, 6));  // 7..12
  REQUIRE(answer.new_pages == 1);
  REQUIRE_FALSE(answer.copy.has_value());
  REQUIRE(PagesOf(*manager, 1) == Pages{0, 1, 2});
  REQUIRE(manager->pool().NumCached() == 3);
  REQUIRE_OK(manager->Free(1));
  REQUIRE(manager->pool().NumEvictable() == 3);

  const AdmissionPlan turn2 = AdmitOk(*manager, 2, TokenRange(1, 14));
  REQUIRE(turn2.hit_pages == 3);
  REQUIRE(turn2.revived_pages == 3);
  REQUIRE(turn2.hit_tokens == 12);
  REQUIRE(PagesOf(*manager, 2) == Pages{0, 1, 2, 3});
  REQUIRE(manager->pool().NumEvictable() == 0);
}

TEST_CASE("n-way fork shares pages and copies the partial page on write") {
  auto manager = MakeManager(Config(16));
  AdmitOk(*manager, 1, TokenRange(1, 6));
  for (SequenceId child : {2, 3, 4}) REQUIRE_OK(manager->Fork(1, child));
  REQUIRE(manager->pool().RefCount(0) == 4);
  REQUIRE(manager->pool().RefCount(1) == 4);
  REQUIRE_OK(manager->CheckInvariants());

  REQUIRE(AppendOk(*manager, 2, {7}).copy == PageCopy{1, 2});
  REQUIRE(AppendOk(*manager, 3, {8}).copy == PageCopy{1, 3});
  REQUIRE(AppendOk(*manager, 4, {9}).copy == PageCopy{1, 4});
  // The last holder writes in place.
  REQUIRE_FALSE(AppendOk(*manager, 1, {10}).copy.has_value());
  REQUIRE(PagesOf(*manager, 1) == Pages{0, 1});
  REQUIRE(PagesOf(*manager, 2) == Pages{0, 2});
  REQUIRE(PagesOf(*manager, 3) == Pages{0, 3});
  REQUIRE(PagesOf(*manager, 4) == Pages{0, 4});
  REQUIRE(manager->stats().cow_copies == 3);
  REQUIRE(manager->stats().forks == 3);
  REQUIRE(manager->stats().pages_in_use == 5);
}

TEST_CASE("beam forked in the middle of a page diverges into own pages") {
  auto manager = MakeManager(Config(16));
  AdmitOk(*manager, 1, TokenRange(1, 10));  // pages 0, 1 full; 2 holds 9, 10
  REQUIRE_OK(manager->Fork(1, 2));
  const AppendResult parent = AppendOk(*manager, 1, {11, 12});
  REQUIRE(parent.copy == PageCopy{2, 3});
  REQUIRE(parent.new_pages == 0);
  const AppendResult child = AppendOk(*manager, 2, {21, 22, 23});
  REQUIRE_FALSE(child.copy.has_value());
  REQUIRE(child.new_pages == 1);
  REQUIRE(PagesOf(*manager, 1) == Pages{0, 1, 3});
  REQUIRE(PagesOf(*manager, 2) == Pages{0, 1, 2, 4});
  // Both full third pages are cached, under different hashes.
  REQUIRE(manager->pool().NumCached() == 4);

  SECTION("a new request with the child's continuation hits the child's page") {
    const AdmissionPlan plan =
        AdmitOk(*manager, 3, Concat(TokenRange(1, 10), {21, 22, 23, 24}));
    REQUIRE(plan.hit_pages == 3);
    REQUIRE(PagesOf(*manager, 3) == Pages{0, 1, 2, 5});
  }
}

TEST_CASE(
    "under memory pressure the continuation is evicted before the prefix") {
  auto manager = MakeManager(Config(6, 4, 6));
  AdmitOk(*manager, 1, TokenRange(1, 9));  // pages 0, 1 cached; 2 partial
  REQUIRE_OK(manager->Free(1));
  REQUIRE(manager->pool().Snapshot().lru == Pages{1, 0});
  REQUIRE(manager->pool().NumFree() == 6);

  // Five pages: four plain free pages, then the LRU head (page 1) is evicted.
  AdmitOk(*manager, 2, TokenRange(100, 20));
  REQUIRE(PagesOf(*manager, 2) == Pages{2, 3, 4, 5, 1});
  REQUIRE(manager->stats().evictions == 1);

  // The prefix page is still cached (and would be revived).
  auto plan = manager->PlanAdmission(Concat(TokenRange(1, 4), {50}));
  REQUIRE_OK(plan);
  REQUIRE(plan->hit_pages == 1);
  REQUIRE(plan->revived_pages == 1);
  REQUIRE(plan->new_pages == 1);
  REQUIRE(plan->pages_consumed() == 2);
  REQUIRE_FALSE(manager->CanAdmit(Concat(TokenRange(1, 4), {50})));
}

TEST_CASE("a salted request never hits another salt's pages") {
  auto manager = MakeManager(Config(16));
  const std::vector<TokenId> prompt = TokenRange(1, 9);
  AdmitOk(*manager, 1, prompt, {.cache_salt = "tenant-a"});
  const AdmissionPlan other =
      AdmitOk(*manager, 2, prompt, {.cache_salt = "tenant-b"});
  REQUIRE(other.hit_pages == 0);
  REQUIRE(PagesOf(*manager, 2) == Pages{3, 4, 5});
  const AdmissionPlan adapter =
      AdmitOk(*manager, 3, prompt, {.cache_salt = "tenant-a", .adapter_id = 7});
  REQUIRE(adapter.hit_pages == 0);
  const AdmissionPlan same =
      AdmitOk(*manager, 4, prompt, {.cache_salt = "tenant-a"});
  REQUIRE(same.hit_pages == 2);
  REQUIRE(PagesOf(*manager, 4) == Pages{0, 1, 9});
}

TEST_CASE("prefix caching can be turned off") {
  auto manager = MakeManager(Config(16), {.enable_prefix_caching = false});
  AdmitOk(*manager, 1, TokenRange(1, 9));
  const AdmissionPlan plan = AdmitOk(*manager, 2, TokenRange(1, 9));
  REQUIRE(plan.hit_pages == 0);
  REQUIRE(manager->pool().NumCached() == 0);
  REQUIRE_OK(manager->Free(1));
  REQUIRE(manager->pool().NumEvictable() == 0);
}

TEST_CASE("admission plans and the watermark") {
  auto manager = MakeManager(Config(8), {.watermark_pages = 2});
  const std::vector<TokenId> prompt = TokenRange(1, 20);  // 5 pages
  auto plan = manager->PlanAdmission(prompt);
  REQUIRE_OK(plan);
  REQUIRE(plan->new_pages == 5);
  REQUIRE(plan->pages_consumed() == 5);
  REQUIRE(manager->CanAdmit(prompt));
  AdmitOk(*manager, 1, prompt);
  // 3 pages left, 2 kept: a 2-page prompt must wait, a 1-page one fits.
  REQUIRE_FALSE(manager->CanAdmit(TokenRange(50, 8)));
  REQUIRE(manager->CanAdmit(TokenRange(50, 4)));
  // Appends may use the watermark.
  AppendOk(*manager, 1, TokenRange(21, 12));
  REQUIRE(manager->pool().NumFree() == 0);
}

SequenceHandle HandleOk(const BlockManager& manager, SequenceId id) {
  auto handle = Impl(manager).HandleOf(id);
  REQUIRE_OK(handle);
  return *handle;
}

TEST_CASE("append many appends in entry order and reports changed entries") {
  auto manager = MakeManager(Config(16));
  AdmitOk(*manager, 1, TokenRange(1, 6));   // pages 0, 1 (2 of 4 in page 1)
  AdmitOk(*manager, 2, TokenRange(50, 4));  // page 2, full
  REQUIRE_OK(manager->Fork(1, 3));          // shares 0, 1
  const std::vector<SequenceHandle> handles = {
      HandleOk(*manager, 1), HandleOk(*manager, 2), HandleOk(*manager, 3),
      HandleOk(*manager, 1)};
  for (const SequenceHandle handle : handles) {
    REQUIRE(handle.index >= 0);
    REQUIRE(handle.index < Impl(*manager).handle_limit());
  }
  internal::AppendManyResult result;
  // 1 copies its shared partial page; 2 opens a page; 3 then holds page 1
  // alone and writes in place; 1 appends again, filling its copy.
  REQUIRE_OK(
      Impl(*manager).AppendMany(handles, {1, 1, 1, 1}, {7, 51, 9, 8}, result));
  REQUIRE_OK(manager->CheckInvariants());
  REQUIRE(result.changed == std::vector<int32_t>{0, 1});
  // 1 rewrote its page 1 (the copy), 2 added its page 1.
  REQUIRE(result.first_changed_page == std::vector<int32_t>{1, 1});
  REQUIRE(result.copies == std::vector<PageCopy>{{1, 3}});
  REQUIRE(result.new_pages == 1);
  REQUIRE(PagesOf(*manager, 1) == Pages{0, 3});
  REQUIRE(PagesOf(*manager, 2) == Pages{2, 4});
  REQUIRE(PagesOf(*manager, 3) == Pages{0, 1});
  REQUIRE(*manager->NumTokens(1) == 8);
  REQUIRE(*manager->NumTokens(3) == 7);
  auto pages = Impl(*manager).PagesAt(handles[1]);
  REQUIRE_OK(pages);
  REQUIRE(Pages(pages->begin(), pages->end()) == Pages{2, 4});

  // Same tokens through Append: the same pages and cache entries.
  auto reference = MakeManager(Config(16));
  AdmitOk(*reference, 1, TokenRange(1, 6));
  AdmitOk(*reference, 2, TokenRange(50, 4));
  REQUIRE_OK(reference->Fork(1, 3));
  AppendOk(*reference, 1, {7});
  AppendOk(*reference, 2, {51});
  AppendOk(*reference, 3, {9});
  AppendOk(*reference, 1, {8});
  REQUIRE(reference->Snapshot() == manager->Snapshot());
}

TEST_CASE("append many fails as a whole") {
  auto manager = MakeManager(Config(4, 4, 4));
  AdmitOk(*manager, 1, TokenRange(1, 6));
  AdmitOk(*manager, 2, TokenRange(20, 3));  // 3 pages used, 1 free
  const SequenceHandle one = HandleOk(*manager, 1);
  const SequenceHandle two = HandleOk(*manager, 2);
  const BlockManagerSnapshot before = manager->Snapshot();
  internal::AppendManyResult result;
  result.changed = {5};
  result.first_changed_page = {2};

  SECTION("bad arguments") {
    REQUIRE_STATUS_IS(Impl(*manager).AppendMany({one}, {1, 1}, {7, 8}, result),
                      kInvalidArgument);
    REQUIRE_STATUS_IS(
        Impl(*manager).AppendMany({one, two}, {1, -1}, {7}, result),
        kInvalidArgument);
    REQUIRE_STATUS_IS(
        Impl(*manager).AppendMany({one, two}, {1, 2}, {7, 8}, result),
        kInvalidArgument);
    REQUIRE_STATUS_IS(Impl(*manager).AppendMany({one}, {1}, {7, 8}, result),
                      kInvalidArgument);
    REQUIRE_STATUS_IS(
        Impl(*manager).AppendMany({one, {99, 0}}, {1, 1}, {7, 8}, result),
        kInvalidArgument);
    REQUIRE_STATUS_IS(Impl(*manager).AppendMany({{-1, 0}}, {1}, {7}, result),
                      kInvalidArgument);
    const SequenceHandle stale = {one.index, one.generation + 1};
    REQUIRE_STATUS_IS(Impl(*manager).AppendMany({stale}, {1}, {7}, result),
                      kInvalidArgument);
  }
  SECTION("a later entry runs out of pages") {
    // Entry 0 takes the free page; entry 1 then needs another.
    REQUIRE_STATUS_IS(Impl(*manager).AppendMany({two, one}, {2, 3},
                                                {21, 22, 7, 8, 9}, result),
                      kResourceExhausted);
  }
  SECTION("a one-token start finds no page after fills and a start") {
    // Sequence 2 fills its page and starts the free one; sequence 1 fills
    // its page and then needs a page that is not there.
    REQUIRE_STATUS_IS(
        Impl(*manager).AppendMany({two, two, one, one, one}, {1, 1, 1, 1, 1},
                                  {21, 22, 7, 8, 9}, result),
        kResourceExhausted);
  }
  SECTION("a later entry passes max_pages_per_seq") {
    REQUIRE_STATUS_IS(Impl(*manager).AppendMany({two, one}, {1, 11},
                                                TokenRange(21, 12), result),
                      kOutOfRange);
  }
  SECTION("a handle whose sequence left, even once its entry is reused") {
    REQUIRE_OK(manager->Free(2));
    const BlockManagerSnapshot freed = manager->Snapshot();
    REQUIRE_STATUS_IS(
        Impl(*manager).AppendMany({one, two}, {1, 1}, {7, 8}, result),
        kInvalidArgument);
    REQUIRE_STATUS_IS(Impl(*manager).PagesAt(two), kInvalidArgument);
    REQUIRE_STATUS_IS(Impl(*manager).HandleOf(2), kNotFound);
    REQUIRE(manager->Snapshot() == freed);
    AdmitOk(*manager, 3, TokenRange(40, 2));
    const SequenceHandle three = HandleOk(*manager, 3);
    REQUIRE(three.index == two.index);  // LIFO reuse of the entry.
    REQUIRE_FALSE(three == two);
    const BlockManagerSnapshot reused = manager->Snapshot();
    REQUIRE_STATUS_IS(Impl(*manager).AppendMany({two}, {1}, {7}, result),
                      kInvalidArgument);
    REQUIRE(manager->Snapshot() == reused);
    return;
  }
  REQUIRE(result.changed.empty());
  REQUIRE(result.first_changed_page.empty());
  REQUIRE(result.copies.empty());
  REQUIRE(result.new_pages == 0);
  REQUIRE(manager->Snapshot() == before);
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("a rolled-back fork keeps copy on write exact") {
  // The fork's undo leaves the parent's partial page flagged as maybe
  // shared; its next append must still write in place.
  auto manager = MakeManager(Config(16));
  AdmitOk(*manager, 1, TokenRange(1, 6));
  REQUIRE_OK(Impl(*manager).BeginStep());
  REQUIRE_OK(manager->Fork(1, 2));
  REQUIRE_OK(Impl(*manager).RollbackStep());
  REQUIRE_FALSE(AppendOk(*manager, 1, {7}).copy.has_value());
  REQUIRE(PagesOf(*manager, 1) == Pages{0, 1});
}

TEST_CASE("prompt hashes computed once serve planning and admission") {
  const std::vector<TokenId> system = TokenRange(100, 8);  // 2 pages of 4
  auto manager = MakeManager(Config(16));
  auto reference = MakeManager(Config(16));
  for (BlockManager* m : {manager.get(), reference.get()}) {
    AdmitOk(*m, 1, Concat(system, TokenRange(1, 3)));
  }
  const std::vector<TokenId> prompt = Concat(system, TokenRange(50, 6));
  const HashExtraKeys extra = {};
  std::vector<BlockHash> hashes(4);
  auto count = manager->HashPrompt(prompt, extra, absl::MakeSpan(hashes));
  REQUIRE_OK(count);
  REQUIRE(*count == 3);  // 14 tokens: 3 full pages.
  hashes.resize(3);

  auto plan = manager->PlanAdmission(prompt, extra, hashes);
  REQUIRE_OK(plan);
  REQUIRE(plan->hit_pages == 2);
  REQUIRE(manager->CanAdmit(prompt, extra, hashes));
  auto admitted = manager->Admit(2, prompt, extra, hashes);
  REQUIRE_OK(admitted);
  REQUIRE(admitted->hit_pages == 2);
  REQUIRE_OK(manager->CheckInvariants());
  // The same as hashing inside Admit.
  AdmitOk(*reference, 2, prompt, extra);
  REQUIRE(manager->Snapshot() == reference->Snapshot());

  SECTION("a wrong count of hashes is rejected, changing nothing") {
    const BlockManagerSnapshot before = manager->Snapshot();
    const std::vector<BlockHash> short_chain(hashes.begin(), hashes.end() - 1);
    REQUIRE_STATUS_IS(manager->PlanAdmission(prompt, extra, short_chain),
                      kInvalidArgument);
    REQUIRE_FALSE(manager->CanAdmit(prompt, extra, short_chain));
    REQUIRE_STATUS_IS(manager->Admit(3, prompt, extra, short_chain),
                      kInvalidArgument);
    REQUIRE(manager->Snapshot() == before);
  }
  SECTION("hashes of other extra keys are refused at admission") {
    const BlockManagerSnapshot before = manager->Snapshot();
    REQUIRE_STATUS_IS(manager->Admit(3, prompt, {"tenant-b", 0}, hashes),
                      kInvalidArgument);
    REQUIRE(manager->Snapshot() == before);
  }
  SECTION("after a check, other first pages and first hashes are refused") {
    // Admit remembers the first page it checked; a prompt that differs in
    // it, or a chain that does not start from it, still fails the check.
    const BlockManagerSnapshot before = manager->Snapshot();
    std::vector<TokenId> other_start = prompt;
    other_start[3] += 1;
    REQUIRE_STATUS_IS(manager->Admit(3, other_start, extra, hashes),
                      kInvalidArgument);
    std::vector<BlockHash> other_first = hashes;
    other_first[0] = hashes[1];
    REQUIRE_STATUS_IS(manager->Admit(3, prompt, extra, other_first),
                      kInvalidArgument);
    REQUIRE(manager->Snapshot() == before);
    // And the remembered page still passes.
    REQUIRE_OK(manager->Admit(3, prompt, extra, hashes));
  }
  SECTION("without prefix caching the hashes are ignored") {
    auto uncached = MakeManager(Config(16), {.enable_prefix_caching = false});
    auto result = uncached->Admit(2, prompt, extra, {hashes.front()});
    REQUIRE_OK(result);
    REQUIRE(result->hit_pages == 0);
  }
}

TEST_CASE("failing calls change nothing") {
  auto manager = MakeManager(Config(4, 4, 4));
  AdmitOk(*manager, 1, TokenRange(1, 6));
  REQUIRE_OK(manager->Fork(1, 2));  // 2 pages shared, 2 free
  const BlockManagerSnapshot before = manager->Snapshot();

  SECTION("admit") {
    REQUIRE_STATUS_IS(manager->Admit(1, TokenRange(1, 4)), kAlreadyExists);
    REQUIRE_STATUS_IS(manager->Admit(3, {}), kInvalidArgument);
    REQUIRE_STATUS_IS(manager->Admit(3, TokenRange(1, 17)), kOutOfRange);
    REQUIRE_STATUS_IS(manager->Admit(3, TokenRange(100, 16)),
                      kResourceExhausted);
    REQUIRE_STATUS_IS(manager->PlanAdmission({}), kInvalidArgument);
  }
  SECTION("append") {
    REQUIRE_STATUS_IS(manager->Append(9, {1}), kNotFound);
    REQUIRE_STATUS_IS(manager->Append(1, TokenRange(7, 11)), kOutOfRange);
    // A copy of page 1 plus 2 new pages is one more than the 2 free pages.
    REQUIRE_STATUS_IS(manager->Append(1, TokenRange(7, 10)),
                      kResourceExhausted);
  }
  SECTION("a one-token start with no page left") {
    AppendOk(*manager, 1, {7, 8});   // copies page 1 and fills the copy.
    AppendOk(*manager, 2, {9, 10});  // fills page 1, now held alone.
    AppendOk(*manager, 2, {11});     // starts the last free page.
    const BlockManagerSnapshot full = manager->Snapshot();
    REQUIRE_STATUS_IS(manager->Append(1, {12}), kResourceExhausted);
    REQUIRE(manager->Snapshot() == full);
    REQUIRE_OK(manager->CheckInvariants());
    return;
  }
  SECTION("fork, free, preempt") {
    REQUIRE_STATUS_IS(manager->Fork(9, 3), kNotFound);
    REQUIRE_STATUS_IS(manager->Fork(1, 2), kAlreadyExists);
    REQUIRE_STATUS_IS(manager->Free(9), kNotFound);
    REQUIRE_STATUS_IS(manager->Preempt(9), kNotFound);
    REQUIRE_STATUS_IS(manager->Pages(9), kNotFound);
    REQUIRE_STATUS_IS(manager->NumTokens(9), kNotFound);
  }
  SECTION("steps out of order") {
    REQUIRE_STATUS_IS(Impl(*manager).CommitStep(), kFailedPrecondition);
    REQUIRE_STATUS_IS(Impl(*manager).RollbackStep(), kFailedPrecondition);
    REQUIRE_OK(Impl(*manager).BeginStep());
    REQUIRE_STATUS_IS(Impl(*manager).BeginStep(), kFailedPrecondition);
    REQUIRE_STATUS_IS(manager->ResetPrefixCache(), kFailedPrecondition);
    REQUIRE_OK(Impl(*manager).RollbackStep());
  }
  REQUIRE(manager->Snapshot() == before);
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("a rolled-back step restores the exact state") {
  auto manager = MakeManager(Config(12));
  AdmitOk(*manager, 1, TokenRange(1, 9));
  AdmitOk(*manager, 2, TokenRange(1, 6));
  AppendOk(*manager, 2, TokenRange(7, 3));
  REQUIRE_OK(manager->Free(2));
  const BlockManagerSnapshot before = manager->Snapshot();

  REQUIRE_OK(Impl(*manager).BeginStep());
  REQUIRE(Impl(*manager).in_step());
  REQUIRE_OK(manager->Fork(1, 3));
  AppendOk(*manager, 1, TokenRange(10, 7));
  AppendOk(*manager, 3, {42});
  REQUIRE_OK(manager->Free(1));
  AdmitOk(*manager, 4, TokenRange(1, 12));  // revives cached pages
  AdmitOk(*manager, 5, TokenRange(300, 7));
  REQUIRE_STATUS_IS(manager->Admit(6, TokenRange(400, 32)), kResourceExhausted);
  REQUIRE_OK(manager->Preempt(4));
  REQUIRE(manager->Snapshot() != before);
  REQUIRE_OK(Impl(*manager).RollbackStep());
  REQUIRE_FALSE(Impl(*manager).in_step());

  REQUIRE(manager->Snapshot() == before);
  REQUIRE_OK(manager->CheckInvariants());

  SECTION("and the manager keeps working after it") {
    AppendOk(*manager, 1, TokenRange(10, 7));
    REQUIRE_OK(Impl(*manager).BeginStep());
    AdmitOk(*manager, 7, TokenRange(1, 5));
    REQUIRE_OK(Impl(*manager).CommitStep());
    REQUIRE(manager->Contains(7));
    REQUIRE_OK(manager->CheckInvariants());
  }
}

TEST_CASE("appends across page boundaries in one step roll back exactly") {
  BlockManagerOptions options;
  SECTION("with prefix caching") {}
  SECTION("without prefix caching") { options.enable_prefix_caching = false; }
  auto manager = MakeManager(Config(12), options);
  AdmitOk(*manager, 1, TokenRange(1, 3));  // a partial page one token short.
  const BlockManagerSnapshot before = manager->Snapshot();

  // Each script fills the page, then writes the next page's first tokens
  // over the buffered ones, by a start of one token or of several.
  using Script = std::vector<std::vector<TokenId>>;
  const Script script = GENERATE(Script{{50}, {51}, {52}, {53}, {54}, {55}},
                                 Script{{50}, {51, 52}, {53}, {54}, {55}});
  REQUIRE_OK(Impl(*manager).BeginStep());
  for (const std::vector<TokenId>& tokens : script) {
    AppendOk(*manager, 1, tokens);
  }
  REQUIRE(PagesOf(*manager, 1).size() == 3);
  REQUIRE_OK(Impl(*manager).RollbackStep());
  REQUIRE(manager->Snapshot() == before);
  REQUIRE_OK(manager->CheckInvariants());

  // The restored partial page fills to the same content as before.
  AppendOk(*manager, 1, {50});
  if (options.enable_prefix_caching) {
    auto plan = manager->PlanAdmission(Concat(TokenRange(1, 3), {50, 9}));
    REQUIRE_OK(plan);
    REQUIRE(plan->hit_pages == 1);
  }
}

TEST_CASE("create rejects bad configs and options") {
  REQUIRE_STATUS_IS(BlockManager::Create(PagedKvConfig{}), kInvalidArgument);
  REQUIRE_STATUS_IS(BlockManager::Create(Config(8), {.watermark_pages = -1}),
                    kInvalidArgument);
  REQUIRE_STATUS_IS(BlockManager::Create(Config(8), {.watermark_pages = 9}),
                    kInvalidArgument);
  REQUIRE_STATUS_IS(BlockManager::Create(Config(8), {.max_sequences = -1}),
                    kInvalidArgument);
  for (const int32_t changes : {-1, kMaxReservedKvChanges + 1}) {
    INFO("reserved_kv_changes " << changes);
    const auto manager = BlockManager::Create(
        Config(8), {.enable_kv_events = true, .reserved_kv_changes = changes});
    REQUIRE(manager.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(std::string(manager.status().message())
                .find(absl::StrCat("reserved_kv_changes must be in "
                                   "[0, 4194304], got ",
                                   changes)) != std::string::npos);
  }
  // 0: the buffers grow as the events come.
  REQUIRE_OK(BlockManager::Create(
      Config(8), {.enable_kv_events = true, .reserved_kv_changes = 0}));
}

TEST_CASE("sequences beyond the reserved slab still work") {
  auto manager = MakeManager(Config(64), {.max_sequences = 2});
  for (SequenceId id = 0; id < 10; ++id)
    AdmitOk(*manager, id, TokenRange(1, 5));
  REQUIRE(manager->num_sequences() == 10);
  for (SequenceId id = 0; id < 10; ++id) REQUIRE_OK(manager->Free(id));
  REQUIRE(manager->num_sequences() == 0);
  REQUIRE(manager->stats().pages_in_use == 0);
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("stats count tokens, forks, frees and preemptions") {
  auto manager = MakeManager(Config(16));
  AdmitOk(*manager, 1, TokenRange(1, 9));
  AppendOk(*manager, 1, {10, 11});
  REQUIRE_OK(manager->Fork(1, 2));
  REQUIRE_OK(manager->Free(1));
  REQUIRE_OK(manager->Preempt(2));
  const BlockManagerStats stats = manager->stats();
  REQUIRE(stats.admitted == 1);
  REQUIRE(stats.prompt_tokens == 9);
  REQUIRE(stats.appended_tokens == 2);
  REQUIRE(stats.forks == 1);
  REQUIRE(stats.freed == 1);
  REQUIRE(stats.preemptions == 1);
  REQUIRE(stats.pages_in_use == 0);
  REQUIRE(stats.peak_pages_in_use == 3);
  REQUIRE_STATUS_IS(manager->NumTokens(1), kNotFound);
}

// Host tier
// --------------------------------------------------------------------

std::vector<HostCopy> TakeCopies(BlockManager& manager) {
  std::vector<HostCopy> copies;
  REQUIRE_OK(manager.TakeHostCopies(copies));
  return copies;
}

// The loads of `copies`, in order.
std::vector<HostCopy> Loads(const std::vector<HostCopy>& copies) {
  std::vector<HostCopy> loads;
  for (const HostCopy& copy : copies) {
    if (copy.direction == HostCopy::Direction::kHostToDevice) {
      loads.push_back(copy);
    }
  }
  return loads;
}

// 8 pages of 4 tokens, a host tier of 16: prompt A (4 full pages and one
// token) computed, freed, then evicted by an unrelated 8-page prompt B into
// the host tier; every copy batch taken.
std::unique_ptr<BlockManager> ManagerWithAInHost(
    BlockManagerOptions options = {}) {
  options.host_pages = 16;
  auto manager = MakeManager(Config(8), options);
  AdmitOk(*manager, 1, TokenRange(1, 17));
  REQUIRE_OK(manager->Free(1));
  TakeCopies(*manager);
  AdmitOk(*manager, 2, TokenRange(1000, 32));  // evicts A's 4 cached pages.
  REQUIRE_OK(manager->Free(2));
  const std::vector<HostCopy> stores = TakeCopies(*manager);
  REQUIRE(stores.size() == 4);
  for (const HostCopy& copy : stores) {
    REQUIRE(copy.direction == HostCopy::Direction::kDeviceToHost);
  }
  REQUIRE(manager->stats().host_stores == 4);
  return manager;
}

TEST_CASE("a prompt evicted to the host tier is loaded back when it returns") {
  auto manager = ManagerWithAInHost();
  const std::vector<TokenId> prompt = TokenRange(1, 17);
  auto planned = manager->PlanAdmission(prompt);
  REQUIRE_OK(planned);
  REQUIRE(planned->hit_pages == 4);
  REQUIRE(planned->host_hit_pages == 4);
  REQUIRE(planned->new_pages == 1);
  REQUIRE(planned->pages_consumed() == 5);
  const AdmissionPlan plan = AdmitOk(*manager, 3, prompt);
  REQUIRE(plan.hit_tokens == 16);
  REQUIRE(plan.host_hit_pages == 4);
  REQUIRE(plan.computed_tokens == 1);
  const Pages pages = PagesOf(*manager, 3);
  // Each page it takes evicts one of B's, stored first.
  const std::vector<HostCopy> copies = TakeCopies(*manager);
  REQUIRE(copies.size() == 9);
  const std::vector<HostCopy> loads = Loads(copies);
  REQUIRE(loads.size() == 4);
  for (int i = 0; i < 4; ++i) {
    REQUIRE(loads[i].direction == HostCopy::Direction::kHostToDevice);
    REQUIRE(loads[i].device_page == pages[i]);
  }
  const BlockManagerStats stats = manager->stats();
  REQUIRE(stats.prefix_hit_tokens == 16);
  REQUIRE(stats.host_hit_tokens == 16);
  REQUIRE(stats.host_loads == 4);
  // The loaded pages are cached again: a fourth admission hits the device.
  auto again = manager->PlanAdmission(prompt);
  REQUIRE_OK(again);
  REQUIRE(again->hit_pages == 4);
  REQUIRE(again->host_hit_pages == 0);
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("hits continue from the device into the host tier") {
  auto manager = ManagerWithAInHost();
  // Prompt A's first two pages come back on the device through a prompt
  // that shares them; the next two are the host tier's.
  AdmitOk(*manager, 3, TokenRange(1, 9));
  TakeCopies(*manager);
  const AdmissionPlan plan = AdmitOk(*manager, 4, TokenRange(1, 17));
  REQUIRE(plan.hit_pages == 4);
  REQUIRE(plan.host_hit_pages == 2);
  REQUIRE(plan.revived_pages == 0);
  const Pages three = PagesOf(*manager, 3);
  const Pages four = PagesOf(*manager, 4);
  REQUIRE(four[0] == three[0]);
  REQUIRE(four[1] == three[1]);
  const std::vector<HostCopy> loads = Loads(TakeCopies(*manager));
  REQUIRE(loads.size() == 2);
  REQUIRE(loads[0].device_page == four[2]);
  REQUIRE(loads[1].device_page == four[3]);
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("loading a prompt's hits never drops a later one of them") {
  // A host tier of 4 pages: each load takes a device page, whose eviction
  // stores a page; that store must not drop the prompt's next hit.
  auto manager = MakeManager(Config(8), {.host_pages = 4});
  for (const auto& [id, prompt] :
       {std::pair{1, TokenRange(1, 17)}, std::pair{2, TokenRange(1000, 32)},
        std::pair{3, TokenRange(2000, 8)}}) {
    AdmitOk(*manager, id, prompt);
    REQUIRE_OK(manager->Free(id));
    TakeCopies(*manager);
  }
  auto planned = manager->PlanAdmission(TokenRange(1, 17));
  REQUIRE_OK(planned);
  REQUIRE(planned->host_hit_pages > 1);
  const AdmissionPlan plan = AdmitOk(*manager, 4, TokenRange(1, 17));
  REQUIRE(plan.host_hit_pages == planned->host_hit_pages);
  REQUIRE(Loads(TakeCopies(*manager)).size() ==
          static_cast<size_t>(plan.host_hit_pages));
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("no load of a copy batch writes a page its copy on write uses") {
  // Between two steps: A's partial page, shared with its fork B, is copied
  // when one of them appends; B leaves, freeing the shared page (A copied
  // it) or B's copy (B did); C's admission loads A's evicted prompt from
  // the host tier. The batch's loads run before its copies on write, so
  // none may load into the copy's source or destination.
  const bool fork_appends = GENERATE(false, true);
  INFO((fork_appends ? "B" : "A") << " appends");
  auto manager = ManagerWithAInHost();
  AdmitOk(*manager, 3, TokenRange(500, 2));
  REQUIRE_OK(manager->Fork(3, 4));
  TakeCopies(*manager);
  auto appended = manager->Append(fork_appends ? 4 : 3, TokenRange(502, 1));
  REQUIRE_OK(appended);
  REQUIRE(appended->copy.has_value());
  const PageId freed =
      fork_appends ? appended->copy->destination : appended->copy->source;
  REQUIRE_OK(manager->Free(4));
  AdmitOk(*manager, 5, TokenRange(1, 17));
  const std::vector<HostCopy> loads = Loads(TakeCopies(*manager));
  REQUIRE(loads.size() == 4);
  for (const HostCopy& load : loads) REQUIRE(load.device_page != freed);
  REQUIRE_OK(manager->CheckInvariants());
  // Taken, the batch frees it.
  REQUIRE(manager->pool().RefCount(freed) == 0);
}

TEST_CASE("an admission that cannot load its hits changes nothing") {
  auto manager = ManagerWithAInHost();
  AdmitOk(*manager, 3, TokenRange(500, 24));  // 6 of the 8 pages.
  TakeCopies(*manager);
  const BlockManagerSnapshot before = manager->Snapshot();
  // 4 loads and a new page need 5 allocatable pages; 2 are.
  const auto refused = manager->Admit(4, TokenRange(1, 17));
  REQUIRE_STATUS_IS(refused, kResourceExhausted);
  REQUIRE(manager->Snapshot() == before);
  REQUIRE(TakeCopies(*manager).empty());
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("a host tier is refused without prefix caching or with groups") {
  const auto no_cache = BlockManager::Create(
      Config(8), {.enable_prefix_caching = false, .host_pages = 4});
  REQUIRE_STATUS_IS(no_cache, kInvalidArgument);
  REQUIRE(std::string(no_cache.status().message()).find("prefix caching") !=
          std::string::npos);
  REQUIRE_STATUS_IS(BlockManager::Create(Config(8), {.host_pages = -1}),
                    kInvalidArgument);
  BlockManagerOptions groups{.host_pages = 4};
  groups.kv_cache_groups = {{.kind = AttentionKind::kFull, .page_size = 4},
                            {.kind = AttentionKind::kSlidingWindow,
                             .page_size = 4,
                             .sliding_window = 8}};
  const auto hybrid = BlockManager::Create(Config(16), groups);
  REQUIRE_STATUS_IS(hybrid, kInvalidArgument);
  REQUIRE(std::string(hybrid.status().message()).find("one full-attention") !=
          std::string::npos);
  // Without a host tier there is nothing to take.
  auto manager = MakeManager(Config(8));
  AdmitOk(*manager, 1, TokenRange(1, 9));
  REQUIRE(TakeCopies(*manager).empty());
}

TEST_CASE("host tier events: CPU stores and removals, loads stored on GPU") {
  BlockManagerOptions options{.enable_kv_events = true};
  options.host_pages = 16;
  auto manager = ManagerWithAInHost(options);
  std::vector<KvCacheEvent> events;
  REQUIRE_OK(manager->TakeKvEvents(events));
  // A's four pages were removed from the GPU and stored on the CPU, with
  // the hashes a router knows them by.
  std::vector<BlockHash> stored_a;
  for (const KvCacheEvent& event : events) {
    if (event.kind == KvCacheEvent::Kind::kBlockStored &&
        event.medium == KvCacheEvent::Medium::kGpu && stored_a.empty()) {
      stored_a = event.block_hashes;
    }
  }
  REQUIRE(stored_a.size() == 4);
  std::vector<BlockHash> cpu_stored;
  for (const KvCacheEvent& event : events) {
    if (event.medium != KvCacheEvent::Medium::kCpu) continue;
    REQUIRE(event.kind == KvCacheEvent::Kind::kBlockStored);
    REQUIRE(!event.parent_block_hash.has_value());
    REQUIRE(event.token_ids.empty());
    cpu_stored.insert(cpu_stored.end(), event.block_hashes.begin(),
                      event.block_hashes.end());
  }
  // Evicted from the LRU head: the continuation first.
  REQUIRE(cpu_stored ==
          std::vector<BlockHash>(stored_a.rbegin(), stored_a.rend()));
  // Loading A back stores its pages on the GPU, with chain and tokens.
  AdmitOk(*manager, 3, TokenRange(1, 17));
  events.clear();
  REQUIRE_OK(manager->TakeKvEvents(events));
  // Each load's page evicts one of B's first (a GPU removal and a CPU
  // store): the loads are events of their own, each naming its parent.
  std::vector<BlockHash> gpu_stored;
  std::vector<TokenId> tokens;
  for (const KvCacheEvent& event : events) {
    if (event.kind != KvCacheEvent::Kind::kBlockStored ||
        event.medium != KvCacheEvent::Medium::kGpu) {
      continue;
    }
    if (gpu_stored.empty()) {
      REQUIRE(!event.parent_block_hash.has_value());
    } else {
      REQUIRE(event.parent_block_hash == gpu_stored.back());
    }
    gpu_stored.insert(gpu_stored.end(), event.block_hashes.begin(),
                      event.block_hashes.end());
    tokens.insert(tokens.end(), event.token_ids.begin(), event.token_ids.end());
  }
  REQUIRE(gpu_stored == stored_a);
  REQUIRE(tokens == TokenRange(1, 16));
}

}  // namespace
}  // namespace kvblock
