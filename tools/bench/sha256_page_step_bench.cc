// Copyright 2026 The kvblock Authors.
//
// The two SHA-256 page steps side by side (lib/sha256_page_step.h): OpenSSL's
// compression function and the SHA extensions', each chained on its own
// output as a sequence's pages are. BM_HashPage measures the one a
// BlockHasher picks.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "sha256_page_step.h"

namespace kvblock::internal {
namespace {

// Args: implementation (0: OpenSSL, 1: SHA extensions), page_size.
void BM_Sha256PageStep(benchmark::State& state) {
  using Step = BlockHash (*)(const BlockHash&, absl::Span<const TokenId>);
  Step step = Sha256PageStepOpenSsl;
  if (state.range(0) != 0) {
#if KVBLOCK_SHA256_NI_ARCH
    step = Sha256PageStepNi;
#endif
    if (!CpuHasSha256Ni()) {
      state.SkipWithError("this CPU lacks the SHA extensions");
      return;
    }
  }
  std::vector<TokenId> page(static_cast<size_t>(state.range(1)));
  for (size_t i = 0; i < page.size(); ++i) {
    page[i] = static_cast<TokenId>((i * 7919) % 128256);
  }
  BlockHash parent;
  for (auto _ : state) {
    parent = step(parent, page);
    benchmark::DoNotOptimize(parent);
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() *
                          static_cast<int64_t>(sizeof(TokenId) * page.size()));
}
BENCHMARK(BM_Sha256PageStep)
    ->ArgNames({"extensions", "page_size"})
    ->ArgsProduct({{0, 1}, {16, 64}});

}  // namespace
}  // namespace kvblock::internal
