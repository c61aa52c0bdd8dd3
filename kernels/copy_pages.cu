// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Batched page copy that executes copy-on-write: the K and V page of every
// layer for every (source, destination) pair, in one launch.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernel_utils.cuh"
#include "launchers.h"

namespace kvblock::kernels {
namespace {

constexpr int kCopyThreads = 256;

// Grid: min(num_items, 2^30) blocks; block `x` copies items x, x + gridDim.x,
// ..., where item = (copy * num_layers + layer) * 2 + (0 for K, 1 for V).
// Block: kCopyThreads threads moving one page of `page_vecs` Vec-sized chunks.
template <typename Vec>
__global__ void __launch_bounds__(kCopyThreads)
    CopyPagesKernel(PagedKvPool pool, const int32_t* __restrict__ copies,
                    int64_t num_items, int64_t page_vecs) {
  Vec* pages = static_cast<Vec*>(pool.data);
  const int64_t items_per_copy = 2 * int64_t{pool.num_layers};
  for (int64_t item = blockIdx.x; item < num_items; item += gridDim.x) {
    const int64_t copy = item / items_per_copy;
    const int64_t layer = (item % items_per_copy) / 2;
    const int32_t half = static_cast<int32_t>(item % 2);
    const int32_t source = copies[2 * copy];
    const int32_t destination = copies[2 * copy + 1];
    if (source < 0 || source >= pool.num_pages || destination < 0 ||
        destination >= pool.num_pages) {
      continue;  // Out-of-range pair: skipped (the host rejects it).
    }
    // Page index within the whole pool of this layer's K or V half.
    const int64_t half_base =
        layer * 2 * pool.num_pages + int64_t{half} * pool.num_pages;
    GroupCopy(pages + (half_base + source) * page_vecs,
              pages + (half_base + destination) * page_vecs, page_vecs,
              static_cast<int>(threadIdx.x), kCopyThreads);
  }
}

}  // namespace

int LaunchCopyPages(const PagedKvPool& pool, const int32_t* copies,
                    int64_t num_copies, void* stream) {
  if (num_copies == 0) return cudaSuccess;
  const int64_t page_bytes = int64_t{pool.page_size} * pool.RowBytes();
  const int width = VectorBytes(reinterpret_cast<uintptr_t>(pool.data) |
                                static_cast<uint64_t>(page_bytes));
  const int64_t num_items = num_copies * 2 * pool.num_layers;
  return DispatchVector(width, [&](auto vec) {
    using Vec = decltype(vec);
    CopyPagesKernel<Vec><<<GridFor(num_items), kCopyThreads, 0,
                           static_cast<cudaStream_t>(stream)>>>(
        pool, copies, num_items, page_bytes / width);
    return cudaGetLastError();
  });
}

}  // namespace kvblock::kernels
