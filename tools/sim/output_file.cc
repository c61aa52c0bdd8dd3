// Copyright 2026 The kvblock Authors.
#include "sim/output_file.h"

#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"

namespace kvblock::sim {

absl::Status WriteToFile(absl::string_view path,
                         const std::function<void(std::ostream&)>& write) {
  std::ofstream out{std::string(path), std::ios::out | std::ios::trunc};
  if (!out) {
    return absl::InternalError(absl::StrCat("cannot create '", path, "'"));
  }
  write(out);
  out.close();
  if (!out) {
    return absl::InternalError(absl::StrCat("write failed: '", path, "'"));
  }
  return absl::OkStatus();
}

}  // namespace kvblock::sim
