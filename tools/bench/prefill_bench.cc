// Copyright 2026 The kvblock Authors.
//
// Prefill benchmark: the host cost of getting one long prompt into the cache
// through BatchCommit, whole or in chunks (chunked prefill). A prompt of
// `tokens` tokens (32,000: 2,000 pages of 16) is admitted whole in one step,
// or admitted with its first `chunk` tokens and given the rest as one
// PromptChunk a step. Every step uploads its page-table patch, as a
// scheduler's would. The time covers all the prompt's steps, and the step
// that finishes the sequence; it is reported per prompt, with `ns_per_token`.
//
// The prompts are unique (no prefix hits). With `arrival:1` each is hashed
// on arrival (BlockManager::HashPrompt, outside the time, as kvblock-sim and
// vLLM do) and its hashes given to the join and every chunk; with
// `arrival:0` the steps hash the pages they compute. Either way each page is
// hashed once. Pages of earlier prompts stay cached and are evicted by later
// ones, the same for both ways. What the chunked way adds is a step per
// chunk: the transaction, the chunk's validation and the row update.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "bench_device.h"
#include "kvblock/batch_commit.h"
#include "kvblock/block_manager.h"
#include "kvblock/device.h"
#include "kvblock/page_table.h"

namespace kvblock {
namespace {

constexpr int32_t kPageSize = 16;
constexpr int32_t kWidth = 2048;  // pages of a row: 32k tokens.

// Args: prompt tokens, chunk tokens (0: the whole prompt in one step),
// prompt hashed on arrival (1) or in the steps (0).
void BM_PrefillPrompt(benchmark::State& state) {
  const int64_t tokens = state.range(0);
  const int64_t chunk = state.range(1) == 0 ? tokens : state.range(1);
  const bool hash_on_arrival = state.range(2) != 0;
  PagedKvConfig config;
  config.page_size = kPageSize;
  config.max_pages_per_seq = kWidth;
  config.max_batch = 8;
  config.num_pages = 2 * kWidth;  // room for one prompt and a cached one.
  auto manager = BlockManager::Create(config, {});
  auto table = KVPageTable::Create(config.max_batch, kWidth, config.num_pages,
                                   BenchDevice());
  if (!manager.ok() || !table.ok()) {
    state.SkipWithError("cannot create the manager or the table");
    return;
  }
  auto commit = BatchCommit::Create(**manager, **table);
  if (!commit.ok()) {
    state.SkipWithError(commit.status().ToString().c_str());
    return;
  }
  if (absl::Status s = (*table)->Upload(nullptr).status(); !s.ok()) {
    state.SkipWithError(s.ToString().c_str());
    return;
  }
  std::vector<TokenId> prompt(static_cast<size_t>(tokens));
  std::vector<BlockHash> hashes(hash_on_arrival ? tokens / kPageSize : 0);
  SequenceId id = 0;
  double seconds = 0;
  int64_t steps = 0;
  // Runs one step and uploads its patch; false (reported) on failure.
  const auto step = [&](const StepPlan& plan) {
    absl::StatusOr<StepResult> result = (*commit)->Commit(plan);
    absl::Status status = result.status();
    if (status.ok()) status = (*table)->Upload(nullptr).status();
    if (!status.ok()) state.SkipWithError(status.ToString().c_str());
    ++steps;
    return status.ok();
  };
  for (auto _ : state) {
    // A unique prompt: no prefix hits.
    for (int64_t i = 0; i < tokens; ++i) {
      prompt[i] = static_cast<TokenId>((id * 7919 + i) % 32000);
    }
    if (hash_on_arrival) {
      const absl::Status hashed =
          (*manager)->HashPrompt(prompt, {}, absl::MakeSpan(hashes)).status();
      if (!hashed.ok()) {
        state.SkipWithError(hashed.ToString().c_str());
        return;
      }
    }
    const auto start = std::chrono::steady_clock::now();
    const JoinRequest join{.id = id,
                           .tokens = prompt,
                           .prompt_hashes = hashes,
                           .admit = {.prefill_tokens = chunk}};
    if (!step({.joins = absl::MakeConstSpan(&join, 1)})) return;
    for (int64_t done = chunk; done < tokens; done += chunk) {
      const PromptChunk next{
          .id = id,
          .tokens = absl::MakeConstSpan(prompt).subspan(
              static_cast<size_t>(done),
              static_cast<size_t>(std::min(chunk, tokens - done))),
          .prompt_hashes = hashes};
      if (!step({.prompt_chunks = absl::MakeConstSpan(&next, 1)})) return;
    }
    if (!step({.finished = absl::MakeConstSpan(&id, 1)})) return;
    const double prompt_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    seconds += prompt_seconds;
    state.SetIterationTime(prompt_seconds);
    ++id;
  }
  const double iterations = static_cast<double>(state.iterations());
  state.counters["ns_per_token"] =
      1e9 * seconds / (iterations * static_cast<double>(tokens));
  state.counters["steps"] = static_cast<double>(steps) / iterations;
  state.SetLabel(std::string(BenchDevice().name()));
}
BENCHMARK(BM_PrefillPrompt)
    ->ArgNames({"tokens", "chunk", "arrival"})
    ->ArgsProduct({{32000}, {0, 2048, 512}, {1, 0}})
    ->ArgsProduct({{4000}, {0, 512}, {1, 0}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kvblock
