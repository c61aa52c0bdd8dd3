// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// The KV cache groups of the simulated model: a preset by name (--model) or
// any mix in the flag form (--kv_cache_groups), each group with the run's
// page size. A group holds an equal share of the model's layers, as vLLM
// groups them (gpt-oss: 18 full and 18 sliding-window layers, two groups;
// Gemma 3: five local layers per global one, six groups).
#ifndef KVBLOCK_TOOLS_SIM_MODELS_H_
#define KVBLOCK_TOOLS_SIM_MODELS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kvblock/kv_cache_groups.h"

namespace kvblock::sim {

struct ModelPreset {
  absl::string_view name;
  absl::string_view groups;  // in the --kv_cache_groups form.
  absl::string_view description;
};

// llama (one full group), gpt-oss, gemma3, llama4.
absl::Span<const ModelPreset> ModelPresets();

// The groups of preset `model` or of `groups` (the flag form: a comma list
// of `full`, `sliding:W` and `chunked:C`, each optionally `xN` for N such
// groups), at `page_size` tokens a page; empty (one default full group) when
// both are empty or name one full-attention group. InvalidArgument naming the
// flag and the bad value: an unknown preset, both flags given, a bad entry, or
// groups that ValidateKvCacheGroups refuses.
absl::StatusOr<std::vector<KvCacheGroupSpec>> ModelGroups(
    absl::string_view model, absl::string_view groups, int32_t page_size);

// The groups in the flag form (`full`, `sliding:W`, `chunked:C`), one
// entry a group; "full" for none.
std::string GroupName(const KvCacheGroupSpec& group);
std::string DescribeGroups(absl::Span<const KvCacheGroupSpec> groups);

// Whether a group skips pages (sliding window, chunked local).
bool HasWindowGroup(absl::Span<const KvCacheGroupSpec> groups);

// The same groups, every one full attention.
std::vector<KvCacheGroupSpec> AllFullAttention(
    absl::Span<const KvCacheGroupSpec> groups);

}  // namespace kvblock::sim

#endif  // KVBLOCK_TOOLS_SIM_MODELS_H_
