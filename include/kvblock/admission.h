// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// What admitting a prompt asks (AdmitOptions) and takes (AdmissionPlan):
// the vocabulary BlockManager's PlanAdmission, CanAdmit and Admit share with
// the planner behind them.
#ifndef KVBLOCK_ADMISSION_H_
#define KVBLOCK_ADMISSION_H_

#include <cstdint>
#include <limits>

namespace kvblock {

// How a prompt is admitted (PlanAdmission, CanAdmit, Admit).
struct AdmitOptions {
  // Chunked prefill: the prompt tokens after the prefix hits that the
  // admitting step computes, at most (positive; the default: all of them).
  // The rest come later through AppendPrompt.
  int64_t prefill_tokens = std::numeric_limits<int64_t>::max();
  // False: take no prefix hits, compute the whole prompt (as vLLM does for a
  // request that wants prompt log-probabilities); its full pages are still
  // registered for others.
  bool read_prefix_cache = true;
};

// What admitting a prompt takes, computed without changing anything.
struct AdmissionPlan {
  int32_t hit_pages = 0;      // whole pages served from the prefix cache.
  int64_t hit_tokens = 0;     // hit_pages * page_size.
  int32_t revived_pages = 0;  // of the hits, pages now evictable.
  // Of the hits, pages the host tier holds (BlockManagerOptions::
  // host_pages): each is loaded into a new page.
  int32_t host_hit_pages = 0;
  int32_t new_pages = 0;  // fresh pages to allocate.
  // Prompt tokens the admitting step computes: after the hits, at most
  // AdmitOptions::prefill_tokens.
  int64_t computed_tokens = 0;
  // Pages reserved for the rest of the prompt (reserve_prompt_pages).
  int32_t reserved_pages = 0;
  // Allocatable pages the admission consumes: revived + loaded + new.
  int32_t pages_consumed() const {
    return revived_pages + host_hit_pages + new_pages;
  }
};

}  // namespace kvblock

#endif  // KVBLOCK_ADMISSION_H_
