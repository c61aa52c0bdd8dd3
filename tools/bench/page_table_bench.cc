// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// KVPageTable benchmarks on the host device at max_batch 256 and 1024,
// max_pages_per_seq 512 and 2048, with few (8) or many (all) rows changed per
// step. Rows are half full, as in a batch of half-length sequences. The
// arguments are (max_batch, max_pages_per_seq, many).
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "kvblock/device.h"
#include "kvblock/page_table.h"

namespace kvblock {
namespace {

constexpr int32_t kNumPages = 1 << 20;
constexpr int32_t kFewRows = 8;

struct Bench {
  std::unique_ptr<Device> device = Device::Host();
  std::unique_ptr<KVPageTable> table;
  // Two contents of the same length per slot, so every step changes rows.
  std::vector<PageId> ids[2];
  std::vector<SlotId> slots;  // the rows a step changes, spread evenly.
  std::vector<KVPageTableRowUpdate> updates[2];
};

// A full, uploaded table; nullptr (with the benchmark skipped) on error.
std::unique_ptr<Bench> MakeBench(benchmark::State& state) {
  const int32_t max_batch = static_cast<int32_t>(state.range(0));
  const int32_t width = static_cast<int32_t>(state.range(1));
  const bool many = state.range(2) != 0;
  state.SetLabel(many ? "many rows" : "few rows");
  auto bench = std::make_unique<Bench>();
  absl::StatusOr<std::unique_ptr<KVPageTable>> table =
      KVPageTable::Create(max_batch, width, kNumPages, *bench->device);
  if (!table.ok()) {
    state.SkipWithError(table.status().ToString().c_str());
    return nullptr;
  }
  bench->table = *std::move(table);
  const int32_t count = width / 2;
  for (int v = 0; v < 2; ++v) {
    bench->ids[v].resize(static_cast<size_t>(max_batch) * count);
    for (size_t i = 0; i < bench->ids[v].size(); ++i) {
      bench->ids[v][i] = static_cast<PageId>((i * 2 + v) % kNumPages);
    }
  }
  const int32_t changed = many ? max_batch : kFewRows;
  for (int32_t i = 0; i < changed; ++i) {
    bench->slots.push_back(i * (max_batch / changed));
  }
  for (int v = 0; v < 2; ++v) {
    for (SlotId slot : bench->slots) {
      bench->updates[v].push_back(
          {slot, bench->ids[v].data() + static_cast<size_t>(slot) * count,
           count});
    }
  }
  std::vector<KVPageTableRowUpdate> all;
  for (SlotId slot = 0; slot < max_batch; ++slot) {
    all.push_back({slot,
                   bench->ids[0].data() + static_cast<size_t>(slot) * count,
                   count});
  }
  if (!bench->table->SetRows(all).ok() || !bench->table->Upload(nullptr).ok()) {
    state.SkipWithError("setting up the table failed");
    return nullptr;
  }
  return bench;
}

void PageTableArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"batch", "pages", "many"})
      ->ArgsProduct({{256, 1024}, {512, 2048}, {0, 1}});
}

// SetRows of the changed rows, alternating their contents.
void BM_PageTableSetRows(benchmark::State& state) {
  std::unique_ptr<Bench> bench = MakeBench(state);
  if (bench == nullptr) return;
  int v = 1;
  for (auto _ : state) {
    benchmark::DoNotOptimize(bench->table->SetRows(bench->updates[v]));
    v ^= 1;
  }
  state.SetItemsProcessed(state.iterations() *
                          static_cast<int64_t>(bench->slots.size()));
}
BENCHMARK(BM_PageTableSetRows)->Apply(PageTableArgs);

// CompactRows of a full table: "few" swaps 4 pairs of rows (8 rows move),
// "many" rotates every row by one slot.
void BM_PageTableCompactRows(benchmark::State& state) {
  std::unique_ptr<Bench> bench = MakeBench(state);
  if (bench == nullptr) return;
  const int32_t max_batch = bench->table->max_batch();
  std::vector<SlotId> old_to_new(max_batch);
  for (SlotId slot = 0; slot < max_batch; ++slot) {
    old_to_new[slot] = state.range(2) != 0 ? (slot + 1) % max_batch : slot;
  }
  int64_t moved = max_batch;
  if (state.range(2) == 0) {
    for (size_t i = 0; i + 1 < bench->slots.size(); i += 2) {
      std::swap(old_to_new[bench->slots[i]], old_to_new[bench->slots[i + 1]]);
    }
    moved = kFewRows;
  }
  for (auto _ : state) {
    benchmark::DoNotOptimize(bench->table->CompactRows(old_to_new, max_batch));
  }
  state.SetItemsProcessed(state.iterations() * moved);
}
BENCHMARK(BM_PageTableCompactRows)->Apply(PageTableArgs);

// Upload after SetRows of the changed rows: planning, staging and the copies
// (memcpy on the host device). Only Upload is timed.
void BM_PageTableUpload(benchmark::State& state) {
  std::unique_ptr<Bench> bench = MakeBench(state);
  if (bench == nullptr) return;
  const int64_t bytes_before = bench->device->stats().bytes;
  int v = 1;
  for (auto _ : state) {
    if (!bench->table->SetRows(bench->updates[v]).ok()) {
      state.SkipWithError("SetRows failed");
      break;
    }
    v ^= 1;
    const auto start = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(bench->table->Upload(nullptr));
    state.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count());
  }
  state.SetItemsProcessed(state.iterations() *
                          static_cast<int64_t>(bench->slots.size()));
  state.SetBytesProcessed(bench->device->stats().bytes - bytes_before);
}
BENCHMARK(BM_PageTableUpload)->Apply(PageTableArgs)->UseManualTime();

// Upload with nothing changed: no device operation.
void BM_PageTableUploadClean(benchmark::State& state) {
  std::unique_ptr<Bench> bench = MakeBench(state);
  if (bench == nullptr) return;
  for (auto _ : state) {
    benchmark::DoNotOptimize(bench->table->Upload(nullptr));
  }
}
BENCHMARK(BM_PageTableUploadClean)
    ->ArgNames({"batch", "pages", "many"})
    ->ArgsProduct({{256, 1024}, {512, 2048}, {0}});

}  // namespace
}  // namespace kvblock
