// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Paged decode attention, flash-decoding style: one query token per slot,
// grouped-query heads, the context split into partitions whose partial
// softmax results (max, sum, normalized output) a reduce kernel merges. This
// file holds the launcher, the reduce kernel and the CUDA-core kernel, which
// serves every shape the tensor-core kernel (decode_attention_tc.cu) does not.
//
// CUDA-core kernel: one block serves one (partition, KV head, slot) and all
// `group` query heads that read that KV head. kTpr threads split a K/V row
// into 16-byte vectors (interleaved, so a row's loads are contiguous), and
// each thread serves kHeads query heads at once: an element is loaded and
// converted once and feeds kHeads multiply-adds, with kHeads query slices
// (pass 1) or accumulators (pass 2) in registers. Larger groups take
// `subgroups` (a power of two) such sets of kTpr threads, padding heads
// masked. Those threads form a "lane", which handles one token at a time; the
// block's lanes split the partition. Logits are computed in the log2 domain
// (q pre-scaled by scale * log2(e)), kept in shared memory, and turned into
// probabilities once per partition: no running rescale.
#include <cuda_runtime.h>

#include <cstdint>

#include "decode_common.cuh"
#include "kernel_utils.cuh"
#include "launchers.h"

namespace kvblock::kernels {
namespace {

constexpr int kReduceThreads = 128;

constexpr int Gcd(int a, int b) { return b == 0 ? a : Gcd(b, a % b); }
constexpr int Min(int a, int b) { return a < b ? a : b; }
// Smallest power of two >= x, for x >= 1.
constexpr int CeilPow2(int x) { return x <= 1 ? 1 : 2 * CeilPow2((x + 1) / 2); }
// Largest power of two <= x, for x >= 1.
constexpr int FloorPow2(int x) { return x <= 1 ? 1 : 2 * FloorPow2(x / 2); }

// How threads cover one K/V row of kHeadDim elements of T when each serves
// kHeads query heads.
template <typename T, int kHeadDim, int kHeads>
struct DecodeLayout {
  static constexpr int kVec = kVecElems<T>;         // elements per 16 bytes.
  static constexpr int kRowVecs = kHeadDim / kVec;  // 16-byte loads per row.
  // Threads per row: up to 16 when a thread serves several heads (its query
  // slices stay small), up to 8 for one head (fewer shuffles per token).
  static constexpr int kTpr = Gcd(kRowVecs, kHeads == 1 ? 8 : 16);
  static constexpr int kVecsPerThread = kRowVecs / kTpr;
  static constexpr int kElems = kVecsPerThread * kVec;  // per thread.
  static_assert(kHeadDim % kVec == 0, "head_dim must be whole 16-byte vectors");
  static_assert(32 % kTpr == 0, "a row's threads must not straddle warps");
};

// Most query heads one thread serves: their query slices or accumulators
// take at most 64 registers, and at most kTpr heads, so that a row's
// reduce-scatter leaves every thread one head's logit.
template <typename T, int kHeadDim>
constexpr int DecodeMaxHeads() {
  using L = DecodeLayout<T, kHeadDim, 2>;
  return Min(Min(8, L::kTpr), FloorPow2(L::kElems >= 64 ? 1 : 64 / L::kElems));
}

// Query heads per thread, head subgroups per lane and threads per lane for a
// GQA group.
template <typename T, int kHeadDim>
constexpr int DecodeHeads(int group) {
  return Min(CeilPow2(group), DecodeMaxHeads<T, kHeadDim>());
}
template <typename T, int kHeadDim>
constexpr int DecodeSubgroups(int group) {
  const int heads = DecodeHeads<T, kHeadDim>(group);
  return CeilPow2((group + heads - 1) / heads);
}
template <typename T, int kHeadDim>
constexpr int DecodeLaneThreads(int group) {
  return DecodeSubgroups<T, kHeadDim>(group) *
         (DecodeHeads<T, kHeadDim>(group) == 1
              ? DecodeLayout<T, kHeadDim, 1>::kTpr
              : DecodeLayout<T, kHeadDim, 2>::kTpr);
}

// Shared memory of one block, in bytes. Layout (from the start):
//   int64 rows[2][partition]  element offsets of each token's K and V row
//                             within the layer (-1: token masked)
//   float logits[group][partition]
// overlaid after pass 2 by
//   float sums[group][kHeadDim]
// and then, after the larger of the two,
//   float head_max[group], head_sum[group].
template <int kHeadDim>
__host__ __device__ constexpr int64_t DecodeSmemBytes(int group,
                                                      int partition) {
  const int64_t passes =
      16 * int64_t{partition} + 4 * int64_t{group} * partition;
  const int64_t sums = 4 * int64_t{group} * kHeadDim;
  return (passes > sums ? passes : sums) + 8 * int64_t{group};
}

// True when every supported group size fits the default 48 KiB of shared
// memory (no opt-in attribute needed) and a lane fits in a block.
template <typename T, int kHeadDim>
constexpr bool DecodeShapeFits() {
  for (int group = 1; group <= kMaxDecodeGroup; ++group) {
    if (DecodeSmemBytes<kHeadDim>(group, DecodePartitionTokens(group)) >
            48 * 1024 ||
        DecodeLaneThreads<T, kHeadDim>(group) > kDecodeThreads) {
      return false;
    }
  }
  return true;
}

// `x`'s low log2(kCount) bits reversed.
template <int kCount>
__device__ __forceinline__ int BitReverse(int x) {
  int reversed = 0;
#pragma unroll
  for (int bit = 1; bit < kCount; bit *= 2) {
    reversed = 2 * reversed + ((x & bit) != 0);
  }
  return reversed;
}

// Sums each of kHeads values over the kTpr threads of a row (thread `tx` of
// them) and returns, in every thread, the total of head BitReverse<kHeads>(tx
// % kHeads). A reduce-scatter (each step halves the values a thread keeps,
// trading the other half with its partner) and then a butterfly: kHeads - 1 +
// log2(kTpr / kHeads) shuffles instead of kHeads * log2(kTpr).
template <int kHeads, int kTpr>
__device__ __forceinline__ float RowReduceScatter(float (&v)[kHeads], int tx) {
  static_assert(kHeads <= kTpr, "each thread must end with one head");
#pragma unroll
  for (int offset = 1; offset < kHeads; offset *= 2) {
    const int keep = kHeads / offset / 2;  // values kept after this step.
    const bool upper = (tx & offset) != 0;
#pragma unroll
    for (int i = 0; i < keep; ++i) {
      const float mine = upper ? v[i + keep] : v[i];
      const float theirs = upper ? v[i] : v[i + keep];
      v[i] = mine + __shfl_xor_sync(0xffffffffu, theirs, offset);
    }
  }
  float total = v[0];
#pragma unroll
  for (int offset = kHeads; offset < kTpr; offset *= 2) {
    total += __shfl_xor_sync(0xffffffffu, total, offset);
  }
  return total;
}

// Block: kDecodeThreads threads, DecodeSmemBytes() of dynamic shared memory;
// `subgroups` = DecodeSubgroups(group).
template <typename T, int kHeadDim, int kHeads>
__global__ void __launch_bounds__(kDecodeThreads, 2)
    PagedDecodeKernel(DecodeParams p, int32_t subgroups) {
  using L = DecodeLayout<T, kHeadDim, kHeads>;
  // Tokens each lane loads before it computes: ~128 bytes per thread, half
  // that where the query slices take 64 registers, to stay within 128
  // registers (two blocks per multiprocessor).
  constexpr int kLoads = L::kVecsPerThread >= 8 ? 1 : 8 / L::kVecsPerThread;
  constexpr int kUnroll =
      kHeads * L::kElems >= 64 && kLoads > 1 ? kLoads / 2 : kLoads;
  DecodeBlock b;
  if (!LocateDecodeBlock(p, b)) return;
  const int32_t n = b.n;
  const int32_t partition = p.partition;
  const int group = b.group;
  const int lane_size = subgroups * L::kTpr;
  const int num_lanes = kDecodeThreads / lane_size;
  const int tx = static_cast<int>(threadIdx.x) % L::kTpr;
  const int first_head =  // of the group, the first this thread serves.
      (static_cast<int>(threadIdx.x) / L::kTpr) % subgroups * kHeads;
  const int lane = static_cast<int>(threadIdx.x) / lane_size;
  // The head whose logit RowReduceScatter leaves in this thread.
  const int logit_head = first_head + BitReverse<kHeads>(tx % kHeads);

  extern __shared__ __align__(16) unsigned char smem[];
  int64_t* k_rows = reinterpret_cast<int64_t*>(smem);
  int64_t* v_rows = k_rows + partition;
  float* logits = reinterpret_cast<float*>(v_rows + partition);
  float* head_max = reinterpret_cast<float*>(
      smem + DecodeSmemBytes<kHeadDim>(group, partition) - 8 * group);
  float* head_sum = head_max + group;
  FillRowOffsets(p, b, k_rows, v_rows);

  // This thread's slices of its heads' queries, in the log2 domain (zero for
  // padding heads).
  float q[kHeads][L::kElems];
#pragma unroll
  for (int j = 0; j < kHeads; ++j) {
    const bool real = first_head + j < group;
    const uint4* q_vecs = reinterpret_cast<const uint4*>(
        static_cast<const T*>(p.query) +
        (b.first_q_row + (real ? first_head + j : 0)) * kHeadDim);
#pragma unroll
    for (int c = 0; c < L::kVecsPerThread; ++c) {
      float f[L::kVec];
      VecToFloat<T>(real ? q_vecs[c * L::kTpr + tx] : uint4{}, f);
#pragma unroll
      for (int e = 0; e < L::kVec; ++e) {
        q[j][c * L::kVec + e] = f[e] * p.scale_log2;
      }
    }
  }
  const T* layer_base = LayerBase<T>(p, b);
  __syncthreads();

  // Pass 1: logits. Every thread runs the same trip count (n is uniform), so
  // the row reductions' full-warp shuffles are safe.
  const int step = num_lanes * kUnroll;
  for (int base = 0; base < n; base += step) {
    uint4 k[kUnroll][L::kVecsPerThread];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int t = base + u * num_lanes + lane;
      const int64_t offset = t < n ? k_rows[t] : -1;
      const uint4* row = reinterpret_cast<const uint4*>(
          layer_base + (offset >= 0 ? offset : 0));
#pragma unroll
      for (int c = 0; c < L::kVecsPerThread; ++c) {
        k[u][c] = offset >= 0 ? row[c * L::kTpr + tx] : uint4{};
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float dot[kHeads] = {};
#pragma unroll
      for (int c = 0; c < L::kVecsPerThread; ++c) {
        float f[L::kVec];
        VecToFloat<T>(k[u][c], f);
#pragma unroll
        for (int j = 0; j < kHeads; ++j) {
#pragma unroll
          for (int e = 0; e < L::kVec; ++e) {
            dot[j] += q[j][c * L::kVec + e] * f[e];
          }
        }
      }
      const float logit = RowReduceScatter<kHeads, L::kTpr>(dot, tx);
      const int t = base + u * num_lanes + lane;
      if (t < n && tx < kHeads && logit_head < group) {
        logits[logit_head * partition + t] = k_rows[t] >= 0 ? logit : -INFINITY;
      }
    }
  }
  __syncthreads();

  // Probabilities in place of the logits (a masked token's is 0).
  SoftmaxRows(logits, partition, group, n, head_max, head_sum,
              [&](int h, int t, float prob) {
                logits[h * partition + t] = prob;
                return prob;
              });
  __syncthreads();

  // Pass 2: probability-weighted V rows.
  float acc[kHeads][L::kElems] = {};
  for (int base = 0; base < n; base += step) {
    uint4 v[kUnroll][L::kVecsPerThread];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int t = base + u * num_lanes + lane;
      const int64_t offset = t < n ? v_rows[t] : -1;
      const uint4* row = reinterpret_cast<const uint4*>(
          layer_base + (offset >= 0 ? offset : 0));
#pragma unroll
      for (int c = 0; c < L::kVecsPerThread; ++c) {
        v[u][c] = offset >= 0 ? row[c * L::kTpr + tx] : uint4{};
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int t = base + u * num_lanes + lane;
      float prob[kHeads];
#pragma unroll
      for (int j = 0; j < kHeads; ++j) {
        const int h = first_head + j;
        prob[j] = t < n && h < group ? logits[h * partition + t] : 0.f;
      }
#pragma unroll
      for (int c = 0; c < L::kVecsPerThread; ++c) {
        float f[L::kVec];
        VecToFloat<T>(v[u][c], f);
#pragma unroll
        for (int j = 0; j < kHeads; ++j) {
#pragma unroll
          for (int e = 0; e < L::kVec; ++e) {
            acc[j][c * L::kVec + e] += prob[j] * f[e];
          }
        }
      }
    }
  }

  // Sum the lanes' accumulators: lanes narrower than a warp first merge
  // within it by shuffles; then each warp (or each wider lane) adds its sums
  // into shared memory in turn.
  for (int offset = lane_size; offset < 32; offset *= 2) {
#pragma unroll
    for (int j = 0; j < kHeads; ++j) {
#pragma unroll
      for (int i = 0; i < L::kElems; ++i) {
        acc[j][i] += __shfl_xor_sync(0xffffffffu, acc[j][i], offset);
      }
    }
  }
  __syncthreads();  // The sums below overlay rows and logits.
  float* sums = reinterpret_cast<float*>(smem);
  const int span = lane_size < 32 ? 32 : lane_size;
  const int turn = static_cast<int>(threadIdx.x) / span;
  const bool adds = static_cast<int>(threadIdx.x) % span < lane_size;
  for (int r = 0; r < kDecodeThreads / span; ++r) {
    if (turn == r && adds) {
#pragma unroll
      for (int j = 0; j < kHeads; ++j) {
        if (first_head + j >= group) continue;
        float* head_sums = sums + (first_head + j) * kHeadDim;
#pragma unroll
        for (int c = 0; c < L::kVecsPerThread; ++c) {
#pragma unroll
          for (int e = 0; e < L::kVec; ++e) {
            float& cell = head_sums[(c * L::kTpr + tx) * L::kVec + e];
            const float value = acc[j][c * L::kVec + e];
            cell = r == 0 ? value : cell + value;
          }
        }
      }
    }
    __syncthreads();
  }
  WriteDecodeOutput<T>(p, b, sums, head_max, head_sum);
}

// Grid: (num_q_heads, batch). Block: kReduceThreads threads over head_dim.
// Merges the partitions [0, ceil((len - window start) / partition)) of one
// query head: weight
// of partition p = sum_p * 2^(max_p - max), output = sum of weighted partial
// outputs / sum of weights (0 for an empty or fully masked sequence).
template <typename T>
__global__ void __launch_bounds__(kReduceThreads)
    DecodeReduceKernel(const float* __restrict__ partial_out,
                       const float* __restrict__ partial_max,
                       const float* __restrict__ partial_sum,
                       const int32_t* __restrict__ seq_lens, int32_t max_tokens,
                       int32_t sliding_window, int32_t partition,
                       int32_t num_parts, int32_t head_dim,
                       T* __restrict__ out) {
  const int64_t row = int64_t{blockIdx.y} * gridDim.x + blockIdx.x;
  const int32_t len = min(max(seq_lens[blockIdx.y], 0), max_tokens);
  const int32_t read = len - WindowStart(len, sliding_window);
  const auto parts =
      static_cast<int32_t>((int64_t{read} + partition - 1) / partition);
  const float* maxima = partial_max + row * num_parts;
  const float* sums = partial_sum + row * num_parts;
  __shared__ float shared_max;
  __shared__ float shared_total;
  if (threadIdx.x < 32) {
    float m = -INFINITY;
    for (int p = threadIdx.x; p < parts; p += 32) m = fmaxf(m, maxima[p]);
    m = WarpMax(m);
    float total = 0.f;
    for (int p = threadIdx.x; p < parts; p += 32) {
      if (maxima[p] != -INFINITY) total += sums[p] * exp2f(maxima[p] - m);
    }
    total = WarpSum(total);
    if (threadIdx.x == 0) {
      shared_max = m;
      shared_total = total;
    }
  }
  __syncthreads();
  const float m = shared_max;
  const float total = shared_total;
  for (int d = threadIdx.x; d < head_dim; d += kReduceThreads) {
    float acc = 0.f;
    for (int p = 0; p < parts; ++p) {
      if (maxima[p] == -INFINITY) continue;
      acc += sums[p] * exp2f(maxima[p] - m) *
             partial_out[(row * num_parts + p) * head_dim + d];
    }
    out[row * head_dim + d] = FromFloat<T>(total > 0.f ? acc / total : 0.f);
  }
}

}  // namespace

int LaunchPagedDecodeAttention(const PagedKvPool& pool, int32_t layer,
                               const PageTable& table, const int32_t* seq_lens,
                               int32_t batch, const void* query,
                               int32_t num_q_heads, float scale,
                               int32_t sliding_window, float* workspace,
                               void* out, void* stream) {
  if (batch == 0) return cudaSuccess;
  const int32_t group = num_q_heads / pool.num_kv_heads;
  const int32_t partition = DecodePartitionTokens(group);
  const int32_t max_tokens = table.max_pages_per_seq * pool.page_size;
  const int32_t num_parts =
      static_cast<int32_t>(DecodePartitions(max_tokens, group));
  // Workspace: partial outputs, then maxima, then sums (unused for 1 part).
  const int64_t rows = int64_t{batch} * num_q_heads;
  float* partial_out = workspace;
  float* partial_max =
      num_parts > 1 ? partial_out + rows * num_parts * pool.head_dim : nullptr;
  float* partial_sum = num_parts > 1 ? partial_max + rows * num_parts : nullptr;
  const cudaStream_t cuda_stream = static_cast<cudaStream_t>(stream);
  const DecodeParams params = {.pool = pool,
                               .layer = layer,
                               .table = table,
                               .seq_lens = seq_lens,
                               .query = query,
                               .num_q_heads = num_q_heads,
                               .scale_log2 = scale * kLog2e,
                               .sliding_window = sliding_window,
                               .partition = partition,
                               .partial_out = partial_out,
                               .partial_max = partial_max,
                               .partial_sum = partial_sum,
                               .out = out};
  const dim3 grid(num_parts, pool.num_kv_heads, batch);
  return DispatchDType(pool.dtype, [&](auto type) {
    using T = decltype(type);
    return DispatchHeadDim(pool.head_dim, [&](auto dim) {
      constexpr int kHeadDim = decltype(dim)::kValue;
      static_assert(DecodeShapeFits<T, kHeadDim>());
      const cudaError_t launched =
          DecodeTensorCoreShape(pool.dtype, kHeadDim, group)
              ? LaunchPagedDecodeTensorCore(params, grid, cuda_stream)
              : DispatchConstant<1, 2, 4, 8>(
                    DecodeHeads<T, kHeadDim>(group), [&](auto served) {
                      constexpr int kHeads = decltype(served)::kValue;
                      if constexpr (kHeads > DecodeMaxHeads<T, kHeadDim>()) {
                        return cudaErrorInvalidValue;  // Never picked.
                      } else {
                        PagedDecodeKernel<T, kHeadDim, kHeads>
                            <<<grid, kDecodeThreads,
                               DecodeSmemBytes<kHeadDim>(group, partition),
                               cuda_stream>>>(
                                params, DecodeSubgroups<T, kHeadDim>(group));
                        return cudaGetLastError();
                      }
                    });
      if (launched != cudaSuccess || num_parts == 1) return launched;
      DecodeReduceKernel<T>
          <<<dim3(num_q_heads, batch), kReduceThreads, 0, cuda_stream>>>(
              partial_out, partial_max, partial_sum, seq_lens, max_tokens,
              sliding_window, partition, num_parts, kHeadDim,
              static_cast<T*>(out));
      return cudaGetLastError();
    });
  });
}

}  // namespace kvblock::kernels
