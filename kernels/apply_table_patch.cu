// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// The page-table patch kernel: KVPageTable::Upload copies one packed patch
// (K ids and ranges) to the device per upload, and this kernel writes it into
// both halves of the device table, deriving the V ids.
#include <cuda_runtime.h>

#include <cstdint>

#include "launchers.h"

namespace kvblock::kernels {
namespace {

constexpr int kPatchThreads = 256;
constexpr int kWarp = 32;
constexpr int kRangesPerBlock = kPatchThreads / kWarp;

// Grid: ceil(num_ranges / kRangesPerBlock) blocks. Block: kPatchThreads
// threads, warp `w` of block `b` applying range b * kRangesPerBlock + w, its
// lanes striding over the range's entries (a decode range is one id).
__global__ void __launch_bounds__(kPatchThreads)
    ApplyPageTablePatchKernel(int32_t* __restrict__ table, int32_t max_batch,
                              int32_t width, int32_t num_pages,
                              const int32_t* __restrict__ ids,
                              const TablePatchRange* __restrict__ ranges,
                              int32_t num_ranges) {
  const int64_t r = int64_t{blockIdx.x} * kRangesPerBlock + threadIdx.x / kWarp;
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  if (r >= num_ranges) return;
  const TablePatchRange range = ranges[r];
  const int64_t slot = range.entry / width;
  const int64_t first = range.entry % width;
  if (range.entry < 0 || slot >= max_batch || range.count < 0 ||
      range.clear < 0 || range.ids_offset < 0 ||
      first + range.count + range.clear > width) {
    return;  // Does not fit the table: skipped (the host never builds one).
  }
  int32_t* const k = table + slot * 2 * width + first;
  int32_t* const v = k + width;
  const int32_t* const source = ids + range.ids_offset;
  for (int32_t i = lane; i < range.count; i += kWarp) {
    const int32_t id = source[i];
    k[i] = id;
    v[i] = id + num_pages;
  }
  const int32_t end = range.count + range.clear;
  for (int32_t i = range.count + lane; i < end; i += kWarp) {
    k[i] = -1;
    v[i] = -1;
  }
}

}  // namespace

int LaunchApplyPageTablePatch(int32_t* table, int32_t max_batch,
                              int32_t max_pages_per_seq, int32_t num_pages,
                              const int32_t* ids, const TablePatchRange* ranges,
                              int32_t num_ranges, void* stream) {
  if (num_ranges <= 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>(
      (int64_t{num_ranges} + kRangesPerBlock - 1) / kRangesPerBlock);
  ApplyPageTablePatchKernel<<<blocks, kPatchThreads, 0,
                              static_cast<cudaStream_t>(stream)>>>(
      table, max_batch, max_pages_per_seq, num_pages, ids, ranges, num_ranges);
  return cudaGetLastError();
}

}  // namespace kvblock::kernels
