// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "sim/models.h"

#include <algorithm>
#include <cstdint>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kvblock/status_macros.h"

namespace kvblock::sim {
namespace {

constexpr ModelPreset kPresets[] = {
    {"llama", "full", "one full-attention group (Llama 3)"},
    {"gpt-oss", "full,sliding:128",
     "full attention and a 128-token sliding window, alternating layers"},
    {"gemma3", "sliding:1024x5,full",
     "five 1,024-token sliding-window layers per global one (Gemma 3)"},
    {"llama4", "chunked:8192x3,full",
     "three 8,192-token chunked-local layers per global one (Llama 4)"},
};

// Digits alone: SimpleAtoi also takes spaces and a sign.
bool IsDecimal(absl::string_view text) {
  return !text.empty() && absl::c_all_of(text, absl::ascii_isdigit);
}

// Groups beyond which the flag form stops: ValidateKvCacheGroups's limit.
absl::StatusOr<std::vector<KvCacheGroupSpec>> ParseGroups(
    absl::string_view groups, int32_t page_size) {
  std::vector<KvCacheGroupSpec> specs;
  for (const absl::string_view written : absl::StrSplit(groups, ',')) {
    const auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat("--kv_cache_groups: '", written, "' ", why,
                       " (entries: full, sliding:W, chunked:C, each "
                       "optionally xN)"));
    };
    absl::string_view entry = written;
    int64_t repeat = 1;
    if (const size_t x = entry.rfind('x'); x != absl::string_view::npos) {
      if (!IsDecimal(entry.substr(x + 1)) ||
          !absl::SimpleAtoi(entry.substr(x + 1), &repeat) || repeat < 1 ||
          repeat > kMaxKvCacheGroups) {
        return bad(absl::StrCat("repeats a group other than 1 to ",
                                kMaxKvCacheGroups, " times"));
      }
      entry = entry.substr(0, x);
    }
    KvCacheGroupSpec spec{.kind = AttentionKind::kFull,
                          .page_size = page_size,
                          .sliding_window = 0,
                          .attention_chunk_size = 0,
                          .eagle = false};
    const std::vector<absl::string_view> parts = absl::StrSplit(entry, ':');
    int32_t span = 0;
    if (parts.size() > 2) return bad("has more than one ':'");
    if (parts.size() == 2 && (!IsDecimal(parts[1]) ||
                              !absl::SimpleAtoi(parts[1], &span) || span < 1)) {
      return bad("has no positive window or chunk");
    }
    if (parts[0] == "full" && parts.size() == 1) {
    } else if (parts[0] == "sliding" && parts.size() == 2) {
      spec.kind = AttentionKind::kSlidingWindow;
      spec.sliding_window = span;
    } else if (parts[0] == "chunked" && parts.size() == 2) {
      spec.kind = AttentionKind::kChunkedLocal;
      spec.attention_chunk_size = span;
    } else {
      return bad("is not a group");
    }
    if (specs.size() + static_cast<size_t>(repeat) > kMaxKvCacheGroups) {
      return bad(
          absl::StrCat("makes more than ", kMaxKvCacheGroups, " groups"));
    }
    specs.insert(specs.end(), static_cast<size_t>(repeat), spec);
  }
  if (absl::Status status = ValidateKvCacheGroups(specs); !status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv_cache_groups=", groups, ": ", status.message()));
  }
  return specs;
}

}  // namespace

absl::Span<const ModelPreset> ModelPresets() { return kPresets; }

absl::StatusOr<std::vector<KvCacheGroupSpec>> ModelGroups(
    absl::string_view model, absl::string_view groups, int32_t page_size) {
  if (!model.empty() && !groups.empty()) {
    return absl::InvalidArgumentError(
        "--model and --kv_cache_groups exclude each other");
  }
  if (!model.empty()) {
    const ModelPreset* preset =
        std::find_if(std::begin(kPresets), std::end(kPresets),
                     [&](const ModelPreset& p) { return p.name == model; });
    if (preset == std::end(kPresets)) {
      std::vector<absl::string_view> names;
      for (const ModelPreset& p : kPresets) names.push_back(p.name);
      return absl::InvalidArgumentError(absl::StrCat("--model must be one of ",
                                                     absl::StrJoin(names, ", "),
                                                     ", got '", model, "'"));
    }
    groups = preset->groups;
  }
  if (groups.empty()) return std::vector<KvCacheGroupSpec>();
  KVBLOCK_ASSIGN_OR_RETURN(std::vector<KvCacheGroupSpec> specs,
                           ParseGroups(groups, page_size));
  // One full-attention group, however it is spelled, is the default model.
  if (specs.size() == 1 && specs[0].kind == AttentionKind::kFull) specs.clear();
  return specs;
}

std::string GroupName(const KvCacheGroupSpec& group) {
  switch (group.kind) {
    case AttentionKind::kSlidingWindow:
      return absl::StrCat("sliding:", group.sliding_window);
    case AttentionKind::kChunkedLocal:
      return absl::StrCat("chunked:", group.attention_chunk_size);
    case AttentionKind::kFull:
      break;
  }
  return "full";
}

std::string DescribeGroups(absl::Span<const KvCacheGroupSpec> groups) {
  if (groups.empty()) return "full";
  std::vector<std::string> names;
  for (const KvCacheGroupSpec& group : groups)
    names.push_back(GroupName(group));
  return absl::StrJoin(names, ",");
}

bool HasWindowGroup(absl::Span<const KvCacheGroupSpec> groups) {
  return std::any_of(groups.begin(), groups.end(), [](const auto& group) {
    return group.kind != AttentionKind::kFull;
  });
}

std::vector<KvCacheGroupSpec> AllFullAttention(
    absl::Span<const KvCacheGroupSpec> groups) {
  std::vector<KvCacheGroupSpec> full(groups.begin(), groups.end());
  for (KvCacheGroupSpec& group : full) {
    group.kind = AttentionKind::kFull;
    group.sliding_window = 0;
    group.attention_chunk_size = 0;
  }
  return full;
}

}  // namespace kvblock::sim
