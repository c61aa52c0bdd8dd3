// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Model-based randomized test of BlockManager: seeded random scheduler calls
// (admissions drawn from a few shared prompt prefixes, salts and adapters,
// whole or in chunks, reserving the rest of the prompt or not; prompt
// chunks; appends; drafts, accepted in part or rejected; forks; frees;
// preemptions; step transactions that are committed or rolled back;
// prefix-cache resets) run on a real manager and on a trivially correct
// model (vectors and std::maps, linear scans), and after every call:
//   - CheckInvariants() is OK;
//   - the manager's Snapshot() equals the model's: refcounts, free-stack and
//     LRU order, cached pages and their hashes, every sequence's pages,
//     tokens and chain hash, and all stats; plans and append results match;
//   - a failing call left Snapshot() as it was (strong guarantee), and a
//     rolled-back step restores the Snapshot() taken before BeginStep();
//   - a page held by two sequences holds the same content for both: same
//     logical position, salt, adapter and tokens up to the end of the page;
//   - pages in use equal the distinct pages the live sequences hold;
//   - every cached page's hash is the hash chain of the verified tokens it
//     was registered with, recomputed here (no draft reaches the cache).
// The model's prefix cache is keyed by content (salt, adapter, every token up
// to the end of the page), not by hash: a hit happens exactly when that
// content was registered (behind a cached parent) and some page holding it
// is still cached. The model computes block hashes only to compare them with
// the manager's.
#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kvblock/block_hash.h"
#include "kvblock/block_manager.h"
#include "kvblock/config.h"
#include "manager/block_manager_test_util.h"
#include "pool_test_util.h"
#include "test_util.h"

namespace Catch {
template <>
struct StringMaker<kvblock::BlockManagerSnapshot::SequenceState> {
  static std::string convert(
      const kvblock::BlockManagerSnapshot::SequenceState& s) {
    return absl::StrCat("{id ", s.id, " pages [", absl::StrJoin(s.pages, " "),
                        "] tokens ", s.num_tokens, " of prompt ",
                        s.prompt_tokens, " drafts ", s.drafts, " partial [",
                        absl::StrJoin(s.partial_tokens, " "), "] salt '",
                        s.cache_salt, "' adapter ", s.adapter_id, "}");
  }
};
template <>
struct StringMaker<kvblock::BlockManagerStats> {
  static std::string convert(const kvblock::BlockManagerStats& s) {
    return absl::StrCat(
        "{admitted ", s.admitted, " forks ", s.forks, " freed ", s.freed,
        " preemptions ", s.preemptions, " prompt_tokens ", s.prompt_tokens,
        " prefix_hit_tokens ", s.prefix_hit_tokens, " prompt_chunks ",
        s.prompt_chunks, " appended_tokens ", s.appended_tokens,
        " draft_slots ", s.draft_slots, " cow_copies ", s.cow_copies,
        " evictions ", s.evictions, " pages_in_use ", s.pages_in_use, " peak ",
        s.peak_pages_in_use, "}");
  }
};
}  // namespace Catch

namespace kvblock {
namespace {

using Code = absl::StatusCode;

// What a full page holds: its salt, adapter and every token of the sequence
// up to the end of the page.
struct ContentKey {
  std::string salt;
  int64_t adapter = 0;
  std::vector<TokenId> tokens;
  friend auto operator<=>(const ContentKey&, const ContentKey&) = default;
};

struct ModelSequence {
  std::vector<TokenId> tokens;  // verified: scheduled prompt, appended.
  std::vector<TokenId> prompt;  // the whole prompt.
  std::string salt;
  int64_t adapter = 0;
  std::vector<PageId> pages;      // of the tokens, then of the drafts.
  std::vector<BlockHash> hashes;  // Of the full pages (prefix caching only).
  int32_t drafts = 0;
  bool reserves = false;
  int64_t prompt_left() const {
    return std::max<int64_t>(0, static_cast<int64_t>(prompt.size()) -
                                    static_cast<int64_t>(tokens.size()));
  }
};

struct ModelPlan {
  Code code = Code::kOk;
  AdmissionPlan plan;
  std::vector<PageId> hits;
  std::vector<ContentKey> keys;   // Of the prompt's full pages.
  std::vector<BlockHash> hashes;  // Of the prompt's full pages.
};

// The reference manager. Each mutating method returns the status code the
// real manager must return and, on error, leaves the model unchanged.
// Copyable: a step is modelled by saving a copy.
class Model {
 public:
  Model(const PagedKvConfig& config, const BlockManagerOptions& options,
        BlockHasher& hasher)
      : config_(config),
        options_(options),
        hasher_(&hasher),
        refcount_(config.num_pages, 0) {
    for (PageId page = config.num_pages - 1; page >= 0; --page) {
      free_stack_.push_back(page);
    }
  }

  const std::map<SequenceId, ModelSequence>& sequences() const {
    return sequences_;
  }
  int32_t NumFree() const {
    return static_cast<int32_t>(free_stack_.size() + lru_.size());
  }
  int32_t NumUsed() const { return config_.num_pages - NumFree(); }
  int32_t NumAllocatable() const { return NumFree() - reserved_; }
  int32_t reserved() const { return reserved_; }

  // The pages `sequence` still has reserved for its prompt.
  int32_t ReservationOf(const ModelSequence& sequence) const {
    if (!sequence.reserves) return 0;
    const int64_t prompt_pages =
        (static_cast<int64_t>(sequence.prompt.size()) + config_.page_size - 1) /
        config_.page_size;
    return static_cast<int32_t>(std::max<int64_t>(
        0, prompt_pages - static_cast<int64_t>(sequence.pages.size())));
  }

  ModelPlan Plan(const std::vector<TokenId>& prompt, const std::string& salt,
                 int64_t adapter, const AdmitOptions& admit = {}) const {
    ModelPlan result;
    const int32_t page_size = config_.page_size;
    const int64_t length = static_cast<int64_t>(prompt.size());
    if (prompt.empty() || admit.prefill_tokens < 1) {
      result.code = Code::kInvalidArgument;
      return result;
    }
    const int64_t pages = (length + page_size - 1) / page_size;
    if (pages > config_.max_pages_per_seq) {
      result.code = Code::kOutOfRange;
      return result;
    }
    if (options_.enable_prefix_caching) {
      BlockHash parent = hasher_->RootHash({salt, adapter});
      for (int64_t i = 0; i < length / page_size; ++i) {
        const auto end = prompt.begin() + (i + 1) * page_size;
        result.keys.push_back({salt, adapter, {prompt.begin(), end}});
        parent = hasher_->HashPage(parent, absl::MakeConstSpan(prompt).subspan(
                                               i * page_size, page_size));
        result.hashes.push_back(parent);
      }
      // The last prompt token is always computed: at most (length - 1) /
      // page_size pages can hit.
      const int64_t max_hits =
          admit.read_prefix_cache ? (length - 1) / page_size : 0;
      for (int64_t i = 0; i < max_hits; ++i) {
        const auto it = index_.find(result.keys[i]);
        if (it == index_.end()) break;
        const PageId page = it->second.front();
        result.hits.push_back(page);
        if (refcount_[page] == 0) ++result.plan.revived_pages;
      }
    }
    result.plan.hit_pages = static_cast<int32_t>(result.hits.size());
    result.plan.hit_tokens = int64_t{result.plan.hit_pages} * page_size;
    result.plan.computed_tokens =
        std::min(admit.prefill_tokens, length - result.plan.hit_tokens);
    const int64_t end = result.plan.hit_tokens + result.plan.computed_tokens;
    const int64_t end_pages = (end + page_size - 1) / page_size;
    result.plan.new_pages =
        static_cast<int32_t>(end_pages) - result.plan.hit_pages;
    if (options_.reserve_prompt_pages) {
      result.plan.reserved_pages = static_cast<int32_t>(pages - end_pages);
    }
    return result;
  }

  bool CanAdmit(const ModelPlan& plan) const {
    return plan.code == Code::kOk &&
           plan.plan.pages_consumed() + plan.plan.reserved_pages <=
               NumAllocatable() - options_.watermark_pages;
  }

  Code Admit(SequenceId id, const std::vector<TokenId>& prompt,
             const std::string& salt, int64_t adapter, ModelPlan& out,
             const AdmitOptions& admit = {}) {
    if (sequences_.contains(id)) return Code::kAlreadyExists;
    out = Plan(prompt, salt, adapter, admit);
    if (out.code != Code::kOk) return out.code;
    if (!CanAdmit(out)) return Code::kResourceExhausted;
    const int64_t end = out.plan.hit_tokens + out.plan.computed_tokens;
    const size_t full = static_cast<size_t>(end / config_.page_size);
    ModelSequence& sequence = sequences_[id];
    sequence.tokens.assign(prompt.begin(), prompt.begin() + end);
    sequence.prompt = prompt;
    sequence.salt = salt;
    sequence.adapter = adapter;
    sequence.reserves = out.plan.reserved_pages > 0;
    reserved_ += out.plan.reserved_pages;
    for (const PageId page : out.hits) {
      if (refcount_[page] == 0) {
        lru_.erase(std::find(lru_.begin(), lru_.end(), page));
        ++pool_stats_.cache_revivals;
      }
      ++refcount_[page];
      NoteUsed();
      ++pool_stats_.cache_hits;
      sequence.pages.push_back(page);
    }
    for (int32_t i = 0; i < out.plan.new_pages; ++i) {
      sequence.pages.push_back(AllocateOne());
    }
    for (size_t i = out.hits.size(); i < std::min(full, out.keys.size()); ++i) {
      Register(sequence.pages[i], out.keys[i], out.hashes[i]);
    }
    sequence.hashes.assign(
        out.hashes.begin(),
        out.hashes.begin() +
            static_cast<std::ptrdiff_t>(std::min(full, out.hashes.size())));
    ++stats_.admitted;
    stats_.prompt_tokens += static_cast<int64_t>(prompt.size());
    stats_.prefix_hit_tokens += out.plan.hit_tokens;
    return Code::kOk;
  }

  // What allocations for `sequence` may take: the others' reservations
  // stay.
  int64_t AllocatableFor(const ModelSequence& sequence) const {
    return int64_t{NumFree()} - reserved_ + ReservationOf(sequence);
  }

  // Append, or with `prompt_chunk` AppendPrompt (the hashes are right, or
  // checked by the caller).
  Code Append(SequenceId id, const std::vector<TokenId>& tokens,
              AppendResult& result, bool prompt_chunk = false) {
    const auto it = sequences_.find(id);
    if (it == sequences_.end()) return Code::kNotFound;
    ModelSequence& sequence = it->second;
    if (prompt_chunk && (tokens.empty() || static_cast<int64_t>(tokens.size()) >
                                               sequence.prompt_left())) {
      return Code::kInvalidArgument;
    }
    if (tokens.empty()) return Code::kOk;
    if (!prompt_chunk && sequence.prompt_left() > 0) {
      return Code::kFailedPrecondition;
    }
    const int32_t page_size = config_.page_size;
    const int64_t length =
        static_cast<int64_t>(sequence.tokens.size() + tokens.size());
    const int64_t pages = (length + page_size - 1) / page_size;
    if (pages > config_.max_pages_per_seq) return Code::kOutOfRange;
    const size_t partial = sequence.tokens.size() / page_size;
    const bool copy = sequence.tokens.size() % page_size != 0 &&
                      refcount_[sequence.pages[partial]] > 1;
    const int64_t needed =
        std::max<int64_t>(0,
                          pages - static_cast<int64_t>(sequence.pages.size())) +
        (copy ? 1 : 0);
    if (needed > AllocatableFor(sequence)) return Code::kResourceExhausted;
    const int32_t reserved_before = ReservationOf(sequence);
    if (copy) CopyOnWrite(sequence, partial, result);
    sequence.drafts = static_cast<int32_t>(std::max<int64_t>(
        0, sequence.drafts - static_cast<int64_t>(tokens.size())));
    // Every new page is allocated before any fills (and is registered).
    while (static_cast<int64_t>(sequence.pages.size()) < pages) {
      sequence.pages.push_back(AllocateOne());
      ++result.new_pages;
    }
    for (const TokenId token : tokens) {
      sequence.tokens.push_back(token);
      if (sequence.tokens.size() % page_size != 0 ||
          !options_.enable_prefix_caching) {
        continue;
      }
      const BlockHash hash = hasher_->HashPage(
          sequence.hashes.empty()
              ? hasher_->RootHash({sequence.salt, sequence.adapter})
              : sequence.hashes.back(),
          absl::MakeConstSpan(sequence.tokens).last(page_size));
      sequence.hashes.push_back(hash);
      Register(sequence.pages[sequence.tokens.size() / page_size - 1],
               {sequence.salt, sequence.adapter, sequence.tokens}, hash);
    }
    reserved_ -= reserved_before - ReservationOf(sequence);
    if (prompt_chunk) {
      ++stats_.prompt_chunks;
    } else {
      stats_.appended_tokens += static_cast<int64_t>(tokens.size());
    }
    return Code::kOk;
  }

  Code SetDrafts(SequenceId id, int32_t count, AppendResult& result) {
    const auto it = sequences_.find(id);
    if (it == sequences_.end()) return Code::kNotFound;
    ModelSequence& sequence = it->second;
    if (count < 0) return Code::kInvalidArgument;
    if (count == sequence.drafts) return Code::kOk;
    if (count > 0 && sequence.prompt_left() > 0) {
      return Code::kFailedPrecondition;
    }
    const int32_t page_size = config_.page_size;
    const int64_t pages =
        (static_cast<int64_t>(sequence.tokens.size()) + count + page_size - 1) /
        page_size;
    if (pages > config_.max_pages_per_seq) return Code::kOutOfRange;
    const size_t partial = sequence.tokens.size() / page_size;
    const bool copy = count > 0 && sequence.drafts == 0 &&
                      sequence.tokens.size() % page_size != 0 &&
                      refcount_[sequence.pages[partial]] > 1;
    const int64_t old_pages = static_cast<int64_t>(sequence.pages.size());
    const int64_t needed =
        std::max<int64_t>(0, pages - old_pages) + (copy ? 1 : 0);
    if (needed > AllocatableFor(sequence)) return Code::kResourceExhausted;
    while (static_cast<int64_t>(sequence.pages.size()) > pages) {
      const PageId page = sequence.pages.back();
      sequence.pages.pop_back();
      REQUIRE(refcount_[page] == 1);
      REQUIRE(!cached_.contains(page));
      refcount_[page] = 0;
      free_stack_.push_back(page);
      ++result.released_pages;
    }
    if (copy) CopyOnWrite(sequence, partial, result);
    while (static_cast<int64_t>(sequence.pages.size()) < pages) {
      sequence.pages.push_back(AllocateOne());
      ++result.new_pages;
    }
    sequence.drafts = count;
    stats_.draft_slots += count;
    return Code::kOk;
  }

  Code Fork(SequenceId parent, SequenceId child) {
    const auto it = sequences_.find(parent);
    if (it == sequences_.end()) return Code::kNotFound;
    if (sequences_.contains(child)) return Code::kAlreadyExists;
    if (it->second.prompt_left() > 0 || it->second.drafts > 0) {
      return Code::kFailedPrecondition;
    }
    for (const PageId page : it->second.pages) ++refcount_[page];
    sequences_[child] = it->second;
    sequences_[child].reserves = false;
    ++stats_.forks;
    return Code::kOk;
  }

  Code Remove(SequenceId id, bool preempted) {
    const auto it = sequences_.find(id);
    if (it == sequences_.end()) return Code::kNotFound;
    reserved_ -= ReservationOf(it->second);
    const std::vector<PageId>& pages = it->second.pages;
    for (auto page = pages.rbegin(); page != pages.rend(); ++page) {
      if (--refcount_[*page] > 0) continue;
      // A second copy of cached content stays cached only while it is held.
      const auto cached = cached_.find(*page);
      if (cached != cached_.end() &&
          index_.at(cached->second.first).front() != *page) {
        Uncache(*page);
      }
      if (cached_.contains(*page)) {
        lru_.push_back(*page);
      } else {
        free_stack_.push_back(*page);
      }
    }
    sequences_.erase(it);
    ++(preempted ? stats_.preemptions : stats_.freed);
    return Code::kOk;
  }

  Code ResetPrefixCache(bool in_step) {
    if (in_step) return Code::kFailedPrecondition;
    free_stack_.insert(free_stack_.end(), lru_.begin(), lru_.end());
    lru_.clear();
    cached_.clear();
    index_.clear();
    return Code::kOk;
  }

  BlockManagerSnapshot Snapshot() const {
    BlockManagerSnapshot snapshot;
    BlockPoolSnapshot& pool = snapshot.pool;
    pool.refcounts = refcount_;
    pool.free_stack = free_stack_;
    pool.lru = lru_;
    for (const auto& [page, entry] : cached_) {
      pool.cached.emplace_back(page, entry.second);
    }
    std::map<PageId, std::vector<PageId>> rings;  // by their smallest page.
    for (const auto& [key, ring] : index_) {
      if (ring.size() > 1) {
        rings[*std::min_element(ring.begin(), ring.end())] = ring;
      }
    }
    for (auto& [first, ring] : rings) pool.duplicates.push_back(ring);
    pool.stats = pool_stats_;
    for (const auto& [id, sequence] : sequences_) {
      const size_t partial = sequence.tokens.size() % config_.page_size;
      snapshot.sequences.push_back(
          {.id = id,
           .pages = sequence.pages,
           .num_tokens = static_cast<int64_t>(sequence.tokens.size()),
           .last_full_hash =
               !sequence.hashes.empty() ? sequence.hashes.back()
               : options_.enable_prefix_caching
                   ? hasher_->RootHash({sequence.salt, sequence.adapter})
                   : BlockHash{},
           .partial_tokens = {sequence.tokens.end() - partial,
                              sequence.tokens.end()},
           .cache_salt = sequence.salt,
           .adapter_id = sequence.adapter,
           .prompt_tokens = static_cast<int64_t>(sequence.prompt.size()),
           .drafts = sequence.drafts});
    }
    snapshot.stats = stats_;
    snapshot.stats.cow_copies = pool_stats_.cow_copies;
    snapshot.stats.evictions = pool_stats_.evictions;
    snapshot.stats.pages_in_use = NumUsed();
    snapshot.stats.peak_pages_in_use = pool_stats_.peak_used;
    return snapshot;
  }

 private:
  void NoteUsed() {
    pool_stats_.peak_used = std::max(pool_stats_.peak_used, NumUsed());
  }

  // The free-stack top, else the least recently released cached page.
  // The sequence's shared page `partial` is copied: its reference moves to
  // a fresh page.
  void CopyOnWrite(ModelSequence& sequence, size_t partial,
                   AppendResult& result) {
    const PageId source = sequence.pages[partial];
    const PageId destination = AllocateOne();
    --refcount_[source];
    ++pool_stats_.cow_copies;
    sequence.pages[partial] = destination;
    result.copy = PageCopy{source, destination};
  }

  PageId AllocateOne() {
    PageId page;
    if (!free_stack_.empty()) {
      page = free_stack_.back();
      free_stack_.pop_back();
    } else {
      page = lru_.front();
      lru_.erase(lru_.begin());
      Uncache(page);
      ++pool_stats_.evictions;
    }
    refcount_[page] = 1;
    ++pool_stats_.allocations;
    NoteUsed();
    return page;
  }

  // Drops cached `page`; the next page holding its content answers.
  void Uncache(PageId page) {
    const auto it = index_.find(cached_.at(page).first);
    if (it->second.size() > 1 && it->second.front() == page) {
      ++cache_counts_.kept_by_second_copy;
    }
    std::erase(it->second, page);
    if (it->second.empty()) index_.erase(it);
    cached_.erase(page);
  }

  // Caches a new full page when the content before it is cached (or it is
  // a first page): behind the pages holding its content, if any, without
  // counting a registration.
  void Register(PageId page, const ContentKey& key, const BlockHash& hash) {
    REQUIRE(!cached_.contains(page));
    const size_t page_size = static_cast<size_t>(config_.page_size);
    if (key.tokens.size() > page_size) {
      const ContentKey parent{
          key.salt,
          key.adapter,
          {key.tokens.begin(), key.tokens.end() - page_size}};
      if (!index_.contains(parent)) {
        ++cache_counts_.parent_not_cached;
        return;
      }
    }
    std::vector<PageId>& ring = index_[key];
    if (ring.empty()) ++pool_stats_.cache_registrations;
    if (!ring.empty()) ++cache_counts_.second_copies;
    ring.push_back(page);
    cached_.emplace(page, std::make_pair(key, hash));
  }

  PagedKvConfig config_;
  BlockManagerOptions options_;
  BlockHasher* hasher_;
  std::vector<int32_t> refcount_;
  std::vector<PageId> free_stack_;  // Bottom to top.
  std::vector<PageId> lru_;         // Head (evicted first) to tail.
  std::map<PageId, std::pair<ContentKey, BlockHash>> cached_;
  // The pages holding each cached content, in the order they were cached:
  // the first answers lookups.
  std::map<ContentKey, std::vector<PageId>> index_;
  BlockPoolStats pool_stats_;
  BlockManagerStats stats_;  // The manager-owned counters.
  std::map<SequenceId, ModelSequence> sequences_;
  int32_t reserved_ = 0;  // pages reserved for the rest of prompts.

 public:
  // How often the paths of a second copy and of a parent gone ran.
  struct CacheCounts {
    int64_t second_copies = 0;        // cached behind a first copy
    int64_t kept_by_second_copy = 0;  // a first copy left, a second answers
    int64_t parent_not_cached = 0;    // a full page left uncached
  };
  const CacheCounts& cache_counts() const { return cache_counts_; }

 private:
  CacheCounts cache_counts_;

 public:
  // The cached pages and the content each was registered with.
  const std::map<PageId, std::pair<ContentKey, BlockHash>>& cached() const {
    return cached_;
  }
};

struct Scenario {
  uint32_t seed;
  int32_t num_pages;
  int32_t page_size;
  int32_t max_pages_per_seq;
  bool prefix_caching;
  int32_t watermark_pages;
  HashAlgorithm algorithm;
  // Sequence slots reserved (0: 4 * max_batch = 16); fewer than kNumIds
  // make the slab grow.
  int32_t max_sequences;
  bool reserve_prompt_pages = true;
};

// Counts of calls, by name, to show that every path ran.
using OpCounts = std::map<std::string, int64_t>;

class RandomRun {
 public:
  static constexpr SequenceId kNumIds = 20;
  static constexpr int kNumBases = 4;

  explicit RandomRun(const Scenario& scenario)
      : scenario_(scenario),
        rng_(scenario.seed),
        config_{.num_pages = scenario.num_pages,
                .max_batch = 4,
                .max_pages_per_seq = scenario.max_pages_per_seq,
                .page_size = scenario.page_size},
        options_{.enable_prefix_caching = scenario.prefix_caching,
                 .hash_algorithm = scenario.algorithm,
                 .watermark_pages = scenario.watermark_pages,
                 .max_sequences = scenario.max_sequences,
                 .reserve_prompt_pages = scenario.reserve_prompt_pages},
        hasher_(NewHasher(scenario.algorithm, scenario.page_size)),
        model_(config_, options_, hasher_) {
    auto manager = BlockManager::Create(config_, options_);
    REQUIRE_OK(manager);
    manager_ = std::move(manager).value();
    const int64_t max_tokens = config_.MaxTokensPerSeq();
    for (int b = 0; b < kNumBases; ++b) {
      std::vector<TokenId>& base = bases_.emplace_back();
      for (int64_t i = 0; i < max_tokens; ++i) base.push_back(Uniform(0, 99));
    }
  }

  // Runs at least `ops` manager calls (the last step may add a few), checking
  // everything after each.
  void Run(int64_t ops, OpCounts& counts) {
    counts_ = &counts;
    while (op_ < ops) {
      const int dice = Uniform(0, 99);
      if (dice < 8) {
        RunStep();
      } else if (dice < 9) {
        Call("reset_prefix_cache", [&] { return ResetPrefixCache(); });
      } else if (dice < 11) {
        Call("step_misuse", [&] { return StepMisuse(); });
      } else {
        RunMutation();
      }
    }
    const Model::CacheCounts& cache = model_.cache_counts();
    counts["(second copies cached)"] = cache.second_copies;
    counts["(hashes kept by a second copy)"] = cache.kept_by_second_copy;
    counts["(pages not cached: parent gone)"] = cache.parent_not_cached;
  }

 private:
  static BlockHasher NewHasher(HashAlgorithm algorithm, int32_t page_size) {
    auto hasher = BlockHasher::Create(algorithm, page_size);
    REQUIRE_OK(hasher);
    return std::move(hasher).value();
  }

  int Uniform(int lo, int hi) {  // In [lo, hi].
    return std::uniform_int_distribution<int>(lo, hi)(rng_);
  }
  bool Chance(int percent) { return Uniform(1, 100) <= percent; }

  SequenceId AnyId() { return Uniform(0, kNumIds - 1); }
  // Mostly a live sequence (when there is one).
  SequenceId LiveId() {
    const auto& sequences = model_.sequences();
    if (sequences.empty() || Chance(5)) return AnyId();
    auto it = sequences.begin();
    std::advance(it, Uniform(0, static_cast<int>(sequences.size()) - 1));
    return it->first;
  }
  // Mostly an id that is not live (when there is one).
  SequenceId FreeId() {
    for (int attempt = 0; attempt < 8 && Chance(95); ++attempt) {
      const SequenceId id = AnyId();
      if (!model_.sequences().contains(id)) return id;
    }
    return AnyId();
  }

  // A prompt: the next turn of a conversation (a live sequence's tokens) or
  // a prefix of a shared base, either followed by a suffix in a 3-token
  // vocabulary (so unrelated suffixes still collide); rarely empty. Too long
  // prompts come from long prefixes with a suffix.
  std::vector<TokenId> Prompt() {
    const int kind = Uniform(0, 99);
    if (kind < 2) return {};
    std::vector<TokenId> prompt;
    if (kind < 30) {
      const auto it = model_.sequences().find(LiveId());
      if (it != model_.sequences().end()) prompt = it->second.tokens;
    } else {
      const std::vector<TokenId>& base = bases_[Uniform(0, kNumBases - 1)];
      prompt.assign(base.begin(),
                    base.begin() + Uniform(1, static_cast<int>(base.size())));
    }
    if (kind < 30 || kind >= 60) {
      for (int i = Uniform(1, 2 * config_.page_size); i > 0; --i) {
        prompt.push_back(Uniform(0, 2));
      }
    }
    return prompt;
  }

  // Generated tokens: mostly one (decode), sometimes up to 40. Tokens are a
  // function of the position and one of two "samples", so sequences with
  // equal histories generate equal pages.
  std::vector<TokenId> Generated(SequenceId id) {
    const int dice = Uniform(0, 99);
    const int count = dice < 55   ? 1
                      : dice < 85 ? Uniform(1, 2 * config_.page_size)
                                  : Uniform(1, 40);
    const int sample = Uniform(0, 1);
    const auto it = model_.sequences().find(id);
    const int start = it == model_.sequences().end()
                          ? 0
                          : static_cast<int>(it->second.tokens.size());
    std::vector<TokenId> tokens;
    for (int i = 0; i < count; ++i) {
      tokens.push_back(100 + ((start + i) * 7 + sample * 13) % 5);
    }
    return tokens;
  }

  // Calls `op` (one manager call, which returns the manager's status code
  // after checking its result against the model) and checks everything.
  template <typename Op>
  void Call(const char* name, Op&& op) {
    ++(*counts_)[name];
    INFO("seed " << scenario_.seed << ", op " << op_ << " (" << name << ")"
                 << (in_step_ ? " in a step" : ""));
    ++op_;
    const BlockManagerSnapshot before = manager_->Snapshot();
    const Code code = op();
    if (code != Code::kOk) {
      ++(*counts_)[absl::StrCat(name, " -> ", absl::StatusCodeToString(code))];
      REQUIRE(manager_->Snapshot() == before);
    }
    if (manager_->stats().evictions > before.stats.evictions) {
      ++(*counts_)[absl::StrCat(name, " with evictions")];
    }
    Verify();
  }

  void RunMutation() {
    const int dice = Uniform(0, 99);
    if (dice < 25) {
      Call("admit", [&] { return Admit(); });
    } else if (dice < 35) {
      Call("append_prompt", [&] { return AppendPrompt(); });
    } else if (dice < 53) {
      Call("append", [&] { return Append(); });
    } else if (dice < 63) {
      Call("append_many", [&] { return AppendMany(); });
    } else if (dice < 70) {
      Call("set_drafts", [&] { return SetDrafts(); });
    } else if (dice < 77) {
      Call("fork", [&] { return Fork(); });
    } else if (dice < 90) {
      Call("free", [&] { return Remove(false); });
    } else {
      Call("preempt", [&] { return Remove(true); });
    }
  }

  // Mostly a live sequence with prompt tokens left (when there is one).
  SequenceId PrefillingId() {
    std::vector<SequenceId> ids;
    for (const auto& [id, sequence] : model_.sequences()) {
      if (sequence.prompt_left() > 0) ids.push_back(id);
    }
    if (ids.empty() || Chance(10)) return LiveId();
    return ids[Uniform(0, static_cast<int>(ids.size()) - 1)];
  }

  // A draft count: mostly 1 to 5, sometimes 0 or several pages, rarely
  // negative.
  int32_t Drafts() {
    const int dice = Uniform(0, 99);
    if (dice < 1) return -1;
    if (dice < 20) return 0;
    if (dice < 80) return Uniform(1, 5);
    return Uniform(1, 4 * config_.page_size);
  }

  // BeginStep, a few calls, then CommitStep or RollbackStep.
  void RunStep() {
    Call("begin_step", [&] {
      step_model_ = model_;
      step_snapshot_ = manager_->Snapshot();
      REQUIRE_OK(Impl(*manager_).BeginStep());
      in_step_ = true;
      return Code::kOk;
    });
    for (int n = Uniform(1, 8); n > 0; --n) {
      const int dice = Uniform(0, 99);
      if (dice < 3) {
        Call("reset_prefix_cache", [&] { return ResetPrefixCache(); });
      } else if (dice < 6) {
        Call("step_misuse", [&] { return StepMisuse(); });
      } else {
        RunMutation();
      }
    }
    if (Chance(50)) {
      Call("rollback_step", [&] {
        REQUIRE_OK(Impl(*manager_).RollbackStep());
        in_step_ = false;
        model_ = step_model_;
        REQUIRE(manager_->Snapshot() == step_snapshot_);
        return Code::kOk;
      });
    } else {
      Call("commit_step", [&] {
        REQUIRE_OK(Impl(*manager_).CommitStep());
        in_step_ = false;
        return Code::kOk;
      });
    }
  }

  Code Admit() {
    const SequenceId id = Chance(95) ? FreeId() : LiveId();
    const std::vector<TokenId> prompt = Prompt();
    const std::string& salt =
        kSalts[Uniform(0, static_cast<int>(kSalts.size()) - 1)];
    const int64_t adapter = Chance(85) ? 0 : 5;
    const HashExtraKeys extra{salt, adapter};
    // Chunked prefill a third of the time; rarely a bad chunk, or no cache.
    AdmitOptions admit;
    if (Chance(35)) admit.prefill_tokens = Uniform(Chance(2) ? 0 : 1, 10);
    admit.read_prefix_cache = !Chance(5);
    INFO("admit " << id << ": " << prompt.size() << " tokens, salt '" << salt
                  << "', adapter " << adapter << ", prefill "
                  << admit.prefill_tokens << ", read cache "
                  << admit.read_prefix_cache);

    const ModelPlan planned = model_.Plan(prompt, salt, adapter, admit);
    const absl::StatusOr<AdmissionPlan> plan =
        manager_->PlanAdmission(prompt, extra, {}, admit);
    REQUIRE(plan.status().code() == planned.code);
    if (plan.ok()) CheckPlan(*plan, planned.plan);
    const bool can_admit = manager_->CanAdmit(prompt, extra, {}, admit);
    REQUIRE(can_admit == model_.CanAdmit(planned));

    ModelPlan expected;
    const bool was_live = model_.sequences().contains(id);
    const Code code = model_.Admit(id, prompt, salt, adapter, expected, admit);
    const absl::StatusOr<AdmissionPlan> admitted =
        manager_->Admit(id, prompt, extra, {}, admit);
    REQUIRE(admitted.status().code() == code);
    if (!was_live) REQUIRE(admitted.ok() == can_admit);
    if (admitted.ok()) {
      CheckPlan(*admitted, expected.plan);
      if (admitted->hit_pages > 0) ++(*counts_)["admit with hits"];
      if (admitted->revived_pages > 0) ++(*counts_)["admit with revivals"];
      if (admitted->reserved_pages > 0) ++(*counts_)["admit with a reserve"];
      if (admitted->hit_tokens + admitted->computed_tokens <
          static_cast<int64_t>(prompt.size())) {
        ++(*counts_)["admit a first chunk"];
      }
    }
    return admitted.status().code();
  }

  static void CheckPlan(const AdmissionPlan& actual,
                        const AdmissionPlan& expected) {
    REQUIRE(actual.hit_pages == expected.hit_pages);
    REQUIRE(actual.hit_tokens == expected.hit_tokens);
    REQUIRE(actual.revived_pages == expected.revived_pages);
    REQUIRE(actual.new_pages == expected.new_pages);
    REQUIRE(actual.computed_tokens == expected.computed_tokens);
    REQUIRE(actual.reserved_pages == expected.reserved_pages);
  }

  // The next chunk of a prompt (sometimes too long or empty), filed under
  // the prompt's hashes half of the time (rarely another prompt's).
  Code AppendPrompt() {
    const SequenceId id = PrefillingId();
    const auto it = model_.sequences().find(id);
    std::vector<TokenId> chunk;
    std::vector<BlockHash> hashes;
    bool wrong_hashes = false;
    // A wrong chain is found before anything changes when the chunk starts
    // past page 0 (its chain so far is checked), else where it fills page
    // 0 (hashed and compared); a chunk that fills no page passes.
    bool wrong_early = false;
    bool wrong_late = false;
    if (it != model_.sequences().end()) {
      const ModelSequence& sequence = it->second;
      const int64_t left = sequence.prompt_left();
      const int64_t size =
          Chance(3) ? left + 1 : Uniform(Chance(2) ? 0 : 1, 12);
      const size_t start = sequence.tokens.size();
      for (int64_t i = 0; i < size; ++i) {
        chunk.push_back(start + i < sequence.prompt.size()
                            ? sequence.prompt[start + i]
                            : 1);
      }
      if (scenario_.prefix_caching && Chance(50)) {
        hashes.resize(sequence.prompt.size() / config_.page_size);
        std::vector<TokenId> hashed = sequence.prompt;
        wrong_hashes = Chance(5) && !hashed.empty();
        if (wrong_hashes) hashed[0] += 1000;
        REQUIRE_OK(manager_->HashPrompt(
            hashed, {sequence.salt, sequence.adapter}, absl::MakeSpan(hashes)));
        wrong_hashes = wrong_hashes && !hashes.empty();
        wrong_early = wrong_hashes && start / config_.page_size > 0;
        wrong_late = wrong_hashes && !wrong_early &&
                     (start + chunk.size()) / config_.page_size > 0;
      }
    }
    INFO("append prompt " << chunk.size() << " tokens to " << id << ", "
                          << hashes.size() << " hashes"
                          << (wrong_hashes ? " (wrong)" : ""));
    Model trial = model_;
    AppendResult expected;
    Code code = trial.Append(id, chunk, expected, /*prompt_chunk=*/true);
    if (code != Code::kNotFound && wrong_early) code = Code::kInvalidArgument;
    if (code == Code::kOk && wrong_late) code = Code::kInvalidArgument;
    const absl::StatusOr<AppendResult> result =
        manager_->AppendPrompt(id, chunk, hashes);
    REQUIRE(result.status().code() == code);
    if (result.ok()) {
      model_ = std::move(trial);
      REQUIRE(result->new_pages == expected.new_pages);
      REQUIRE(result->copy == expected.copy);
      if (model_.sequences().at(id).prompt_left() == 0) {
        ++(*counts_)["append prompt completes it"];
      }
    }
    return code;
  }

  Code SetDrafts() {
    const SequenceId id = LiveId();
    const int32_t count = Drafts();
    INFO("set " << count << " drafts of " << id);
    AppendResult expected;
    const Code code = model_.SetDrafts(id, count, expected);
    const absl::StatusOr<AppendResult> result = manager_->SetDrafts(id, count);
    REQUIRE(result.status().code() == code);
    if (result.ok()) {
      REQUIRE(result->new_pages == expected.new_pages);
      REQUIRE(result->copy == expected.copy);
      REQUIRE(result->released_pages == expected.released_pages);
      if (result->copy.has_value()) ++(*counts_)["set drafts with copy"];
      if (result->released_pages > 0) ++(*counts_)["set drafts releases"];
      if (result->new_pages > 0) ++(*counts_)["set drafts allocates"];
    }
    return code;
  }

  Code Append() {
    const SequenceId id = LiveId();
    const std::vector<TokenId> tokens =
        Chance(1) ? std::vector<TokenId>{} : Generated(id);
    INFO("append " << tokens.size() << " tokens to " << id);
    AppendResult expected;
    const Code code = model_.Append(id, tokens, expected);
    const absl::StatusOr<AppendResult> result = manager_->Append(id, tokens);
    REQUIRE(result.status().code() == code);
    if (result.ok()) {
      REQUIRE(result->new_pages == expected.new_pages);
      REQUIRE(result->copy == expected.copy);
      if (result->copy.has_value()) ++(*counts_)["append with copy"];
    }
    return code;
  }

  // AppendMany over 1 to 4 entries (a sequence may repeat; now and then a
  // handle that is not live), against the model's Appends in entry order:
  // all of them, or none when one fails.
  Code AppendMany() {
    std::vector<SequenceHandle> handles;
    std::vector<int32_t> counts;
    std::vector<TokenId> tokens;
    std::vector<int32_t> drafts;
    const bool drafting = Chance(40);
    Model trial = model_;
    internal::AppendManyResult expected;
    Code code = Code::kOk;
    int64_t draft_steps = 0;
    for (int n = Uniform(1, 4); n > 0; --n) {
      const SequenceId id = LiveId();
      const absl::StatusOr<SequenceHandle> handle =
          Impl(*manager_).HandleOf(id);
      const bool live = handle.ok() && !Chance(3);
      if (live) {
        handles.push_back(*handle);
      } else if (handle.ok() && Chance(50)) {  // a stale generation.
        handles.push_back({handle->index, handle->generation - 1});
      } else {
        handles.push_back({Impl(*manager_).handle_limit(), 0});
      }
      const std::vector<TokenId> more =
          Chance(5) ? std::vector<TokenId>{} : Generated(id);
      counts.push_back(static_cast<int32_t>(more.size()));
      tokens.insert(tokens.end(), more.begin(), more.end());
      if (drafting) drafts.push_back(Drafts());
      if (code != Code::kOk) continue;
      if (!live) {
        code = Code::kInvalidArgument;
        continue;
      }
      const auto pages_of = [&] {
        return static_cast<int32_t>(trial.sequences().at(id).pages.size());
      };
      const int32_t pages_before = pages_of();
      const int32_t page_size = manager_->config().page_size;
      const bool fills =
          trial.sequences().at(id).tokens.size() % page_size + more.size() >=
          static_cast<size_t>(page_size);
      AppendResult one;
      code = trial.Append(id, more, one);
      if (code != Code::kOk) continue;
      int32_t first_changed = pages_before - (one.copy.has_value() ? 1 : 0);
      if (drafting) {
        const int32_t pages_between = pages_of();
        AppendResult drafted;
        code = trial.SetDrafts(id, drafts.back(), drafted);
        if (code != Code::kOk) continue;
        first_changed = std::min(
            {first_changed, pages_between - (drafted.copy.has_value() ? 1 : 0),
             pages_of()});
        if (drafted.copy.has_value()) one.copy = drafted.copy;
        one.new_pages += drafted.new_pages;
        one.released_pages = drafted.released_pages;
        // StepPastEdge's kind: a page fills or one is added, and no more.
        if (!one.copy.has_value() && one.released_pages == 0 &&
            one.new_pages <= 1 && (fills || one.new_pages == 1) &&
            !more.empty() && more.size() < static_cast<size_t>(page_size)) {
          ++draft_steps;
        }
      }
      if (one.new_pages == 0 && !one.copy.has_value() &&
          one.released_pages == 0) {
        continue;
      }
      expected.changed.push_back(static_cast<int32_t>(handles.size() - 1));
      expected.first_changed_page.push_back(first_changed);
      if (one.copy.has_value()) expected.copies.push_back(*one.copy);
      expected.new_pages += one.new_pages;
    }
    INFO("append many: " << handles.size() << " entries, " << tokens.size()
                         << " tokens" << (drafting ? ", drafting" : ""));
    internal::AppendManyResult result;
    REQUIRE(Impl(*manager_)
                .AppendMany(handles, counts, tokens, result, drafts)
                .code() == code);
    if (drafting && code == Code::kOk) {
      ++(*counts_)["append many drafting"];
      (*counts_)["append many drafts past a page edge"] += draft_steps;
    }
    if (code == Code::kOk) {
      model_ = std::move(trial);
      REQUIRE(result.changed == expected.changed);
      REQUIRE(result.first_changed_page == expected.first_changed_page);
      REQUIRE(result.copies == expected.copies);
      REQUIRE(result.new_pages == expected.new_pages);
      if (!result.copies.empty()) ++(*counts_)["append many with copy"];
    } else {
      REQUIRE(result.changed.empty());
      REQUIRE(result.first_changed_page.empty());
      REQUIRE(result.copies.empty());
    }
    return code;
  }

  Code Fork() {
    const SequenceId parent = LiveId();
    const SequenceId child = Chance(90) ? FreeId() : LiveId();
    INFO("fork " << parent << " -> " << child);
    const Code code = model_.Fork(parent, child);
    REQUIRE(manager_->Fork(parent, child).code() == code);
    return code;
  }

  Code Remove(bool preempted) {
    const SequenceId id = LiveId();
    INFO((preempted ? "preempt " : "free ") << id);
    const Code code = model_.Remove(id, preempted);
    REQUIRE((preempted ? manager_->Preempt(id) : manager_->Free(id)).code() ==
            code);
    return code;
  }

  Code ResetPrefixCache() {
    const Code code = model_.ResetPrefixCache(in_step_);
    REQUIRE(manager_->ResetPrefixCache().code() == code);
    return code;
  }

  // A step call out of order: FailedPrecondition, nothing changes.
  Code StepMisuse() {
    absl::Status status;
    if (in_step_) {
      status = Impl(*manager_).BeginStep();
    } else {
      status = Chance(50) ? Impl(*manager_).CommitStep()
                          : Impl(*manager_).RollbackStep();
    }
    REQUIRE(status.code() == Code::kFailedPrecondition);
    return status.code();
  }

  void Verify() {
    REQUIRE_OK(manager_->CheckInvariants());
    REQUIRE(Impl(*manager_).in_step() == in_step_);
    const BlockManagerSnapshot actual = manager_->Snapshot();
    const BlockManagerSnapshot expected = model_.Snapshot();
    REQUIRE(actual.stats == expected.stats);
    REQUIRE(actual.sequences == expected.sequences);
    REQUIRE(actual.pool == expected.pool);
    REQUIRE(actual == expected);
    REQUIRE(manager_->stats() == expected.stats);

    // Live sequences, through the query API, and what their pages hold.
    REQUIRE(manager_->num_sequences() ==
            static_cast<int32_t>(model_.sequences().size()));
    for (SequenceId id = -1; id <= kNumIds; ++id) {
      REQUIRE(manager_->Contains(id) == model_.sequences().contains(id));
    }
    REQUIRE(manager_->Pages(kNumIds).status().code() == Code::kNotFound);
    REQUIRE(manager_->NumTokens(kNumIds).status().code() == Code::kNotFound);
    // Page -> (holder, logical page) of its first holder.
    std::map<PageId, std::pair<const ModelSequence*, size_t>> holders;
    for (const auto& [id, sequence] : model_.sequences()) {
      const absl::StatusOr<absl::Span<const PageId>> pages =
          manager_->Pages(id);
      REQUIRE_OK(pages);
      REQUIRE(*manager_->NumTokens(id) ==
              static_cast<int64_t>(sequence.tokens.size()));
      for (size_t i = 0; i < pages->size(); ++i) {
        const auto [it, first] = holders.try_emplace((*pages)[i], &sequence, i);
        if (!first) {
          CheckSameContent(*it->second.first, it->second.second, sequence, i);
        }
      }
    }
    REQUIRE(manager_->stats().pages_in_use ==
            static_cast<int32_t>(holders.size()));
    REQUIRE(manager_->pool().NumUsed() == static_cast<int32_t>(holders.size()));
    REQUIRE(manager_->reserved_pages() == model_.reserved());
    REQUIRE(manager_->NumAllocatable() == model_.NumAllocatable());
    for (const auto& [id, sequence] : model_.sequences()) {
      REQUIRE(*manager_->PromptTokensLeft(id) == sequence.prompt_left());
      REQUIRE(*manager_->NumDrafts(id) == sequence.drafts);
    }

    // Every cached page's hash, recomputed from the verified tokens it was
    // registered with: the chain of its salt, adapter and tokens.
    if (!scenario_.prefix_caching) return;
    const std::map<PageId, std::pair<ContentKey, BlockHash>>& cached =
        model_.cached();
    for (const auto& [page, hash] : actual.pool.cached) {
      // Checked once per registration.
      const auto [known, fresh] = checked_hashes_.try_emplace(page, hash);
      if (!fresh && known->second == hash) continue;
      known->second = hash;
      const auto it = cached.find(page);
      REQUIRE(it != cached.end());
      const ContentKey& key = it->second.first;
      std::vector<BlockHash> chain(key.tokens.size() / config_.page_size);
      REQUIRE_OK(HashChain(hasher_, key.tokens, {key.salt, key.adapter},
                           absl::MakeSpan(chain)));
      REQUIRE(!chain.empty());
      REQUIRE(chain.back() == hash);
    }
  }

  // Two holders of one page: same logical page, salt and adapter, and the
  // same tokens up to the end of the page (a shared partial page is the last
  // page of both, with as many tokens in each).
  void CheckSameContent(const ModelSequence& a, size_t page_a,
                        const ModelSequence& b, size_t page_b) const {
    REQUIRE(page_a == page_b);
    REQUIRE(a.salt == b.salt);
    REQUIRE(a.adapter == b.adapter);
    const size_t end = (page_a + 1) * config_.page_size;
    const size_t end_a = std::min(end, a.tokens.size());
    const size_t end_b = std::min(end, b.tokens.size());
    REQUIRE(end_a == end_b);
    REQUIRE(std::equal(a.tokens.begin(), a.tokens.begin() + end_a,
                       b.tokens.begin()));
  }

  static inline const std::vector<std::string> kSalts = {"", "", "tenant-a",
                                                         "tenant-b"};

  const Scenario scenario_;
  std::mt19937 rng_;
  const PagedKvConfig config_;
  const BlockManagerOptions options_;
  BlockHasher hasher_;
  Model model_;
  std::unique_ptr<BlockManager> manager_;
  std::vector<std::vector<TokenId>> bases_;
  int64_t op_ = 0;
  bool in_step_ = false;
  Model step_model_ = model_;
  BlockManagerSnapshot step_snapshot_;
  OpCounts* counts_ = nullptr;
  // Cached pages whose hash Verify recomputed, with that hash.
  std::map<PageId, BlockHash> checked_hashes_;
};

TEST_CASE("random manager calls match the model", "[random]") {
  // Small pools so exhaustion, eviction and OutOfRange happen often.
  const Scenario scenario = GENERATE(
      Scenario{1, 24, 2, 8, true, 0, HashAlgorithm::kSha256, 0, true},
      Scenario{2, 40, 3, 12, true, 2, HashAlgorithm::kXxh3_128, 2, false},
      Scenario{3, 64, 4, 16, true, 0, HashAlgorithm::kSha256, 0, true},
      Scenario{4, 48, 2, 16, true, 1, HashAlgorithm::kXxh3_128, 0, false},
      Scenario{5, 32, 4, 8, false, 1, HashAlgorithm::kSha256, 1, true});
  constexpr int64_t kOps = testing::RandomRunLength(25'000);
  OpCounts counts;
  RandomRun(scenario).Run(kOps, counts);

  std::string summary;
  for (const auto& [name, count] : counts) {
    absl::StrAppend(&summary, "\n  ", name, ": ", count);
  }
  INFO("seed " << scenario.seed << " calls:" << summary);
  // Every path ran often enough to mean something (in proportion to the
  // run's length).
  for (const char* name : {"admit",
                           "append",
                           "fork",
                           "free",
                           "preempt",
                           "begin_step",
                           "rollback_step",
                           "commit_step",
                           "reset_prefix_cache",
                           "step_misuse",
                           "admit -> RESOURCE_EXHAUSTED",
                           "admit -> OUT_OF_RANGE",
                           "admit -> ALREADY_EXISTS",
                           "admit -> INVALID_ARGUMENT",
                           "append -> RESOURCE_EXHAUSTED",
                           "append -> OUT_OF_RANGE",
                           "append with copy",
                           "fork -> ALREADY_EXISTS",
                           "fork -> FAILED_PRECONDITION",
                           "admit a first chunk",
                           "append_prompt",
                           "append_prompt -> INVALID_ARGUMENT",
                           "set_drafts",
                           "set drafts releases",
                           "set drafts allocates",
                           "set_drafts -> FAILED_PRECONDITION",
                           "set_drafts -> OUT_OF_RANGE",
                           "append many drafting",
                           "append many drafts past a page edge"}) {
    CAPTURE(name);
    CHECK(counts[name] >= testing::RandomRunLength(20));
  }
  // Rarer paths: a fork's shared partial page under new drafts, drafts that
  // find the pool full, a chunk that completes its prompt.
  for (const char* name :
       {"set drafts with copy", "set_drafts -> RESOURCE_EXHAUSTED",
        "append prompt completes it"}) {
    CAPTURE(name);
    CHECK(counts[name] >= testing::RandomRunLength(10));
  }
  if (scenario.reserve_prompt_pages) {
    CHECK(counts["admit with a reserve"] >= testing::RandomRunLength(20));
  } else {
    CHECK(counts["admit with a reserve"] == 0);
  }
  if (scenario.prefix_caching) {
    CHECK(counts["admit with hits"] >= testing::RandomRunLength(200));
    CHECK(counts["admit with revivals"] >= testing::RandomRunLength(50));
    CHECK(counts["admit with evictions"] >= testing::RandomRunLength(50));
    CHECK(counts["append with evictions"] >= testing::RandomRunLength(20));
    CHECK(counts["(second copies cached)"] >= testing::RandomRunLength(50));
    CHECK(counts["(hashes kept by a second copy)"] >=
          testing::RandomRunLength(10));
    CHECK(counts["(pages not cached: parent gone)"] >=
          testing::RandomRunLength(10));
  } else {
    CHECK(counts["admit with hits"] == 0);
  }
  WARN(summary);
}

}  // namespace
}  // namespace kvblock
