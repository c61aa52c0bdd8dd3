// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "soak/soak.h"

#include <cmath>

#include "test_util.h"

namespace kvblock::soak {
namespace {

TEST_CASE("a short soak finds no violation and counts what it did") {
  const bool caching = GENERATE(true, false);
  const uint64_t seed = GENERATE(1u, 2u);
  INFO("seed " << seed << ", prefix caching " << caching);
  SoakOptions options;
  options.seed = seed;
  options.prefix_caching = caching;
  options.max_operations = 50'000;
  const absl::StatusOr<SoakReport> report = RunSoak(options);
  REQUIRE_OK(report);
  INFO(FormatReport(*report));
  REQUIRE(report->violations == 0);
  REQUIRE(report->first_violation.empty());
  REQUIRE(report->operations >= 50'000);
  REQUIRE(report->steps > 1'000);
  // Invalid plans are refused with their codes; pages run out.
  REQUIRE(report->failures_by_code.at("INVALID_ARGUMENT") > 0);
  REQUIRE(report->failures_by_code.at("NOT_FOUND") > 0);
  REQUIRE(report->failures_by_code.at("RESOURCE_EXHAUSTED") > 0);
  int64_t refused = 0;
  for (const auto& [code, count] : report->failures_by_code) refused += count;
  REQUIRE(refused == report->refused_steps);
}

TEST_CASE("a soak with a host tier and KV cache events finds no violation") {
  SoakOptions options;
  options.max_operations = 50'000;
  options.host_pages = 48;
  options.kv_events = true;
  const absl::StatusOr<SoakReport> report = RunSoak(options);
  REQUIRE_OK(report);
  INFO(FormatReport(*report));
  REQUIRE(report->violations == 0);
  REQUIRE(report->host_copies > 100);
  REQUIRE(report->kv_changes > 1000);
  REQUIRE(report->peak_rss_kb >= report->peak_rss_kb_at_tenth);
  REQUIRE(report->peak_rss_kb_at_tenth > 0);
}

TEST_CASE("a soak is deterministic for a seed") {
  SoakOptions options;
  options.max_operations = 20'000;
  const absl::StatusOr<SoakReport> a = RunSoak(options);
  const absl::StatusOr<SoakReport> b = RunSoak(options);
  REQUIRE_OK(a);
  REQUIRE_OK(b);
  REQUIRE(a->operations == b->operations);
  REQUIRE(a->steps == b->steps);
  REQUIRE(a->failures_by_code == b->failures_by_code);
}

TEST_CASE("a soak refuses bad options") {
  SoakOptions options;
  options.max_operations = -1;
  REQUIRE_STATUS_IS(RunSoak(options), kInvalidArgument);
  options.max_operations = 10;
  for (const double seconds : {-1.0, std::nan("")}) {
    options.max_seconds = seconds;
    const absl::StatusOr<SoakReport> report = RunSoak(options);
    REQUIRE_STATUS_IS(report, kInvalidArgument);
    REQUIRE(report.status().message().find("seconds") !=
            absl::string_view::npos);
  }
  options.max_seconds = 0;
  options.num_pages = 0;
  REQUIRE_STATUS_IS(RunSoak(options), kInvalidArgument);
}

}  // namespace
}  // namespace kvblock::soak
