// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "sim/report.h"

#include <sstream>
#include <string>

#include "kvblock/version.h"
#include "nlohmann/json.hpp"
#include "test_util.h"

namespace kvblock::sim {
namespace {

SimResult SampleResult() {
  SimResult result;
  result.requests = 12;
  result.completed = 9;
  result.rejected = {
      {"r7", "its prompt needs 80 pages", RejectedRequest::Kind::kPoolTooSmall},
      {"r8", "its prompt has 3000 uncached tokens",
       RejectedRequest::Kind::kOverTokenBudget},
      {"r9", "its prompt needs 90 pages",
       RejectedRequest::Kind::kPoolTooSmall}};
  result.prompt_tokens = 4000;
  result.prefix_hit_tokens = 1000;
  result.generated_tokens = 2000;
  result.recomputed_tokens = 70;
  result.steps = 500;
  result.preemptions = 3;
  result.cow_copies = 12;
  result.evictions = 40;
  result.num_pages = 256;
  result.peak_pages_used = 250;
  result.mean_pages_used = 180.5;
  result.host_ns_by_phase = {.planning_ns = 1'000'000,
                             .frees_ns = 250'000,
                             .admissions_ns = 1'500'000,
                             .appends_ns = 1'000'000,
                             .page_table_ns = 250'000,
                             .bookkeeping_ns = 500'000,
                             .upload_ns = 400'000,
                             .copy_on_write_ns = 100'000};
  result.host_ns_total = result.host_ns_by_phase.total_ns();
  result.sequence_steps = 100'000;
  result.wall_seconds = 0.5;
  result.scheduler_thread_ns = 250'000'000;
  result.upload_copies = 600;
  result.upload_bytes = 123456;
  result.upload_entries = 5000;
  result.upload_ranges = 1500;
  result.table_setup_ns = 2'000'000;
  result.queue_steps = {
      .count = 9, .mean = 4.5, .p50 = 3, .p99 = 20, .max = 20};
  result.ttft_steps = {.count = 9, .mean = 5.5, .p50 = 4, .p99 = 21, .max = 21};
  result.peak_waiting = 6;
  result.steps_limited_by_pages = 30;
  result.steps_limited_by_max_batch = 20;
  result.steps_limited_by_token_budget = 10;
  return result;
}

RunSetup SampleSetup() {
  RunSetup setup{
      .source = "workload mixed (seed 1)", .device = "host", .config = {}};
  setup.config.kv.num_pages = 256;
  setup.config.kv.max_batch = 32;
  setup.config.kv.max_pages_per_seq = 64;
  setup.config.manager.watermark_pages = 2;
  return setup;
}

TEST_CASE("the readable report states every number") {
  std::ostringstream out;
  PrintReport(SampleResult(), SampleSetup(), out);
  const std::string text = out.str();
  INFO(text);
  for (const char* line : {
           "kvblock-sim: workload mixed (seed 1) on host\n",
           "pool 256 pages x 16 tokens, batch <= 32, 64 pages per sequence, "
           "2048 tokens per step\n",
           "prefix caching on (sha256), watermark 2 pages\n",
           "requests          9 completed, 3 rejected (of 12)\n",
           "prompt tokens     4000 admitted, 1000 from the prefix cache (25.0% "
           "hit rate)\n",
           "generated tokens  2000 (70 of them recomputed after a "
           "preemption)\n",
           "steps             500\n",
           "pages in use      peak 250, mean 180.5 of 256\n",
           "evictions         40 cached pages reused\n",
           "preemptions       3 requests recomputed\n",
           "copy-on-write     12 page copies\n",
           "queue wait        4.5 steps mean, p50 3, p99 20, max 20; at most 6 "
           "requests waiting\n",
           "first token       5.5 steps after arrival mean, p50 4, p99 21, max "
           "21\n",
           "batch limits      60 steps left requests waiting: 30 for pages, 20 "
           "for max_batch, 10 for the token budget\n",
           "host time         5.00 ms in the steps, 10.0 us per step, 50 ns "
           "per running sequence per step\n",
           "  planning          1.00 ms   20.0%  the scheduler: arrivals, "
           "planning, applying\n",
           "  admissions        1.50 ms   30.0%",
           "  frees            250.0 us    5.0%",
           "  page table       250.0 us    5.0%",
           "  upload           400.0 us    8.0%",
           "  copy-on-write    100.0 us    2.0%",
           "page table        247 bytes uploaded per step: 10.0 entries set in "
           "3.0 rows, 600 copies in all (the whole table at start-up: 2.00 ms, "
           "not in host time)\n",
           "simulator speed   12000 tokens/s, 1000 steps/s of this process's "
           "wall time (0.500 s; not a model's throughput); the scheduler "
           "thread's CPU 250.00 ms, 500.0 us per step\n",
           "rejected          3: 1 over_token_budget, 2 pool_too_small\n",
           "rejected          r7: its prompt needs 80 pages\n",
           "rejected          r8: its prompt has 3000 uncached tokens\n",
       }) {
    REQUIRE(text.find(line) != std::string::npos);
  }
}

TEST_CASE("the report counts rejections past the listed ones") {
  SimResult result = SampleResult();
  result.unlisted_rejections[static_cast<size_t>(
      RejectedRequest::Kind::kRanOutAlone)] = 4;
  std::ostringstream out;
  PrintReport(result, SampleSetup(), out);
  const std::string text = out.str();
  for (const char* line : {
           "requests          9 completed, 7 rejected (of 12)\n",
           "rejected          7: 1 over_token_budget, 2 pool_too_small, 4 "
           "ran_out_alone\n",
           "rejected          ... and 4 more\n",
       }) {
    REQUIRE(text.find(line) != std::string::npos);
  }
  std::ostringstream json;
  WriteJsonReport(result, SampleSetup(), json);
  const nlohmann::json report = nlohmann::json::parse(json.str());
  REQUIRE(report["rejected"] == 7);
  REQUIRE(report["rejected_requests"].size() == 3);
}

TEST_CASE("with a host tier the report splits hits by tier and costs copies") {
  SimResult result = SampleResult();
  result.host_pages = 4000;
  result.host_hit_tokens = 600;
  result.host_stores = 30;
  result.host_loads = 40;
  result.host_bytes_stored = 30 * 8192;
  result.host_bytes_loaded = 40 * 8192;
  result.host_evictions = 5;
  result.host_copy_ns = 2'500'000;
  result.host_copy_ns_max_step = 60'000;
  RunSetup setup = SampleSetup();
  setup.config.manager.host_pages = 4000;
  std::ostringstream out;
  PrintReport(result, setup, out);
  const std::string text = out.str();
  for (const char* line : {
           "  by tier         400 from the device (10.0%), 600 from the host "
           "tier (15.0%)\n",
           "host tier         4000 pages (write-back); 30 pages stored (245.8 "
           "KB), 40 loaded (327.7 KB), 5 host pages reused; copies at 64 "
           "GB/s: 2.50 ms in all, 5.0 us a step, at most 60.0 us\n",
       }) {
    INFO(line);
    REQUIRE(text.find(line) != std::string::npos);
  }
  std::ostringstream json;
  WriteJsonReport(result, setup, json);
  const nlohmann::json report = nlohmann::json::parse(json.str());
  REQUIRE(report["host_pages"] == 4000);
  REQUIRE(report["device_hit_tokens"] == 400);
  REQUIRE(report["host_hit_tokens"] == 600);
  REQUIRE(report["host_stores"] == 30);
  REQUIRE(report["host_loads"] == 40);
  REQUIRE(report["host_bytes_stored"] == 30 * 8192);
  REQUIRE(report["host_bytes_loaded"] == 40 * 8192);
  REQUIRE(report["host_evictions"] == 5);
  REQUIRE(report["host_copy_ns"] == 2'500'000);
  REQUIRE(report["host_copy_ns_per_step"] == 5'000.0);
  REQUIRE(report["host_copy_ns_max_step"] == 60'000);
  REQUIRE(report["config"]["host_pages"] == 4000);
  REQUIRE(report["config"]["host_bandwidth_gbps"] == 64.0);
  REQUIRE(report["config"]["host_write_through"] == false);
  // Without a host tier the text has neither line.
  std::ostringstream plain;
  PrintReport(SampleResult(), SampleSetup(), plain);
  REQUIRE(plain.str().find("\nhost tier ") == std::string::npos);
  REQUIRE(plain.str().find("by tier") == std::string::npos);
}

TEST_CASE("the JSON report has the design's fields") {
  std::ostringstream out;
  WriteJsonReport(SampleResult(), SampleSetup(), out);
  const nlohmann::json report = nlohmann::json::parse(out.str());
  REQUIRE(report["requests"] == 12);
  REQUIRE(report["completed"] == 9);
  REQUIRE(report["rejected"] == 3);
  REQUIRE(report["rejected_requests"].size() == 3);
  REQUIRE(report["rejected_requests"][0]["id"] == "r7");
  REQUIRE(report["rejected_requests"][0]["kind"] == "pool_too_small");
  REQUIRE(report["rejected_requests"][1]["kind"] == "over_token_budget");
  REQUIRE(report["rejected_requests"][1]["reason"] ==
          "its prompt has 3000 uncached tokens");
  REQUIRE(report["recomputed_tokens"] == 70);
  REQUIRE(report["queue_steps"]["count"] == 9);
  REQUIRE(report["queue_steps"]["mean"] == 4.5);
  REQUIRE(report["queue_steps"]["p50"] == 3);
  REQUIRE(report["queue_steps"]["p99"] == 20);
  REQUIRE(report["queue_steps"]["max"] == 20);
  REQUIRE(report["ttft_steps"]["mean"] == 5.5);
  REQUIRE(report["ttft_steps"]["max"] == 21);
  REQUIRE(report["peak_waiting"] == 6);
  REQUIRE(report["steps_limited_by"]["pages"] == 30);
  REQUIRE(report["steps_limited_by"]["max_batch"] == 20);
  REQUIRE(report["steps_limited_by"]["token_budget"] == 10);
  REQUIRE(report["prompt_tokens"] == 4000);
  REQUIRE(report["prefix_hit_tokens"] == 1000);
  REQUIRE(report["prefix_hit_rate"] == 0.25);
  REQUIRE(report["generated_tokens"] == 2000);
  REQUIRE(report["steps"] == 500);
  REQUIRE(report["preemptions"] == 3);
  REQUIRE(report["cow_copies"] == 12);
  REQUIRE(report["evictions"] == 40);
  REQUIRE(report["peak_pages_used"] == 250);
  REQUIRE(report["mean_pages_used"] == 180.5);
  REQUIRE(report["host_ns_total"] == 5'000'000);
  REQUIRE(report["host_ns_per_step"] == 10'000.0);
  REQUIRE(report["tokens_per_second"] == 12'000.0);
  REQUIRE(report["scheduler_thread_ns"] == 250'000'000);
  REQUIRE(report["steps_per_second"] == 1'000.0);
  REQUIRE(report["upload_bytes"] == 123456);
  REQUIRE(report["upload_entries"] == 5000);
  REQUIRE(report["upload_ranges"] == 1500);
  REQUIRE(report["table_setup_ns"] == 2'000'000);
  REQUIRE(report["host_ns_per_sequence_step"] == 50.0);
  const nlohmann::json& phases = report["host_ns_by_phase"];
  REQUIRE(phases.size() == 10);
  REQUIRE(phases["host_copies"] == 0);
  REQUIRE(phases["planning"] == 1'000'000);
  REQUIRE(phases["admissions"] == 1'500'000);
  REQUIRE(phases["appends"] == 1'000'000);
  REQUIRE(phases["frees"] == 250'000);
  REQUIRE(phases["bookkeeping"] == 500'000);
  REQUIRE(phases["page_table"] == 250'000);
  REQUIRE(phases["upload"] == 400'000);
  REQUIRE(phases["copy_on_write"] == 100'000);
  REQUIRE(phases["kv_events"] == 0);
  REQUIRE(report["kv_events"]["on"] == false);
  REQUIRE(report["kv_events"]["endpoint"] == "");
  REQUIRE(report["device"] == "host");
  REQUIRE(report["version"] == KVBLOCK_VERSION);
  REQUIRE(report["config"]["num_pages"] == 256);
  REQUIRE(report["config"]["hash"] == "sha256");
  REQUIRE(report["config"]["prefix_caching"] == true);
}

TEST_CASE("DescribeRun names the run and its configuration in one line") {
  REQUIRE(DescribeRun(SampleSetup()) ==
          "workload mixed (seed 1) on host: 256 pages x 16 tokens, batch <= "
          "32, 64 pages per sequence, 2048 tokens per step, prefix caching on "
          "(sha256), chunked prefill on, whole prompts reserved, speculative "
          "decoding off");
}

TEST_CASE("an empty run reports zero rates, not NaN") {
  SimResult result;
  std::ostringstream text;
  PrintReport(result, SampleSetup(), text);
  REQUIRE(text.str().find("nan") == std::string::npos);
  std::ostringstream json;
  WriteJsonReport(result, SampleSetup(), json);
  const nlohmann::json report = nlohmann::json::parse(json.str());
  REQUIRE(report["prefix_hit_rate"] == 0.0);
  REQUIRE(report["host_ns_per_step"] == 0.0);
  REQUIRE(report["rejected_requests"].empty());
}

}  // namespace
}  // namespace kvblock::sim
