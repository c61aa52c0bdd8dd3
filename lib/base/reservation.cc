// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "base/reservation.h"

#include <unistd.h>

namespace kvblock::internal {

absl::Status Reservation::Check() const {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return absl::OkStatus();  // unknown.
  const int64_t memory = static_cast<int64_t>(pages) * page_size;
  if (bytes_ <= memory) return absl::OkStatus();
  return Exhausted(
      absl::StrCat("more than this machine's ", memory, " bytes of memory"));
}

}  // namespace kvblock::internal
