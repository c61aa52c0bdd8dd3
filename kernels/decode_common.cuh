// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// What the two paged decode attention kernels share: their parameters, the
// block's place in the grid (partition, KV head, slot), the row offsets of a
// partition's tokens, the softmax over logits in shared memory, and the
// writing of a block's output. The CUDA-core kernel (decode_attention.cu)
// serves every shape; the tensor-core kernel (decode_attention_tc.cu) serves
// 16-bit KV with GQA groups of 2 to 16 and head_dim <= 128.
//
// Grid of both: (num_partitions, num_kv_heads, batch). With one partition a
// block writes `out`; otherwise it writes its partial output (normalized by
// its own sum), maximum and sum for DecodeReduceKernel (decode_attention.cu).
#ifndef KVBLOCK_KERNELS_DECODE_COMMON_CUH_
#define KVBLOCK_KERNELS_DECODE_COMMON_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "kernel_utils.cuh"
#include "launchers.h"

namespace kvblock::kernels {

inline constexpr float kLog2e = 1.4426950408889634f;

struct DecodeParams {
  PagedKvPool pool;
  int32_t layer;
  PageTable table;
  const int32_t* seq_lens;
  const void* query;  // [batch, num_q_heads, head_dim] of pool.dtype.
  int32_t num_q_heads;
  float scale_log2;        // softmax scale * log2(e): logits are base-2.
  int32_t sliding_window;  // > 0: the query reads its last tokens only.
  int32_t partition;   // tokens per partition, DecodePartitionTokens(group).
  float* partial_out;  // workspace, when there are several partitions.
  float* partial_max;
  float* partial_sum;
  void* out;  // [batch, num_q_heads, head_dim] of pool.dtype.
};

// The part of the batch one block serves.
struct DecodeBlock {
  int32_t slot;
  int32_t kv_head;
  int32_t part;
  int32_t num_parts;
  int32_t start;        // first token of the partition.
  int32_t n;            // tokens of the partition, [0, partition].
  int32_t group;        // query heads per KV head.
  int64_t first_q_row;  // query row (slot, head) of the group's first head.
};

// The first token a query of a sequence of `len` tokens reads: the start of
// its sliding window (when `window` is positive), else 0. The partitions
// split the tokens from there.
__host__ __device__ __forceinline__ int32_t WindowStart(int32_t len,
                                                        int32_t window) {
  return window > 0 && len > window ? len - window : 0;
}

// This block's DecodeBlock; false when the block has nothing to do (a
// partition past the end of its sequence, which the reduce skips).
__device__ __forceinline__ bool LocateDecodeBlock(const DecodeParams& p,
                                                  DecodeBlock& b) {
  b.slot = blockIdx.z;
  b.kv_head = blockIdx.y;
  b.part = blockIdx.x;
  b.num_parts = gridDim.x;
  const int32_t max_tokens = p.table.max_pages_per_seq * p.pool.page_size;
  const int32_t len = min(max(p.seq_lens[b.slot], 0), max_tokens);
  b.start = WindowStart(len, p.sliding_window) + b.part * p.partition;
  b.n = max(0, min(len - b.start, p.partition));
  b.group = p.num_q_heads / p.pool.num_kv_heads;
  b.first_q_row = int64_t{b.slot} * p.num_q_heads + b.kv_head * b.group;
  return b.num_parts == 1 || b.start < len;
}

// Element offsets, within the layer, of the K and V rows of the block's n
// tokens; both -1 when either page id is unusable, which masks the token.
__device__ __forceinline__ void FillRowOffsets(const DecodeParams& p,
                                               const DecodeBlock& b,
                                               int64_t* k_rows,
                                               int64_t* v_rows) {
  const PagedKvPool& pool = p.pool;
  const int64_t row_elems = int64_t{pool.num_kv_heads} * pool.head_dim;
  const int32_t* k_ids =
      p.table.data + int64_t{b.slot} * 2 * p.table.max_pages_per_seq;
  const int32_t* v_ids = k_ids + p.table.max_pages_per_seq;
  for (int t = threadIdx.x; t < b.n; t += blockDim.x) {
    const int32_t token = b.start + t;
    const int32_t logical_page = token / pool.page_size;
    const int32_t in_page = token % pool.page_size;
    const int32_t k_page = k_ids[logical_page];
    const int32_t v_page = v_ids[logical_page];
    const bool usable = k_page >= 0 && k_page < pool.num_pages &&
                        v_page >= pool.num_pages && v_page < 2 * pool.num_pages;
    k_rows[t] =
        usable ? (int64_t{k_page} * pool.page_size + in_page) * row_elems : -1;
    v_rows[t] =
        usable ? (int64_t{v_page} * pool.page_size + in_page) * row_elems : -1;
  }
}

// The block's KV head in its layer: add a row offset to reach a K or V row.
template <typename T>
__device__ __forceinline__ const T* LayerBase(const DecodeParams& p,
                                              const DecodeBlock& b) {
  const PagedKvPool& pool = p.pool;
  const int64_t row_elems = int64_t{pool.num_kv_heads} * pool.head_dim;
  return static_cast<const T*>(pool.data) +
         int64_t{p.layer} * 2 * pool.num_pages * pool.page_size * row_elems +
         int64_t{b.kv_head} * pool.head_dim;
}

__device__ __forceinline__ float WarpMax(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  }
  return x;
}

__device__ __forceinline__ float WarpSum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  }
  return x;
}

// Softmax of rows [0, rows) of base-2 logits (row h at logits + h * pitch,
// tokens [0, count), masked ones -inf), one warp per row. `store(h, t, p)`
// keeps probability p of token t and returns the value it kept (p rounded to
// the type it is stored in), which the row's sum adds up; a warp reads each
// 32 tokens before it stores theirs, so a store may overwrite logits the warp
// has read. Writes each row's maximum and sum to head_max / head_sum.
template <typename Store>
__device__ __forceinline__ void SoftmaxRows(const float* logits, int pitch,
                                            int rows, int count,
                                            float* head_max, float* head_sum,
                                            Store&& store) {
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int num_warps = static_cast<int>(blockDim.x) / 32;
  for (int h = warp; h < rows; h += num_warps) {
    const float* s = logits + int64_t{h} * pitch;
    float m = -INFINITY;
    for (int t = lane; t < count; t += 32) m = fmaxf(m, s[t]);
    m = WarpMax(m);
    float sum = 0.f;
    for (int base = 0; base < count; base += 32) {
      const int t = base + lane;
      const float logit = t < count ? s[t] : -INFINITY;
      __syncwarp();
      if (t < count) {
        sum += store(h, t, m == -INFINITY ? 0.f : exp2f(logit - m));
      }
    }
    sum = WarpSum(sum);
    if (lane == 0) {
      head_max[h] = m;
      head_sum[h] = sum;
    }
  }
}

// Writes the block's result from sums[group][head_dim] (the probability-
// weighted V rows of each query head) and each head's maximum and sum.
template <typename T>
__device__ __forceinline__ void WriteDecodeOutput(const DecodeParams& p,
                                                  const DecodeBlock& b,
                                                  const float* sums,
                                                  const float* head_max,
                                                  const float* head_sum) {
  const int head_dim = p.pool.head_dim;
  for (int i = threadIdx.x; i < b.group * head_dim; i += blockDim.x) {
    const int h = i / head_dim;
    const int d = i % head_dim;
    const float total = head_sum[h];
    const float value = total > 0.f ? sums[i] / total : 0.f;
    if (b.num_parts == 1) {
      static_cast<T*>(p.out)[(b.first_q_row + h) * head_dim + d] =
          FromFloat<T>(value);
    } else {
      p.partial_out[((b.first_q_row + h) * b.num_parts + b.part) * head_dim +
                    d] = value;
    }
  }
  if (b.num_parts > 1 && static_cast<int>(threadIdx.x) < b.group) {
    const int64_t index = (b.first_q_row + threadIdx.x) * b.num_parts + b.part;
    p.partial_max[index] = head_max[threadIdx.x];
    p.partial_sum[index] = head_sum[threadIdx.x];
  }
}

template <int N>
struct Constant {
  static constexpr int kValue = N;
};

// Calls `f(Constant<N>{})` for the N of kValues that equals `value`
// (cudaErrorInvalidValue when none does), so a kernel is instantiated for
// each of them.
template <int... kValues, typename F>
cudaError_t DispatchConstant(int value, F&& f) {
  cudaError_t result = cudaErrorInvalidValue;
  ((value == kValues && ((result = f(Constant<kValues>{})), true)) || ...);
  return result;
}

// Calls `f(Constant<head_dim>{})` for a head_dim the decode kernels are
// compiled for.
template <typename F>
cudaError_t DispatchHeadDim(int32_t head_dim, F&& f) {
  return DispatchConstant<64, 80, 96, 128, 256>(head_dim, f);
}

// True when the tensor-core kernel serves this shape.
constexpr bool DecodeTensorCoreShape(KvDType dtype, int32_t head_dim,
                                     int32_t group) {
  return dtype != KvDType::kF32 && head_dim <= 128 && head_dim % 16 == 0 &&
         group >= 2 && group <= 16;
}

// Launches the tensor-core kernel (decode_attention_tc.cu) over `grid`;
// REQUIRES DecodeTensorCoreShape(). Returns the launch's cudaError_t.
cudaError_t LaunchPagedDecodeTensorCore(const DecodeParams& params, dim3 grid,
                                        cudaStream_t stream);

}  // namespace kvblock::kernels

#endif  // KVBLOCK_KERNELS_DECODE_COMMON_CUH_
