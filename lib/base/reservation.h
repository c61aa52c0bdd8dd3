// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Internal: the memory a factory reserves up front, summed without overflow
// and checked before anything is allocated, so that a config that Validate()
// accepts but no machine can hold is ResourceExhausted, never a crash (a
// reservation that throws, or one the kernel overcommits and kills later).
//
// Usage:
//   Reservation r("block manager");
//   r.Add(sequences, bytes_per_sequence);
//   KVBLOCK_RETURN_IF_ERROR(r.Check());
//   KVBLOCK_RETURN_IF_ERROR(Reservation::Construct([&] { ... }));
//
// Thread safety: a plain value; Check reads the machine's memory size.
#ifndef KVBLOCK_LIB_BASE_RESERVATION_H_
#define KVBLOCK_LIB_BASE_RESERVATION_H_

#include <cstdint>
#include <limits>
#include <new>
#include <stdexcept>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace kvblock::internal {

class Reservation {
 public:
  explicit Reservation(absl::string_view what) : what_(what) {}

  // Adds `count` items of `bytes_each` bytes (both non-negative), saturating
  // at INT64_MAX.
  void Add(int64_t count, int64_t bytes_each) {
    constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
    if (count != 0 && bytes_each > kMax / count) {
      bytes_ = kMax;
      return;
    }
    const int64_t bytes = count * bytes_each;
    bytes_ = bytes > kMax - bytes_ ? kMax : bytes_ + bytes;
  }

  int64_t bytes() const { return bytes_; }

  // ResourceExhausted naming what reserves and how much, when the total
  // exceeds the machine's physical memory.
  absl::Status Check() const;

  // Runs `construct`, turning an allocation that fails anyway (std::bad_alloc
  // or std::length_error, e.g. under a memory limit) into ResourceExhausted.
  template <typename Construct>
  absl::Status Run(Construct&& construct) const {
    try {
      construct();
    } catch (const std::bad_alloc&) {
      return Exhausted("the allocation failed");
    } catch (const std::length_error&) {
      return Exhausted("the allocation failed");
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Exhausted(absl::string_view why) const {
    return absl::ResourceExhaustedError(
        absl::StrCat(what_, ": reserving ", bytes_, " bytes up front: ", why));
  }

  std::string what_;
  int64_t bytes_ = 0;
};

}  // namespace kvblock::internal

#endif  // KVBLOCK_LIB_BASE_RESERVATION_H_
