// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Model-based randomized test of a BlockManager of several KV cache groups:
// seeded random calls (admissions from a few shared prompt prefixes, whole or
// in chunks; prompt chunks; appends; drafts; forks; frees; preemptions) run
// on the manager and on an independent per-group model (token vectors and
// sets of cached token prefixes), and after every call:
//   - CheckInvariants() is OK;
//   - in every group, every sequence holds PagesForTokens(tokens + drafts)
//     pages at that group's page size, its leading null pages are exactly
//     those the model's window skipped (NumSkippedPages of the tokens
//     computed before each append, or of the hit at admission), and no
//     other entry is the null page;
//   - pages in use are the distinct pages held, plus the null page;
//   - with a pool too large to evict, an admission's hit is the longest
//     aligned prefix whose pages every group has cached, by brute force
//     over the model's prefix sets (each group caching every full page of
//     the tokens its sequences computed, a window group those
//     CachesFullPage keeps); with EAGLE groups, which match a page more and
//     drop it in vLLM's fixed point, an aligned prefix no longer than that;
//   - a failing call left Snapshot() as it was (one transaction over every
//     group).
#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/group_spec_test_util.h"
#include "kvblock/block_manager.h"
#include "kvblock/config.h"
#include "kvblock/kv_cache_groups.h"
#include "test_util.h"

namespace kvblock {
namespace {

using Tokens = std::vector<TokenId>;

constexpr KvCacheGroupSpec Spec(AttentionKind kind, int32_t page_size,
                                int32_t span) {
  return testing::GroupSpec(kind, page_size, span);
}

KvCacheGroupSpec Eagle(KvCacheGroupSpec spec) {
  spec.eagle = true;
  return spec;
}

struct Scenario {
  std::string name;
  std::vector<KvCacheGroupSpec> groups;
  int32_t num_pages;
  uint32_t seed;
  // Whether the pool never evicts: hits are then checked by brute force.
  bool ample;
};

// The leading pages of a hit of `length` tokens that `group` takes as null:
// those no later token attends to, but a sliding window keeps the hit's last
// page even when it reaches back less (vLLM counts its window pages from a
// cached one).
int64_t HitSkippedPages(const KvCacheGroupSpec& group, int64_t length) {
  const int64_t skipped = NumSkippedPages(group, length);
  if (group.kind != AttentionKind::kSlidingWindow || length == 0) {
    return skipped;
  }
  return std::min(skipped, length / group.page_size - 1);
}

class Model {
 public:
  struct Sequence {
    Tokens tokens;
    int64_t prompt_end = 0;
    int32_t drafts = 0;
    std::vector<int64_t> skipped;  // per group: leading null pages.
  };

  explicit Model(std::vector<KvCacheGroupSpec> groups)
      : groups_(std::move(groups)),
        cached_(groups_.size()),
        alignment_(AlignmentTokens(groups_)) {}

  // The longest hit within `prompt` (at most its length less one), every
  // group's needed pages cached.
  int64_t BruteForceHit(const Tokens& prompt) const {
    const int64_t max_length = static_cast<int64_t>(prompt.size()) - 1;
    for (int64_t length = max_length / alignment_ * alignment_; length > 0;
         length -= alignment_) {
      bool all = true;
      for (size_t g = 0; g < groups_.size() && all; ++g) {
        const int32_t page_size = groups_[g].page_size;
        for (int64_t page = HitSkippedPages(groups_[g], length);
             page < length / page_size && all; ++page) {
          all =
              cached_[g].count(Tokens(
                  prompt.begin(), prompt.begin() + (page + 1) * page_size)) > 0;
        }
      }
      if (all) return length;
    }
    return 0;
  }

  // The sequence computed its tokens up to `tokens`' length: every group
  // caches the full pages it keeps.
  void Computed(const Tokens& tokens) {
    for (size_t g = 0; g < groups_.size(); ++g) {
      const int32_t page_size = groups_[g].page_size;
      for (int64_t page = 0;
           page < static_cast<int64_t>(tokens.size()) / page_size; ++page) {
        if (groups_[g].kind != AttentionKind::kFull &&
            !CachesFullPage(groups_[g], page, alignment_)) {
          continue;
        }
        cached_[g].insert(
            Tokens(tokens.begin(), tokens.begin() + (page + 1) * page_size));
      }
    }
  }

  // Before the next tokens are computed, the window groups skip.
  void Skip(Sequence& seq) const {
    for (size_t g = 0; g < groups_.size(); ++g) {
      seq.skipped[g] = std::max(
          seq.skipped[g],
          NumSkippedPages(groups_[g], static_cast<int64_t>(seq.tokens.size())));
    }
  }

  std::map<SequenceId, Sequence> sequences;

 private:
  const std::vector<KvCacheGroupSpec> groups_;
  std::vector<std::set<Tokens>> cached_;
  const int64_t alignment_;
};

class Runner {
 public:
  explicit Runner(const Scenario& scenario)
      : scenario_(scenario), rng_(scenario.seed), model_(scenario.groups) {
    const PagedKvConfig config{.num_pages = scenario.num_pages,
                               .max_batch = 8,
                               .max_pages_per_seq = 40,
                               .page_size = 4};
    auto manager =
        BlockManager::Create(config, {.kv_cache_groups = scenario.groups});
    REQUIRE_OK(manager);
    manager_ = std::move(manager).value();
    for (int b = 0; b < 3; ++b) {
      bases_.push_back(testing::TokenRange(1000 * (b + 1), 120));
    }
  }

  void Run(int64_t ops) {
    for (int64_t op = 0; op < ops; ++op) {
      INFO("scenario " << scenario_.name << " seed " << scenario_.seed << " op "
                       << op);
      Step();
      REQUIRE_OK(manager_->CheckInvariants());
      Compare();
    }
    // Both kinds of call ran: the tight pools refuse some.
    REQUIRE(failures_ > 0);
    // EAGLE's dropped page still leaves hits.
    if (eagle_ && scenario_.ample) REQUIRE(eagle_hits_ > 0);
  }

 private:
  int Uniform(int lo, int hi) {  // [lo, hi]
    return std::uniform_int_distribution<int>(lo, hi)(rng_);
  }
  Tokens Fresh(int count) {
    Tokens tokens(count);
    for (TokenId& t : tokens) t = next_token_++;
    return tokens;
  }
  SequenceId AnyLive() {
    auto it = model_.sequences.begin();
    std::advance(it, Uniform(0, static_cast<int>(model_.sequences.size()) - 1));
    return it->first;
  }

  // Runs `call`; on error checks that nothing changed and returns false.
  // `fork`: a fork, which FailedPrecondition refuses while its parent has
  // prompt tokens left.
  template <typename Call>
  bool Try(Call&& call, bool fork = false) {
    const BlockManagerSnapshot before = manager_->Snapshot();
    const absl::Status status = call();
    if (!status.ok()) {
      INFO(status.ToString());
      // Only what the calls ask for can fail: room in the pool or a table.
      REQUIRE(
          (status.code() == absl::StatusCode::kResourceExhausted ||
           status.code() == absl::StatusCode::kOutOfRange ||
           (fork && status.code() == absl::StatusCode::kFailedPrecondition)));
      REQUIRE(manager_->Snapshot() == before);
      ++failures_;
    }
    return status.ok();
  }

  void Step() {
    const int choice = model_.sequences.empty() ? 0 : Uniform(0, 9);
    if (choice <= 2 || model_.sequences.empty()) return Admit();
    const SequenceId id = AnyLive();
    Model::Sequence& seq = model_.sequences[id];
    const bool prompt_left =
        static_cast<int64_t>(seq.tokens.size()) < seq.prompt_end;
    switch (choice) {
      case 3:
      case 4:
      case 5: {
        if (prompt_left) return AppendPrompt(id, seq);
        if (seq.drafts > 0 && Uniform(0, 1) == 0) {
          if (Try([&] { return manager_->SetDrafts(id, 0).status(); })) {
            seq.drafts = 0;
          }
          return;
        }
        const Tokens tokens = Fresh(Uniform(1, 6));
        if (Try([&] { return manager_->Append(id, tokens).status(); })) {
          model_.Skip(seq);
          seq.tokens.insert(seq.tokens.end(), tokens.begin(), tokens.end());
          seq.drafts =
              std::max(0, seq.drafts - static_cast<int>(tokens.size()));
          model_.Computed(seq.tokens);
        }
        return;
      }
      case 6: {
        if (prompt_left) return AppendPrompt(id, seq);
        const int32_t drafts = Uniform(0, 5);
        if (Try([&] { return manager_->SetDrafts(id, drafts).status(); })) {
          seq.drafts = drafts;
        }
        return;
      }
      case 7: {
        const SequenceId child = next_id_++;
        if (Try([&] { return manager_->Fork(id, child); }, /*fork=*/true)) {
          Model::Sequence copy = seq;
          model_.sequences[child] = copy;
          prompts_[child] = prompts_.at(id);
          prompt_hashes_[child] = prompt_hashes_.at(id);
        }
        return;
      }
      default: {
        const bool preempt = Uniform(0, 1) == 0;
        if (Try([&] {
              return preempt ? manager_->Preempt(id) : manager_->Free(id);
            })) {
          model_.sequences.erase(id);
        }
        return;
      }
    }
  }

  void Admit() {
    const Tokens& base = bases_[Uniform(0, 2)];
    Tokens prompt(base.begin(), base.begin() + Uniform(1, 90));
    if (Uniform(0, 2) == 0) {
      const Tokens tail = Fresh(Uniform(1, 10));
      prompt.insert(prompt.end(), tail.begin(), tail.end());
    }
    const int64_t prefill = Uniform(0, 1) == 0 ? prompt.size() : Uniform(1, 20);
    const int64_t expected_hit =
        scenario_.ample ? model_.BruteForceHit(prompt) : -1;
    const SequenceId id = next_id_++;
    // Half the prompts come hashed, as a scheduler hashes them on arrival:
    // one chain of hash blocks for every group.
    std::vector<BlockHash> hashes;
    if (Uniform(0, 1) == 0) {
      hashes.resize(prompt.size());
      const absl::StatusOr<int64_t> blocks =
          manager_->HashPrompt(prompt, {}, absl::MakeSpan(hashes));
      REQUIRE_OK(blocks);
      hashes.resize(static_cast<size_t>(*blocks));
    }
    AdmissionPlan plan;
    if (!Try([&] {
          absl::StatusOr<AdmissionPlan> admitted = manager_->Admit(
              id, prompt, {}, hashes, {.prefill_tokens = prefill});
          if (admitted.ok()) plan = *admitted;
          return admitted.status();
        })) {
      return;
    }
    if (expected_hit >= 0 && !eagle_) REQUIRE(plan.hit_tokens == expected_hit);
    if (expected_hit >= 0 && eagle_) {
      REQUIRE(plan.hit_tokens <= expected_hit);
      REQUIRE(plan.hit_tokens % AlignmentTokens(scenario_.groups) == 0);
      if (plan.hit_tokens > 0) ++eagle_hits_;
    }
    Model::Sequence seq;
    seq.prompt_end = static_cast<int64_t>(prompt.size());
    seq.skipped.assign(scenario_.groups.size(), 0);
    for (size_t g = 0; g < scenario_.groups.size(); ++g) {
      seq.skipped[g] = HitSkippedPages(scenario_.groups[g], plan.hit_tokens);
    }
    const int64_t end = plan.hit_tokens + plan.computed_tokens;
    seq.tokens.assign(prompt.begin(), prompt.begin() + end);
    model_.Computed(seq.tokens);
    prompts_[id] = prompt;
    prompt_hashes_[id] = std::move(hashes);
    model_.sequences[id] = seq;
  }

  void AppendPrompt(SequenceId id, Model::Sequence& seq) {
    const Tokens& prompt = PromptOf(id);
    const int64_t done = static_cast<int64_t>(seq.tokens.size());
    const int64_t count =
        std::min<int64_t>(seq.prompt_end - done, Uniform(1, 24));
    const Tokens chunk(prompt.begin() + done, prompt.begin() + done + count);
    const std::vector<BlockHash>& hashes = prompt_hashes_.at(id);
    if (Try([&] {
          return manager_->AppendPrompt(id, chunk, hashes).status();
        })) {
      model_.Skip(seq);
      seq.tokens.insert(seq.tokens.end(), chunk.begin(), chunk.end());
      model_.Computed(seq.tokens);
    }
  }

  const Tokens& PromptOf(SequenceId id) { return prompts_.at(id); }

  // Every sequence's length, drafts and pages in every group against the
  // model; one REQUIRE, naming the first difference.
  void Compare() {
    REQUIRE(manager_->num_sequences() ==
            static_cast<int32_t>(model_.sequences.size()));
    const PageId null_page = manager_->null_page();
    std::set<PageId> held;
    std::string difference;
    for (const auto& [id, seq] : model_.sequences) {
      const int64_t length = static_cast<int64_t>(seq.tokens.size());
      if (manager_->NumTokens(id).value_or(-1) != length ||
          manager_->NumDrafts(id).value_or(-1) != seq.drafts) {
        difference = absl::StrCat("sequence ", id, ": length or drafts");
        break;
      }
      for (size_t g = 0; g < scenario_.groups.size() && difference.empty();
           ++g) {
        const absl::Span<const PageId> pages =
            manager_->GroupPages(id, static_cast<int32_t>(g)).value();
        if (static_cast<int64_t>(pages.size()) !=
            PagesForTokens(length + seq.drafts,
                           scenario_.groups[g].page_size)) {
          difference =
              absl::StrCat("sequence ", id, " group ", g, ": ", pages.size(),
                           " pages for ", length, " + ", seq.drafts);
        }
        for (size_t i = 0; i < pages.size() && difference.empty(); ++i) {
          const bool skipped = static_cast<int64_t>(i) < seq.skipped[g];
          if ((pages[i] == null_page) != skipped) {
            difference = absl::StrCat("sequence ", id, " group ", g, " page ",
                                      i, ": the model skips ", seq.skipped[g]);
          }
          if (!skipped) held.insert(pages[i]);
        }
      }
      if (!difference.empty()) break;
    }
    INFO(difference);
    REQUIRE(difference.empty());
    REQUIRE(manager_->pool().NumUsed() ==
            static_cast<int32_t>(held.size()) + (null_page == kNoPage ? 0 : 1));
  }

  const Scenario scenario_;
  std::mt19937 rng_;
  Model model_;
  std::unique_ptr<BlockManager> manager_;
  std::vector<Tokens> bases_;
  std::map<SequenceId, Tokens> prompts_;
  // Each prompt's chain of hash blocks, when it was admitted with one.
  std::map<SequenceId, std::vector<BlockHash>> prompt_hashes_;
  SequenceId next_id_ = 0;
  TokenId next_token_ = 1'000'000;
  int64_t failures_ = 0;
  const bool eagle_ =
      std::any_of(scenario_.groups.begin(), scenario_.groups.end(),
                  [](const KvCacheGroupSpec& group) { return group.eagle; });
  int64_t eagle_hits_ = 0;
};

TEST_CASE("random calls on KV cache groups match the per-group model",
          "[random]") {
  using enum AttentionKind;
  const std::vector<Scenario> scenarios = {
      {"gpt-oss",
       {Spec(kFull, 4, 0), Spec(kSlidingWindow, 4, 6)},
       4096,
       1,
       true},
      {"gemma3",
       {Spec(kSlidingWindow, 4, 9), Spec(kSlidingWindow, 4, 9),
        Spec(kFull, 4, 0)},
       4096,
       2,
       true},
      {"llama4", {Spec(kChunkedLocal, 8, 8), Spec(kFull, 8, 0)}, 4096, 3, true},
      {"two page sizes", {Spec(kFull, 4, 0), Spec(kFull, 8, 0)}, 4096, 4, true},
      {"window of one",
       {Spec(kSlidingWindow, 4, 1), Spec(kFull, 4, 0)},
       4096,
       5,
       true},
      {"window alone", {Spec(kSlidingWindow, 4, 13)}, 4096, 6, true},
      {"tight gpt-oss",
       {Spec(kFull, 4, 0), Spec(kSlidingWindow, 4, 6)},
       90,
       7,
       false},
      {"eagle gpt-oss",
       {Eagle(Spec(kFull, 4, 0)), Eagle(Spec(kSlidingWindow, 4, 6))},
       4096,
       9,
       true},
      // A window of pages below the hits' unit (CachesFullPage's shift).
      {"eagle small window pages",
       {Eagle(Spec(kFull, 16, 0)), Eagle(Spec(kSlidingWindow, 4, 5))},
       4096,
       10,
       true},
      {"tight eagle",
       {Eagle(Spec(kFull, 8, 0)), Eagle(Spec(kSlidingWindow, 4, 5)),
        Spec(kChunkedLocal, 8, 16)},
       120,
       11,
       false},
      {"tight three kinds",
       {Spec(kFull, 8, 0), Spec(kSlidingWindow, 4, 5),
        Spec(kChunkedLocal, 8, 16)},
       120,
       8,
       false},
  };
  for (const Scenario& scenario : scenarios) {
    Runner(scenario).Run(testing::RandomRunLength(1500));
  }
}

}  // namespace
}  // namespace kvblock
