// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Status plumbing for kvblock and its users: Debian's Abseil 20220623 ships
// no RETURN_IF_ERROR or ASSIGN_OR_RETURN, so kvblock defines its own, once,
// here, with a KVBLOCK_ prefix that cannot clash with another library's.
//
// Thread safety: macros; nothing here has state.
#ifndef KVBLOCK_STATUS_MACROS_H_
#define KVBLOCK_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define KVBLOCK_CONCAT_INNER_(a, b) a##b
#define KVBLOCK_CONCAT_(a, b) KVBLOCK_CONCAT_INNER_(a, b)

// Returns the status of `expr` from the enclosing function when it is an error.
#define KVBLOCK_RETURN_IF_ERROR(expr)                                     \
  do {                                                                    \
    if (::absl::Status kvblock_status_ = (expr); !kvblock_status_.ok()) { \
      return kvblock_status_;                                             \
    }                                                                     \
  } while (false)

// `KVBLOCK_ASSIGN_OR_RETURN(auto x, MakeX());` declares `x` from an
// absl::StatusOr or returns its error from the enclosing function.
#define KVBLOCK_ASSIGN_OR_RETURN(lhs, expr)                                   \
  KVBLOCK_ASSIGN_OR_RETURN_IMPL_(KVBLOCK_CONCAT_(kvblock_or_, __LINE__), lhs, \
                                 expr)

#define KVBLOCK_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.ok()) return std::move(tmp).status();       \
  lhs = std::move(tmp).value()

#endif  // KVBLOCK_STATUS_MACROS_H_
