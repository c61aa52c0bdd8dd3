// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "device/kernels_reference.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kvblock/status_macros.h"

namespace kvblock::internal {
namespace {

// Bytes of one token's row of one page (num_kv_heads * head_dim elements).
int64_t RowBytes(const PagedKvConfig& config) {
  return int64_t{config.num_kv_heads} * config.head_dim *
         DTypeSize(config.dtype);
}

// Address of row `in_page` of pool page `page` (K or V id) of layer `layer`.
unsigned char* PoolRow(const KvPool& pool, int32_t layer, PageId page,
                       int64_t in_page) {
  const PagedKvConfig& c = pool.config;
  const int64_t row =
      (int64_t{layer} * 2 * c.num_pages + page) * c.page_size + in_page;
  return static_cast<unsigned char*>(pool.data) + row * RowBytes(c);
}

// The K and V page ids of logical page `logical_page` of `slot`'s row.
struct PagePair {
  PageId k;
  PageId v;
};
PagePair TablePages(const DeviceTensor& table, int64_t slot,
                    int64_t logical_page) {
  const int64_t width = table.shape()[2];
  const int32_t* row = table.data() + slot * 2 * width;
  return {row[logical_page], row[width + logical_page]};
}

// True when both ids are pages of their half of the pool.
bool Usable(const PagedKvConfig& config, PagePair pages) {
  return pages.k >= 0 && pages.k < config.num_pages &&
         pages.v >= config.num_pages && pages.v < 2 * config.num_pages;
}

// Leading logical pages of `slot` whose K and V ids are usable.
int64_t LivePages(const PagedKvConfig& config, const DeviceTensor& table,
                  int64_t slot) {
  int64_t pages = 0;
  while (pages < config.max_pages_per_seq &&
         Usable(config, TablePages(table, slot, pages))) {
    ++pages;
  }
  return pages;
}

// Each of batch.seq_lens is in [0, limit] and fits the slot's live pages.
absl::Status CheckLengths(const PagedKvConfig& config, const KvBatch& batch,
                          int64_t limit, const char* limit_name) {
  for (int32_t slot = 0; slot < batch.batch; ++slot) {
    const int32_t len = batch.seq_lens[slot];
    if (len < 0 || len > limit) {
      return absl::InvalidArgumentError(
          absl::StrCat("seq_lens[", slot, "] = ", len, " is outside [0, ",
                       limit_name, " = ", limit, "]"));
    }
    const int64_t live = LivePages(config, batch.page_table, slot);
    if (len > live * config.page_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "seq_lens[", slot, "] = ", len, " exceeds the ", live,
          " live pages x page_size ", config.page_size, " of slot ", slot));
    }
  }
  return absl::OkStatus();
}

}  // namespace

float HalfToFloat(uint16_t bits) {
  const uint32_t sign = uint32_t{bits & 0x8000u} << 16;
  const uint32_t exponent = (bits >> 10) & 0x1f;
  const uint32_t mantissa = bits & 0x3ff;
  if (exponent == 0) {  // Zero or subnormal: mantissa * 2^-24, exact.
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign != 0 ? -magnitude : magnitude;
  }
  const uint32_t float_exponent = exponent == 0x1f ? 0xff : exponent + 112;
  return std::bit_cast<float>(sign | (float_exponent << 23) | (mantissa << 13));
}

uint16_t FloatToHalf(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return sign | 0x7e00u;  // NaN.
  // 65520 = halfway between the largest half (65504) and 2^16: rounds to inf.
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;
  if (magnitude < 0x38800000u) {  // Below 2^-14: a subnormal half (or zero).
    const float scaled = std::bit_cast<float>(magnitude) * 16777216.0f;  // 2^24
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  uint32_t half =
      ((((magnitude >> 23) - 112) << 10) | ((magnitude >> 13) & 0x3ff));
  const uint32_t rest = magnitude & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (half & 1) != 0)) ++half;
  return sign | static_cast<uint16_t>(half);
}

float Bf16ToFloat(uint16_t bits) {
  return std::bit_cast<float>(uint32_t{bits} << 16);
}

uint16_t FloatToBf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x40);  // Quiet NaN.
  }
  const uint32_t rounding = 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float LoadElement(const void* data, int64_t index, DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return HalfToFloat(static_cast<const uint16_t*>(data)[index]);
    case DType::kBf16:
      return Bf16ToFloat(static_cast<const uint16_t*>(data)[index]);
    case DType::kF32:
      return static_cast<const float*>(data)[index];
  }
  return 0.f;
}

void StoreElement(void* data, int64_t index, DType dtype, float value) {
  switch (dtype) {
    case DType::kF16:
      static_cast<uint16_t*>(data)[index] = FloatToHalf(value);
      return;
    case DType::kBf16:
      static_cast<uint16_t*>(data)[index] = FloatToBf16(value);
      return;
    case DType::kF32:
      static_cast<float*>(data)[index] = value;
      return;
  }
}

namespace {

// Where token t of sequence b is: `k` and `v` hold its row of every KV head
// ([num_kv_heads, head_dim] elements) from element `first`.
struct TokenRows {
  const void* k;
  const void* v;
  int64_t first;
};

// Decode attention of one query token per sequence over the tokens that
// `rows(b, t)` finds, reading only the window's. Each logit is computed
// twice (for the max, then for its weight) rather than stored: a sequence
// may be longer than any buffer worth holding (pages may repeat in a table).
template <typename Rows>
void DecodeAttentionOver(DType dtype, int64_t batch, const int32_t* seq_lens,
                         int32_t num_kv_heads, int32_t head_dim,
                         const DecodeQuery& query, void* out, Rows rows) {
  const int32_t group = query.num_q_heads / num_kv_heads;
  const int64_t d = head_dim;
  std::vector<float> q(d);
  std::vector<float> acc(d);
  for (int64_t b = 0; b < batch; ++b) {
    const int32_t len = seq_lens[b];
    // The window's first token: tokens before it are never read.
    const int32_t first =
        query.sliding_window > 0 ? std::max(0, len - query.sliding_window) : 0;
    for (int64_t qh = 0; qh < query.num_q_heads; ++qh) {
      const int64_t q_row = (b * query.num_q_heads + qh) * d;
      const int64_t head = (qh / group) * d;
      for (int64_t i = 0; i < d; ++i) {
        q[i] = LoadElement(query.query, q_row + i, dtype);
      }
      const auto logit = [&](const TokenRows& token) {
        float dot = 0.f;
        for (int64_t i = 0; i < d; ++i) {
          dot += q[i] * LoadElement(token.k, token.first + head + i, dtype);
        }
        return dot * query.scale;
      };
      float max_logit = -INFINITY;
      for (int32_t t = first; t < len; ++t) {
        max_logit = std::max(max_logit, logit(rows(b, t)));
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      float sum = 0.f;
      for (int32_t t = first; t < len; ++t) {
        const TokenRows token = rows(b, t);
        const float p = std::exp(logit(token) - max_logit);
        sum += p;
        for (int64_t i = 0; i < d; ++i) {
          acc[i] += p * LoadElement(token.v, token.first + head + i, dtype);
        }
      }
      for (int64_t i = 0; i < d; ++i) {
        StoreElement(out, q_row + i, dtype, len > 0 ? acc[i] / sum : 0.f);
      }
    }
  }
}

}  // namespace

void DenseDecodeAttention(const DenseKv& kv, const DecodeQuery& query,
                          void* out) {
  const int64_t row = int64_t{kv.num_kv_heads} * kv.head_dim;
  DecodeAttentionOver(
      kv.dtype, kv.batch, kv.seq_lens, kv.num_kv_heads, kv.head_dim, query, out,
      [&](int64_t b, int32_t t) {
        return TokenRows{kv.key, kv.value, (b * kv.max_len + t) * row};
      });
}

absl::Status CopyPagesReference(const KvPool& pool, const PageId* copies,
                                int64_t num_copies) {
  const PagedKvConfig& c = pool.config;
  absl::flat_hash_set<PageId> destinations;
  for (int64_t i = 0; i < num_copies; ++i) {
    const PageId source = copies[2 * i];
    const PageId destination = copies[2 * i + 1];
    for (PageId id : {source, destination}) {
      if (id < 0 || id >= c.num_pages) {
        return absl::InvalidArgumentError(absl::StrCat(
            "copies[", i, "] = (", source, ", ", destination, "): page ", id,
            " is outside [0, num_pages = ", c.num_pages, ")"));
      }
    }
    if (!destinations.insert(destination).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("copies[", i, "] = (", source, ", ", destination,
                       "): destination ", destination, " is repeated"));
    }
  }
  for (int64_t i = 0; i < num_copies; ++i) {
    if (destinations.contains(copies[2 * i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "copies[", i, "] = (", copies[2 * i], ", ", copies[2 * i + 1],
          "): source ", copies[2 * i], " is also a destination"));
    }
  }
  const int64_t page_bytes = c.PageBytes();
  for (int64_t i = 0; i < num_copies; ++i) {
    for (int32_t layer = 0; layer < c.num_layers; ++layer) {
      for (PageId half : {0, c.num_pages}) {
        std::memcpy(PoolRow(pool, layer, copies[2 * i + 1] + half, 0),
                    PoolRow(pool, layer, copies[2 * i] + half, 0), page_bytes);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status RunHostCopiesReference(const KvPool& pool, const HostKvPool& host,
                                    const HostCopy* copies,
                                    int64_t num_copies) {
  const PagedKvConfig& c = pool.config;
  // Pages written: host pages by stores, device pages by loads.
  absl::flat_hash_set<int64_t> written;
  for (int64_t i = 0; i < num_copies; ++i) {
    const HostCopy& copy = copies[i];
    const auto bad = [&](auto&&... parts) {
      return absl::InvalidArgumentError(
          absl::StrCat("copies[", i, "] = (device page ", copy.device_page,
                       ", host page ", copy.host_page, ", direction ",
                       static_cast<int>(copy.direction), "): ", parts...));
    };
    if (copy.device_page < 0 || copy.device_page >= c.num_pages) {
      return bad("device page outside [0, num_pages = ", c.num_pages, ")");
    }
    if (copy.host_page < 0 || copy.host_page >= host.num_pages) {
      return bad("host page outside [0, host.num_pages = ", host.num_pages,
                 ")");
    }
    const bool store = copy.direction == HostCopy::Direction::kDeviceToHost;
    if (!store && copy.direction != HostCopy::Direction::kHostToDevice) {
      return bad("unknown direction");
    }
    // Stores write host pages (keys >= 0), loads device pages (< 0).
    const int64_t key = store ? copy.host_page : -1 - int64_t{copy.device_page};
    if (!written.insert(key).second) {
      return bad(store ? "its host page" : "its device page",
                 " is written by an earlier copy of its direction");
    }
  }
  const int64_t page_bytes = c.PageBytes();
  auto* pool_bytes = static_cast<uint8_t*>(pool.data);
  auto* host_bytes = static_cast<uint8_t*>(host.data);
  for (const HostCopy::Direction direction :
       {HostCopy::Direction::kDeviceToHost,
        HostCopy::Direction::kHostToDevice}) {
    for (int64_t i = 0; i < num_copies; ++i) {
      const HostCopy& copy = copies[i];
      if (copy.direction != direction) continue;
      for (int64_t layer = 0; layer < c.num_layers; ++layer) {
        for (int64_t half = 0; half < 2; ++half) {
          uint8_t* device_page =
              pool_bytes + (layer * 2 * c.num_pages + half * c.num_pages +
                            copy.device_page) *
                               page_bytes;
          uint8_t* host_page =
              host_bytes +
              ((int64_t{copy.host_page} * c.num_layers + layer) * 2 + half) *
                  page_bytes;
          if (direction == HostCopy::Direction::kDeviceToHost) {
            std::memcpy(host_page, device_page, page_bytes);
          } else {
            std::memcpy(device_page, host_page, page_bytes);
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status WriteKvReference(const KvPool& pool, int32_t layer,
                              const DeviceTensor& page_table,
                              const KvTokens& tokens) {
  const PagedKvConfig& c = pool.config;
  for (int64_t i = 0; i < tokens.num_tokens; ++i) {
    const SlotId slot = tokens.slots[i];
    const int32_t position = tokens.positions[i];
    if (slot == kNoSlot) continue;
    if (slot < 0 || slot >= c.max_batch) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokens.slots[", i, "] = ", slot,
                       " is outside [0, max_batch = ", c.max_batch, ")"));
    }
    if (position < 0 || position >= c.MaxTokensPerSeq()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokens.positions[", i, "] = ", position, " is outside [0, ",
          c.MaxTokensPerSeq(), ") (max_pages_per_seq x page_size)"));
    }
    const PagePair pages = TablePages(page_table, slot, position / c.page_size);
    if (!Usable(c, pages)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokens.positions[", i, "] = ", position, " of slot ", slot,
          " is on logical page ", position / c.page_size, " whose ids (",
          pages.k, ", ", pages.v, ") are not live pages"));
    }
  }
  const int64_t row_bytes = RowBytes(c);
  for (int64_t i = 0; i < tokens.num_tokens; ++i) {
    const SlotId slot = tokens.slots[i];
    if (slot == kNoSlot) continue;
    const int32_t position = tokens.positions[i];
    const PagePair pages = TablePages(page_table, slot, position / c.page_size);
    const int64_t in_page = position % c.page_size;
    std::memcpy(PoolRow(pool, layer, pages.k, in_page),
                static_cast<const unsigned char*>(tokens.key) + i * row_bytes,
                row_bytes);
    std::memcpy(PoolRow(pool, layer, pages.v, in_page),
                static_cast<const unsigned char*>(tokens.value) + i * row_bytes,
                row_bytes);
  }
  return absl::OkStatus();
}

absl::Status GatherKvReference(const KvPool& pool, int32_t layer,
                               const KvBatch& batch, int32_t max_len,
                               void* key_out, void* value_out) {
  const PagedKvConfig& c = pool.config;
  KVBLOCK_RETURN_IF_ERROR(CheckLengths(c, batch, max_len, "max_len"));
  const int64_t row_bytes = RowBytes(c);
  for (int64_t slot = 0; slot < batch.batch; ++slot) {
    for (int64_t t = 0; t < max_len; ++t) {
      const int64_t offset = (slot * max_len + t) * row_bytes;
      unsigned char* k_out = static_cast<unsigned char*>(key_out) + offset;
      unsigned char* v_out = static_cast<unsigned char*>(value_out) + offset;
      if (t >= batch.seq_lens[slot]) {
        std::memset(k_out, 0, row_bytes);
        std::memset(v_out, 0, row_bytes);
        continue;
      }
      const PagePair pages =
          TablePages(batch.page_table, slot, t / c.page_size);
      std::memcpy(k_out, PoolRow(pool, layer, pages.k, t % c.page_size),
                  row_bytes);
      std::memcpy(v_out, PoolRow(pool, layer, pages.v, t % c.page_size),
                  row_bytes);
    }
  }
  return absl::OkStatus();
}

absl::Status PagedDecodeAttentionReference(const KvPool& pool, int32_t layer,
                                           const KvBatch& batch,
                                           const DecodeQuery& query,
                                           void* out) {
  const PagedKvConfig& c = pool.config;
  KVBLOCK_RETURN_IF_ERROR(CheckLengths(c, batch, c.MaxTokensPerSeq(),
                                       "max_pages_per_seq x page_size"));
  // Read in place: a gathered copy of the rows would be as large as the
  // lengths, which a table repeating pages makes larger than the pool.
  DecodeAttentionOver(
      c.dtype, batch.batch, batch.seq_lens, c.num_kv_heads, c.head_dim, query,
      out, [&](int64_t b, int32_t t) {
        const PagePair pages = TablePages(batch.page_table, b, t / c.page_size);
        return TokenRows{PoolRow(pool, layer, pages.k, t % c.page_size),
                         PoolRow(pool, layer, pages.v, t % c.page_size), 0};
      });
  return absl::OkStatus();
}

absl::Status ToCsrReference(const PagedKvConfig& config, const KvBatch& batch,
                            const CsrPageIndex& csr) {
  KVBLOCK_RETURN_IF_ERROR(CheckLengths(config, batch, config.MaxTokensPerSeq(),
                                       "max_pages_per_seq x page_size"));
  csr.kv_indptr[0] = 0;
  for (int32_t slot = 0; slot < batch.batch; ++slot) {
    const int32_t len = batch.seq_lens[slot];
    const auto pages = static_cast<int32_t>(config.PagesFor(len));
    const int32_t begin = csr.kv_indptr[slot];
    for (int32_t i = 0; i < pages; ++i) {
      csr.kv_indices[begin + i] = TablePages(batch.page_table, slot, i).k;
    }
    csr.kv_indptr[slot + 1] = begin + pages;
    csr.kv_last_page_len[slot] =
        len == 0 ? 0 : len - (pages - 1) * config.page_size;
  }
  return absl::OkStatus();
}

}  // namespace kvblock::internal
