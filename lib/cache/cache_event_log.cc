// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "cache/cache_event_log.h"

#include <cassert>
#include <cstddef>
#include <optional>
#include <string>
#include <utility>

namespace kvblock::internal {

void CacheEventLog::Truncate(const Mark& mark) {
  if (mark.runs < runs_.size()) {
    const Run& first_dropped = runs_[mark.runs];
    tokens_.resize(first_dropped.tokens_offset);
    salts_.resize(first_dropped.salt_offset);
    runs_.resize(mark.runs);
  }
  hashes_.resize(mark.hashes);
  records_.resize(mark.records);
  open_run_ = -1;
}

void CacheEventLog::Registered(const BlockHash& key, bool stored,
                               int32_t group) {
  if (open_run_ < 0) {
    if (stored) {
      AddHashed(Kind::kStored, SaltKey(key, GroupKeySalt(group)), group);
    }
    return;
  }
  // The run holds the page's hash already (BeginRun).
  const int32_t page_in_run = run_cursor_++;
  if (stored) {
    Add(Kind::kStored, open_run_, static_cast<size_t>(page_in_run),
        runs_[open_run_].group);
  }
}

void CacheEventLog::BeginRun(int64_t first_page, const BlockHash& parent,
                             absl::Span<const BlockHash> hashes,
                             absl::Span<const TokenId> tokens,
                             absl::string_view cache_salt, int64_t adapter_id,
                             int32_t group) {
  assert(hashes.empty() || tokens.size() % hashes.size() == 0);
  open_run_ = static_cast<int32_t>(runs_.size());
  run_cursor_ = 0;
  runs_.push_back(
      {.hashes_offset = hashes_.size(),
       .tokens_offset = tokens_.size(),
       .page_size = hashes.empty() ? 0 : tokens.size() / hashes.size(),
       .salt_offset = salts_.size(),
       .salt_size = cache_salt.size(),
       .adapter_id = adapter_id,
       .group = group,
       .has_parent = first_page > 0});
  hashes_.push_back(parent);
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
  const size_t hashes_base = out.hashes_.size();
  if (run_base > 0 || hashes_base > 0) {
    for (size_t i = records_base; i < out.records_.size(); ++i) {
      Record& record = out.records_[i];
      if (record.run >= 0) {
        record.run += run_base;
      } else {
        record.index += hashes_base;
      }
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
  hashes_.resize(2 * changes);
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
  event.medium = KvCacheEvent::Medium::kGpu;
  return event;
}

}  // namespace

size_t CacheEventLog::EventEnd(size_t begin, size_t end) const {
  const Record& first = records_[begin];
  size_t next = begin + 1;
  switch (first.kind) {
    case Kind::kCleared:
      return next;
    case Kind::kRemoved:
    case Kind::kHostStored:
    case Kind::kHostRemoved:
      // Consecutive pages of one kind and group; host stores have no chain.
      while (next < end && records_[next].kind == first.kind &&
             records_[next].group == first.group) {
        ++next;
      }
      return next;
    case Kind::kStored:
      // A page the pool registered on its own has no chain to continue.
      if (first.run < 0) return next;
      // Pages that continue the chain under the same keys join the event:
      // the run's next page, or a run that goes on from the page before.
      for (; next < end && records_[next].kind == Kind::kStored; ++next) {
        const Record& record = records_[next];
        const Record& before = records_[next - 1];
        if (record.run >= 0 && record.run == before.run &&
            record.index == before.index + 1) {
          continue;
        }
        const BlockHash* chain = parent(next);
        if (record.group != first.group || chain == nullptr ||
            *chain != hash(next - 1) || cache_salt(next) != cache_salt(begin) ||
            adapter_id(next) != adapter_id(begin)) {
          break;
        }
      }
      return next;
  }
  return next;
}

size_t CacheEventLog::BuildEvents(size_t begin, size_t end,
                                  std::vector<KvCacheEvent>& out,
                                  size_t used) const {
  for (size_t i = begin; i < end;) {
    const size_t last = EventEnd(i, end);
    KvCacheEvent& event = NextEvent(out, used, kind(i));
    event.group_idx = group(i);
    event.medium = medium(i);
    if (event.kind == KvCacheEvent::Kind::kBlockStored) {
      if (const BlockHash* chain = parent(i)) event.parent_block_hash = *chain;
      const absl::string_view salt = cache_salt(i);
      event.cache_salt.assign(salt.data(), salt.size());
      event.adapter_id = adapter_id(i);
    }
    for (; i < last; ++i) {
      if (event.kind == KvCacheEvent::Kind::kAllBlocksCleared) continue;
      event.block_hashes.push_back(hash(i));
      const absl::Span<const TokenId> page_tokens = tokens(i);
      event.token_ids.insert(event.token_ids.end(), page_tokens.begin(),
                             page_tokens.end());
    }
  }
  return used;
}

}  // namespace kvblock::internal
