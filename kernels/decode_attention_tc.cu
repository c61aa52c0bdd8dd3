// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Paged decode attention on tensor cores (WMMA, 16x16x16 tiles, fp32
// accumulation), for 16-bit KV with GQA groups of 2 to 16 and head_dim a
// multiple of 16 up to 128: the shapes where the CUDA-core kernel spends a
// multiply-add per query head on every K and V element it loads.
//
// One block of kTcWarps warps serves one (partition, KV head, slot). The
// group's query heads, padded with zero rows to 16, form the A operand; a
// warp stages 16 tokens' K rows in shared memory and multiplies them in
// (16 heads x 16 tokens of logits per tile), the next tile's loads already in
// flight. The base-2 logits of the kRows heads kept (8 when the group fits,
// else 16) go to shared memory, the softmax turns them into 16-bit
// probabilities in place, and a second pass multiplies probability tiles
// (kRows x 16 tokens) with staged V tiles into per-warp accumulators (kRows x
// 256 / kRows dims each), which are then summed. Keeping 8 rows halves the
// logits' shared memory and the accumulators' registers, so that four blocks
// fit on a multiprocessor: the kernel is bound by loads in flight.
// Probabilities are rounded to the KV type before the second product (as
// FlashAttention does); each head's sum adds the rounded values, so the weights
// still sum to one.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cstdint>
#include <type_traits>

#include "decode_common.cuh"
#include "kernel_utils.cuh"
#include "launchers.h"

namespace kvblock::kernels {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kTcWarps = 4;
constexpr int kTcThreads = 32 * kTcWarps;
// Tokens of a tile, and query heads (rows) of the padded group.
constexpr int kTile = 16;

// Elements of a staged row: a 16-byte multiple that shifts successive rows by
// 16 bytes across the shared-memory banks.
template <int kHeadDim>
inline constexpr int kPitch = kHeadDim + 8;

// Shared memory of one block, in bytes (T is 2 bytes). Layout:
//   T q_tile[16][kPitch]              the group's queries, padding rows zero
//   T stage[kTcWarps][16][kPitch]     each warp's K or V tile, or its tile
//                                     of 16 x 16 float logits
//   float logits[kRows][partition]    base-2 logits; the softmax overwrites
//                                     row h with T probabilities from its
//                                     start (a T row pitch of 2 * partition)
//   int64 rows[2][partition]          K and V row offsets (-1: masked)
//   float head_max[16], head_sum[16]
// and, after pass 2, over q_tile and stage:
//   float sums[kRows][kHeadDim]
// Every WMMA pointer is 32-byte aligned: each region's size is a multiple of
// 32 bytes.
template <int kHeadDim, int kRows>
__host__ __device__ constexpr int64_t TcSmemBytes(int partition) {
  return int64_t{2} * kTile * kPitch<kHeadDim> * (1 + kTcWarps) +
         int64_t{4} * kRows * partition + int64_t{16} * partition + 8 * kTile;
}

// Query heads (rows) kept after pass 1: 8 where the group fits and a V tile
// splits into 32-dim slices (the 8 x 32 x 16 WMMA shape), else 16.
constexpr int TcRows(int head_dim, int group) {
  return group <= 8 && head_dim % 32 == 0 ? 8 : 16;
}

// The K or V rows of tokens [first, first + 16) of a warp's tile, as 16-byte
// vectors a lane holds in registers (zero past n and for masked tokens).
template <typename T, int kHeadDim>
struct TileRows {
  static constexpr int kRowVecs = kHeadDim / 8;
  static constexpr int kPerLane = kTile * kRowVecs / 32;
  static_assert(kTile * kRowVecs % 32 == 0, "a tile is whole warp loads");
  uint4 vecs[kPerLane];

  __device__ __forceinline__ void Load(const T* layer_base, const int64_t* rows,
                                       int first, int n, int lane) {
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int i = lane + 32 * j;
      const int t = first + i / kRowVecs;
      const int64_t offset = t < n ? rows[t] : -1;
      vecs[j] = offset >= 0 ? reinterpret_cast<const uint4*>(
                                  layer_base + offset)[i % kRowVecs]
                            : uint4{};
    }
  }

  __device__ __forceinline__ void Store(T* stage, int lane) const {
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int i = lane + 32 * j;
      *reinterpret_cast<uint4*>(stage + i / kRowVecs * kPitch<kHeadDim> +
                                i % kRowVecs * 8) = vecs[j];
    }
  }
};

// Block: kTcThreads threads, TcSmemBytes() of dynamic shared memory; kRows =
// TcRows(head_dim, group).
template <typename T, int kHeadDim, int kRows>
__global__ void __launch_bounds__(kTcThreads, kRows == 8 ? 4 : 3)
    PagedDecodeTensorCoreKernel(DecodeParams p) {
  constexpr int kP = kPitch<kHeadDim>;
  constexpr int kRowVecs = kHeadDim / 8;
  constexpr int kCols = 256 / kRows;  // dims of a pass-2 accumulator.
  static_assert(kHeadDim % kCols == 0, "whole accumulators per head");
  using Accumulator = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
  using Sums = wmma::fragment<wmma::accumulator, kRows, kCols, 16, float>;
  DecodeBlock b;
  if (!LocateDecodeBlock(p, b)) return;
  const int n = b.n;
  const int partition = p.partition;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;

  extern __shared__ __align__(128) unsigned char smem[];
  T* q_tile = reinterpret_cast<T*>(smem);
  T* stage = q_tile + kTile * kP;
  float* logits = reinterpret_cast<float*>(stage + kTcWarps * kTile * kP);
  T* probs = reinterpret_cast<T*>(logits);  // row h at 2 * h * partition.
  int64_t* k_rows = reinterpret_cast<int64_t*>(logits + kRows * partition);
  int64_t* v_rows = k_rows + partition;
  float* head_max = reinterpret_cast<float*>(v_rows + partition);
  float* head_sum = head_max + kTile;
  FillRowOffsets(p, b, k_rows, v_rows);
  const uint4* q_vecs = reinterpret_cast<const uint4*>(
      static_cast<const T*>(p.query) + b.first_q_row * kHeadDim);
  for (int i = threadIdx.x; i < kTile * kRowVecs; i += kTcThreads) {
    const int h = i / kRowVecs;
    *reinterpret_cast<uint4*>(q_tile + h * kP + i % kRowVecs * 8) =
        h < b.group ? q_vecs[i] : uint4{};
  }
  const T* layer_base = LayerBase<T>(p, b);
  __syncthreads();

  // Runs `compute(first)` on each of this warp's tiles (w, w + kTcWarps, ...
  // for warp w; tokens first to first + 15) once the tile's rows at
  // `offsets` are staged in my_stage, with the next tile's loads in flight.
  const int num_tiles = (n + kTile - 1) / kTile;
  T* my_stage = stage + warp * kTile * kP;
  auto for_each_tile = [&](const int64_t* offsets, auto&& compute) {
    TileRows<T, kHeadDim> rows;
    if (warp < num_tiles) rows.Load(layer_base, offsets, warp * kTile, n, lane);
    for (int tile = warp; tile < num_tiles; tile += kTcWarps) {
      const int first = tile * kTile;
      rows.Store(my_stage, lane);
      __syncwarp();
      if (tile + kTcWarps < num_tiles) {
        rows.Load(layer_base, offsets, first + kTcWarps * kTile, n, lane);
      }
      compute(first);
      __syncwarp();  // The next tile's store overwrites my_stage.
    }
  };

  // Pass 1: 16 x 16 logits per tile.
  for_each_tile(k_rows, [&](int first) {
    Accumulator dots;
    wmma::fill_fragment(dots, 0.f);
#pragma unroll
    for (int k = 0; k < kHeadDim; k += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> q;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> keys;
      wmma::load_matrix_sync(q, q_tile + k, kP);
      wmma::load_matrix_sync(keys, my_stage + k, kP);
      wmma::mma_sync(dots, q, keys, dots);
    }
    // Through the warp's stage (its K tile consumed) into the kept rows:
    // base 2, -inf for masked tokens and tokens past n, padding heads 0 (so
    // their probability rows read as zeros).
    float* tile_logits = reinterpret_cast<float*>(my_stage);
    __syncwarp();
    wmma::store_matrix_sync(tile_logits, dots, kTile, wmma::mem_row_major);
    __syncwarp();
    for (int i = lane; i < kRows * kTile; i += 32) {
      const int h = i / kTile;
      const int t = first + i % kTile;
      logits[h * partition + t] = h >= b.group ? 0.f
                                  : t < n && k_rows[t] >= 0
                                      ? tile_logits[i] * p.scale_log2
                                      : -INFINITY;
    }
  });
  __syncthreads();

  // Probabilities of the real heads' rows, over whole tiles (zero past n).
  SoftmaxRows(logits, partition, b.group, num_tiles * kTile, head_max, head_sum,
              [&](int h, int t, float prob) {
                const T kept = FromFloat<T>(prob);
                probs[2 * h * partition + t] = kept;
                return ToFloat(kept);
              });
  __syncthreads();

  // Pass 2: probability tiles times V tiles, summed per warp.
  Sums acc[kHeadDim / kCols];
#pragma unroll
  for (int d = 0; d < kHeadDim / kCols; ++d) wmma::fill_fragment(acc[d], 0.f);
  for_each_tile(v_rows, [&](int first) {
    wmma::fragment<wmma::matrix_a, kRows, kCols, 16, T, wmma::row_major> prob;
    wmma::load_matrix_sync(prob, probs + first, 2 * partition);
#pragma unroll
    for (int d = 0; d < kHeadDim / kCols; ++d) {
      wmma::fragment<wmma::matrix_b, kRows, kCols, 16, T, wmma::row_major>
          values;
      wmma::load_matrix_sync(values, my_stage + d * kCols, kP);
      wmma::mma_sync(acc[d], prob, values, acc[d]);
    }
  });
  __syncthreads();  // The sums below overlay q_tile and stage.

  // The warps add their accumulators into sums in turn.
  float* sums = reinterpret_cast<float*>(smem);
  for (int w = 0; w < kTcWarps; ++w) {
    if (warp == w) {
#pragma unroll
      for (int d = 0; d < kHeadDim / kCols; ++d) {
        if (w > 0) {
          Sums so_far;
          wmma::load_matrix_sync(so_far, sums + d * kCols, kHeadDim,
                                 wmma::mem_row_major);
#pragma unroll
          for (int i = 0; i < so_far.num_elements; ++i) {
            acc[d].x[i] += so_far.x[i];
          }
        }
        wmma::store_matrix_sync(sums + d * kCols, acc[d], kHeadDim,
                                wmma::mem_row_major);
      }
    }
    __syncthreads();
  }
  WriteDecodeOutput<T>(p, b, sums, head_max, head_sum);
}

}  // namespace

cudaError_t LaunchPagedDecodeTensorCore(const DecodeParams& params, dim3 grid,
                                        cudaStream_t stream) {
  return DispatchDType(params.pool.dtype, [&](auto type) {
    using T = decltype(type);
    return DispatchHeadDim(params.pool.head_dim, [&](auto dim) {
      constexpr int kHeadDim = decltype(dim)::kValue;
      if constexpr (std::is_same_v<T, float> || kHeadDim > 128) {
        return cudaErrorInvalidValue;  // Not a DecodeTensorCoreShape.
      } else {
        const int32_t group = params.num_q_heads / params.pool.num_kv_heads;
        auto launch = [&](auto rows) -> cudaError_t {
          constexpr int kRows = decltype(rows)::kValue;
          const auto bytes =
              static_cast<int>(TcSmemBytes<kHeadDim, kRows>(params.partition));
          auto* kernel = PagedDecodeTensorCoreKernel<T, kHeadDim, kRows>;
          // Above the default 48 KiB: opt in, on the current device.
          if (cudaError_t error = cudaFuncSetAttribute(
                  kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
              error != cudaSuccess) {
            return error;
          }
          kernel<<<grid, kTcThreads, bytes, stream>>>(params);
          return cudaGetLastError();
        };
        if constexpr (kHeadDim % 32 == 0) {
          if (TcRows(kHeadDim, group) == 8) return launch(Constant<8>{});
        }
        return launch(Constant<16>{});
      }
    });
  });
}

}  // namespace kvblock::kernels
