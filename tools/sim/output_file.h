// Copyright 2026 The kvblock Authors.
//
// WriteToFile: how kvblock-sim writes its output files (--json, --timeline,
// --plot, --write_trace): create or truncate the file, let a writer fill the
// stream, and report any failure as a status naming the path.
//
// Thread safety: a plain function; concurrent calls must name different files.
#ifndef KVBLOCK_TOOLS_SIM_OUTPUT_FILE_H_
#define KVBLOCK_TOOLS_SIM_OUTPUT_FILE_H_

#include <functional>
#include <ostream>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace kvblock::sim {

// Writes the file at `path` with `write`. Internal "cannot create" /
// "write failed", naming `path`, when the file cannot be opened or the stream
// fails (disk full, ...).
absl::Status WriteToFile(absl::string_view path,
                         const std::function<void(std::ostream&)>& write);

}  // namespace kvblock::sim

#endif  // KVBLOCK_TOOLS_SIM_OUTPUT_FILE_H_
