// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "kvblock/metrics.h"

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "kvblock/block_manager.h"
#include "kvblock/device.h"
#include "kvblock/kv_cache_groups.h"
#include "kvblock/page_table.h"
#include "test_util.h"

namespace kvblock {
namespace {

using testing::TokenRange;

PagedKvConfig Config() {
  PagedKvConfig config;
  config.num_pages = 16;
  config.page_size = 4;
  config.max_pages_per_seq = 8;
  config.max_batch = 4;
  return config;
}

double ValueOf(const std::vector<Metric>& metrics, absl::string_view name) {
  for (const Metric& metric : metrics) {
    if (metric.name == name) return metric.value;
  }
  FAIL("no metric " << name);
  return -1;
}

TEST_CASE("CollectMetrics reads the manager under vLLM's names") {
  auto manager = BlockManager::Create(Config());
  REQUIRE_OK(manager);
  // Two 8-token prompts sharing their first page: 2 + 1 new pages, one
  // 4-token hit; then one is preempted.
  REQUIRE_OK((*manager)->Admit(1, TokenRange(0, 8)));
  std::vector<TokenId> second = TokenRange(0, 4);
  for (TokenId t : TokenRange(100, 4)) second.push_back(t);
  REQUIRE_OK((*manager)->Admit(2, second));
  REQUIRE_OK((*manager)->Preempt(2));

  auto metrics = CollectMetrics({.manager = manager->get()});
  REQUIRE_OK(metrics);
  CHECK(ValueOf(*metrics, "vllm:kv_cache_usage_perc") == 2.0 / 16);
  CHECK(ValueOf(*metrics, "vllm:prefix_cache_queries") == 16);
  CHECK(ValueOf(*metrics, "vllm:prefix_cache_hits") == 4);
  CHECK(ValueOf(*metrics, "vllm:num_preemptions") == 1);
  CHECK(ValueOf(*metrics, "kvblock_pages") == 16);
  CHECK(ValueOf(*metrics, "kvblock_pages_in_use") == 2);
  CHECK(ValueOf(*metrics, "kvblock_pages_peak_in_use") == 3);
  CHECK(ValueOf(*metrics, "kvblock_pages_cached") == 3);
  CHECK(ValueOf(*metrics, "kvblock_pages_evictable") == 1);
  CHECK(ValueOf(*metrics, "kvblock_admissions") == 2);
  CHECK(ValueOf(*metrics, "kvblock_page_allocations") == 3);
  for (const Metric& metric : *metrics) {
    CHECK_FALSE(absl::StartsWith(metric.name, "kvblock_page_table"));
    CHECK_FALSE(absl::StartsWith(metric.name, "kvblock_kv_event"));
  }
}

TEST_CASE("the null page of window groups is neither in use nor counted") {
  // vLLM's usage leaves its null block out (BlockPool.get_usage): an idle
  // hybrid manager uses nothing, and one sequence's pages count alone.
  BlockManagerOptions options;
  options.kv_cache_groups = {{.kind = AttentionKind::kFull, .page_size = 4},
                             {.kind = AttentionKind::kSlidingWindow,
                              .page_size = 4,
                              .sliding_window = 8}};
  auto manager = BlockManager::Create(Config(), options);
  REQUIRE_OK(manager);
  REQUIRE((*manager)->null_page() != kNoPage);
  auto idle = CollectMetrics({.manager = manager->get()});
  REQUIRE_OK(idle);
  CHECK(ValueOf(*idle, "vllm:kv_cache_usage_perc") == 0);
  CHECK(ValueOf(*idle, "kvblock_pages_in_use") == 0);
  CHECK(ValueOf(*idle, "kvblock_pages_peak_in_use") == 0);
  CHECK(ValueOf(*idle, "kvblock_pages") == 16);
  // 8 tokens: 2 pages in each group.
  REQUIRE_OK((*manager)->Admit(1, TokenRange(0, 8)));
  auto busy = CollectMetrics({.manager = manager->get()});
  REQUIRE_OK(busy);
  CHECK(ValueOf(*busy, "kvblock_pages_in_use") == 4);
  CHECK(ValueOf(*busy, "vllm:kv_cache_usage_perc") == 4.0 / 15);
  CHECK(ValueOf(*busy, "kvblock_pages_peak_in_use") == 4);
}

TEST_CASE("CollectMetrics adds the page table's and the publisher's") {
  auto manager = BlockManager::Create(Config());
  REQUIRE_OK(manager);
  std::unique_ptr<Device> host = Device::Host();
  auto table = KVPageTable::Create(4, 8, 16, *host);
  REQUIRE_OK(table);
  REQUIRE_OK((*table)->Upload(nullptr));
  KvEventPublisherStats events;
  events.batches_published = 7;
  events.batches_dropped = 2;
  events.queued_bytes = 300;
  auto metrics = CollectMetrics({.manager = manager->get(),
                                 .page_table = table->get(),
                                 .kv_events = &events});
  REQUIRE_OK(metrics);
  CHECK(ValueOf(*metrics, "kvblock_page_table_uploads") == 1);
  CHECK(ValueOf(*metrics, "kvblock_page_table_upload_bytes") ==
        static_cast<double>((*table)->upload_stats().bytes));
  CHECK(ValueOf(*metrics, "kvblock_kv_event_batches_published") == 7);
  CHECK(ValueOf(*metrics, "kvblock_kv_event_batches_dropped") == 2);
  CHECK(ValueOf(*metrics, "kvblock_kv_event_queued_bytes") == 300);
}

TEST_CASE("CollectMetrics without a manager is an error") {
  auto metrics = CollectMetrics({});
  REQUIRE_STATUS_IS(metrics, kInvalidArgument);
  CHECK(
      absl::StrContains(metrics.status().message(), "sources.manager is null"));
}

TEST_CASE("FormatPrometheusText writes the exposition format") {
  const std::vector<Metric> metrics = {
      {"vllm:num_preemptions", "Preemptions.", Metric::Type::kCounter, 3},
      {"vllm:kv_cache_usage_perc", "Usage.\nOf\\pages.", Metric::Type::kGauge,
       0.125},
  };
  auto text = FormatPrometheusText(
      metrics, {{"model_name", "m\"1\"\n\\"}, {"engine", "0"}});
  REQUIRE_OK(text);
  CHECK(*text ==
        "# HELP vllm:num_preemptions_total Preemptions.\n"
        "# TYPE vllm:num_preemptions_total counter\n"
        "vllm:num_preemptions_total{model_name=\"m\\\"1\\\"\\n\\\\\","
        "engine=\"0\"} 3\n"
        "# HELP vllm:kv_cache_usage_perc Usage.\\nOf\\\\pages.\n"
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        "vllm:kv_cache_usage_perc{model_name=\"m\\\"1\\\"\\n\\\\\","
        "engine=\"0\"} 0.125\n");

  auto bare = FormatPrometheusText(metrics, {});
  REQUIRE_OK(bare);
  CHECK(absl::StrContains(*bare, "\nvllm:num_preemptions_total 3\n"));
  CHECK(FormatPrometheusText({}, {}).value().empty());
}

TEST_CASE("FormatPrometheusText writes exact values and the special ones") {
  const auto one = [](double value) {
    const std::vector<Metric> metrics = {
        {"x", "", Metric::Type::kGauge, value}};
    auto text = FormatPrometheusText(metrics, {});
    REQUIRE_OK(text);
    return text->substr(text->rfind(' ') + 1);
  };
  CHECK(one(0) == "0\n");
  CHECK(one(-5) == "-5\n");
  CHECK(one(9007199254740991.0) == "9007199254740991\n");
  CHECK(one(1e300) == "1.0000000000000001e+300\n");
  CHECK(one(0.1) == "0.10000000000000001\n");
  CHECK(one(std::numeric_limits<double>::infinity()) == "+Inf\n");
  CHECK(one(-std::numeric_limits<double>::infinity()) == "-Inf\n");
  CHECK(one(std::numeric_limits<double>::quiet_NaN()) == "NaN\n");
}

TEST_CASE("FormatPrometheusText refuses bad names, naming them") {
  const std::vector<Metric> good = {{"ok", "", Metric::Type::kGauge, 1}};
  const auto refused = [](absl::StatusOr<std::string> text,
                          absl::string_view part) {
    REQUIRE_STATUS_IS(text, kInvalidArgument);
    CHECK(absl::StrContains(text.status().message(), part));
  };
  refused(FormatPrometheusText(good, {{"model-name", "m"}}),
          "label name \"model-name\"");
  refused(FormatPrometheusText(good, {{"", "m"}}), "label name \"\"");
  refused(FormatPrometheusText(good, {{"0x", "m"}}), "label name \"0x\"");
  refused(FormatPrometheusText(good, {{"__name__", "m"}}),
          "label name \"__name__\"");
  refused(FormatPrometheusText(good, {{"a:b", "m"}}), "label name \"a:b\"");
  refused(FormatPrometheusText(good, {{"engine", "0"}, {"engine", "1"}}),
          "label \"engine\" is given twice");
  const std::string huge(1 << 20, '\n');
  refused(FormatPrometheusText(good, {{huge, "m"}}), "label name \"\\n\\n");
  const std::vector<Metric> bad = {{"9lives", "", Metric::Type::kGauge, 1}};
  refused(FormatPrometheusText(bad, {}), "metric name \"9lives\"");
  const std::vector<Metric> empty = {{"", "", Metric::Type::kCounter, 1}};
  refused(FormatPrometheusText(empty, {}), "metric name \"\"");
}

}  // namespace
}  // namespace kvblock
