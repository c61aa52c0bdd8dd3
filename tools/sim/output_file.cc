// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "sim/output_file.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"

namespace kvblock::sim {
namespace {

// The system's reason for the last failed call, or a fallback.
std::string Reason() {
  return errno != 0 ? std::strerror(errno) : "unknown error";
}

}  // namespace

absl::Status CheckWritable(absl::string_view path) {
  errno = 0;
  std::ofstream out{std::string(path), std::ios::out | std::ios::trunc};
  if (!out) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot create '", path, "': ", Reason()));
  }
  return absl::OkStatus();
}

absl::Status WriteToFile(absl::string_view path,
                         const std::function<void(std::ostream&)>& write) {
  errno = 0;
  std::ofstream out{std::string(path), std::ios::out | std::ios::trunc};
  if (!out) {
    return absl::InternalError(
        absl::StrCat("cannot create '", path, "': ", Reason()));
  }
  write(out);
  out.close();
  if (!out) {
    return absl::InternalError(
        absl::StrCat("write failed: '", path, "': ", Reason()));
  }
  return absl::OkStatus();
}

}  // namespace kvblock::sim
