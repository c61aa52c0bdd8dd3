// Copyright 2026 The kvblock Authors.
#include "cache_event_log.h"

#include <cstddef>
#include <optional>
#include <string>
#include <utility>

namespace kvblock::internal {

void CacheEventLog::Truncate(const Mark& mark) {
  if (mark.runs < runs_.size()) {
    const Run& first_dropped = runs_[mark.runs];
    hashes_.resize(first_dropped.hashes_offset);
    tokens_.resize(first_dropped.tokens_offset);
    salts_.resize(first_dropped.salt_offset);
    runs_.resize(mark.runs);
  }
  records_.resize(mark.records);
  open_run_ = -1;
}

void CacheEventLog::Registered(const BlockHash& hash, bool stored) {
  const int32_t page_in_run = open_run_ >= 0 ? run_cursor_++ : 0;
  if (!stored) return;
  Add(Kind::kStored, hash, open_run_, page_in_run);
}

void CacheEventLog::BeginRun(int64_t first_page, const BlockHash& parent,
                             absl::Span<const BlockHash> hashes,
                             absl::Span<const TokenId> tokens,
                             absl::string_view cache_salt, int64_t adapter_id) {
  open_run_ = static_cast<int32_t>(runs_.size());
  run_cursor_ = 0;
  runs_.push_back({.first_page = first_page,
                   .parent = parent,
                   .hashes_offset = hashes_.size(),
                   .tokens_offset = tokens_.size(),
                   .salt_offset = salts_.size(),
                   .salt_size = cache_salt.size(),
                   .adapter_id = adapter_id});
  hashes_.insert(hashes_.end(), hashes.begin(), hashes.end());
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  salts_.append(cache_salt.data(), cache_salt.size());
}

void CacheEventLog::Clear() {
  records_.clear();
  runs_.clear();
  hashes_.clear();
  tokens_.clear();
  salts_.clear();
  open_run_ = -1;
}

void CacheEventLog::AppendTo(CacheEventLog& out) const {
  const int32_t run_base = static_cast<int32_t>(out.runs_.size());
  const size_t records_base = out.records_.size();
  out.records_.insert(out.records_.end(), records_.begin(), records_.end());
  const size_t runs_base = out.runs_.size();
  out.runs_.insert(out.runs_.end(), runs_.begin(), runs_.end());
  // Rebased onto `out`'s arrays, unless they were empty.
  if (run_base > 0) {
    for (size_t i = records_base; i < out.records_.size(); ++i) {
      if (out.records_[i].run >= 0) out.records_[i].run += run_base;
    }
  }
  if (!out.hashes_.empty() || !out.tokens_.empty() || !out.salts_.empty()) {
    for (size_t i = runs_base; i < out.runs_.size(); ++i) {
      out.runs_[i].hashes_offset += out.hashes_.size();
      out.runs_[i].tokens_offset += out.tokens_.size();
      out.runs_[i].salt_offset += out.salts_.size();
    }
  }
  out.hashes_.insert(out.hashes_.end(), hashes_.begin(), hashes_.end());
  out.tokens_.insert(out.tokens_.end(), tokens_.begin(), tokens_.end());
  out.salts_.append(salts_);
}

void CacheEventLog::Reserve(size_t changes, size_t page_size) {
  records_.resize(changes);
  runs_.resize(changes);
  hashes_.resize(changes);
  tokens_.resize(changes * page_size);
  Clear();
}

void CacheEventLog::Swap(CacheEventLog& other) {
  records_.swap(other.records_);
  runs_.swap(other.runs_);
  hashes_.swap(other.hashes_);
  tokens_.swap(other.tokens_);
  salts_.swap(other.salts_);
  std::swap(open_run_, other.open_run_);
  std::swap(run_cursor_, other.run_cursor_);
}

namespace {

// The event of `out` at `used`, reset: a stale one (its buffers kept) or a
// new one.
KvCacheEvent& NextEvent(std::vector<KvCacheEvent>& out, size_t& used,
                        KvCacheEvent::Kind kind) {
  if (used == out.size()) out.emplace_back();
  KvCacheEvent& event = out[used++];
  event.kind = kind;
  event.block_hashes.clear();
  event.parent_block_hash.reset();
  event.token_ids.clear();
  event.cache_salt.clear();
  event.adapter_id = 0;
  return event;
}

}  // namespace

size_t CacheEventLog::BuildEvents(int32_t page_size, size_t begin, size_t end,
                                  std::vector<KvCacheEvent>& out,
                                  size_t used) const {
  const size_t page = static_cast<size_t>(page_size);
  const Record* previous = nullptr;
  for (size_t i = begin; i < end; ++i) {
    const Record& record = records_[i];
    switch (record.kind) {
      case Kind::kCleared:
        NextEvent(out, used, KvCacheEvent::Kind::kAllBlocksCleared);
        break;
      case Kind::kRemoved:
        if (previous == nullptr || previous->kind != Kind::kRemoved) {
          NextEvent(out, used, KvCacheEvent::Kind::kBlockRemoved);
        }
        out[used - 1].block_hashes.push_back(record.hash);
        break;
      case Kind::kStored:
        AddStored(record, previous, page, out, used);
        break;
    }
    previous = &record;
  }
  return used;
}

void CacheEventLog::AddStored(const Record& record, const Record* previous,
                              size_t page_size, std::vector<KvCacheEvent>& out,
                              size_t& used) const {
  // A page the pool registered on its own has no chain, tokens or keys.
  if (record.run < 0) {
    NextEvent(out, used, KvCacheEvent::Kind::kBlockStored)
        .block_hashes.push_back(record.hash);
    return;
  }
  const Run& run = runs_[record.run];
  // The chain before this page: the run's page before it (cached already or
  // not, it is the chain), or the run's parent; none at page 0.
  std::optional<BlockHash> parent;
  if (record.page_in_run > 0) {
    parent = hashes_[run.hashes_offset + record.page_in_run - 1];
  } else if (run.first_page > 0) {
    parent = run.parent;
  }
  const absl::string_view salt =
      absl::string_view(salts_).substr(run.salt_offset, run.salt_size);
  // Pages that continue the last event's chain, under the same keys, join
  // it: consecutive pages of one registration make one event.
  const bool extends = previous != nullptr && previous->kind == Kind::kStored &&
                       previous->run >= 0 && parent.has_value() &&
                       *parent == previous->hash &&
                       out[used - 1].cache_salt == salt &&
                       out[used - 1].adapter_id == run.adapter_id;
  if (!extends) {
    KvCacheEvent& event =
        NextEvent(out, used, KvCacheEvent::Kind::kBlockStored);
    event.parent_block_hash = parent;
    event.cache_salt.assign(salt.data(), salt.size());
    event.adapter_id = run.adapter_id;
  }
  KvCacheEvent& event = out[used - 1];
  event.block_hashes.push_back(record.hash);
  const auto tokens =
      tokens_.begin() + static_cast<ptrdiff_t>(run.tokens_offset +
                                               record.page_in_run * page_size);
  event.token_ids.insert(event.token_ids.end(), tokens,
                         tokens + static_cast<ptrdiff_t>(page_size));
}

}  // namespace kvblock::internal
