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
#include "base/reservation.h"
#include "cache/cache_event_log.h"
#include "cache/group_key.h"
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
  if (options.num_blocks < 1 || options.num_blocks > kMaxNumPages) {
    return bad("num_blocks must be in [1, ", kMaxNumPages,
               "] (block 0 is the null block), got ", options.num_blocks);
  }
  if (options.block_size < 1) {
    return bad("block_size must be positive, got ", options.block_size);
  }
  if (options.max_model_len < 1) {
    return bad("max_model_len must be positive, got ", options.max_model_len);
  }
  if (options.max_num_batched_tokens < 0) {
    return bad("max_num_batched_tokens must be non-negative, got ",
               options.max_num_batched_tokens);
  }
  std::vector<KvCacheGroupSpec> groups = options.kv_cache_groups;
  if (groups.empty()) groups.push_back({.page_size = options.block_size});
  KVBLOCK_RETURN_IF_ERROR(ValidateKvCacheGroups(groups));
  // vLLM's coordinator: groups marked is_eagle_group drop a hit's last
  // block, or every group when use_eagle marks none.
  const bool marked =
      std::any_of(groups.begin(), groups.end(),
                  [](const auto& group) { return group.eagle; });
  for (size_t g = 0; g < groups.size(); ++g) {
    if (options.use_eagle && !marked) groups[g].eagle = true;
    if (options.enable_caching &&
        groups[g].page_size % options.block_size != 0) {
      return bad("kv cache group ", g, ": block size ", groups[g].page_size,
                 " is not a multiple of the hash block size ",
                 options.block_size);
    }
  }
  if (options.host_pages < 0 || options.host_pages > kMaxNumPages) {
    return bad("host_pages must be in [0, ", kMaxNumPages, "], got ",
               options.host_pages);
  }
  if (options.host_pages > 0 && !options.enable_caching) {
    return bad("host_pages = ", options.host_pages,
               " needs caching on (the host tier keeps cached blocks)");
  }
  if (options.host_pages > 0 &&
      (groups.size() != 1 || groups[0].kind != AttentionKind::kFull)) {
    return bad("host_pages = ", options.host_pages, " with ", groups.size(),
               " kv cache group", groups.size() == 1 ? " of " : "s, the first ",
               AttentionKindName(groups[0].kind),
               ": the host tier serves one full-attention group");
  }
  // vLLM's coordinator without prefix caching looks no hit up, nor asserts
  // what hits need (ValidateGroupCacheHits).
  std::optional<GroupCacheHitFinder> finder;
  if (options.enable_caching) {
    KVBLOCK_ASSIGN_OR_RETURN(finder,
                             GroupCacheHitFinder::Create(groups, kNullBlock));
  }
  // What the constructor reserves beyond the pool, checked before it tries:
  // each block's hashes of its smaller blocks, for the groups of larger
  // pages (caching only).
  int64_t max_scale = 1;
  if (options.enable_caching) {
    for (const KvCacheGroupSpec& group : groups) {
      max_scale =
          std::max<int64_t>(max_scale, group.page_size / options.block_size);
    }
  }
  const BlockPoolOptions pool_options = {
      .eviction_order = options.eviction_order,
      .index_duplicates = true,
      .host_pages = options.host_pages,
      .host_write_policy = options.host_write_policy};
  internal::Reservation reservation("vllm kv cache manager");
  reservation.Add(options.num_blocks,
                  (max_scale - 1) * static_cast<int64_t>(sizeof(BlockHash)));
  // The pool's too: each part may fit where the sum does not.
  reservation.Add(1,
                  BlockPool::ReservedBytes(options.num_blocks, pool_options));
  KVBLOCK_RETURN_IF_ERROR(reservation.Check());
  KVBLOCK_ASSIGN_OR_RETURN(std::unique_ptr<BlockPool> pool,
                           BlockPool::Create(options.num_blocks, pool_options));
  std::unique_ptr<VllmKvCacheManager> manager;
  KVBLOCK_RETURN_IF_ERROR(reservation.Run([&] {
    manager.reset(new VllmKvCacheManager(options, std::move(groups),
                                         std::move(finder), std::move(pool)));
  }));
  return manager;
}

VllmKvCacheManager::VllmKvCacheManager(
    const VllmKvCacheManagerOptions& options,
    std::vector<KvCacheGroupSpec> groups,
    std::optional<GroupCacheHitFinder> finder, std::unique_ptr<BlockPool> pool)
    : options_(options),
      groups_(std::move(groups)),
      alignment_tokens_(AlignmentTokens(groups_)),
      finder_(std::move(finder)),
      pool_(std::move(pool)),
      new_blocks_(groups_.size()) {
  // Both eviction orders hand out page 0 first: it becomes the null block.
  [[maybe_unused]] const absl::StatusOr<PageId> null_block = pool_->Allocate();
  assert(null_block.ok() && *null_block == kNullBlock);
  if (options_.enable_kv_cache_events) {
    events_ = std::make_unique<internal::CacheEventLog>();
    pool_->set_event_log(events_.get());
  }
  const int64_t budget = options_.max_num_batched_tokens > 0
                             ? options_.max_num_batched_tokens
                             : options_.max_model_len;
  for (int32_t g = 0; g < num_groups(); ++g) {
    const KvCacheGroupSpec& group = groups_[g];
    salts_.push_back(internal::GroupKeySalt(g));
    windowed_ = windowed_ || group.kind != AttentionKind::kFull;
    // A group that leaves some blocks out leaves out the first of each
    // unit of a hit (CachesFullPage).
    masked_.push_back(!CachesFullPage(group, 0, alignment_tokens_));
    // Without caching nothing is hashed, and page sizes need not divide.
    scales_.push_back(std::max(group.page_size / options_.block_size, 1));
    if (options_.enable_caching) max_scale_ = std::max(max_scale_, Scale(g));
    // vLLM's max_admission_blocks_per_request: a window group holds at most
    // its window (or chunk) and a step's tokens.
    switch (group.kind) {
      case AttentionKind::kFull:
        admission_caps_.push_back(INT64_MAX);
        break;
      case AttentionKind::kSlidingWindow:
        admission_caps_.push_back(
            CeilBlocks(g, std::min(Add(group.sliding_window - 1, budget),
                                   options_.max_model_len)) +
            1);
        break;
      case AttentionKind::kChunkedLocal:
        admission_caps_.push_back(
            CeilBlocks(g, std::min(Add(group.attention_chunk_size, budget),
                                   options_.max_model_len)));
        break;
    }
  }
  if (max_scale_ > 1) {
    hash_prefixes_.resize(static_cast<size_t>(options_.num_blocks) *
                          (max_scale_ - 1));
  }
  slots_.resize(groups_.size());
  plans_.resize(groups_.size());
  plan_ranges_.resize(groups_.size());
}

VllmKvCacheManager::~VllmKvCacheManager() = default;

BlockHash VllmKvCacheManager::Key(int32_t group,
                                  absl::Span<const BlockHash> hashes,
                                  int64_t index) const {
  const BlockHash& hash = hashes[(index + 1) * Scale(group) - 1];
  // Group 0's salt is zero: its keys are the hashes.
  return group == 0 ? hash : internal::SaltKey(hash, salts_[group]);
}

const GroupCacheHit& VllmKvCacheManager::FindLongestCacheHit(
    absl::Span<const BlockHash> block_hashes, int64_t max_length) {
  if (!options_.enable_caching) max_length = 0;
  const int64_t known = static_cast<int64_t>(block_hashes.size());
  if (num_groups() == 1 && groups_[0].kind == AttentionKind::kFull) {
    // Most models: the finder's full-attention walk, its lookups inlined
    // (the finder's take a call each).
    hit_.pages.resize(1);
    std::vector<PageId>& pages = hit_.pages[0];
    pages.clear();
    const int64_t max_blocks =
        std::min(std::max<int64_t>(max_length, 0) / options_.block_size, known);
    for (int64_t i = 0; i < max_blocks; ++i) {
      const std::optional<PageId> block = pool_->Lookup(block_hashes[i]);
      if (!block) break;
      pages.push_back(*block);
    }
    if (groups_[0].eagle && !pages.empty()) pages.pop_back();
    hit_.hit_tokens = static_cast<int64_t>(pages.size()) * options_.block_size;
    return hit_;
  }
  if (!finder_.has_value()) {
    // Caching off: no finder was made (its group checks are caching's).
    hit_.hit_tokens = 0;
    hit_.pages.resize(groups_.size());
    for (std::vector<PageId>& pages : hit_.pages) pages.clear();
    return hit_;
  }
  finder_->Find(
      max_length,
      [&](int32_t group, int64_t page) {
        const int64_t last = (page + 1) * Scale(group) - 1;
        if (last >= known) return kNoPage;
        // Group 0's keys are its hashes: no copy to salt.
        const std::optional<PageId> block =
            group == 0 ? pool_->Lookup(block_hashes[last])
                       : pool_->Lookup(Key(group, block_hashes, page));
        return block ? *block : kNoPage;
      },
      hit_);
  return hit_;
}

bool VllmKvCacheManager::IsHitUnchanged(
    absl::Span<const BlockHash> block_hashes, int64_t max_length,
    const GroupCacheHit& hit) const {
  if (!options_.enable_caching) return hit.hit_tokens == 0;
  // One full-attention group: its hit is the cached run from block 0.
  if (num_groups() != 1 || groups_[0].kind != AttentionKind::kFull ||
      hit.pages.size() != 1) {
    return false;
  }
  const bool eagle = groups_[0].eagle;
  const absl::Span<const PageId> pages = hit.pages[0];
  if (eagle && pages.empty()) return false;
  const size_t max_blocks = static_cast<size_t>(
      std::min<int64_t>(std::max<int64_t>(max_length, 0) / options_.block_size,
                        static_cast<int64_t>(block_hashes.size())));
  // The walk found `walked` blocks: the hit, and with eagle one more.
  const size_t walked = pages.size() + (eagle ? 1 : 0);
  if (walked > max_blocks) return false;
  for (size_t i = 0; i < pages.size(); ++i) {
    if (!pool_->IsIndexedAs(pages[i], block_hashes[i])) return false;
  }
  if (walked > pages.size() && !pool_->Lookup(block_hashes[pages.size()])) {
    return false;
  }
  return walked == max_blocks || !pool_->Lookup(block_hashes[walked]);
}

int64_t VllmKvCacheManager::BlocksToAllocate(const Request* request,
                                             int64_t num_tokens,
                                             const VllmSlotRequest& slots,
                                             int64_t total_computed,
                                             bool capped) const {
  int64_t total = 0;
  for (int32_t g = 0; g < num_groups(); ++g) {
    // vLLM's SingleTypeKVCacheManager.get_num_blocks_to_allocate.
    int64_t required = CeilBlocks(g, num_tokens);
    if (capped) required = std::min(required, admission_caps_[g]);
    const GroupBlocks* held =
        request == nullptr ? nullptr : &request->groups[g];
    const int64_t num_held = held == nullptr ? 0 : held->blocks.size();
    if (held != nullptr && held->num_cached >= 0) {
      // A running request: no hits.
      total += std::max<int64_t>(required - num_held, 0);
      continue;
    }
    const absl::Span<const PageId> hits =
        g < static_cast<int32_t>(slots.new_computed_blocks.size())
            ? slots.new_computed_blocks[g]
            : absl::Span<const PageId>();
    const int64_t skipped = NumSkippedPages(groups_[g], total_computed);
    const int64_t local = static_cast<int64_t>(hits.size()) + num_held;
    total += std::max<int64_t>(required - std::max(skipped, local), 0);
    // Hits past the skipped ones that are evictable leave the free count.
    const size_t first_kept = static_cast<size_t>(std::min<int64_t>(
        std::max<int64_t>(skipped - num_held, 0), hits.size()));
    for (size_t i = first_kept; i < hits.size(); ++i) {
      if (hits[i] != kNullBlock && pool_->RefCount(hits[i]) == 0) ++total;
    }
  }
  return total;
}

void VllmKvCacheManager::RemoveSkipped(Request& request,
                                       int64_t total_computed_tokens) {
  for (int32_t g = 0; g < num_groups(); ++g) {
    std::vector<PageId>& blocks = request.groups[g].blocks;
    const int64_t skipped = std::min<int64_t>(
        NumSkippedPages(groups_[g], total_computed_tokens), blocks.size());
    // Newest first, down to the first block skipped already.
    for (int64_t i = skipped - 1; i >= 0 && blocks[i] != kNullBlock; --i) {
      // Cannot fail: the request holds a reference on it.
      [[maybe_unused]] const absl::Status released = pool_->Release(blocks[i]);
      assert(released.ok());
      blocks[i] = kNullBlock;
    }
  }
}

int64_t VllmKvCacheManager::SkippedFrees(const Request& request,
                                         int64_t total_computed_tokens) const {
  int64_t frees = 0;
  for (int32_t g = 0; g < num_groups(); ++g) {
    const std::vector<PageId>& blocks = request.groups[g].blocks;
    const int64_t skipped = std::min<int64_t>(
        NumSkippedPages(groups_[g], total_computed_tokens), blocks.size());
    for (int64_t i = skipped - 1; i >= 0 && blocks[i] != kNullBlock; --i) {
      frees += pool_->RefCount(blocks[i]) == 1 ? 1 : 0;
    }
  }
  return frees;
}

void VllmKvCacheManager::RemoveSkippedBlocks(absl::string_view request_id,
                                             int64_t total_computed_tokens) {
  // No token computed skips none (vLLM's max(0, ...)); a negative count
  // would overflow NumSkippedTokens.
  if (total_computed_tokens <= 0) return;
  auto found = by_id_.find(request_id);
  if (found != by_id_.end())
    RemoveSkipped(found->second, total_computed_tokens);
}

absl::Status VllmKvCacheManager::BlocksToCache(
    absl::string_view request_id, absl::Span<const BlockHash> block_hashes,
    int64_t num_tokens) {
  // Hits are multiples of the page sizes' least common multiple: caching
  // stops at the last one (one group: at its page size, which changes
  // nothing).
  const int64_t alignment = alignment_tokens_;
  const int64_t aligned =
      num_groups() == 1 ? num_tokens : num_tokens / alignment * alignment;
  for (int32_t g = 0; g < num_groups(); ++g) {
    const GroupPlan& plan = plans_[g];
    const int64_t full = aligned / groups_[g].page_size;
    if (full <= plan.num_cached) {
      plan_ranges_[g] = {plan.num_cached, plan.num_cached};
      continue;
    }
    // As vLLM, blocks past the ones held count as cached too; the hashes
    // must reach them (vLLM asserts it) and cover the held ones.
    const int64_t needed =
        std::max(full, std::min(full, plan.held_after) * Scale(g));
    if (static_cast<int64_t>(block_hashes.size()) < needed) {
      return absl::InvalidArgumentError(absl::StrCat(
          "vllm kv cache manager: request ", request_id, " has ",
          block_hashes.size(), " block hashes; caching its ", num_tokens,
          " computed tokens",
          num_groups() > 1 ? absl::StrCat(" in kv cache group ", g) : "",
          " needs ", needed));
    }
    plan_ranges_[g] = {plan.num_cached, static_cast<int32_t>(full)};
  }
  return absl::OkStatus();
}

void VllmKvCacheManager::Cache(Request& request,
                               absl::Span<const BlockHash> block_hashes) {
  for (int32_t g = 0; g < num_groups(); ++g) {
    GroupBlocks& group = request.groups[g];
    const auto [from, to] = plan_ranges_[g];
    if (to <= from) {  // most decode steps fill no block.
      slots_[g].cached_from = slots_[g].cached_to = from;
      continue;
    }
    const int32_t held = static_cast<int32_t>(group.blocks.size());
    const int64_t scale = Scale(g);
    for (int32_t i = from; i < std::min(to, held); ++i) {
      const PageId block = group.blocks[i];
      if (block == kNullBlock || (masked_[g] && !CachesBlock(g, i))) continue;
      const BlockHash key = Key(g, block_hashes, i);
      // Cannot fail: the block is used by the request and uncached (a hit
      // keeps its hash and is never cached again; a new block has none).
      [[maybe_unused]] const absl::StatusOr<PageId> cached =
          pool_->RegisterCached(block, key, g);
      assert(cached.ok());
      if (scale == 1) continue;
      const auto prefix = block_hashes.subspan(i * scale, scale - 1);
      std::copy(prefix.begin(), prefix.end(),
                hash_prefixes_.begin() + block * (max_scale_ - 1));
      if (events_ != nullptr) {
        KeyPrefix& kept = key_prefixes_[key];
        kept.hashes.assign(prefix.begin(), prefix.end());
        ++kept.blocks;
      }
    }
    group.num_cached = to;
    slots_[g].cached_from = from;
    slots_[g].cached_to = std::min(to, held);
  }
}

absl::Status VllmKvCacheManager::Allocate(int32_t group, GroupBlocks& blocks,
                                          int64_t count) {
  if (count <= 0) return absl::OkStatus();
  std::vector<PageId>& list = blocks.blocks;
  const size_t first = list.size();
  list.resize(first + count);
  const absl::Status status =
      pool_->AllocateN(absl::MakeSpan(list).subspan(first));
  if (!status.ok()) {
    list.resize(first);
    return status;
  }
  new_blocks_[group].insert(new_blocks_[group].end(), list.begin() + first,
                            list.end());
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
  const auto& hits = slots.new_computed_blocks;
  if (!hits.empty() && static_cast<int32_t>(hits.size()) != num_groups()) {
    return bad("new_computed_blocks has ", hits.size(),
               " lists, one a kv cache group (", num_groups(), ") or none");
  }
  auto found = by_id_.find(slots.request_id);
  Request* request = found == by_id_.end() ? nullptr : &found->second;
  // vLLM enters a request in every group at once: one group tells.
  const bool running = request != nullptr && request->groups[0].num_cached >= 0;
  const bool has_hits = std::any_of(hits.begin(), hits.end(),
                                    [](auto list) { return !list.empty(); });
  const bool takes_hits =
      !running && (has_hits || slots.num_external_computed_tokens > 0);
  int64_t num_held = 0;
  if (request != nullptr) {
    for (const GroupBlocks& group : request->groups) {
      num_held += group.blocks.size();
    }
  }
  if ((has_hits && running) || (takes_hits && num_held > 0)) {
    return bad("holds ", num_held,
               " blocks: prefix hits and external computed tokens are for a "
               "request's first allocation");
  }
  for (size_t g = 0; g < hits.size(); ++g) {
    for (size_t i = 0; i < hits[g].size(); ++i) {
      const PageId block = hits[g][i];
      const bool skipped =
          block == kNullBlock && groups_[g].kind != AttentionKind::kFull;
      if (!skipped && (block == kNullBlock || !pool_->CachedHash(block))) {
        return bad(
            "computed block ", i,
            num_groups() > 1 ? absl::StrCat(" of kv cache group ", g) : "",
            " (id ", block, ") is not cached");
      }
    }
  }

  const int64_t num_local_computed =
      Add(slots.num_computed_tokens, slots.num_new_computed_tokens);
  const int64_t num_total_computed =
      Add(num_local_computed, slots.num_external_computed_tokens);
  const int64_t total_computed =
      std::min(num_total_computed, options_.max_model_len);
  if (slots.full_sequence_must_fit &&
      BlocksToAllocate(
          request, std::min(slots.num_tokens, options_.max_model_len), slots,
          total_computed, /*capped=*/true) > pool_->NumFree()) {
    return VllmSlotResult{};
  }
  const int64_t num_tokens_main_model =
      Add(total_computed, slots.num_new_tokens);
  const int64_t num_need_slot =
      std::min(Add(num_tokens_main_model, slots.num_lookahead_tokens),
               options_.max_model_len);

  // What each group will hold, for the cache check.
  for (int32_t g = 0; g < num_groups(); ++g) {
    GroupPlan& plan = plans_[g];
    const int64_t held =
        request == nullptr ? 0 : request->groups[g].blocks.size();
    plan.skipped = 0;
    plan.external_blocks = 0;
    plan.after_hits = held;
    plan.num_cached =
        request == nullptr ? 0 : std::max(request->groups[g].num_cached, 0);
    if (takes_hits) {
      // vLLM's allocate_new_computed_blocks: the skipped hits are null.
      const int64_t skipped_tokens =
          NumSkippedTokens(groups_[g], num_total_computed);
      plan.skipped = skipped_tokens / groups_[g].page_size;
      const int64_t skipped = plan.skipped;
      const int64_t num_hits = hits.empty() ? 0 : hits[g].size();
      plan.after_hits = std::max(skipped, num_hits);
      plan.num_cached = static_cast<int32_t>(plan.after_hits);
      const int64_t external =
          skipped > 0 ? std::min(num_total_computed - skipped_tokens,
                                 slots.num_external_computed_tokens)
                      : slots.num_external_computed_tokens;
      if (external > 0) {
        plan.external_blocks = std::max<int64_t>(
            CeilBlocks(g, num_total_computed) - plan.after_hits, 0);
      }
    }
    plan.held_after = std::max(plan.after_hits + plan.external_blocks,
                               CeilBlocks(g, num_need_slot));
  }
  // Without hits to take, the blocks are added to those held: a window
  // that skips blocks the request never held (computed tokens past its
  // blocks, which vLLM's check counts as null blocks and its allocation
  // then takes from the pool: a ValueError there) is refused before
  // anything changes.
  if (!takes_hits) {
    for (int32_t g = 0; g < num_groups(); ++g) {
      const int64_t held =
          request == nullptr ? 0 : request->groups[g].blocks.size();
      const int64_t skipped = NumSkippedPages(groups_[g], num_total_computed);
      if (skipped > held && CeilBlocks(g, num_need_slot) > held) {
        return bad(num_total_computed, " tokens computed (num_computed_tokens ",
                   slots.num_computed_tokens, ") skip ", skipped,
                   " blocks of kv cache group ", g, ", which holds ", held,
                   ": computed tokens past the request's blocks");
      }
    }
  }
  // vLLM frees the skipped blocks before it checks, and keeps them freed
  // when it then allocates nothing (and only then looks at the hashes).
  const bool skips = request != nullptr && windowed_;
  if (BlocksToAllocate(request, num_need_slot, slots, num_total_computed,
                       /*capped=*/false) >
      pool_->NumFree() + (skips ? SkippedFrees(*request, total_computed) : 0)) {
    if (skips) RemoveSkipped(*request, total_computed);
    return VllmSlotResult{};
  }
  // Past max_model_len, computed tokens can ask for more blocks than the
  // capacity check counts (vLLM then fails in get_new_blocks, or on a list
  // of that many null blocks): refused before anything changes.
  if (takes_hits) {
    int64_t external = 0;
    for (int32_t g = 0; g < num_groups(); ++g) {
      const GroupPlan& plan = plans_[g];
      if (plan.skipped >
          CeilBlocks(g, options_.max_model_len) + options_.num_blocks) {
        return bad(num_total_computed, " computed tokens skip ", plan.skipped,
                   " blocks of kv cache group ", g,
                   ", more than max_model_len's and the pool's blocks");
      }
      external += plan.external_blocks;
    }
    if (external > pool_->NumFree()) {
      return bad(num_total_computed, " computed tokens need ", external,
                 " blocks for external tokens; ", pool_->NumFree(),
                 " are free");
    }
    // With a host tier, external tokens are its: each block is loaded.
    if (pool_->host_pages() > 0) {
      const GroupPlan& plan = plans_[0];
      for (int64_t i = plan.after_hits;
           i < plan.after_hits + plan.external_blocks; ++i) {
        const int64_t needed = (i + 1) * Scale(0);
        if (static_cast<int64_t>(slots.block_hashes.size()) < needed) {
          return bad("has ", slots.block_hashes.size(),
                     " block hashes; loading block ", i,
                     " from the host tier needs ", needed);
        }
        const BlockHash key = Key(0, slots.block_hashes, i);
        if (const std::optional<PageId> cached = pool_->Lookup(key)) {
          return bad(slots.num_external_computed_tokens,
                     " external computed tokens: block ", i,
                     " is cached on the device (block ", *cached,
                     "), not loaded from the host tier");
        }
        if (!pool_->HostLookup(key).has_value()) {
          return bad(slots.num_external_computed_tokens,
                     " external computed tokens: the host tier does not hold "
                     "block ",
                     i,
                     " (get_num_new_matched_tokens counts the ones it holds)");
        }
      }
    }
  }
  const bool cache = options_.enable_caching && !slots.delay_cache_blocks;
  const int64_t num_tokens_to_cache =
      std::min(num_tokens_main_model, slots.num_tokens);
  if (cache) {
    KVBLOCK_RETURN_IF_ERROR(BlocksToCache(slots.request_id, slots.block_hashes,
                                          num_tokens_to_cache));
  }
  if (skips) RemoveSkipped(*request, total_computed);

  // Checked: from here the call cannot fail but for a broken invariant, and
  // the transaction undoes the pool's part then.
  const bool is_new = request == nullptr;
  if (is_new) request = &NewRequest(slots.request_id);
  new_blocks_before_.clear();
  for (const auto& ids : new_blocks_) new_blocks_before_.push_back(ids.size());
  const BlockPool::Savepoint savepoint = pool_->BeginTransaction();
  // An entry made before (GetNumCommonPrefixBlocks, CacheBlocks) goes back
  // to its lists' lengths and counts.
  for (int32_t g = 0; g < num_groups(); ++g) {
    plans_[g].held_before = request->groups[g].blocks.size();
    plans_[g].num_cached_before = request->groups[g].num_cached;
  }
  absl::Cleanup undo = [&] {
    pool_->RollbackTransaction(savepoint).IgnoreError();
    for (int32_t g = 0; g < num_groups(); ++g) {
      new_blocks_[g].resize(new_blocks_before_[g]);
      request->groups[g].blocks.resize(plans_[g].held_before);
      request->groups[g].num_cached = plans_[g].num_cached_before;
    }
    if (is_new) by_id_.erase(slots.request_id);
  };
  if (takes_hits) {
    // Every group's hits first: a group's blocks for external tokens must
    // not evict another group's hit (vLLM's order, group by group, can
    // hand such a block to both).
    for (int32_t g = 0; g < num_groups(); ++g) {
      GroupBlocks& group = request->groups[g];
      const GroupPlan& plan = plans_[g];
      const absl::Span<const PageId> list =
          hits.empty() ? absl::Span<const PageId>() : hits[g];
      // The null block for each skipped one, then the hits past them.
      const int64_t num_skipped = plan.skipped;
      const size_t first_kept =
          static_cast<size_t>(std::min<int64_t>(num_skipped, list.size()));
      const auto kept = list.subspan(first_kept);
      acquired_.clear();
      for (PageId block : kept) {
        if (block != kNullBlock) acquired_.push_back(block);
      }
      KVBLOCK_RETURN_IF_ERROR(pool_->AcquireCached(acquired_));
      group.blocks.assign(num_skipped, kNullBlock);
      group.blocks.insert(group.blocks.end(), kept.begin(), kept.end());
      group.num_cached = static_cast<int32_t>(group.blocks.size());
    }
    if (pool_->host_pages() > 0) {
      // One group: its external blocks are the host tier's, loaded.
      const absl::Status loaded =
          LoadFromHost(request->groups[0].blocks, slots.block_hashes,
                       plans_[0].after_hits, plans_[0].external_blocks);
      if (!loaded.ok()) {
        return absl::Status(
            loaded.code(),
            absl::StrCat(
                "vllm kv cache manager: request ", slots.request_id,
                ": loading its external tokens' blocks: ", loaded.message()));
      }
    } else {
      for (int32_t g = 0; g < num_groups(); ++g) {
        KVBLOCK_RETURN_IF_ERROR(
            Allocate(g, request->groups[g], plans_[g].external_blocks));
      }
    }
  }
  for (int32_t g = 0; g < num_groups(); ++g) {
    GroupBlocks& group = request->groups[g];
    slots_[g] = {.first_new_block = static_cast<int32_t>(group.blocks.size())};
    const int64_t count = CeilBlocks(g, num_need_slot) -
                          static_cast<int64_t>(group.blocks.size());
    if (count > 0) KVBLOCK_RETURN_IF_ERROR(Allocate(g, group, count));
  }
  if (cache) Cache(*request, slots.block_hashes);
  for (int32_t g = 0; g < num_groups(); ++g) {
    slots_[g].blocks = request->groups[g].blocks;
  }
  std::move(undo).Cancel();
  KVBLOCK_RETURN_IF_ERROR(pool_->CommitTransaction(savepoint));
  return VllmSlotResult{.allocated = true, .groups = slots_};
}

absl::Status VllmKvCacheManager::LoadFromHost(
    std::vector<PageId>& blocks, absl::Span<const BlockHash> block_hashes,
    int64_t first, int64_t count) {
  // Every block of the run pinned first (as the connector's prepare_load
  // pins them): a load's new block may evict a cached one, whose store
  // must not drop a later block of the run from a full host tier.
  host_keys_.clear();
  for (int64_t i = first; i < first + count; ++i) {
    host_keys_.push_back(Key(0, block_hashes, i));
  }
  KVBLOCK_RETURN_IF_ERROR(pool_->UseHostPages(host_keys_));
  for (int64_t i = first; i < first + count; ++i) {
    // Not new blocks to zero: the load writes them whole.
    KVBLOCK_ASSIGN_OR_RETURN(
        const PageId block,
        pool_->LoadFromHost(Key(0, block_hashes, i), /*group=*/0));
    blocks.push_back(block);
  }
  return absl::OkStatus();
}

int64_t VllmKvCacheManager::GetNumNewMatchedTokens(
    absl::Span<const BlockHash> block_hashes, int64_t num_tokens,
    int64_t num_computed_tokens) {
  if (pool_->host_pages() == 0 || num_computed_tokens < 0) return 0;
  const int64_t page_size = groups_[0].page_size;
  const int64_t full_blocks =
      std::min(std::max<int64_t>(num_tokens, 0) / page_size,
               static_cast<int64_t>(block_hashes.size()) / Scale(0));
  // The connector's: less than a block to load is no hit.
  if (full_blocks * page_size - num_computed_tokens < page_size) return 0;
  const int64_t start = num_computed_tokens / page_size;
  int64_t end = start;
  while (end < full_blocks) {
    const BlockHash key = Key(0, block_hashes, end);
    if (pool_->Lookup(key) || !pool_->HostLookup(key)) break;
    ++end;
  }
  const int64_t tokens = end * page_size - num_computed_tokens;
  if (tokens < page_size) return 0;
  // A prompt of whole blocks: its last token is computed again.
  return end * page_size >= num_tokens ? num_tokens - 1 - num_computed_tokens
                                       : tokens;
}

absl::Status VllmKvCacheManager::TakeHostCopies(std::vector<HostCopy>& out) {
  return pool_->TakeHostCopies(out);
}

absl::StatusOr<absl::Span<const VllmGroupSlots>>
VllmKvCacheManager::CacheBlocks(absl::string_view request_id,
                                absl::Span<const BlockHash> block_hashes,
                                int64_t num_tokens) {
  for (VllmGroupSlots& slots : slots_) slots = {};
  if (!options_.enable_caching) return absl::MakeConstSpan(slots_);
  auto found = by_id_.find(request_id);
  Request* request = found == by_id_.end() ? nullptr : &found->second;
  bool caches = false;
  for (int32_t g = 0; g < num_groups(); ++g) {
    const GroupBlocks* group = request ? &request->groups[g] : nullptr;
    plans_[g] = {.held_after = group ? int64_t(group->blocks.size()) : 0,
                 .num_cached = group ? std::max(group->num_cached, 0) : 0};
  }
  KVBLOCK_RETURN_IF_ERROR(BlocksToCache(request_id, block_hashes, num_tokens));
  for (int32_t g = 0; g < num_groups(); ++g) {
    const auto [from, to] = plan_ranges_[g];
    slots_[g] = {.cached_from = from, .cached_to = from};
    caches = caches || to > from;
  }
  if (!caches) return absl::MakeConstSpan(slots_);
  // vLLM's cache_blocks enters an unknown request (its defaultdict), with
  // its count of cached blocks.
  if (request == nullptr) request = &NewRequest(request_id);
  Cache(*request, block_hashes);
  return absl::MakeConstSpan(slots_);
}

void VllmKvCacheManager::Free(absl::string_view request_id) {
  auto found = by_id_.find(request_id);
  if (found == by_id_.end()) return;
  Request& request = found->second;
  for (GroupBlocks& group : request.groups) {
    for (auto it = group.blocks.rbegin(); it != group.blocks.rend(); ++it) {
      if (*it == kNullBlock) continue;
      // Cannot fail: the request holds a reference on each.
      [[maybe_unused]] const absl::Status released = pool_->Release(*it);
      assert(released.ok());
    }
    group.blocks.clear();
    group.num_cached = -1;
  }
  spare_requests_.push_back(std::move(request));
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
  if (!pool_->ResetPrefixCache().ok()) return false;
  key_prefixes_.clear();
  return true;
}

absl::Span<const PageId> VllmKvCacheManager::Blocks(
    absl::string_view request_id, int32_t group) const {
  auto found = by_id_.find(request_id);
  if (found == by_id_.end() || group < 0 || group >= num_groups()) return {};
  return found->second.groups[group].blocks;
}

VllmKvCacheManager::Request& VllmKvCacheManager::NewRequest(
    absl::string_view request_id) {
  Request& request = by_id_[request_id];
  if (!spare_requests_.empty()) {
    request = std::move(spare_requests_.back());
    spare_requests_.pop_back();
  } else {
    request.groups.resize(groups_.size());
  }
  return request;
}

std::vector<int32_t> VllmKvCacheManager::GetNumCommonPrefixBlocks(
    absl::string_view request_id) {
  std::vector<int32_t> common(groups_.size(), 0);
  // vLLM reads its defaultdict here, entering an unknown request (with no
  // blocks) until it is freed; the count of requests includes it.
  auto found = by_id_.find(request_id);
  if (found == by_id_.end()) {
    NewRequest(request_id);
    return common;
  }
  for (int32_t g = 0; g < num_groups(); ++g) {
    // A window group's leading blocks are null: vLLM counts none.
    if (groups_[g].kind != AttentionKind::kFull) continue;
    for (PageId block : found->second.groups[g].blocks) {
      if (RefCount(block) != num_requests()) break;
      ++common[g];
    }
  }
  return common;
}

std::vector<std::vector<PageId>> VllmKvCacheManager::TakeNewBlockIds() {
  std::vector<std::vector<PageId>> ids(groups_.size());
  ids.swap(new_blocks_);
  return ids;
}

absl::Span<const BlockHash> VllmKvCacheManager::CachedHashPrefix(
    PageId block) const {
  const int32_t group = pool_->CachedGroup(block);
  if (group < 0 || group >= num_groups() || Scale(group) == 1) return {};
  return absl::MakeConstSpan(hash_prefixes_)
      .subspan(static_cast<size_t>(block) * (max_scale_ - 1), Scale(group) - 1);
}

void VllmKvCacheManager::DrainEvents() {
  if (events_ == nullptr) return;
  for (size_t i = 0; i < static_cast<size_t>(events_->num_records()); ++i) {
    const KvCacheEvent::Kind kind = events_->kind(i);
    if (events_->medium(i) == KvCacheEvent::Medium::kCpu) {
      host_events_.push_back(
          {.removed = kind == KvCacheEvent::Kind::kBlockRemoved,
           .hash = events_->hash(i)});
      continue;
    }
    if (kind != KvCacheEvent::Kind::kBlockRemoved) continue;
    RemovedBlock& block = removed_.emplace_back();
    block.group = events_->group(i);
    const BlockHash& hash = events_->hash(i);
    if (block.group < num_groups() && Scale(block.group) > 1) {
      // The hashes before the key, kept while a block is cached under it.
      auto kept =
          key_prefixes_.find(internal::SaltKey(hash, salts_[block.group]));
      if (kept != key_prefixes_.end()) {
        block.hashes = kept->second.hashes;
        if (--kept->second.blocks == 0) key_prefixes_.erase(kept);
      }
    }
    block.hashes.push_back(hash);
  }
  events_->Clear();
}

std::vector<VllmKvCacheManager::RemovedBlock>
VllmKvCacheManager::TakeRemovedHashes() {
  DrainEvents();
  std::vector<RemovedBlock> removed;
  removed.swap(removed_);
  return removed;
}

std::vector<VllmKvCacheManager::HostEvent>
VllmKvCacheManager::TakeHostEvents() {
  DrainEvents();
  std::vector<HostEvent> events;
  events.swap(host_events_);
  return events;
}

double VllmKvCacheManager::Usage() const {
  const int32_t real_blocks = options_.num_blocks - 1;
  if (real_blocks == 0) return 0.0;
  return 1.0 - static_cast<double>(pool_->NumFree()) / real_blocks;
}

absl::Status VllmKvCacheManager::CheckInvariants() const {
  KVBLOCK_RETURN_IF_ERROR(pool_->CheckInvariants());
  // The null block's, and the pool's on each parked block.
  int64_t references = 1 + static_cast<int64_t>(pool_->parked_pages().size());
  for (const auto& [id, request] : by_id_) {
    for (int32_t g = 0; g < num_groups(); ++g) {
      const GroupBlocks& group = request.groups[g];
      for (PageId block : group.blocks) {
        if (block == kNullBlock && groups_[g].kind != AttentionKind::kFull) {
          continue;  // a skipped block.
        }
        if (block == kNullBlock || pool_->RefCount(block) == 0) {
          return absl::InternalError(absl::StrCat(
              "vllm kv cache manager: request ", id, " holds block ", block,
              " in kv cache group ", g, ", which is not in use"));
        }
        ++references;
      }
    }
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
