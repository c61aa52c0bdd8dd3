// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// BatchCommit over a manager of several KV cache groups: one table holding
// every group's rows (group g's slot s is row g * max_batch + s), window
// groups' skipped pages in their rows as the null page, copies tagged with
// their group, and a failed step undone in every group and row.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/group_spec_test_util.h"
#include "commit/batch_commit_test_util.h"
#include "commit/page_table_checks.h"
#include "kvblock/batch_commit.h"
#include "kvblock/block_manager.h"
#include "kvblock/device.h"
#include "kvblock/page_table.h"
#include "test_util.h"

namespace kvblock {
namespace {

using Pages = std::vector<PageId>;
using Tokens = std::vector<TokenId>;
using testing::TokenRange;

using testing::GroupSpec;

constexpr int32_t kMaxBatch = 4;

KvCacheGroupSpec Eagle(KvCacheGroupSpec spec) {
  spec.eagle = true;
  return spec;
}

struct Fixture {
  Fixture(int32_t num_pages, std::vector<KvCacheGroupSpec> groups,
          int32_t width) {
    const PagedKvConfig config{.num_pages = num_pages,
                               .max_batch = kMaxBatch,
                               .max_pages_per_seq = 16,
                               .page_size = 4};
    auto created = BlockManager::Create(config, {.kv_cache_groups = groups});
    REQUIRE_OK(created);
    manager = std::move(created).value();
    device = Device::Host();
    auto made =
        KVPageTable::Create(kMaxBatch * static_cast<int32_t>(groups.size()),
                            width, num_pages, *device);
    REQUIRE_OK(made);
    table = std::move(made).value();
    auto commit_or = BatchCommit::Create(*manager, *table);
    REQUIRE_OK(commit_or);
    commit = std::move(commit_or).value();
  }
  // Group g's row of slot `slot`, up to its first kNoPage.
  Pages Row(int32_t g, SlotId slot) const {
    const auto row = table->HostRow(g * kMaxBatch + slot).value();
    return {row.begin(), std::find(row.begin(), row.end(), kNoPage)};
  }
  Pages GroupPages(SequenceId id, int32_t g) const {
    const auto pages = manager->GroupPages(id, g).value();
    return {pages.begin(), pages.end()};
  }
  std::vector<Pages> Rows() const {
    std::vector<Pages> rows;
    for (int32_t row = 0; row < table->max_batch(); ++row) {
      rows.push_back(Row(row / kMaxBatch, row % kMaxBatch));
    }
    return rows;
  }

  std::unique_ptr<BlockManager> manager;
  std::unique_ptr<Device> device;
  std::unique_ptr<KVPageTable> table;
  std::unique_ptr<BatchCommit> commit;
};

TEST_CASE("a commit keeps every group's rows in one table") {
  using enum AttentionKind;
  // gpt-oss's shape: full attention and a window of 8 tokens.
  Fixture f(128, {GroupSpec(kFull, 4), GroupSpec(kSlidingWindow, 4, 8)}, 16);
  const Tokens prompt_a = TokenRange(1, 22);
  const Tokens prompt_b = TokenRange(100, 9);
  const JoinRequest joins[] = {{.id = 1, .tokens = prompt_a},
                               {.id = 2, .tokens = prompt_b}};
  auto joined = f.commit->Commit({.joins = joins});
  REQUIRE_OK(joined);
  REQUIRE(joined->batch == 2);
  // Rows of both groups were written: slots 0 and 1, rows 4 and 5.
  REQUIRE(Pages(joined->changed_slots.begin(), joined->changed_slots.end()) ==
          Pages{0, 1, 4, 5});
  for (int32_t g = 0; g < 2; ++g) {
    REQUIRE(f.Row(g, 0) == f.GroupPages(1, g));
    REQUIRE(f.Row(g, 1) == f.GroupPages(2, g));
  }
  REQUIRE_OK(f.commit->CheckInvariants());
  // Decode: the window group's rows gain null pages as the window moves.
  for (int step = 0; step < 24; ++step) {
    const int32_t counts[] = {1, 1};
    const TokenId tokens[] = {500 + step, 600 + step};
    auto decoded =
        f.commit->Commit({.append_counts = counts, .append_tokens = tokens});
    REQUIRE_OK(decoded);
    REQUIRE(decoded->copy_groups.empty());
    REQUIRE_OK(f.commit->CheckInvariants());
  }
  // Sequence 1 computed 22 + 23 tokens before the last step: (45 - 7) / 4.
  const Pages window = f.Row(1, 0);
  REQUIRE(std::count(window.begin(), window.end(), f.manager->null_page()) ==
          9);
  const Pages full = f.Row(0, 0);
  REQUIRE(full.size() == 12);
  REQUIRE(std::count(full.begin(), full.end(), f.manager->null_page()) == 0);
  // Sequence 1 leaves: sequence 2's rows move to slot 0 in both groups.
  const SequenceId finished[] = {1};
  auto left = f.commit->Commit({.finished = finished});
  REQUIRE_OK(left);
  REQUIRE(left->moves.size() == 1);
  for (int32_t g = 0; g < 2; ++g) {
    REQUIRE(f.Row(g, 0) == f.GroupPages(2, g));
    REQUIRE(f.Row(g, 1).empty());
  }
  REQUIRE_OK(f.commit->CheckInvariants());
}

TEST_CASE("a commit tags the copies of forks with their group") {
  using enum AttentionKind;
  Fixture f(128, {GroupSpec(kSlidingWindow, 4, 5), GroupSpec(kFull, 4)}, 16);
  const Tokens prompt = TokenRange(1, 14);
  const JoinRequest joins[] = {{.id = 1, .tokens = prompt}};
  REQUIRE_OK(f.commit->Commit({.joins = joins}));
  const Tokens fork_tokens = {77};
  const JoinRequest forks[] = {{.id = 2, .fork_of = 1, .tokens = fork_tokens}};
  const int32_t counts[] = {1};
  const TokenId tokens[] = {78};
  auto forked = f.commit->Commit(
      {.joins = forks, .append_counts = counts, .append_tokens = tokens});
  REQUIRE_OK(forked);
  // The parent appends first and copies the shared partial page in both
  // groups; the child then holds the old one alone.
  REQUIRE(forked->copies.size() == 2);
  REQUIRE(std::vector<int32_t>(forked->copy_groups.begin(),
                               forked->copy_groups.end()) ==
          std::vector<int32_t>{0, 1});
  REQUIRE(f.Row(0, 0).back() == forked->copies[0].destination);
  REQUIRE(f.Row(1, 0).back() == forked->copies[1].destination);
  REQUIRE_OK(f.commit->CheckInvariants());
}

TEST_CASE("a fork shares its parent's pages from before its window's release") {
  // The parent appends in the step it is forked: its window releases the
  // pages its new token no longer reads, but the fork, which has not
  // computed that token, takes the pages as at the start of the step (it
  // took the null page where its last token is, breaking the invariants).
  using enum AttentionKind;
  for (const KvCacheGroupSpec& window :
       {GroupSpec(kChunkedLocal, 4, 8), GroupSpec(kSlidingWindow, 4, 4)}) {
    INFO("window kind " << static_cast<int>(window.kind));
    Fixture f(128, {GroupSpec(kFull, 4), window}, 16);
    const Tokens prompt = TokenRange(1, 8);  // two full pages.
    const JoinRequest joins[] = {{.id = 1, .tokens = prompt}};
    REQUIRE_OK(f.commit->Commit({.joins = joins}));
    const Pages before = f.GroupPages(1, 1);
    const JoinRequest forks[] = {{.id = 2, .fork_of = 1}};
    const int32_t counts[] = {1};
    const TokenId tokens[] = {99};
    REQUIRE_OK(f.commit->Commit(
        {.joins = forks, .append_counts = counts, .append_tokens = tokens}));
    REQUIRE(f.GroupPages(2, 1) == before);
    REQUIRE(f.GroupPages(1, 1)[0] == f.manager->null_page());
    REQUIRE(f.Row(1, 1) == before);
    REQUIRE_OK(f.manager->CheckInvariants());
    REQUIRE_OK(f.commit->CheckInvariants());
  }
}

TEST_CASE("a chunked prompt's rows show its window's skips") {
  using enum AttentionKind;
  Fixture f(128, {GroupSpec(kFull, 4), GroupSpec(kSlidingWindow, 4, 6)}, 16);
  const Tokens prompt = TokenRange(1, 40);
  const JoinRequest joins[] = {
      {.id = 1, .tokens = prompt, .admit = {.prefill_tokens = 16}}};
  REQUIRE_OK(f.commit->Commit({.joins = joins}));
  const PromptChunk chunk[] = {
      {.id = 1, .tokens = absl::MakeConstSpan(prompt).subspan(16, 16)}};
  auto chunked = f.commit->Commit({.prompt_chunks = chunk});
  REQUIRE_OK(chunked);
  // (16 - 5) / 4 = 2 pages left the window.
  REQUIRE(f.Row(1, 0)[1] == f.manager->null_page());
  REQUIRE(f.Row(1, 0)[2] != f.manager->null_page());
  REQUIRE_OK(f.commit->CheckInvariants());
}

TEST_CASE("a step releases its windows' pages before it allocates") {
  using enum AttentionKind;
  // 20 pages, one the null page: a prompt of 32 tokens holds 8 in each
  // group, and 3 are left. Its window of 8 tokens then needs 3 of its pages
  // at most; the step must release the rest before any group or join
  // allocates, as the coordinator's own Append does.
  const std::vector<KvCacheGroupSpec> groups = {
      GroupSpec(kFull, 4), GroupSpec(kSlidingWindow, 4, 8)};
  const Tokens prompt = TokenRange(1, 32);
  const JoinRequest first[] = {{.id = 1, .tokens = prompt}};
  SECTION("an append of 16 tokens") {
    Fixture f(20, groups, 16);
    REQUIRE_OK(f.commit->Commit({.joins = first}));
    REQUIRE(f.manager->pool().NumFree() == 3);
    const int32_t counts[] = {16};
    const Tokens tokens = TokenRange(100, 16);
    REQUIRE_OK(
        f.commit->Commit({.append_counts = counts, .append_tokens = tokens}));
    REQUIRE(f.GroupPages(1, 0).size() == 12);
    REQUIRE(f.Row(1, 0) == f.GroupPages(1, 1));
    REQUIRE_OK(f.commit->CheckInvariants());
  }
  SECTION("a decode step that admits a prompt") {
    Fixture f(20, groups, 16);
    REQUIRE_OK(f.commit->Commit({.joins = first}));
    const int32_t counts[] = {1};
    const TokenId token[] = {100};
    const Tokens second = TokenRange(200, 8);
    const JoinRequest join[] = {{.id = 2, .tokens = second}};
    auto step = f.commit->Commit(
        {.joins = join, .append_counts = counts, .append_tokens = token});
    REQUIRE_OK(step);
    REQUIRE(step->batch == 2);
    for (int32_t g = 0; g < 2; ++g) {
      REQUIRE(f.Row(g, 0) == f.GroupPages(1, g));
      REQUIRE(f.Row(g, 1) == f.GroupPages(2, g));
    }
    REQUIRE_OK(f.commit->CheckInvariants());
  }
}

TEST_CASE("a chunk's prompt hashes serve groups of two page sizes") {
  using enum AttentionKind;
  // Pages of 4 and 8 tokens: the table is as wide as the 4-token group's.
  const std::vector<KvCacheGroupSpec> groups = {GroupSpec(kFull, 4),
                                                GroupSpec(kFull, 8)};
  Fixture f(128, groups, 16);
  Fixture plain(128, groups, 16);
  const Tokens prompt = TokenRange(1, 32);
  const JoinRequest joins[] = {
      {.id = 1, .tokens = prompt, .admit = {.prefill_tokens = 8}}};
  REQUIRE_OK(f.commit->Commit({.joins = joins}));
  REQUIRE_OK(plain.commit->Commit({.joins = joins}));
  std::vector<BlockHash> hashes(8);
  REQUIRE_OK(f.manager->HashPrompt(prompt, {}, absl::MakeSpan(hashes)));
  // The chain of 4-token hash blocks: a chain of 8-token pages is refused
  // by the step, which changes nothing.
  const PromptChunk short_chain[] = {
      {.id = 1,
       .tokens = absl::MakeConstSpan(prompt).subspan(8, 8),
       .prompt_hashes = absl::MakeConstSpan(hashes).first(4)}};
  const BlockManagerSnapshot before = f.manager->Snapshot();
  const std::vector<Pages> rows = f.Rows();
  const auto refused = f.commit->Commit({.prompt_chunks = short_chain});
  REQUIRE_STATUS_IS(refused, kInvalidArgument);
  REQUIRE(std::string(refused.status().message())
              .find("8 full pages of 4 tokens") != std::string::npos);
  REQUIRE(f.manager->Snapshot() == before);
  REQUIRE(f.Rows() == rows);
  // With the chain each group files its pages as it would hash them.
  const PromptChunk chunk[] = {
      {.id = 1,
       .tokens = absl::MakeConstSpan(prompt).subspan(8, 8),
       .prompt_hashes = hashes}};
  const PromptChunk unhashed[] = {
      {.id = 1, .tokens = absl::MakeConstSpan(prompt).subspan(8, 8)}};
  REQUIRE_OK(f.commit->Commit({.prompt_chunks = chunk}));
  REQUIRE_OK(plain.commit->Commit({.prompt_chunks = unhashed}));
  REQUIRE(f.manager->Snapshot() == plain.manager->Snapshot());
  REQUIRE(f.Rows() == plain.Rows());
  REQUIRE_OK(f.commit->CheckInvariants());
}

TEST_CASE("a commit of groups checks the table's geometry") {
  using enum AttentionKind;
  const PagedKvConfig config{.num_pages = 64,
                             .max_batch = kMaxBatch,
                             .max_pages_per_seq = 16,
                             .page_size = 4};
  auto manager = BlockManager::Create(
      config, {.kv_cache_groups = {GroupSpec(kFull, 4), GroupSpec(kFull, 2)}});
  REQUIRE_OK(manager);
  std::unique_ptr<Device> device = Device::Host();
  // Pages of 2 tokens need 32 per sequence: the table is that wide.
  auto narrow = KVPageTable::Create(2 * kMaxBatch, 16, 64, *device);
  REQUIRE_OK(narrow);
  const auto refused = BatchCommit::Create(**manager, **narrow);
  REQUIRE_STATUS_IS(refused, kInvalidArgument);
  REQUIRE(std::string(refused.status().message()).find("(8, 32, 64)") !=
          std::string::npos);
  auto wide = KVPageTable::Create(2 * kMaxBatch, 32, 64, *device);
  REQUIRE_OK(wide);
  REQUIRE_OK(BatchCommit::Create(**manager, **wide));
}

// Random steps against the manager's own pages: after every step each
// group's row of each slot is its sequence's pages in that group, and a
// failed step leaves the manager and every row as they were. Each step is
// also tried as the manager's own calls, one at a time (then undone): a
// commit accepts every step they accept, as it releases windows' pages no
// later than they do. Where no group releases pages, it accepts exactly
// those, and holds as many pages after; with one group, the very pages.
TEST_CASE("random steps over KV cache groups keep every row", "[random]") {
  using enum AttentionKind;
  // Groups, and a pool small enough to refuse steps.
  struct Model {
    std::vector<KvCacheGroupSpec> groups;
    int32_t pages;
  };
  const std::vector<Model> models = {
      {{GroupSpec(kFull, 4), GroupSpec(kSlidingWindow, 4, 6)}, 40},
      {{GroupSpec(kSlidingWindow, 4, 9), GroupSpec(kSlidingWindow, 4, 9),
        GroupSpec(kFull, 4)},
       40},
      {{GroupSpec(kChunkedLocal, 8, 8), GroupSpec(kFull, 4)}, 40},
      // EAGLE drafting with a window of pages below the hits' unit.
      {{Eagle(GroupSpec(kFull, 16)), Eagle(GroupSpec(kSlidingWindow, 4, 5))},
       20},
      // No group releases pages: the calls and the commit agree exactly.
      {{GroupSpec(kFull, 4)}, 24},
      {{GroupSpec(kFull, 4), GroupSpec(kFull, 8)}, 40},
  };
  for (size_t m = 0; m < models.size(); ++m) {
    const std::vector<KvCacheGroupSpec>& groups = models[m].groups;
    const bool releases = std::any_of(
        groups.begin(), groups.end(),
        [](const auto& group) { return group.kind != AttentionKind::kFull; });
    const int32_t width =
        std::max(16, static_cast<int32_t>(64 / groups[0].page_size));
    Fixture f(models[m].pages, groups, width);
    std::mt19937 rng(static_cast<uint32_t>(m + 1));
    const auto uniform = [&](int lo, int hi) {
      return std::uniform_int_distribution<int>(lo, hi)(rng);
    };
    SequenceId next_id = 0;
    TokenId next_token = 1;
    int64_t failures = 0;
    for (int64_t step = 0; step < testing::RandomRunLength(400); ++step) {
      INFO("model " << m << " step " << step);
      const absl::Span<const SequenceId> running = f.commit->slots();
      std::vector<SequenceId> finished;
      std::vector<JoinRequest> joins;
      std::vector<int32_t> counts(running.size(), 0);
      std::vector<TokenId> tokens;
      std::vector<PromptChunk> chunks;
      std::vector<Tokens> prompts;
      prompts.reserve(4);
      std::vector<Tokens> chunk_tokens;
      chunk_tokens.reserve(running.size());
      for (size_t slot = 0; slot < running.size(); ++slot) {
        const SequenceId id = running[slot];
        const int64_t left = f.manager->PromptTokensLeft(id).value();
        if (uniform(0, 9) == 0) {
          finished.push_back(id);
        } else if (left > 0) {
          Tokens& chunk = chunk_tokens.emplace_back();
          for (int64_t i = 0; i < std::min<int64_t>(left, uniform(1, 12));
               ++i) {
            chunk.push_back(next_token++);
          }
          chunks.push_back({.id = id, .tokens = chunk});
        } else {
          counts[slot] = uniform(0, 3);
          for (int32_t i = 0; i < counts[slot]; ++i) {
            tokens.push_back(next_token++);
          }
        }
      }
      const int32_t room = kMaxBatch - static_cast<int32_t>(running.size()) +
                           static_cast<int32_t>(finished.size());
      for (int32_t j = 0; j < std::min(room, uniform(0, 2)); ++j) {
        Tokens& prompt = prompts.emplace_back(
            TokenRange(uniform(0, 1) == 0 ? 1 : next_token, uniform(1, 30)));
        next_token += 100;
        joins.push_back({.id = next_id++,
                         .tokens = prompt,
                         .admit = {.prefill_tokens = uniform(1, 40)}});
      }
      const BlockManagerSnapshot before = f.manager->Snapshot();
      const std::vector<Pages> rows = f.Rows();
      const StepPlan plan = {.finished = finished,
                             .joins = joins,
                             .append_counts = counts,
                             .append_tokens = tokens,
                             .prompt_chunks = chunks};
      const std::vector<SequenceId> slots(running.begin(), running.end());
      const testing::CallByCall by_call =
          testing::TryCallByCall(*f.manager, slots, plan);
      REQUIRE(f.manager->Snapshot() == before);
      const auto result = f.commit->Commit(plan);
      INFO("one call at a time: " << by_call.status.ToString());
      if (by_call.status.ok()) REQUIRE(result.ok());
      if (!releases) {
        REQUIRE(result.ok() == by_call.status.ok());
        if (result.ok() && groups.size() == 1) {
          REQUIRE(f.manager->Snapshot() == by_call.after);
        } else if (result.ok()) {
          REQUIRE(f.manager->stats() == by_call.after.stats);
        }
      }
      if (!result.ok()) {
        INFO(result.status().ToString());
        REQUIRE(f.manager->Snapshot() == before);
        REQUIRE(f.Rows() == rows);
        ++failures;
        // Make room: the oldest running sequence leaves.
        if (!running.empty()) {
          const SequenceId oldest[] = {running[0]};
          REQUIRE_OK(f.commit->Commit({.preempted = oldest}));
        }
      }
      REQUIRE_OK(f.commit->CheckInvariants());
      // The upload sends what changed (a window's released pages alone
      // where only they did): the device then holds the host rows.
      REQUIRE_OK(f.table->Upload(nullptr));
      REQUIRE(testing::ReadMirror(*f.table, *f.device) ==
              testing::ExpectedMirror(*f.table));
    }
    REQUIRE(failures > 0);  // the pool is small enough to refuse steps.
  }
}

}  // namespace
}  // namespace kvblock
