// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "kvblock/kv_cache_groups.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace kvblock {
namespace {

absl::Status GroupError(size_t group, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("kv cache group ", group, ": ", what));
}

// The window or chunk of `group`'s kind, and the other's value, checked.
absl::Status ValidateExtent(size_t index, const KvCacheGroupSpec& group) {
  const bool window = group.kind == AttentionKind::kSlidingWindow;
  const bool chunk = group.kind == AttentionKind::kChunkedLocal;
  if (window ? group.sliding_window <= 0 : group.sliding_window != 0) {
    return GroupError(index, absl::StrCat("sliding_window must be ",
                                          window ? "positive" : "0", " for ",
                                          AttentionKindName(group.kind),
                                          ", got ", group.sliding_window));
  }
  if (chunk ? group.attention_chunk_size <= 0
            : group.attention_chunk_size != 0) {
    return GroupError(
        index,
        absl::StrCat("attention_chunk_size must be ", chunk ? "positive" : "0",
                     " for ", AttentionKindName(group.kind), ", got ",
                     group.attention_chunk_size));
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view AttentionKindName(AttentionKind kind) {
  // Indexed by the enumerators' values.
  constexpr absl::string_view kNames[] = {"full_attention", "sliding_window",
                                          "chunked_local_attention"};
  const auto index = static_cast<size_t>(kind);
  return index < std::size(kNames) ? kNames[index] : "unknown";
}

bool SameAttention(const KvCacheGroupSpec& a, const KvCacheGroupSpec& b) {
  return a.kind == b.kind && a.page_size == b.page_size &&
         a.sliding_window == b.sliding_window &&
         a.attention_chunk_size == b.attention_chunk_size;
}

absl::Status ValidateKvCacheGroups(absl::Span<const KvCacheGroupSpec> groups) {
  if (groups.empty() || groups.size() > kMaxKvCacheGroups) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv cache groups: between 1 and ", kMaxKvCacheGroups,
                     " groups, got ", groups.size()));
  }
  int64_t lcm = 1;
  for (size_t i = 0; i < groups.size(); ++i) {
    const KvCacheGroupSpec& group = groups[i];
    if (AttentionKindName(group.kind) == "unknown") {
      return GroupError(i, absl::StrCat("unknown attention kind ",
                                        static_cast<int32_t>(group.kind)));
    }
    if (group.page_size <= 0) {
      return GroupError(
          i, absl::StrCat("page_size must be positive, got ", group.page_size));
    }
    if (absl::Status s = ValidateExtent(i, group); !s.ok()) return s;
    lcm = std::lcm(lcm, int64_t{group.page_size});
    if (lcm > kMaxAlignmentTokens) {
      return GroupError(
          i, absl::StrCat("the page sizes' least common multiple exceeds ",
                          kMaxAlignmentTokens, " tokens"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateGroupCacheHits(absl::Span<const KvCacheGroupSpec> groups) {
  const int64_t lcm = AlignmentTokens(groups);
  for (size_t i = 0; i < groups.size(); ++i) {
    const KvCacheGroupSpec& group = groups[i];
    if (group.kind != AttentionKind::kChunkedLocal) continue;
    if (group.page_size != lcm) {
      return GroupError(
          i,
          absl::StrCat("chunked local attention needs the pages of every "
                       "group to divide its own (page_size ",
                       group.page_size, ", least common multiple ", lcm, ")"));
    }
    if (group.eagle) {
      return GroupError(i,
                        "EAGLE drafting is not supported with chunked "
                        "local attention");
    }
  }
  return absl::OkStatus();
}

int32_t HashPageSize(absl::Span<const KvCacheGroupSpec> groups) {
  int32_t gcd = 0;
  for (const KvCacheGroupSpec& group : groups) {
    gcd = std::gcd(gcd, group.page_size);
  }
  return gcd;
}

int64_t AlignmentTokens(absl::Span<const KvCacheGroupSpec> groups) {
  int64_t lcm = 1;
  for (const KvCacheGroupSpec& group : groups) {
    lcm = std::lcm(lcm, int64_t{group.page_size});
  }
  return lcm;
}

int64_t NextSkipTokens(const KvCacheGroupSpec& group, int64_t pages) {
  const int64_t tokens = (pages + 1) * group.page_size;
  switch (group.kind) {
    case AttentionKind::kFull:
      break;
    case AttentionKind::kSlidingWindow:
      // tokens - W + 1 skipped tokens fill pages + 1 pages.
      return tokens + group.sliding_window - 1;
    case AttentionKind::kChunkedLocal: {
      // The first chunk boundary at or past `tokens`.
      const int64_t chunk = group.attention_chunk_size;
      return (tokens + chunk - 1) / chunk * chunk;
    }
  }
  return std::numeric_limits<int64_t>::max();
}

bool CachesFullPage(const KvCacheGroupSpec& group, int64_t page,
                    int64_t alignment_tokens) {
  if (group.kind != AttentionKind::kSlidingWindow ||
      alignment_tokens <= group.page_size) {
    return true;
  }
  const int64_t per_unit = alignment_tokens / group.page_size;
  // The pages before a hit's end that its window reads. An EAGLE group's
  // hit ends a page later and drops that page (FindSlidingWindow): one page
  // more, the first of the next unit. (vLLM 28be48fa's mask leaves that
  // page out, so such a group never hits; later vLLM shifts it as here.)
  const int64_t shift = group.eagle ? 1 : 0;
  const int64_t tail =
      (int64_t{group.sliding_window} - 1 + group.page_size - 1) /
          group.page_size +
      shift;
  if (tail >= per_unit) return true;
  return page >= shift && (page - shift) % per_unit >= per_unit - tail;
}

}  // namespace kvblock
