// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Kernels over the paged KV pool: copy-on-write page copy, the host tier's
// copies, KV write, KV gather, paged decode attention and export to
// FlashInfer's CSR layout. Each
// call validates its arguments, then runs on `device`: the CUDA kernels of
// kernels/ on a CUDA device (enqueued on `stream`, asynchronous), the CPU
// references of lib/ on Device::Host() (synchronous; `stream` is ignored).
//
// Layout. The pool of all layers is ONE allocation (KvPool::data):
//   [num_layers, 2 * num_pages, page_size, num_kv_heads, head_dim] of dtype;
// the V page of K page `p` is page `p + num_pages` of the same layer. The
// page table is KVPageTable::kernel_view(): int32 [max_batch, 2,
// max_pages_per_seq], row `slot`, half 0 = K ids, half 1 = V ids, -1 unused.
// Sequence `b` of a batch is slot `b`; token `t` of it lives in row
// `t % page_size` of page `table[b][half][t / page_size]`. Every pointer
// argument is an address in `device`'s memory (host memory for the host
// device), and every tensor is contiguous with the shape its comment gives.
//
// Validation. Shapes, counts, dtypes, null pointers and the geometry limits of
// the CUDA kernels are checked on every device, so that code tested on the
// host runs on a GPU. Values inside device memory (page ids, slots,
// positions, lengths) can be checked only where the host can read them: the
// host device rejects a bad one with InvalidArgument before it writes
// anything; CUDA kernels skip what they cannot use (never touching memory out
// of bounds) and trust KVPageTable::Upload to have validated the table. On
// any error, nothing is written.
//
// Errors common to every call: InvalidArgument for a bad argument (the
// message names it and its value), a misaligned pointer included: arrays of
// the pool's dtype (pool.data, keys, values, outputs) need its alignment,
// int32 arrays (tables, lengths, slots, positions, copies, CSR arrays) 4
// bytes, a workspace a float's;
// Unavailable for a CUDA device when kvblock was built without CUDA; Internal
// for a failed kernel launch.
//
// Complexity: linear in the bytes each call reads and writes; decode
// attention reads each K and V row of the batch once.
// Thread safety: stateless functions; the caller orders work on `stream`.
#ifndef KVBLOCK_KERNELS_H_
#define KVBLOCK_KERNELS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kvblock/block_pool.h"
#include "kvblock/config.h"
#include "kvblock/device.h"
#include "kvblock/types.h"

namespace kvblock {

// The KV pool of every layer (non-owning). config.Validate() must pass.
struct KvPool {
  PagedKvConfig config;
  // [num_layers, 2 * num_pages, page_size, num_kv_heads, head_dim] of
  // config.dtype, in device memory.
  void* data = nullptr;
};

// The new tokens of one step, for one layer (non-owning, device memory).
struct KvTokens {
  const void* key = nullptr;    // [num_tokens, num_kv_heads, head_dim], dtype.
  const void* value = nullptr;  // [num_tokens, num_kv_heads, head_dim], dtype.
  const SlotId* slots = nullptr;       // [num_tokens]; kNoSlot = padding.
  const int32_t* positions = nullptr;  // [num_tokens]: index in the sequence.
  int64_t num_tokens = 0;
};

// The sequences of slots [0, batch) (non-owning, device memory).
struct KvBatch {
  DeviceTensor page_table;  // int32 [max_batch, 2, max_pages_per_seq].
  const int32_t* seq_lens = nullptr;  // [batch]: tokens of slot b.
  int32_t batch = 0;
};

// One decode step's queries (non-owning, device memory).
struct DecodeQuery {
  const void* query = nullptr;  // [batch, num_q_heads, head_dim], pool dtype.
  int32_t num_q_heads = 0;      // a multiple of num_kv_heads, ratio <= 32.
  float scale = 0.f;            // softmax scale, usually 1/sqrt(head_dim).
  // Sliding-window attention (vLLM's sliding_window): when positive, a
  // slot's query attends to its last sliding_window tokens only, and the
  // pages wholly before them are never read (they may hold the null page).
  // 0: every token.
  int32_t sliding_window = 0;
};

// FlashInfer's paged-KV index arrays (device memory).
struct CsrPageIndex {
  int32_t* kv_indptr = nullptr;         // [batch + 1].
  int32_t* kv_indices = nullptr;        // [kv_indices_capacity].
  int64_t kv_indices_capacity = 0;      // >= batch * max_pages_per_seq.
  int32_t* kv_last_page_len = nullptr;  // [batch].
};

// Copy-on-write: copies, in every layer, K page `copies[i][0]` to K page
// `copies[i][1]` and the matching V pages (`+ num_pages`), for the
// `num_copies` pairs of `copies` (PageId [num_copies, 2], device memory, e.g.
// the CoW list of a BatchCommit uploaded by the caller). One launch; none for
// zero pairs. Errors: InvalidArgument for a negative count, a null pointer, an
// invalid pool, or (host device) an id outside [0, num_pages), a destination
// that is a source or repeated.
absl::Status CopyPages(Device& device, const KvPool& pool, const PageId* copies,
                       int64_t num_copies, Stream stream);

// The host tier's KV (non-owning): `num_pages` host pages, each the K and V
// of one page in every layer: [num_pages, num_layers, 2, page_size,
// num_kv_heads, head_dim] of the pool's dtype, contiguous, in pinned memory
// of `device` (Device::AllocatePinned, which a CUDA kernel reads and writes
// in place; plain host memory on the host device).
struct HostKvPool {
  void* data = nullptr;
  int32_t num_pages = 0;
};

// Bytes of one host page, what one HostCopy moves: 2 * num_layers *
// config.PageBytes(). REQUIRES: config.Validate() passes.
int64_t HostPageBytes(const PagedKvConfig& config);

// Runs a copy batch of the host tier (BlockPool::TakeHostCopies,
// BatchCommit's StepResult::host_copies): every kDeviceToHost copy (device
// page `device_page`'s K and V in every layer into host page `host_page`),
// then every kHostToDevice copy (the other way), one launch each, none for
// zero copies. `copies`: HostCopy [num_copies], in memory the device reads
// (device memory or pinned host memory on CUDA). Enqueue it on a stream of
// its own after the previous step's forward pass, and make this step's
// copy-on-write copies and forward pass wait for it (an event). Errors:
// InvalidArgument for a negative count, a null pointer, an invalid pool, a
// host pool of no pages or misaligned, or (host device) a page out of range,
// an unknown direction, or two copies of a direction writing the same page.
absl::Status RunHostCopies(Device& device, const KvPool& pool,
                           const HostKvPool& host, const HostCopy* copies,
                           int64_t num_copies, Stream stream);

// Writes the K and V rows of `tokens` into layer `layer` through
// `page_table`; a token with slot kNoSlot is skipped (padding). Two tokens
// with the same slot and position: the last wins on the host device, either
// on a GPU (do not send both). Errors: InvalidArgument for a bad layer, table
// shape, count, null or misaligned pointer (key and value need their dtype's
// alignment), or (host device) a slot outside [0, max_batch), a negative
// position, or a position whose page is not a live id of its slot's row.
absl::Status WriteKv(Device& device, const KvPool& pool, int32_t layer,
                     const DeviceTensor& page_table, const KvTokens& tokens,
                     Stream stream);

// Gathers layer `layer` of `batch` into key_out and value_out, each
// [batch.batch, max_len, num_kv_heads, head_dim] of the pool dtype;
// positions at or past a slot's length are zero. Errors: InvalidArgument for
// a bad layer, table shape, batch, max_len or null pointer, or (host device) a
// length outside [0, max_len] or longer than the slot's live pages hold.
absl::Status GatherKv(Device& device, const KvPool& pool, int32_t layer,
                      const KvBatch& batch, int32_t max_len, void* key_out,
                      void* value_out, Stream stream);

// Bytes of workspace PagedDecodeAttention needs for `batch` slots and
// `num_q_heads` query heads of `config` (0 when one partition covers
// max_pages_per_seq * page_size tokens). REQUIRES: arguments that
// PagedDecodeAttention accepts.
int64_t PagedDecodeWorkspaceBytes(const PagedKvConfig& config, int32_t batch,
                                  int32_t num_q_heads);

// Decode attention of one query token per slot of `batch` over layer
// `layer`: out[b][qh] = softmax(scale * q[b][qh] . K[b][kh]^T) V[b][kh] over
// the slot's seq_lens[b] tokens (its last query.sliding_window ones with a
// window), kh = qh / (num_q_heads / num_kv_heads), fp32
// accumulation; `out` is [batch, num_q_heads, head_dim] of the pool dtype, and
// a slot of length 0 gets zeros. Long contexts are split into partitions
// merged by a second kernel (flash-decoding), using `workspace` of at least
// PagedDecodeWorkspaceBytes() bytes. On a CUDA device, fp16 and bf16 pools
// with 2 to 16 query heads per KV head and head_dim <= 128 run on tensor
// cores, which round the softmax probabilities to the pool dtype before
// weighting V (fp32 sums, as FlashAttention does); other shapes, and the host
// device, keep them in fp32. The kernel reads 16-byte vectors:
// pool.data and query.query must be 16-byte aligned. Errors: InvalidArgument
// for a bad layer, table shape, batch (> 65535 included), query heads, a
// negative sliding window, a
// head_dim other than 64, 80, 96, 128 or 256, a non-finite scale, a small
// workspace, a null or misaligned pointer, or (host device) a length outside
// [0, max_pages_per_seq * page_size] or longer than the slot's live pages
// hold.
absl::Status PagedDecodeAttention(Device& device, const KvPool& pool,
                                  int32_t layer, const KvBatch& batch,
                                  const DecodeQuery& query, void* workspace,
                                  int64_t workspace_bytes, void* out,
                                  Stream stream);

// Writes FlashInfer's CSR page index of `batch`: slot b owns the
// ceil(seq_lens[b] / page_size) K page ids kv_indices[kv_indptr[b] ..
// kv_indptr[b + 1]), and kv_last_page_len[b] tokens of its last page are used
// (0 for an empty slot). Use pool.data[layer][0 : num_pages] as FlashInfer's K
// cache and [num_pages : 2 * num_pages] as its V cache. Nothing is written for
// an empty batch. Errors: InvalidArgument for a bad config, table shape,
// batch, small kv_indices_capacity or null pointer, or (host device) a length
// outside [0, max_pages_per_seq * page_size] or longer than the slot's live
// pages hold. On a CUDA device such a length is not seen: the kernel copies
// the row's -1 entries into kv_indices, so lengths must match the table.
absl::Status ToCsr(Device& device, const PagedKvConfig& config,
                   const KvBatch& batch, const CsrPageIndex& csr,
                   Stream stream);

}  // namespace kvblock

#endif  // KVBLOCK_KERNELS_H_
