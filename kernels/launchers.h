// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Host launchers of kvblock's CUDA kernels: the plain, Abseil-free interface
// between lib/device/kernels.cc (which validates arguments and speaks
// absl::Status) and the nvcc-compiled kernels/*.cu files. Everything here is
// plain data and plain functions so that both compilers read it; no CUDA header
// is needed.
//
// The paged KV pool is ONE contiguous device allocation for all layers:
//   pool[num_layers][2 * num_pages][page_size][num_kv_heads][head_dim]
// Layer `l`'s K page `p` starts at element
//   ((l * 2 * num_pages + p) * page_size) * num_kv_heads * head_dim,
// and its V page is page `p + num_pages` of the same layer. Every offset is
// computed in 64 bits.
//
// Each launcher takes the stream last (a cudaStream_t passed as void*,
// nullptr = default stream), returns 0 (cudaSuccess) without launching when
// there is no work, and otherwise returns the cudaError_t of the launch
// (cudaGetLastError()). Arguments are NOT validated here beyond what keeps
// memory accesses in bounds: lib/device/kernels.cc does that. Table entries and
// per-token inputs live in device memory and are read only by the kernels,
// which skip (never dereference) page ids outside their range.
//
// Thread safety: the launchers are stateless; concurrent calls on different
// streams are safe when they do not write the same memory.
#ifndef KVBLOCK_KERNELS_LAUNCHERS_H_
#define KVBLOCK_KERNELS_LAUNCHERS_H_

#include <cstdint>

namespace kvblock::kernels {

// Element type of the pool; the values match kvblock::DType.
enum class KvDType : int32_t { kF16 = 0, kBf16 = 1, kF32 = 2 };

// Bytes of one element of `dtype`.
constexpr int64_t KvDTypeBytes(KvDType dtype) {
  return dtype == KvDType::kF32 ? 4 : 2;
}

// The paged K/V pool of every layer.
struct PagedKvPool {
  // [num_layers, 2 * num_pages, page_size, num_kv_heads, head_dim] of dtype.
  void* data;
  int32_t num_layers;
  int32_t num_pages;  // K pages per layer (V pages: as many more).
  int32_t page_size;  // tokens per page.
  int32_t num_kv_heads;
  int32_t head_dim;
  KvDType dtype;

  // Bytes of one token's row of one page: num_kv_heads * head_dim elements.
  int64_t RowBytes() const {
    return int64_t{num_kv_heads} * head_dim * KvDTypeBytes(dtype);
  }
};

// The batched device page table (KVPageTable::kernel_view()).
struct PageTable {
  // int32 [max_batch, 2, max_pages_per_seq]: row `slot`, half 0 = K page ids,
  // half 1 = V page ids (K id + num_pages); -1 = unused. Live ids of a half
  // form a prefix of it.
  const int32_t* data;
  int32_t max_batch;
  int32_t max_pages_per_seq;
};

// One range of a page-table patch (the layout of kvblock::PageTablePatchRange):
// K entries [first, first + count) of row `slot`, where `entry` = slot *
// max_pages_per_seq + first, get ids[ids_offset, + count), the V half those
// ids + num_pages, and the `clear` entries after them -1 in both halves.
struct TablePatchRange {
  int32_t entry;
  int32_t count;
  int32_t clear;
  int32_t ids_offset;
};

// Threads of one decode-attention block.
inline constexpr int kDecodeThreads = 256;
// Largest num_q_heads / num_kv_heads the decode kernel supports.
inline constexpr int kMaxDecodeGroup = 32;

// Tokens of one split-K partition of the decode kernel for a GQA group of
// `group` query heads per KV head (the group's logits of one partition fit in
// 32 KiB of shared memory).
constexpr int32_t DecodePartitionTokens(int32_t group) {
  return group <= 16 ? 512 : 256;
}

// True when the decode kernel is compiled for `head_dim`.
constexpr bool DecodeHeadDimSupported(int32_t head_dim) {
  return head_dim == 64 || head_dim == 80 || head_dim == 96 ||
         head_dim == 128 || head_dim == 256;
}

// Copy-on-write: for each of the `num_copies` pairs, copies K page
// `copies[i][0]` to K page `copies[i][1]` and V page `+ num_pages` to V page
// `+ num_pages`, in every layer, in one launch. 16-byte vector copies when the
// pool and page size allow it.
//   copies: int32 [num_copies, 2] (source K id, destination K id), device.
// REQUIRES: no destination is also a source or another pair's destination.
int LaunchCopyPages(const PagedKvPool& pool, const int32_t* copies,
                    int64_t num_copies, void* stream);

// One copy of the host tier (the layout of kvblock::HostCopy): device page
// `device_page` and host page `host_page`, direction 0 a store (device to
// host), 1 a load (host to device).
struct HostPageCopy {
  int32_t device_page;
  int32_t host_page;
  uint8_t direction;
};

// Runs the copies of `copies` whose direction is `direction`, each the K and
// V page of every layer, in one launch; copies of the other direction and
// ids out of range are skipped. 16-byte vector copies when the pools and the
// page size allow it.
//   host: [host_pages, num_layers, 2, page_size, num_kv_heads, head_dim] of
//     pool.dtype, pinned host memory the kernel reaches in place.
//   copies: [num_copies], device-readable.
// REQUIRES: no two copies of `direction` write the same page.
int LaunchHostCopies(const PagedKvPool& pool, void* host, int32_t host_pages,
                     const HostPageCopy* copies, int64_t num_copies,
                     uint8_t direction, void* stream);

// Writes the K and V rows of `num_tokens` new tokens into layer `layer`: token
// `i` goes to position `positions[i]` of slot `slots[i]`, i.e. to row
// `positions[i] % page_size` of page `table[slots[i]][half][positions[i] /
// page_size]`. A token with a slot of -1 (padding) is skipped.
//   key, value: [num_tokens, num_kv_heads, head_dim] of pool.dtype, device.
//   slots, positions: int32 [num_tokens], device.
int LaunchWriteKv(const PagedKvPool& pool, int32_t layer,
                  const PageTable& table, const void* key, const void* value,
                  const int32_t* slots, const int32_t* positions,
                  int64_t num_tokens, void* stream);

// Gathers layer `layer` of slots [0, batch) into dense tensors; positions at
// or past a slot's length are zero-filled.
//   seq_lens: int32 [batch], device.
//   key_out, value_out: [batch, max_len, num_kv_heads, head_dim] of
//   pool.dtype, device.
int LaunchGatherKv(const PagedKvPool& pool, int32_t layer,
                   const PageTable& table, const int32_t* seq_lens,
                   int32_t batch, int32_t max_len, void* key_out,
                   void* value_out, void* stream);

// Split-K partitions of a decode over rows of `max_tokens` tokens (at least 1).
constexpr int64_t DecodePartitions(int64_t max_tokens, int32_t group) {
  const int64_t partition = DecodePartitionTokens(group);
  return max_tokens <= partition ? 1 : (max_tokens + partition - 1) / partition;
}

// Floats of decode workspace for `batch` sequences whose rows hold up to
// `max_tokens` tokens: zero when one partition covers them (the kernel then
// writes `out` directly), otherwise partial outputs, maxima and sums:
// batch * num_q_heads * partitions * (head_dim + 2).
constexpr int64_t DecodeWorkspaceFloats(int64_t max_tokens, int32_t batch,
                                        int32_t num_q_heads,
                                        int32_t num_kv_heads,
                                        int32_t head_dim) {
  const int64_t partitions =
      DecodePartitions(max_tokens, num_q_heads / num_kv_heads);
  if (partitions == 1) return 0;
  return int64_t{batch} * num_q_heads * partitions * (int64_t{head_dim} + 2);
}

// Decode attention of one query token per slot in [0, batch) over layer
// `layer`: out = softmax(scale * q k^T) v with fp32 accumulation, query head
// `qh` reading KV head `qh / (num_q_heads / num_kv_heads)`. Flash-decoding:
// the context is split into partitions of DecodePartitionTokens() tokens; a
// reduce kernel merges the partial results when there is more than one.
// 16-bit pools with groups of 2 to 16 and head_dim <= 128 run on tensor cores
// (decode_attention_tc.cu), with probabilities rounded to pool.dtype.
//   query, out: [batch, num_q_heads, head_dim] of pool.dtype, device.
//   seq_lens: int32 [batch], device; a length of 0 gives a zero output.
//   sliding_window: > 0: each query reads its last sliding_window tokens
//     only (the pages before them are never read); 0: all.
//   workspace: DecodeWorkspaceFloats(...) floats, device.
// REQUIRES: DecodeHeadDimSupported(head_dim), num_q_heads a multiple of
// num_kv_heads with a ratio <= kMaxDecodeGroup, batch <= 65535.
int LaunchPagedDecodeAttention(const PagedKvPool& pool, int32_t layer,
                               const PageTable& table, const int32_t* seq_lens,
                               int32_t batch, const void* query,
                               int32_t num_q_heads, float scale,
                               int32_t sliding_window, float* workspace,
                               void* out, void* stream);

// FlashInfer's paged-KV layout for slots [0, batch): kv_indptr[b + 1] -
// kv_indptr[b] = ceil(seq_lens[b] / page_size) pages (clamped to the row),
// kv_indices = those K page ids of each slot in order, kv_last_page_len[b] =
// tokens in the last page (0 for an empty sequence). One block.
//   seq_lens, kv_last_page_len: int32 [batch]; kv_indptr: int32 [batch + 1];
//   kv_indices: int32 [batch * max_pages_per_seq] (the upper bound); device.
int LaunchToCsr(const PageTable& table, int32_t page_size,
                const int32_t* seq_lens, int32_t batch, int32_t* kv_indptr,
                int32_t* kv_indices, int32_t* kv_last_page_len, void* stream);

// Applies `num_ranges` ranges of a page-table patch to `table` (int32
// [max_batch, 2, max_pages_per_seq], device), one warp per range; a range
// that does not fit the table is skipped. The ranges of one patch write
// disjoint entries, so they run in any order.
//   ids: int32 K ids the ranges point into; ranges: [num_ranges]; device.
int LaunchApplyPageTablePatch(int32_t* table, int32_t max_batch,
                              int32_t max_pages_per_seq, int32_t num_pages,
                              const int32_t* ids, const TablePatchRange* ranges,
                              int32_t num_ranges, void* stream);

}  // namespace kvblock::kernels

#endif  // KVBLOCK_KERNELS_LAUNCHERS_H_
