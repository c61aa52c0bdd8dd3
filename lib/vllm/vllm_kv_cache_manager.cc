// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "kvblock/vllm_kv_cache_manager.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "cache/cache_event_log.h"
#include "kvblock/status_macros.h"

namespace kvblock {
namespace {

// Token counts add up without overflowing: a sum past int64 is int64's
// largest, which no pool holds (vLLM's Python ints never overflow).
int64_t Add(int64_t a, int64_t b) {
  int64_t sum;
  return __builtin_add_overflow(a, b, &sum) ? INT64_MAX : sum;
}

}  // namespace

absl::StatusOr<std::unique_ptr<VllmKvCacheManager>> VllmKvCacheManager::Create(
    const VllmKvCacheManagerOptions& options) {
  auto bad = [](auto&&... parts) {
    return absl::InvalidArgumentError(
        absl::StrCat("vllm kv cache manager: ", parts...));
  };
  if (options.num_blocks < 1) {
    return bad("num_blocks must be positive (block 0 is the null block), got ",
               options.num_blocks);
  }
  if (options.block_size < 1) {
    return bad("block_size must be positive, got ", options.block_size);
  }
  if (options.max_model_len < 1) {
    return bad("max_model_len must be positive, got ", options.max_model_len);
  }
  KVBLOCK_ASSIGN_OR_RETURN(
      std::unique_ptr<BlockPool> pool,
      BlockPool::Create(options.num_blocks,
                        {.eviction_order = options.eviction_order,
                         .index_duplicates = true}));
  return std::unique_ptr<VllmKvCacheManager>(
      new VllmKvCacheManager(options, std::move(pool)));
}

VllmKvCacheManager::VllmKvCacheManager(const VllmKvCacheManagerOptions& options,
                                       std::unique_ptr<BlockPool> pool)
    : options_(options), pool_(std::move(pool)) {
  // Both eviction orders hand out page 0 first: it becomes the null block.
  [[maybe_unused]] const absl::StatusOr<PageId> null_block = pool_->Allocate();
  assert(null_block.ok() && *null_block == kNullBlock);
  if (options_.enable_kv_cache_events) {
    events_ = std::make_unique<internal::CacheEventLog>();
    pool_->set_event_log(events_.get());
  }
}

VllmKvCacheManager::~VllmKvCacheManager() = default;

absl::Span<const PageId> VllmKvCacheManager::FindLongestCacheHit(
    absl::Span<const BlockHash> block_hashes, int64_t max_length) {
  hit_.clear();
  if (!options_.enable_caching) return hit_;
  const int64_t max_blocks =
      std::min<int64_t>(std::max<int64_t>(max_length, 0) / options_.block_size,
                        static_cast<int64_t>(block_hashes.size()));
  for (int64_t i = 0; i < max_blocks; ++i) {
    const std::optional<PageId> block = pool_->Lookup(block_hashes[i]);
    if (!block) break;
    hit_.push_back(*block);
  }
  if (options_.use_eagle && !hit_.empty()) hit_.pop_back();
  return hit_;
}

bool VllmKvCacheManager::IsHitUnchanged(
    absl::Span<const BlockHash> block_hashes, int64_t max_length,
    absl::Span<const PageId> hit) const {
  if (!options_.enable_caching) return hit.empty();
  if (options_.use_eagle && hit.empty()) return false;
  const size_t max_blocks = static_cast<size_t>(
      std::min<int64_t>(std::max<int64_t>(max_length, 0) / options_.block_size,
                        static_cast<int64_t>(block_hashes.size())));
  // The walk found `walked` blocks: the hit, and with eagle one more.
  const size_t walked = hit.size() + (options_.use_eagle ? 1 : 0);
  if (walked > max_blocks) return false;
  for (size_t i = 0; i < hit.size(); ++i) {
    if (!pool_->IsIndexedAs(hit[i], block_hashes[i])) return false;
  }
  if (walked > hit.size() && !pool_->Lookup(block_hashes[hit.size()])) {
    return false;
  }
  return walked == max_blocks || !pool_->Lookup(block_hashes[walked]);
}

int64_t VllmKvCacheManager::BlocksToAllocate(
    const Request* request, int64_t num_tokens,
    absl::Span<const PageId> hits) const {
  const int64_t held = request == nullptr ? 0 : request->blocks.size();
  int64_t evictable = 0;
  for (PageId block : hits) evictable += pool_->RefCount(block) == 0 ? 1 : 0;
  return std::max<int64_t>(
             CeilBlocks(num_tokens) - held - static_cast<int64_t>(hits.size()),
             0) +
         evictable;
}

absl::StatusOr<std::pair<int32_t, int32_t>> VllmKvCacheManager::BlocksToCache(
    absl::string_view request_id, int32_t num_cached,
    absl::Span<const BlockHash> block_hashes, int64_t num_tokens) const {
  // As vLLM, blocks past the ones held count as cached too (allocate_slots
  // holds every block of the computed tokens).
  const int64_t full = num_tokens / options_.block_size;
  if (full <= num_cached) return std::pair{num_cached, num_cached};
  if (static_cast<int64_t>(block_hashes.size()) < full) {
    return absl::InvalidArgumentError(
        absl::StrCat("vllm kv cache manager: request ", request_id, " has ",
                     block_hashes.size(), " block hashes; caching its ",
                     num_tokens, " computed tokens needs ", full));
  }
  return std::pair{num_cached, static_cast<int32_t>(full)};
}

void VllmKvCacheManager::Cache(Request& request, int32_t from, int32_t to,
                               absl::Span<const BlockHash> block_hashes) {
  const int32_t held = static_cast<int32_t>(request.blocks.size());
  for (int32_t i = from; i < std::min(to, held); ++i) {
    // Cannot fail: the block is used by the request and uncached (a hit
    // keeps its hash and is never cached again; a new block has none).
    [[maybe_unused]] const absl::StatusOr<PageId> cached =
        pool_->RegisterCached(request.blocks[i], block_hashes[i]);
    assert(cached.ok());
  }
  if (to > from) request.num_cached_blocks = to;
}

absl::Status VllmKvCacheManager::Allocate(Request& request, int64_t count) {
  if (count <= 0) return absl::OkStatus();
  const size_t first = request.blocks.size();
  request.blocks.resize(first + count);
  const absl::Status status =
      pool_->AllocateN(absl::MakeSpan(request.blocks).subspan(first));
  if (!status.ok()) {
    request.blocks.resize(first);
    return status;
  }
  new_blocks_.insert(new_blocks_.end(), request.blocks.begin() + first,
                     request.blocks.end());
  return absl::OkStatus();
}

absl::StatusOr<VllmSlotResult> VllmKvCacheManager::AllocateSlots(
    const VllmSlotRequest& slots) {
  auto bad = [&slots](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vllm kv cache manager: request ", slots.request_id, ": ", parts...));
  };
  if (slots.num_new_tokens < 0 || slots.num_new_computed_tokens < 0 ||
      slots.num_lookahead_tokens < 0 ||
      slots.num_external_computed_tokens < 0 || slots.num_computed_tokens < 0 ||
      slots.num_tokens < 0) {
    return bad("token counts must be non-negative, got num_tokens ",
               slots.num_tokens, ", num_computed_tokens ",
               slots.num_computed_tokens, ", num_new_tokens ",
               slots.num_new_tokens, ", num_new_computed_tokens ",
               slots.num_new_computed_tokens, ", num_lookahead_tokens ",
               slots.num_lookahead_tokens, ", num_external_computed_tokens ",
               slots.num_external_computed_tokens);
  }
  if (slots.num_new_tokens == 0 && slots.num_external_computed_tokens == 0) {
    return bad(
        "num_new_tokens must be greater than 0 when there are no external "
        "computed tokens");
  }
  auto found = by_id_.find(slots.request_id);
  Request* request = found == by_id_.end() ? nullptr : &found->second;
  const absl::Span<const PageId> hits = slots.new_computed_blocks;
  const bool running = request != nullptr && request->num_cached_blocks >= 0;
  const bool takes_hits =
      !running && (!hits.empty() || slots.num_external_computed_tokens > 0);
  if ((!hits.empty() && running) ||
      (takes_hits && request != nullptr && !request->blocks.empty())) {
    return bad("holds ", request->blocks.size(),
               " blocks: prefix hits and external computed tokens are for a "
               "request's first allocation");
  }
  for (size_t i = 0; i < hits.size(); ++i) {
    if (hits[i] == kNullBlock || !pool_->CachedHash(hits[i])) {
      return bad("computed block ", i, " (id ", hits[i], ") is not cached");
    }
  }

  const int64_t num_local_computed =
      Add(slots.num_computed_tokens, slots.num_new_computed_tokens);
  const int64_t num_total_computed =
      Add(num_local_computed, slots.num_external_computed_tokens);
  const int64_t total_computed =
      std::min(num_total_computed, options_.max_model_len);
  if (slots.full_sequence_must_fit &&
      BlocksToAllocate(request,
                       std::min(slots.num_tokens, options_.max_model_len),
                       hits) > pool_->NumFree()) {
    return VllmSlotResult{};
  }
  const int64_t num_tokens_main_model =
      Add(total_computed, slots.num_new_tokens);
  const int64_t num_need_slot =
      std::min(Add(num_tokens_main_model, slots.num_lookahead_tokens),
               options_.max_model_len);
  if (BlocksToAllocate(request, num_need_slot, hits) > pool_->NumFree()) {
    return VllmSlotResult{};
  }

  // What the request will hold once its hits are in, for the cache check.
  const int64_t held_after_hits =
      (request ? request->blocks.size() : 0) + hits.size();
  // vLLM allocates blocks for external tokens only when there are some.
  const int64_t external_blocks =
      takes_hits && slots.num_external_computed_tokens > 0
          ? std::max<int64_t>(CeilBlocks(num_total_computed) - held_after_hits,
                              0)
          : 0;
  const int64_t held_after =
      std::max(held_after_hits + external_blocks, CeilBlocks(num_need_slot));
  const bool cache = options_.enable_caching && !slots.delay_cache_blocks;
  const int32_t num_cached =
      takes_hits ? static_cast<int32_t>(held_after_hits)
                 : std::max(request ? request->num_cached_blocks : 0, 0);
  const int64_t num_tokens_to_cache =
      std::min(num_tokens_main_model, slots.num_tokens);
  if (cache) {
    const int64_t full = std::min<int64_t>(
        num_tokens_to_cache / options_.block_size, held_after);
    if (full > num_cached &&
        static_cast<int64_t>(slots.block_hashes.size()) < full) {
      return bad("has ", slots.block_hashes.size(),
                 " block hashes; caching its ", num_tokens_to_cache,
                 " computed tokens needs ", full);
    }
  }

  // Checked: from here the call cannot fail but for a broken invariant, and
  // the transaction undoes the pool's part then.
  const bool is_new = request == nullptr;
  if (is_new) request = &NewRequest(slots.request_id);
  const size_t new_blocks_before = new_blocks_.size();
  const BlockPool::Savepoint savepoint = pool_->BeginTransaction();
  absl::Cleanup undo = [&] {
    pool_->RollbackTransaction(savepoint).IgnoreError();
    new_blocks_.resize(new_blocks_before);
    if (is_new) by_id_.erase(slots.request_id);
  };
  if (takes_hits) {
    KVBLOCK_RETURN_IF_ERROR(pool_->AcquireCached(hits));
    request->blocks.insert(request->blocks.end(), hits.begin(), hits.end());
    request->num_cached_blocks = static_cast<int32_t>(request->blocks.size());
    KVBLOCK_RETURN_IF_ERROR(Allocate(*request, external_blocks));
  }
  const int32_t first_new = static_cast<int32_t>(request->blocks.size());
  KVBLOCK_RETURN_IF_ERROR(
      Allocate(*request, CeilBlocks(num_need_slot) -
                             static_cast<int64_t>(request->blocks.size())));
  VllmSlotResult result{.allocated = true, .first_new_block = first_new};
  if (cache) {
    KVBLOCK_ASSIGN_OR_RETURN(
        const auto range,
        BlocksToCache(slots.request_id, num_cached, slots.block_hashes,
                      num_tokens_to_cache));
    Cache(*request, range.first, range.second, slots.block_hashes);
    result.cached_from = range.first;
    result.cached_to = std::min<int32_t>(
        range.second, static_cast<int32_t>(request->blocks.size()));
  }
  std::move(undo).Cancel();
  KVBLOCK_RETURN_IF_ERROR(pool_->CommitTransaction(savepoint));
  return result;
}

absl::StatusOr<std::pair<int32_t, int32_t>> VllmKvCacheManager::CacheBlocks(
    absl::string_view request_id, absl::Span<const BlockHash> block_hashes,
    int64_t num_tokens) {
  if (!options_.enable_caching) return std::pair{0, 0};
  auto found = by_id_.find(request_id);
  const Request none;
  const Request& known = found == by_id_.end() ? none : found->second;
  KVBLOCK_ASSIGN_OR_RETURN(
      const auto range,
      BlocksToCache(request_id, std::max(known.num_cached_blocks, 0),
                    block_hashes, num_tokens));
  if (range.first == range.second) return range;
  // vLLM's cache_blocks enters an unknown request (its defaultdict), with
  // its count of cached blocks.
  Request& request =
      found == by_id_.end() ? NewRequest(request_id) : found->second;
  Cache(request, range.first, range.second, block_hashes);
  return std::pair{range.first,
                   std::min<int32_t>(range.second, request.blocks.size())};
}

void VllmKvCacheManager::Free(absl::string_view request_id) {
  auto found = by_id_.find(request_id);
  if (found == by_id_.end()) return;
  std::vector<PageId>& blocks = found->second.blocks;
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    // Cannot fail: the request holds a reference on each.
    [[maybe_unused]] const absl::Status released = pool_->Release(*it);
    assert(released.ok());
  }
  blocks.clear();
  spare_lists_.push_back(std::move(blocks));
  by_id_.erase(found);
}

absl::Status VllmKvCacheManager::EvictBlocks(
    absl::Span<const PageId> block_ids) {
  for (PageId block : block_ids) {
    if (block < 0 || block >= options_.num_blocks) {
      return absl::InvalidArgumentError(
          absl::StrCat("vllm kv cache manager: block id ", block,
                       " is not in [0, ", options_.num_blocks, ")"));
    }
  }
  for (PageId block : block_ids) {
    KVBLOCK_RETURN_IF_ERROR(pool_->Uncache(block).status());
  }
  return absl::OkStatus();
}

bool VllmKvCacheManager::ResetPrefixCache() {
  if (pool_->NumUsed() != 1) return false;  // The null block's only.
  return pool_->ResetPrefixCache().ok();
}

absl::Span<const PageId> VllmKvCacheManager::Blocks(
    absl::string_view request_id) const {
  auto found = by_id_.find(request_id);
  if (found == by_id_.end()) return {};
  return found->second.blocks;
}

VllmKvCacheManager::Request& VllmKvCacheManager::NewRequest(
    absl::string_view request_id) {
  Request& request = by_id_[request_id];
  if (!spare_lists_.empty()) {
    request.blocks = std::move(spare_lists_.back());
    spare_lists_.pop_back();
  }
  return request;
}

int32_t VllmKvCacheManager::GetNumCommonPrefixBlocks(
    absl::string_view request_id) {
  // vLLM reads its defaultdict here, entering an unknown request (with no
  // blocks) until it is freed; the count of requests includes it.
  auto found = by_id_.find(request_id);
  if (found == by_id_.end()) {
    NewRequest(request_id);
    return 0;
  }
  int32_t common = 0;
  for (PageId block : found->second.blocks) {
    if (pool_->RefCount(block) != num_requests()) break;
    ++common;
  }
  return common;
}

std::vector<PageId> VllmKvCacheManager::TakeNewBlockIds() {
  std::vector<PageId> ids;
  ids.swap(new_blocks_);
  return ids;
}

std::vector<BlockHash> VllmKvCacheManager::TakeRemovedHashes() {
  std::vector<BlockHash> hashes;
  if (events_ == nullptr) return hashes;
  for (size_t i = 0; i < static_cast<size_t>(events_->num_records()); ++i) {
    if (events_->kind(i) == KvCacheEvent::Kind::kBlockRemoved) {
      hashes.push_back(events_->hash(i));
    }
  }
  events_->Clear();
  return hashes;
}

double VllmKvCacheManager::Usage() const {
  const int32_t real_blocks = options_.num_blocks - 1;
  if (real_blocks == 0) return 0.0;
  return 1.0 - static_cast<double>(pool_->NumFree()) / real_blocks;
}

absl::Status VllmKvCacheManager::CheckInvariants() const {
  KVBLOCK_RETURN_IF_ERROR(pool_->CheckInvariants());
  int64_t references = 1;  // The null block's.
  for (const auto& [id, request] : by_id_) {
    for (PageId block : request.blocks) {
      if (block == kNullBlock || pool_->RefCount(block) == 0) {
        return absl::InternalError(
            absl::StrCat("vllm kv cache manager: request ", id, " holds block ",
                         block, ", which is not in use"));
      }
    }
    if (request.num_cached_blocks >
        static_cast<int32_t>(request.blocks.size())) {
      return absl::InternalError(
          absl::StrCat("vllm kv cache manager: request ", id, " has ",
                       request.num_cached_blocks, " cached of ",
                       request.blocks.size(), " blocks"));
    }
    references += static_cast<int64_t>(request.blocks.size());
  }
  int64_t counted = 0;
  for (PageId block = 0; block < options_.num_blocks; ++block) {
    counted += pool_->RefCount(block);
  }
  if (counted != references) {
    return absl::InternalError(absl::StrCat(
        "vllm kv cache manager: requests and the null block hold ", references,
        " block references, the pool counts ", counted));
  }
  return absl::OkStatus();
}

}  // namespace kvblock
