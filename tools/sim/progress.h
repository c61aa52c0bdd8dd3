// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// ProgressLine: the one-line progress display kvblock-sim keeps on stderr
// while it runs ("step 1200  running 30  waiting 4  done 120/300 (40%)"),
// redrawn in place with a carriage return at most once per interval, and
// erased by Finish() so the report starts on a clean line. Disabled (it
// writes nothing) when the output is not a terminal; the caller decides.
//
// Complexity: O(1) per Update (a clock read; a short write once per interval).
// Thread safety: thread-compatible; one thread updates a line.
#ifndef KVBLOCK_TOOLS_SIM_PROGRESS_H_
#define KVBLOCK_TOOLS_SIM_PROGRESS_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <ostream>

#include "sim/scheduler.h"

namespace kvblock::sim {

class ProgressLine {
 public:
  // Draws on `out` (which must outlive the line) when `enabled`, at most
  // once per `interval` (the first Update always draws).
  ProgressLine(std::ostream& out, bool enabled,
               std::chrono::steady_clock::duration interval);

  // Redraws the line with `progress` if the interval has passed.
  void Update(const Progress& progress);

  // Erases the line if one was drawn.
  void Finish();

 private:
  std::ostream& out_;
  const bool enabled_;
  const std::chrono::steady_clock::duration interval_;
  std::chrono::steady_clock::time_point next_draw_;
  size_t drawn_width_ = 0;  // characters of the line on screen.
};

}  // namespace kvblock::sim

#endif  // KVBLOCK_TOOLS_SIM_PROGRESS_H_
