// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// BlockPool benchmarks, each at pools of 1,000 and 1,000,000 pages: the cost
// per operation must not grow with the pool.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "kvblock/block_pool.h"

namespace kvblock {
namespace {

constexpr int kChain = 16;  // Pages per batch / prefix chain.

BlockHash BenchHash(uint32_t i) {
  BlockHash hash;
  for (int b = 0; b < 4; ++b) {
    hash.bytes[b] = static_cast<uint8_t>(i >> (8 * b));
    hash.bytes[8 + b] = static_cast<uint8_t>((i * 2654435761u) >> (8 * b));
  }
  return hash;
}

// A pool of state.range(0) pages, with a host tier of `host` times as many.
std::unique_ptr<BlockPool> MakePool(benchmark::State& state, int32_t host = 0) {
  const auto num_pages = static_cast<int32_t>(state.range(0));
  auto pool = BlockPool::Create(num_pages, {.host_pages = host * num_pages});
  if (!pool.ok()) {
    state.SkipWithError(pool.status().ToString().c_str());
    return nullptr;
  }
  return std::move(pool).value();
}

// A pool whose every page is cached under BenchHash(page) and evictable,
// released in page order (page 0 is the LRU head).
std::unique_ptr<BlockPool> MakeCachedPool(benchmark::State& state,
                                          int32_t host = 0) {
  std::unique_ptr<BlockPool> pool = MakePool(state, host);
  if (pool == nullptr) return nullptr;
  std::vector<PageId> pages(pool->num_pages());
  bool ok = pool->AllocateN(absl::MakeSpan(pages)).ok();
  for (PageId page : pages) {
    ok &= pool->RegisterCached(page, BenchHash(page)).ok();
  }
  for (PageId page : pages) ok &= pool->Release(page).ok();
  if (!ok) state.SkipWithError("setting up the cached pool failed");
  return pool;
}

// Allocate one page, release it (LIFO: the same page every time).
void BM_PoolAllocateRelease(benchmark::State& state) {
  std::unique_ptr<BlockPool> pool = MakePool(state);
  if (pool == nullptr) return;
  for (auto _ : state) {
    PageId page = *pool->Allocate();
    benchmark::DoNotOptimize(page);
    pool->Release(page).IgnoreError();
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_PoolAllocateRelease)->Arg(1000)->Arg(1000000);

// AllocateN of kChain pages, released last first; items are pages.
void BM_PoolAllocateNRelease(benchmark::State& state) {
  std::unique_ptr<BlockPool> pool = MakePool(state);
  if (pool == nullptr) return;
  PageId pages[kChain];
  for (auto _ : state) {
    pool->AllocateN(absl::MakeSpan(pages)).IgnoreError();
    benchmark::DoNotOptimize(pages);
    for (int i = kChain - 1; i >= 0; --i) pool->Release(pages[i]).IgnoreError();
  }
  state.SetItemsProcessed(state.iterations() * kChain);
}
BENCHMARK(BM_PoolAllocateNRelease)->Arg(1000)->Arg(1000000);

// Writable on a shared page (a copy), then undo it: release the copy and
// retain the source again.
void BM_PoolWritableCopy(benchmark::State& state) {
  std::unique_ptr<BlockPool> pool = MakePool(state);
  if (pool == nullptr) return;
  const PageId shared = *pool->Allocate();
  pool->Retain(shared).IgnoreError();
  for (auto _ : state) {
    CopyOnWrite cow = *pool->Writable(shared);
    benchmark::DoNotOptimize(cow);
    pool->Release(cow.page).IgnoreError();
    pool->Retain(shared).IgnoreError();
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_PoolWritableCopy)->Arg(1000)->Arg(1000000);

// Lookup of a cached hash, spread over the whole index (cache misses grow
// with the index, the work does not). Includes making the hash.
void BM_PoolCachedLookup(benchmark::State& state) {
  std::unique_ptr<BlockPool> pool = MakeCachedPool(state);
  if (pool == nullptr) return;
  const uint32_t n = static_cast<uint32_t>(pool->num_pages());
  uint32_t page = 0;
  for (auto _ : state) {
    page = (page + 7919u) % n;
    benchmark::DoNotOptimize(pool->Lookup(BenchHash(page)));
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_PoolCachedLookup)->Arg(1000)->Arg(1000000);

// A prefix hit of kChain evictable pages (revived), released last first back
// to the LRU tail; items are pages.
void BM_PoolAcquireCachedPrefixRevive(benchmark::State& state) {
  std::unique_ptr<BlockPool> pool = MakeCachedPool(state);
  if (pool == nullptr) return;
  const uint32_t n = static_cast<uint32_t>(pool->num_pages());
  std::vector<BlockHash> chain(kChain);
  PageId pages[kChain];
  uint32_t start = 0;
  for (auto _ : state) {
    for (int i = 0; i < kChain; ++i) chain[i] = BenchHash((start + i) % n);
    start = (start + 7919u) % n;
    const int32_t hits = *pool->AcquireCachedPrefix(chain, pages);
    for (int i = hits - 1; i >= 0; --i) pool->Release(pages[i]).IgnoreError();
  }
  state.SetItemsProcessed(state.iterations() * kChain);
}
BENCHMARK(BM_PoolAcquireCachedPrefixRevive)->Arg(1000)->Arg(1000000);

// Allocation that evicts the LRU head (every page is cached and evictable);
// the page is cached again under a new hash and released to the LRU tail.
// With `host` (host pages per page of the pool), each eviction stores the
// page in the host tier (its LRU head dropped once it is full), the copies
// taken every 64 allocations, as a step takes them.
void BM_PoolAllocateEvict(benchmark::State& state) {
  std::unique_ptr<BlockPool> pool =
      MakeCachedPool(state, static_cast<int32_t>(state.range(1)));
  if (pool == nullptr) return;
  std::vector<HostCopy> copies;
  copies.reserve(64);
  uint32_t next_hash = static_cast<uint32_t>(pool->num_pages());
  for (auto _ : state) {
    const PageId page = *pool->Allocate();
    pool->RegisterCached(page, BenchHash(next_hash++)).IgnoreError();
    pool->Release(page).IgnoreError();
    if (next_hash % 64 == 0) {
      copies.clear();
      pool->TakeHostCopies(copies).IgnoreError();
    }
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["host_stores"] =
      benchmark::Counter(static_cast<double>(pool->stats().host_stores),
                         benchmark::Counter::kAvgIterations);
}
BENCHMARK(BM_PoolAllocateEvict)
    ->ArgNames({"pages", "host"})
    ->ArgsProduct({{1000, 16384, 1000000}, {0, 10}});

// A transaction of kChain allocations (half of them evictions) rolled back;
// items are pages.
void BM_PoolTransactionRollback(benchmark::State& state) {
  std::unique_ptr<BlockPool> pool = MakeCachedPool(state);
  if (pool == nullptr) return;
  PageId pages[kChain / 2];
  pool->AllocateN(absl::MakeSpan(pages)).IgnoreError();  // Evicts 8 pages.
  for (int i = kChain / 2 - 1; i >= 0; --i) {
    pool->Release(pages[i]).IgnoreError();  // 8 plain free pages.
  }
  PageId batch[kChain];
  for (auto _ : state) {
    const BlockPool::Savepoint savepoint = pool->BeginTransaction();
    pool->AllocateN(absl::MakeSpan(batch)).IgnoreError();
    benchmark::DoNotOptimize(batch);
    pool->RollbackTransaction(savepoint).IgnoreError();
  }
  state.SetItemsProcessed(state.iterations() * kChain);
}
BENCHMARK(BM_PoolTransactionRollback)->Arg(1000)->Arg(1000000);

}  // namespace
}  // namespace kvblock
