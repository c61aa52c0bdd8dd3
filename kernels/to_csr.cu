// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Page table -> FlashInfer's CSR paged-KV layout (kv_indptr, kv_indices,
// kv_last_page_len), on the device, so that a serving step needs no host
// round trip between the table upload and the attention call.
#include <cuda_runtime.h>

#include <cstdint>

#include "launchers.h"

namespace kvblock::kernels {
namespace {

constexpr int kCsrThreads = 1024;
constexpr int kCsrWarps = kCsrThreads / 32;

// Grid: 1 block. Block: kCsrThreads threads. First a block-wide inclusive
// scan of the slots' page counts, kCsrThreads slots at a time with a carry,
// writing kv_indptr and kv_last_page_len; then one warp per slot copies the
// slot's K page ids into kv_indices.
__global__ void __launch_bounds__(kCsrThreads)
    ToCsrKernel(PageTable table, int32_t page_size,
                const int32_t* __restrict__ seq_lens, int32_t batch,
                int32_t* __restrict__ kv_indptr,
                int32_t* __restrict__ kv_indices,
                int32_t* __restrict__ kv_last_page_len) {
  __shared__ int32_t warp_totals[kCsrWarps];
  __shared__ int32_t carry;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int32_t max_tokens = table.max_pages_per_seq * page_size;
  if (threadIdx.x == 0) {
    carry = 0;
    kv_indptr[0] = 0;
  }
  __syncthreads();
  for (int32_t chunk = 0; chunk < batch; chunk += kCsrThreads) {
    const int32_t slot = chunk + static_cast<int32_t>(threadIdx.x);
    int32_t pages = 0;
    if (slot < batch) {
      const int32_t len = min(max(seq_lens[slot], 0), max_tokens);
      pages = static_cast<int32_t>((int64_t{len} + page_size - 1) / page_size);
      kv_last_page_len[slot] = len == 0 ? 0 : len - (pages - 1) * page_size;
    }
    int32_t sum = pages;  // Inclusive scan within the warp...
#pragma unroll
    for (int offset = 1; offset < 32; offset *= 2) {
      const int32_t other = __shfl_up_sync(0xffffffffu, sum, offset);
      if (lane >= offset) sum += other;
    }
    if (lane == 31) warp_totals[warp] = sum;
    __syncthreads();
    if (warp == 0) {  // ...then over the warps' totals.
      int32_t total = warp_totals[lane];
#pragma unroll
      for (int offset = 1; offset < 32; offset *= 2) {
        const int32_t other = __shfl_up_sync(0xffffffffu, total, offset);
        if (lane >= offset) total += other;
      }
      warp_totals[lane] = total;
    }
    __syncthreads();
    const int32_t inclusive =
        carry + sum + (warp > 0 ? warp_totals[warp - 1] : 0);
    if (slot < batch) kv_indptr[slot + 1] = inclusive;
    __syncthreads();  // Everyone has read carry and warp_totals.
    if (threadIdx.x == kCsrThreads - 1) carry = inclusive;
    __syncthreads();
  }
  // kv_indptr, written above by this block, is visible after the barrier.
  for (int32_t slot = warp; slot < batch; slot += kCsrWarps) {
    const int32_t begin = kv_indptr[slot];
    const int32_t count = kv_indptr[slot + 1] - begin;
    const int32_t* k_ids =
        table.data + int64_t{slot} * 2 * table.max_pages_per_seq;
    for (int32_t i = lane; i < count; i += 32) kv_indices[begin + i] = k_ids[i];
  }
}

}  // namespace

int LaunchToCsr(const PageTable& table, int32_t page_size,
                const int32_t* seq_lens, int32_t batch, int32_t* kv_indptr,
                int32_t* kv_indices, int32_t* kv_last_page_len, void* stream) {
  if (batch == 0) return cudaSuccess;
  ToCsrKernel<<<1, kCsrThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      table, page_size, seq_lens, batch, kv_indptr, kv_indices,
      kv_last_page_len);
  return cudaGetLastError();
}

}  // namespace kvblock::kernels
