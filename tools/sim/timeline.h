// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// The per-step views of a kvblock-sim run: the --timeline CSV (one row per
// committed step, for tools/plot and spreadsheets) and the --plot SVG, a small
// self-contained line chart under a title line (the run's description) with
// four panels over the steps: pages in use, the cumulative prefix hit rate,
// the batch size and the cumulative preemptions.
//
// CSV columns (header row first): step, batch, pages_used, hit_tokens,
// prompt_tokens, preemptions, cow_copies, evictions, waiting, limit (none,
// pages, max_batch or token_budget), host_hit_tokens, host_stores,
// host_loads and host_copy_us (host_copy_ns in microseconds), as StepRecord
// defines them.
//
// The chart keeps at most kChartPoints points per line: longer runs are
// bucketed (pages and batch show each bucket's maximum, the hit rate its
// value at the bucket's end).
//
// Complexity: linear in the steps.
// Thread safety: plain functions over values.
#ifndef KVBLOCK_TOOLS_SIM_TIMELINE_H_
#define KVBLOCK_TOOLS_SIM_TIMELINE_H_

#include <cstdint>
#include <ostream>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "sim/scheduler.h"

namespace kvblock::sim {

inline constexpr int kChartPoints = 720;

// The CSV timeline of `steps`.
void WriteTimelineCsv(absl::Span<const StepRecord> steps, std::ostream& out);

// The SVG chart of `steps` over a pool of `num_pages` pages (the scale of the
// pages panel), titled `title`. With no steps it says so instead of drawing
// lines.
void WriteSvgChart(absl::Span<const StepRecord> steps, int32_t num_pages,
                   absl::string_view title, std::ostream& out);

}  // namespace kvblock::sim

#endif  // KVBLOCK_TOOLS_SIM_TIMELINE_H_
