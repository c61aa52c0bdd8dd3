// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Fuzzes kvblock-sim's trace parser with arbitrary bytes: it must return
// requests or an InvalidArgument naming a line, never crash, hang or leak;
// what it accepts must pass ValidateRequests and round-trip through
// WriteTrace and ParseTrace unchanged.
#include <cstdint>
#include <sstream>
#include <string>

#include "fuzz_input.h"
#include "sim/trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const kvblock::sim::TraceLimits limits{.max_tokens_per_seq = 256,
                                         .max_samples = 8};
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  const absl::StatusOr<std::vector<kvblock::sim::Request>> requests =
      kvblock::sim::ParseTrace(in, limits);
  if (!requests.ok()) {
    FUZZ_CHECK(requests.status().code() == absl::StatusCode::kInvalidArgument,
               requests.status().ToString());
    FUZZ_CHECK(requests.status().message().find("line ") == 0,
               requests.status().ToString());
    FUZZ_CHECK(requests.status().message().size() < 1000,
               "an error message of unbounded size");
    return 0;
  }
  FUZZ_CHECK(kvblock::sim::ValidateRequests(*requests, limits).ok(),
             "an accepted trace fails ValidateRequests");
  std::stringstream written;
  kvblock::sim::WriteTrace(*requests, written);
  const absl::StatusOr<std::vector<kvblock::sim::Request>> again =
      kvblock::sim::ParseTrace(written, limits);
  FUZZ_CHECK(again.ok(), again.status().ToString());
  FUZZ_CHECK(*again == *requests, "a written trace parses back different");
  return 0;
}
