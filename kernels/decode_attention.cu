// Copyright 2026 The kvblock Authors.
//
// Paged decode attention, flash-decoding style: one query token per slot,
// grouped-query heads, the context split into partitions whose partial
// softmax results (max, sum, normalized output) a reduce kernel merges.
//
// One block serves one (partition, KV head, slot) and all `group` query heads
// that read that KV head, so each K/V row is fetched from memory once. Its
// threads form "lanes" of kTpr * group threads; a lane handles one token at a
// time, kTpr threads per query head splitting head_dim into 16-byte vectors
// (interleaved, so a row's loads are contiguous). Logits are computed in the
// log2 domain (q pre-scaled by scale * log2(e)), kept in shared memory, and
// turned into probabilities once per partition: no running rescale.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernel_utils.cuh"
#include "kernels.h"

namespace kvblock::kernels {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kWarps = kDecodeThreads / 32;
constexpr int kReduceThreads = 128;

constexpr int Gcd(int a, int b) { return b == 0 ? a : Gcd(b, a % b); }

// How a lane's threads cover one K/V row of kHeadDim elements of T.
template <typename T, int kHeadDim>
struct DecodeLayout {
  static constexpr int kVec = kVecElems<T>;         // elements per 16 bytes.
  static constexpr int kRowVecs = kHeadDim / kVec;  // 16-byte loads per row.
  static constexpr int kTpr = Gcd(kRowVecs, 8);     // threads per row.
  static constexpr int kVecsPerThread = kRowVecs / kTpr;
  static constexpr int kElems = kVecsPerThread * kVec;  // per thread.
  // Tokens each lane loads before it computes: ~128 bytes per thread.
  static constexpr int kUnroll = kVecsPerThread >= 8 ? 1 : 8 / kVecsPerThread;
  static_assert(kHeadDim % kVec == 0, "head_dim must be whole 16-byte vectors");
  static_assert(32 % kTpr == 0, "a row's threads must not straddle warps");
};

// Shared memory of one block, in bytes. Layout (from the start):
//   int64 rows[2][partition]  element offsets of each token's K and V row
//                             within the layer (-1: token masked)
//   float logits[group][partition]
// overlaid after pass 2 by
//   float partial[num_lanes][group][kHeadDim]
// and then, after the larger of the two,
//   float head_max[group], head_sum[group].
template <typename T, int kHeadDim>
constexpr int64_t DecodeSmemBytes(int group, int partition) {
  using L = DecodeLayout<T, kHeadDim>;
  const int64_t passes =
      16 * int64_t{partition} + 4 * int64_t{group} * partition;
  const int64_t lanes = kDecodeThreads / (L::kTpr * group);
  const int64_t reduce = 4 * lanes * group * kHeadDim;
  return (passes > reduce ? passes : reduce) + 8 * int64_t{group};
}

// True when every supported group size fits the default 48 KiB of shared
// memory (no opt-in attribute needed).
template <typename T, int kHeadDim>
constexpr bool DecodeSmemFits() {
  for (int group = 1; group <= kMaxDecodeGroup; ++group) {
    if (DecodeSmemBytes<T, kHeadDim>(group, DecodePartitionTokens(group)) >
        48 * 1024) {
      return false;
    }
  }
  return true;
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

// Grid: (num_partitions, num_kv_heads, batch). Block: kDecodeThreads threads,
// DecodeSmemBytes() of dynamic shared memory. With one partition the block
// writes `out`; otherwise it writes its partial output (normalized by its own
// sum), maximum and sum for DecodeReduceKernel.
template <typename T, int kHeadDim>
__global__ void __launch_bounds__(kDecodeThreads)
    PagedDecodeKernel(PagedKvPool pool, int32_t layer, PageTable table,
                      const int32_t* __restrict__ seq_lens,
                      const T* __restrict__ query, int32_t num_q_heads,
                      float scale_log2, int32_t partition,
                      float* __restrict__ partial_out,
                      float* __restrict__ partial_max,
                      float* __restrict__ partial_sum, T* __restrict__ out) {
  using L = DecodeLayout<T, kHeadDim>;
  const int32_t slot = blockIdx.z;
  const int32_t kv_head = blockIdx.y;
  const int32_t part = blockIdx.x;
  const int32_t num_parts = gridDim.x;
  const int32_t max_tokens = table.max_pages_per_seq * pool.page_size;
  const int32_t len = min(max(seq_lens[slot], 0), max_tokens);
  const int32_t start = part * partition;
  if (num_parts > 1 && start >= len) return;  // The reduce skips this part.
  const int32_t n = max(0, min(len - start, partition));

  const int group = num_q_heads / pool.num_kv_heads;
  const int tx = static_cast<int>(threadIdx.x) % L::kTpr;
  const int head = (static_cast<int>(threadIdx.x) / L::kTpr) % group;
  const int lane = static_cast<int>(threadIdx.x) / (L::kTpr * group);
  const int num_lanes = kDecodeThreads / (L::kTpr * group);
  const bool active = lane < num_lanes;
  const int64_t q_row = int64_t{slot} * num_q_heads + kv_head * group + head;

  extern __shared__ __align__(16) unsigned char smem[];
  int64_t* k_rows = reinterpret_cast<int64_t*>(smem);
  int64_t* v_rows = k_rows + partition;
  float* logits = reinterpret_cast<float*>(v_rows + partition);
  float* head_max = reinterpret_cast<float*>(
      smem + DecodeSmemBytes<T, kHeadDim>(group, partition) - 8 * group);
  float* head_sum = head_max + group;

  // Row offsets of the partition's tokens (both -1 when either page id is
  // unusable, which masks the token).
  const int64_t row_elems = int64_t{pool.num_kv_heads} * kHeadDim;
  const int32_t* k_ids =
      table.data + int64_t{slot} * 2 * table.max_pages_per_seq;
  const int32_t* v_ids = k_ids + table.max_pages_per_seq;
  for (int t = threadIdx.x; t < n; t += kDecodeThreads) {
    const int32_t token = start + t;
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

  // Query in registers, in the log2 domain.
  float q[L::kElems];
  const uint4* q_vecs =
      reinterpret_cast<const uint4*>(query + q_row * kHeadDim);
#pragma unroll
  for (int c = 0; c < L::kVecsPerThread; ++c) {
    float f[L::kVec];
    VecToFloat<T>(q_vecs[c * L::kTpr + tx], f);
#pragma unroll
    for (int e = 0; e < L::kVec; ++e) q[c * L::kVec + e] = f[e] * scale_log2;
  }
  const T* layer_base =
      static_cast<const T*>(pool.data) +
      int64_t{layer} * 2 * pool.num_pages * pool.page_size * row_elems +
      int64_t{kv_head} * kHeadDim;
  __syncthreads();

  // Pass 1: logits. Every thread runs the same trip count (n is uniform), so
  // the row reductions' full-warp shuffles are safe.
  const int step = num_lanes * L::kUnroll;
  for (int base = 0; base < n; base += step) {
    uint4 k[L::kUnroll][L::kVecsPerThread];
#pragma unroll
    for (int u = 0; u < L::kUnroll; ++u) {
      const int t = base + u * num_lanes + lane;
      const int64_t offset = active && t < n ? k_rows[t] : -1;
      const uint4* row = reinterpret_cast<const uint4*>(
          layer_base + (offset >= 0 ? offset : 0));
#pragma unroll
      for (int c = 0; c < L::kVecsPerThread; ++c) {
        k[u][c] = offset >= 0 ? row[c * L::kTpr + tx] : uint4{};
      }
    }
#pragma unroll
    for (int u = 0; u < L::kUnroll; ++u) {
      float dot = 0.f;
#pragma unroll
      for (int c = 0; c < L::kVecsPerThread; ++c) {
        float f[L::kVec];
        VecToFloat<T>(k[u][c], f);
#pragma unroll
        for (int e = 0; e < L::kVec; ++e) dot += q[c * L::kVec + e] * f[e];
      }
#pragma unroll
      for (int offset = L::kTpr / 2; offset > 0; offset /= 2) {
        dot += __shfl_xor_sync(0xffffffffu, dot, offset);
      }
      const int t = base + u * num_lanes + lane;
      if (active && t < n && tx == 0) {
        logits[head * partition + t] = k_rows[t] >= 0 ? dot : -INFINITY;
      }
    }
  }
  __syncthreads();

  // Softmax of each query head over the partition: one warp per head.
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int warp_lane = static_cast<int>(threadIdx.x) % 32;
  for (int h = warp; h < group; h += kWarps) {
    float* s = logits + h * partition;
    float m = -INFINITY;
    for (int t = warp_lane; t < n; t += 32) m = fmaxf(m, s[t]);
    m = WarpMax(m);
    float sum = 0.f;
    for (int t = warp_lane; t < n; t += 32) {
      const float p = m == -INFINITY ? 0.f : exp2f(s[t] - m);
      s[t] = p;
      sum += p;
    }
    sum = WarpSum(sum);
    if (warp_lane == 0) {
      head_max[h] = m;
      head_sum[h] = sum;
    }
  }
  __syncthreads();

  // Pass 2: probability-weighted V rows.
  float acc[L::kElems] = {};
  for (int base = 0; base < n; base += step) {
    uint4 v[L::kUnroll][L::kVecsPerThread];
    float p[L::kUnroll];
#pragma unroll
    for (int u = 0; u < L::kUnroll; ++u) {
      const int t = base + u * num_lanes + lane;
      const int64_t offset = active && t < n ? v_rows[t] : -1;
      p[u] = offset >= 0 ? logits[head * partition + t] : 0.f;
      const uint4* row = reinterpret_cast<const uint4*>(
          layer_base + (offset >= 0 ? offset : 0));
#pragma unroll
      for (int c = 0; c < L::kVecsPerThread; ++c) {
        v[u][c] = offset >= 0 ? row[c * L::kTpr + tx] : uint4{};
      }
    }
#pragma unroll
    for (int u = 0; u < L::kUnroll; ++u) {
#pragma unroll
      for (int c = 0; c < L::kVecsPerThread; ++c) {
        float f[L::kVec];
        VecToFloat<T>(v[u][c], f);
#pragma unroll
        for (int e = 0; e < L::kVec; ++e) acc[c * L::kVec + e] += p[u] * f[e];
      }
    }
  }
  __syncthreads();  // The partial sums below overlay rows and logits.

  float* partial = reinterpret_cast<float*>(smem);
  if (active) {
#pragma unroll
    for (int c = 0; c < L::kVecsPerThread; ++c) {
#pragma unroll
      for (int e = 0; e < L::kVec; ++e) {
        partial[(lane * group + head) * kHeadDim +
                (c * L::kTpr + tx) * L::kVec + e] = acc[c * L::kVec + e];
      }
    }
  }
  __syncthreads();
  const int64_t first_row = int64_t{slot} * num_q_heads + kv_head * group;
  for (int i = threadIdx.x; i < group * kHeadDim; i += kDecodeThreads) {
    const int h = i / kHeadDim;
    const int d = i % kHeadDim;
    float sum = 0.f;
    for (int l = 0; l < num_lanes; ++l)
      sum += partial[(l * group + h) * kHeadDim + d];
    const float total = head_sum[h];
    const float value = total > 0.f ? sum / total : 0.f;
    if (num_parts == 1) {
      out[(first_row + h) * kHeadDim + d] = FromFloat<T>(value);
    } else {
      partial_out[((first_row + h) * num_parts + part) * kHeadDim + d] = value;
    }
  }
  if (num_parts > 1 && static_cast<int>(threadIdx.x) < group) {
    const int64_t index = (first_row + threadIdx.x) * num_parts + part;
    partial_max[index] = head_max[threadIdx.x];
    partial_sum[index] = head_sum[threadIdx.x];
  }
}

// Grid: (num_q_heads, batch). Block: kReduceThreads threads over head_dim.
// Merges the partitions [0, ceil(len / partition)) of one query head: weight
// of partition p = sum_p * 2^(max_p - max), output = sum of weighted partial
// outputs / sum of weights (0 for an empty or fully masked sequence).
template <typename T>
__global__ void __launch_bounds__(kReduceThreads)
    DecodeReduceKernel(const float* __restrict__ partial_out,
                       const float* __restrict__ partial_max,
                       const float* __restrict__ partial_sum,
                       const int32_t* __restrict__ seq_lens, int32_t max_tokens,
                       int32_t partition, int32_t num_parts, int32_t head_dim,
                       T* __restrict__ out) {
  const int64_t row = int64_t{blockIdx.y} * gridDim.x + blockIdx.x;
  const int32_t len = min(max(seq_lens[blockIdx.y], 0), max_tokens);
  const auto parts =
      static_cast<int32_t>((int64_t{len} + partition - 1) / partition);
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

template <int N>
struct HeadDim {
  static constexpr int kValue = N;
};

// Calls `f(HeadDim<N>{})` for a head_dim the decode kernel is compiled for.
template <typename F>
cudaError_t DispatchHeadDim(int32_t head_dim, F&& f) {
  switch (head_dim) {
    case 64:
      return f(HeadDim<64>{});
    case 80:
      return f(HeadDim<80>{});
    case 96:
      return f(HeadDim<96>{});
    case 128:
      return f(HeadDim<128>{});
    case 256:
      return f(HeadDim<256>{});
  }
  return cudaErrorInvalidValue;
}

}  // namespace

int LaunchPagedDecodeAttention(const PagedKvPool& pool, int32_t layer,
                               const PageTable& table, const int32_t* seq_lens,
                               int32_t batch, const void* query,
                               int32_t num_q_heads, float scale,
                               float* workspace, void* out, void* stream) {
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
  return DispatchDType(pool.dtype, [&](auto type) {
    using T = decltype(type);
    return DispatchHeadDim(pool.head_dim, [&](auto dim) {
      constexpr int kHeadDim = decltype(dim)::kValue;
      static_assert(DecodeSmemFits<T, kHeadDim>());
      const dim3 grid(num_parts, pool.num_kv_heads, batch);
      PagedDecodeKernel<T, kHeadDim>
          <<<grid, kDecodeThreads,
             DecodeSmemBytes<T, kHeadDim>(group, partition), cuda_stream>>>(
              pool, layer, table, seq_lens, static_cast<const T*>(query),
              num_q_heads, scale * kLog2e, partition, partial_out, partial_max,
              partial_sum, static_cast<T*>(out));
      if (cudaError_t error = cudaGetLastError(); error != cudaSuccess) {
        return error;
      }
      if (num_parts == 1) return cudaSuccess;
      DecodeReduceKernel<T>
          <<<dim3(num_q_heads, batch), kReduceThreads, 0, cuda_stream>>>(
              partial_out, partial_max, partial_sum, seq_lens, max_tokens,
              partition, num_parts, kHeadDim, static_cast<T*>(out));
      return cudaGetLastError();
    });
  });
}

}  // namespace kvblock::kernels
