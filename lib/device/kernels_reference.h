// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Internal: CPU references of the kernels of kvblock/kernels.h, which are
// also the host device's implementation, plus the f16/bf16 conversions they
// use. Every pointer is host memory. The callers (lib/device/kernels.cc and
// tests) pass arguments that kernels.cc's validation accepts (shapes, counts,
// pointers); the references check the values stored in memory (page ids,
// slots, positions, lengths) before they write anything, so a failing call
// changes nothing.
//
// Complexity: linear in the bytes read and written; decode attention is
// O(batch * num_q_heads * len * head_dim), reading the KV in place.
// Thread safety: stateless functions.
#ifndef KVBLOCK_LIB_DEVICE_KERNELS_REFERENCE_H_
#define KVBLOCK_LIB_DEVICE_KERNELS_REFERENCE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kvblock/config.h"
#include "kvblock/device.h"
#include "kvblock/kernels.h"
#include "kvblock/types.h"

namespace kvblock::internal {

// IEEE binary16 <-> float. FloatToHalf rounds to nearest even, overflows to
// infinity and keeps NaN a (quiet) NaN; HalfToFloat is exact.
float HalfToFloat(uint16_t bits);
uint16_t FloatToHalf(float value);

// bfloat16 <-> float, likewise (bfloat16 is the top half of a float).
float Bf16ToFloat(uint16_t bits);
uint16_t FloatToBf16(float value);

// Element `index` of an array of `dtype`, as float; and the store rounding a
// float to `dtype`.
float LoadElement(const void* data, int64_t index, DType dtype);
void StoreElement(void* data, int64_t index, DType dtype, float value);

// A dense KV tensor pair, as GatherKv writes it (host memory).
struct DenseKv {
  DType dtype = DType::kBf16;
  int32_t batch = 0;
  int32_t max_len = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  const void* key = nullptr;    // [batch, max_len, num_kv_heads, head_dim].
  const void* value = nullptr;  // [batch, max_len, num_kv_heads, head_dim].
  const int32_t* seq_lens = nullptr;  // [batch], each in [0, max_len].
};

// Plain softmax attention of one query token per sequence over dense KV
// (its last query.sliding_window tokens with a window, the rows before them
// unread), fp32 accumulation: out [batch, num_q_heads, head_dim] of kv.dtype; a
// sequence of length 0 gets zeros. REQUIRES: query.num_q_heads a positive
// multiple of kv.num_kv_heads; valid lengths.
void DenseDecodeAttention(const DenseKv& kv, const DecodeQuery& query,
                          void* out);

// The references of CopyPages, WriteKv, GatherKv, PagedDecodeAttention and
// ToCsr (kvblock/kernels.h has their contracts and errors); the decode
// reference computes what DenseDecodeAttention computes, bit for bit, over
// the pages in place.
absl::Status CopyPagesReference(const KvPool& pool, const PageId* copies,
                                int64_t num_copies);

// RunHostCopies on the host: every id, direction and written page checked
// first (InvalidArgument naming the copy, nothing written), then the stores
// in order, then the loads.
absl::Status RunHostCopiesReference(const KvPool& pool, const HostKvPool& host,
                                    const HostCopy* copies, int64_t num_copies);
absl::Status WriteKvReference(const KvPool& pool, int32_t layer,
                              const DeviceTensor& page_table,
                              const KvTokens& tokens);
absl::Status GatherKvReference(const KvPool& pool, int32_t layer,
                               const KvBatch& batch, int32_t max_len,
                               void* key_out, void* value_out);
absl::Status PagedDecodeAttentionReference(const KvPool& pool, int32_t layer,
                                           const KvBatch& batch,
                                           const DecodeQuery& query, void* out);
absl::Status ToCsrReference(const PagedKvConfig& config, const KvBatch& batch,
                            const CsrPageIndex& csr);

}  // namespace kvblock::internal

#endif  // KVBLOCK_LIB_DEVICE_KERNELS_REFERENCE_H_
