// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Status assertions for Catch2 that print the status on failure.
#ifndef KVBLOCK_TESTS_TEST_UTIL_H_
#define KVBLOCK_TESTS_TEST_UTIL_H_

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "catch.h"
#include "kvblock/types.h"

namespace kvblock::testing {

inline const absl::Status& GetStatus(const absl::Status& status) {
  return status;
}
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

// The length of a randomized run: `ops`, or a quarter of it in a sanitizer
// build (ASan and UBSan make each operation about eight times slower; the
// default build runs every seed at full length).
constexpr int64_t RandomRunLength(int64_t ops) {
#if defined(__SANITIZE_ADDRESS__)
  return ops / 4;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  return ops / 4;
#else
  return ops;
#endif
#else
  return ops;
#endif
}

// `count` consecutive token ids from `first`.
inline std::vector<TokenId> TokenRange(TokenId first, int count) {
  std::vector<TokenId> tokens(count);
  std::iota(tokens.begin(), tokens.end(), first);
  return tokens;
}

}  // namespace kvblock::testing

// REQUIRE that a Status or StatusOr is OK; prints it otherwise.
#define REQUIRE_OK(expr)                                                      \
  do {                                                                        \
    const auto& kvblock_req_ok_ = (expr);                                     \
    INFO(#expr << " -> "                                                      \
               << ::kvblock::testing::GetStatus(kvblock_req_ok_).ToString()); \
    REQUIRE(::kvblock::testing::GetStatus(kvblock_req_ok_).ok());             \
  } while (false)

// REQUIRE that a Status or StatusOr failed with `code` (an absl::StatusCode
// enumerator name such as kInvalidArgument).
#define REQUIRE_STATUS_IS(expr, status_code)                                  \
  do {                                                                        \
    const auto& kvblock_req_st_ = (expr);                                     \
    INFO(#expr << " -> "                                                      \
               << ::kvblock::testing::GetStatus(kvblock_req_st_).ToString()); \
    REQUIRE(::kvblock::testing::GetStatus(kvblock_req_st_).code() ==          \
            ::absl::StatusCode::status_code);                                 \
  } while (false)

#endif  // KVBLOCK_TESTS_TEST_UTIL_H_
