// Copyright 2026 The kvblock Authors.
//
// PrefixIndex: the prefix cache's index inside BlockPool, block hash -> page.
//
// Open addressing with linear probing over 8-byte slots, each a 32-bit tag
// of the hash and a page id; the hashes themselves stay with the pages (the
// caller's `hash_of(page)`), and a tag match is confirmed there. The table
// is at most half full, so a probe reads one or two cache lines, and it is a
// quarter the size of a map that stores the 32-byte keys: the index of a
// 16K-page pool (256 KiB) stays in a core's L2 cache. Deletion shifts later
// entries back instead of leaving tombstones, so lookups never slow down
// with churn.
//
// The tag is the top 32 bits of Abseil's per-process seeded hash of every
// byte of the key, and a slot's home position is the tag's top bits: crafted
// keys cannot crowd one probe run, and a deletion finds an entry's home
// without reading its key.
//
// Capacity is fixed at construction (2 * max_entries rounded up to a power
// of two, at least 16 slots), so nothing allocates after it. The caller
// keeps at most max_entries pages indexed and erases only indexed pages
// (BlockPool: one entry per cached page); a broken contract fails an
// assert (unless NDEBUG) instead of probing forever. Thread-compatible.
#ifndef KVBLOCK_PREFIX_INDEX_H_
#define KVBLOCK_PREFIX_INDEX_H_

#include <algorithm>
#include <bit>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kvblock/block_hash.h"
#include "kvblock/types.h"

namespace kvblock {

class PrefixIndex {
 public:
  // Room for `max_entries` pages (at least 1; up to 2^30, BlockPool's
  // largest pool).
  explicit PrefixIndex(int32_t max_entries)
      : max_entries_(std::max(max_entries, 1)),
        shift_(32 - std::countr_zero(std::bit_ceil(std::max<size_t>(
                        16, 2 * static_cast<size_t>(max_entries_))))),
        slots_(size_t{1} << (32 - shift_)),
        mask_(slots_.size() - 1) {
    assert(max_entries >= 1 && max_entries <= (1 << 30));
  }

  int32_t size() const { return size_; }

  // The tag of `hash`: Insert and Erase take it, so that a caller that keeps
  // each entry's tag (BlockPool does, beside the page's hash) erases without
  // hashing the key again.
  static uint32_t Tag(const BlockHash& hash) {
    return static_cast<uint32_t>(absl::Hash<BlockHash>{}(hash) >> 32);
  }

  // The page indexed under `hash`, or kNoPage. O(1) expected.
  template <typename HashOf>
  PageId Find(const BlockHash& hash, const HashOf& hash_of) const {
    const uint32_t tag = Tag(hash);
    for (size_t i = Home(tag);; i = (i + 1) & mask_) {
      const Slot& slot = slots_[i];
      if (slot.page == kNoPage) return kNoPage;
      if (slot.tag == tag && hash_of(slot.page) == hash) return slot.page;
    }
  }

  // Indexes `page` under `hash` unless a page is indexed there already;
  // returns that page, or `page`. O(1) expected.
  // REQUIRES: `tag` == Tag(hash); fewer than max_entries pages indexed, or
  // `hash` among them.
  template <typename HashOf>
  PageId Insert(uint32_t tag, const BlockHash& hash, PageId page,
                const HashOf& hash_of) {
    assert(tag == Tag(hash));
    for (size_t i = Home(tag);; i = (i + 1) & mask_) {
      Slot& slot = slots_[i];
      if (slot.page == kNoPage) {
        assert(size_ < max_entries_);
        slot = Slot{tag, page};
        ++size_;
        return page;
      }
      if (slot.tag == tag && hash_of(slot.page) == hash) return slot.page;
    }
  }

  // Removes `page`, indexed under a hash whose Tag is `tag`. O(1) expected.
  // REQUIRES: `page` is indexed under such a hash.
  void Erase(uint32_t tag, PageId page) {
    size_t hole = Home(tag);
    while (slots_[hole].page != page) {
      assert(slots_[hole].page != kNoPage);
      hole = (hole + 1) & mask_;
    }
    // Moves back each later entry of the run that may sit at the hole: one
    // whose home is not cyclically in (hole, j].
    for (size_t j = (hole + 1) & mask_; slots_[j].page != kNoPage;
         j = (j + 1) & mask_) {
      const size_t home = Home(slots_[j].tag);
      if (((j - home) & mask_) >= ((j - hole) & mask_)) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole] = Slot{};
    --size_;
  }

  // Calls `f(page)` for every indexed page, in slot order. O(capacity).
  template <typename F>
  void ForEach(const F& f) const {
    for (const Slot& slot : slots_) {
      if (slot.page != kNoPage) f(slot.page);
    }
  }

  void Clear() {
    std::fill(slots_.begin(), slots_.end(), Slot{});
    size_ = 0;
  }

  // Internal when a slot's tag is not its page's, an entry cannot be reached
  // from its home, or the count is off. O(capacity).
  template <typename HashOf>
  absl::Status CheckInvariants(const HashOf& hash_of) const {
    int32_t count = 0;
    for (size_t i = 0; i < slots_.size(); ++i) {
      const Slot& slot = slots_[i];
      if (slot.page == kNoPage) continue;
      ++count;
      if (slot.tag != Tag(hash_of(slot.page))) {
        return absl::InternalError(
            absl::StrCat("prefix index: slot ", i, " holds page ", slot.page,
                         " under a tag not of its hash"));
      }
      for (size_t j = Home(slot.tag); j != i; j = (j + 1) & mask_) {
        if (slots_[j].page == kNoPage) {
          return absl::InternalError(
              absl::StrCat("prefix index: page ", slot.page, " in slot ", i,
                           " is cut off from its home by empty slot ", j));
        }
      }
    }
    if (count != size_) {
      return absl::InternalError(
          absl::StrCat("prefix index: ", count, " entries, counted ", size_));
    }
    return absl::OkStatus();
  }

 private:
  struct Slot {
    uint32_t tag = 0;
    PageId page = kNoPage;  // kNoPage: empty.
  };

  size_t Home(uint32_t tag) const { return tag >> shift_; }

  int32_t max_entries_;
  int shift_;  // 32 - log2(capacity).
  std::vector<Slot> slots_;
  size_t mask_;
  int32_t size_ = 0;
};

}  // namespace kvblock

#endif  // KVBLOCK_PREFIX_INDEX_H_
