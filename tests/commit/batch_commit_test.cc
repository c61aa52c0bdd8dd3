// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "kvblock/batch_commit.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "base/fault_injection.h"
#include "commit/batch_commit_test_util.h"
#include "manager/block_manager_test_util.h"
#include "test_util.h"

namespace kvblock {
namespace {

using Pages = std::vector<PageId>;
using testing::CommitFixture;
using testing::CommitState;

PagedKvConfig SmallConfig() {
  PagedKvConfig config;
  config.num_pages = 16;
  config.page_size = 4;
  config.max_pages_per_seq = 4;
  config.max_batch = 4;
  return config;
}

// `count` tokens first, first + 1, ....
std::vector<TokenId> TokenRangeOf(TokenId first, int32_t count) {
  std::vector<TokenId> tokens(count);
  for (int32_t i = 0; i < count; ++i) tokens[i] = first + i;
  return tokens;
}

std::vector<SlotId> OldToNew(const StepResult& result, int32_t old_batch) {
  return {result.old_to_new.begin(), result.old_to_new.begin() + old_batch};
}

TEST_CASE("scripted steps: joins, fork, copy-on-write, finish and compaction") {
  CommitFixture f(SmallConfig());
  const std::vector<TokenId> prompt_a = {1, 2, 3, 4, 5, 6};
  const std::vector<TokenId> prompt_b = {100, 101, 102, 103, 104};

  // Step 1: two prompts join an empty batch.
  const JoinRequest joins1[] = {{.id = 10, .tokens = prompt_a},
                                {.id = 11, .tokens = prompt_b}};
  auto step1 = f.commit->Commit({.joins = joins1});
  REQUIRE_OK(step1);
  REQUIRE(step1->batch == 2);
  REQUIRE(OldToNew(*step1, 0).empty());
  REQUIRE(Pages(step1->changed_slots.begin(), step1->changed_slots.end()) ==
          Pages{0, 1});
  REQUIRE(step1->copies.empty());
  REQUIRE(step1->new_pages == 4);
  REQUIRE(f.Row(0) == Pages{0, 1});
  REQUIRE(f.Row(1) == Pages{2, 3});
  REQUIRE_OK(f.commit->CheckInvariants());

  // Step 2: a beam forks from 10 (before 10 appends); everyone writes a token.
  const std::vector<TokenId> fork_tokens = {50};
  const JoinRequest joins2[] = {
      {.id = 12, .fork_of = 10, .tokens = fork_tokens}};
  const int32_t counts2[] = {1, 1};
  const TokenId tokens2[] = {7, 105};
  auto step2 = f.commit->Commit(
      {.joins = joins2, .append_counts = counts2, .append_tokens = tokens2});
  REQUIRE_OK(step2);
  REQUIRE(step2->batch == 3);
  REQUIRE(OldToNew(*step2, 2) == std::vector<SlotId>{0, 1});
  REQUIRE(Pages(step2->changed_slots.begin(), step2->changed_slots.end()) ==
          Pages{0, 2});
  REQUIRE(std::vector<PageCopy>(step2->copies.begin(), step2->copies.end()) ==
          std::vector<PageCopy>{{1, 4}});
  REQUIRE(f.Row(0) == Pages{0, 4});
  REQUIRE(f.Row(1) == Pages{2, 3});
  REQUIRE(f.Row(2) == Pages{0, 1});
  REQUIRE(f.commit->slots()[2] == 12);
  // Page 4, the copy-on-write destination, is not a new page of the step.
  REQUIRE(step2->new_pages == 0);
  REQUIRE_OK(f.commit->CheckInvariants());

  // Step 3: 10 finishes and the last row (12) fills its slot; 11 stays
  // and crosses into a new page (10's freed page 4).
  const SequenceId finished3[] = {10};
  const int32_t counts3[] = {0, 3, 1};
  const TokenId tokens3[] = {106, 107, 108, 51};
  auto step3 = f.commit->Commit({.finished = finished3,
                                 .append_counts = counts3,
                                 .append_tokens = tokens3});
  REQUIRE_OK(step3);
  REQUIRE(step3->batch == 2);
  REQUIRE(OldToNew(*step3, 3) == std::vector<SlotId>{kNoSlot, 1, 0});
  REQUIRE(step3->moves.size() == 1);
  REQUIRE(step3->moves[0].from == 2);
  REQUIRE(step3->moves[0].to == 0);
  REQUIRE(Pages(step3->changed_slots.begin(), step3->changed_slots.end()) ==
          Pages{1});
  REQUIRE(step3->copies.empty());
  REQUIRE(f.Row(0) == Pages{0, 1});
  REQUIRE(f.Row(1) == Pages{2, 3, 4});
  REQUIRE(f.Row(2).empty());
  REQUIRE(*f.commit->SlotOf(12) == 0);
  REQUIRE(*f.commit->SlotOf(11) == 1);
  REQUIRE_STATUS_IS(f.commit->SlotOf(10), kNotFound);
  REQUIRE_OK(f.commit->CheckInvariants());

  // The uploaded device view matches the host rows.
  REQUIRE_OK(f.UploadAndCheck());
}

// A batch of `n` one-page prompts 100, 101, ... in slots 0..n-1.
void FillBatch(CommitFixture& f, int32_t n) {
  std::vector<std::vector<TokenId>> prompts;
  std::vector<JoinRequest> joins;
  for (int32_t i = 0; i < n; ++i) prompts.push_back({i + 1});
  for (int32_t i = 0; i < n; ++i) {
    joins.push_back({.id = 100 + i, .tokens = prompts[i]});
  }
  REQUIRE_OK(f.commit->Commit({.joins = joins}));
}

TEST_CASE("a leaving slot is filled by the last surviving row") {
  PagedKvConfig config = SmallConfig();
  config.max_batch = 8;
  config.num_pages = 32;
  CommitFixture f(config);
  FillBatch(f, 6);
  const std::vector<TokenId> prompt = {9};
  using Slots = std::vector<SequenceId>;
  SECTION("one hole below the survivors, one leaving slot above them") {
    // Slots 1 and 4 leave: survivors 4; hole 1 takes row 5, slot 4 was past
    // the survivors. Two joins take slots 4 and 5.
    const SequenceId finished[] = {101, 104};
    const JoinRequest joins[] = {{.id = 7, .tokens = prompt},
                                 {.id = 8, .tokens = prompt}};
    auto step = f.commit->Commit({.finished = finished, .joins = joins});
    REQUIRE_OK(step);
    REQUIRE(OldToNew(*step, 6) ==
            std::vector<SlotId>{0, kNoSlot, 2, 3, kNoSlot, 1});
    REQUIRE(step->moves.size() == 1);
    REQUIRE(step->moves[0].from == 5);
    REQUIRE(step->moves[0].to == 1);
    REQUIRE(Slots(f.commit->slots().begin(), f.commit->slots().end()) ==
            Slots{100, 105, 102, 103, 7, 8});
    REQUIRE(Pages(step->changed_slots.begin(), step->changed_slots.end()) ==
            Pages{4, 5});
  }
  SECTION("holes take the last rows in order, the highest first") {
    const SequenceId finished[] = {100, 101};
    auto step = f.commit->Commit({.finished = finished});
    REQUIRE_OK(step);
    REQUIRE(OldToNew(*step, 6) ==
            std::vector<SlotId>{kNoSlot, kNoSlot, 2, 3, 1, 0});
    REQUIRE(Slots(f.commit->slots().begin(), f.commit->slots().end()) ==
            Slots{105, 104, 102, 103});
    REQUIRE(step->changed_slots.empty());
  }
  SECTION("a hole's filler skips rows that leave too") {
    const SequenceId finished[] = {102, 105};
    const SequenceId preempted[] = {104};
    auto step =
        f.commit->Commit({.finished = finished, .preempted = preempted});
    REQUIRE_OK(step);
    REQUIRE(OldToNew(*step, 6) ==
            std::vector<SlotId>{0, 1, kNoSlot, 2, kNoSlot, kNoSlot});
    REQUIRE(Slots(f.commit->slots().begin(), f.commit->slots().end()) ==
            Slots{100, 101, 103});
  }
  SECTION("the last rows leaving moves nothing") {
    const SequenceId finished[] = {104, 105};
    auto step = f.commit->Commit({.finished = finished});
    REQUIRE_OK(step);
    REQUIRE(step->moves.empty());
    REQUIRE(OldToNew(*step, 6) ==
            std::vector<SlotId>{0, 1, 2, 3, kNoSlot, kNoSlot});
  }
  SECTION("the moved row's appends land in its new slot") {
    // Slot 0 leaves; row 5 moves to slot 0 and gets its own token, 15.
    const SequenceId finished[] = {100};
    const int32_t counts[] = {0, 1, 1, 1, 1, 1};
    const TokenId tokens[] = {11, 12, 13, 14, 15};
    const absl::Span<const PageId> before = *f.manager->Pages(105);
    const PageId first_page = before[0];
    auto step = f.commit->Commit({.finished = finished,
                                  .append_counts = counts,
                                  .append_tokens = tokens});
    REQUIRE_OK(step);
    REQUIRE(f.commit->slots()[0] == 105);
    REQUIRE(*f.manager->NumTokens(105) == 2);
    REQUIRE(f.Row(0) == Pages(f.manager->Pages(105)->begin(),
                              f.manager->Pages(105)->end()));
    REQUIRE(f.Row(0)[0] == first_page);
  }
  // Every row is its sequence's pages, rows past the batch are empty, and
  // the device view follows.
  REQUIRE_OK(f.commit->CheckInvariants());
  REQUIRE_OK(f.UploadAndCheck());
}

TEST_CASE("n samples fork from a prompt that joins in the same step") {
  CommitFixture f(SmallConfig());
  const std::vector<TokenId> prompt = {1, 2, 3, 4, 5};
  const JoinRequest joins[] = {{.id = 1, .tokens = prompt},
                               {.id = 2, .fork_of = 1},
                               {.id = 3, .fork_of = 1}};
  auto step = f.commit->Commit({.joins = joins});
  REQUIRE_OK(step);
  REQUIRE(step->batch == 3);
  for (SlotId slot = 0; slot < 3; ++slot) REQUIRE(f.Row(slot) == Pages{0, 1});
  REQUIRE(f.manager->pool().RefCount(1) == 3);
  // Each sample's first token copies the shared partial page but the last.
  const int32_t counts[] = {1, 1, 1};
  const TokenId tokens[] = {7, 8, 9};
  auto next =
      f.commit->Commit({.append_counts = counts, .append_tokens = tokens});
  REQUIRE_OK(next);
  REQUIRE(std::vector<PageCopy>(next->copies.begin(), next->copies.end()) ==
          std::vector<PageCopy>{{1, 2}, {1, 3}});
  REQUIRE(f.Row(0) == Pages{0, 2});
  REQUIRE(f.Row(1) == Pages{0, 3});
  REQUIRE(f.Row(2) == Pages{0, 1});
  REQUIRE_OK(f.commit->CheckInvariants());
}

TEST_CASE("append pages are what the step's appends then allocate") {
  CommitFixture f(SmallConfig());  // 4 tokens a page.
  const std::vector<TokenId> prompt = {1, 2, 3, 4, 5, 6};
  const JoinRequest joins[] = {{.id = 1, .tokens = prompt},
                               {.id = 2, .fork_of = 1}};
  REQUIRE_OK(f.commit->Commit({.joins = joins}));
  // Both share the partial page: 1 copies it, 2 then holds it alone; 1's
  // three tokens also start a page.
  const int32_t counts[] = {3, 1};
  const TokenId tokens[] = {7, 8, 9, 10};
  const absl::StatusOr<int64_t> pages = f.commit->AppendPages(counts);
  REQUIRE_OK(pages);
  REQUIRE(*pages == 3);
  auto step =
      f.commit->Commit({.append_counts = counts, .append_tokens = tokens});
  REQUIRE_OK(step);
  REQUIRE(step->new_pages + static_cast<int64_t>(step->copies.size()) == 2);
  // 2's one token: the page it held with 1 is its own now.
  REQUIRE(*f.commit->AppendPages(std::vector<int32_t>{0, 1}) == 0);
  const int32_t wrong_length[] = {1};
  REQUIRE_STATUS_IS(f.commit->AppendPages(wrong_length), kInvalidArgument);
  const int32_t negative[] = {1, -1};
  const absl::StatusOr<int64_t> refused = f.commit->AppendPages(negative);
  REQUIRE_STATUS_IS(refused, kInvalidArgument);
  // Named by slot, as Commit names counts.
  REQUIRE(
      absl::StrContains(refused.status().message(), "append_counts[1] = -1"));
}

TEST_CASE("a fork of a same-step fork shares what that fork joined with") {
  CommitFixture f(SmallConfig());
  const std::vector<TokenId> prompt = {1, 2, 3, 4, 5, 6};
  const JoinRequest first[] = {{.id = 1, .tokens = prompt}};
  REQUIRE_OK(f.commit->Commit({.joins = first}));
  // 2 forks 1 and appends 7; 3 forks 2 in the same step: forks are made
  // before any append, so 3 holds 1's six tokens, not 2's seventh.
  const std::vector<TokenId> seven = {7};
  const JoinRequest joins[] = {{.id = 2, .fork_of = 1, .tokens = seven},
                               {.id = 3, .fork_of = 2}};
  auto step = f.commit->Commit({.joins = joins});
  REQUIRE_OK(step);
  REQUIRE(*f.manager->NumTokens(2) == 7);
  REQUIRE(*f.manager->NumTokens(3) == 6);
  REQUIRE(*f.manager->Pages(3) == *f.manager->Pages(1));
  // 2 wrote into the partial page the three shared: it got its own copy.
  REQUIRE(step->copies.size() == 1);
  REQUIRE((*f.manager->Pages(2))[1] == step->copies[0].destination);
  REQUIRE_OK(f.commit->CheckInvariants());
  // A fork of a same-step join may not append in that step.
  const JoinRequest appending[] = {{.id = 4, .fork_of = 1},
                                   {.id = 5, .fork_of = 4, .tokens = seven}};
  const CommitState before = f.Capture();
  const absl::StatusOr<StepResult> refused =
      f.commit->Commit({.joins = appending});
  REQUIRE_STATUS_IS(refused, kInvalidArgument);
  REQUIRE(refused.status().message().find("append them in the next step") !=
          absl::string_view::npos);
  REQUIRE(f.Capture() == before);
}

TEST_CASE("a join with precomputed prompt hashes hashes nothing more") {
  CommitFixture with_hashes(SmallConfig());
  CommitFixture without(SmallConfig());
  const std::vector<TokenId> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  std::vector<BlockHash> hashes(2);
  REQUIRE_OK(
      with_hashes.manager->HashPrompt(prompt, {}, absl::MakeSpan(hashes)));
  const JoinRequest hashed[] = {
      {.id = 1, .tokens = prompt, .prompt_hashes = hashes}};
  const JoinRequest plain[] = {{.id = 1, .tokens = prompt}};
  REQUIRE_OK(with_hashes.commit->Commit({.joins = hashed}));
  REQUIRE_OK(without.commit->Commit({.joins = plain}));
  REQUIRE(with_hashes.Capture() == without.Capture());

  // A chain of the wrong length is refused like any bad join.
  const CommitState before = with_hashes.Capture();
  const JoinRequest wrong[] = {
      {.id = 2,
       .tokens = prompt,
       .prompt_hashes = absl::MakeConstSpan(hashes).first(1)}};
  REQUIRE_STATUS_IS(with_hashes.commit->Commit({.joins = wrong}),
                    kInvalidArgument);
  REQUIRE(with_hashes.Capture() == before);
}

TEST_CASE("a sequence the commit runs changes only through the commit") {
  CommitFixture f(SmallConfig());
  const std::vector<TokenId> p = {1, 2};
  const std::vector<TokenId> q = {50, 51};
  const JoinRequest joins[] = {{.id = 1, .tokens = p}, {.id = 2, .tokens = q}};
  REQUIRE_OK(f.commit->Commit({.joins = joins}));
  const SequenceHandle one = *Impl(*f.manager).HandleOf(1);
  const CommitState before = f.Capture();
  const auto refused = [&](const absl::Status& status) {
    REQUIRE_STATUS_IS(status, kFailedPrecondition);
    REQUIRE(status.message().find(
                "sequence 1 runs in a BatchCommit; it changes only through") !=
            std::string::npos);
    REQUIRE(f.Capture() == before);
  };
  const TokenId token = 6;
  refused(f.manager->Append(1, {token}).status());
  refused(f.manager->AppendPrompt(1, {token}).status());
  refused(f.manager->SetDrafts(1, 2).status());
  refused(f.manager->Free(1));
  refused(f.manager->Preempt(1));
  internal::AppendManyResult many;
  refused(Impl(*f.manager).AppendMany({one}, {1}, {token}, many));

  // Reading and forking stay open; the child is the caller's.
  REQUIRE_OK(f.manager->Fork(1, 7));
  REQUIRE_OK(f.manager->Append(7, {token}).status());
  const int32_t counts[] = {3, 1};
  const TokenId tokens[] = {3, 4, 5, 52};
  REQUIRE_OK(
      f.commit->Commit({.append_counts = counts, .append_tokens = tokens}));
  REQUIRE(f.Row(0) == *f.manager->Pages(1));
  REQUIRE_OK(f.UploadAndCheck());
  REQUIRE_OK(f.commit->CheckInvariants());

  // A sequence that left is the caller's again, as are all of them once the
  // commit is gone.
  const SequenceId finished[] = {1};
  REQUIRE_OK(f.commit->Commit({.finished = finished}));
  REQUIRE_OK(f.manager->Admit(1, p).status());
  REQUIRE_OK(f.manager->Free(1));
  REQUIRE_STATUS_IS(f.manager->Free(2), kFailedPrecondition);
  f.commit.reset();
  REQUIRE_OK(f.manager->Append(2, {token}).status());
  REQUIRE_OK(f.manager->Free(2));
  REQUIRE_OK(f.manager->Free(7));
  REQUIRE_OK(f.manager->CheckInvariants());
}

TEST_CASE("invalid steps are refused and change nothing") {
  PagedKvConfig config = SmallConfig();
  config.num_pages = 8;
  CommitFixture f(config);
  const std::vector<TokenId> prompt = {1, 2, 3, 4, 5};
  const JoinRequest joins[] = {{.id = 1, .tokens = prompt},
                               {.id = 2, .tokens = prompt}};
  REQUIRE_OK(f.commit->Commit({.joins = joins}));
  const CommitState before = f.Capture();

  const int32_t one_count[] = {1};
  const int32_t counts[] = {1, 1};
  const int32_t negative[] = {-1, 1};
  const TokenId tokens[] = {7, 8};
  const SequenceId unknown[] = {9};
  const SequenceId twice[] = {1, 1};
  const SequenceId first[] = {1};
  const JoinRequest live[] = {{.id = 2, .tokens = prompt}};
  const JoinRequest duplicate[] = {{.id = 5, .tokens = prompt},
                                   {.id = 5, .tokens = prompt}};
  const JoinRequest orphan[] = {{.id = 5, .fork_of = 9}};
  const JoinRequest fork_of_leaving[] = {{.id = 5, .fork_of = 1}};
  const JoinRequest negative_id[] = {{.id = -3, .tokens = prompt}};
  const std::vector<TokenId> sample_token = {9};
  const JoinRequest fork_appends_in_prefill[] = {
      {.id = 5, .tokens = prompt},
      {.id = 6, .fork_of = 5, .tokens = sample_token}};
  const JoinRequest too_many[] = {{.id = 5, .tokens = prompt},
                                  {.id = 6, .tokens = prompt},
                                  {.id = 7, .tokens = prompt}};
  const std::vector<TokenId> huge(17, 1);
  const JoinRequest too_long[] = {{.id = 5, .tokens = huge}};
  const std::vector<TokenId> big1(16, 3);
  const std::vector<TokenId> big2(16, 4);
  const JoinRequest exhausting[] = {{.id = 5, .tokens = big1},
                                    {.id = 6, .tokens = big2}};

  REQUIRE_STATUS_IS(
      f.commit->Commit({.append_counts = one_count,
                        .append_tokens = absl::MakeSpan(tokens, 1)}),
      kInvalidArgument);
  REQUIRE_STATUS_IS(
      f.commit->Commit({.append_counts = counts,
                        .append_tokens = absl::MakeSpan(tokens, 1)}),
      kInvalidArgument);
  REQUIRE_STATUS_IS(
      f.commit->Commit({.append_counts = negative, .append_tokens = tokens}),
      kInvalidArgument);
  REQUIRE_STATUS_IS(f.commit->Commit({.finished = unknown}), kNotFound);
  REQUIRE_STATUS_IS(f.commit->Commit({.finished = twice}), kInvalidArgument);
  REQUIRE_STATUS_IS(f.commit->Commit({.finished = first, .preempted = first}),
                    kInvalidArgument);
  REQUIRE_STATUS_IS(f.commit->Commit({.finished = first,
                                      .append_counts = counts,
                                      .append_tokens = tokens}),
                    kInvalidArgument);
  REQUIRE_STATUS_IS(f.commit->Commit({.joins = live}), kAlreadyExists);
  REQUIRE_STATUS_IS(f.commit->Commit({.joins = duplicate}), kInvalidArgument);
  REQUIRE_STATUS_IS(f.commit->Commit({.joins = orphan}), kInvalidArgument);
  REQUIRE_STATUS_IS(
      f.commit->Commit({.finished = first, .joins = fork_of_leaving}),
      kInvalidArgument);
  REQUIRE_STATUS_IS(f.commit->Commit({.joins = negative_id}), kInvalidArgument);
  REQUIRE_STATUS_IS(f.commit->Commit({.joins = fork_appends_in_prefill}),
                    kInvalidArgument);
  REQUIRE_STATUS_IS(f.commit->Commit({.joins = too_many}), kFailedPrecondition);
  // Failures inside the step: rolled back.
  REQUIRE_STATUS_IS(f.commit->Commit({.joins = too_long}), kOutOfRange);
  REQUIRE_STATUS_IS(f.commit->Commit({.joins = exhausting}),
                    kResourceExhausted);
  REQUIRE(f.Capture() == before);
  REQUIRE_OK(f.commit->CheckInvariants());
}

TEST_CASE("a chunked prompt continues in chunks beside decodes") {
  CommitFixture f(SmallConfig());
  const std::vector<TokenId> decode_prompt = {1, 2, 3, 4, 5};
  std::vector<TokenId> long_prompt(14);
  for (int i = 0; i < 14; ++i) long_prompt[i] = 100 + i;

  // Step 1: a decoding sequence and the first 6 tokens of a 14-token prompt.
  const JoinRequest joins1[] = {
      {.id = 1, .tokens = decode_prompt},
      {.id = 2, .tokens = long_prompt, .admit = {.prefill_tokens = 6}}};
  auto step1 = f.commit->Commit({.joins = joins1});
  REQUIRE_OK(step1);
  REQUIRE(f.Row(0) == Pages{0, 1});
  REQUIRE(f.Row(1) == Pages{2, 3});
  REQUIRE(*f.manager->PromptTokensLeft(2) == 8);
  REQUIRE(step1->new_pages == 4);

  // Step 2: sequence 1 decodes, sequence 2 schedules 2 more prompt tokens
  // (its page 1 fills: no new page, no row change).
  const int32_t counts2[] = {1, 0};
  const TokenId tokens2[] = {6};
  const PromptChunk chunks2[] = {
      {.id = 2, .tokens = absl::MakeConstSpan(long_prompt).subspan(6, 2)}};
  auto step2 = f.commit->Commit({.append_counts = counts2,
                                 .append_tokens = tokens2,
                                 .prompt_chunks = chunks2});
  REQUIRE_OK(step2);
  REQUIRE(step2->changed_slots.empty());
  REQUIRE(f.Row(1) == Pages{2, 3});

  // Step 3: the rest of the prompt, 6 tokens over two new pages; the
  // sequence's row is rewritten from its first new page.
  const int32_t counts3[] = {1, 0};
  const TokenId tokens3[] = {7};
  const PromptChunk chunks3[] = {
      {.id = 2, .tokens = absl::MakeConstSpan(long_prompt).subspan(8, 6)}};
  auto step3 = f.commit->Commit({.append_counts = counts3,
                                 .append_tokens = tokens3,
                                 .prompt_chunks = chunks3});
  REQUIRE_OK(step3);
  REQUIRE(Pages(step3->changed_slots.begin(), step3->changed_slots.end()) ==
          Pages{1});
  REQUIRE(f.Row(1) == Pages{2, 3, 4, 5});
  REQUIRE(step3->new_pages == 2);
  REQUIRE(*f.manager->PromptTokensLeft(2) == 0);
  REQUIRE_OK(f.commit->CheckInvariants());
  REQUIRE_OK(f.UploadAndCheck());
}

TEST_CASE("draft slots grow and shrink a row within the step") {
  CommitFixture f(SmallConfig());
  const std::vector<TokenId> prompt = {1, 2, 3, 4, 5, 6};
  const JoinRequest joins[] = {{.id = 1, .tokens = prompt}};
  REQUIRE_OK(f.commit->Commit({.joins = joins}));
  REQUIRE(f.Row(0) == Pages{0, 1});

  // 5 drafts after 6 tokens: a third page for the kernels to write into.
  const int32_t drafts1[] = {5};
  auto step1 = f.commit->Commit({.draft_counts = drafts1});
  REQUIRE_OK(step1);
  REQUIRE(f.Row(0) == Pages{0, 1, 2});
  REQUIRE(step1->new_pages == 1);
  REQUIRE(Pages(step1->changed_slots.begin(), step1->changed_slots.end()) ==
          Pages{0});

  // Every draft rejected: the target's token, no new drafts. Page 2 (drafts
  // only) is released and its entry cleared.
  const int32_t counts2[] = {1};
  const TokenId tokens2[] = {7};
  const int32_t drafts2[] = {0};
  auto step2 = f.commit->Commit({.append_counts = counts2,
                                 .append_tokens = tokens2,
                                 .draft_counts = drafts2});
  REQUIRE_OK(step2);
  REQUIRE(f.Row(0) == Pages{0, 1});
  REQUIRE(step2->new_pages == 0);
  REQUIRE(f.manager->pool().NumFree() == 14);
  REQUIRE_OK(f.commit->CheckInvariants());
  REQUIRE_OK(f.UploadAndCheck());

  // Drafts over a partial page a fork shares: copied, counted as a draft
  // copy.
  const JoinRequest fork[] = {{.id = 2, .fork_of = 1}};
  REQUIRE_OK(f.commit->Commit({.joins = fork}));
  const int32_t drafts3[] = {2, 0};
  auto step3 = f.commit->Commit({.draft_counts = drafts3});
  REQUIRE_OK(step3);
  REQUIRE(std::vector<PageCopy>(step3->copies.begin(), step3->copies.end()) ==
          std::vector<PageCopy>{{1, 2}});
  REQUIRE(step3->draft_copies == 1);
  REQUIRE(f.Row(0) == Pages{0, 2, 3});
  REQUIRE(f.Row(1) == Pages{0, 1});
  REQUIRE_OK(f.commit->CheckInvariants());
}

TEST_CASE("invalid chunks and drafts are refused and change nothing") {
  CommitFixture f(SmallConfig());
  const std::vector<TokenId> prompt = {1, 2, 3, 4, 5};
  std::vector<TokenId> long_prompt(12, 7);
  const JoinRequest joins[] = {
      {.id = 1, .tokens = prompt},
      {.id = 2, .tokens = long_prompt, .admit = {.prefill_tokens = 4}}};
  REQUIRE_OK(f.commit->Commit({.joins = joins}));
  const CommitState before = f.Capture();
  const TokenId token[] = {9};
  const PromptChunk of_unknown[] = {{.id = 7, .tokens = token}};
  const PromptChunk of_two[] = {{.id = 2, .tokens = token}};
  const PromptChunk twice[] = {{.id = 2, .tokens = token},
                               {.id = 2, .tokens = token}};
  const PromptChunk of_decoding[] = {{.id = 1, .tokens = token}};
  const int32_t appends_to_two[] = {0, 1};
  const int32_t drafts_of_two[] = {0, 1};
  const int32_t one_draft[] = {1};
  const int32_t negative_drafts[] = {-1, 0};
  const SequenceId two[] = {2};
  const JoinRequest fork_of_prefilling[] = {{.id = 5, .fork_of = 2}};

  const auto refused = [&](const StepPlan& plan, absl::StatusCode code,
                           const char* message) {
    auto result = f.commit->Commit(plan);
    REQUIRE(result.status().code() == code);
    REQUIRE(result.status().message().find(message) != std::string::npos);
    REQUIRE(f.Capture() == before);
  };
  refused({.prompt_chunks = of_unknown}, absl::StatusCode::kNotFound,
          "prompt chunk of sequence 7, which is not running");
  refused({.prompt_chunks = twice}, absl::StatusCode::kInvalidArgument,
          "which has another chunk");
  refused({.append_counts = appends_to_two,
           .append_tokens = token,
           .prompt_chunks = of_two},
          absl::StatusCode::kInvalidArgument, "also appends or drafts");
  refused({.prompt_chunks = of_two, .draft_counts = drafts_of_two},
          absl::StatusCode::kInvalidArgument, "also appends or drafts");
  refused({.finished = two, .prompt_chunks = of_two},
          absl::StatusCode::kInvalidArgument, "which leaves");
  refused({.draft_counts = one_draft}, absl::StatusCode::kInvalidArgument,
          "draft_counts has 1 entries, the batch has 2");
  refused({.draft_counts = negative_drafts}, absl::StatusCode::kInvalidArgument,
          "draft_counts[0] is -1");
  refused({.finished = two, .draft_counts = drafts_of_two},
          absl::StatusCode::kInvalidArgument, "appends 0 tokens and 1 drafts");
  // Found while applying, rolled back: a chunk of a sequence with no prompt
  // left, drafts of a prefilling one, a fork of a prefilling one.
  refused({.prompt_chunks = of_decoding}, absl::StatusCode::kInvalidArgument,
          "0 prompt tokens left");
  refused({.draft_counts = drafts_of_two},
          absl::StatusCode::kFailedPrecondition, "8 prompt tokens left");
  refused({.joins = fork_of_prefilling}, absl::StatusCode::kFailedPrecondition,
          "8 prompt tokens to compute");
}

TEST_CASE("pool exhausted half-way through the appends rolls the step back") {
  PagedKvConfig config = SmallConfig();
  config.num_pages = 6;
  CommitFixture f(config);
  const std::vector<TokenId> a = {1, 2, 3, 4};
  const std::vector<TokenId> b = {11, 12, 13, 14};
  const std::vector<TokenId> c = {21, 22, 23, 24};
  const JoinRequest joins[] = {
      {.id = 1, .tokens = a}, {.id = 2, .tokens = b}, {.id = 3, .tokens = c}};
  REQUIRE_OK(f.commit->Commit({.joins = joins}));  // 3 pages, 3 free
  const CommitState before = f.Capture();
  // Each needs a new page; the third and fourth tokens of 3 need a second.
  const int32_t counts[] = {1, 1, 5};
  const TokenId tokens[] = {5, 15, 25, 26, 27, 28, 29};
  REQUIRE_STATUS_IS(
      f.commit->Commit({.append_counts = counts, .append_tokens = tokens}),
      kResourceExhausted);
  REQUIRE(f.Capture() == before);
  REQUIRE_OK(f.commit->CheckInvariants());

  SECTION("preempting one and retrying succeeds") {
    const SequenceId preempted[] = {1};
    const int32_t retry_counts[] = {0, 1, 5};
    const TokenId retry_tokens[] = {15, 25, 26, 27, 28, 29};
    auto step = f.commit->Commit({.preempted = preempted,
                                  .append_counts = retry_counts,
                                  .append_tokens = retry_tokens});
    REQUIRE_OK(step);
    REQUIRE(step->batch == 2);
    REQUIRE(f.manager->stats().preemptions == 1);
    REQUIRE_OK(f.commit->CheckInvariants());
  }
}

TEST_CASE("a step's host copies come with it; a failed step lists none") {
  PagedKvConfig config = SmallConfig();
  config.num_pages = 6;
  CommitFixture f(config, {.host_pages = 8});
  const std::vector<TokenId> a = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  const std::vector<TokenId> b = TokenRangeOf(100, 16);
  const std::vector<TokenId> c = TokenRangeOf(200, 8);
  const JoinRequest join_a[] = {{.id = 1, .tokens = a}};
  auto step1 = f.commit->Commit({.joins = join_a});
  REQUIRE_OK(step1);
  REQUIRE(step1->host_copies.empty());
  const SequenceId finish_a[] = {1};
  REQUIRE_OK(f.commit->Commit({.finished = finish_a}));  // 2 pages cached.
  // B takes the 4 free pages, C evicts A's 2 cached ones: stored.
  const JoinRequest join_bc[] = {{.id = 2, .tokens = b},
                                 {.id = 3, .tokens = c}};
  auto step3 = f.commit->Commit({.joins = join_bc});
  REQUIRE_OK(step3);
  REQUIRE(step3->host_copies.size() == 2);
  for (const HostCopy& copy : step3->host_copies) {
    REQUIRE(copy.direction == HostCopy::Direction::kDeviceToHost);
  }
  const SequenceId finish_bc[] = {2, 3};
  REQUIRE_OK(f.commit->Commit({.finished = finish_bc}));
  const CommitState before = f.Capture();

  // A comes back: 2 loads, but D's 6 pages do not fit beside them.
  const std::vector<TokenId> d = TokenRangeOf(300, 16);
  const JoinRequest join_ad[] = {{.id = 4, .tokens = a},
                                 {.id = 5, .tokens = d}};
  REQUIRE_STATUS_IS(f.commit->Commit({.joins = join_ad}), kResourceExhausted);
  REQUIRE(f.Capture() == before);
  REQUIRE(f.manager->pool().host_copies().empty());

  const JoinRequest join_a_again[] = {{.id = 4, .tokens = a}};
  auto step5 = f.commit->Commit({.joins = join_a_again});
  REQUIRE_OK(step5);
  int loads = 0;
  for (const HostCopy& copy : step5->host_copies) {
    if (copy.direction == HostCopy::Direction::kHostToDevice) ++loads;
  }
  REQUIRE(loads == 2);
  REQUIRE(f.manager->stats().host_hit_tokens == 8);
  REQUIRE(f.Row(0) == f.manager->Pages(4).value());
  // Between steps nothing is left to take.
  std::vector<HostCopy> taken;
  REQUIRE_OK(f.manager->TakeHostCopies(taken));
  REQUIRE(taken.empty());
  REQUIRE_OK(f.commit->CheckInvariants());
}

TEST_CASE("create rejects a table of another geometry") {
  CommitFixture f(SmallConfig());
  auto device = Device::Host();
  auto table = KVPageTable::Create(4, 8, 16, *device);
  REQUIRE_OK(table);
  REQUIRE_STATUS_IS(BatchCommit::Create(*f.manager, **table), kInvalidArgument);
}

TEST_CASE("a table serves one commit at a time") {
  CommitFixture f(SmallConfig());
  const std::vector<TokenId> prompt = {1, 2};
  const JoinRequest joins[] = {{.id = 1, .tokens = prompt}};
  REQUIRE_OK(f.commit->Commit({.joins = joins}));
  // A second manager's commit would write its rows over the first's.
  auto other = BlockManager::Create(SmallConfig(), {});
  REQUIRE_OK(other);
  const auto refused = BatchCommit::Create(**other, *f.table);
  REQUIRE_STATUS_IS(refused, kFailedPrecondition);
  REQUIRE(
      std::string(refused.status().message()).find("another BatchCommit's") !=
      std::string::npos);
  REQUIRE_OK(f.commit->CheckInvariants());
  // Once the first is gone, the table is free.
  f.commit.reset();
  auto second = BatchCommit::Create(**other, *f.table);
  REQUIRE_OK(second);
  REQUIRE_OK((*second)->CheckInvariants());
}

TEST_CASE("an injected fault at every site of a step is rolled back") {
  PagedKvConfig config = SmallConfig();
  config.num_pages = 12;
  CommitFixture f(config);
  const std::vector<TokenId> system = {1, 2, 3, 4, 5, 6};
  const std::vector<TokenId> other = {1, 2, 3, 4, 9, 9};
  const JoinRequest joins1[] = {{.id = 1, .tokens = system},
                                {.id = 2, .tokens = other}};
  REQUIRE_OK(f.commit->Commit({.joins = joins1}));

  // A step that frees, admits with prefix hits, forks, appends across a page
  // boundary and copies on write.
  const SequenceId finished[] = {2};
  const std::vector<TokenId> again = {1, 2, 3, 4, 5, 6, 7, 8, 40};
  const std::vector<TokenId> fork_tokens = {77};
  const JoinRequest joins2[] = {{.id = 3, .tokens = again},
                                {.id = 4, .fork_of = 1, .tokens = fork_tokens}};
  const int32_t counts[] = {3, 0};
  const TokenId tokens[] = {9, 10, 11};
  const StepPlan plan{.finished = finished,
                      .joins = joins2,
                      .append_counts = counts,
                      .append_tokens = tokens};
  const CommitState before = f.Capture();
  int64_t faults = 0;
  for (int64_t n = 1;; ++n) {
    CAPTURE(n);
    internal::FaultInjection::FailNth(n);
    absl::StatusOr<StepResult> step = f.commit->Commit(plan);
    internal::FaultInjection::Disarm();
    if (step.ok()) break;
    ++faults;
    REQUIRE(f.Capture() == before);
    REQUIRE_OK(f.commit->CheckInvariants());
  }
  // Allocations, retains, cache revivals and rows: many sites, all undone.
  REQUIRE(faults >= 8);
  REQUIRE(f.commit->batch() == 3);
  REQUIRE_OK(f.commit->CheckInvariants());
  REQUIRE_OK(f.UploadAndCheck());
}

}  // namespace
}  // namespace kvblock
