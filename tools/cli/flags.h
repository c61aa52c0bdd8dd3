// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// ParseFlags: the command line of kvblock's tools, with their exit codes.
// Abseil's ParseCommandLine exits 1 for an unknown flag, a value that does
// not parse and --help alike; a kvblock tool exits 2 for bad input and 0
// for --help. So the tools parse with this instead: each argument sets the
// flag of that name through Abseil's public reflection API
// (FindCommandLineFlag, CommandLineFlag::ParseFrom), in the forms Abseil
// takes (--name=value, --name value, --bool, --nobool; one or two dashes).
//
// Thread safety: call once, from main, before any other thread starts.
#ifndef KVBLOCK_TOOLS_CLI_FLAGS_H_
#define KVBLOCK_TOOLS_CLI_FLAGS_H_

#include <optional>
#include <ostream>

#include "absl/strings/string_view.h"

namespace kvblock::cli {

// Sets the flags that `argv` names, and returns nothing when the tool should
// run, or the exit code it should return at once: 0 after --help (or -h,
// --helpfull, --helpshort), which prints `usage` and then every flag defined
// in a file whose path ends with `flags_file` (the tool's main file) with its
// default and help to `out`; 0 after --version, which prints "TOOL VERSION"
// (meson.build's project version) to `out`; 2 after a bad argument (an unknown
// flag, a missing or unparsable value, a positional argument: the tools take
// flags only), printed to `err` as "TOOL: message (see --help)".
std::optional<int> ParseFlags(int argc, char** argv, absl::string_view tool,
                              absl::string_view usage,
                              absl::string_view flags_file, std::ostream& out,
                              std::ostream& err);

}  // namespace kvblock::cli

#endif  // KVBLOCK_TOOLS_CLI_FLAGS_H_
