// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// The built-in workloads of kvblock-sim: request streams that exercise each
// behaviour of the block manager, generated from a seed.
//
//   sysprompt  many requests behind a few long system prompts, two tenants
//              (cache salts): prefix hits, isolation between tenants.
//   multiturn  conversations whose next turn repeats the previous prompt and
//              answer: hits on generated pages.
//   parallel   n = 4 samples per prompt: forks and copy-on-write.
//   beam       beam search of width 4: forks and frees every step.
//   unique     no sharing at all: evictions and preemptions under load.
//   mixed      all of the above at once (the default).
//   serving    2000 unrelated long prompts, about 100 running at once: the
//              scale of one serving replica, for measuring the library's
//              cost per step (needs a wider table and a bigger pool).
//
// Every workload but `serving` fits a sequence of 1024 tokens (64 pages of
// 16) and a batch of 4, and arrives over a few hundred steps, so a default run
// takes well under a second yet keeps the pool under pressure.
//
// Contract: MakeWorkload is a pure function of (name, seed): the same
// requests, in the same order (by arrival, ties in generation order), on every
// machine.
//
// Complexity: linear in the tokens generated.
// Thread safety: plain functions; no shared state.
#ifndef KVBLOCK_TOOLS_SIM_WORKLOADS_H_
#define KVBLOCK_TOOLS_SIM_WORKLOADS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "sim/trace.h"

namespace kvblock::sim {

struct WorkloadInfo {
  absl::string_view name;
  absl::string_view description;   // one line.
  int64_t max_tokens_per_seq = 0;  // of its longest sequence, at most.
};

inline constexpr absl::string_view kDefaultWorkload = "mixed";

// Every built-in workload, in the order of the header comment.
absl::Span<const WorkloadInfo> Workloads();

// The requests of workload `name` for `seed`, sorted by arrival.
// InvalidArgument for an unknown name (the message lists the known ones).
absl::StatusOr<std::vector<Request>> MakeWorkload(absl::string_view name,
                                                  uint64_t seed);

}  // namespace kvblock::sim

#endif  // KVBLOCK_TOOLS_SIM_WORKLOADS_H_
