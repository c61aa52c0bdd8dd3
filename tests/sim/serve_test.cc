// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "sim/serve.h"

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "kvblock/device.h"
#include "sim/scheduler.h"
#include "sim/trace.h"
#include "sim/workloads.h"
#include "test_util.h"

namespace kvblock::sim {
namespace {

constexpr TraceLimits kLimits{.max_tokens_per_seq = 64, .max_samples = 8};

constexpr char kRequest[] =
    R"({"id": "a", "arrival": 2, "prompt": [1, 2, 3], "max_tokens": 4})";

FeedReport ReportAt(int64_t clock) {
  return {.clock = clock,
          .kv_event_batches = 3,
          .running = 2,
          .waiting = 1,
          .completed = 5,
          .rejected = 0,
          .finished_ids = {}};
}

TEST_CASE("a window of requests is handed over at its run_until") {
  std::istringstream in(std::string(kRequest) + "\n\n" +
                        R"({"id": "b", "arrival": 7, "prompt": [4], )"
                        R"("max_tokens": 1})"
                        "\n{\"run_until\": 8}\n");
  std::ostringstream out;
  LineFeed feed(in, out, kLimits);
  std::deque<Request> arrivals;
  const auto horizon = feed.Next(ReportAt(0), arrivals);
  REQUIRE_OK(horizon);
  REQUIRE(*horizon == std::optional<int64_t>(8));
  REQUIRE(arrivals.size() == 2);
  REQUIRE(arrivals[0].id == "a");
  REQUIRE(arrivals[1].arrival == 7);
  // The state goes out before the input is read, one JSON line.
  REQUIRE(out.str() ==
          "{\"clock\":0,\"kv_event_batches\":3,\"running\":2,"
          "\"waiting\":1,\"completed\":5,\"rejected\":0}\n");
  // End of input ends the feed; what came before it is handed over.
  out.str("");
  std::istringstream tail(
      R"({"id": "c", "arrival": 9, "prompt": [4], "max_tokens": 1})");
  LineFeed last(tail, out, kLimits);
  arrivals.clear();
  const auto ended = last.Next(ReportAt(0), arrivals);
  REQUIRE_OK(ended);
  REQUIRE(!ended->has_value());
  REQUIRE(arrivals.size() == 1);
}

TEST_CASE("bad serve input is refused naming the line; nothing is handed") {
  struct Case {
    std::string input;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"{\"run_until\": 0}\n", "line 1: run_until: 0 does not pass step 0"},
      {std::string(kRequest) + "\n{\"run_until\": 2}\n",
       "line 2: run_until: 2 is not after the arrival of 'a' (step 2)"},
      {"{\"run_until\": -1}\n", "line 1: run_until: -1 is outside"},
      {"{\"run_until\": 5, \"id\": \"x\"}\n",
       "line 1: run_until: a control line holds run_until alone"},
      {"{\"run_until\": \"5\"}\n", "line 1: run_until: expected an integer"},
      {std::string(kRequest) + "\n" + kRequest + "\n",
       "line 2: id: \"a\" is in use: a request with it has not finished"},
      {R"({"id": "b", "arrival": 3, "prompt": [1], "max_tokens": 1})"
       "\n" +
           std::string(kRequest) + "\n",
       "line 2: arrival: 2 is before step 3"},
      {"not json\n", "line 1: bad JSON"},
      {"[1]\n", "line 1: expected a JSON object"},
      {R"({"id": "b", "prompt": [1], "max_tokens": 0})", "line 1: max_tokens"},
  };
  for (const Case& c : cases) {
    INFO(c.input);
    std::istringstream in(c.input);
    std::ostringstream out;
    LineFeed feed(in, out, kLimits);
    std::deque<Request> arrivals;
    const auto horizon = feed.Next(ReportAt(0), arrivals);
    REQUIRE_STATUS_IS(horizon, kInvalidArgument);
    REQUIRE_THAT(std::string(horizon.status().message()),
                 Catch::Matchers::Contains("serve input: " + c.message));
    REQUIRE(arrivals.empty());
  }
  // In a later window: a request before the last horizon, a horizon that
  // does not pass it.
  for (const Case& c :
       std::vector<Case>{{kRequest, "line 2: arrival: 2 is before step 5"},
                         {"{\"run_until\": 5}",
                          "line 2: run_until: 5 does not pass step 5"}}) {
    INFO(c.input);
    std::istringstream in("{\"run_until\": 5}\n" + c.input + "\n");
    std::ostringstream out;
    LineFeed feed(in, out, kLimits);
    std::deque<Request> arrivals;
    REQUIRE_OK(feed.Next(ReportAt(0), arrivals));
    const auto late = feed.Next(ReportAt(5), arrivals);
    REQUIRE_STATUS_IS(late, kInvalidArgument);
    REQUIRE_THAT(std::string(late.status().message()),
                 Catch::Matchers::Contains("serve input: " + c.message));
    REQUIRE(arrivals.empty());
  }
}

SchedulerConfig ServeConfig() {
  SchedulerConfig config;
  config.kv.num_pages = 256;
  config.kv.page_size = 16;
  config.kv.max_batch = 32;
  config.kv.max_pages_per_seq = 64;
  config.kv.num_kv_heads = 1;
  config.kv.head_dim = 8;
  return config;
}

// The requests as a router would feed them: each distinct arrival step's
// requests, then a run_until of the next arrival step.
std::string FeedOf(const std::vector<Request>& requests) {
  std::vector<Request> sorted = requests;
  std::stable_sort(
      sorted.begin(), sorted.end(),
      [](const Request& a, const Request& b) { return a.arrival < b.arrival; });
  std::ostringstream out;
  for (size_t i = 0; i < sorted.size(); ++i) {
    WriteTrace(absl::MakeConstSpan(&sorted[i], 1), out);
    if (i + 1 < sorted.size() && sorted[i + 1].arrival > sorted[i].arrival) {
      out << "{\"run_until\": " << sorted[i + 1].arrival << "}\n";
    }
  }
  return out.str();
}

TEST_CASE("a served run equals the run of the same trace") {
  const auto requests = MakeWorkload("mixed", 2);
  REQUIRE_OK(requests);
  std::unique_ptr<Device> device = Device::Host();
  auto whole = Scheduler::Create(ServeConfig(), *device);
  REQUIRE_OK(whole);
  const auto run = (*whole)->Run(*requests);
  REQUIRE_OK(run);

  auto served = Scheduler::Create(ServeConfig(), *device);
  REQUIRE_OK(served);
  std::istringstream in(FeedOf(*requests));
  std::ostringstream out;
  LineFeed feed(in, out, TraceLimitsFor(ServeConfig()));
  const auto result = (*served)->Serve(feed);
  REQUIRE_OK(result);
  REQUIRE(result->requests == run->requests);
  REQUIRE(result->completed == run->completed);
  REQUIRE(result->timeline == run->timeline);
  REQUIRE(result->prefix_hit_tokens == run->prefix_hit_tokens);
  REQUIRE(result->generated_tokens == run->generated_tokens);
  REQUIRE(result->queue_steps == run->queue_steps);
  REQUIRE_OK((*served)->manager().CheckInvariants());
  REQUIRE((*served)->manager().pool().NumUsed() == 0);
  // One state line before each window: at 0, then at each horizon, each
  // saying the steps before it are done.
  std::istringstream states(out.str());
  std::string line;
  int64_t last_clock = -1;
  int64_t lines = 0;
  constexpr absl::string_view kHead = "{\"clock\":";
  while (std::getline(states, line)) {
    REQUIRE(absl::StartsWith(line, kHead));
    int64_t clock = 0;
    REQUIRE(absl::SimpleAtoi(
        line.substr(kHead.size(), line.find(',') - kHead.size()), &clock));
    REQUIRE(clock > last_clock);
    last_clock = clock;
    ++lines;
  }
  REQUIRE(lines > 1);
  REQUIRE_STATUS_IS((*served)->Serve(feed), kFailedPrecondition);
}

TEST_CASE("a finished request's id may be reused, an unfinished one's not") {
  const std::string again =
      R"({"id": "a", "arrival": 9, "prompt": [4], "max_tokens": 1})";
  std::istringstream in(std::string(kRequest) + "\n{\"run_until\": 5}\n" +
                        again + "\n{\"run_until\": 10}\n" + again + "\n");
  std::ostringstream out;
  LineFeed feed(in, out, kLimits);
  std::deque<Request> arrivals;
  REQUIRE_OK(feed.Next(ReportAt(0), arrivals));
  // "a" has not finished by step 5: a second "a" is refused...
  std::istringstream in2(std::string(kRequest) + "\n{\"run_until\": 5}\n" +
                         again + "\n");
  LineFeed refusing(in2, out, kLimits);
  REQUIRE_OK(refusing.Next(ReportAt(0), arrivals));
  const auto refused = refusing.Next(ReportAt(5), arrivals);
  REQUIRE_STATUS_IS(refused, kInvalidArgument);
  REQUIRE_THAT(std::string(refused.status().message()),
               Catch::Matchers::Contains("line 3: id: \"a\" is in use"));
  // ...and taken once a report says it finished, but not twice in a window.
  const std::vector<std::string> finished = {"a"};
  FeedReport report = ReportAt(5);
  report.finished_ids = finished;
  arrivals.clear();
  const auto reused = feed.Next(report, arrivals);
  REQUIRE_OK(reused);
  REQUIRE(*reused == std::optional<int64_t>(10));
  REQUIRE(arrivals.size() == 1);
  REQUIRE(arrivals[0].arrival == 9);
  REQUIRE_STATUS_IS(feed.Next(ReportAt(10), arrivals), kInvalidArgument);
}

// Requests generated as a served run goes on: `total` of them, one each
// step, a window of 10 at a time, each reusing an id of one finished long
// before (ids cycle over 1,000).
class CountingFeed final : public RequestFeed {
 public:
  explicit CountingFeed(int64_t total) : total_(total) {}
  absl::StatusOr<std::optional<int64_t>> Next(
      const FeedReport& report, std::deque<Request>& arrivals) override {
    finished_ += static_cast<int64_t>(report.finished_ids.size());
    if (next_ == total_) return std::nullopt;
    const int64_t end = std::min(total_, next_ + 10);
    for (; next_ < end; ++next_) {
      arrivals.push_back({.id = "r" + std::to_string(next_ % 1000),
                          .arrival = next_,
                          .prompt = {1, 2, static_cast<TokenId>(next_ % 97)},
                          .max_tokens = 2});
    }
    return end;
  }
  int64_t finished() const { return finished_; }

 private:
  const int64_t total_;
  int64_t next_ = 0;
  int64_t finished_ = 0;
};

TEST_CASE("a served run reports finished ids and keeps no timeline if asked") {
  std::unique_ptr<Device> device = Device::Host();
  SchedulerConfig config = ServeConfig();
  config.keep_timeline = false;
  auto scheduler = Scheduler::Create(config, *device);
  REQUIRE_OK(scheduler);
  CountingFeed feed(5000);
  const auto result = (*scheduler)->Serve(feed);
  REQUIRE_OK(result);
  REQUIRE(result->requests == 5000);
  REQUIRE(result->completed == 5000);
  REQUIRE(result->timeline.empty());
  REQUIRE(result->steps >= 5000);
  REQUIRE(result->queue_steps.count == 5000);
  // Every request but those finishing after the feed ended was reported.
  REQUIRE(feed.finished() > 4990);
  REQUIRE(feed.finished() <= 5000);
}

// A feed that breaks its contract.
class BadFeed final : public RequestFeed {
 public:
  explicit BadFeed(int64_t arrival, int64_t horizon)
      : arrival_(arrival), horizon_(horizon) {}
  absl::StatusOr<std::optional<int64_t>> Next(
      const FeedReport& report, std::deque<Request>& arrivals) override {
    if (report.clock > 0) return std::nullopt;
    arrivals.push_back(
        {.id = "x", .arrival = arrival_, .prompt = {1}, .max_tokens = 1});
    return horizon_;
  }

 private:
  int64_t arrival_;
  int64_t horizon_;
};

TEST_CASE("a feed that breaks its contract ends the run as Internal") {
  std::unique_ptr<Device> device = Device::Host();
  struct Case {
    int64_t arrival;
    int64_t horizon;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {5, 3, "feed: request 'x' arrives at step 5, outside [0, 3)"},
           {0, 0, "feed: horizon 0 does not pass step 0"}}) {
    auto scheduler = Scheduler::Create(ServeConfig(), *device);
    REQUIRE_OK(scheduler);
    BadFeed feed(c.arrival, c.horizon);
    const auto result = (*scheduler)->Serve(feed);
    REQUIRE_STATUS_IS(result, kInternal);
    REQUIRE_THAT(std::string(result.status().message()),
                 Catch::Matchers::Contains(c.message));
  }
}

}  // namespace
}  // namespace kvblock::sim
