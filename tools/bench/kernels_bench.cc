// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Kernels of kvblock/kernels.h: page copy, the host tier's copies, KV write,
// KV gather and paged decode attention, plus a device-to-device memcpy as the
// bandwidth ceiling (tools/gpu-check divides each kernel's rate by it) and,
// for the host tier, pinned host-device memcpys of as many bytes as the
// copy batch (its ceiling over PCIe or NVLink). On CUDA device 0 when
// there is one, at batch 64 x 4096 tokens (8 KV heads, head_dim 128, bf16,
// pages of 16 tokens); otherwise on the host device (the CPU references) at
// batch 4 x 256 tokens, 2 KV heads, head_dim 64.
//
// bytes_per_second counts bytes read plus bytes written (a copy of N bytes
// moves 2N), for the memcpy and the kernels alike. Each iteration enqueues 10
// launches and then synchronizes; the time is wall-clock (manual time).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bench_device.h"
#include "kvblock/config.h"
#include "kvblock/device.h"
#include "kvblock/kernels.h"
#include "kvblock/page_table.h"
#include "kvblock/status_macros.h"

namespace kvblock {
namespace {

constexpr int kLaunchesPerIteration = 10;

// The batch the benchmarks run: every slot holds `context` tokens.
struct Geometry {
  int32_t batch;
  int32_t context;
  int32_t num_kv_heads;
  int32_t head_dim;
  int32_t page_size;

  PagedKvConfig Config(int32_t num_layers) const {
    PagedKvConfig config;
    config.max_batch = batch;
    config.max_pages_per_seq = context / page_size;
    config.num_pages = batch * config.max_pages_per_seq;
    config.page_size = page_size;
    config.num_layers = num_layers;
    config.num_kv_heads = num_kv_heads;
    config.head_dim = head_dim;
    config.dtype = DType::kBf16;
    return config;
  }
  int64_t RowBytes() const {
    return int64_t{num_kv_heads} * head_dim * DTypeSize(DType::kBf16);
  }
};

const Geometry& BenchGeometry() {
  static const Geometry geometry = BenchDevice().kind() == Device::Kind::kCuda
                                       ? Geometry{64, 4096, 8, 128, 16}
                                       : Geometry{4, 256, 2, 64, 16};
  return geometry;
}

// Device memory holding `values`.
template <typename T>
absl::StatusOr<DeviceBuffer> Upload(Device& device,
                                    const std::vector<T>& values) {
  const size_t bytes = values.size() * sizeof(T);
  KVBLOCK_ASSIGN_OR_RETURN(DeviceBuffer buffer, device.Allocate(bytes));
  KVBLOCK_RETURN_IF_ERROR(
      device.CopyToDevice(values.data(), buffer.data(), bytes, nullptr));
  KVBLOCK_RETURN_IF_ERROR(device.Synchronize(nullptr));
  return buffer;
}

// A zero-filled pool of `num_layers` layers and an identity page table whose
// slots all hold BenchGeometry().context tokens.
struct PagedSetup {
  PagedKvConfig config;
  DeviceBuffer pool;
  std::unique_ptr<KVPageTable> table;
  DeviceBuffer seq_lens;

  static absl::StatusOr<PagedSetup> Create(Device& device, int32_t num_layers) {
    const Geometry& g = BenchGeometry();
    PagedSetup setup;
    setup.config = g.Config(num_layers);
    KVBLOCK_ASSIGN_OR_RETURN(setup.pool,
                             device.Allocate(static_cast<size_t>(
                                 setup.config.LayerPoolBytes() * num_layers)));
    KVBLOCK_ASSIGN_OR_RETURN(
        setup.table, KVPageTable::Create(setup.config.max_batch,
                                         setup.config.max_pages_per_seq,
                                         setup.config.num_pages, device));
    KVBLOCK_RETURN_IF_ERROR(setup.table->SetIdentity());
    KVBLOCK_RETURN_IF_ERROR(setup.table->Upload(nullptr).status());
    KVBLOCK_ASSIGN_OR_RETURN(
        setup.seq_lens,
        Upload(device, std::vector<int32_t>(g.batch, g.context)));
    return setup;
  }

  KvPool kv_pool() const { return {config, pool.data()}; }
  KvBatch batch() const {
    return {table->kernel_view(), static_cast<const int32_t*>(seq_lens.data()),
            config.max_batch};
  }
};

// Times kLaunchesPerIteration calls of `launch` per iteration (after one
// untimed warm-up call) and reports `bytes_per_launch` moved per call.
template <typename Launch>
void TimeLaunches(benchmark::State& state, int64_t bytes_per_launch,
                  Launch&& launch) {
  Device& device = BenchDevice();
  if (absl::Status status = launch(); !status.ok()) {
    state.SkipWithError(status.ToString().c_str());
    return;
  }
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    absl::Status status;
    for (int i = 0; i < kLaunchesPerIteration && status.ok(); ++i) {
      status = launch();
    }
    if (status.ok()) status = device.Synchronize(nullptr);
    if (!status.ok()) {
      state.SkipWithError(status.ToString().c_str());
      break;
    }
    state.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count());
  }
  state.SetBytesProcessed(state.iterations() * kLaunchesPerIteration *
                          bytes_per_launch);
  state.SetLabel(std::string(device.name()));
}

// The bandwidth ceiling: cudaMemcpy device to device (memcpy on the host) of
// as many bytes as a layer of the pool holds.
void BM_KernelD2DCopy(benchmark::State& state) {
  Device& device = BenchDevice();
  const auto bytes =
      static_cast<size_t>(BenchGeometry().Config(1).LayerPoolBytes());
  absl::StatusOr<DeviceBuffer> source = device.Allocate(bytes);
  absl::StatusOr<DeviceBuffer> target = device.Allocate(bytes);
  if (!source.ok() || !target.ok()) {
    state.SkipWithError("allocation failed");
    return;
  }
  TimeLaunches(state, 2 * static_cast<int64_t>(bytes), [&] {
    return device.CopyDeviceToDevice(source->data(), target->data(), bytes,
                                     nullptr);
  });
}
BENCHMARK(BM_KernelD2DCopy)->UseManualTime();

// The host tier's copies: a batch of a quarter of the pool's pages (K and V,
// 4 layers) stored into (direction 0) or loaded from (1) pinned host pages,
// one RunHostCopies launch; on CUDA the kernel reads and writes the host
// memory in place, over the bus. Also the copy engine's rate for as many
// bytes (`memcpy:1`: cudaMemcpyAsync between pinned and device memory, one
// contiguous block), the ceiling the kernel's rate is set against.
void BM_KernelHostCopies(benchmark::State& state) {
  constexpr int32_t kLayers = 4;
  const bool load = state.range(0) != 0;
  const bool memcpy_only = state.range(1) != 0;
  Device& device = BenchDevice();
  absl::StatusOr<PagedSetup> setup = PagedSetup::Create(device, kLayers);
  if (!setup.ok()) {
    state.SkipWithError(setup.status().ToString().c_str());
    return;
  }
  const int32_t num_copies = setup->config.num_pages / 4;
  const auto bytes = static_cast<size_t>(num_copies) *
                     static_cast<size_t>(HostPageBytes(setup->config));
  absl::StatusOr<PinnedBuffer> host = device.AllocatePinned(bytes);
  if (!host.ok()) {
    state.SkipWithError(host.status().ToString().c_str());
    return;
  }
  if (memcpy_only) {
    TimeLaunches(state, static_cast<int64_t>(bytes), [&] {
      return load ? device.CopyToDevice(host->data(), setup->pool.data(), bytes,
                                        nullptr)
                  : device.CopyToHost(setup->pool.data(), host->data(), bytes,
                                      nullptr);
    });
    return;
  }
  std::vector<HostCopy> list;
  for (int32_t i = 0; i < num_copies; ++i) {
    // Every second device page: the kernel gathers and scatters pages.
    list.push_back({2 * i, i,
                    load ? HostCopy::Direction::kHostToDevice
                         : HostCopy::Direction::kDeviceToHost});
  }
  absl::StatusOr<DeviceBuffer> copies = Upload(device, list);
  if (!copies.ok()) {
    state.SkipWithError(copies.status().ToString().c_str());
    return;
  }
  TimeLaunches(state, static_cast<int64_t>(bytes), [&] {
    return RunHostCopies(device, setup->kv_pool(), {host->data(), num_copies},
                         static_cast<const HostCopy*>(copies->data()),
                         num_copies, nullptr);
  });
  state.counters["pages"] = num_copies;
}
// bytes_per_second here counts the bytes that cross the bus once (the
// direction's), not read plus written: a bus moves them one way.
BENCHMARK(BM_KernelHostCopies)
    ->ArgNames({"load", "memcpy"})
    ->ArgsProduct({{0, 1}, {0, 1}})
    ->UseManualTime();

// Copy-on-write of a quarter of the pages (K and V, 4 layers): sources in the
// first half of the pool, destinations in the second.
void BM_KernelCopyPages(benchmark::State& state) {
  constexpr int32_t kLayers = 4;
  Device& device = BenchDevice();
  absl::StatusOr<PagedSetup> setup = PagedSetup::Create(device, kLayers);
  if (!setup.ok()) {
    state.SkipWithError(setup.status().ToString().c_str());
    return;
  }
  const int32_t num_pages = setup->config.num_pages;
  std::vector<PageId> pairs;
  for (PageId i = 0; i < num_pages / 4; ++i) {
    pairs.push_back(i);
    pairs.push_back(num_pages / 2 + i);
  }
  absl::StatusOr<DeviceBuffer> copies = Upload(device, pairs);
  if (!copies.ok()) {
    state.SkipWithError(copies.status().ToString().c_str());
    return;
  }
  const int64_t num_copies = num_pages / 4;
  const int64_t bytes =
      2 * num_copies * kLayers * 2 * setup->config.PageBytes();
  TimeLaunches(state, bytes, [&] {
    return CopyPages(device, setup->kv_pool(),
                     static_cast<const PageId*>(copies->data()), num_copies,
                     nullptr);
  });
}
BENCHMARK(BM_KernelCopyPages)->UseManualTime();

// A prefill-sized write: a quarter of every slot's context.
void BM_KernelWriteKv(benchmark::State& state) {
  Device& device = BenchDevice();
  const Geometry& g = BenchGeometry();
  absl::StatusOr<PagedSetup> setup = PagedSetup::Create(device, 1);
  if (!setup.ok()) {
    state.SkipWithError(setup.status().ToString().c_str());
    return;
  }
  const int32_t per_slot = g.context / 4;
  const int64_t num_tokens = int64_t{g.batch} * per_slot;
  std::vector<SlotId> slots(num_tokens);
  std::vector<int32_t> positions(num_tokens);
  for (int64_t i = 0; i < num_tokens; ++i) {
    slots[i] = static_cast<SlotId>(i / per_slot);
    positions[i] = static_cast<int32_t>(i % per_slot);
  }
  const auto kv_bytes = static_cast<size_t>(num_tokens * g.RowBytes());
  absl::StatusOr<DeviceBuffer> key = device.Allocate(kv_bytes);
  absl::StatusOr<DeviceBuffer> value = device.Allocate(kv_bytes);
  absl::StatusOr<DeviceBuffer> slots_buffer = Upload(device, slots);
  absl::StatusOr<DeviceBuffer> positions_buffer = Upload(device, positions);
  if (!key.ok() || !value.ok() || !slots_buffer.ok() ||
      !positions_buffer.ok()) {
    state.SkipWithError("allocation failed");
    return;
  }
  const KvTokens tokens = {
      key->data(), value->data(),
      static_cast<const SlotId*>(slots_buffer->data()),
      static_cast<const int32_t*>(positions_buffer->data()), num_tokens};
  // K and V read and written, plus slot and position reads.
  const int64_t bytes = 4 * static_cast<int64_t>(kv_bytes) + num_tokens * 8;
  TimeLaunches(state, bytes, [&] {
    return WriteKv(device, setup->kv_pool(), 0, setup->table->kernel_view(),
                   tokens, nullptr);
  });
}
BENCHMARK(BM_KernelWriteKv)->UseManualTime();

// Gather of every slot's full context.
void BM_KernelGatherKv(benchmark::State& state) {
  Device& device = BenchDevice();
  const Geometry& g = BenchGeometry();
  absl::StatusOr<PagedSetup> setup = PagedSetup::Create(device, 1);
  if (!setup.ok()) {
    state.SkipWithError(setup.status().ToString().c_str());
    return;
  }
  const auto out_bytes =
      static_cast<size_t>(int64_t{g.batch} * g.context * g.RowBytes());
  absl::StatusOr<DeviceBuffer> key = device.Allocate(out_bytes);
  absl::StatusOr<DeviceBuffer> value = device.Allocate(out_bytes);
  if (!key.ok() || !value.ok()) {
    state.SkipWithError("allocation failed");
    return;
  }
  TimeLaunches(state, 4 * static_cast<int64_t>(out_bytes), [&] {
    return GatherKv(device, setup->kv_pool(), 0, setup->batch(), g.context,
                    key->data(), value->data(), nullptr);
  });
}
BENCHMARK(BM_KernelGatherKv)->UseManualTime();

// Decode attention over every slot's full context. Arg: query heads per KV
// head (the GQA group).
void BM_KernelPagedDecode(benchmark::State& state) {
  Device& device = BenchDevice();
  const Geometry& g = BenchGeometry();
  const auto num_q_heads =
      static_cast<int32_t>(g.num_kv_heads * state.range(0));
  absl::StatusOr<PagedSetup> setup = PagedSetup::Create(device, 1);
  if (!setup.ok()) {
    state.SkipWithError(setup.status().ToString().c_str());
    return;
  }
  const int64_t workspace_bytes =
      PagedDecodeWorkspaceBytes(setup->config, g.batch, num_q_heads);
  const auto q_bytes = static_cast<size_t>(
      int64_t{g.batch} * num_q_heads * g.head_dim * DTypeSize(DType::kBf16));
  absl::StatusOr<DeviceBuffer> query = device.Allocate(q_bytes);
  absl::StatusOr<DeviceBuffer> out = device.Allocate(q_bytes);
  absl::StatusOr<DeviceBuffer> workspace = device.Allocate(
      static_cast<size_t>(std::max<int64_t>(workspace_bytes, 1)));
  if (!query.ok() || !out.ok() || !workspace.ok()) {
    state.SkipWithError("allocation failed");
    return;
  }
  const DecodeQuery decode = {query->data(), num_q_heads, 0.088f};
  // Every K and V row of the batch read once, the query read, out written.
  const int64_t bytes =
      2 * int64_t{g.batch} * g.context * g.RowBytes() + 2 * q_bytes;
  TimeLaunches(state, bytes, [&] {
    return PagedDecodeAttention(device, setup->kv_pool(), 0, setup->batch(),
                                decode, workspace->data(), workspace_bytes,
                                out->data(), nullptr);
  });
}
BENCHMARK(BM_KernelPagedDecode)
    ->ArgName("group")
    ->Arg(1)
    ->Arg(4)
    ->Arg(8)
    ->UseManualTime();

}  // namespace
}  // namespace kvblock
