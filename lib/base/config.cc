// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "kvblock/config.h"

#include <cstdint>
#include <iterator>
#include <limits>

#include "absl/strings/str_cat.h"

namespace kvblock {
namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

absl::Status RequirePositive(absl::string_view field, int64_t value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("config: ", field, " must be positive, got ", value));
}

// True when `a * b` (both positive) fits int64.
bool ProductFits(int64_t a, int64_t b) { return a <= kInt64Max / b; }

}  // namespace

int64_t DTypeSize(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

absl::string_view DTypeName(DType dtype) {
  // Indexed by the enumerators' values.
  constexpr absl::string_view kNames[] = {"f16", "bf16", "f32"};
  const auto index = static_cast<size_t>(dtype);
  return index < std::size(kNames) ? kNames[index] : "unknown";
}

absl::Status PagedKvConfig::Validate() const {
  const struct {
    absl::string_view name;
    int32_t value;
  } counts[] = {
      {"num_pages", num_pages},
      {"max_batch", max_batch},
      {"max_pages_per_seq", max_pages_per_seq},
      {"page_size", page_size},
      {"num_layers", num_layers},
      {"num_kv_heads", num_kv_heads},
      {"head_dim", head_dim},
  };
  for (const auto& count : counts) {
    if (absl::Status s = RequirePositive(count.name, count.value); !s.ok()) {
      return s;
    }
  }
  if (dtype != DType::kF16 && dtype != DType::kBf16 && dtype != DType::kF32) {
    return absl::InvalidArgumentError(
        absl::StrCat("config: dtype must be f16, bf16 or f32, got ",
                     static_cast<int>(dtype)));
  }
  if (num_pages > kMaxNumPages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config: num_pages ", num_pages,
        " is too large: V page ids (num_pages + id) would overflow int32"));
  }
  // Derived products, each checked before it is formed.
  const int64_t per_token = int64_t{num_kv_heads} * head_dim;  // fits: int32^2
  if (!ProductFits(per_token, page_size) ||
      !ProductFits(per_token * page_size, DTypeSize(dtype)) ||
      !ProductFits(PageBytes(), 2 * int64_t{num_pages})) {
    return absl::InvalidArgumentError(
        absl::StrCat("config: pool of num_pages ", num_pages, " x page_size ",
                     page_size, " x num_kv_heads ", num_kv_heads,
                     " x head_dim ", head_dim, " overflows int64 bytes"));
  }
  if (!ProductFits(LayerPoolBytes(), num_layers)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config: num_layers ", num_layers, " x layer pool bytes ",
                     LayerPoolBytes(), " overflows int64"));
  }
  return absl::OkStatus();
}

int64_t PagedKvConfig::RequiredSingleSequencePages() const {
  return int64_t{num_layers} * max_pages_per_seq;
}

int64_t PagedKvConfig::MaxTokensPerSeq() const {
  return int64_t{max_pages_per_seq} * page_size;
}

int64_t PagedKvConfig::PageElements() const {
  return int64_t{page_size} * num_kv_heads * head_dim;
}

int64_t PagedKvConfig::PageBytes() const {
  return PageElements() * DTypeSize(dtype);
}

int64_t PagedKvConfig::LayerPoolBytes() const {
  return 2 * int64_t{num_pages} * PageBytes();
}

int64_t PagedKvConfig::PageTableEntries() const {
  return int64_t{max_batch} * 2 * max_pages_per_seq;
}

}  // namespace kvblock
