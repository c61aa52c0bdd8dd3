// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "sim/output_file.h"

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "test_util.h"

namespace kvblock::sim {
namespace {

TEST_CASE("WriteToFile creates or truncates the file") {
  const std::string path = "sim_output_file_test.txt";
  REQUIRE_OK(WriteToFile(path, [](std::ostream& out) { out << "first\n"; }));
  REQUIRE_OK(WriteToFile(path, [](std::ostream& out) { out << "second\n"; }));
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  REQUIRE(text.str() == "second\n");
  std::remove(path.c_str());
}

TEST_CASE("WriteToFile names a path it cannot create") {
  const absl::Status status =
      WriteToFile("/nonexistent/kvblock/out.json", [](std::ostream&) {});
  REQUIRE_STATUS_IS(status, kInternal);
  REQUIRE(status.message() ==
          "cannot create '/nonexistent/kvblock/out.json': No such file or "
          "directory");
}

TEST_CASE("CheckWritable creates an empty file or names the reason") {
  const std::string path = "sim_output_file_check.txt";
  REQUIRE_OK(WriteToFile(path, [](std::ostream& out) { out << "old\n"; }));
  REQUIRE_OK(CheckWritable(path));
  std::ifstream in(path);
  REQUIRE(in.peek() == std::ifstream::traits_type::eof());
  std::remove(path.c_str());
  const absl::Status missing = CheckWritable("/nonexistent/kvblock/out.json");
  REQUIRE_STATUS_IS(missing, kInvalidArgument);
  REQUIRE(missing.message() ==
          "cannot create '/nonexistent/kvblock/out.json': No such file or "
          "directory");
}

}  // namespace
}  // namespace kvblock::sim
