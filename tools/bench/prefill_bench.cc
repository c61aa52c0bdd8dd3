// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Prefill benchmarks: the host cost of getting one long prompt into the cache
// through BatchCommit, whole or in chunks (chunked prefill), in steps of its
// own (BM_PrefillPrompt) or beside a decode batch (BM_PrefillBesideDecode,
// below). A prompt of
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
#include "evict_caches.h"
#include "kvblock/batch_commit.h"
#include "kvblock/block_manager.h"
#include "kvblock/device.h"
#include "kvblock/page_table.h"

namespace kvblock {
namespace {

constexpr int32_t kWidth = 2048;  // pages of a row: 32k tokens.

// A manager, its device table (uploaded whole once, as at a server's
// start) and the commit layer over them.
class PrefillRig {
 public:
  // False, reported to `state`, when a part cannot be made.
  bool Init(const PagedKvConfig& config, benchmark::State& state) {
    auto manager = BlockManager::Create(config, {});
    auto table = KVPageTable::Create(config.max_batch, config.max_pages_per_seq,
                                     config.num_pages, BenchDevice());
    if (!manager.ok() || !table.ok()) {
      state.SkipWithError("cannot create the manager or the table");
      return false;
    }
    manager_ = *std::move(manager);
    table_ = *std::move(table);
    auto commit = BatchCommit::Create(*manager_, *table_);
    if (!commit.ok()) {
      state.SkipWithError(commit.status().ToString().c_str());
      return false;
    }
    commit_ = *std::move(commit);
    return Report(table_->Upload(nullptr).status(), state);
  }
  // Commits one step and uploads its patch; false (reported) on failure.
  bool Step(const StepPlan& plan, benchmark::State& state) {
    absl::Status status = commit_->Commit(plan).status();
    if (status.ok()) status = table_->Upload(nullptr).status();
    return Report(status, state);
  }
  // Fills `prompt` with sequence `id`'s tokens, unique (no prefix hits;
  // token ids below 32,000), and hashes it into `hashes` unless that is empty
  // (on arrival, outside the time); false (reported) on failure.
  bool NewPrompt(SequenceId id, absl::Span<TokenId> prompt,
                 absl::Span<BlockHash> hashes, benchmark::State& state) {
    for (size_t i = 0; i < prompt.size(); ++i) {
      prompt[i] =
          static_cast<TokenId>((id * 7919 + static_cast<int64_t>(i)) % 32000);
    }
    if (hashes.empty()) return true;
    return Report(manager_->HashPrompt(prompt, {}, hashes).status(), state);
  }
  BatchCommit& commit() { return *commit_; }

 private:
  static bool Report(const absl::Status& status, benchmark::State& state) {
    if (!status.ok()) state.SkipWithError(status.ToString().c_str());
    return status.ok();
  }

  std::unique_ptr<BlockManager> manager_;
  std::unique_ptr<KVPageTable> table_;
  std::unique_ptr<BatchCommit> commit_;  // over the two above.
};

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
  PrefillRig rig;
  if (!rig.Init(config, state)) return;
  std::vector<TokenId> prompt(static_cast<size_t>(tokens));
  std::vector<BlockHash> hashes(hash_on_arrival ? tokens / kPageSize : 0);
  SequenceId id = 0;
  double seconds = 0;
  int64_t steps = 0;
  const auto step = [&](const StepPlan& plan) {
    ++steps;
    return rig.Step(plan, state);
  };
  for (auto _ : state) {
    if (!rig.NewPrompt(id, absl::MakeSpan(prompt), absl::MakeSpan(hashes),
                       state)) {
      return;
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

// The same prompt beside a running decode batch, as chunked prefill runs in
// a serving loop: every step appends a token to each of kDecoders sequences
// (their prompts of 64 to 79 tokens, so that every step some of them start a
// page) and carries the prompt's join or its next chunk. Args: prompt tokens
// (0: decode steps alone, the baseline), chunk tokens (0: the whole prompt in
// the first step), caches evicted before every step (1, outside the time,
// as a serving loop's own work between steps would; evict_caches.h) or not
// (0). Every variant times the same kPromptSteps steps and one more that
// finishes the prompt (commit and upload each), so the prompt's cost is a
// variant's time less the baseline's: what admitting it adds to the steps
// that run anyway. The decoders start afresh, outside the time, before their
// rows fill.
constexpr int32_t kDecoders = 64;
constexpr int32_t kDecoderPromptTokens = 64;
constexpr int64_t kPromptSteps = 16;  // 32,000 tokens in 2,048-token chunks.

void BM_PrefillBesideDecode(benchmark::State& state) {
  const int64_t tokens = state.range(0);
  const int64_t chunk = state.range(1) == 0 ? tokens : state.range(1);
  const bool cold = state.range(2) != 0;
  // A decoder's row, in pages, before it starts afresh.
  constexpr int32_t kDecoderPages = 64;
  PagedKvConfig config;
  config.page_size = kPageSize;
  config.max_pages_per_seq = kWidth;
  config.max_batch = 2 * kDecoders;
  // The prompt, a cached one, and the decoders at their longest.
  config.num_pages = 2 * kWidth + kDecoders * (kDecoderPages + 1);
  PrefillRig rig;
  if (!rig.Init(config, state)) return;
  std::vector<TokenId> prompt(static_cast<size_t>(tokens));
  std::vector<BlockHash> hashes(static_cast<size_t>(tokens / kPageSize));
  std::vector<std::vector<TokenId>> decoder_prompts(kDecoders);
  std::vector<SequenceId> decoders;
  std::vector<JoinRequest> joins;
  std::vector<int32_t> counts;
  std::vector<TokenId> appended(kDecoders, 7);
  SequenceId next_id = 0;
  int64_t decoded = 0;  // steps since the decoders started.
  const auto step = [&](const StepPlan& plan) { return rig.Step(plan, state); };
  // A step inside the time; with `cold`, after the caches are evicted.
  double iteration_seconds = 0;
  const auto timed_step = [&](const StepPlan& plan) {
    if (cold) EvictCaches();
    const auto start = std::chrono::steady_clock::now();
    const bool ok = step(plan);
    iteration_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    return ok;
  };
  // One token for every decoder, none for the prompt (which, with a chunk,
  // may not append in the same step).
  const auto decode_counts = [&](SequenceId prompt_id) {
    const absl::Span<const SequenceId> slots = rig.commit().slots();
    counts.assign(slots.size(), 1);
    for (size_t slot = 0; slot < slots.size(); ++slot) {
      if (slots[slot] == prompt_id) counts[slot] = 0;
    }
    return absl::MakeConstSpan(counts);
  };
  const auto tokens_for = [&](absl::Span<const int32_t> of) {
    return absl::MakeConstSpan(appended).first(
        static_cast<size_t>(std::count(of.begin(), of.end(), 1)));
  };
  double seconds = 0;
  for (auto _ : state) {
    if (decoders.empty() ||
        decoded + kPromptSteps + 1 >
            int64_t{kDecoderPages - kDecoderPromptTokens / kPageSize - 2} *
                kPageSize) {
      // Outside the time: the decoders leave and new ones join.
      if (!decoders.empty() && !step({.finished = decoders})) return;
      decoders.clear();
      joins.clear();
      for (int32_t i = 0; i < kDecoders; ++i) {
        std::vector<TokenId>& p = decoder_prompts[i];
        // Staggered lengths: every step some decoders start a page, as in
        // serving (in lockstep, 15 of 16 steps would change no row and
        // upload nothing, and the chunks would pay for the uploads alone).
        p.resize(kDecoderPromptTokens + i % kPageSize);
        for (size_t t = 0; t < p.size(); ++t) {
          // Apart from the prompts' ids (below 32,000): no prefix hits
          // between them.
          p[t] = static_cast<TokenId>(
              32000 + (next_id * 131 + static_cast<int64_t>(t)) % 1000);
        }
        decoders.push_back(next_id);
        joins.push_back({.id = next_id++, .tokens = p});
      }
      if (!step({.joins = joins})) return;
      decoded = 0;
    }
    const SequenceId id = next_id++;
    if (tokens > 0 && !rig.NewPrompt(id, absl::MakeSpan(prompt),
                                     absl::MakeSpan(hashes), state)) {
      return;
    }
    iteration_seconds = 0;
    for (int64_t s = 0; s < kPromptSteps; ++s) {
      const absl::Span<const int32_t> step_counts = decode_counts(id);
      StepPlan plan{.append_counts = step_counts,
                    .append_tokens = tokens_for(step_counts)};
      const JoinRequest join{.id = id,
                             .tokens = prompt,
                             .prompt_hashes = hashes,
                             .admit = {.prefill_tokens = chunk}};
      const int64_t done = s * chunk;
      const PromptChunk next{.id = id,
                             .tokens = absl::MakeConstSpan(prompt).subspan(
                                 static_cast<size_t>(std::min(done, tokens)),
                                 static_cast<size_t>(std::clamp<int64_t>(
                                     tokens - done, 0, chunk))),
                             .prompt_hashes = hashes};
      if (tokens > 0 && s == 0) plan.joins = absl::MakeConstSpan(&join, 1);
      if (tokens > 0 && s > 0 && done < tokens) {
        plan.prompt_chunks = absl::MakeConstSpan(&next, 1);
      }
      if (!timed_step(plan)) return;
    }
    // The step that finishes the prompt (a plain decode step without one).
    const absl::Span<const int32_t> last_counts = decode_counts(id);
    StepPlan last{.append_counts = last_counts,
                  .append_tokens = tokens_for(last_counts)};
    if (tokens > 0) last.finished = absl::MakeConstSpan(&id, 1);
    if (!timed_step(last)) return;
    decoded += kPromptSteps + 1;
    seconds += iteration_seconds;
    state.SetIterationTime(iteration_seconds);
  }
  state.counters["us_per_step"] =
      1e6 * seconds /
      (static_cast<double>(state.iterations()) * (kPromptSteps + 1));
  state.SetLabel(std::string(BenchDevice().name()));
}
BENCHMARK(BM_PrefillBesideDecode)
    ->ArgNames({"tokens", "chunk", "cold"})
    ->ArgsProduct({{0}, {0}, {0, 1}})
    ->ArgsProduct({{32000}, {0, 2048}, {0, 1}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kvblock
