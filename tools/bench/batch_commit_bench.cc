// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// BatchCommit benchmark: the host cost of one steady-state decode step. Every
// running sequence appends one token (with page_size 16, one in 16 crosses
// into a new page); about 1% of the batch finishes, at random slots, and as
// many prompts join (a shared 4-page prefix, so they hit the prefix cache,
// plus a unique suffix). Reported per step (the time) and per sequence
// (`ns_per_seq`), at batch 64, 256 and 1024.
//
// The headline rows (`upload:1`) time the whole step a scheduler pays for:
// Commit, then KVPageTable::Upload of the step's patch, at page-table widths
// (`width`, max_pages_per_seq) of 128, 256 and 2048 pages (2k-, 4k- and
// 32k-token rows; the sequences themselves are about 6 pages long, so the
// width must not matter). The `upload:0` rows leave the upload out, to
// isolate Commit; they also compare SHA-256 with XXH3 page hashes, prompts
// hashed on arrival (HashPrompt, as vLLM and kvblock-sim do, outside the
// step) with prompts hashed by the step itself, and prefix caching off (no
// page hashed, registered or evicted), which isolates the cost of the cache.
//
// The time is that of Commit (and Upload) alone, clocked around the calls
// (manual time): drafting the step, and hashing prompts on arrival, are not
// in it (the CPU column still is the whole loop's). `arrival_ns_per_seq`
// reports that hashing per running sequence, so the two add up to the
// scheduler thread's cost when it hashes on arrival itself; Admit still
// hashes each prompt's first page, to check the hashes it is given.
//
// With `upload`, each step's patch is reported as `upload_bytes_per_step`
// (ids and ranges copied to the device), `upload_entries_per_step` (K entries
// it sets: ids written and entries cleared; the V half mirrors them),
// `upload_ranges_per_step` (rows patched) and `upload_copies_per_step`. The
// table lives on CUDA device 0 when there is one (the label names the
// device): there the time is the host's (staging, and enqueueing the copy
// and the patch kernel); on the host device the copy is a memcpy and the
// patch is applied by the CPU, both inside the time.
//
// Speculative decoding (`drafts:4`): every running sequence holds 4 draft
// slots after each step; the next step accepts each draft with probability
// 0.7 until the first rejection, so it appends 1 + accepted tokens (2.77 on
// average) and sets 4 new drafts (pages for them allocated, shared partial
// pages copied, pages wholly past the new end released). `ns_per_seq` is
// then the cost of one sequence's step, which advances it 2.77 tokens, to
// set against the `drafts:0` row's one token. The pool is three times as
// large (sequences run longer before they finish), and a sequence that
// nears its row's width finishes. With `held:0` the sequences append the
// same verified tokens (the same draws) but hold no drafts (draft counts of
// 0): what the tokens cost without the draft slots.
//
// Cold caches (`cold:1`): in serving, the scheduler's own work and the
// model's launch run between two steps, and the step finds the CPU's
// caches holding their data, not its own. These rows write to every cache
// line of a 4 MiB buffer (twice this machine's L2) between steps, outside
// the time; python_bench.py's batched step does the same, so the two
// compare in one regime (its own work between steps evicts part of the
// caches too).
//
// Heap allocations are counted by replacing the global operator new in this
// binary and OpenSSL's allocator (SHA-256 page hashes): `allocs_per_step`
// counts those made inside the timed calls (the goal is 0).
#include <benchmark/benchmark.h>
#include <openssl/crypto.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "bench_device.h"
#include "evict_caches.h"
#include "kvblock/batch_commit.h"
#include "kvblock/block_manager.h"
#include "kvblock/device.h"
#include "kvblock/page_table.h"

namespace {

// Heap allocations made by this process (one scheduler thread allocates in
// the timed region; the counter needs no synchronization beyond that).
int64_t allocations = 0;

void* CountedAlloc(std::size_t size) {
  ++allocations;
  if (void* ptr = std::malloc(size == 0 ? 1 : size)) return ptr;
  throw std::bad_alloc();
}

void* CountedCryptoMalloc(std::size_t size, const char*, int) {
  ++allocations;
  return std::malloc(size);
}
void* CountedCryptoRealloc(void* ptr, std::size_t size, const char*, int) {
  ++allocations;
  return std::realloc(ptr, size);
}
void CryptoFree(void* ptr, const char*, int) { std::free(ptr); }

// Must run before OpenSSL's first allocation, hence a static initializer.
const bool crypto_allocations_counted =
    CRYPTO_set_mem_functions(CountedCryptoMalloc, CountedCryptoRealloc,
                             CryptoFree) == 1;

}  // namespace

void* operator new(std::size_t size) { return CountedAlloc(size); }
void* operator new[](std::size_t size) { return CountedAlloc(size); }
void operator delete(void* ptr) noexcept { std::free(ptr); }
void operator delete[](void* ptr) noexcept { std::free(ptr); }
void operator delete(void* ptr, std::size_t) noexcept { std::free(ptr); }
void operator delete[](void* ptr, std::size_t) noexcept { std::free(ptr); }

namespace kvblock {
namespace {

constexpr int32_t kPrefixTokens = 4 * kPageSize;
constexpr int32_t kMaxSuffixTokens = 2 * kPageSize;
constexpr int32_t kWarmupSteps = 1000;
constexpr double kDraftAcceptance = 0.7;

// A decode workload at one batch size: the stack, and the scratch the
// scheduler fills each step (reused, so steps allocate nothing here).
class DecodeWorkload {
 public:
  // Creates the stack and fills the batch; false (with the error reported to
  // `state`) on failure.
  // `groups`: KV cache groups, 1 or 2, the first full attention when there
  // are two; `window`: the last group's sliding window (0: full attention).
  // Two groups with a window of 128 are gpt-oss's. `pool_pages_per_seq`:
  // pages of the pool a sequence and group (0: 16, or 48 with drafts).
  bool Init(benchmark::State& state, int32_t batch, int32_t width,
            HashAlgorithm hash, bool prefix_caching, bool hash_on_arrival,
            int32_t drafts, bool hold_drafts, int32_t groups = 1,
            int32_t window = 0, int32_t pool_pages_per_seq = 0) {
    batch_ = batch;
    hash_on_arrival_ = hash_on_arrival;
    drafts_ = drafts;
    hold_drafts_ = hold_drafts;
    max_tokens_ = int64_t{width - 1} * kPageSize - (drafts + 1);
    PagedKvConfig config;
    config.page_size = kPageSize;
    config.max_pages_per_seq = width;
    config.max_batch = batch;
    // Steady state: about half the pool in use, the rest cached pages that
    // the steps evict.
    config.num_pages = (pool_pages_per_seq > 0 ? pool_pages_per_seq
                        : drafts > 0           ? 48
                                               : 16) *
                       batch * groups;
    BlockManagerOptions options;
    options.hash_algorithm = hash;
    options.enable_prefix_caching = prefix_caching;
    const KvCacheGroupSpec full{.kind = AttentionKind::kFull,
                                .page_size = kPageSize,
                                .sliding_window = 0,
                                .attention_chunk_size = 0,
                                .eagle = false};
    KvCacheGroupSpec last = full;
    if (window > 0) {
      last.kind = AttentionKind::kSlidingWindow;
      last.sliding_window = window;
    }
    if (groups == 2) {
      options.kv_cache_groups = {full, last};
    } else if (window > 0) {
      options.kv_cache_groups = {last};
    }
    auto manager = BlockManager::Create(config, options);
    if (!manager.ok()) return Fail(state, manager.status());
    manager_ = *std::move(manager);
    auto table = KVPageTable::Create(groups * batch, width, config.num_pages,
                                     BenchDevice());
    if (!table.ok()) return Fail(state, table.status());
    table_ = *std::move(table);
    auto commit = BatchCommit::Create(*manager_, *table_);
    if (!commit.ok()) return Fail(state, commit.status());
    commit_ = *std::move(commit);

    rng_.seed(batch);
    std::mt19937& rng = rng_;
    tokens_.resize(1 << 16);
    for (TokenId& token : tokens_) token = static_cast<TokenId>(rng() % 32000);
    prompts_.resize(batch);
    for (std::vector<TokenId>& prompt : prompts_) {
      prompt.reserve(kPrefixTokens + kMaxSuffixTokens);
    }
    prompt_hashes_.resize(batch);
    for (std::vector<BlockHash>& hashes : prompt_hashes_) {
      hashes.resize((kPrefixTokens + kMaxSuffixTokens) / kPageSize);
    }
    joins_.resize(batch);
    finished_.reserve(batch);
    leaving_slots_.reserve(batch);
    counts_.assign(batch, 1);
    draft_counts_.assign(drafts > 0 ? batch : 0, 0);

    // Everyone joins at once, then the batch runs into its steady state
    // (cache full, evicting; journals and scratch at their peak size).
    for (int32_t i = 0; i < batch; ++i) DraftJoin(i);
    auto first = commit_->Commit({.joins = absl::MakeConstSpan(joins_)});
    if (!first.ok()) return Fail(state, first.status());
    for (int i = 0; i < kWarmupSteps; ++i) {
      Draft();
      if (absl::Status s = Commit(true); !s.ok()) return Fail(state, s);
    }
    return true;
  }

  // Drafts the next decode step: ~1% finish at random slots, as many prompts
  // arrive and join, every other sequence appends one token (with drafts:
  // its accepted drafts and one, then holds new drafts).
  void Draft() {
    finish_credit_ += batch_;
    int32_t leaving = finish_credit_ / 100;
    finish_credit_ %= 100;
    finished_.clear();
    leaving_slots_.clear();
    const absl::Span<const SequenceId> slots = commit_->slots();
    int32_t tokens = batch_;
    if (drafts_ > 0) {
      tokens = 0;
      // The last step's joins, after the survivors, hold no drafts yet.
      const int32_t drafting = batch_ - last_joins_;
      for (SlotId slot = 0; slot < batch_; ++slot) {
        int32_t accepted = 0;
        const int32_t held = slot < drafting ? drafts_ : 0;
        while (accepted < held && accept_(rng_)) ++accepted;
        counts_[slot] = 1 + accepted;
        draft_counts_[slot] = hold_drafts_ ? drafts_ : 0;
        tokens += counts_[slot];
        // A sequence that nears its row's width finishes.
        if (leaving_slots_.size() < static_cast<size_t>(batch_ / 2) &&
            manager_->NumTokens(slots[slot]).value_or(0) > max_tokens_) {
          tokens -= counts_[slot];
          counts_[slot] = draft_counts_[slot] = 0;
          leaving_slots_.push_back(slot);
          finished_.push_back(slots[slot]);
        }
      }
      leaving += static_cast<int32_t>(finished_.size());
    }
    while (static_cast<int32_t>(finished_.size()) < leaving) {
      const SlotId slot =
          static_cast<SlotId>(rng_() % static_cast<uint32_t>(batch_));
      if (counts_[slot] == 0) continue;  // already leaving.
      tokens -= counts_[slot];
      counts_[slot] = 0;
      if (drafts_ > 0) draft_counts_[slot] = 0;
      leaving_slots_.push_back(slot);
      finished_.push_back(slots[slot]);
    }
    for (int32_t i = 0; i < leaving; ++i) DraftJoin(i);
    last_joins_ = leaving;
    plan_ = StepPlan{
        .finished = finished_,
        .joins = absl::MakeConstSpan(joins_.data(), leaving),
        .append_counts = counts_,
        .append_tokens = NextTokens(tokens),
        .draft_counts = draft_counts_,
    };
  }

  // Commits the drafted step; then, with `upload`, uploads the table.
  absl::Status Commit(bool upload) {
    absl::StatusOr<StepResult> result = commit_->Commit(plan_);
    for (const SlotId slot : leaving_slots_) counts_[slot] = 1;
    if (!result.ok()) return result.status();
    if (upload) return table_->Upload(nullptr).status();
    return absl::OkStatus();
  }

  // Total time spent hashing prompts on arrival.
  double arrival_seconds() const { return arrival_seconds_; }
  // What the table's uploads have copied so far.
  const KVPageTableUploadStats& upload_stats() const {
    return table_->upload_stats();
  }

 private:
  static bool Fail(benchmark::State& state, const absl::Status& status) {
    state.SkipWithError(status.ToString().c_str());
    return false;
  }

  absl::Span<const TokenId> NextTokens(int32_t n) {
    if (token_offset_ + n > tokens_.size()) token_offset_ = 0;
    const absl::Span<const TokenId> span =
        absl::MakeConstSpan(tokens_).subspan(token_offset_, n);
    token_offset_ += n;
    return span;
  }

  // Makes joins_[i] a new sequence: the shared prefix, then 1 to
  // kMaxSuffixTokens unique tokens; hashed here when it arrives, if so.
  void DraftJoin(int32_t i) {
    std::vector<TokenId>& prompt = prompts_[i];
    const absl::Span<const TokenId> prefix =
        absl::MakeConstSpan(tokens_).first(kPrefixTokens);
    prompt.assign(prefix.begin(), prefix.end());
    const int32_t suffix =
        1 + static_cast<int32_t>(next_id_ % kMaxSuffixTokens);
    const absl::Span<const TokenId> unique = NextTokens(suffix);
    prompt.insert(prompt.end(), unique.begin(), unique.end());
    joins_[i] = {.id = next_id_++, .tokens = prompt};
    if (!hash_on_arrival_) return;
    const auto start = std::chrono::steady_clock::now();
    const absl::StatusOr<int64_t> pages =
        manager_->HashPrompt(prompt, {}, absl::MakeSpan(prompt_hashes_[i]));
    arrival_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    // Cannot fail: prompt_hashes_[i] holds the longest prompt's pages.
    joins_[i].prompt_hashes =
        absl::MakeConstSpan(prompt_hashes_[i]).first(pages.value_or(0));
  }

  int32_t batch_ = 0;
  bool hash_on_arrival_ = false;
  int32_t drafts_ = 0;
  bool hold_drafts_ = true;  // else the verified tokens alone.
  int64_t max_tokens_ = 0;   // a drafting sequence past this finishes.
  int32_t last_joins_ = 0;   // joins of the last step: its last slots.
  std::bernoulli_distribution accept_{kDraftAcceptance};
  double arrival_seconds_ = 0;
  std::unique_ptr<BlockManager> manager_;
  std::unique_ptr<KVPageTable> table_;
  std::unique_ptr<BatchCommit> commit_;

  std::vector<TokenId> tokens_;
  size_t token_offset_ = 0;
  // Picks the leaving slots: a fresh draw every step (a fixed cycle of picks
  // would leave some slots never picked, and with rows that stay in their
  // slot, sequences that never finish).
  std::mt19937 rng_;
  int32_t finish_credit_ = 0;
  SequenceId next_id_ = 0;
  std::vector<std::vector<TokenId>> prompts_;
  std::vector<std::vector<BlockHash>> prompt_hashes_;
  std::vector<JoinRequest> joins_;
  StepPlan plan_;
  std::vector<SequenceId> finished_;
  std::vector<SlotId> leaving_slots_;
  std::vector<int32_t> counts_;        // by slot: tokens, or 0 while leaving.
  std::vector<int32_t> draft_counts_;  // by slot; empty without drafts.
};

// Args: batch, width (max_pages_per_seq), upload (0/1), hash (0: SHA-256,
// the default; 1: XXH3), prefix caching (1, the default; 0: off, so no page
// is hashed), prompts hashed on arrival (1) or in the step (0), drafts per
// sequence, caches evicted between steps (1) or not (0), drafts held after
// the step (1) or the verified tokens alone (0).
// Times `workload`'s decode steps, `upload`ing each, from `cold` caches,
// and sets the counters.
void RunDecodeSteps(benchmark::State& state, DecodeWorkload& workload,
                    int32_t batch, bool upload, bool cold) {
  const double arrival_before = workload.arrival_seconds();
  const KVPageTableUploadStats uploads_before = workload.upload_stats();
  int64_t step_allocations = 0;
  double step_seconds = 0;
  for (auto _ : state) {
    workload.Draft();
    if (cold) EvictCaches();
    const int64_t before = allocations;
    const auto start = std::chrono::steady_clock::now();
    const absl::Status status = workload.Commit(upload);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    step_allocations += allocations - before;
    if (!status.ok()) {
      state.SkipWithError(status.ToString().c_str());
      return;
    }
    state.SetIterationTime(seconds);
    step_seconds += seconds;
  }
  const double per_seq =
      1e9 / (static_cast<double>(state.iterations()) * batch);
  state.counters["ns_per_seq"] = step_seconds * per_seq;
  state.counters["arrival_ns_per_seq"] =
      (workload.arrival_seconds() - arrival_before) * per_seq;
  state.counters["allocs_per_step"] =
      benchmark::Counter(static_cast<double>(step_allocations),
                         benchmark::Counter::kAvgIterations);
  if (upload) {
    const KVPageTableUploadStats& uploads = workload.upload_stats();
    const auto per_step = [](int64_t n) {
      return benchmark::Counter(static_cast<double>(n),
                                benchmark::Counter::kAvgIterations);
    };
    state.counters["upload_bytes_per_step"] =
        per_step(uploads.bytes - uploads_before.bytes);
    state.counters["upload_entries_per_step"] =
        per_step(uploads.entries - uploads_before.entries);
    state.counters["upload_ranges_per_step"] =
        per_step(uploads.ranges - uploads_before.ranges);
    state.counters["upload_copies_per_step"] =
        per_step(uploads.copies - uploads_before.copies);
  }
  state.SetLabel(std::string(BenchDevice().name()));
}

void BM_CommitDecodeStep(benchmark::State& state) {
  if (!crypto_allocations_counted) {
    state.SkipWithError("OpenSSL allocated before its allocator was replaced");
    return;
  }
  const int32_t batch = static_cast<int32_t>(state.range(0));
  const int32_t width = static_cast<int32_t>(state.range(1));
  const bool upload = state.range(2) != 0;
  const HashAlgorithm hash =
      state.range(3) == 0 ? HashAlgorithm::kSha256 : HashAlgorithm::kXxh3_128;
  DecodeWorkload workload;
  if (!workload.Init(state, batch, width, hash, state.range(4) != 0,
                     state.range(5) != 0, static_cast<int32_t>(state.range(6)),
                     state.range(8) != 0)) {
    return;
  }
  RunDecodeSteps(state, workload, batch, upload, state.range(7) != 0);
}
BENCHMARK(BM_CommitDecodeStep)
    ->ArgNames({"batch", "width", "upload", "xxh3", "cache", "arrival",
                "drafts", "cold", "held"})
    // The whole step, upload included, at three row widths.
    ->ArgsProduct(
        {{64, 256, 1024}, {128, 256, 2048}, {1}, {0}, {1}, {1}, {0}, {0}, {1}})
    // The same step from cold caches (to set against python_bench.py's).
    ->ArgsProduct({{64, 256, 1024}, {128}, {1}, {0}, {1}, {1}, {0}, {1}, {1}})
    // Speculative decoding: 4 drafts a sequence, 70% accepted each; at batch
    // 256 also against plain decode with XXH3 page hashes and without
    // prefix caching (what hashing the 2.77x more pages that fill costs).
    ->ArgsProduct({{64, 256, 1024}, {256}, {1}, {0}, {1}, {1}, {4}, {0}, {1}})
    ->ArgsProduct({{256}, {256}, {1}, {1}, {1}, {1}, {0, 4}, {0}, {1}})
    ->ArgsProduct({{256}, {256}, {1}, {0}, {0}, {1}, {0, 4}, {0}, {1}})
    // The drafted step's verified tokens without the drafts.
    ->ArgsProduct({{256}, {256}, {1}, {0}, {1, 0}, {1}, {4}, {0}, {0}})
    // Commit alone: the hash algorithms, hashing in the step, no caching.
    ->ArgsProduct(
        {{64, 256, 1024}, {128}, {0}, {0, 1}, {1}, {1, 0}, {0}, {0}, {1}})
    ->ArgsProduct({{64, 256, 1024}, {128}, {0}, {0}, {0}, {0}, {0}, {0}, {1}})
    ->UseManualTime();

// BM_CommitDecodeStep's whole step (upload, SHA-256, prefix caching, prompts
// hashed on arrival) for a model of one KV cache group (full attention, or a
// 128-token sliding window alone), of gpt-oss's two (full attention and a
// 128-token sliding window, one table of both groups' rows), or of two
// full-attention groups: what a second group costs a step, and what its
// window's skips cost.
void BM_CommitDecodeStepGroups(benchmark::State& state) {
  if (!crypto_allocations_counted) {
    state.SkipWithError("OpenSSL allocated before its allocator was replaced");
    return;
  }
  const int32_t batch = static_cast<int32_t>(state.range(0));
  DecodeWorkload workload;
  if (!workload.Init(state, batch, static_cast<int32_t>(state.range(1)),
                     HashAlgorithm::kSha256, /*prefix_caching=*/true,
                     /*hash_on_arrival=*/true, /*drafts=*/0,
                     /*hold_drafts=*/true, static_cast<int32_t>(state.range(2)),
                     static_cast<int32_t>(state.range(3)),
                     static_cast<int32_t>(state.range(4)))) {
    return;
  }
  RunDecodeSteps(state, workload, batch, /*upload=*/true, /*cold=*/false);
}
// window: the last group's sliding window (0: full attention, a group that
// skips nothing). pool: pages of the pool a running sequence and group (16:
// the short sequences' own; 256: a pool of 4k-token sequences, as users
// run). One group at twice the batch (128, 512, 2048) holds the pages,
// table rows and sequences' state of two groups: what a second group costs
// beyond its memory. One full group of twice the pool (32, 512) holds the
// pages of two groups at the same batch, and one group's sequences' state:
// what a second group costs beyond its pages.
BENCHMARK(BM_CommitDecodeStepGroups)
    ->ArgNames({"batch", "width", "groups", "window", "pool"})
    ->ArgsProduct(
        {{64, 128, 256, 512, 1024, 2048}, {256}, {1}, {0, 128}, {16, 256}})
    ->ArgsProduct({{64, 256, 1024}, {256}, {1}, {0}, {32, 512}})
    ->ArgsProduct({{64, 256, 1024}, {256}, {2}, {0, 128}, {16, 256}})
    ->UseManualTime();

}  // namespace
}  // namespace kvblock
