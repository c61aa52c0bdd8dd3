// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// BlockManager benchmarks: the scheduler's calls, each at pools of 1,000 and
// 1,000,000 pages (first argument) in the same state, that of a busy server:
// a quarter of the pages held by running sequences, a quarter cached and
// evictable, half free, so the prefix index holds half the pool. The cost per
// call must not grow with the pool.
//
// Calls run in steady-state loops that undo themselves (admit + free, fork +
// free), so no timing is paused; a benchmark's time is per loop iteration.
//
// The work per call is the same at both sizes. Calls that take fresh pages
// (BM_AdmitFree hit=0, BM_AppendPage) still cost more at 1,000,000 pages:
// they walk the free stack into pages untouched for long and insert into an
// index of half a million entries, so they miss the CPU caches, which a
// 1,000-page pool (about 50 KB of page state) never does. That cost grows
// from about 10,000 to 300,000 pages and then stays flat; it is memory
// latency, not work proportional to the pool.
// Pages hold 16 tokens; a sequence holds at most 64 pages (1024 tokens). The
// hash is SHA-256 (the default) unless an `alg` argument says otherwise;
// hashing a page is most of the work of any call that fills one (compare
// BM_HashPage).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "bench_device.h"
#include "kvblock/block_hash.h"
#include "kvblock/block_manager.h"
#include "kvblock/config.h"

namespace kvblock {
namespace {

constexpr int32_t kMaxPagesPerSeq = 64;
constexpr int32_t kMaxTokens = kPageSize * kMaxPagesPerSeq;
// Ids of the sequences a benchmark runs; background ids start above.
constexpr SequenceId kSeq = 0;
constexpr SequenceId kChild = 1;
constexpr SequenceId kBackground = 1'000'000;
// Token values of benchmark prompts, apart from the background's.
constexpr TokenId kPromptTokens = 100'000'000;

// `count` tokens `first`, `first + 1`, ...: distinct values, so pages of
// different prompts never share a hash.
std::vector<TokenId> Tokens(TokenId first, int32_t count) {
  std::vector<TokenId> tokens(count);
  for (int32_t i = 0; i < count; ++i) tokens[i] = first + i;
  return tokens;
}

// Skips the benchmark with `status` unless it is OK.
bool Ok(benchmark::State& state, const absl::Status& status) {
  if (!status.ok()) state.SkipWithError(status.ToString().c_str());
  return status.ok();
}

// A manager over `state.range(0)` pages in the busy state described at the
// top (full-length background sequences; every second one freed, last page
// first), hashing with `algorithm`; null after SkipWithError on failure.
std::unique_ptr<BlockManager> LoadedManager(
    benchmark::State& state, HashAlgorithm algorithm = HashAlgorithm::kSha256) {
  const int32_t num_pages = static_cast<int32_t>(state.range(0));
  const int32_t background = num_pages / 2 / kMaxPagesPerSeq;
  const PagedKvConfig config{.num_pages = num_pages,
                             .max_batch = 256,
                             .max_pages_per_seq = kMaxPagesPerSeq,
                             .page_size = kPageSize};
  auto manager = BlockManager::Create(
      config, {.hash_algorithm = algorithm, .max_sequences = background + 16});
  if (!Ok(state, manager.status())) return nullptr;
  for (int32_t k = 0; k < background; ++k) {
    const std::vector<TokenId> prompt = Tokens(k * kMaxTokens, kMaxTokens);
    if (!Ok(state, (*manager)->Admit(kBackground + k, prompt).status())) {
      return nullptr;
    }
  }
  for (int32_t k = 1; k < background; k += 2) {
    if (!Ok(state, (*manager)->Free(kBackground + k))) return nullptr;
  }
  return std::move(manager).value();
}

int64_t AlgorithmArg(HashAlgorithm algorithm) {
  return static_cast<int64_t>(algorithm);
}

// Admit a 255-token prompt (16 pages, 15 full), then free it. hit=1: the 15
// full pages are cached and evictable, so the admission revives them and
// allocates one page; hit=0: every prompt is new, so 16 pages are allocated
// (from the free stack, then by evicting the LRU head once it runs dry) and
// 15 are registered. Either way the admission hashes 15 pages.
void BM_AdmitFree(benchmark::State& state) {
  const auto algorithm = static_cast<HashAlgorithm>(state.range(2));
  std::unique_ptr<BlockManager> manager = LoadedManager(state, algorithm);
  if (manager == nullptr) return;
  const bool hit = state.range(1) != 0;
  std::vector<TokenId> prompt = Tokens(kPromptTokens, 16 * kPageSize - 1);
  if (hit && (!Ok(state, manager->Admit(kSeq, prompt).status()) ||
              !Ok(state, manager->Free(kSeq)))) {
    return;
  }
  for (auto _ : state) {
    if (!hit) ++prompt[0];
    absl::StatusOr<AdmissionPlan> plan = manager->Admit(kSeq, prompt);
    if (!Ok(state, plan.status())) return;
    benchmark::DoNotOptimize(plan);
    if (!Ok(state, manager->Free(kSeq))) return;
  }
  state.counters["hit_pages"] = manager->stats().prefix_hit_tokens / kPageSize /
                                static_cast<double>(state.iterations());
  state.SetLabel(std::string(HashAlgorithmName(algorithm)));
}
BENCHMARK(BM_AdmitFree)
    ->ArgNames({"pages", "hit", "alg"})
    ->ArgsProduct({{1000, 1000000},
                   {0, 1},
                   {AlgorithmArg(HashAlgorithm::kSha256),
                    AlgorithmArg(HashAlgorithm::kXxh3_128)}});

// A decode step: append one token to a running sequence. Every 16th call
// fills a page (hash + register) and the next allocates one; a sequence that
// reaches 1024 tokens is freed and a new one admitted (once per 1023
// appends). Items are tokens.
void BM_AppendToken(benchmark::State& state) {
  std::unique_ptr<BlockManager> manager = LoadedManager(state);
  if (manager == nullptr) return;
  TokenId next = kPromptTokens;
  int64_t tokens = kMaxTokens;  // Admit before the first append.
  for (auto _ : state) {
    if (tokens == kMaxTokens) {
      if (manager->Contains(kSeq) && !Ok(state, manager->Free(kSeq))) return;
      const TokenId prompt[] = {next++};
      if (!Ok(state, manager->Admit(kSeq, prompt).status())) return;
      tokens = 1;
    }
    const TokenId token[] = {next++};
    absl::StatusOr<AppendResult> result = manager->Append(kSeq, token);
    if (!Ok(state, result.status())) return;
    benchmark::DoNotOptimize(result);
    ++tokens;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_AppendToken)->ArgName("pages")->Arg(1000)->Arg(1000000);

// A page-crossing append: 16 tokens appended at a page boundary, so each
// call allocates a page, fills it, hashes and registers it. Reset as above
// (once per 63 calls). Items are pages.
void BM_AppendPage(benchmark::State& state) {
  std::unique_ptr<BlockManager> manager = LoadedManager(state);
  if (manager == nullptr) return;
  TokenId next = kPromptTokens;
  std::vector<TokenId> page(kPageSize);
  int32_t pages = kMaxPagesPerSeq;  // Admit before the first append.
  for (auto _ : state) {
    if (pages == kMaxPagesPerSeq) {
      if (manager->Contains(kSeq) && !Ok(state, manager->Free(kSeq))) return;
      const std::vector<TokenId> prompt = Tokens(next, kPageSize);
      next += kPageSize;
      if (!Ok(state, manager->Admit(kSeq, prompt).status())) return;
      pages = 1;
    }
    for (TokenId& token : page) token = next++;
    absl::StatusOr<AppendResult> result = manager->Append(kSeq, page);
    if (!Ok(state, result.status())) return;
    benchmark::DoNotOptimize(result);
    ++pages;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_AppendPage)->ArgName("pages")->Arg(1000)->Arg(1000000);

// Fork a running sequence of `seq_pages` pages (the last one partial), then
// free the child: one reference taken and dropped per page. cow=1 also
// appends a token to the child between the two, which copies the shared
// partial last page (beam search's first divergent step).
void BM_ForkFree(benchmark::State& state) {
  std::unique_ptr<BlockManager> manager = LoadedManager(state);
  if (manager == nullptr) return;
  const int32_t seq_pages = static_cast<int32_t>(state.range(1));
  const bool cow = state.range(2) != 0;
  const std::vector<TokenId> prompt =
      Tokens(kPromptTokens, seq_pages * kPageSize - kPageSize / 2);
  if (!Ok(state, manager->Admit(kSeq, prompt).status())) return;
  const TokenId token[] = {kPromptTokens - 1};
  for (auto _ : state) {
    if (!Ok(state, manager->Fork(kSeq, kChild))) return;
    if (cow) {
      absl::StatusOr<AppendResult> result = manager->Append(kChild, token);
      if (!Ok(state, result.status())) return;
      benchmark::DoNotOptimize(result);
    }
    if (!Ok(state, manager->Free(kChild))) return;
  }
  state.counters["cow_copies"] =
      manager->stats().cow_copies / static_cast<double>(state.iterations());
}
BENCHMARK(BM_ForkFree)
    ->ArgNames({"pages", "seq_pages", "cow"})
    ->ArgsProduct({{1000, 1000000}, {4, 64}, {0, 1}});

// Prefix lookup: PlanAdmission of a cached 64-page (1024-token) prompt,
// which hashes its 64 pages and looks up 63 (the last page is recomputed).
// Items are pages: time per page = hash + lookup.
void BM_PlanCachedPrompt(benchmark::State& state) {
  const auto algorithm = static_cast<HashAlgorithm>(state.range(1));
  std::unique_ptr<BlockManager> manager = LoadedManager(state, algorithm);
  if (manager == nullptr) return;
  // The first background sequence: live, every page cached.
  const std::vector<TokenId> prompt = Tokens(0, kMaxTokens);
  for (auto _ : state) {
    absl::StatusOr<AdmissionPlan> plan = manager->PlanAdmission(prompt);
    if (!Ok(state, plan.status())) return;
    benchmark::DoNotOptimize(plan);
    if (plan->hit_pages != kMaxPagesPerSeq - 1) {
      state.SkipWithError("the prompt is not cached");
      return;
    }
  }
  state.SetItemsProcessed(state.iterations() * kMaxPagesPerSeq);
  state.SetLabel(std::string(HashAlgorithmName(algorithm)));
}
BENCHMARK(BM_PlanCachedPrompt)
    ->ArgNames({"pages", "alg"})
    ->ArgsProduct({{1000, 1000000},
                   {AlgorithmArg(HashAlgorithm::kSha256),
                    AlgorithmArg(HashAlgorithm::kXxh3_128)}});

}  // namespace
}  // namespace kvblock
