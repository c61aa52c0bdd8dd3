// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "sim/trace.h"

#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace kvblock::sim {
namespace {

constexpr TraceLimits kLimits{.max_tokens_per_seq = 64, .max_samples = 8};

absl::StatusOr<std::vector<Request>> Parse(const std::string& text) {
  std::istringstream in(text);
  return ParseTrace(in, kLimits);
}

TEST_CASE("a trace line with every field parses") {
  const auto requests = Parse(
      R"({"id": "r1", "arrival": 5, "prompt": [1, 2, 3], "max_tokens": 8, )"
      R"("n": 2, "output": [7, 8], "cache_salt": "tenant-a"})"
      "\n");
  REQUIRE_OK(requests);
  REQUIRE(requests->size() == 1);
  const Request& r = (*requests)[0];
  REQUIRE(r.id == "r1");
  REQUIRE(r.arrival == 5);
  REQUIRE(r.prompt == std::vector<TokenId>{1, 2, 3});
  REQUIRE(r.max_tokens == 8);
  REQUIRE(r.n == 2);
  REQUIRE(r.beam == 1);
  REQUIRE(r.output == std::vector<TokenId>{7, 8});
  REQUIRE(r.cache_salt == "tenant-a");
}

TEST_CASE(
    "optional fields default, unknown fields and blank lines are skipped") {
  const auto requests = Parse(
      "\n"
      R"({"id": "a", "prompt": [4], "max_tokens": 1, "temperature": 0.7})"
      "\n   \r\n"
      R"({"id": "b", "prompt": [5, 6], "max_tokens": 2, "beam": 3})"
      "\r\n");
  REQUIRE_OK(requests);
  REQUIRE(requests->size() == 2);
  const Request& a = (*requests)[0];
  REQUIRE(a.arrival == 0);
  REQUIRE(a.n == 1);
  REQUIRE(a.beam == 1);
  REQUIRE(a.output.empty());
  REQUIRE(a.cache_salt.empty());
  REQUIRE((*requests)[1].beam == 3);
}

TEST_CASE("every malformed line is an error naming its line and field") {
  struct Case {
    const char* line;
    const char* field;  // expected in the message after "line 2: ".
  };
  const Case cases[] = {
      {R"({"id": "x", "prompt": [1], "max_tokens": 1)", "bad JSON at byte 43"},
      {R"({"id": "x", "prompt": [1], "max_tokens": 1e400})",
       "bad JSON: [json.exception.out_of_range.406] number overflow"},
      {R"({"id": "x", "prompt": [1], "max_tokens": 1, "id": "y"})",
       R"("id": the member is repeated)"},
      {R"({"id": "x", "prompt": [1], "max_tokens": 1, "max_tokens": 2})",
       R"("max_tokens": the member is repeated)"},
      {R"({"id": "x", "prompt": [1], "max_tokens": 18446744073709551616})",
       "max_tokens: 1.8446744073709552e+19 is absurd"},
      {R"({"id": "x", "prompt": [-9223372036854775809], "max_tokens": 1})",
       "prompt[0]: -9.223372036854776e+18 is absurd"},
      {R"([1, 2, 3])", "expected a JSON object"},
      {R"({"prompt": [1], "max_tokens": 1})", "id: missing"},
      {R"({"id": 7, "prompt": [1], "max_tokens": 1})", "id: expected a string"},
      {R"({"id": "", "prompt": [1], "max_tokens": 1})",
       "id: must not be empty"},
      {R"({"id": "x", "max_tokens": 1})", "prompt: missing"},
      {R"({"id": "x", "prompt": "1 2", "max_tokens": 1})",
       "prompt: expected an array"},
      {R"({"id": "x", "prompt": [], "max_tokens": 1})",
       "prompt: must not be empty"},
      {R"({"id": "x", "prompt": [1, "2"], "max_tokens": 1})",
       "prompt[1]: expected an integer"},
      {R"({"id": "x", "prompt": [1, -2], "max_tokens": 1})",
       "prompt[1]: token -2 is negative"},
      {R"({"id": "x", "prompt": [1.5], "max_tokens": 1})",
       "prompt[0]: expected an integer"},
      {R"({"id": "x", "prompt": [4294967296], "max_tokens": 1})",
       "prompt[0]: 4294967296 is absurd"},
      {R"({"id": "x", "prompt": [1]})", "max_tokens: missing"},
      {R"({"id": "x", "prompt": [1], "max_tokens": 0})",
       "max_tokens: 0 is less than 1"},
      {R"({"id": "x", "prompt": [1], "max_tokens": -3})",
       "max_tokens: -3 is less than 1"},
      {R"({"id": "x", "prompt": [1], "max_tokens": "8"})",
       "max_tokens: expected an integer"},
      {R"({"id": "x", "prompt": [1], "max_tokens": 18446744073709551615})",
       "max_tokens: 18446744073709551615 is absurd"},
      {R"({"id": "x", "prompt": [1], "max_tokens": 64})",
       "max_tokens: 64 after a prompt of 1 tokens exceeds the 64"},
      {R"({"id": "x", "prompt": [1], "max_tokens": 1, "arrival": -1})",
       "arrival: -1 is negative"},
      {R"({"id": "x", "prompt": [1], "max_tokens": 1, "arrival": 4000000000000})",
       "arrival: 4000000000000 is absurd"},
      {R"({"id": "x", "prompt": [1], "max_tokens": 1, "arrival": 1e3})",
       "arrival: expected an integer"},
      {R"({"id": "x", "prompt": [1], "max_tokens": 1, "n": 0})",
       "n: 0 is less than 1"},
      {R"({"id": "x", "prompt": [1], "max_tokens": 1, "n": 9})",
       "n: 9 exceeds the batch of 8"},
      {R"({"id": "x", "prompt": [1], "max_tokens": 1, "n": 3000000000})",
       "n: 3000000000 is absurd"},
      {R"({"id": "x", "prompt": [1], "max_tokens": 1, "beam": -4})",
       "beam: -4 is less than 1"},
      {R"({"id": "x", "prompt": [1], "max_tokens": 1, "beam": 2, "n": 2})",
       "beam: width 2 with n 2"},
      {R"({"id": "x", "prompt": [1], "max_tokens": 1, "output": [3, 4]})",
       "output: 2 tokens exceed max_tokens 1"},
      {R"({"id": "x", "prompt": [1], "max_tokens": 2, "output": [-3]})",
       "output[0]: token -3 is negative"},
      {R"({"id": "x", "prompt": [1], "max_tokens": 2, "output": 3})",
       "output: expected an array"},
      {R"({"id": "x", "prompt": [1], "max_tokens": 1, "cache_salt": 5})",
       "cache_salt: expected a string"},
      {R"({"id": "first", "prompt": [1], "max_tokens": 1})",
       "id: \"first\" duplicates line 1"},
  };
  for (const Case& c : cases) {
    const std::string text =
        std::string(R"({"id": "first", "prompt": [9], "max_tokens": 1})") +
        "\n" + c.line + "\n" +
        R"({"id": "last", "prompt": [9], "max_tokens": 1})" + "\n";
    const auto requests = Parse(text);
    INFO(c.line << " -> " << requests.status().ToString());
    REQUIRE_STATUS_IS(requests, kInvalidArgument);
    REQUIRE(requests.status().message().find(
                std::string("line 2: ") + c.field) != absl::string_view::npos);
  }
}

TEST_CASE("a message cuts a long value between characters") {
  // 30 two-byte characters: the 40-byte cut falls after the 19th.
  std::string value;
  for (int i = 0; i < 30; ++i) value += "\xc3\xa9";
  const auto requests =
      Parse(R"({"id": "x", "prompt": [1], "max_tokens": ")" + value + "\"}\n");
  REQUIRE_STATUS_IS(requests, kInvalidArgument);
  const std::string message(requests.status().message());
  INFO(message);
  REQUIRE(message.find("max_tokens: expected an integer, got \"" +
                       value.substr(0, 38) + "...") != std::string::npos);
}

TEST_CASE("a deeply nested value is an error, not a stack overflow") {
  // 100,000 nested arrays: the message must describe the value without
  // walking it (json::dump recursed once per level and overflowed).
  for (const char* field : {"prompt", "output", "id", "max_tokens"}) {
    std::string line = R"({"id": "x", "prompt": [1], "max_tokens": 2, ")";
    line += field;
    line += R"(": )";
    line += std::string(100'000, '[') + std::string(100'000, ']') + "}\n";
    const auto requests = Parse(line);
    INFO(field << " -> " << requests.status().ToString().substr(0, 200));
    REQUIRE_STATUS_IS(requests, kInvalidArgument);
    REQUIRE(requests.status().message().find("line 1: ") !=
            absl::string_view::npos);
    REQUIRE(requests.status().message().size() < 200);
  }
  const auto deep_token =
      Parse(R"({"id": "x", "max_tokens": 2, "prompt": [1, )" +
            std::string(50'000, '[') + std::string(50'000, ']') + "]}\n");
  REQUIRE_STATUS_IS(deep_token, kInvalidArgument);
  REQUIRE(deep_token.status().message().find(
              "prompt[1]: expected an integer, got an array of 1 elements") !=
          absl::string_view::npos);
}

TEST_CASE("a prompt longer than a sequence names the prompt") {
  std::string tokens = "0";
  for (int i = 1; i < 65; ++i) tokens += ",0";
  const auto requests =
      Parse(R"({"id": "long", "max_tokens": 1, "prompt": [)" + tokens + "]}\n");
  REQUIRE_STATUS_IS(requests, kInvalidArgument);
  REQUIRE(requests.status().message().find(
              "line 1: prompt: 65 tokens exceed the 64 tokens") !=
          absl::string_view::npos);
}

TEST_CASE("line numbers count blank lines") {
  const auto requests = Parse(R"({"id": "a", "prompt": [1], "max_tokens": 1})"
                              "\n\n\n"
                              R"({"id": "b", "prompt": [1], "max_tokens": 0})"
                              "\n");
  REQUIRE_STATUS_IS(requests, kInvalidArgument);
  REQUIRE(requests.status().message().find("line 4: max_tokens") !=
          absl::string_view::npos);
}

TEST_CASE("written traces parse back equal") {
  std::vector<Request> requests(3);
  requests[0] = {
      .id = "plain", .arrival = 0, .prompt = {1, 2}, .max_tokens = 3};
  requests[1] = {.id = "samples \"quoted\"",
                 .arrival = 7,
                 .prompt = {0, 31999},
                 .max_tokens = 4,
                 .n = 4,
                 .output = {5, 6},
                 .cache_salt = "tenant\n1"};
  requests[2] = {
      .id = "beams", .arrival = 9, .prompt = {3}, .max_tokens = 2, .beam = 4};
  std::ostringstream out;
  WriteTrace(requests, out);
  const auto parsed = Parse(out.str());
  REQUIRE_OK(parsed);
  REQUIRE(*parsed == requests);
}

TEST_CASE("ValidateRequests names the request and finds duplicate ids") {
  std::vector<Request> requests(2);
  requests[0] = {.id = "a", .prompt = {1}, .max_tokens = 1};
  requests[1] = {.id = "b", .prompt = {1}, .max_tokens = 0};
  absl::Status status = ValidateRequests(requests, kLimits);
  REQUIRE_STATUS_IS(status, kInvalidArgument);
  REQUIRE(status.message().find("request 'b' (#1): max_tokens") !=
          absl::string_view::npos);
  requests[1] = requests[0];
  status = ValidateRequests(requests, kLimits);
  REQUIRE_STATUS_IS(status, kInvalidArgument);
  REQUIRE(
      status.message().find("request 'a' (#1): id: duplicates request #0") !=
      absl::string_view::npos);
  requests[1].id = "c";
  REQUIRE_OK(ValidateRequests(requests, kLimits));
}

TEST_CASE("generated tokens follow the output, then a fixed function") {
  const Request request = {
      .id = "r", .prompt = {1}, .max_tokens = 8, .output = {11, 12}};
  REQUIRE(GeneratedToken(request, 0, 0) == 11);
  REQUIRE(GeneratedToken(request, 0, 1) == 12);
  // Other samples ignore the output.
  REQUIRE(GeneratedToken(request, 1, 0) != 11);
  // Pinned values: the function must not change between versions, so traces
  // replay the same on every machine.
  REQUIRE(GeneratedToken(request, 0, 2) == GeneratedToken(request, 0, 2));
  Request other = request;
  other.id = "s";
  int differing = 0;
  for (int64_t position = 2; position < 8; ++position) {
    const TokenId token = GeneratedToken(request, 0, position);
    REQUIRE(token >= 0);
    REQUIRE(token < kGeneratedVocab);
    differing += token != GeneratedToken(other, 0, position);
    differing += token != GeneratedToken(request, 1, position);
  }
  REQUIRE(differing >= 10);
}

TEST_CASE("trace files: a missing one is NotFound, errors name the path") {
  const auto missing =
      ReadTraceFile("/nonexistent/kvblock/trace.jsonl", kLimits);
  REQUIRE_STATUS_IS(missing, kNotFound);
  REQUIRE(missing.status().message().find("/nonexistent/kvblock/trace.jsonl") !=
          absl::string_view::npos);

  const std::string path = "sim_trace_test.jsonl";
  {
    std::ofstream out(path);
    out << R"({"id": "a", "prompt": [1], "max_tokens": 1})"
        << "\n"
        << R"({"id": "b", "prompt": [1], "max_tokens": 1, "n": 0})"
        << "\n";
  }
  const auto bad = ReadTraceFile(path, kLimits);
  REQUIRE_STATUS_IS(bad, kInvalidArgument);
  REQUIRE(bad.status().message() ==
          "sim_trace_test.jsonl: line 2: n: 0 is less than 1");
  std::remove(path.c_str());
}

TEST_CASE("ParseTraceLine: blank, a request, or run_until where allowed") {
  const auto blank = ParseTraceLine(" \t", kLimits, true);
  REQUIRE_OK(blank);
  REQUIRE(!blank->request.has_value());
  REQUIRE(!blank->run_until.has_value());
  const auto request = ParseTraceLine(
      R"({"id": "a", "prompt": [1], "max_tokens": 2})", kLimits, true);
  REQUIRE_OK(request);
  REQUIRE(request->request->id == "a");
  REQUIRE(!request->run_until.has_value());
  const auto control = ParseTraceLine(R"({"run_until": 9})", kLimits, true);
  REQUIRE_OK(control);
  REQUIRE(control->run_until == std::optional<int64_t>(9));
  REQUIRE(!control->request.has_value());
  // In a trace, a control line is a request without its fields.
  const auto in_trace = ParseTraceLine(R"({"run_until": 9})", kLimits, false);
  REQUIRE_STATUS_IS(in_trace, kInvalidArgument);
  REQUIRE(in_trace.status().message() == "id: missing");
  const auto too_long = ParseTraceLine(
      R"({"id": "a", "prompt": [1], "max_tokens": 64})", kLimits, true);
  REQUIRE_STATUS_IS(too_long, kInvalidArgument);
  REQUIRE_THAT(std::string(too_long.status().message()),
               Catch::Matchers::Contains("max_tokens: 64 after a prompt"));
}

}  // namespace
}  // namespace kvblock::sim
