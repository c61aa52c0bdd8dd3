// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Model-based randomized test of BlockPool and SequenceBlockTable: seeded
// random operations run on the real pool and tables and on a trivially
// correct model (vectors and a std::map, linear scans), and after every step
// the pool's invariants hold and its Snapshot() equals the model's, stats
// included. Transactions are modelled by copying the whole model. Every run
// is repeated with vLLM's options (one queue, every duplicate cached), and
// with a host tier (write-back and write-through). With a host tier the test
// also keeps every page's content (the key whose KV it holds): each taken
// copy batch runs as the contract says (stores, then loads, then the
// forward pass computing the pages cached in the batch), and then every
// cached page, device and host, must hold its own key.
#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kvblock/block_pool.h"
#include "kvblock/kv_cache_groups.h"
#include "kvblock/sequence_table.h"
#include "pool_test_util.h"
#include "test_util.h"

namespace kvblock {
namespace {

using ::kvblock::testing::NewPool;
using ::kvblock::testing::TestHash;
using Code = absl::StatusCode;
using Kind = CopyOnWrite::Kind;

// The reference pool. Each method returns the status code the real pool must
// return and, on error, leaves the model unchanged.
struct ModelPool {
  int32_t n = 0;
  int32_t max_refcount = 0;
  bool one_queue = false;   // EvictionOrder::kLeastRecentlyFreed.
  bool duplicates = false;  // index_duplicates.
  int32_t depth = 0;
  std::vector<int32_t> refcount;
  std::vector<PageId> free_stack;  // Bottom to top.
  std::vector<PageId> lru;         // Head to tail.
  // Cached pages in the order they were cached: a lookup finds the first.
  std::vector<std::pair<PageId, BlockHash>> cached;
  BlockPoolStats stats;

  // The host tier (host_n 0: none).
  static constexpr uint32_t kLoaded = 1u << 31;
  static constexpr uint32_t kParked = 1u << 30;
  static constexpr uint32_t kCopied = 1u << 29;
  static constexpr uint32_t kBatchMask = kCopied - 1;
  int32_t host_n = 0;
  bool write_through = false;
  uint32_t batch = 1;
  std::vector<uint32_t> stamp;                             // by device page.
  std::vector<HostPageId> host_free;                       // bottom to top.
  std::vector<std::pair<HostPageId, BlockHash>> host_lru;  // head first.
  std::vector<uint32_t> host_stamp;                        // by host page.
  std::vector<HostCopy> copies;
  std::vector<PageId> parked;
  std::vector<PageId> written_through;

  ModelPool(int32_t num_pages, int32_t max_rc, bool vllm, int32_t host_pages,
            bool through)
      : n(num_pages),
        max_refcount(max_rc),
        one_queue(vllm),
        duplicates(vllm),
        refcount(num_pages, 0),
        host_n(host_pages),
        write_through(through),
        stamp(num_pages, 0) {
    for (PageId p = 0; p < n; ++p) lru.push_back(p);
    if (!one_queue) free_stack.assign(lru.rbegin(), lru.rend()), lru.clear();
    ClearHost();
  }

  void ClearHost() {
    host_free.clear();
    for (HostPageId h = host_n - 1; h >= 0; --h) host_free.push_back(h);
    host_lru.clear();
    host_stamp.assign(host_n, 0);
  }
  std::optional<HostPageId> HostFind(const BlockHash& key) const {
    for (const auto& [page, k] : host_lru) {
      if (k == key) return page;
    }
    return std::nullopt;
  }
  void HostUse(HostPageId h, uint32_t with_batch) {
    auto it = std::find_if(host_lru.begin(), host_lru.end(),
                           [h](const auto& entry) { return entry.first == h; });
    const auto entry = *it;
    host_lru.erase(it);
    host_lru.push_back(entry);
    host_stamp[h] = with_batch;
  }
  // Stores cached page `p` (key `key`, not in the host tier).
  bool StoreToHost(PageId p, const BlockHash& key) {
    HostPageId h;
    if (!host_free.empty()) {
      h = host_free.back();
      host_free.pop_back();
    } else {
      // The least recently stored or used page the open batch does not use.
      const auto victim = std::find_if(
          host_lru.begin(), host_lru.end(),
          [&](const auto& e) { return host_stamp[e.first] != batch; });
      if (victim == host_lru.end()) return false;
      h = victim->first;
      host_lru.erase(victim);
      ++stats.host_evictions;
    }
    host_lru.emplace_back(h, key);
    host_stamp[h] = batch;
    copies.push_back({p, h, HostCopy::Direction::kDeviceToHost});
    ++stats.host_stores;
    return true;
  }
  void Stamp(PageId p, uint32_t flags) {
    const uint32_t kept =
        (stamp[p] & kBatchMask) == batch ? stamp[p] & ~kBatchMask : 0;
    stamp[p] = batch | kept | flags;
  }
  bool Parked(PageId p) const { return (stamp[p] & kParked) != 0; }
  bool LoadedInBatch(PageId p) const {
    return (stamp[p] & (kBatchMask | kLoaded)) == (batch | kLoaded);
  }
  // Loaded into, or read by a copy on write, in the open batch.
  bool CopiedInBatch(PageId p) const {
    return (stamp[p] & kBatchMask) == batch &&
           (stamp[p] & (kLoaded | kCopied)) != 0;
  }
  // Whether a caller holds a reference: a parked page's last is the pool's.
  bool Used(PageId p) const { return refcount[p] > (Parked(p) ? 1 : 0); }
  void WriteBack(PageId p, const BlockHash& key) {
    if ((stamp[p] & kBatchMask) == batch) {
      ++stats.host_store_skips;
    } else if (HostFind(key).has_value()) {
      // Held already: neither stored again nor moved.
    } else if (!StoreToHost(p, key)) {
      ++stats.host_store_skips;
    }
  }

  std::optional<BlockHash> CachedHash(PageId p) const {
    for (const auto& [page, hash] : cached) {
      if (page == p) return hash;
    }
    return std::nullopt;
  }
  bool IsCached(PageId p) const { return CachedHash(p).has_value(); }
  void Forget(PageId p) {
    std::erase_if(cached, [p](const auto& entry) { return entry.first == p; });
  }

  int32_t NumFree() const {
    return static_cast<int32_t>(free_stack.size() + lru.size());
  }
  void NoteUsed() {
    stats.peak_used = std::max(stats.peak_used, n - NumFree());
  }
  bool InRange(PageId p) const { return p >= 0 && p < n; }
  std::optional<PageId> Lookup(const BlockHash& hash) const {
    for (const auto& [page, h] : cached) {
      if (h == hash) return page;
    }
    return std::nullopt;
  }

  PageId AllocateOne() {
    PageId page;
    if (!free_stack.empty()) {
      page = free_stack.back();
      free_stack.pop_back();
    } else {
      page = lru.front();
      lru.erase(lru.begin());
      if (const std::optional<BlockHash> key = CachedHash(page)) {
        Forget(page);
        ++stats.evictions;
        if (host_n > 0) WriteBack(page, *key);
      }
    }
    refcount[page] = 1;
    ++stats.allocations;
    NoteUsed();
    return page;
  }
  Code AllocateN(int32_t count, std::vector<PageId>& out) {
    if (count > NumFree()) return Code::kResourceExhausted;
    for (int32_t i = 0; i < count; ++i) out.push_back(AllocateOne());
    return Code::kOk;
  }
  Code Retain(PageId p) {
    if (!InRange(p)) return Code::kInvalidArgument;
    if (!Used(p) || refcount[p] == max_refcount) {
      return Code::kFailedPrecondition;
    }
    ++refcount[p];
    return Code::kOk;
  }
  Code Release(PageId p) {
    if (!InRange(p)) return Code::kInvalidArgument;
    if (!Used(p)) return Code::kFailedPrecondition;
    if (refcount[p] == 1 && host_n > 0 && CopiedInBatch(p)) {
      Stamp(p, kParked);
      parked.push_back(p);
      return Code::kOk;
    }
    if (--refcount[p] == 0) {
      // Without `duplicates`, a second copy of a hash is cached only while
      // it is used.
      const std::optional<BlockHash> hash = CachedHash(p);
      if (hash && !duplicates && Lookup(*hash) != p) Forget(p);
      (IsCached(p) || one_queue ? lru : free_stack).push_back(p);
    }
    return Code::kOk;
  }
  Code Writable(PageId p, CopyOnWrite& cow) {
    if (p != kNoPage) {
      if (!InRange(p)) return Code::kInvalidArgument;
      if (!Used(p)) return Code::kFailedPrecondition;
      if (refcount[p] == 1) {
        Forget(p);
        cow = {Kind::kExisting, p, kNoPage};
        return Code::kOk;
      }
    }
    if (NumFree() == 0) return Code::kResourceExhausted;
    const PageId destination = AllocateOne();
    if (p == kNoPage) {
      cow = {Kind::kAllocated, destination, kNoPage};
    } else {
      --refcount[p];
      if (host_n > 0) {
        Stamp(p, kCopied);
        Stamp(destination, kCopied);
      }
      ++stats.cow_copies;
      cow = {Kind::kCopy, destination, p};
    }
    return Code::kOk;
  }
  Code Register(PageId p, const BlockHash& hash, PageId& holder) {
    if (!InRange(p)) return Code::kInvalidArgument;
    if (!Used(p)) return Code::kFailedPrecondition;
    for (const auto& [page, h] : cached) {
      if (page != p) continue;
      if (!(h == hash)) return Code::kFailedPrecondition;
      holder = p;
      return Code::kOk;
    }
    const std::optional<PageId> other = Lookup(hash);
    holder = other.value_or(p);
    cached.emplace_back(p, hash);
    const bool stored = !other || duplicates;
    if (stored) ++stats.cache_registrations;
    if (host_n > 0) {
      Stamp(p, 0);
      if (stored && write_through) written_through.push_back(p);
    }
    return Code::kOk;
  }
  Code LoadFromHost(const BlockHash& key, int32_t group, PageId& page) {
    if (host_n == 0) return Code::kFailedPrecondition;
    if (group < 0 || group >= kMaxKvCacheGroups) {
      return Code::kInvalidArgument;
    }
    const std::optional<HostPageId> h = HostFind(key);
    if (!h || Lookup(key)) return Code::kFailedPrecondition;
    if (NumFree() == 0) return Code::kResourceExhausted;
    HostUse(*h, batch);
    page = AllocateOne();
    copies.push_back({page, *h, HostCopy::Direction::kHostToDevice});
    ++stats.host_loads;
    PageId holder;
    Register(page, key, holder);
    Stamp(page, kLoaded);
    return Code::kOk;
  }
  Code UseHostPages(const std::vector<BlockHash>& keys) {
    if (host_n == 0 && !keys.empty()) return Code::kFailedPrecondition;
    for (const BlockHash& key : keys) {
      if (!HostFind(key)) return Code::kFailedPrecondition;
    }
    for (const BlockHash& key : keys) HostUse(*HostFind(key), batch);
    return Code::kOk;
  }
  Code Take(std::vector<HostCopy>& out) {
    if (depth > 0) return Code::kFailedPrecondition;
    out = copies;
    copies.clear();
    if (host_n == 0) return Code::kOk;
    if (batch == kBatchMask) {
      stamp.assign(n, 0);
      host_stamp.assign(host_n, 0);
      batch = 1;
    } else {
      ++batch;
    }
    for (const PageId p : parked) {
      stamp[p] &= ~kParked;
      Release(p);
    }
    parked.clear();
    for (const PageId p : written_through) {
      const std::optional<BlockHash> key = CachedHash(p);
      if (key && !HostFind(*key) && !StoreToHost(p, *key)) {
        ++stats.host_store_skips;
      }
    }
    written_through.clear();
    return Code::kOk;
  }
  Code Uncache(PageId p, bool& was_cached) {
    if (!InRange(p)) return Code::kInvalidArgument;
    was_cached = IsCached(p);
    Forget(p);
    if (was_cached && refcount[p] == 0 && !one_queue) {
      lru.erase(std::find(lru.begin(), lru.end(), p));
      free_stack.push_back(p);
    }
    return Code::kOk;
  }
  Code Acquire(const std::vector<BlockHash>& chain, size_t out_size,
               std::vector<PageId>& hits) {
    if (out_size < chain.size()) return Code::kInvalidArgument;
    const ModelPool before = *this;
    for (const BlockHash& hash : chain) {
      const std::optional<PageId> page = Lookup(hash);
      if (!page) break;
      if (refcount[*page] == max_refcount) {
        *this = before;
        hits.clear();
        return Code::kFailedPrecondition;
      }
      if (refcount[*page] == 0) {
        lru.erase(std::find(lru.begin(), lru.end(), *page));
        refcount[*page] = 1;
        ++stats.cache_revivals;
        NoteUsed();
      } else {
        ++refcount[*page];
      }
      hits.push_back(*page);
    }
    stats.cache_hits += static_cast<int64_t>(hits.size());
    return Code::kOk;
  }
  Code Reset() {
    if (depth > 0) return Code::kFailedPrecondition;
    if (!copies.empty() || !parked.empty()) return Code::kFailedPrecondition;
    if (!one_queue) {
      free_stack.insert(free_stack.end(), lru.begin(), lru.end());
      lru.clear();
    }
    cached.clear();
    ClearHost();
    written_through.clear();
    return Code::kOk;
  }

  BlockPoolSnapshot Snapshot() const {
    BlockPoolSnapshot s;
    s.refcounts = refcount;
    s.free_stack = free_stack;
    s.lru = lru;
    s.cached.assign(cached.begin(), cached.end());
    std::sort(s.cached.begin(), s.cached.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    // Pages sharing a hash, in cache order; the groups by smallest page.
    std::map<PageId, std::vector<PageId>> rings;
    for (const auto& [page, hash] : cached) {
      std::vector<PageId> ring;
      for (const auto& [other, h] : cached) {
        if (h == hash) ring.push_back(other);
      }
      if (ring.size() > 1) {
        rings[*std::min_element(ring.begin(), ring.end())] = ring;
      }
    }
    for (auto& [first, ring] : rings) s.duplicates.push_back(ring);
    s.stats = stats;
    if (host_n > 0) {
      for (const auto& [page, key] : host_lru) s.host_lru.push_back(page);
      s.host_cached.assign(host_lru.begin(), host_lru.end());
      std::sort(s.host_cached.begin(), s.host_cached.end(),
                [](const auto& a, const auto& b) { return a.first < b.first; });
      s.host_free = host_free;
      for (HostPageId h = 0; h < host_n; ++h) {
        if (host_stamp[h] == batch) s.host_used.push_back(h);
      }
      s.host_copies = copies;
      for (PageId p = 0; p < n; ++p) {
        if ((stamp[p] & kBatchMask) == batch) s.fresh_pages.push_back(p);
        if (LoadedInBatch(p)) s.loaded_pages.push_back(p);
      }
      s.parked = parked;
      s.write_through = written_through;
    }
    return s;
  }
};

// The reference sequence table: its live pages.
using ModelTable = std::vector<PageId>;

// Everything the test drives: real and model pool and tables, and the
// references the test holds outside tables.
struct World {
  ModelPool model;
  std::vector<SequenceBlockTable> tables;
  std::vector<ModelTable> model_tables;
  std::vector<PageId> held;
};

// Table operations on the model, in terms of the model pool, with the same
// argument checks in the same order as SequenceBlockTable.
Code ModelEnsureWritable(World& w, int t, int32_t lp, CopyOnWrite& cow) {
  ModelTable& table = w.model_tables[t];
  if (lp < 0) return Code::kInvalidArgument;
  if (lp >= w.tables[t].capacity() || lp > static_cast<int32_t>(table.size())) {
    return Code::kOutOfRange;
  }
  const PageId current =
      lp < static_cast<int32_t>(table.size()) ? table[lp] : kNoPage;
  const Code code = w.model.Writable(current, cow);
  if (code != Code::kOk) return code;
  if (lp == static_cast<int32_t>(table.size())) {
    table.push_back(cow.page);
  } else {
    table[lp] = cow.page;
  }
  return Code::kOk;
}

// Retains (or releases, last first) every page of `pages`, all or none.
Code ModelApplyAll(ModelPool& model, const std::vector<PageId>& pages,
                   bool release) {
  const ModelPool before = model;
  for (size_t i = 0; i < pages.size(); ++i) {
    const Code code = release ? model.Release(pages[pages.size() - 1 - i])
                              : model.Retain(pages[i]);
    if (code != Code::kOk) {
      model = before;
      return code;
    }
  }
  return Code::kOk;
}

Code ModelFork(World& w, int source, int target) {
  if (source == target ||
      w.tables[source].capacity() != w.tables[target].capacity()) {
    return Code::kInvalidArgument;
  }
  if (!w.model_tables[target].empty()) return Code::kFailedPrecondition;
  const Code code = ModelApplyAll(w.model, w.model_tables[source], false);
  if (code == Code::kOk) w.model_tables[target] = w.model_tables[source];
  return code;
}

Code ModelInstall(World& w, int t, const std::vector<PageId>& pages) {
  if (static_cast<int32_t>(pages.size()) > w.tables[t].capacity()) {
    return Code::kOutOfRange;
  }
  if (!w.model_tables[t].empty()) return Code::kFailedPrecondition;
  const Code code = ModelApplyAll(w.model, pages, false);
  if (code == Code::kOk) w.model_tables[t] = pages;
  return code;
}

Code ModelReleaseAll(World& w, int t) {
  const Code code = ModelApplyAll(w.model, w.model_tables[t], true);
  if (code == Code::kOk) w.model_tables[t].clear();
  return code;
}

enum class Op {
  kAllocate,
  kAllocateN,
  kRetain,
  kRelease,
  kWritable,
  kRegisterCached,
  kUncache,
  kLookup,
  kAcquireCachedPrefix,
  kEnsureWritable,
  kFork,
  kInstallSharedPrefix,
  kReleaseAll,
  kReleaseHeld,
  kBeginTransaction,
  kCommitTransaction,
  kRollbackTransaction,
  kResetPrefixCache,
  kLoadFromHost,
  kTakeHostCopies,
  kHostLookup,
  kUseHostPages,
};

// Each operation with its relative frequency.
constexpr struct {
  Op op;
  int weight;
  const char* name;
} kOps[] = {
    {Op::kAllocate, 8, "allocate"},
    {Op::kAllocateN, 4, "allocate_n"},
    {Op::kRetain, 6, "retain"},
    {Op::kRelease, 14, "release"},
    {Op::kWritable, 6, "writable"},
    {Op::kRegisterCached, 8, "register_cached"},
    {Op::kUncache, 2, "uncache"},
    {Op::kLookup, 3, "lookup"},
    {Op::kAcquireCachedPrefix, 7, "acquire_cached_prefix"},
    {Op::kEnsureWritable, 10, "ensure_writable"},
    {Op::kFork, 5, "fork"},
    {Op::kInstallSharedPrefix, 4, "install_shared_prefix"},
    {Op::kReleaseAll, 9, "release_all"},
    {Op::kReleaseHeld, 4, "release_held"},
    {Op::kBeginTransaction, 4, "begin_transaction"},
    {Op::kCommitTransaction, 3, "commit_transaction"},
    {Op::kRollbackTransaction, 3, "rollback_transaction"},
    {Op::kResetPrefixCache, 2, "reset_prefix_cache"},
    {Op::kLoadFromHost, 8, "load_from_host"},
    {Op::kTakeHostCopies, 10, "take_host_copies"},
    {Op::kHostLookup, 2, "host_lookup"},
    {Op::kUseHostPages, 2, "use_host_pages"},
};

// A run's pool: its size, options and host tier.
struct RunShape {
  uint32_t seed = 0;
  int32_t num_pages = 0;
  int32_t max_refcount = 0;
  bool vllm = false;
  int32_t host_pages = 0;
  bool write_through = false;
};

class RandomRun {
 public:
  explicit RandomRun(const RunShape& shape)
      : rng_(shape.seed),
        pool_(NewPool(
            shape.num_pages,
            {.max_refcount = shape.max_refcount,
             .journal_reserve = 16,
             .eviction_order = shape.vllm ? EvictionOrder::kLeastRecentlyFreed
                                          : EvictionOrder::kNeverCachedFirst,
             .index_duplicates = shape.vllm,
             .host_pages = shape.host_pages,
             .host_write_policy = shape.write_through
                                      ? HostWritePolicy::kWriteThrough
                                      : HostWritePolicy::kWriteBack})),
        world_{ModelPool(shape.num_pages, shape.max_refcount, shape.vllm,
                         shape.host_pages, shape.write_through),
               {},
               {},
               {}},
        device_content_(shape.num_pages),
        host_content_(shape.host_pages),
        loaded_key_(shape.num_pages) {
    for (int32_t capacity : {6, 6, 6, 4}) {
      world_.tables.emplace_back(capacity);
      world_.model_tables.emplace_back();
    }
  }

  // Runs `steps` random operations, checking everything after each, counts
  // them by name, and returns the pool's final stats.
  BlockPoolStats Run(int steps, std::map<std::string, int>& counts) {
    counts_ = &counts;
    int total_weight = 0;
    for (const auto& op : kOps) total_weight += op.weight;
    for (int step = 0; step < steps; ++step) {
      int dice = Uniform(0, total_weight - 1);
      size_t i = 0;
      while (dice >= kOps[i].weight) dice -= kOps[i++].weight;
      INFO("step " << step << ": " << kOps[i].name);
      ++counts[kOps[i].name];

      const BlockPoolSnapshot before = pool_->Snapshot();
      const absl::StatusCode code = Step(kOps[i].op);
      INFO("expected " << absl::StatusCodeToString(expected_) << ", got "
                       << absl::StatusCodeToString(code));
      REQUIRE(code == expected_);
      REQUIRE_OK(pool_->CheckInvariants());
      const BlockPoolSnapshot after = pool_->Snapshot();
      REQUIRE(after == world_.model.Snapshot());
      if (!after.duplicates.empty()) ++counts["(duplicates held)"];
      if (code != Code::kOk) REQUIRE(after == before);
      for (size_t t = 0; t < world_.tables.size(); ++t) {
        const auto entries = world_.tables[t].entries();
        const ModelTable& model = world_.model_tables[t];
        REQUIRE(world_.tables[t].num_pages() ==
                static_cast<int32_t>(model.size()));
        REQUIRE(std::equal(model.begin(), model.end(), entries.begin()));
        REQUIRE(std::all_of(entries.begin() + model.size(), entries.end(),
                            [](PageId p) { return p == kNoPage; }));
      }
      REQUIRE(pool_->transaction_depth() == world_.model.depth);
    }
    return pool_->stats();
  }

 private:
  static constexpr int kNumHashes = 40;
  static constexpr int kMaxDepth = 3;

  struct Saved {
    World world;
    BlockPool::Savepoint savepoint;
  };

  int Uniform(int lo, int hi) {  // In [lo, hi].
    return std::uniform_int_distribution<int>(lo, hi)(rng_);
  }
  bool Chance(int percent) { return Uniform(1, 100) <= percent; }

  // A page id: mostly one the test holds, else any id, bad ones included.
  // For an operation that consumes the caller's reference (`consuming`), a
  // used page the test does not hold is only rarely picked: that steals a
  // table's reference and leaves the table dangling until a rollback.
  PageId PickPage(bool consuming) {
    const std::vector<PageId>& held = world_.held;
    if (!held.empty() && Chance(75)) {
      return held[Uniform(0, static_cast<int>(held.size()) - 1)];
    }
    const PageId page = Uniform(-2, pool_->num_pages() + 1);
    if (consuming && world_.model.InRange(page) &&
        world_.model.refcount[page] > 0 && Chance(95) &&
        std::find(held.begin(), held.end(), page) == held.end()) {
      return pool_->num_pages();
    }
    return page;
  }
  BlockHash AnyHash() {
    return TestHash(static_cast<uint32_t>(Uniform(0, kNumHashes - 1)));
  }
  // A hash: mostly one that is cached right now.
  BlockHash PickHash() {
    const auto& cached = world_.model.cached;
    if (cached.empty() || Chance(40)) return AnyHash();
    return cached[Uniform(0, static_cast<int>(cached.size()) - 1)].second;
  }
  // A key: mostly one the host tier holds and the device does not.
  BlockHash PickHostKey() {
    const auto& host = world_.model.host_lru;
    if (host.empty() || Chance(20)) return PickHash();
    return host[Uniform(0, static_cast<int>(host.size()) - 1)].second;
  }

  // Runs taken copy batch `copies` on the pages' contents as the contract
  // says: stores, then loads, then the forward pass that computes the pages
  // `open` (the snapshot before the take) cached in the batch; then every
  // cached page must hold its key, but the host pages the next batch
  // stores into (write-through).
  void RunCopies(const std::vector<HostCopy>& copies,
                 const BlockPoolSnapshot& open) {
    for (const HostCopy& copy : copies) {
      if (copy.direction == HostCopy::Direction::kDeviceToHost) {
        host_content_[copy.host_page] = device_content_[copy.device_page];
      }
    }
    for (const HostCopy& copy : copies) {
      if (copy.direction == HostCopy::Direction::kHostToDevice) {
        device_content_[copy.device_page] = host_content_[copy.host_page];
        INFO("load into device page " << copy.device_page);
        REQUIRE(device_content_[copy.device_page] ==
                loaded_key_[copy.device_page]);
      }
    }
    for (const auto& [page, key] : open.cached) {
      if (std::binary_search(open.fresh_pages.begin(), open.fresh_pages.end(),
                             page)) {
        device_content_[page] = key;
      }
    }
    const BlockPoolSnapshot now = pool_->Snapshot();
    for (const auto& [page, key] : now.cached) {
      INFO("device page " << page);
      REQUIRE(device_content_[page] == key);
    }
    for (const auto& [page, key] : now.host_cached) {
      const bool pending = std::any_of(
          now.host_copies.begin(), now.host_copies.end(),
          [page = page](const HostCopy& c) { return c.host_page == page; });
      INFO("host page " << page);
      if (!pending) REQUIRE(host_content_[page] == key);
    }
  }
  void DropHeld(PageId page) {
    auto it = std::find(world_.held.begin(), world_.held.end(), page);
    if (it != world_.held.end()) world_.held.erase(it);
  }
  int PickTable() {
    return Uniform(0, static_cast<int>(world_.tables.size()) - 1);
  }
  // Mostly an empty table (when there is one), for fork and install.
  int PickEmptyTable() {
    const int t = PickTable();
    if (!Chance(80)) return t;
    for (size_t i = 0; i < world_.model_tables.size(); ++i) {
      if (world_.model_tables[i].empty()) return static_cast<int>(i);
    }
    return t;
  }

  // Runs `op` on the real objects and returns its status code, after setting
  // expected_ from the model.
  absl::StatusCode Step(Op op) {
    ModelPool& model = world_.model;
    switch (op) {
      case Op::kAllocate: {
        std::vector<PageId> expected;
        expected_ = model.AllocateN(1, expected);
        auto page = pool_->Allocate();
        if (page.ok()) {
          REQUIRE(*page == expected[0]);
          world_.held.push_back(*page);
        }
        return page.status().code();
      }
      case Op::kAllocateN: {
        const int count = Uniform(0, 5);
        std::vector<PageId> expected;
        expected_ = model.AllocateN(count, expected);
        std::vector<PageId> pages(count, kNoPage);
        const absl::Status status = pool_->AllocateN(absl::MakeSpan(pages));
        if (status.ok()) {
          REQUIRE(pages == expected);
          world_.held.insert(world_.held.end(), pages.begin(), pages.end());
        }
        return status.code();
      }
      case Op::kRetain: {
        const PageId page = PickPage(false);
        expected_ = model.Retain(page);
        const absl::Status status = pool_->Retain(page);
        if (status.ok()) world_.held.push_back(page);
        return status.code();
      }
      case Op::kRelease: {
        const PageId page = PickPage(true);
        expected_ = model.Release(page);
        const absl::Status status = pool_->Release(page);
        if (status.ok()) DropHeld(page);
        return status.code();
      }
      case Op::kWritable: {
        const PageId page = Chance(20) ? kNoPage : PickPage(true);
        CopyOnWrite expected;
        expected_ = model.Writable(page, expected);
        auto cow = pool_->Writable(page);
        if (cow.ok()) {
          REQUIRE(*cow == expected);
          DropHeld(page);
          world_.held.push_back(cow->page);
        }
        return cow.status().code();
      }
      case Op::kRegisterCached: {
        const PageId page = PickPage(false);
        const BlockHash hash = Chance(80) ? AnyHash() : PickHash();
        PageId expected = kNoPage;
        expected_ = model.Register(page, hash, expected);
        auto holder = pool_->RegisterCached(page, hash);
        if (holder.ok()) REQUIRE(*holder == expected);
        return holder.status().code();
      }
      case Op::kUncache: {
        const PageId page =
            Chance(50) && !model.cached.empty()
                ? model
                      .cached[Uniform(
                          0, static_cast<int>(model.cached.size()) - 1)]
                      .first
                : PickPage(false);
        bool expected = false;
        expected_ = model.Uncache(page, expected);
        auto was_cached = pool_->Uncache(page);
        if (was_cached.ok()) REQUIRE(*was_cached == expected);
        return was_cached.status().code();
      }
      case Op::kLookup: {
        const BlockHash hash = PickHash();
        REQUIRE(pool_->Lookup(hash) == model.Lookup(hash));
        expected_ = Code::kOk;
        return Code::kOk;
      }
      case Op::kAcquireCachedPrefix: {
        std::vector<BlockHash> chain(Uniform(0, 4));
        for (BlockHash& hash : chain) hash = PickHash();
        const bool short_output = Chance(5) && !chain.empty();
        const size_t out_size = chain.size() - (short_output ? 1 : 0);
        std::vector<PageId> expected;
        expected_ = model.Acquire(chain, out_size, expected);
        std::vector<PageId> out(out_size, kNoPage);
        auto hits = pool_->AcquireCachedPrefix(chain, absl::MakeSpan(out));
        if (hits.ok()) {
          REQUIRE(std::vector<PageId>(out.begin(), out.begin() + *hits) ==
                  expected);
          world_.held.insert(world_.held.end(), expected.begin(),
                             expected.end());
        }
        return hits.status().code();
      }
      case Op::kEnsureWritable: {
        const int t = PickTable();
        const int32_t size = world_.tables[t].num_pages();
        const int32_t lp =
            Chance(90) ? Uniform(std::max(0, size - 2), size) : Uniform(-1, 7);
        CopyOnWrite expected;
        expected_ = ModelEnsureWritable(world_, t, lp, expected);
        auto cow = world_.tables[t].EnsureWritable(lp, *pool_);
        if (cow.ok()) REQUIRE(*cow == expected);
        return cow.status().code();
      }
      case Op::kFork: {
        const int source = PickTable();
        const int target = PickEmptyTable();
        expected_ = ModelFork(world_, source, target);
        return world_.tables[source]
            .ForkInto(world_.tables[target], *pool_)
            .code();
      }
      case Op::kInstallSharedPrefix: {
        const int t = PickEmptyTable();
        std::vector<PageId> pages(Uniform(0, 5));
        for (PageId& page : pages) page = PickPage(false);
        expected_ = ModelInstall(world_, t, pages);
        return world_.tables[t].InstallSharedPrefix(pages, *pool_).code();
      }
      case Op::kReleaseAll: {
        const int t = PickTable();
        expected_ = ModelReleaseAll(world_, t);
        return world_.tables[t].ReleaseAll(*pool_).code();
      }
      case Op::kReleaseHeld: {
        // Last taken first. A held page may have been released behind the
        // test's back (by a table or a random release): then both refuse.
        for (auto it = world_.held.rbegin(); it != world_.held.rend(); ++it) {
          REQUIRE(pool_->Release(*it).code() == model.Release(*it));
        }
        world_.held.clear();
        expected_ = Code::kOk;
        return Code::kOk;
      }
      case Op::kBeginTransaction: {
        expected_ = Code::kOk;
        if (model.depth == kMaxDepth) return Code::kOk;
        saved_.push_back(Saved{world_, pool_->BeginTransaction()});
        ++model.depth;
        return Code::kOk;
      }
      case Op::kCommitTransaction:
      case Op::kRollbackTransaction: {
        const bool commit = op == Op::kCommitTransaction;
        if (saved_.empty() || Chance(10)) {
          // A savepoint that is not the innermost one's is refused.
          BlockPool::Savepoint wrong;
          wrong.depth = model.depth + 1;
          expected_ = Code::kFailedPrecondition;
          return (commit ? pool_->CommitTransaction(wrong)
                         : pool_->RollbackTransaction(wrong))
              .code();
        }
        const Saved saved = std::move(saved_.back());
        saved_.pop_back();
        expected_ = Code::kOk;
        if (commit) {
          --model.depth;
          return pool_->CommitTransaction(saved.savepoint).code();
        }
        world_ = saved.world;  // Tables are restored from their copies.
        return pool_->RollbackTransaction(saved.savepoint).code();
      }
      case Op::kResetPrefixCache:
        expected_ = model.Reset();
        return pool_->ResetPrefixCache().code();
      case Op::kLoadFromHost: {
        const BlockHash key = PickHostKey();
        const int32_t group = Chance(3) ? kMaxKvCacheGroups : 0;
        PageId expected = kNoPage;
        expected_ = model.LoadFromHost(key, group, expected);
        auto page = pool_->LoadFromHost(key, group);
        if (page.ok()) {
          REQUIRE(*page == expected);
          world_.held.push_back(*page);
          loaded_key_[*page] = key;
        }
        return page.status().code();
      }
      case Op::kTakeHostCopies: {
        std::vector<HostCopy> expected;
        expected_ = model.Take(expected);
        const BlockPoolSnapshot open = pool_->Snapshot();
        std::vector<HostCopy> copies;
        const absl::Status status = pool_->TakeHostCopies(copies);
        if (status.ok()) {
          REQUIRE(copies == expected);
          if (!copies.empty()) ++(*counts_)["(host copies taken)"];
          if (pool_->host_pages() > 0) RunCopies(copies, open);
        }
        return status.code();
      }
      case Op::kUseHostPages: {
        std::vector<BlockHash> keys(Uniform(0, 3));
        for (BlockHash& key : keys) key = PickHostKey();
        expected_ = model.UseHostPages(keys);
        return pool_->UseHostPages(keys).code();
      }
      case Op::kHostLookup: {
        const BlockHash key = PickHostKey();
        REQUIRE(pool_->HostLookup(key) == model.HostFind(key));
        expected_ = Code::kOk;
        return Code::kOk;
      }
    }
    return Code::kUnknown;
  }

  std::mt19937 rng_;
  std::unique_ptr<BlockPool> pool_;
  World world_;
  std::vector<Saved> saved_;
  absl::StatusCode expected_ = Code::kOk;
  // The key whose KV each device and host page holds (unset: none yet).
  std::vector<std::optional<BlockHash>> device_content_;
  std::vector<std::optional<BlockHash>> host_content_;
  // By device page: the key of its last load.
  std::vector<std::optional<BlockHash>> loaded_key_;
  std::map<std::string, int>* counts_ = nullptr;  // Run's.
};

TEST_CASE("random operations match the reference model") {
  // kvblock's eviction order, then vLLM's options.
  const bool vllm = GENERATE(false, true);
  // {seed, pages, max refcount}: small pools so exhaustion and eviction are
  // frequent; a low maximum refcount so overflow is reached.
  const struct {
    uint32_t seed;
    int32_t num_pages;
    int32_t max_refcount;
  } runs[] = {
      {1, 12, 4}, {2, 24, 3}, {3, 8, 6}, {4, 32, 5}, {5, 16, 2},
  };
  constexpr int kStepsPerRun = 16000;
  std::map<std::string, int> counts;
  BlockPoolStats totals;  // Of the work that was not rolled back.
  for (const auto& run : runs) {
    INFO("seed " << run.seed << ", " << run.num_pages << " pages, max refcount "
                 << run.max_refcount << (vllm ? ", vLLM's options" : ""));
    const BlockPoolStats stats = RandomRun({.seed = run.seed,
                                            .num_pages = run.num_pages,
                                            .max_refcount = run.max_refcount,
                                            .vllm = vllm})
                                     .Run(kStepsPerRun, counts);
    totals.evictions += stats.evictions;
    totals.cow_copies += stats.cow_copies;
    totals.cache_revivals += stats.cache_revivals;
  }
  CAPTURE(totals.evictions, totals.cow_copies, totals.cache_revivals);
  REQUIRE(totals.evictions > 100);
  REQUIRE(totals.cow_copies > 300);
  REQUIRE(totals.cache_revivals > 300);
  for (const auto& [name, count] : counts) {
    if (name.front() == '(') continue;
    CAPTURE(name, count);
    REQUIRE(count > 1000);
  }
  // Steps that left some hash cached on more than one page.
  CAPTURE(counts["(duplicates held)"]);
  REQUIRE(counts["(duplicates held)"] > 5000);
}

TEST_CASE("random operations with a host tier match the reference model") {
  const bool vllm = GENERATE(false, true);
  const bool write_through = GENERATE(false, true);
  // {seed, pages, host pages}: host tiers smaller and larger than the pool.
  const struct {
    uint32_t seed;
    int32_t num_pages;
    int32_t host_pages;
  } runs[] = {{11, 12, 6}, {12, 8, 24}, {13, 16, 16}, {14, 6, 3}};
  constexpr int kStepsPerRun = 16000;
  std::map<std::string, int> counts;
  BlockPoolStats totals;
  for (const auto& run : runs) {
    INFO("seed " << run.seed << ", " << run.num_pages << " pages, "
                 << run.host_pages << " host pages"
                 << (vllm ? ", vLLM's options" : "")
                 << (write_through ? ", write-through" : ""));
    const BlockPoolStats stats = RandomRun({.seed = run.seed,
                                            .num_pages = run.num_pages,
                                            .max_refcount = 4,
                                            .vllm = vllm,
                                            .host_pages = run.host_pages,
                                            .write_through = write_through})
                                     .Run(kStepsPerRun, counts);
    totals.host_stores += stats.host_stores;
    totals.host_loads += stats.host_loads;
    totals.host_evictions += stats.host_evictions;
    totals.host_store_skips += stats.host_store_skips;
  }
  CAPTURE(totals.host_stores, totals.host_loads, totals.host_evictions,
          totals.host_store_skips, counts["(host copies taken)"]);
  REQUIRE(totals.host_stores > 120);
  REQUIRE(totals.host_loads > 100);
  REQUIRE(totals.host_evictions > 4);
  REQUIRE(totals.host_store_skips > 50);
  REQUIRE(counts["(host copies taken)"] > 120);
  REQUIRE(counts["load_from_host"] > 1000);
}

}  // namespace
}  // namespace kvblock
