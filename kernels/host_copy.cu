// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// The host tier's copies: pages moved between the paged KV pool and pinned
// host memory, read and written in place by the kernel (zero copy), one
// direction a launch.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernel_utils.cuh"
#include "launchers.h"

namespace kvblock::kernels {
namespace {

constexpr int kHostCopyThreads = 256;

// Grid: min(num_items, 2^30) blocks; block `x` copies items x, x + gridDim.x,
// ..., where item = (copy * num_layers + layer) * 2 + (0 for K, 1 for V).
// Block: kHostCopyThreads threads moving one page of `page_vecs` Vec-sized
// chunks between the pool and host page `host_page`'s slot of the item.
template <typename Vec>
__global__ void __launch_bounds__(kHostCopyThreads)
    HostCopyKernel(PagedKvPool pool, Vec* __restrict__ host, int32_t host_pages,
                   const HostPageCopy* __restrict__ copies, int64_t num_items,
                   int64_t page_vecs, uint8_t direction) {
  Vec* pages = static_cast<Vec*>(pool.data);
  const int64_t items_per_copy = 2 * int64_t{pool.num_layers};
  for (int64_t item = blockIdx.x; item < num_items; item += gridDim.x) {
    const HostPageCopy copy = copies[item / items_per_copy];
    if (copy.direction != direction || copy.device_page < 0 ||
        copy.device_page >= pool.num_pages || copy.host_page < 0 ||
        copy.host_page >= host_pages) {
      continue;  // the other direction, or out of range (the host rejects).
    }
    const int64_t layer = (item % items_per_copy) / 2;
    const int64_t half = item % 2;
    // The K page of layer l is page l * 2 * num_pages + p, the V page
    // num_pages after it; a host page holds layer l's K, then its V.
    Vec* device_page = pages + (layer * 2 * pool.num_pages +
                                half * pool.num_pages + copy.device_page) *
                                   page_vecs;
    Vec* host_page =
        host + (int64_t{copy.host_page} * items_per_copy + layer * 2 + half) *
                   page_vecs;
    if (direction == 0) {
      GroupCopy(device_page, host_page, page_vecs,
                static_cast<int>(threadIdx.x), kHostCopyThreads);
    } else {
      GroupCopy(host_page, device_page, page_vecs,
                static_cast<int>(threadIdx.x), kHostCopyThreads);
    }
  }
}

}  // namespace

int LaunchHostCopies(const PagedKvPool& pool, void* host, int32_t host_pages,
                     const HostPageCopy* copies, int64_t num_copies,
                     uint8_t direction, void* stream) {
  if (num_copies == 0) return cudaSuccess;
  const int64_t page_bytes = int64_t{pool.page_size} * pool.RowBytes();
  const int width = VectorBytes(reinterpret_cast<uintptr_t>(pool.data) |
                                reinterpret_cast<uintptr_t>(host) |
                                static_cast<uint64_t>(page_bytes));
  const int64_t num_items = num_copies * 2 * pool.num_layers;
  return DispatchVector(width, [&](auto vec) {
    using Vec = decltype(vec);
    HostCopyKernel<Vec><<<GridFor(num_items), kHostCopyThreads, 0,
                          static_cast<cudaStream_t>(stream)>>>(
        pool, static_cast<Vec*>(host), host_pages, copies, num_items,
        page_bytes / width, direction);
    return cudaGetLastError();
  });
}

}  // namespace kvblock::kernels
