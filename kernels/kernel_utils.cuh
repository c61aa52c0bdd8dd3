// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Device helpers shared by kernels/*.cu: the vector type of a byte copy,
// element conversions to and from float, and 16-byte vector loads. Included
// only by .cu files (nvcc); nothing here allocates or synchronizes.
#ifndef KVBLOCK_KERNELS_KERNEL_UTILS_CUH_
#define KVBLOCK_KERNELS_KERNEL_UTILS_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "launchers.h"

namespace kvblock::kernels {

// Largest power-of-two access width (16, 8, 4 or 2 bytes) that divides
// `bits`, the bitwise OR of every base address and every row size in bytes
// that a copy uses. Element sizes are at least 2 bytes, so 2 always divides.
inline int VectorBytes(uint64_t bits) {
  for (int width = 16; width > 2; width /= 2) {
    if (bits % width == 0) return width;
  }
  return 2;
}

// Calls `f(Vec{})` with the unsigned type of `width` bytes (from VectorBytes),
// so a byte-copy kernel is instantiated for each access width.
template <typename F>
cudaError_t DispatchVector(int width, F&& f) {
  switch (width) {
    case 16:
      return f(uint4{});
    case 8:
      return f(uint2{});
    case 4:
      return f(uint32_t{});
    default:
      return f(uint16_t{});
  }
}

// Calls `f(T{})` with the CUDA element type of `dtype`.
template <typename F>
cudaError_t DispatchDType(KvDType dtype, F&& f) {
  switch (dtype) {
    case KvDType::kF16:
      return f(__half{});
    case KvDType::kBf16:
      return f(__nv_bfloat16{});
    case KvDType::kF32:
      return f(float{});
  }
  return cudaErrorInvalidValue;
}

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Elements of T in one 16-byte vector.
template <typename T>
inline constexpr int kVecElems = 16 / static_cast<int>(sizeof(T));

// Converts the 16-byte vector `raw` of T elements to floats.
template <typename T>
__device__ __forceinline__ void VecToFloat(const uint4& raw,
                                           float (&out)[kVecElems<T>]) {
  const T* elems = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int i = 0; i < kVecElems<T>; ++i) out[i] = ToFloat(elems[i]);
}

// Copies `n` vectors from `src` to `dst` with a group of `stride` threads in
// which the caller is thread `rank`; each thread keeps kCopyUnroll loads in
// flight before its stores.
inline constexpr int kCopyUnroll = 4;
template <typename Vec>
__device__ __forceinline__ void GroupCopy(const Vec* __restrict__ src,
                                          Vec* __restrict__ dst, int64_t n,
                                          int rank, int stride) {
  for (int64_t base = rank; base < n; base += int64_t{stride} * kCopyUnroll) {
    Vec chunk[kCopyUnroll];
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) {
      const int64_t i = base + int64_t{u} * stride;
      if (i < n) chunk[u] = src[i];
    }
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) {
      const int64_t i = base + int64_t{u} * stride;
      if (i < n) dst[i] = chunk[u];
    }
  }
}

// Zero-fills `n` vectors of `dst` with a group of `stride` threads.
template <typename Vec>
__device__ __forceinline__ void GroupZero(Vec* __restrict__ dst, int64_t n,
                                          int rank, int stride) {
  for (int64_t i = rank; i < n; i += stride) dst[i] = Vec{};
}

// Blocks of a grid-stride launch over `items` work items: one per item,
// capped at 2^30 (each block then loops over several items).
inline unsigned int GridFor(int64_t items) {
  constexpr int64_t kMaxBlocks = int64_t{1} << 30;
  return static_cast<unsigned int>(items < kMaxBlocks ? items : kMaxBlocks);
}

}  // namespace kvblock::kernels

#endif  // KVBLOCK_KERNELS_KERNEL_UTILS_CUH_
