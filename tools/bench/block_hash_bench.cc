// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Block hashing: the cost of hashing one full page (the work done whenever a
// page fills and is registered in the prefix cache), and of hashing a whole
// prompt's chain (the work before a prefix lookup at admission). Bytes are
// token bytes (4 per token); items are pages.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kvblock/block_hash.h"

namespace kvblock {
namespace {

// A per-tenant salt of a typical length (a UUID).
constexpr absl::string_view kSalt = "3f2a9c1e-7b4d-4e8a-9f10-2c6d8e1b5a70";

std::vector<TokenId> Tokens(int64_t count) {
  std::vector<TokenId> tokens(static_cast<size_t>(count));
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<TokenId>((i * 7919) % 128256);
  }
  return tokens;
}

// Args: algorithm id, page_size.
void BM_HashPage(benchmark::State& state) {
  const auto algorithm = static_cast<HashAlgorithm>(state.range(0));
  const int32_t page_size = static_cast<int32_t>(state.range(1));
  absl::StatusOr<BlockHasher> hasher =
      BlockHasher::Create(algorithm, page_size);
  if (!hasher.ok()) {
    state.SkipWithError(hasher.status().ToString().c_str());
    return;
  }
  const std::vector<TokenId> page = Tokens(page_size);
  BlockHash parent = hasher->RootHash({kSalt, 0});
  for (auto _ : state) {
    parent = hasher->HashPage(parent, page);
    benchmark::DoNotOptimize(parent);
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * page_size *
                          static_cast<int64_t>(sizeof(TokenId)));
  state.SetLabel(std::string(HashAlgorithmName(algorithm)));
}
BENCHMARK(BM_HashPage)
    ->ArgNames({"alg", "page_size"})
    ->Args({static_cast<int64_t>(HashAlgorithm::kSha256), 16})
    ->Args({static_cast<int64_t>(HashAlgorithm::kSha256), 64})
    ->Args({static_cast<int64_t>(HashAlgorithm::kXxh3_128), 16})
    ->Args({static_cast<int64_t>(HashAlgorithm::kXxh3_128), 64});

// Args: algorithm id, prompt tokens; pages of 16 tokens.
void BM_HashChain(benchmark::State& state) {
  constexpr int32_t kPageSize = 16;
  const auto algorithm = static_cast<HashAlgorithm>(state.range(0));
  const int64_t prompt_tokens = state.range(1);
  absl::StatusOr<BlockHasher> hasher =
      BlockHasher::Create(algorithm, kPageSize);
  if (!hasher.ok()) {
    state.SkipWithError(hasher.status().ToString().c_str());
    return;
  }
  const std::vector<TokenId> prompt = Tokens(prompt_tokens);
  std::vector<BlockHash> hashes(static_cast<size_t>(prompt_tokens / kPageSize));
  const HashExtraKeys extra = {kSalt, 0};
  for (auto _ : state) {
    absl::StatusOr<int64_t> pages =
        HashChain(*hasher, prompt, extra, absl::MakeSpan(hashes));
    benchmark::DoNotOptimize(pages);
    benchmark::DoNotOptimize(hashes.data());
  }
  state.SetItemsProcessed(state.iterations() *
                          static_cast<int64_t>(hashes.size()));
  state.SetBytesProcessed(state.iterations() * prompt_tokens *
                          static_cast<int64_t>(sizeof(TokenId)));
  state.SetLabel(std::string(HashAlgorithmName(algorithm)));
}
BENCHMARK(BM_HashChain)
    ->ArgNames({"alg", "tokens"})
    ->Args({static_cast<int64_t>(HashAlgorithm::kSha256), 4096})
    ->Args({static_cast<int64_t>(HashAlgorithm::kXxh3_128), 4096});

}  // namespace
}  // namespace kvblock
