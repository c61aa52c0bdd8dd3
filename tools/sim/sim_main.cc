// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// kvblock-sim: replays a trace or a built-in workload through a simulated
// continuous-batching scheduler that drives the kvblock library, and prints
// what the block manager did. See tools/sim/scheduler.h for the loop and
// tools/sim/README.md for the trace format, the flags and the report.
//
// Exit codes: 0 success (and --help); 1 a failure at run time (device, file
// output, library error); 2 bad input (an unknown flag or a bad value, a
// trace file or line, a workload name, an output path that cannot be
// written).
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cli/flags.h"
#include "kvblock/block_hash.h"
#include "kvblock/device.h"
#include "kvblock/kv_event_publisher.h"
#include "kvblock/metrics.h"
#include "kvblock/status_macros.h"
#include "sim/metrics_server.h"
#include "sim/models.h"
#include "sim/output_file.h"
#include "sim/progress.h"
#include "sim/report.h"
#include "sim/scheduler.h"
#include "sim/serve.h"
#include "sim/timeline.h"
#include "sim/trace.h"
#include "sim/workloads.h"

ABSL_FLAG(std::string, trace, "",
          "JSON Lines trace to replay, one request a line (the format: "
          "tools/sim/README.md); excludes --workload");
ABSL_FLAG(std::string, workload, "",
          "built-in workload: sysprompt, multiturn, chat, parallel, beam, "
          "unique, serving, longcontext or mixed (the default when no "
          "--trace is given)");
ABSL_FLAG(bool, serve, false,
          "serve requests a router feeds on stdin, in lockstep, writing the "
          "run's state on stdout before each horizon (tools/sim/serve.h, "
          "tools/router); excludes --trace, --workload and --write_trace");
ABSL_FLAG(uint64_t, seed, 1,
          "seed of the built-in workload and of the drafts' acceptance");
ABSL_FLAG(std::string, model, "",
          "the model's KV cache groups, a preset: llama (one full group), "
          "gpt-oss (full + 128-token sliding window), gemma3 (5 x 1,024-token "
          "sliding window + full), llama4 (3 x 8,192-token chunked local + "
          "full); default llama");
ABSL_FLAG(std::string, kv_cache_groups, "",
          "the model's KV cache groups in full: a comma list of full, "
          "sliding:W and chunked:C, each optionally xN (e.g. "
          "sliding:1024x5,full); excludes --model");
ABSL_FLAG(int32_t, pages, 384, "KV pages in the pool");
ABSL_FLAG(int32_t, page_size, 16, "tokens per page");
ABSL_FLAG(int32_t, max_batch, 32,
          "most sequences running at once (rows of the page table)");
ABSL_FLAG(int32_t, max_pages_per_seq, 64,
          "most pages of one sequence (columns of the page table)");
ABSL_FLAG(int64_t, max_tokens_per_step, 2048,
          "tokens one step may compute: one per decoding sequence plus its "
          "drafts, plus the prompt tokens (chunks) it computes");
ABSL_FLAG(bool, chunked_prefill, true,
          "compute long prompts over several steps (vLLM v1's default); "
          "false: a prompt is computed in the step that admits it, and one "
          "over --max_tokens_per_step is rejected");
ABSL_FLAG(int64_t, chunk_tokens, 0,
          "with chunked prefill, the most prompt tokens of one request a step "
          "computes (0: what the budget has left)");
ABSL_FLAG(bool, reserve_prompt, true,
          "admit a chunked prompt only when its whole prompt fits, reserving "
          "the pages (vLLM's default); false: admit on the first chunk alone");
ABSL_FLAG(int32_t, spec_tokens, 0,
          "speculative decoding: draft slots per decoding sequence and step "
          "(0: off; at most 64; beams never draft)");
ABSL_FLAG(double, spec_acceptance, 0.7,
          "probability each draft is accepted, in [0, 1] (the first "
          "rejection ends a step's accepted run)");
ABSL_FLAG(std::string, kv_events, "",
          "publish KV cache events in vLLM's format on a ZeroMQ PUB socket "
          "bound here (e.g. tcp://127.0.0.1:5557; empty: off; discard: "
          "record and take them, publish nothing)");
ABSL_FLAG(int32_t, metrics_port, -1,
          "with --serve, serve the library's metrics (Prometheus text, "
          "vLLM's names) at http://127.0.0.1:PORT/metrics, refreshed at each "
          "horizon (0: a free port, said on stderr; -1: off)");
ABSL_FLAG(std::string, kv_events_replay, "",
          "with --kv_events, a ROUTER replay socket bound here (empty: none)");
ABSL_FLAG(int32_t, kv_events_wait_ms, 0,
          "with --kv_events, milliseconds to wait after binding, before the "
          "run, so that subscribers connect in time (PUB drops what it sends "
          "before they do)");
ABSL_FLAG(int32_t, kv_events_cpu, -1,
          "with --kv_events, the CPU the publisher thread and ZeroMQ's I/O "
          "thread run on (-1: any); keep the simulator's own thread off it, "
          "e.g. taskset -c 0 kvblock-sim --kv_events_cpu=1");
ABSL_FLAG(int32_t, kv_events_poll_us, 250,
          "with --kv_events, how often the publisher thread looks for "
          "batches, in microseconds (less often while it finds none, up to "
          "a millisecond)");
ABSL_FLAG(int64_t, kv_events_max_queued_bytes, int64_t{64} << 20,
          "with --kv_events, the bytes ZeroMQ may hold of what the publisher "
          "sent and it has not written out (0: no bound); a batch past it "
          "is numbered and kept for replay, not sent");
ABSL_FLAG(std::string, kv_events_encoding, "map",
          "KV event encoding: map (vLLM since mid-2026) or array (tagged "
          "arrays, before)");
ABSL_FLAG(std::string, kv_events_hashes, "int64",
          "KV event block hashes: int64 (vLLM's integer form) or bytes");
ABSL_FLAG(bool, prefix_caching, true,
          "share full pages of equal prefixes between requests");
ABSL_FLAG(std::string, hash, "sha256",
          "prefix-cache hash: sha256 (collision resistant) or xxh3 (fast, "
          "trusted prompts only)");
ABSL_FLAG(double, watermark, 0.01,
          "fraction of the pool admission leaves free for the appends of "
          "running sequences, in [0, 1)");
ABSL_FLAG(std::string, device, "auto",
          "where the page table and the KV pool live: host, cuda (GPU 0) or "
          "auto (cuda when a GPU works, else host)");
ABSL_FLAG(int32_t, num_kv_heads, 2,
          "KV heads of the simulated model (sizes the KV pool the "
          "copy-on-write kernel copies in)");
ABSL_FLAG(int32_t, head_dim, 64, "head dimension of the simulated model");
ABSL_FLAG(int32_t, host_pages, 0,
          "pages of the host tier (pinned host memory keeping cached pages "
          "the pool evicts; 0: none)");
ABSL_FLAG(bool, host_write_through, false,
          "store every cached page in the host tier in the step after it is "
          "computed (write-through), not when the pool evicts it");
ABSL_FLAG(double, host_bandwidth, 64,
          "GB/s (10^9 bytes a second) the host tier's copies are costed at, "
          "one direction at a time (default: PCIe 5 x16)");
ABSL_FLAG(int64_t, host_page_bytes, 0,
          "bytes a host-tier copy is costed at (a page over every layer, K "
          "and V; 0: the simulated pool's)");
ABSL_FLAG(std::string, json, "", "also write the report as JSON to this file");
ABSL_FLAG(std::string, timeline, "",
          "write one CSV row per step to this file (for tools/plot)");
ABSL_FLAG(std::string, plot, "",
          "write an SVG chart of pages in use, hit rate, batch size and "
          "preemptions over steps to this file");
ABSL_FLAG(std::string, write_trace, "",
          "write the requests (the workload or trace) as a JSON Lines trace "
          "to this file and exit without running");

namespace kvblock::sim {
namespace {

constexpr int kExitFailure = 1;
constexpr int kExitBadInput = 2;

int Fail(int code, const absl::Status& status) {
  std::cerr << "kvblock-sim: " << status.message() << '\n';
  return code;
}

// The scheduler config the flags describe; InvalidArgument naming the flag.
absl::StatusOr<SchedulerConfig> ConfigFromFlags() {
  SchedulerConfig config;
  config.kv.num_pages = absl::GetFlag(FLAGS_pages);
  config.kv.page_size = absl::GetFlag(FLAGS_page_size);
  config.kv.max_batch = absl::GetFlag(FLAGS_max_batch);
  config.kv.max_pages_per_seq = absl::GetFlag(FLAGS_max_pages_per_seq);
  config.kv.num_kv_heads = absl::GetFlag(FLAGS_num_kv_heads);
  config.kv.head_dim = absl::GetFlag(FLAGS_head_dim);
  if (absl::Status status = config.kv.Validate(); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad geometry (--pages, --page_size, --max_batch, --max_pages_per_seq,"
        " --num_kv_heads, --head_dim): ",
        status.message()));
  }
  config.max_tokens_per_step = absl::GetFlag(FLAGS_max_tokens_per_step);
  if (config.max_tokens_per_step <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_tokens_per_step must be positive, got ",
                     config.max_tokens_per_step));
  }
  config.chunked_prefill = absl::GetFlag(FLAGS_chunked_prefill);
  config.chunk_tokens = absl::GetFlag(FLAGS_chunk_tokens);
  if (config.chunk_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--chunk_tokens must be 0 or positive, got ", config.chunk_tokens));
  }
  config.manager.reserve_prompt_pages = absl::GetFlag(FLAGS_reserve_prompt);
  config.spec_tokens = absl::GetFlag(FLAGS_spec_tokens);
  if (config.spec_tokens < 0 || config.spec_tokens > kMaxSpecTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("--spec_tokens must be in [0, ", kMaxSpecTokens, "], got ",
                     config.spec_tokens));
  }
  config.spec_acceptance = absl::GetFlag(FLAGS_spec_acceptance);
  if (!(config.spec_acceptance >= 0 && config.spec_acceptance <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--spec_acceptance must be in [0, 1], got ", config.spec_acceptance));
  }
  config.spec_seed = absl::GetFlag(FLAGS_seed);
  config.manager.enable_prefix_caching = absl::GetFlag(FLAGS_prefix_caching);
  const std::string hash = absl::GetFlag(FLAGS_hash);
  if (hash == "sha256") {
    config.manager.hash_algorithm = HashAlgorithm::kSha256;
  } else if (hash == "xxh3" || hash == "xxh3_128") {
    config.manager.hash_algorithm = HashAlgorithm::kXxh3_128;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--hash must be sha256 or xxh3, got '", hash, "'"));
  }
  const double watermark = absl::GetFlag(FLAGS_watermark);
  if (!(watermark >= 0 && watermark < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--watermark must be in [0, 1), got ", watermark));
  }
  config.manager.watermark_pages =
      static_cast<int32_t>(std::floor(watermark * config.kv.num_pages));
  KVBLOCK_ASSIGN_OR_RETURN(
      config.manager.kv_cache_groups,
      ModelGroups(absl::GetFlag(FLAGS_model),
                  absl::GetFlag(FLAGS_kv_cache_groups), config.kv.page_size));
  config.manager.host_pages = absl::GetFlag(FLAGS_host_pages);
  if (config.manager.host_pages < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--host_pages must be 0 or positive, got ", config.manager.host_pages));
  }
  if (config.manager.host_pages > 0 &&
      !config.manager.kv_cache_groups.empty()) {
    return absl::InvalidArgumentError(
        "--host_pages serves a model of one full-attention group only "
        "(--model=llama, no --kv_cache_groups)");
  }
  if (config.manager.host_pages > 0 && !config.manager.enable_prefix_caching) {
    return absl::InvalidArgumentError(
        "--host_pages needs --prefix_caching (the host tier keeps cached "
        "pages)");
  }
  config.manager.host_write_policy = absl::GetFlag(FLAGS_host_write_through)
                                         ? HostWritePolicy::kWriteThrough
                                         : HostWritePolicy::kWriteBack;
  config.host_bandwidth_gbps = absl::GetFlag(FLAGS_host_bandwidth);
  if (!(config.host_bandwidth_gbps >= kMinHostBandwidthGbps &&
        config.host_bandwidth_gbps <= kMaxHostBandwidthGbps)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--host_bandwidth must be in [", kMinHostBandwidthGbps, ", ",
        kMaxHostBandwidthGbps, "] GB/s, got ", config.host_bandwidth_gbps));
  }
  config.host_page_bytes = absl::GetFlag(FLAGS_host_page_bytes);
  if (config.host_page_bytes < 0 ||
      config.host_page_bytes > kMaxHostPageBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--host_page_bytes must be in [0, ", kMaxHostPageBytes,
                     "], got ", config.host_page_bytes));
  }
  return config;
}

// What a built-in workload needs of the geometry flags that `kv` lacks, as
// a clause for the error that it does not fit; empty when it lacks none.
std::string WorkloadNeeds(absl::string_view workload, const PagedKvConfig& kv) {
  for (const WorkloadInfo& info : Workloads()) {
    if (info.name != workload) continue;
    const int64_t pages = PagesForTokens(info.max_tokens_per_seq, kv.page_size);
    if (pages <= kv.max_pages_per_seq) return "";
    return absl::StrCat("; it needs --max_pages_per_seq=", pages,
                        " or more at --page_size=", kv.page_size);
  }
  return "";
}

// The requests the flags name, validated for `config`, and a description.
absl::StatusOr<std::vector<Request>> RequestsFromFlags(
    const SchedulerConfig& config, std::string& source) {
  const std::string trace = absl::GetFlag(FLAGS_trace);
  std::string workload = absl::GetFlag(FLAGS_workload);
  if (!trace.empty()) {
    if (!workload.empty()) {
      return absl::InvalidArgumentError(
          "--trace and --workload exclude each other");
    }
    source = absl::StrCat("trace ", trace);
    absl::StatusOr<std::vector<Request>> requests =
        ReadTraceFile(trace, TraceLimitsFor(config));
    // An empty trace is a mistake (a wrong path, a failed export), not a
    // run of nothing: bad input.
    if (requests.ok() && requests->empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("trace ", trace, " holds no requests"));
    }
    return requests;
  }
  if (workload.empty()) workload = std::string(kDefaultWorkload);
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  source = absl::StrCat("workload ", workload, " (seed ", seed, ")");
  absl::StatusOr<std::vector<Request>> requests = MakeWorkload(workload, seed);
  if (!requests.ok()) return requests.status();
  if (absl::Status status = ValidateRequests(*requests, TraceLimitsFor(config));
      !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "workload ", workload, " does not fit the flags: ", status.message(),
        WorkloadNeeds(workload, config.kv)));
  }
  return requests;
}

// The KV event publisher the flags ask for, or null.
absl::StatusOr<std::unique_ptr<KvEventPublisher>> PublisherFromFlags(
    int32_t page_size, HashAlgorithm hash_algorithm,
    const std::vector<KvCacheGroupSpec>& groups) {
  KvEventPublisherOptions options;
  options.hash_algorithm = hash_algorithm;
  options.kv_cache_groups = groups;
  options.endpoint = absl::GetFlag(FLAGS_kv_events);
  options.replay_endpoint = absl::GetFlag(FLAGS_kv_events_replay);
  options.block_size = page_size;
  options.cpu = absl::GetFlag(FLAGS_kv_events_cpu);
  options.poll_interval =
      absl::Microseconds(absl::GetFlag(FLAGS_kv_events_poll_us));
  options.max_queued_bytes = absl::GetFlag(FLAGS_kv_events_max_queued_bytes);
  // Each flag checked whatever the endpoint (discard and off included), and
  // named: the publisher's own checks would name --kv_events.
  const int32_t poll_us = absl::GetFlag(FLAGS_kv_events_poll_us);
  if (poll_us < 10 || poll_us > 1000000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv_events_poll_us must be in [10, 1000000], got ", poll_us));
  }
  if (options.cpu < -1 || options.cpu >= CPU_SETSIZE) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv_events_cpu must be -1 or in [0, ", CPU_SETSIZE,
                     "), got ", options.cpu));
  }
  if (options.max_queued_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv_events_max_queued_bytes must be at least 0, got ",
                     options.max_queued_bytes));
  }
  const int32_t wait_ms = absl::GetFlag(FLAGS_kv_events_wait_ms);
  if (wait_ms < 0 || wait_ms > 60000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv_events_wait_ms must be in [0, 60000], got ", wait_ms));
  }
  const std::string encoding = absl::GetFlag(FLAGS_kv_events_encoding);
  if (encoding == "array") {
    options.encoding = KvEventPublisherOptions::Encoding::kTaggedArray;
  } else if (encoding != "map") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv_events_encoding must be map or array, got '", encoding, "'"));
  }
  const std::string hashes = absl::GetFlag(FLAGS_kv_events_hashes);
  if (hashes == "bytes") {
    options.hash_form = KvEventPublisherOptions::HashForm::kBytes;
  } else if (hashes != "int64") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv_events_hashes must be int64 or bytes, got '", hashes, "'"));
  }
  if (options.endpoint.empty() || options.endpoint == "discard") {
    if (!options.replay_endpoint.empty()) {
      return absl::InvalidArgumentError(
          "--kv_events_replay needs a --kv_events endpoint");
    }
    return nullptr;
  }
  absl::StatusOr<std::unique_ptr<KvEventPublisher>> publisher =
      KvEventPublisher::Create(options);
  // An endpoint that cannot be bound is its flag's fault; the publisher's
  // message names the option (endpoint or replay_endpoint).
  if (!publisher.ok()) {
    const absl::string_view message = publisher.status().message();
    return absl::InvalidArgumentError(absl::StrCat(
        absl::StrContains(message, "replay_endpoint") ? "--kv_events_replay: "
                                                      : "--kv_events: ",
        message));
  }
  return publisher;
}

absl::StatusOr<std::unique_ptr<Device>> DeviceFromFlags() {
  const std::string device = absl::GetFlag(FLAGS_device);
  if (device == "host") return Device::Host();
  if (device == "cuda") return Device::Cuda(0);
  if (device == "auto") {
    absl::StatusOr<std::unique_ptr<Device>> cuda = Device::Cuda(0);
    if (cuda.ok()) return cuda;
    return Device::Host();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--device must be auto, host or cuda, got '", device, "'"));
}

int Main() {
  absl::StatusOr<SchedulerConfig> config = ConfigFromFlags();
  if (!config.ok()) return Fail(kExitBadInput, config.status());
  const bool serve = absl::GetFlag(FLAGS_serve);
  if (serve && (!absl::GetFlag(FLAGS_trace).empty() ||
                !absl::GetFlag(FLAGS_workload).empty() ||
                !absl::GetFlag(FLAGS_write_trace).empty())) {
    return Fail(kExitBadInput,
                absl::InvalidArgumentError(
                    "--serve excludes --trace, --workload and --write_trace"));
  }
  const int32_t metrics_port = absl::GetFlag(FLAGS_metrics_port);
  if (metrics_port != -1 && !serve) {
    return Fail(kExitBadInput,
                absl::InvalidArgumentError(absl::StrCat(
                    "--metrics_port needs --serve (a run of a trace or a "
                    "workload ends before a scrape), got --metrics_port=",
                    metrics_port)));
  }
  std::string source = "requests served on stdin";
  absl::StatusOr<std::vector<Request>> requests =
      serve ? std::vector<Request>() : RequestsFromFlags(*config, source);
  if (!requests.ok()) {
    const absl::StatusCode code = requests.status().code();
    return Fail(code == absl::StatusCode::kInvalidArgument ||
                        code == absl::StatusCode::kNotFound
                    ? kExitBadInput
                    : kExitFailure,
                requests.status());
  }
  if (const std::string path = absl::GetFlag(FLAGS_write_trace);
      !path.empty()) {
    // It writes the trace and exits: the run's outputs would never come.
    for (const auto& [flag, value] :
         {std::pair{"--json", absl::GetFlag(FLAGS_json)},
          std::pair{"--timeline", absl::GetFlag(FLAGS_timeline)},
          std::pair{"--plot", absl::GetFlag(FLAGS_plot)}}) {
      if (!value.empty()) {
        return Fail(kExitBadInput,
                    absl::InvalidArgumentError(absl::StrCat(
                        "--write_trace writes the trace without a run: ", flag,
                        " would never be written")));
      }
    }
    if (absl::Status status = CheckWritable(path); !status.ok()) {
      return Fail(kExitBadInput, status);
    }
    absl::Status status = WriteToFile(
        path, [&](std::ostream& out) { WriteTrace(*requests, out); });
    if (!status.ok()) return Fail(kExitFailure, status);
    // On stderr: the trace may be written to standard output.
    std::cerr << "kvblock-sim: wrote " << requests->size() << " requests of "
              << source << " to " << path << '\n';
    return 0;
  }
  // Every output path, before the run: a path that cannot be written is
  // bad input, found at once.
  for (const std::string& path :
       {absl::GetFlag(FLAGS_json), absl::GetFlag(FLAGS_timeline),
        absl::GetFlag(FLAGS_plot)}) {
    if (path.empty()) continue;
    if (absl::Status status = CheckWritable(path); !status.ok()) {
      return Fail(kExitBadInput, status);
    }
  }
  absl::StatusOr<std::unique_ptr<Device>> device = DeviceFromFlags();
  if (!device.ok()) {
    return Fail(device.status().code() == absl::StatusCode::kInvalidArgument
                    ? kExitBadInput
                    : kExitFailure,
                device.status());
  }
  absl::StatusOr<std::unique_ptr<KvEventPublisher>> publisher =
      PublisherFromFlags(config->kv.page_size, config->manager.hash_algorithm,
                         config->manager.kv_cache_groups);
  if (!publisher.ok()) {
    return Fail(publisher.status().code() == absl::StatusCode::kInvalidArgument
                    ? kExitBadInput
                    : kExitFailure,
                publisher.status());
  }
  if (*publisher != nullptr) {
    const int32_t wait_ms = absl::GetFlag(FLAGS_kv_events_wait_ms);
    // Said once bound, before the wait, so that subscribers of a "*" port
    // know where to connect.
    std::cerr << "kvblock-sim: kv events on " << (*publisher)->endpoint();
    if (!(*publisher)->replay_endpoint().empty()) {
      std::cerr << ", replay on " << (*publisher)->replay_endpoint();
    }
    std::cerr << std::endl;
    std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
  }
  // A record per step only for the outputs that draw it: a long --serve
  // run without them keeps none.
  config->keep_timeline = !absl::GetFlag(FLAGS_timeline).empty() ||
                          !absl::GetFlag(FLAGS_plot).empty();
  if (absl::GetFlag(FLAGS_kv_events) == "discard") {
    // What recording and taking the events after every step cost the
    // scheduler's thread, without a publisher's threads beside it.
    config->kv_event_sink.publish = [](KvEventBatch& batch) { batch.Clear(); };
  } else if (*publisher != nullptr) {
    KvEventPublisher* const p = publisher->get();
    // A full queue drops: counted.
    config->kv_event_sink.publish = [p](KvEventBatch& batch) {
      p->Publish(batch);
    };
    config->kv_event_sink.ready = [p] { return p->idle(); };
  }
  absl::StatusOr<std::unique_ptr<Scheduler>> scheduler =
      Scheduler::Create(*config, **device);
  if (!scheduler.ok()) {
    // A geometry the library refuses, or that needs more memory than the
    // machine has, is bad input: the flags ask for it.
    const absl::StatusCode code = scheduler.status().code();
    return Fail(code == absl::StatusCode::kInvalidArgument ||
                        code == absl::StatusCode::kResourceExhausted
                    ? kExitBadInput
                    : kExitFailure,
                scheduler.status());
  }

  std::unique_ptr<MetricsServer> metrics_server;
  if (metrics_port != -1) {
    absl::StatusOr<std::unique_ptr<MetricsServer>> started =
        MetricsServer::Start(metrics_port);
    if (!started.ok()) {
      return Fail(started.status().code() == absl::StatusCode::kInvalidArgument
                      ? kExitBadInput
                      : kExitFailure,
                  started.status());
    }
    metrics_server = *std::move(started);
    std::cerr << "kvblock-sim: metrics on http://127.0.0.1:"
              << metrics_server->port() << "/metrics" << std::endl;
  }
  // The metrics of the steps done, before each horizon's state line.
  const auto refresh_metrics = [&] {
    KvEventPublisherStats events;
    if (*publisher != nullptr) events = (*publisher)->stats();
    absl::StatusOr<std::vector<Metric>> metrics = CollectMetrics(
        {.manager = &(*scheduler)->manager(),
         .page_table = &(*scheduler)->page_table(),
         .kv_events = *publisher != nullptr ? &events : nullptr});
    absl::StatusOr<std::string> text =
        metrics.ok()
            ? FormatPrometheusText(
                  *metrics, {{"model_name", "kvblock-sim"}, {"engine", "0"}})
            : metrics.status();
    metrics_server->Set(
        text.ok() ? *std::move(text)
                  : absl::StrCat("# ", text.status().ToString(), "\n"));
  };

  ProgressLine progress(std::cerr, isatty(STDERR_FILENO) != 0,
                        std::chrono::milliseconds(250));
  const auto update = [&](const Progress& p) { progress.Update(p); };
  LineFeed feed(std::cin, std::cout, TraceLimitsFor(*config),
                metrics_server != nullptr
                    ? std::function<void()>(refresh_metrics)
                    : std::function<void()>());
  absl::StatusOr<SimResult> result = serve
                                         ? (*scheduler)->Serve(feed, update)
                                         : (*scheduler)->Run(*requests, update);
  progress.Finish();
  if (!result.ok()) {
    // A bad line of the router's input is bad input.
    return Fail(result.status().code() == absl::StatusCode::kInvalidArgument
                    ? kExitBadInput
                    : kExitFailure,
                result.status());
  }
  if (*publisher != nullptr) {
    // What the thread has left to send, then its counts.
    (*publisher)->Flush(absl::Seconds(10));
    const KvEventPublisherStats stats = (*publisher)->stats();
    result->kv_events.batches_published = stats.batches_published;
    result->kv_events.events_published = stats.events_published;
    result->kv_events.batches_dropped = stats.batches_dropped;
    result->kv_events.batches_unsent = stats.batches_unsent;
    result->kv_events.publisher_thread_ns = stats.thread_cpu_ns;
    result->kv_events.endpoint = (*publisher)->endpoint();
    result->kv_events.replay_endpoint = (*publisher)->replay_endpoint();
  }

  // A model with a window group is run again with every group full
  // attention: the pages the same trace would hold without windows.
  if (!serve && HasWindowGroup(config->manager.kv_cache_groups)) {
    SchedulerConfig full = *config;
    full.manager.kv_cache_groups =
        AllFullAttention(config->manager.kv_cache_groups);
    full.kv_event_sink = {};
    full.keep_timeline = false;
    absl::StatusOr<std::unique_ptr<Scheduler>> shadow =
        Scheduler::Create(full, **device);
    absl::StatusOr<SimResult> compared =
        shadow.ok() ? (*shadow)->Run(*requests, [](const Progress&) {})
                    : shadow.status();
    if (!compared.ok()) return Fail(kExitFailure, compared.status());
    result->full_attention =
        FullAttentionRun{.peak_pages_used = compared->peak_pages_used,
                         .preemptions = compared->preemptions,
                         .prefix_hit_tokens = compared->prefix_hit_tokens,
                         .steps = compared->steps};
  }

  const RunSetup setup{.source = source,
                       .device = std::string((*device)->name()),
                       .config = *config};
  PrintReport(*result, setup, std::cout);
  std::vector<absl::Status> writes;
  if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    writes.push_back(WriteToFile(path, [&](std::ostream& out) {
      WriteJsonReport(*result, setup, out);
    }));
  }
  if (const std::string path = absl::GetFlag(FLAGS_timeline); !path.empty()) {
    writes.push_back(WriteToFile(path, [&](std::ostream& out) {
      WriteTimelineCsv(result->timeline, out);
    }));
  }
  if (const std::string path = absl::GetFlag(FLAGS_plot); !path.empty()) {
    writes.push_back(WriteToFile(path, [&](std::ostream& out) {
      WriteSvgChart(result->timeline, result->num_pages, DescribeRun(setup),
                    out);
    }));
  }
  // The text report is the run's output: one that could not be written
  // (a full disk, a closed pipe) fails the run.
  if (!std::cout.flush()) {
    writes.push_back(
        absl::DataLossError("cannot write the report to standard output"));
  }
  int code = 0;
  for (const absl::Status& status : writes) {
    if (!status.ok()) code = Fail(kExitFailure, status);
  }
  return code;
}

}  // namespace
}  // namespace kvblock::sim

int main(int argc, char** argv) {
  // A reader that goes away (a router that exits) fails the next write,
  // which --serve reports (exit 1), instead of killing the process.
  std::signal(SIGPIPE, SIG_IGN);
  if (const std::optional<int> exit_code = kvblock::cli::ParseFlags(
          argc, argv, "kvblock-sim",
          "replays a trace or a built-in workload through a "
          "continuous-batching "
          "scheduler driving the kvblock library, and reports prefix hits, "
          "pages "
          "in use, evictions, preemptions, copy-on-write copies, queueing and "
          "host time.\n"
          "  kvblock-sim                         the mixed workload\n"
          "  kvblock-sim --workload=beam --json=report.json\n"
          "  kvblock-sim --trace=requests.jsonl --pages=2048 --timeline=t.csv\n"
          "The trace format, every flag and every report field: "
          "tools/sim/README.md.\n"
          "Exit codes: 0 ok, 1 run-time failure, 2 bad input (flags included).",
          "sim/sim_main.cc", std::cout, std::cerr)) {
    return *exit_code;
  }
  return kvblock::sim::Main();
}
