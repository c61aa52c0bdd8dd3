// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "sim/progress.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_format.h"

namespace kvblock::sim {

ProgressLine::ProgressLine(std::ostream& out, bool enabled,
                           std::chrono::steady_clock::duration interval)
    : out_(out), enabled_(enabled), interval_(interval) {}

void ProgressLine::Update(const Progress& progress) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (drawn_width_ > 0 && now < next_draw_) return;
  next_draw_ = now + interval_;
  const int64_t percent =
      progress.total > 0 ? 100 * progress.finished / progress.total : 100;
  const std::string line =
      absl::StrFormat("step %d  running %d  waiting %d  done %d/%d (%d%%)",
                      progress.step, progress.running, progress.waiting,
                      progress.finished, progress.total, percent);
  // Pad over the tail of a longer previous line.
  const size_t width = std::max(line.size(), drawn_width_);
  out_ << '\r' << line << std::string(width - line.size(), ' ') << std::flush;
  drawn_width_ = width;
}

void ProgressLine::Finish() {
  if (drawn_width_ == 0) return;
  out_ << '\r' << std::string(drawn_width_, ' ') << '\r' << std::flush;
  drawn_width_ = 0;
}

}  // namespace kvblock::sim
