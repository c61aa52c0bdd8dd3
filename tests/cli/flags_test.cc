// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "cli/flags.h"

#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "kvblock/version.h"
#include "test_util.h"

ABSL_FLAG(int32_t, cli_test_count, 3, "a count");
ABSL_FLAG(bool, cli_test_verbose, false, "talk more");
ABSL_FLAG(std::string, cli_test_name, "", "a name");

namespace kvblock::cli {
namespace {

struct Parsed {
  std::optional<int> exit_code;
  std::string out;
  std::string err;
};

// ParseFlags of `args` (after the program name), from default flag values.
Parsed Parse(std::vector<std::string> args) {
  absl::SetFlag(&FLAGS_cli_test_count, 3);
  absl::SetFlag(&FLAGS_cli_test_verbose, false);
  absl::SetFlag(&FLAGS_cli_test_name, "");
  args.insert(args.begin(), "tool");
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  std::ostringstream out;
  std::ostringstream err;
  const std::optional<int> exit_code =
      ParseFlags(static_cast<int>(argv.size()), argv.data(), "tool",
                 "does a thing.", "cli/flags_test.cc", out, err);
  return {exit_code, out.str(), err.str()};
}

TEST_CASE("ParseFlags sets flags in every form Abseil takes") {
  REQUIRE(Parse({}).exit_code == std::nullopt);
  REQUIRE(Parse({"--cli_test_count=7"}).exit_code == std::nullopt);
  REQUIRE(absl::GetFlag(FLAGS_cli_test_count) == 7);
  REQUIRE(Parse({"-cli_test_count", "8", "--cli_test_name=a=b"}).exit_code ==
          std::nullopt);
  REQUIRE(absl::GetFlag(FLAGS_cli_test_count) == 8);
  REQUIRE(absl::GetFlag(FLAGS_cli_test_name) == "a=b");
  REQUIRE(Parse({"--cli_test_verbose"}).exit_code == std::nullopt);
  REQUIRE(absl::GetFlag(FLAGS_cli_test_verbose));
  REQUIRE(Parse({"--cli_test_verbose", "--nocli_test_verbose"}).exit_code ==
          std::nullopt);
  REQUIRE_FALSE(absl::GetFlag(FLAGS_cli_test_verbose));
  REQUIRE(Parse({"--cli_test_verbose=true", "--"}).exit_code == std::nullopt);
  REQUIRE(absl::GetFlag(FLAGS_cli_test_verbose));
}

TEST_CASE("--help lists the tool's flags and only them") {
  for (const char* help : {"--help", "-h", "--helpfull", "--helpshort"}) {
    const Parsed parsed = Parse({"--cli_test_count=1", help, "--nope"});
    REQUIRE(parsed.exit_code == 0);
    REQUIRE(parsed.out.rfind("tool: does a thing.\n\nFlags:\n", 0) == 0);
    REQUIRE(
        parsed.out.find("  --cli_test_count (default: 3)\n      a count\n") !=
        std::string::npos);
    REQUIRE(
        parsed.out.find("  --cli_test_name (default: \"\")\n      a name\n") !=
        std::string::npos);
    REQUIRE(parsed.out.find(
                "  --cli_test_verbose (default: false)\n      talk more\n") !=
            std::string::npos);
    REQUIRE(parsed.out.find("  --version\n      print \"tool " KVBLOCK_VERSION
                            "\" and exit\n") != std::string::npos);
    // Abseil's own flags (--flagfile, ...) are not the tool's.
    REQUIRE(parsed.out.find("flagfile") == std::string::npos);
    REQUIRE(parsed.err.empty());
  }
}

TEST_CASE("--version prints the tool and meson.build's version, exit code 0") {
  const Parsed parsed = Parse({"--cli_test_count=5", "--version", "--nope"});
  REQUIRE(parsed.exit_code == 0);
  REQUIRE(parsed.out == "tool " KVBLOCK_VERSION "\n");
  REQUIRE(parsed.err.empty());
  // The version of the build: meson.build's, three numbers.
  REQUIRE(std::string(KVBLOCK_VERSION) ==
          absl::StrFormat("%d.%d.%d", KVBLOCK_VERSION_MAJOR,
                          KVBLOCK_VERSION_MINOR, KVBLOCK_VERSION_PATCH));
}

TEST_CASE("bad arguments are errors that name them, with exit code 2") {
  const struct {
    std::vector<std::string> args;
    const char* message;
  } cases[] = {
      {{"--nope"}, "tool: unknown flag --nope (see --help)\n"},
      {{"--nope=1"}, "tool: unknown flag --nope (see --help)\n"},
      {{"--nocli_test_count"}, "tool: unknown flag --nocli_test_count"},
      {{"--flagfile=x"}, "tool: unknown flag --flagfile"},
      {{"--cli_test_count=abc"},
       "tool: bad value 'abc' for --cli_test_count: "},
      {{"--cli_test_count=99999999999"}, "bad value '99999999999'"},
      {{"--cli_test_verbose=maybe"},
       "bad value 'maybe' for --cli_test_verbose"},
      {{"--cli_test_count"}, "tool: flag --cli_test_count needs a value"},
      {{"file.txt"}, "tool: unexpected argument 'file.txt': flags only"},
      {{"-"}, "tool: unexpected argument '-': flags only"},
      {{"--", "file.txt"}, "tool: unexpected argument 'file.txt': flags only"},
  };
  for (const auto& c : cases) {
    INFO(c.args.front());
    const Parsed parsed = Parse(c.args);
    REQUIRE(parsed.exit_code == 2);
    REQUIRE(parsed.err.find(c.message) != std::string::npos);
    REQUIRE(parsed.out.empty());
  }
}

}  // namespace
}  // namespace kvblock::cli
