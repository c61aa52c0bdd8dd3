// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// kvblock/kernels.h: argument validation, then dispatch to the CPU reference
// (host device) or to the CUDA launcher of kernels/launchers.h (CUDA device).
#include "kvblock/kernels.h"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "device/kernels_reference.h"
#include "kernels/launchers.h"
#include "kvblock/status_macros.h"

#ifdef KVBLOCK_HAVE_CUDA
#include <cuda_runtime.h>

#include "device/device_cuda.h"
#endif

namespace kvblock {
namespace {

static_assert(static_cast<int32_t>(kernels::KvDType::kF16) ==
              static_cast<int32_t>(DType::kF16));
static_assert(static_cast<int32_t>(kernels::KvDType::kBf16) ==
              static_cast<int32_t>(DType::kBf16));
static_assert(static_cast<int32_t>(kernels::KvDType::kF32) ==
              static_cast<int32_t>(DType::kF32));

// A HostCopy list is read by the kernel as HostPageCopy.
static_assert(sizeof(HostCopy) == sizeof(kernels::HostPageCopy));
static_assert(offsetof(HostCopy, device_page) ==
              offsetof(kernels::HostPageCopy, device_page));
static_assert(offsetof(HostCopy, host_page) ==
              offsetof(kernels::HostPageCopy, host_page));
static_assert(offsetof(HostCopy, direction) ==
              offsetof(kernels::HostPageCopy, direction));
static_assert(static_cast<uint8_t>(HostCopy::Direction::kDeviceToHost) == 0 &&
              static_cast<uint8_t>(HostCopy::Direction::kHostToDevice) == 1);

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
// The decode grid puts slots in gridDim.z and KV heads in gridDim.y.
constexpr int32_t kMaxDecodeBatch = 65535;
constexpr int32_t kMaxDecodeKvHeads = 65535;

template <typename... Args>
absl::Status Invalid(const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(args...));
}

// InvalidArgument naming the first null pointer of `pointers`.
absl::Status RequireNonNull(
    std::initializer_list<std::pair<absl::string_view, const void*>> pointers) {
  for (const auto& [name, pointer] : pointers) {
    if (pointer == nullptr) return Invalid(name, " is null");
  }
  return absl::OkStatus();
}

// InvalidArgument naming the first of `pointers` not aligned to `alignment`
// bytes (the kernels load whole elements, or vectors of them).
absl::Status RequireAligned(
    size_t alignment,
    std::initializer_list<std::pair<absl::string_view, const void*>> pointers) {
  for (const auto& [name, pointer] : pointers) {
    if (reinterpret_cast<uintptr_t>(pointer) % alignment != 0) {
      return Invalid(name, " is not ", alignment, "-byte aligned");
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateConfig(const PagedKvConfig& config) {
  if (absl::Status status = config.Validate(); !status.ok()) return status;
  if (config.MaxTokensPerSeq() > kInt32Max) {
    return Invalid("config: max_pages_per_seq ", config.max_pages_per_seq,
                   " x page_size ", config.page_size,
                   " exceeds int32 token positions");
  }
  return absl::OkStatus();
}

absl::Status ValidatePool(const KvPool& pool) {
  KVBLOCK_RETURN_IF_ERROR(ValidateConfig(pool.config));
  if (pool.data == nullptr) return Invalid("pool: data is null");
  return RequireAligned(DTypeSize(pool.config.dtype),
                        {{"pool.data", pool.data}});
}

absl::Status ValidateLayer(const PagedKvConfig& config, int32_t layer) {
  if (layer < 0 || layer >= config.num_layers) {
    return Invalid("layer ", layer,
                   " is outside [0, num_layers = ", config.num_layers, ")");
  }
  return absl::OkStatus();
}

absl::Status ValidateTable(const PagedKvConfig& config,
                           const DeviceTensor& table) {
  if (table.data() == nullptr) return Invalid("page_table: data is null");
  KVBLOCK_RETURN_IF_ERROR(
      RequireAligned(sizeof(int32_t), {{"page_table: data", table.data()}}));
  const auto& shape = table.shape();
  if (shape[0] != config.max_batch || shape[1] != 2 ||
      shape[2] != config.max_pages_per_seq) {
    return Invalid("page_table: shape [", shape[0], ", ", shape[1], ", ",
                   shape[2], "] is not [max_batch, 2, max_pages_per_seq] = [",
                   config.max_batch, ", 2, ", config.max_pages_per_seq, "]");
  }
  return absl::OkStatus();
}

absl::Status ValidateBatch(const PagedKvConfig& config, const KvBatch& batch) {
  KVBLOCK_RETURN_IF_ERROR(ValidateTable(config, batch.page_table));
  if (batch.batch < 0 || batch.batch > config.max_batch) {
    return Invalid("batch ", batch.batch,
                   " is outside [0, max_batch = ", config.max_batch, "]");
  }
  if (batch.batch > 0 && batch.seq_lens == nullptr) {
    return Invalid("seq_lens is null");
  }
  return RequireAligned(sizeof(int32_t), {{"seq_lens", batch.seq_lens}});
}

// The launchers' views of the pool and the table (used on CUDA devices).
kernels::PagedKvPool KernelPool(const KvPool& pool) {
  const PagedKvConfig& c = pool.config;
  return {pool.data,
          c.num_layers,
          c.num_pages,
          c.page_size,
          c.num_kv_heads,
          c.head_dim,
          static_cast<kernels::KvDType>(c.dtype)};
}

kernels::PageTable KernelTable(const DeviceTensor& table) {
  return {table.data(), static_cast<int32_t>(table.shape()[0]),
          static_cast<int32_t>(table.shape()[2])};
}

// Runs `host` (returning absl::Status) on the host device, and `cuda`
// (returning the cudaError_t of a launcher) on a CUDA device. Without CUDA,
// `cuda` is never called, so the launchers it names need no definition.
template <typename Host, typename Cuda>
absl::Status Dispatch(Device& device, absl::string_view kernel, Host&& host,
                      [[maybe_unused]] Cuda&& cuda) {
  if (device.kind() == Device::Kind::kHost) return host();
#ifdef KVBLOCK_HAVE_CUDA
  // Launches go to the current device, and a launcher reports
  // cudaGetLastError(): drop an error an earlier, unrelated call left (a
  // sticky error would come back, as it should).
  KVBLOCK_RETURN_IF_ERROR(device.MakeCurrent());
  (void)cudaGetLastError();
  return internal::CudaStatus(static_cast<cudaError_t>(cuda()),
                              absl::StrCat(kernel, " launch"));
#else
  return absl::UnavailableError(
      absl::StrCat(kernel, ": kvblock was built without CUDA"));
#endif
}

}  // namespace

absl::Status CopyPages(Device& device, const KvPool& pool, const PageId* copies,
                       int64_t num_copies, Stream stream) {
  KVBLOCK_RETURN_IF_ERROR(ValidatePool(pool));
  if (num_copies < 0 || num_copies > pool.config.num_pages) {
    return Invalid("num_copies ", num_copies,
                   " is outside [0, num_pages = ", pool.config.num_pages,
                   "] (destinations are distinct)");
  }
  if (num_copies == 0) return absl::OkStatus();
  KVBLOCK_RETURN_IF_ERROR(RequireNonNull({{"copies", copies}}));
  KVBLOCK_RETURN_IF_ERROR(
      RequireAligned(alignof(PageId), {{"copies", copies}}));
  return Dispatch(
      device, "CopyPages",
      [&] { return internal::CopyPagesReference(pool, copies, num_copies); },
      [&] {
        return kernels::LaunchCopyPages(KernelPool(pool), copies, num_copies,
                                        stream);
      });
}

int64_t HostPageBytes(const PagedKvConfig& config) {
  return 2 * int64_t{config.num_layers} * config.PageBytes();
}

absl::Status RunHostCopies(Device& device, const KvPool& pool,
                           const HostKvPool& host, const HostCopy* copies,
                           int64_t num_copies, Stream stream) {
  KVBLOCK_RETURN_IF_ERROR(ValidatePool(pool));
  if (host.data == nullptr) return Invalid("host: data is null");
  if (host.num_pages < 1) {
    return Invalid("host: num_pages ", host.num_pages, " is not positive");
  }
  KVBLOCK_RETURN_IF_ERROR(
      RequireAligned(DTypeSize(pool.config.dtype), {{"host.data", host.data}}));
  if (num_copies < 0) return Invalid("num_copies ", num_copies, " is negative");
  if (num_copies == 0) return absl::OkStatus();
  KVBLOCK_RETURN_IF_ERROR(RequireNonNull({{"copies", copies}}));
  KVBLOCK_RETURN_IF_ERROR(
      RequireAligned(alignof(HostCopy), {{"copies", copies}}));
  return Dispatch(
      device, "RunHostCopies",
      [&] {
        return internal::RunHostCopiesReference(pool, host, copies, num_copies);
      },
      [&] {
        const auto* list =
            reinterpret_cast<const kernels::HostPageCopy*>(copies);
        for (const uint8_t direction : {0, 1}) {
          const int error = kernels::LaunchHostCopies(
              KernelPool(pool), host.data, host.num_pages, list, num_copies,
              direction, stream);
          if (error != 0) return error;
        }
        return 0;
      });
}

absl::Status WriteKv(Device& device, const KvPool& pool, int32_t layer,
                     const DeviceTensor& page_table, const KvTokens& tokens,
                     Stream stream) {
  KVBLOCK_RETURN_IF_ERROR(ValidatePool(pool));
  KVBLOCK_RETURN_IF_ERROR(ValidateLayer(pool.config, layer));
  KVBLOCK_RETURN_IF_ERROR(ValidateTable(pool.config, page_table));
  if (tokens.num_tokens < 0) {
    return Invalid("tokens.num_tokens ", tokens.num_tokens, " is negative");
  }
  if (tokens.num_tokens == 0) return absl::OkStatus();
  KVBLOCK_RETURN_IF_ERROR(
      RequireNonNull({{"tokens.key", tokens.key},
                      {"tokens.value", tokens.value},
                      {"tokens.slots", tokens.slots},
                      {"tokens.positions", tokens.positions}}));
  KVBLOCK_RETURN_IF_ERROR(RequireAligned(
      DTypeSize(pool.config.dtype),
      {{"tokens.key", tokens.key}, {"tokens.value", tokens.value}}));
  KVBLOCK_RETURN_IF_ERROR(RequireAligned(
      sizeof(int32_t), {{"tokens.slots", tokens.slots},
                        {"tokens.positions", tokens.positions}}));
  return Dispatch(
      device, "WriteKv",
      [&] {
        return internal::WriteKvReference(pool, layer, page_table, tokens);
      },
      [&] {
        return kernels::LaunchWriteKv(
            KernelPool(pool), layer, KernelTable(page_table), tokens.key,
            tokens.value, tokens.slots, tokens.positions, tokens.num_tokens,
            stream);
      });
}

absl::Status GatherKv(Device& device, const KvPool& pool, int32_t layer,
                      const KvBatch& batch, int32_t max_len, void* key_out,
                      void* value_out, Stream stream) {
  KVBLOCK_RETURN_IF_ERROR(ValidatePool(pool));
  KVBLOCK_RETURN_IF_ERROR(ValidateLayer(pool.config, layer));
  KVBLOCK_RETURN_IF_ERROR(ValidateBatch(pool.config, batch));
  if (max_len < 0) return Invalid("max_len ", max_len, " is negative");
  // Each output holds batch * max_len rows of at most 2^31 * 2^31 * 4 bytes.
  const int64_t rows = int64_t{batch.batch} * max_len;
  const int64_t row_bytes = int64_t{pool.config.num_kv_heads} *
                            pool.config.head_dim * DTypeSize(pool.config.dtype);
  if (rows > 0 && row_bytes > std::numeric_limits<int64_t>::max() / rows) {
    return Invalid("batch ", batch.batch, " x max_len ", max_len, " rows of ",
                   row_bytes, " bytes overflow int64");
  }
  if (rows == 0) return absl::OkStatus();
  KVBLOCK_RETURN_IF_ERROR(
      RequireNonNull({{"key_out", key_out}, {"value_out", value_out}}));
  KVBLOCK_RETURN_IF_ERROR(
      RequireAligned(DTypeSize(pool.config.dtype),
                     {{"key_out", key_out}, {"value_out", value_out}}));
  return Dispatch(
      device, "GatherKv",
      [&] {
        return internal::GatherKvReference(pool, layer, batch, max_len, key_out,
                                           value_out);
      },
      [&] {
        return kernels::LaunchGatherKv(
            KernelPool(pool), layer, KernelTable(batch.page_table),
            batch.seq_lens, batch.batch, max_len, key_out, value_out, stream);
      });
}

namespace {

// Whether PagedDecodeWorkspaceBytes's product fits int64 (batch and query
// heads near int32's limit, with many partitions, do not).
bool DecodeWorkspaceFits(const PagedKvConfig& config, int32_t batch,
                         int32_t num_q_heads) {
  const int64_t partitions = kernels::DecodePartitions(
      config.MaxTokensPerSeq(), num_q_heads / config.num_kv_heads);
  int64_t bytes = int64_t{sizeof(float)} * (int64_t{config.head_dim} + 2);
  for (const int64_t factor :
       {int64_t{batch}, int64_t{num_q_heads}, partitions}) {
    if (__builtin_mul_overflow(bytes, factor, &bytes)) return false;
  }
  return true;
}

}  // namespace

int64_t PagedDecodeWorkspaceBytes(const PagedKvConfig& config, int32_t batch,
                                  int32_t num_q_heads) {
  return int64_t{sizeof(float)} *
         kernels::DecodeWorkspaceFloats(config.MaxTokensPerSeq(), batch,
                                        num_q_heads, config.num_kv_heads,
                                        config.head_dim);
}

absl::Status PagedDecodeAttention(Device& device, const KvPool& pool,
                                  int32_t layer, const KvBatch& batch,
                                  const DecodeQuery& query, void* workspace,
                                  int64_t workspace_bytes, void* out,
                                  Stream stream) {
  const PagedKvConfig& c = pool.config;
  KVBLOCK_RETURN_IF_ERROR(ValidatePool(pool));
  KVBLOCK_RETURN_IF_ERROR(ValidateLayer(c, layer));
  KVBLOCK_RETURN_IF_ERROR(ValidateBatch(c, batch));
  if (batch.batch > kMaxDecodeBatch) {
    return Invalid("batch ", batch.batch, " exceeds the decode limit ",
                   kMaxDecodeBatch);
  }
  if (c.num_kv_heads > kMaxDecodeKvHeads) {
    return Invalid("num_kv_heads ", c.num_kv_heads,
                   " exceeds the decode limit ", kMaxDecodeKvHeads);
  }
  if (query.num_q_heads <= 0 || query.num_q_heads % c.num_kv_heads != 0 ||
      query.num_q_heads / c.num_kv_heads > kernels::kMaxDecodeGroup) {
    return Invalid("query.num_q_heads ", query.num_q_heads,
                   " is not num_kv_heads ", c.num_kv_heads, " x [1, ",
                   kernels::kMaxDecodeGroup, "]");
  }
  if (!kernels::DecodeHeadDimSupported(c.head_dim)) {
    return Invalid("head_dim ", c.head_dim,
                   " is not one of the decode kernel's 64, 80, 96, 128, 256");
  }
  if (!std::isfinite(query.scale)) {
    return Invalid("query.scale ", query.scale, " is not finite");
  }
  if (query.sliding_window < 0) {
    return Invalid("query.sliding_window ", query.sliding_window,
                   " is negative");
  }
  if (batch.batch == 0) return absl::OkStatus();
  if (!DecodeWorkspaceFits(c, batch.batch, query.num_q_heads)) {
    return Invalid("the workspace of batch ", batch.batch, " x num_q_heads ",
                   query.num_q_heads, " x ", c.MaxTokensPerSeq(),
                   " tokens a sequence overflows int64 bytes");
  }
  const int64_t required =
      PagedDecodeWorkspaceBytes(c, batch.batch, query.num_q_heads);
  if (workspace_bytes < required) {
    return Invalid("workspace_bytes ", workspace_bytes, " is below the ",
                   required, " that PagedDecodeWorkspaceBytes requires");
  }
  KVBLOCK_RETURN_IF_ERROR(
      RequireNonNull({{"query.query", query.query}, {"out", out}}));
  // The kernel reads the pool and the query as 16-byte vectors.
  KVBLOCK_RETURN_IF_ERROR(RequireAligned(
      16, {{"pool.data", pool.data}, {"query.query", query.query}}));
  KVBLOCK_RETURN_IF_ERROR(RequireAligned(DTypeSize(c.dtype), {{"out", out}}));
  if (required > 0) {
    KVBLOCK_RETURN_IF_ERROR(RequireNonNull({{"workspace", workspace}}));
    KVBLOCK_RETURN_IF_ERROR(
        RequireAligned(sizeof(float), {{"workspace", workspace}}));
  }
  return Dispatch(
      device, "PagedDecodeAttention",
      [&] {
        return internal::PagedDecodeAttentionReference(pool, layer, batch,
                                                       query, out);
      },
      [&] {
        return kernels::LaunchPagedDecodeAttention(
            KernelPool(pool), layer, KernelTable(batch.page_table),
            batch.seq_lens, batch.batch, query.query, query.num_q_heads,
            query.scale, query.sliding_window, static_cast<float*>(workspace),
            out, stream);
      });
}

absl::Status ToCsr(Device& device, const PagedKvConfig& config,
                   const KvBatch& batch, const CsrPageIndex& csr,
                   Stream stream) {
  KVBLOCK_RETURN_IF_ERROR(ValidateConfig(config));
  KVBLOCK_RETURN_IF_ERROR(ValidateBatch(config, batch));
  const int64_t max_indices = int64_t{batch.batch} * config.max_pages_per_seq;
  if (max_indices > kInt32Max) {
    return Invalid("batch ", batch.batch, " x max_pages_per_seq ",
                   config.max_pages_per_seq, " exceeds int32 kv_indptr");
  }
  if (csr.kv_indices_capacity < max_indices) {
    return Invalid("csr.kv_indices_capacity ", csr.kv_indices_capacity,
                   " is below batch x max_pages_per_seq = ", max_indices);
  }
  if (batch.batch == 0) return absl::OkStatus();
  KVBLOCK_RETURN_IF_ERROR(
      RequireNonNull({{"csr.kv_indptr", csr.kv_indptr},
                      {"csr.kv_indices", csr.kv_indices},
                      {"csr.kv_last_page_len", csr.kv_last_page_len}}));
  KVBLOCK_RETURN_IF_ERROR(RequireAligned(
      sizeof(int32_t), {{"csr.kv_indptr", csr.kv_indptr},
                        {"csr.kv_indices", csr.kv_indices},
                        {"csr.kv_last_page_len", csr.kv_last_page_len}}));
  return Dispatch(
      device, "ToCsr",
      [&] { return internal::ToCsrReference(config, batch, csr); },
      [&] {
        return kernels::LaunchToCsr(KernelTable(batch.page_table),
                                    config.page_size, batch.seq_lens,
                                    batch.batch, csr.kv_indptr, csr.kv_indices,
                                    csr.kv_last_page_len, stream);
      });
}

}  // namespace kvblock
