// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "kvblock/kv_events.h"

#include <memory>
#include <vector>

#include "cache/cache_event_log.h"

namespace kvblock {

// Its log comes with the first TakeKvEvents: a batch never taken into
// allocates nothing.
KvEventBatch::KvEventBatch() = default;
KvEventBatch::KvEventBatch(KvEventBatch&&) noexcept = default;
KvEventBatch& KvEventBatch::operator=(KvEventBatch&&) noexcept = default;
KvEventBatch::~KvEventBatch() = default;

// Without a log (new or moved from) a batch is empty.
bool KvEventBatch::empty() const { return log_ == nullptr || log_->empty(); }

int64_t KvEventBatch::num_changes() const {
  return log_ == nullptr ? 0 : log_->num_records();
}

void KvEventBatch::AppendTo(std::vector<KvCacheEvent>& out) const {
  if (log_ != nullptr) log_->AppendEventsTo(out);
}

void KvEventBatch::Clear() {
  if (log_ != nullptr) log_->Clear();
}

}  // namespace kvblock
