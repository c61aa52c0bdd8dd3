// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// RequestState: where one request of a kvblock-sim run stands between steps:
// its running sequences (samples or beams), the tokens each has generated,
// how much of its prompt is done (chunked prefill), the draft slots each
// holds (speculative decoding), and the steps that first admitted it and
// first completed its prompt. What a step is to do with it lives in the
// step's plan (step_planner.h), never here: the planner only reads it. It
// changes on arrival (its prompt's hashes), when a committed step is applied
// (RequestQueue::ApplyStep) and when the request gives way (StepExecutor).
//
// Thread safety: plain data.
#ifndef KVBLOCK_TOOLS_SIM_REQUEST_STATE_H_
#define KVBLOCK_TOOLS_SIM_REQUEST_STATE_H_

#include <cstdint>
#include <vector>

#include "kvblock/block_hash.h"
#include "kvblock/config.h"
#include "kvblock/types.h"
#include "sim/trace.h"

namespace kvblock::sim {

// One running sample or beam of a request.
struct Sequence {
  SequenceId id = 0;
  int32_t sample = 0;  // its GeneratedToken stream.
};

struct RequestState {
  const Request* request = nullptr;
  // The feed's copy of `request` (Serve), released once the request is done;
  // null for a trace's request, which the caller owns.
  Request* owned = nullptr;
  // Completed or rejected: nothing refers to it any more (ReleaseDone).
  bool done = false;
  uint64_t id_hash = 0;
  std::vector<Sequence> sequences = {};  // running, in creation order.
  int64_t generated = 0;                 // tokens appended to each sequence.
  int32_t next_sample = 0;
  // Chunked prefill, this admission: prompt tokens in the first sequence
  // (hits and computed), the steps that computed some, and whether the
  // other samples still wait to fork (until the prompt is done).
  int64_t prompt_done = 0;
  int32_t prompt_steps = 0;
  bool forks_pending = false;
  int32_t drafts = 0;           // draft slots each sequence holds.
  int64_t first_admitted = -1;  // the step that first admitted it.
  int64_t first_token = -1;     // the step that first completed its prompt.
  // The prompt's page hashes, computed once on arrival (empty without
  // prefix caching): planning every step and admitting reuse them.
  std::vector<BlockHash> prompt_hashes = {};

  int64_t PromptLeft() const {
    return static_cast<int64_t>(request->prompt.size()) - prompt_done;
  }

  // The pages its sequences hold for nothing but draft slots.
  int64_t DraftOnlyPages(int32_t page_size) const {
    if (drafts == 0) return 0;
    const int64_t tokens =
        static_cast<int64_t>(request->prompt.size()) + generated;
    return static_cast<int64_t>(sequences.size()) *
           (PagesForTokens(tokens + drafts, page_size) -
            PagesForTokens(tokens, page_size));
  }

  // Recompute after a preemption: the request restarts from its prompt.
  void Restart() {
    generated = 0;
    next_sample = 0;
    prompt_done = 0;
    prompt_steps = 0;
    forks_pending = false;
    drafts = 0;
  }
};

}  // namespace kvblock::sim

#endif  // KVBLOCK_TOOLS_SIM_REQUEST_STATE_H_
