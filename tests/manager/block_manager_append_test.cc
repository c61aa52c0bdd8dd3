// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Scripted steps of BlockManager's append paths that chunked prefill and
// speculative decoding add: prompt chunks ending inside and at the edge of a
// page, reservations, drafts that cross a page, accepted in full or
// rejected, and drafts over a shared partial page. Pages are handed out from
// the free stack's top, 0 first, so every page list is exact.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvblock/block_manager.h"
#include "manager/block_manager_test_util.h"
#include "test_util.h"

namespace kvblock {
namespace {

using Pages = std::vector<PageId>;
using Tokens = std::vector<TokenId>;

constexpr int32_t kPageSize = 4;

std::unique_ptr<BlockManager> MakeManager(int32_t num_pages,
                                          BlockManagerOptions options = {}) {
  PagedKvConfig config;
  config.num_pages = num_pages;
  config.page_size = kPageSize;
  config.max_pages_per_seq = 8;
  config.max_batch = 4;
  auto manager = BlockManager::Create(config, options);
  REQUIRE_OK(manager);
  return *std::move(manager);
}

using testing::TokenRange;

Tokens Concat(Tokens a, const Tokens& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

Tokens Slice(const Tokens& tokens, size_t begin, size_t end) {
  return Tokens(tokens.begin() + begin, tokens.begin() + end);
}

Pages PagesOf(const BlockManager& manager, SequenceId id) {
  auto pages = manager.Pages(id);
  REQUIRE_OK(pages);
  return Pages(pages->begin(), pages->end());
}

// The page cached under the hash chain of `tokens`' full pages, if any.
std::optional<PageId> CachedPage(BlockManager& manager, const Tokens& tokens) {
  std::vector<BlockHash> hashes(tokens.size() / kPageSize);
  REQUIRE_OK(manager.HashPrompt(tokens, {}, absl::MakeSpan(hashes)));
  REQUIRE(!hashes.empty());
  return manager.pool().Lookup(hashes.back());
}

AppendResult PromptOk(BlockManager& manager, SequenceId id,
                      const Tokens& chunk) {
  auto result = manager.AppendPrompt(id, chunk);
  REQUIRE_OK(result);
  REQUIRE_OK(manager.CheckInvariants());
  return *result;
}

AppendResult DraftsOk(BlockManager& manager, SequenceId id, int32_t count) {
  auto result = manager.SetDrafts(id, count);
  REQUIRE_OK(result);
  REQUIRE_OK(manager.CheckInvariants());
  return *result;
}

TEST_CASE("a prompt in chunks takes pages as they come, cached as they fill") {
  auto manager = MakeManager(16);
  const Tokens prompt = TokenRange(100, 10);  // pages [0, 4), [4, 8), [8, 10).

  // The first chunk ends inside page 0: one page now, two reserved.
  auto plan = manager->Admit(1, prompt, {}, {}, {.prefill_tokens = 3});
  REQUIRE_OK(plan);
  REQUIRE(plan->computed_tokens == 3);
  REQUIRE(plan->new_pages == 1);
  REQUIRE(plan->reserved_pages == 2);
  REQUIRE(PagesOf(*manager, 1) == Pages{0});
  REQUIRE(*manager->NumTokens(1) == 3);
  REQUIRE(*manager->PromptTokensLeft(1) == 7);
  REQUIRE(manager->reserved_pages() == 2);
  REQUIRE(manager->NumAllocatable() == 16 - 1 - 2);
  REQUIRE(manager->pool().NumCached() == 0);
  REQUIRE(manager->stats().prompt_tokens == 10);

  // A chunk that fills page 0 and starts page 1: page 0 is cached now.
  AppendResult chunk = PromptOk(*manager, 1, Slice(prompt, 3, 5));
  REQUIRE(chunk.new_pages == 1);
  REQUIRE(PagesOf(*manager, 1) == Pages{0, 1});
  REQUIRE(CachedPage(*manager, Slice(prompt, 0, 4)) == 0);
  REQUIRE(manager->pool().NumCached() == 1);
  REQUIRE(manager->reserved_pages() == 1);

  // The last chunk ends the prompt past page 1's edge.
  chunk = PromptOk(*manager, 1, Slice(prompt, 5, 10));
  REQUIRE(chunk.new_pages == 1);
  REQUIRE(PagesOf(*manager, 1) == Pages{0, 1, 2});
  REQUIRE(CachedPage(*manager, Slice(prompt, 0, 8)) == 1);
  REQUIRE(*manager->PromptTokensLeft(1) == 0);
  REQUIRE(manager->reserved_pages() == 0);
  REQUIRE(manager->stats().prompt_chunks == 2);
  REQUIRE(manager->stats().appended_tokens == 0);

  // Decoding follows.
  REQUIRE_OK(manager->Append(1, {7}));
  REQUIRE(manager->stats().appended_tokens == 1);
}

TEST_CASE("a first chunk at a page's edge caches that page at admission") {
  auto manager = MakeManager(16);
  const Tokens prompt = TokenRange(100, 10);
  REQUIRE_OK(manager->Admit(1, prompt, {}, {}, {.prefill_tokens = 4}));
  REQUIRE(PagesOf(*manager, 1) == Pages{0});
  REQUIRE(CachedPage(*manager, Slice(prompt, 0, 4)) == 0);
  // A chunk ending at the next edge: a new page, cached as it fills.
  REQUIRE(PromptOk(*manager, 1, Slice(prompt, 4, 8)).new_pages == 1);
  REQUIRE(PagesOf(*manager, 1) == Pages{0, 1});
  REQUIRE(CachedPage(*manager, Slice(prompt, 0, 8)) == 1);
  // Its prompt hashes, computed once, file the pages the chunks fill.
  std::vector<BlockHash> hashes(10 / kPageSize);
  REQUIRE_OK(manager->HashPrompt(prompt, {}, absl::MakeSpan(hashes)));
  REQUIRE_OK(manager->AppendPrompt(1, Slice(prompt, 8, 10), hashes));
  REQUIRE(PagesOf(*manager, 1) == Pages{0, 1, 2});
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("a preempted half-prefilled prompt keeps its cached pages") {
  auto manager = MakeManager(16);
  const Tokens prompt = TokenRange(100, 14);
  REQUIRE_OK(manager->Admit(1, prompt, {}, {}, {.prefill_tokens = 8}));
  REQUIRE(manager->reserved_pages() == 2);
  REQUIRE_OK(manager->Preempt(1));
  REQUIRE(manager->reserved_pages() == 0);
  REQUIRE(manager->NumAllocatable() == 16);
  // Recomputed: the two pages it cached are hits (revived from the LRU).
  auto plan = manager->Admit(1, prompt);
  REQUIRE_OK(plan);
  REQUIRE(plan->hit_pages == 2);
  REQUIRE(plan->revived_pages == 2);
  REQUIRE(PagesOf(*manager, 1) == Pages{0, 1, 2, 3});
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("a reserve keeps the rest of a prompt's pages from others") {
  // 6 pages; a 20-token prompt needs 5: 1 now and 4 reserved.
  auto manager = MakeManager(6);
  const Tokens prompt = TokenRange(100, 20);
  REQUIRE_OK(manager->Admit(1, prompt, {}, {}, {.prefill_tokens = 4}));
  REQUIRE(manager->NumAllocatable() == 1);
  const BlockManagerSnapshot before = manager->Snapshot();
  auto refused = manager->Admit(2, TokenRange(500, 8));
  REQUIRE_STATUS_IS(refused, kResourceExhausted);
  REQUIRE(refused.status().message().find("1 are allocatable") !=
          std::string::npos);
  REQUIRE(manager->Snapshot() == before);
  REQUIRE_OK(manager->Admit(2, TokenRange(500, 4)));
  REQUIRE(manager->NumAllocatable() == 0);
  // Sequence 2's next page would come out of the reserve: refused.
  auto append = manager->Append(2, {1});
  REQUIRE_STATUS_IS(append, kResourceExhausted);
  // The chunks still get their pages.
  PromptOk(*manager, 1, Slice(prompt, 4, 20));
  REQUIRE(PagesOf(*manager, 1) == Pages{0, 2, 3, 4, 5});
  REQUIRE(manager->reserved_pages() == 0);
}

TEST_CASE("without a reserve the first chunk alone is admitted") {
  auto manager = MakeManager(6, {.reserve_prompt_pages = false});
  const Tokens prompt = TokenRange(100, 20);
  auto plan = manager->Admit(1, prompt, {}, {}, {.prefill_tokens = 4});
  REQUIRE_OK(plan);
  REQUIRE(plan->reserved_pages == 0);
  REQUIRE_OK(manager->Admit(2, TokenRange(500, 8)));
  REQUIRE(manager->NumAllocatable() == 3);
  // The rest of the prompt no longer fits.
  const BlockManagerSnapshot before = manager->Snapshot();
  REQUIRE_STATUS_IS(manager->AppendPrompt(1, Slice(prompt, 4, 20)),
                    kResourceExhausted);
  REQUIRE(manager->Snapshot() == before);
}

TEST_CASE("a prompt that does not read the cache still fills it") {
  auto manager = MakeManager(16);
  const Tokens prompt = TokenRange(100, 9);
  REQUIRE_OK(manager->Admit(1, prompt, {}, {}, {.read_prefix_cache = false}));
  auto again = manager->Admit(2, prompt, {}, {}, {.read_prefix_cache = false});
  REQUIRE_OK(again);
  REQUIRE(again->hit_pages == 0);
  REQUIRE(PagesOf(*manager, 2) == Pages{3, 4, 5});
  // A reader hits the pages the first one registered.
  auto reader = manager->Admit(3, prompt);
  REQUIRE_OK(reader);
  REQUIRE(reader->hit_pages == 2);
  REQUIRE(PagesOf(*manager, 3) == Pages{0, 1, 6});
}

TEST_CASE("drafts across a page, all accepted") {
  auto manager = MakeManager(16);
  REQUIRE_OK(
      manager->Admit(1, TokenRange(100, 6)));       // pages 0, 1; 2 in page 1.
  AppendResult drafted = DraftsOk(*manager, 1, 5);  // tokens 6..10.
  REQUIRE(drafted.new_pages == 1);
  REQUIRE(PagesOf(*manager, 1) == Pages{0, 1, 2});
  REQUIRE(*manager->NumDrafts(1) == 5);
  REQUIRE(manager->pool().NumCached() == 1);  // page 0 only: no draft.

  // The next step accepts all five and adds its own token: they land in the
  // draft slots' pages, which are cached as verified tokens fill them.
  const Tokens accepted = TokenRange(200, 6);
  auto appended = manager->Append(1, accepted);
  REQUIRE_OK(appended);
  REQUIRE(appended->new_pages == 0);
  REQUIRE(*manager->NumDrafts(1) == 0);
  REQUIRE(PagesOf(*manager, 1) == Pages{0, 1, 2});
  const Tokens verified = Concat(TokenRange(100, 6), accepted);
  REQUIRE(CachedPage(*manager, Slice(verified, 0, 8)) == 1);
  REQUIRE(CachedPage(*manager, Slice(verified, 0, 12)) == 2);
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("drafts across a page, all rejected, then new drafts") {
  auto manager = MakeManager(16);
  REQUIRE_OK(manager->Admit(1, TokenRange(100, 6)));
  DraftsOk(*manager, 1, 5);
  REQUIRE(PagesOf(*manager, 1) == Pages{0, 1, 2});
  const SequenceHandle handle = *Impl(*manager).HandleOf(1);

  // Every draft rejected: one token (the target model's) and no new drafts.
  // Page 2 held only draft slots: released, never cached.
  internal::AppendManyResult result;
  const std::vector<int32_t> counts = {1};
  const std::vector<int32_t> no_drafts = {0};
  const std::vector<int32_t> tokens = {300};
  REQUIRE_OK(Impl(*manager).AppendMany({&handle, 1}, counts, tokens, result,
                                       no_drafts));
  REQUIRE(PagesOf(*manager, 1) == Pages{0, 1});
  REQUIRE(result.changed == std::vector<int32_t>{0});
  REQUIRE(result.first_changed_page == std::vector<int32_t>{2});
  REQUIRE(result.new_pages == 0);
  REQUIRE(*manager->NumDrafts(1) == 0);
  REQUIRE(manager->pool().NumCached() == 1);
  REQUIRE(manager->pool().NumFree() == 14);
  // The released page went back to the free stack: the next one taken.
  REQUIRE(DraftsOk(*manager, 1, 2).new_pages == 1);
  REQUIRE(PagesOf(*manager, 1) == Pages{0, 1, 2});
}

TEST_CASE("a speculative step past a page edge fills, adds and rolls back") {
  auto manager = MakeManager(16);
  REQUIRE_OK(
      manager->Admit(1, TokenRange(100, 6)));  // pages 0, 1; 2 in page 1.
  DraftsOk(*manager, 1, 1);                    // page 1's third slot.
  const SequenceHandle handle = *Impl(*manager).HandleOf(1);
  const BlockManagerSnapshot before = manager->Snapshot();

  // The draft accepted, and two more tokens: page 1 fills (cached) and
  // token 9 starts page 2; three new drafts end in page 2, just added.
  const std::vector<int32_t> counts = {3};
  const std::vector<int32_t> drafts = {3};
  const Tokens tokens = TokenRange(200, 3);
  REQUIRE_OK(Impl(*manager).BeginStep());
  internal::AppendManyResult result;
  REQUIRE_OK(
      Impl(*manager).AppendMany({&handle, 1}, counts, tokens, result, drafts));
  REQUIRE(PagesOf(*manager, 1) == Pages{0, 1, 2});
  REQUIRE(result.changed == std::vector<int32_t>{0});
  REQUIRE(result.first_changed_page == std::vector<int32_t>{2});
  REQUIRE(result.new_pages == 1);
  REQUIRE(*manager->NumTokens(1) == 9);
  REQUIRE(*manager->NumDrafts(1) == 3);
  const Tokens verified = Concat(TokenRange(100, 6), tokens);
  REQUIRE(CachedPage(*manager, Slice(verified, 0, 8)) == 1);
  REQUIRE_OK(manager->CheckInvariants());

  // Undone: page 2 back, page 1 uncached, the partial tokens and drafts
  // as they were.
  REQUIRE_OK(Impl(*manager).RollbackStep());
  REQUIRE(manager->Snapshot() == before);
  REQUIRE(manager->pool().NumCached() == 1);
  REQUIRE_OK(manager->CheckInvariants());

  // Again, committed; then three tokens end on page 2's edge (cached) and
  // two drafts need page 3.
  REQUIRE_OK(
      Impl(*manager).AppendMany({&handle, 1}, counts, tokens, result, drafts));
  const std::vector<int32_t> three = {3};
  const std::vector<int32_t> two_drafts = {2};
  REQUIRE_OK(Impl(*manager).AppendMany({&handle, 1}, three, TokenRange(300, 3),
                                       result, two_drafts));
  REQUIRE(PagesOf(*manager, 1) == Pages{0, 1, 2, 3});
  REQUIRE(result.first_changed_page == std::vector<int32_t>{3});
  REQUIRE(*manager->NumTokens(1) == 12);
  REQUIRE(CachedPage(*manager, Concat(verified, TokenRange(300, 3))) == 2);
  REQUIRE_OK(manager->CheckInvariants());
}

TEST_CASE("drafts over a shared partial page copy it first") {
  auto manager = MakeManager(16);
  REQUIRE_OK(manager->Admit(1, TokenRange(100, 6)));  // pages 0, 1.
  REQUIRE_OK(manager->Fork(1, 2));
  AppendResult drafted = DraftsOk(*manager, 1, 2);
  REQUIRE(drafted.copy == PageCopy{1, 2});
  REQUIRE(drafted.new_pages == 0);
  REQUIRE(PagesOf(*manager, 1) == Pages{0, 2});
  REQUIRE(PagesOf(*manager, 2) == Pages{0, 1});
  // A sequence holding drafts is not forked.
  const BlockManagerSnapshot before = manager->Snapshot();
  absl::Status fork = manager->Fork(1, 3);
  REQUIRE_STATUS_IS(fork, kFailedPrecondition);
  REQUIRE(fork.message().find("2 draft slots") != std::string::npos);
  REQUIRE(manager->Snapshot() == before);
}

TEST_CASE("chunk and draft errors name the value and change nothing") {
  auto manager = MakeManager(16);
  const Tokens prompt = TokenRange(100, 10);
  REQUIRE_OK(manager->Admit(1, prompt, {}, {}, {.prefill_tokens = 3}));
  REQUIRE_OK(manager->Admit(2, TokenRange(500, 5)));
  const BlockManagerSnapshot before = manager->Snapshot();
  const auto unchanged = [&] { REQUIRE(manager->Snapshot() == before); };

  auto zero = manager->Admit(3, prompt, {}, {}, {.prefill_tokens = 0});
  REQUIRE_STATUS_IS(zero, kInvalidArgument);
  REQUIRE(zero.status().message().find("prefill_tokens 0") !=
          std::string::npos);
  unchanged();
  auto too_long = manager->AppendPrompt(1, TokenRange(0, 8));
  REQUIRE_STATUS_IS(too_long, kInvalidArgument);
  REQUIRE(too_long.status().message().find("8 tokens for sequence 1, which "
                                           "has 7 prompt tokens left") !=
          std::string::npos);
  unchanged();
  REQUIRE_STATUS_IS(manager->AppendPrompt(2, {1}), kInvalidArgument);
  REQUIRE_STATUS_IS(manager->AppendPrompt(9, {1}), kNotFound);
  unchanged();
  std::vector<BlockHash> other(2);
  REQUIRE_OK(
      manager->HashPrompt(TokenRange(900, 10), {}, absl::MakeSpan(other)));
  auto wrong = manager->AppendPrompt(1, Slice(prompt, 3, 10), other);
  REQUIRE_STATUS_IS(wrong, kInvalidArgument);
  REQUIRE(wrong.status().message().find("do not start from its prompt") !=
          std::string::npos);
  unchanged();
  auto early = manager->Append(1, {1});
  REQUIRE_STATUS_IS(early, kFailedPrecondition);
  REQUIRE(early.status().message().find("7 prompt tokens left") !=
          std::string::npos);
  unchanged();
  REQUIRE_STATUS_IS(manager->Fork(1, 4), kFailedPrecondition);
  unchanged();
  auto prefilling = manager->SetDrafts(1, 2);
  REQUIRE_STATUS_IS(prefilling, kFailedPrecondition);
  REQUIRE(prefilling.status().message().find("7 prompt tokens left") !=
          std::string::npos);
  unchanged();
  auto negative = manager->SetDrafts(2, -1);
  REQUIRE_STATUS_IS(negative, kInvalidArgument);
  REQUIRE(negative.status().message().find("-1 drafts") != std::string::npos);
  unchanged();
  auto past = manager->SetDrafts(2, 30);
  REQUIRE_STATUS_IS(past, kOutOfRange);
  REQUIRE(past.status().message().find("30 drafts in 9 pages") !=
          std::string::npos);
  unchanged();
  REQUIRE_STATUS_IS(manager->SetDrafts(9, 1), kNotFound);
  unchanged();
}

TEST_CASE("a rolled-back step restores drafts, chunks and reserves") {
  auto manager = MakeManager(16);
  const Tokens prompt = TokenRange(100, 10);
  REQUIRE_OK(manager->Admit(1, prompt, {}, {}, {.prefill_tokens = 3}));
  REQUIRE_OK(manager->Admit(2, TokenRange(500, 6)));
  DraftsOk(*manager, 2, 3);
  const BlockManagerSnapshot before = manager->Snapshot();
  const int32_t reserved = manager->reserved_pages();
  REQUIRE_OK(Impl(*manager).BeginStep());
  PromptOk(*manager, 1, Slice(prompt, 3, 9));
  REQUIRE_OK(manager->Append(2, TokenRange(600, 2)));
  DraftsOk(*manager, 2, 0);
  DraftsOk(*manager, 2, 7);
  REQUIRE_OK(manager->Preempt(1));
  REQUIRE_OK(Impl(*manager).RollbackStep());
  REQUIRE(manager->Snapshot() == before);
  REQUIRE(manager->reserved_pages() == reserved);
  REQUIRE_OK(manager->CheckInvariants());
}

}  // namespace
}  // namespace kvblock
