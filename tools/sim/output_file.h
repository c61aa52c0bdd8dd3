// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// How kvblock-sim writes its output files (--json, --timeline, --plot,
// --write_trace): CheckWritable before the run, so that a path that cannot be
// written fails at once instead of after the whole simulation, then
// WriteToFile once the output exists. Both name the path and the system's
// reason.
//
// Thread safety: plain functions; concurrent calls must name different files.
#ifndef KVBLOCK_TOOLS_SIM_OUTPUT_FILE_H_
#define KVBLOCK_TOOLS_SIM_OUTPUT_FILE_H_

#include <functional>
#include <ostream>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace kvblock::sim {

// Creates (or truncates) the file at `path`, leaving it empty.
// InvalidArgument "cannot create 'PATH': REASON" when it cannot be opened for
// writing (a missing folder, no permission, ...).
absl::Status CheckWritable(absl::string_view path);

// Writes the file at `path` with `write`. Internal "cannot create 'PATH':
// REASON" / "write failed: 'PATH': REASON" when the file cannot be opened or
// the stream fails (disk full, ...).
absl::Status WriteToFile(absl::string_view path,
                         const std::function<void(std::ostream&)>& write);

}  // namespace kvblock::sim

#endif  // KVBLOCK_TOOLS_SIM_OUTPUT_FILE_H_
