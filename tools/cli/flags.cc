// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "cli/flags.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "kvblock/version.h"

namespace kvblock::cli {
namespace {

void PrintHelp(absl::string_view tool, absl::string_view usage,
               absl::string_view flags_file, std::ostream& out) {
  out << tool << ": " << usage << "\n\nFlags:\n"
      << "  --help\n      print this and exit\n"
      << "  --version\n      print \"" << tool << " " << KVBLOCK_VERSION
      << "\" and exit\n";
  std::vector<std::pair<std::string, absl::CommandLineFlag*>> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (absl::EndsWith(flag->Filename(), flags_file)) {
      flags.emplace_back(std::string(name), flag);
    }
  }
  std::sort(flags.begin(), flags.end());
  for (const auto& [name, flag] : flags) {
    const std::string value = flag->DefaultValue();
    out << "  --" << name << " (default: " << (value.empty() ? "\"\"" : value)
        << ")\n      " << flag->Help() << "\n";
  }
}

}  // namespace

std::optional<int> ParseFlags(int argc, char** argv, absl::string_view tool,
                              absl::string_view usage,
                              absl::string_view flags_file, std::ostream& out,
                              std::ostream& err) {
  constexpr int kHelpExit = 0;
  constexpr int kBadInputExit = 2;
  const auto fail = [&](absl::string_view message) {
    err << tool << ": " << message << " (see --help)\n";
    return kBadInputExit;
  };
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") {
      if (i + 1 < argc) {
        return fail(absl::StrCat("unexpected argument '", argv[i + 1],
                                 "': flags only"));
      }
      break;
    }
    if (!absl::ConsumePrefix(&arg, "-") || arg.empty()) {
      return fail(
          absl::StrCat("unexpected argument '", argv[i], "': flags only"));
    }
    absl::ConsumePrefix(&arg, "-");
    const size_t equals = arg.find('=');
    absl::string_view name = arg.substr(0, equals);
    if (name == "help" || name == "h" || name == "helpfull" ||
        name == "helpshort") {
      PrintHelp(tool, usage, flags_file, out);
      return kHelpExit;
    }
    if (name == "version") {
      out << tool << " " << KVBLOCK_VERSION << "\n";
      return kHelpExit;
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    std::string value;
    if (equals != absl::string_view::npos) {
      value = std::string(arg.substr(equals + 1));
    } else if (flag != nullptr && flag->IsOfType<bool>()) {
      value = "true";
    } else if (flag == nullptr && absl::StartsWith(name, "no")) {
      absl::CommandLineFlag* negated =
          absl::FindCommandLineFlag(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>()) {
        flag = negated;
        name.remove_prefix(2);
        value = "false";
      }
    } else if (flag != nullptr) {
      if (i + 1 == argc) {
        return fail(absl::StrCat("flag --", name, " needs a value"));
      }
      value = argv[++i];
    }
    if (flag == nullptr || flag->IsRetired() ||
        !absl::EndsWith(flag->Filename(), flags_file)) {
      return fail(absl::StrCat("unknown flag --", arg.substr(0, equals)));
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return fail(
          absl::StrCat("bad value '", value, "' for --", name, ": ", error));
    }
  }
  return std::nullopt;
}

}  // namespace kvblock::cli
