// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// KV gather: the pages of a batch of slots into dense, zero-padded K and V
// tensors (the inverse of the KV write).
#include <cuda_runtime.h>

#include <cstdint>

#include "kernel_utils.cuh"
#include "launchers.h"

namespace kvblock::kernels {
namespace {

constexpr int kGatherThreads = 128;
constexpr int kWarpsPerBlock = kGatherThreads / 32;

// Grid: min(ceil(batch * max_len / 4), 2^30) blocks. Block: kGatherThreads
// threads, one warp per output row (slot, position) (grid-stride over rows),
// copying that token's K and V rows of `row_vecs` Vec-sized chunks or
// zero-filling them past the slot's length or on an unusable page id.
template <typename Vec>
__global__ void __launch_bounds__(kGatherThreads)
    GatherKvKernel(PagedKvPool pool, int32_t layer, PageTable table,
                   const int32_t* __restrict__ seq_lens, int32_t max_len,
                   int64_t num_rows, int64_t row_vecs,
                   Vec* __restrict__ key_out, Vec* __restrict__ value_out) {
  const Vec* pool_vecs = static_cast<const Vec*>(pool.data);
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t first = int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32;
  const int64_t stride = int64_t{gridDim.x} * kWarpsPerBlock;
  const int64_t layer_rows =
      int64_t{layer} * 2 * pool.num_pages * pool.page_size;
  for (int64_t out_row = first; out_row < num_rows; out_row += stride) {
    const int64_t slot = out_row / max_len;
    const int32_t position = static_cast<int32_t>(out_row % max_len);
    Vec* k_dst = key_out + out_row * row_vecs;
    Vec* v_dst = value_out + out_row * row_vecs;
    const int32_t logical_page = position / pool.page_size;
    bool present =
        position < seq_lens[slot] && logical_page < table.max_pages_per_seq;
    int32_t k_page = -1;
    int32_t v_page = -1;
    if (present) {
      const int32_t* row = table.data + slot * 2 * table.max_pages_per_seq;
      k_page = row[logical_page];
      v_page = row[table.max_pages_per_seq + logical_page];
      present = k_page >= 0 && k_page < pool.num_pages &&
                v_page >= pool.num_pages && v_page < 2 * pool.num_pages;
    }
    if (!present) {
      GroupZero(k_dst, row_vecs, lane, 32);
      GroupZero(v_dst, row_vecs, lane, 32);
      continue;
    }
    const int32_t in_page = position % pool.page_size;
    const int64_t k_row =
        layer_rows + int64_t{k_page} * pool.page_size + in_page;
    const int64_t v_row =
        layer_rows + int64_t{v_page} * pool.page_size + in_page;
    GroupCopy(pool_vecs + k_row * row_vecs, k_dst, row_vecs, lane, 32);
    GroupCopy(pool_vecs + v_row * row_vecs, v_dst, row_vecs, lane, 32);
  }
}

}  // namespace

int LaunchGatherKv(const PagedKvPool& pool, int32_t layer,
                   const PageTable& table, const int32_t* seq_lens,
                   int32_t batch, int32_t max_len, void* key_out,
                   void* value_out, void* stream) {
  const int64_t num_rows = int64_t{batch} * max_len;
  if (num_rows == 0) return cudaSuccess;
  const int64_t row_bytes = pool.RowBytes();
  const int width = VectorBytes(reinterpret_cast<uintptr_t>(pool.data) |
                                reinterpret_cast<uintptr_t>(key_out) |
                                reinterpret_cast<uintptr_t>(value_out) |
                                static_cast<uint64_t>(row_bytes));
  const int64_t blocks = (num_rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return DispatchVector(width, [&](auto vec) {
    using Vec = decltype(vec);
    GatherKvKernel<Vec><<<GridFor(blocks), kGatherThreads, 0,
                          static_cast<cudaStream_t>(stream)>>>(
        pool, layer, table, seq_lens, max_len, num_rows, row_bytes / width,
        static_cast<Vec*>(key_out), static_cast<Vec*>(value_out));
    return cudaGetLastError();
  });
}

}  // namespace kvblock::kernels
