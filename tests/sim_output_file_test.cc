// Copyright 2026 The kvblock Authors.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "sim/output_file.h"
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
  REQUIRE(status.message().find("/nonexistent/kvblock/out.json") !=
          absl::string_view::npos);
}

}  // namespace
}  // namespace kvblock::sim
