// Copyright 2026 The kvblock Authors.
#include "kvblock/kv_events.h"

#include <memory>
#include <vector>

#include "cache_event_log.h"

namespace kvblock {

KvEventBatch::KvEventBatch()
    : log_(std::make_unique<internal::CacheEventLog>()) {}
KvEventBatch::KvEventBatch(KvEventBatch&&) noexcept = default;
KvEventBatch& KvEventBatch::operator=(KvEventBatch&&) noexcept = default;
KvEventBatch::~KvEventBatch() = default;

// A moved-from batch has no log: it is empty.
bool KvEventBatch::empty() const { return log_ == nullptr || log_->empty(); }

int64_t KvEventBatch::num_changes() const {
  return log_ == nullptr ? 0 : log_->num_records();
}

void KvEventBatch::AppendTo(std::vector<KvCacheEvent>& out) const {
  if (log_ != nullptr) log_->AppendEventsTo(page_size_, out);
}

void KvEventBatch::Clear() {
  if (log_ != nullptr) log_->Clear();
}

}  // namespace kvblock
