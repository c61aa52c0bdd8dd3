// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Randomized runs of BatchCommit under a small continuous-batching scheduler:
// random finishes, preemptions, joins (prompts from shared prefixes, so the
// prefix cache hits, whole or as a first chunk; recomputed preempted
// sequences; forks of running sequences and of earlier joins, with and
// without tokens), appends of 1..6 tokens, prompt chunks (chunked prefill)
// and, in half of the steps, draft slots (speculative decoding: the next
// step's appends take them), in pools small enough that steps run out of
// pages. A refused step must change nothing; the scheduler then preempts and
// retries.
//
// After every step the run is checked against a trivially correct model: the
// slot order (holes filled by the last rows), the old-to-new map, the
// rewritten rows, the copy-on-write list (exactly the shared partial pages
// that changed identity), the pages of tokens and drafts, the KV content
// each sequence reads (a model of the copy and write kernels run on the
// step's result, drafts writing KV the next step's tokens overwrite), the
// invariants and the uploaded device view. Each attempt is also run as the
// manager's own calls, one at a time, and undone: the commit must accept it
// exactly when they do and leave the same manager state.
//
// A second run fails every step at every fault-injection site in turn and
// checks that each failure is rolled back to the exact state before the step.
#include <algorithm>
#include <cstdint>
#include <deque>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/fault_injection.h"
#include "commit/batch_commit_test_util.h"
#include "kvblock/batch_commit.h"
#include "test_util.h"

namespace kvblock {
namespace {

using testing::CommitFixture;
using testing::CommitState;
using Tokens = std::vector<TokenId>;
using Pages = std::vector<PageId>;

struct RunConfig {
  uint64_t seed = 0;
  int32_t page_size = 4;
  int32_t num_pages = 26;
  bool prefix_caching = true;
  int32_t watermark_pages = 0;
  bool reserve_prompt_pages = true;
};

PagedKvConfig MakeConfig(const RunConfig& run) {
  PagedKvConfig config;
  config.num_pages = run.num_pages;
  config.page_size = run.page_size;
  config.max_pages_per_seq = 6;
  config.max_batch = 8;
  return config;
}

BlockManagerOptions MakeOptions(const RunConfig& run) {
  BlockManagerOptions options;
  options.enable_prefix_caching = run.prefix_caching;
  options.hash_algorithm = HashAlgorithm::kXxh3_128;
  options.watermark_pages = run.watermark_pages;
  options.reserve_prompt_pages = run.reserve_prompt_pages;
  return options;
}

// KV the kernels write into a draft slot: no token's.
constexpr TokenId kDraftKv = -2;

// A sequence joining in a drafted step.
struct DraftJoin {
  SequenceId id = kNoSequence;
  SequenceId fork_of = kNoSequence;
  Tokens tokens;        // the prompt, or the tokens a fork appends.
  Tokens base;          // what it holds after joining, before appending.
  bool rejoin = false;  // a preempted sequence recomputed.
  // Its pages are written by this step's prefill: a prompt or a fork of one.
  bool prefilled = false;
  // A prompt's first chunk: at most this many tokens after its hits.
  int64_t prefill = std::numeric_limits<int64_t>::max();
};

// A step under construction; owns everything its StepPlan views.
struct Draft {
  std::vector<SequenceId> finished;
  std::vector<SequenceId> preempted;
  std::vector<DraftJoin> joins;
  std::vector<Tokens> appends;  // by slot at the start of the step.
  std::vector<Tokens> chunks;   // by slot: prompt chunks.
  std::vector<int32_t> drafts;  // by slot, or empty: no draft_counts.

  // A plan viewing this draft (and its scratch), valid until the next call.
  StepPlan View(const std::vector<SequenceId>& slots) {
    requests.clear();
    for (const DraftJoin& join : joins) {
      requests.push_back({.id = join.id,
                          .fork_of = join.fork_of,
                          .tokens = join.tokens,
                          .admit = {.prefill_tokens = join.prefill}});
    }
    counts.clear();
    flat.clear();
    for (const Tokens& tokens : appends) {
      counts.push_back(static_cast<int32_t>(tokens.size()));
      flat.insert(flat.end(), tokens.begin(), tokens.end());
    }
    prompt_chunks.clear();
    for (size_t slot = 0; slot < chunks.size(); ++slot) {
      if (!chunks[slot].empty()) {
        prompt_chunks.push_back({.id = slots[slot], .tokens = chunks[slot]});
      }
    }
    return {.finished = finished,
            .preempted = preempted,
            .joins = requests,
            .append_counts = counts,
            .append_tokens = flat,
            .prompt_chunks = prompt_chunks,
            .draft_counts = drafts};
  }

  std::vector<JoinRequest> requests;
  std::vector<int32_t> counts;
  Tokens flat;
  std::vector<PromptChunk> prompt_chunks;
};

struct RunCounters {
  int64_t exhausted = 0;  // refused steps, then shrunk and retried.
  int64_t copies = 0;
  int64_t draft_copies = 0;
  int64_t forks = 0;
  int64_t injected = 0;      // injected failures rolled back.
  int64_t first_chunks = 0;  // prompts joined with part of their tokens.
  int64_t chunks = 0;
  int64_t drafts = 0;          // draft slots set.
  int64_t draft_releases = 0;  // steps whose drafts released pages.
};

// A scheduler driving BatchCommit, with the model it is checked against.
class Scheduler {
 public:
  explicit Scheduler(const RunConfig& run)
      : f_(MakeConfig(run), MakeOptions(run)),
        rng_(run.seed),
        page_size_(run.page_size),
        capacity_(int64_t{MakeConfig(run).max_pages_per_seq} * run.page_size),
        content_(static_cast<size_t>(run.num_pages) * run.page_size, -1) {
    // Shared prefixes (a system prompt, few-shot examples) of 1 to 3 pages,
    // some of them ending inside a page.
    for (int i = 0; i < 4; ++i) {
      prefixes_.push_back(RandomTokens(Between(1, 3 * page_size_), 1000));
    }
  }

  // Runs one step: drafts it, commits it (on ResourceExhausted checks the
  // rollback, preempts or drops a join and retries), checks the result.
  // With `fault_sweep`, the draft is first shrunk to fit in the free pages
  // and every attempt is failed at each injection site in turn.
  void Step(bool fault_sweep) {
    Draft draft = DraftStep();
    if (fault_sweep) FitToPool(draft);
    absl::flat_hash_map<SequenceId, Pages> start_pages;
    for (const SequenceId id : slots_) start_pages[id] = PagesOf(id);
    for (;;) {
      const CommitState before = f_.Capture();
      absl::StatusOr<StepResult> result =
          fault_sweep ? CommitWithFaults(draft, before)
                      : CommitAgainstCalls(draft, before);
      if (result.ok()) {
        Verify(draft, start_pages, *result);
        return;
      }
      REQUIRE_STATUS_IS(result, kResourceExhausted);
      REQUIRE(f_.Capture() == before);
      REQUIRE_OK(f_.commit->CheckInvariants());
      ++counters_.exhausted;
      REQUIRE(Shrink(draft));
    }
  }

  const RunCounters& counters() const { return counters_; }
  const BlockManager& manager() const { return *f_.manager; }

 private:
  int64_t Between(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }
  bool Chance(double p) { return std::bernoulli_distribution(p)(rng_); }

  Tokens RandomTokens(int64_t n, TokenId vocabulary) {
    Tokens tokens(static_cast<size_t>(n));
    for (TokenId& token : tokens) {
      token = static_cast<TokenId>(Between(0, vocabulary - 1));
    }
    return tokens;
  }

  // A shared prefix plus a random suffix: at most 5 of the 6 pages.
  Tokens RandomPrompt() {
    Tokens prompt = prefixes_[Between(0, prefixes_.size() - 1)];
    const Tokens suffix = RandomTokens(Between(0, 2 * page_size_), 1000);
    prompt.insert(prompt.end(), suffix.begin(), suffix.end());
    return prompt;
  }

  Pages PagesOf(SequenceId id) const {
    auto pages = f_.manager->Pages(id);
    REQUIRE_OK(pages);
    return {pages->begin(), pages->end()};
  }

  bool Leaves(const Draft& draft, SequenceId id) const {
    return std::find(draft.finished.begin(), draft.finished.end(), id) !=
               draft.finished.end() ||
           std::find(draft.preempted.begin(), draft.preempted.end(), id) !=
               draft.preempted.end();
  }

  const DraftJoin* FindJoin(const Draft& draft, SequenceId id) const {
    for (const DraftJoin& join : draft.joins) {
      if (join.id == id) return &join;
    }
    return nullptr;
  }

  Draft DraftStep() {
    Draft draft;
    draft.appends.resize(slots_.size());
    draft.chunks.resize(slots_.size());
    if (Chance(0.5)) draft.drafts.assign(slots_.size(), 0);
    std::vector<SequenceId> parents;  // fork candidates.
    for (size_t slot = 0; slot < slots_.size(); ++slot) {
      const SequenceId id = slots_[slot];
      const int64_t room = capacity_ - static_cast<int64_t>(tokens_[id].size());
      const double r = std::uniform_real_distribution<double>(0, 1)(rng_);
      const Tokens& rest = prompt_rest_[id];
      if ((room == 0 && rest.empty()) || r < 0.06) {
        draft.finished.push_back(id);
      } else if (r < 0.08) {
        draft.preempted.push_back(id);
      } else if (!rest.empty()) {
        // Chunked prefill: the next 1 to 2 pages' worth of its prompt.
        const int64_t n = std::min<int64_t>(Between(1, 2 * page_size_),
                                            static_cast<int64_t>(rest.size()));
        draft.chunks[slot].assign(rest.begin(), rest.begin() + n);
      } else {
        // A fork shares pages as they were at the start of the step: its
        // parent holds no drafts then.
        if (drafts_[id] == 0) parents.push_back(id);
        // Mostly one token (decode), sometimes several (accepted drafts),
        // rarely none; a small vocabulary makes forks fill identical pages.
        if (r >= 0.12) {
          const int64_t n = Chance(0.6) ? 1 : Between(2, 6);
          draft.appends[slot] = RandomTokens(std::min(n, room), 8);
        }
        if (!draft.drafts.empty()) {
          const int64_t left =
              room - static_cast<int64_t>(draft.appends[slot].size());
          draft.drafts[slot] = static_cast<int32_t>(
              std::min<int64_t>(Chance(0.3) ? 0 : Between(1, 5), left));
        }
      }
    }
    const int64_t max_batch = f_.table->max_batch();
    const int64_t staying = static_cast<int64_t>(
        slots_.size() - draft.finished.size() - draft.preempted.size());
    const int64_t joins = Between(0, std::min<int64_t>(3, max_batch - staying));
    for (int64_t i = 0; i < joins; ++i) {
      DraftJoin join;
      const double r = std::uniform_real_distribution<double>(0, 1)(rng_);
      if (r < 0.25 && !waiting_.empty()) {
        join.id = waiting_.front().first;
        join.tokens = std::move(waiting_.front().second);
        join.base = join.tokens;
        join.rejoin = true;
        join.prefilled = true;
        waiting_.pop_front();
      } else if (r < 0.6 && !parents.empty()) {
        join.id = next_id_++;
        join.fork_of = parents[Between(0, parents.size() - 1)];
        const DraftJoin* parent = FindJoin(draft, join.fork_of);
        // A prompt joined with part of its tokens cannot be forked yet.
        if (parent != nullptr &&
            parent->prefill != std::numeric_limits<int64_t>::max()) {
          continue;
        }
        join.base = parent != nullptr ? parent->base : tokens_[join.fork_of];
        join.prefilled = parent != nullptr && parent->prefilled;
        const int64_t room = capacity_ - static_cast<int64_t>(join.base.size());
        // BatchCommit refuses a fork that appends in the step its parent
        // joins: a copy of the parent's partial page would run before this
        // step's prefill has written it.
        const bool hazard = parent != nullptr;
        if (room > 0 && !hazard && Chance(0.5)) {
          join.tokens = RandomTokens(std::min<int64_t>(Between(1, 3), room), 8);
        }
      } else {
        join.id = next_id_++;
        join.tokens = RandomPrompt();
        join.base = join.tokens;  // a first chunk: cut after the commit.
        join.prefilled = true;
        if (Chance(0.3)) join.prefill = Between(1, 2 * page_size_);
      }
      parents.push_back(join.id);
      draft.joins.push_back(std::move(join));
    }
    return draft;
  }

  // Drops the joins that are `removed` or fork a removed sequence
  // (transitively); recomputed sequences go back to the front of the queue.
  void DropJoins(Draft& draft, absl::flat_hash_set<SequenceId> removed) {
    std::vector<DraftJoin> kept;
    std::vector<DraftJoin> requeue;
    for (DraftJoin& join : draft.joins) {
      if (removed.contains(join.id) || removed.contains(join.fork_of)) {
        removed.insert(join.id);
        if (join.rejoin) requeue.push_back(std::move(join));
      } else {
        kept.push_back(std::move(join));
      }
    }
    draft.joins = std::move(kept);
    for (auto it = requeue.rbegin(); it != requeue.rend(); ++it) {
      waiting_.emplace_front(it->id, std::move(it->base));
    }
  }

  // After a refused step: preempts the most recently joined running
  // sequence, or drops the last join. False when nothing is left to shrink.
  bool Shrink(Draft& draft) {
    SlotId last = kNoSlot;
    for (SlotId slot = 0; slot < static_cast<SlotId>(slots_.size()); ++slot) {
      if (!Leaves(draft, slots_[slot])) last = slot;
    }
    if (!draft.joins.empty() && (last == kNoSlot || Chance(0.3))) {
      DropJoins(draft, {draft.joins.back().id});
      return true;
    }
    if (last == kNoSlot) return false;
    const SequenceId id = slots_[last];
    draft.appends[last].clear();
    draft.chunks[last].clear();
    if (!draft.drafts.empty()) draft.drafts[last] = 0;
    draft.preempted.push_back(id);
    DropJoins(draft, {id});
    return true;
  }

  // Pages the appends (and then drafts) of a sequence holding `held` tokens
  // in `pages` pages may allocate, a copy of its partial page included.
  int64_t AppendPages(int64_t held, int64_t pages, int64_t appended,
                      int64_t drafts = 0) const {
    if (appended + drafts == 0) return 0;
    const int64_t after =
        (held + appended + drafts + page_size_ - 1) / page_size_;
    return std::max<int64_t>(0, after - pages) +
           (held % page_size_ != 0 ? 1 : 0);
  }

  // Shrinks `draft` until an upper bound of the pages it allocates fits in
  // the allocatable pages (so only injected faults can fail it).
  void FitToPool(Draft& draft) {
    for (;;) {
      int64_t needed = 0;
      for (size_t slot = 0; slot < slots_.size(); ++slot) {
        const SequenceId id = slots_[slot];
        const int64_t pages = static_cast<int64_t>(PagesOf(id).size());
        needed += AppendPages(tokens_[id].size(), pages,
                              draft.appends[slot].size() +
                                  (f_.manager->options().reserve_prompt_pages
                                       ? 0
                                       : draft.chunks[slot].size()),
                              draft.drafts.empty() ? 0 : draft.drafts[slot]);
      }
      for (const DraftJoin& join : draft.joins) {
        needed +=
            join.fork_of == kNoSequence
                ? (join.tokens.size() + page_size_ - 1) / page_size_
                : AppendPages(join.base.size(),
                              (join.base.size() + page_size_ - 1) / page_size_,
                              join.tokens.size());
      }
      if (needed <= f_.manager->NumAllocatable() -
                        f_.manager->options().watermark_pages) {
        return;
      }
      REQUIRE(Shrink(draft));
    }
  }

  // Commits `draft`, having run it as the manager's own calls, one at a
  // time (then undone): the commit accepts it exactly when they do, and
  // leaves the very pages, cache and counters they leave.
  absl::StatusOr<StepResult> CommitAgainstCalls(Draft& draft,
                                                const CommitState& before) {
    const StepPlan plan = draft.View(slots_);
    const testing::CallByCall by_call =
        testing::TryCallByCall(*f_.manager, slots_, plan);
    REQUIRE(f_.Capture() == before);
    absl::StatusOr<StepResult> result = f_.commit->Commit(plan);
    INFO("one call at a time: " << by_call.status.ToString());
    REQUIRE(result.ok() == by_call.status.ok());
    if (!result.ok()) return result;
    // Except one counter where drafts follow appends: the commit allocates
    // a sequence's draft pages before it files the pages its tokens filled,
    // as vLLM's allocate_slots does, while Append files them before
    // SetDrafts allocates. An eviction for the drafts may then uncache a key
    // a filled page has, so that the commit stores it anew where Append
    // found it cached (cache_registrations).
    BlockManagerSnapshot expected = by_call.after;
    const BlockManagerSnapshot now = f_.manager->Snapshot();
    if (!plan.draft_counts.empty()) {
      expected.pool.stats.cache_registrations =
          now.pool.stats.cache_registrations;
    }
    REQUIRE(now == expected);
    return result;
  }

  // Commits `draft` with the n-th injection site failing, n = 1, 2, ...,
  // until it succeeds; every failure must leave the state `before`.
  absl::StatusOr<StepResult> CommitWithFaults(Draft& draft,
                                              const CommitState& before) {
    // More sites than any step of this scheduler has: a step still failing
    // here fails for another reason.
    constexpr int64_t kMaxSites = 10000;
    for (int64_t n = 1; n <= kMaxSites; ++n) {
      CAPTURE(n);
      internal::FaultInjection::FailNth(n);
      absl::StatusOr<StepResult> result = f_.commit->Commit(draft.View(slots_));
      internal::FaultInjection::Disarm();
      if (result.ok()) return result;
      INFO(result.status().ToString());
      REQUIRE(f_.Capture() == before);
      REQUIRE_OK(f_.commit->CheckInvariants());
      ++counters_.injected;
    }
    FAIL("the step still fails with no fault left to inject");
    return absl::InternalError("unreachable");
  }

  // Checks a committed step against the model, then advances the model.
  void Verify(const Draft& draft,
              const absl::flat_hash_map<SequenceId, Pages>& start_pages,
              const StepResult& result) {
    // Slots: survivors below the survivor count stay; each hole there takes
    // the last surviving row; joins follow.
    std::vector<SlotId> old_to_new(f_.table->max_batch(), kNoSlot);
    size_t survivors = 0;
    for (const SequenceId id : slots_) survivors += Leaves(draft, id) ? 0 : 1;
    std::vector<SequenceId> next_slots(survivors);
    for (size_t slot = 0, tail = slots_.size(); slot < survivors; ++slot) {
      size_t from = slot;
      if (Leaves(draft, slots_[slot])) {
        do {
          --tail;
        } while (Leaves(draft, slots_[tail]));
        from = tail;
      }
      old_to_new[from] = static_cast<SlotId>(slot);
      next_slots[slot] = slots_[from];
    }
    for (const DraftJoin& join : draft.joins) next_slots.push_back(join.id);
    REQUIRE(result.batch == static_cast<int32_t>(next_slots.size()));
    REQUIRE(std::vector<SlotId>(result.old_to_new.begin(),
                                result.old_to_new.end()) == old_to_new);
    REQUIRE(std::vector<SequenceId>(f_.commit->slots().begin(),
                                    f_.commit->slots().end()) == next_slots);

    // Per new slot: the pages and tokens it held before appending (a fork
    // holds its parent's as they were after the parent joined), what it
    // appended (tokens or a prompt chunk), and the drafts it holds after.
    const size_t batch = next_slots.size();
    std::vector<Pages> base_pages(batch);
    std::vector<Tokens> base_tokens(batch);
    std::vector<Tokens> appended(batch);
    std::vector<int32_t> drafts_after(batch, 0);
    std::vector<uint8_t> chunked(batch, 0);
    absl::flat_hash_map<SequenceId, size_t> new_slot_of;
    for (size_t slot = 0; slot < slots_.size(); ++slot) {
      const SequenceId id = slots_[slot];
      if (Leaves(draft, id)) continue;
      const size_t s = static_cast<size_t>(old_to_new[slot]);
      base_pages[s] = start_pages.at(id);
      base_tokens[s] = tokens_[id];
      const bool chunk = !draft.chunks[slot].empty();
      chunked[s] = chunk;
      appended[s] = chunk ? draft.chunks[slot] : draft.appends[slot];
      drafts_after[s] =
          !draft.drafts.empty()
              ? draft.drafts[slot]
              : static_cast<int32_t>(std::max<int64_t>(
                    0, drafts_[id] - static_cast<int64_t>(appended[s].size())));
      new_slot_of[id] = s;
    }
    for (size_t j = 0; j < draft.joins.size(); ++j) {
      const DraftJoin& join = draft.joins[j];
      const size_t s = survivors + j;
      new_slot_of[join.id] = s;
      base_tokens[s] = join.base;
      if (join.fork_of == kNoSequence) {
        // A first chunk: the hits and at most `prefill` tokens after them.
        const int64_t held = *f_.manager->NumTokens(join.id);
        const int64_t size = static_cast<int64_t>(join.tokens.size());
        REQUIRE(held <= size);
        REQUIRE(held >= std::min(join.prefill, size));
        REQUIRE((held == size ||
                 (held - std::min(join.prefill, held)) % page_size_ == 0));
        if (held < size) ++counters_.first_chunks;
        base_tokens[s].resize(held);
        base_pages[s] = PagesOf(join.id);
      } else {
        base_pages[s] = base_pages[new_slot_of.at(join.fork_of)];
        appended[s] = join.tokens;
        ++counters_.forks;
      }
    }

    // Copy-on-write, predicted: in append order (survivors by old slot, then
    // joins), a sequence writing into a partial page that another sequence
    // still holds (appending to it, or taking draft slots there) gets a copy
    // of it (and stops holding it). Changed rows, in the order the commit
    // rewrites them: survivors' appends and drafts by old slot, their prompt
    // chunks, then joins.
    std::vector<size_t> append_order;
    for (size_t slot = 0; slot < slots_.size(); ++slot) {
      if (!Leaves(draft, slots_[slot])) {
        append_order.push_back(old_to_new[slot]);
      }
    }
    for (size_t s = survivors; s < batch; ++s) append_order.push_back(s);
    absl::flat_hash_map<PageId, int32_t> holders;
    for (const Pages& pages : base_pages) {
      for (const PageId page : pages) ++holders[page];
    }
    std::vector<PageCopy> copies;
    int64_t draft_copies = 0;
    std::vector<SlotId> changed;
    std::vector<SlotId> changed_chunks;
    std::vector<Pages> final_pages(batch);
    for (const size_t s : append_order) {
      CAPTURE(next_slots[s]);
      final_pages[s] = PagesOf(next_slots[s]);
      const Pages& base = base_pages[s];
      const Pages& now = final_pages[s];
      const int64_t held = static_cast<int64_t>(base_tokens[s].size());
      const int64_t after = held + static_cast<int64_t>(appended[s].size());
      REQUIRE(!base.empty());
      REQUIRE(static_cast<int64_t>(now.size()) ==
              (after + drafts_after[s] + page_size_ - 1) / page_size_);
      // The partial page (if any) may be copied; the others stay.
      const size_t partial = static_cast<size_t>(held / page_size_);
      for (size_t i = 0; i < std::min(base.size(), now.size()); ++i) {
        if (i != partial) REQUIRE(now[i] == base[i]);
      }
      const bool writes = !appended[s].empty() || drafts_after[s] > 0;
      const bool copied =
          writes && held % page_size_ != 0 && holders[base[partial]] > 1;
      if (copied) {
        --holders[base[partial]];
        REQUIRE(now[partial] != base[partial]);
        copies.push_back({base[partial], now[partial]});
        if (appended[s].empty()) ++draft_copies;
      } else if (partial < std::min(base.size(), now.size())) {
        REQUIRE(now[partial] == base[partial]);
      }
      if (s >= survivors || now != base) {
        (chunked[s] ? changed_chunks : changed)
            .push_back(static_cast<SlotId>(s));
      }
      if (now.size() < base.size()) ++counters_.draft_releases;
    }
    std::vector<SlotId> survivors_changed;
    std::vector<SlotId> joins_changed;
    for (const SlotId s : changed) {
      (s >= static_cast<SlotId>(survivors) ? joins_changed : survivors_changed)
          .push_back(s);
    }
    changed = survivors_changed;
    changed.insert(changed.end(), changed_chunks.begin(), changed_chunks.end());
    changed.insert(changed.end(), joins_changed.begin(), joins_changed.end());
    REQUIRE(std::vector<PageCopy>(result.copies.begin(), result.copies.end()) ==
            copies);
    REQUIRE(result.draft_copies == draft_copies);
    REQUIRE(std::vector<SlotId>(result.changed_slots.begin(),
                                result.changed_slots.end()) == changed);
    counters_.copies += static_cast<int64_t>(copies.size());
    counters_.draft_copies += draft_copies;

    // The kernels: copies first (reading the content before the step), then
    // the step's KV writes: tokens, then drafts. A prompt writes every page
    // but the prefix hits held by running sequences; its other hits must
    // hold the same tokens.
    absl::flat_hash_set<PageId> held_by_survivors;
    for (size_t s = 0; s < survivors; ++s) {
      held_by_survivors.insert(base_pages[s].begin(), base_pages[s].end());
    }
    for (const PageCopy& copy : copies) {
      std::copy_n(content_.begin() + Offset(copy.source), page_size_,
                  content_.begin() + Offset(copy.destination));
    }
    for (size_t s = 0; s < batch; ++s) {
      const bool prompt =
          s >= survivors && draft.joins[s - survivors].fork_of == kNoSequence;
      if (prompt) {
        for (size_t t = 0; t < base_tokens[s].size(); ++t) {
          const PageId page = final_pages[s][t / page_size_];
          if (held_by_survivors.contains(page)) continue;
          content_[Offset(page) + t % page_size_] = base_tokens[s][t];
        }
        continue;
      }
      const size_t held = base_tokens[s].size();
      for (size_t i = 0; i < appended[s].size(); ++i) {
        const size_t t = held + i;
        content_[Offset(final_pages[s][t / page_size_]) + t % page_size_] =
            appended[s][i];
      }
      if (draft.drafts.empty()) continue;
      for (int32_t i = 0; i < drafts_after[s]; ++i) {
        const size_t t = held + appended[s].size() + i;
        content_[Offset(final_pages[s][t / page_size_]) + t % page_size_] =
            kDraftKv;
      }
      counters_.drafts += drafts_after[s];
    }

    // Advance the model.
    for (const SequenceId id : draft.finished) {
      tokens_.erase(id);
      prompt_rest_.erase(id);
      drafts_.erase(id);
    }
    for (const SequenceId id : draft.preempted) {
      // Recomputed from its whole prompt and what it generated.
      Tokens all = std::move(tokens_[id]);
      const Tokens& rest = prompt_rest_[id];
      all.insert(all.end(), rest.begin(), rest.end());
      waiting_.emplace_back(id, std::move(all));
      tokens_.erase(id);
      prompt_rest_.erase(id);
      drafts_.erase(id);
    }
    for (size_t s = 0; s < batch; ++s) {
      const SequenceId id = next_slots[s];
      if (s >= survivors) {
        const DraftJoin& join = draft.joins[s - survivors];
        prompt_rest_[id] =
            join.fork_of == kNoSequence
                ? Tokens(join.tokens.begin() + base_tokens[s].size(),
                         join.tokens.end())
                : Tokens();
      } else if (chunked[s]) {
        Tokens& rest = prompt_rest_[id];
        rest.erase(rest.begin(), rest.begin() + appended[s].size());
        ++counters_.chunks;
      }
      Tokens& tokens = tokens_[id];
      tokens = std::move(base_tokens[s]);
      tokens.insert(tokens.end(), appended[s].begin(), appended[s].end());
      drafts_[id] = drafts_after[s];
    }
    slots_ = std::move(next_slots);

    REQUIRE(CheckModel() == "");
    REQUIRE_OK(f_.commit->CheckInvariants());
    REQUIRE_OK(f_.UploadAndCheck());
  }

  size_t Offset(PageId page) const {
    return static_cast<size_t>(page) * page_size_;
  }

  // "" when every running sequence holds its model tokens: the right number
  // of tokens and pages, the content of its pages, and pages shared only at
  // the same position with the same tokens.
  std::string CheckModel() const {
    std::vector<int64_t> first_token(content_.size() / page_size_, -1);
    std::vector<int64_t> valid(first_token.size(), -1);
    for (const SequenceId id : slots_) {
      const Tokens& tokens = tokens_.at(id);
      auto held = f_.manager->NumTokens(id);
      if (!held.ok() || *held != static_cast<int64_t>(tokens.size())) {
        return absl::StrCat("sequence ", id, " holds ", held.value_or(-1),
                            " tokens, the model ", tokens.size());
      }
      const Pages pages = PagesOf(id);
      const int64_t n = static_cast<int64_t>(tokens.size());
      const int64_t drafts = drafts_.at(id);
      if (static_cast<int64_t>(pages.size()) !=
              (n + drafts + page_size_ - 1) / page_size_ ||
          *f_.manager->NumDrafts(id) != drafts ||
          *f_.manager->PromptTokensLeft(id) !=
              static_cast<int64_t>(prompt_rest_.at(id).size())) {
        return absl::StrCat("sequence ", id, " has ", pages.size(),
                            " pages for ", n, " tokens and ", drafts,
                            " drafts, ", prompt_rest_.at(id).size(),
                            " prompt tokens left");
      }
      for (size_t i = 0; i < pages.size(); ++i) {
        const PageId page = pages[i];
        const int64_t first = static_cast<int64_t>(i) * page_size_;
        const int64_t live =
            std::max<int64_t>(0, std::min<int64_t>(page_size_, n - first));
        if (first_token[page] == -1) {
          first_token[page] = first;
          valid[page] = live;
        } else if (first_token[page] != first || valid[page] != live) {
          return absl::StrCat("page ", page, " is shared at token ", first,
                              " with ", live, " live tokens and at token ",
                              first_token[page], " with ", valid[page]);
        }
        for (int64_t o = 0; o < live; ++o) {
          if (content_[Offset(page) + o] != tokens[first + o]) {
            return absl::StrCat(
                "sequence ", id, " token ", first + o, " in page ", page,
                " reads ", content_[Offset(page) + o], ", expected ",
                tokens[first + o], "; tokens [", absl::StrJoin(tokens, ","),
                "], pages [", absl::StrJoin(pages, ","), "]");
          }
        }
      }
    }
    return "";
  }

  CommitFixture f_;
  std::mt19937_64 rng_;
  const int32_t page_size_;
  const int64_t capacity_;  // tokens one sequence may hold.
  std::vector<Tokens> prefixes_;

  // The model: running sequences in slot order with their tokens, the queue
  // of preempted sequences to recompute, and what each page holds.
  std::vector<SequenceId> slots_;
  absl::flat_hash_map<SequenceId, Tokens> tokens_;
  absl::flat_hash_map<SequenceId, Tokens> prompt_rest_;  // chunks to come.
  absl::flat_hash_map<SequenceId, int32_t> drafts_;
  std::deque<std::pair<SequenceId, Tokens>> waiting_;
  std::vector<TokenId> content_;  // [page][offset].
  SequenceId next_id_ = 0;

  RunCounters counters_;
};

TEST_CASE("random continuous batching matches the model after every step") {
  const RunConfig run =
      GENERATE(RunConfig{.seed = 1},
               RunConfig{.seed = 2, .num_pages = 22, .watermark_pages = 2},
               RunConfig{.seed = 3, .page_size = 2, .num_pages = 24},
               RunConfig{.seed = 4, .prefix_caching = false},
               RunConfig{.seed = 5, .reserve_prompt_pages = false});
  constexpr int64_t kSteps = testing::RandomRunLength(10000);
  CAPTURE(run.seed);
  Scheduler scheduler(run);
  for (int64_t step = 0; step < kSteps; ++step) {
    CAPTURE(step);
    scheduler.Step(/*fault_sweep=*/false);
  }
  // The run covered what it is meant to (in proportion to its length).
  using testing::RandomRunLength;
  const RunCounters& counters = scheduler.counters();
  const BlockManagerStats stats = scheduler.manager().stats();
  REQUIRE(counters.exhausted >= RandomRunLength(100));
  REQUIRE(counters.copies >= RandomRunLength(100));
  REQUIRE(counters.draft_copies >= RandomRunLength(20));
  REQUIRE(counters.forks >= RandomRunLength(500));
  REQUIRE(counters.first_chunks >= RandomRunLength(200));
  REQUIRE(counters.chunks >= RandomRunLength(200));
  REQUIRE(counters.drafts >= RandomRunLength(1000));
  REQUIRE(counters.draft_releases >= RandomRunLength(100));
  REQUIRE(stats.preemptions >= RandomRunLength(100));
  REQUIRE(stats.evictions >= (run.prefix_caching ? RandomRunLength(100) : 0));
  REQUIRE(stats.prefix_hit_tokens >=
          (run.prefix_caching ? RandomRunLength(1000) : 0));
}

TEST_CASE(
    "a fault at every site of every step of a random run is rolled back") {
  const RunConfig run =
      GENERATE(RunConfig{.seed = 11}, RunConfig{.seed = 12, .page_size = 2});
  constexpr int64_t kSteps = 300;
  CAPTURE(run.seed);
  Scheduler scheduler(run);
  for (int64_t step = 0; step < kSteps; ++step) {
    CAPTURE(step);
    scheduler.Step(/*fault_sweep=*/true);
  }
  REQUIRE(scheduler.counters().injected >= kSteps);
}

}  // namespace
}  // namespace kvblock
