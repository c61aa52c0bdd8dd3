// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// KV write: the K and V rows of new tokens into their pages, through the
// batched page table.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernel_utils.cuh"
#include "launchers.h"

namespace kvblock::kernels {
namespace {

constexpr int kWriteThreads = 128;
constexpr int kWarpsPerBlock = kWriteThreads / 32;

// Grid: min(ceil(num_tokens / 4), 2^30) blocks. Block: kWriteThreads threads,
// one warp per token (grid-stride over tokens), each warp copying the
// token's K row and V row of `row_vecs` Vec-sized chunks.
template <typename Vec>
__global__ void __launch_bounds__(kWriteThreads)
    WriteKvKernel(PagedKvPool pool, int32_t layer, PageTable table,
                  const Vec* __restrict__ key, const Vec* __restrict__ value,
                  const int32_t* __restrict__ slots,
                  const int32_t* __restrict__ positions, int64_t num_tokens,
                  int64_t row_vecs) {
  Vec* pool_vecs = static_cast<Vec*>(pool.data);
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t first = int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32;
  const int64_t stride = int64_t{gridDim.x} * kWarpsPerBlock;
  for (int64_t token = first; token < num_tokens; token += stride) {
    const int32_t slot = slots[token];
    const int32_t position = positions[token];
    // Padding (slot -1) and out-of-range inputs are skipped.
    if (slot < 0 || slot >= table.max_batch || position < 0) continue;
    const int32_t logical_page = position / pool.page_size;
    if (logical_page >= table.max_pages_per_seq) continue;
    const int32_t* row =
        table.data + int64_t{slot} * 2 * table.max_pages_per_seq;
    const int32_t k_page = row[logical_page];
    const int32_t v_page = row[table.max_pages_per_seq + logical_page];
    if (k_page < 0 || k_page >= pool.num_pages || v_page < pool.num_pages ||
        v_page >= 2 * pool.num_pages) {
      continue;
    }
    const int64_t layer_rows =
        int64_t{layer} * 2 * pool.num_pages * pool.page_size;
    const int32_t in_page = position % pool.page_size;
    const int64_t k_row =
        layer_rows + int64_t{k_page} * pool.page_size + in_page;
    const int64_t v_row =
        layer_rows + int64_t{v_page} * pool.page_size + in_page;
    GroupCopy(key + token * row_vecs, pool_vecs + k_row * row_vecs, row_vecs,
              lane, 32);
    GroupCopy(value + token * row_vecs, pool_vecs + v_row * row_vecs, row_vecs,
              lane, 32);
  }
}

}  // namespace

int LaunchWriteKv(const PagedKvPool& pool, int32_t layer,
                  const PageTable& table, const void* key, const void* value,
                  const int32_t* slots, const int32_t* positions,
                  int64_t num_tokens, void* stream) {
  if (num_tokens == 0) return cudaSuccess;
  const int64_t row_bytes = pool.RowBytes();
  const int width = VectorBytes(reinterpret_cast<uintptr_t>(pool.data) |
                                reinterpret_cast<uintptr_t>(key) |
                                reinterpret_cast<uintptr_t>(value) |
                                static_cast<uint64_t>(row_bytes));
  const int64_t blocks = (num_tokens + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return DispatchVector(width, [&](auto vec) {
    using Vec = decltype(vec);
    WriteKvKernel<Vec><<<GridFor(blocks), kWriteThreads, 0,
                         static_cast<cudaStream_t>(stream)>>>(
        pool, layer, table, static_cast<const Vec*>(key),
        static_cast<const Vec*>(value), slots, positions, num_tokens,
        row_bytes / width);
    return cudaGetLastError();
  });
}

}  // namespace kvblock::kernels
