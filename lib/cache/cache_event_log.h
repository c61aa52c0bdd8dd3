// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Internal: CacheEventLog, the prefix cache's changes in order, from which
// BlockManager::TakeKvEvents builds KV cache events. BlockPool appends a
// record for every page it newly registers, evicts or uncaches and for a
// reset; it does not know a page's tokens or chain, so BlockManager opens a
// registration run around its RegisterCached calls (the run's parent hash,
// hashes, tokens and extra keys), and each registration the pool reports
// while the run is open is its next page. A pool rollback truncates the log
// to the savepoint's mark: a rolled-back step leaves no record.
//
// Thread safety: thread-compatible, owned by one BlockManager.
#ifndef KVBLOCK_LIB_CACHE_CACHE_EVENT_LOG_H_
#define KVBLOCK_LIB_CACHE_CACHE_EVENT_LOG_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "cache/group_key.h"
#include "kvblock/block_hash.h"
#include "kvblock/kv_events.h"
#include "kvblock/types.h"

namespace kvblock::internal {

class CacheEventLog {
 public:
  // The log's size at a savepoint (BlockPool::Savepoint keeps one).
  using Mark = CacheEventLogMark;

  Mark mark() const { return {records_.size(), runs_.size(), hashes_.size()}; }
  // Drops what came after `mark`, and closes an open run.
  void Truncate(const Mark& mark);

  // From BlockPool: RegisterCached on `key` (`stored`: the page is newly
  // cached), an eviction or uncaching of a page cached as `key`, a reset.
  // `group`: the KV cache group `key` is a key of (cache/group_key.h), whose
  // hash the record keeps.
  void Registered(const BlockHash& key, bool stored, int32_t group);
  void Removed(const BlockHash& key, int32_t group) {
    AddHashed(Kind::kRemoved, SaltKey(key, GroupKeySalt(group)), group);
  }
  void Cleared() { Add(Kind::kCleared, -1, 0, 0); }
  // From BlockPool's host tier: `key` stored into it, or dropped from it.
  void HostStored(const BlockHash& key, int32_t group) {
    AddHashed(Kind::kHostStored, SaltKey(key, GroupKeySalt(group)), group);
  }
  void HostRemoved(const BlockHash& key, int32_t group) {
    AddHashed(Kind::kHostRemoved, SaltKey(key, GroupKeySalt(group)), group);
  }

  // From BlockManager: the next hashes.size() registrations are pages
  // [first_page, ...) of a sequence of KV cache group `group` after
  // `parent` (its chain before them), holding `tokens` (the same number a
  // page: the group's page size), under extra keys `cache_salt` and
  // `adapter_id`.
  void BeginRun(int64_t first_page, const BlockHash& parent,
                absl::Span<const BlockHash> hashes,
                absl::Span<const TokenId> tokens, absl::string_view cache_salt,
                int64_t adapter_id, int32_t group);
  void EndRun() { open_run_ = -1; }
  // The open run's next page is not registered (a window group caches only
  // the pages a hit can use): the registrations after it are the pages
  // after it.
  void SkipInRun() {
    if (open_run_ >= 0) ++run_cursor_;
  }

  bool empty() const { return records_.empty(); }
  // Pages stored and removed, and resets.
  int64_t num_records() const { return static_cast<int64_t>(records_.size()); }
  // Records [begin, end) group into events (consecutive pages of a chain in
  // one BlockStored, consecutive removals in one BlockRemoved): the record
  // after the last of the event that starts at `begin`.
  size_t EventEnd(size_t begin, size_t end) const;
  // Record i, as its event reads it: the kind, the page's hash (not for a
  // reset) and, for a page of a registration run (else none, empty and 0),
  // the chain before it (null at a prompt's first page), its tokens and its
  // extra keys.
  // Inline: the publisher thread reads every record through them.
  KvCacheEvent::Kind kind(size_t i) const {
    switch (records_[i].kind) {
      case Kind::kStored:
      case Kind::kHostStored:
        return KvCacheEvent::Kind::kBlockStored;
      case Kind::kRemoved:
      case Kind::kHostRemoved:
        return KvCacheEvent::Kind::kBlockRemoved;
      case Kind::kCleared:
        break;
    }
    return KvCacheEvent::Kind::kAllBlocksCleared;
  }
  // Record i's tier: the host tier's stores and removals are kCpu.
  KvCacheEvent::Medium medium(size_t i) const {
    return records_[i].kind == Kind::kHostStored ||
                   records_[i].kind == Kind::kHostRemoved
               ? KvCacheEvent::Medium::kCpu
               : KvCacheEvent::Medium::kGpu;
  }
  // Record i's KV cache group (0 for a reset).
  int32_t group(size_t i) const { return records_[i].group; }
  const BlockHash& hash(size_t i) const {
    const Record& record = records_[i];
    if (const Run* run = RunOf(i)) {
      return hashes_[run->hashes_offset + 1 + record.index];
    }
    return hashes_[record.index];
  }
  const BlockHash* parent(size_t i) const {
    const Run* run = RunOf(i);
    if (run == nullptr) return nullptr;
    // The run's page before this one (cached already or not, it is the
    // chain), or the run's parent; none at a sequence's page 0.
    const size_t page_in_run = records_[i].index;
    if (page_in_run == 0 && !run->has_parent) return nullptr;
    return &hashes_[run->hashes_offset + page_in_run];
  }
  absl::Span<const TokenId> tokens(size_t i) const {
    const Run* run = RunOf(i);
    if (run == nullptr) return {};
    return absl::MakeConstSpan(tokens_).subspan(
        run->tokens_offset + records_[i].index * run->page_size,
        run->page_size);
  }
  absl::string_view cache_salt(size_t i) const {
    const Run* run = RunOf(i);
    if (run == nullptr) return {};
    return absl::string_view(salts_).substr(run->salt_offset, run->salt_size);
  }
  int64_t adapter_id(size_t i) const {
    const Run* run = RunOf(i);
    return run == nullptr ? 0 : run->adapter_id;
  }

  // Builds records [begin, end) as events (EventEnd's) into `out`
  // from index `used` on, reusing the buffers of the events already there;
  // returns the index after the last (`out` may hold more, stale, after
  // it).
  size_t BuildEvents(size_t begin, size_t end, std::vector<KvCacheEvent>& out,
                     size_t used) const;
  // Appends every record as events to `out`.
  void AppendEventsTo(std::vector<KvCacheEvent>& out) const {
    BuildEvents(0, records_.size(), out, out.size());
  }
  // Forgets every record, keeping the buffers.
  void Clear();
  // Appends a copy of the records to `out`'s (no run open in either), in
  // its buffers: they allocate only while smaller than the records.
  void AppendTo(CacheEventLog& out) const;
  // Sizes an empty log's buffers for `changes` pages of `page_size` tokens
  // (each its own run at worst), writing them once so that their memory is
  // mapped now rather than by the steps that first fill them.
  void Reserve(size_t changes, size_t page_size);
  // What Reserve allocates a change.
  static int64_t ReservedBytesPerChange(int64_t page_size) {
    return int64_t{sizeof(Record) + sizeof(Run) + 2 * sizeof(BlockHash)} +
           page_size * int64_t{sizeof(TokenId)};
  }
  // Exchanges the records with `other`'s (no run open in either).
  void Swap(CacheEventLog& other);

 private:
  enum class Kind : uint8_t {
    kStored,
    kRemoved,
    kCleared,
    kHostStored,
    kHostRemoved
  };
  // Small, as every byte of them crosses to the publisher thread's core:
  // each hash is kept once, in hashes_.
  struct Record {
    Kind kind = Kind::kRemoved;
    // kStored in a run: the run (runs_[run]) and the page's index in it.
    // Otherwise -1 and the page's hash in hashes_ (none for kCleared).
    int32_t run = -1;
    uint8_t group = 0;
    size_t index = 0;
  };
  struct Run {
    // In hashes_: the chain before the run's first page (at a sequence's
    // page 0 there is none: the slot is unread, `has_parent` false), then a
    // hash a page.
    size_t hashes_offset = 0;
    size_t tokens_offset = 0;  // in tokens_, page_size a page.
    size_t page_size = 0;      // tokens a page: its group's page size.
    size_t salt_offset = 0;    // in salts_.
    size_t salt_size = 0;
    int64_t adapter_id = 0;
    int32_t group = 0;
    bool has_parent = false;
  };

  void Add(Kind kind, int32_t run, size_t index, int32_t group) {
    Record& record = records_.emplace_back();
    record.kind = kind;
    record.run = run;
    record.group = static_cast<uint8_t>(group);
    record.index = index;
  }
  // A record of a page outside any run, its hash appended.
  void AddHashed(Kind kind, const BlockHash& hash, int32_t group) {
    hashes_.push_back(hash);
    Add(kind, -1, hashes_.size() - 1, group);
  }

  // The registration run of record i, a stored page; null for any other.
  const Run* RunOf(size_t i) const {
    const Record& record = records_[i];
    if (record.kind != Kind::kStored || record.run < 0) return nullptr;
    return &runs_[record.run];
  }

  std::vector<Record> records_;
  std::vector<Run> runs_;
  std::vector<BlockHash> hashes_;
  std::vector<TokenId> tokens_;
  std::string salts_;
  int32_t open_run_ = -1;
  int32_t run_cursor_ = 0;  // registrations so far in the open run.
};

}  // namespace kvblock::internal

#endif  // KVBLOCK_LIB_CACHE_CACHE_EVENT_LOG_H_
