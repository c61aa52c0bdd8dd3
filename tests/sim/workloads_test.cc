// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "sim/workloads.h"

#include <algorithm>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace kvblock::sim {
namespace {

// The default geometry of kvblock-sim: 64 pages of 16 tokens, a batch of 32.
constexpr TraceLimits kDefaultLimits{.max_tokens_per_seq = 1024,
                                     .max_samples = 32};

std::vector<Request> Make(absl::string_view name, uint64_t seed) {
  auto requests = MakeWorkload(name, seed);
  REQUIRE_OK(requests);
  return *std::move(requests);
}

TEST_CASE("every workload is deterministic for a seed and valid") {
  REQUIRE(Workloads().size() == 9);
  for (const WorkloadInfo& workload : Workloads()) {
    INFO(workload.name);
    const std::vector<Request> a = Make(workload.name, 42);
    REQUIRE(!a.empty());
    REQUIRE(a == Make(workload.name, 42));
    REQUIRE(a != Make(workload.name, 43));
    TraceLimits limits = kDefaultLimits;
    limits.max_tokens_per_seq = workload.max_tokens_per_seq;
    REQUIRE(workload.max_tokens_per_seq >= kDefaultLimits.max_tokens_per_seq);
    REQUIRE_OK(ValidateRequests(a, limits));
    REQUIRE(std::is_sorted(a.begin(), a.end(),
                           [](const Request& x, const Request& y) {
                             return x.arrival < y.arrival;
                           }));
  }
}

TEST_CASE("workloads round-trip through WriteTrace and ParseTrace") {
  for (const WorkloadInfo& workload : Workloads()) {
    INFO(workload.name);
    // The first requests of each: every field a workload sets appears among
    // them, and the whole of the long ones took most of this suite's time
    // under the sanitizers (nlohmann-json, a number a token).
    std::vector<Request> requests = Make(workload.name, 5);
    requests.resize(std::min<size_t>(requests.size(), 32));
    std::stringstream trace;
    WriteTrace(requests, trace);
    TraceLimits limits = kDefaultLimits;
    limits.max_tokens_per_seq = workload.max_tokens_per_seq;
    const auto parsed = ParseTrace(trace, limits);
    REQUIRE_OK(parsed);
    REQUIRE(*parsed == requests);
  }
}

TEST_CASE("unknown workloads are rejected with the known names") {
  const auto requests = MakeWorkload("nope", 1);
  REQUIRE_STATUS_IS(requests, kInvalidArgument);
  REQUIRE(requests.status().message().find("'nope'") !=
          absl::string_view::npos);
  REQUIRE(requests.status().message().find("sysprompt, multiturn") !=
          absl::string_view::npos);
}

TEST_CASE("each workload has the shape its name promises") {
  for (const Request& r : Make("parallel", 1)) REQUIRE(r.n == 4);
  for (const Request& r : Make("beam", 1)) REQUIRE(r.beam == 4);
  for (const Request& r : Make("unique", 1)) {
    REQUIRE(r.n == 1);
    REQUIRE(r.beam == 1);
  }

  // sysprompt: few distinct 128-token prefixes, two tenants.
  std::set<std::vector<TokenId>> prefixes;
  std::set<std::string> salts;
  for (const Request& r : Make("sysprompt", 1)) {
    prefixes.emplace(r.prompt.begin(), r.prompt.begin() + 128);
    salts.insert(r.cache_salt);
  }
  REQUIRE(prefixes.size() <= 4);
  REQUIRE(salts == std::set<std::string>{"tenant-0", "tenant-1"});

  // multiturn: a turn's prompt starts with the previous prompt and output,
  // and arrives after the previous answer is complete.
  const std::vector<Request> chat = Make("multiturn", 1);
  int continued = 0;
  for (const Request& turn : chat) {
    for (const Request& previous : chat) {
      if (turn.id.substr(0, turn.id.rfind('-')) !=
              previous.id.substr(0, previous.id.rfind('-')) ||
          std::stoi(turn.id.substr(turn.id.rfind('-') + 1)) !=
              std::stoi(previous.id.substr(previous.id.rfind('-') + 1)) + 1) {
        continue;
      }
      std::vector<TokenId> history = previous.prompt;
      history.insert(history.end(), previous.output.begin(),
                     previous.output.end());
      REQUIRE(previous.output.size() ==
              static_cast<size_t>(previous.max_tokens));
      REQUIRE(std::equal(history.begin(), history.end(), turn.prompt.begin()));
      REQUIRE(turn.arrival > previous.arrival + previous.max_tokens);
      ++continued;
    }
  }
  REQUIRE(continued > 0);

  // serving: 2000 unrelated long prompts.
  const std::vector<Request> serving = Make("serving", 1);
  REQUIRE(serving.size() == 2000);
  for (const Request& r : serving) {
    REQUIRE(r.prompt.size() >= 128);
    REQUIRE(r.prompt.size() <= 2048);
    REQUIRE(r.max_tokens >= 32);
    REQUIRE(r.max_tokens <= 256);
  }

  // longcontext: 64 prompts of 8k to 32k tokens, 1k tokens out.
  const std::vector<Request> long_context = Make("longcontext", 1);
  REQUIRE(long_context.size() == 64);
  for (const Request& r : long_context) {
    REQUIRE(r.prompt.size() >= 8192);
    REQUIRE(r.prompt.size() <= 32768);
    REQUIRE(r.max_tokens == 1024);
  }

  // mixed: every kind at once.
  std::set<std::string> kinds;
  for (const Request& r : Make("mixed", 1)) {
    kinds.insert(r.id.substr(0, r.id.find('-')));
  }
  REQUIRE(kinds == std::set<std::string>{"sys", "chat", "par", "beam", "uniq"});
}

}  // namespace
}  // namespace kvblock::sim
