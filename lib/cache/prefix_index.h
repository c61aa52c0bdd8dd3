// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Internal: PrefixIndex, the prefix cache's index inside BlockPool, block
// hash -> page.
//
// Buckets of one cache line: 7 entries, each a 32-bit tag of the hash (never
// 0, the tag of a free entry) and a page id, plus an overflow count. The hashes
// themselves stay with the pages (the caller's `hash_of(page)`), and a tag
// match is confirmed there. A key lives in its home bucket, or when that is
// full in the next bucket with a free entry (probing bucket by bucket); every
// bucket passed on the way counts it in its overflow count. So a search
// compares the 7 tags of a bucket at once (SSE2) and stops at the first bucket
// whose overflow count is 0 (or after every bucket), an erase clears its entry
// in place and decrements the counts on its path, and nothing ever moves: no
// probe loop over single slots, no backward shift, no tombstones. At most 57%
// of the entries are used, so a key is in its home bucket about 90% of the time
// (one cache line). The index of a 16K-page pool is 256 KiB, a quarter of a map
// that stores the 32-byte keys, and stays in a core's L2 cache.
//
// The tag is the top 32 bits of Abseil's per-process seeded hash of every
// byte of the key, lowest bit set, and a key's home bucket is the tag's top
// bits: crafted keys cannot crowd one bucket, and an erase finds an entry's
// home without reading its key.
//
// Capacity is fixed at construction (max_entries / 4.9 buckets rounded up to
// a power of two, at least 2), so nothing allocates after it. The caller
// keeps at most max_entries pages indexed and erases only indexed pages
// (BlockPool: one entry per cached page). Every probe is bounded by the
// number of buckets, so a broken contract cannot make any build probe
// forever: Insert into a full index and Erase of a page it does not hold
// return false, which BlockPool reports as Internal. Thread-compatible.
#ifndef KVBLOCK_LIB_CACHE_PREFIX_INDEX_H_
#define KVBLOCK_LIB_CACHE_PREFIX_INDEX_H_

#include <algorithm>
#include <bit>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

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
        shift_(32 - std::countr_zero(NumBuckets(max_entries_))),
        buckets_(NumBuckets(max_entries_)),
        mask_(buckets_.size() - 1) {
    assert(max_entries >= 1 && max_entries <= (1 << 30));
  }

  // Entries per bucket.
  static constexpr int kEntriesPerBucket = 7;
  // No bucket (Place::bucket).
  static constexpr size_t kNoBucket = ~size_t{0};

  // Bytes an index of `max_entries` entries allocates.
  static int64_t ReservedBytes(int32_t max_entries) {
    return static_cast<int64_t>(NumBuckets(std::max(max_entries, 1)) *
                                sizeof(Bucket));
  }

  int32_t size() const { return size_; }

  // The tag of `hash`: Insert and Erase take it, so that a caller that keeps
  // each entry's tag (BlockPool does, beside the page's hash) erases without
  // hashing the key again. Never 0, the tag of a free entry.
  static uint32_t Tag(const BlockHash& hash) {
    return static_cast<uint32_t>(absl::Hash<BlockHash>{}(hash) >> 32) | 1;
  }

  // The home bucket of keys whose Tag is `tag`: the tag's top bits.
  size_t Home(uint32_t tag) const { return tag >> shift_; }
  size_t num_buckets() const { return buckets_.size(); }

  // The page indexed under `hash`, or kNoPage. O(1) expected.
  template <typename HashOf>
  PageId Find(const BlockHash& hash, const HashOf& hash_of) const {
    return Find(Tag(hash), hash, hash_of);
  }
  // The same for a caller that keeps the tag. REQUIRES: `tag` == Tag(hash).
  template <typename HashOf>
  PageId Find(uint32_t tag, const BlockHash& hash,
              const HashOf& hash_of) const {
    assert(tag == Tag(hash));
    const size_t home = Home(tag);
    for (size_t b = home;; b = Next(b)) {
      const Bucket& bucket = buckets_[b];
      for (uint32_t m = bucket.Matches(tag); m != 0; m &= m - 1) {
        const PageId page = bucket.pages[std::countr_zero(m)];
        if (hash_of(page) == hash) return page;
      }
      if (LastOfSearch(bucket, b, home)) return kNoPage;
    }
  }

  // Where `hash` is, or would be indexed: the page indexed under it
  // (`found`), else a free entry for it (`bucket`, `entry`), or neither
  // when every entry is taken.
  struct Place {
    PageId found = kNoPage;
    size_t bucket = kNoBucket;
    int entry = 0;
  };
  // O(1) expected, O(buckets) at worst. REQUIRES: `tag` == Tag(hash).
  template <typename HashOf>
  Place Locate(uint32_t tag, const BlockHash& hash,
               const HashOf& hash_of) const {
    assert(tag == Tag(hash));
    // Look for the key where a search would, noting the first free entry
    // on the way.
    const size_t home = Home(tag);
    Place place;
    uint32_t free_entries = 0;
    size_t b = home;
    for (;; b = Next(b)) {
      const Bucket& bucket = buckets_[b];
      for (uint32_t m = bucket.Matches(tag); m != 0; m &= m - 1) {
        const PageId other = bucket.pages[std::countr_zero(m)];
        if (hash_of(other) == hash) {
          place.found = other;
          return place;
        }
      }
      if (place.bucket == kNoBucket && (free_entries = bucket.Free()) != 0) {
        place.bucket = b;
      }
      if (LastOfSearch(bucket, b, home)) break;
    }
    // No free entry on the search path: the next one after it, if any.
    for (size_t n = 1; place.bucket == kNoBucket && n < buckets_.size(); ++n) {
      b = Next(b);
      if ((free_entries = buckets_[b].Free()) != 0) place.bucket = b;
    }
    place.entry = std::countr_zero(free_entries);
    return place;
  }

  // Indexes `page` under a hash whose Tag is `tag` in the free entry that
  // Locate found for it. Erases may come between the two, not inserts.
  // REQUIRES: `place.bucket` is not kNoBucket.
  void InsertAt(const Place& place, uint32_t tag, PageId page) {
    Bucket& bucket = buckets_[place.bucket];
    assert(bucket.tags[place.entry] == 0);
    bucket.tags[place.entry] = tag;
    bucket.pages[place.entry] = page;
    for (size_t passed = Home(tag); passed != place.bucket;
         passed = Next(passed)) {
      ++buckets_[passed].tags[kOverflow];
    }
    ++size_;
  }

  // Indexes `page` under `hash` unless a page is indexed there already;
  // returns that page, or `page`; kNoPage when every entry is taken (a
  // broken contract: the caller keeps at most max_entries pages indexed).
  // O(1) expected, O(buckets) at worst.
  // REQUIRES: `tag` == Tag(hash).
  template <typename HashOf>
  PageId Insert(uint32_t tag, const BlockHash& hash, PageId page,
                const HashOf& hash_of) {
    const Place place = Locate(tag, hash, hash_of);
    if (place.found != kNoPage) return place.found;
    if (place.bucket == kNoBucket) return kNoPage;
    InsertAt(place, tag, page);
    return page;
  }

  // Removes `page`, indexed under a hash whose Tag is `tag`, and returns
  // true; false, changing nothing, when no bucket holds it (a broken
  // contract). O(1) expected, O(buckets) at worst.
  bool Erase(uint32_t tag, PageId page) {
    const size_t home = Home(tag);
    size_t b = home;
    uint32_t m;
    for (size_t n = 0; (m = buckets_[b].Holds(page)) == 0; ++n) {
      if (n + 1 == buckets_.size()) return false;
      b = Next(b);
    }
    const int entry = std::countr_zero(m);
    buckets_[b].tags[entry] = 0;
    buckets_[b].pages[entry] = kNoPage;
    for (size_t passed = home; passed != b; passed = Next(passed)) {
      --buckets_[passed].tags[kOverflow];
    }
    --size_;
    return true;
  }

  // Puts `replacement` in the entry of `page` (indexed under a hash whose Tag
  // is `tag`, which the replacement's hash shares) and returns true; false,
  // changing nothing, when no bucket holds `page`. O(1) expected.
  bool Replace(uint32_t tag, PageId page, PageId replacement) {
    size_t b = Home(tag);
    uint32_t m;
    for (size_t n = 0; (m = buckets_[b].Holds(page)) == 0; ++n) {
      if (n + 1 == buckets_.size()) return false;
      b = Next(b);
    }
    buckets_[b].pages[std::countr_zero(m)] = replacement;
    return true;
  }

  // Starts loading the home bucket of keys whose Tag is `tag`.
  void Prefetch(uint32_t tag) const {
    __builtin_prefetch(&buckets_[Home(tag)]);
  }

  // Calls `f(page)` for every indexed page, in bucket order. O(capacity).
  template <typename F>
  void ForEach(const F& f) const {
    for (const Bucket& bucket : buckets_) {
      for (int i = 0; i < kEntriesPerBucket; ++i) {
        if (bucket.pages[i] != kNoPage) f(bucket.pages[i]);
      }
    }
  }

  void Clear() {
    std::fill(buckets_.begin(), buckets_.end(), Bucket{});
    size_ = 0;
  }

  // Internal when an entry's tag is not its page's (or a free entry's is not
  // 0), a bucket's overflow count is not the number of keys placed past it
  // from their home (so a search could stop before a key), or the count is
  // off. O(capacity).
  template <typename HashOf>
  absl::Status CheckInvariants(const HashOf& hash_of) const {
    std::vector<uint32_t> passing(buckets_.size(), 0);
    int32_t count = 0;
    for (size_t b = 0; b < buckets_.size(); ++b) {
      const Bucket& bucket = buckets_[b];
      if (bucket.pages[kOverflow] != kNoPage) {
        return absl::InternalError(absl::StrCat(
            "prefix index: bucket ", b, " holds page ", bucket.pages[kOverflow],
            " in its overflow count's place"));
      }
      for (int i = 0; i < kEntriesPerBucket; ++i) {
        const PageId page = bucket.pages[i];
        if (page == kNoPage) {
          if (bucket.tags[i] != 0) {
            return absl::InternalError(
                absl::StrCat("prefix index: free entry ", i, " of bucket ", b,
                             " keeps tag ", bucket.tags[i]));
          }
          continue;
        }
        ++count;
        if (bucket.tags[i] != Tag(hash_of(page))) {
          return absl::InternalError(
              absl::StrCat("prefix index: bucket ", b, " holds page ", page,
                           " under a tag not of its hash"));
        }
        for (size_t passed = Home(bucket.tags[i]); passed != b;
             passed = Next(passed)) {
          ++passing[passed];
        }
      }
    }
    for (size_t b = 0; b < buckets_.size(); ++b) {
      if (buckets_[b].overflow() != passing[b]) {
        return absl::InternalError(absl::StrCat(
            "prefix index: bucket ", b, " counts ", buckets_[b].overflow(),
            " keys placed past it, there are ", passing[b]));
      }
    }
    if (count != size_) {
      return absl::InternalError(
          absl::StrCat("prefix index: ", count, " entries, counted ", size_));
    }
    return absl::OkStatus();
  }

 private:
  // The last of a bucket's 8 tag lanes is its overflow count; its last page
  // lane stays kNoPage.
  static constexpr int kOverflow = kEntriesPerBucket;

  struct alignas(64) Bucket {
    uint32_t tags[kEntriesPerBucket + 1] = {};
    PageId pages[kEntriesPerBucket + 1] = {kNoPage, kNoPage, kNoPage, kNoPage,
                                           kNoPage, kNoPage, kNoPage, kNoPage};

    // Keys placed in a later bucket whose search passes this one.
    uint32_t overflow() const { return tags[kOverflow]; }
    // Bit i set: entry i is used under `tag`.
    uint32_t Matches(uint32_t tag) const { return Equal(tags, tag); }
    // Bit i set: entry i holds `page`.
    uint32_t Holds(PageId page) const {
      return Equal(pages, static_cast<uint32_t>(page));
    }
    // Bit i set: entry i is free.
    uint32_t Free() const { return Equal(tags, 0); }

    // Bit i set, for i < kEntriesPerBucket: lanes[i] == value.
    template <typename Lane>
    static uint32_t Equal(const Lane (&lanes)[kEntriesPerBucket + 1],
                          uint32_t value) {
      constexpr uint32_t kEntries = (1u << kEntriesPerBucket) - 1;
#if defined(__SSE2__)
      const __m128i wanted = _mm_set1_epi32(static_cast<int>(value));
      const auto* vectors = reinterpret_cast<const __m128i*>(lanes);
      const int low = _mm_movemask_ps(
          _mm_castsi128_ps(_mm_cmpeq_epi32(_mm_load_si128(vectors), wanted)));
      const int high = _mm_movemask_ps(_mm_castsi128_ps(
          _mm_cmpeq_epi32(_mm_load_si128(vectors + 1), wanted)));
      return static_cast<uint32_t>(low | (high << 4)) & kEntries;
#else
      uint32_t mask = 0;
      for (int i = 0; i < kEntriesPerBucket; ++i) {
        mask |= static_cast<uint32_t>(static_cast<uint32_t>(lanes[i]) == value)
                << i;
      }
      return mask & kEntries;
#endif
    }
  };
  static_assert(sizeof(Bucket) == 64);

  // At most 57% of the entries used (max_entries / (7 * 4.9 / 7)), at least
  // 2 buckets.
  static size_t NumBuckets(int32_t max_entries) {
    return std::bit_ceil(
        std::max<size_t>(2, (static_cast<size_t>(max_entries) * 10 + 48) / 49));
  }
  size_t Next(size_t bucket) const { return (bucket + 1) & mask_; }
  // A search from `home` ends after `bucket` (index `b`) when no key passes
  // it, or when every bucket was searched (keys may pass all of them, each
  // placed in another's home).
  bool LastOfSearch(const Bucket& bucket, size_t b, size_t home) const {
    return bucket.overflow() == 0 || Next(b) == home;
  }

  int32_t max_entries_;
  int shift_;  // 32 - log2(buckets).
  std::vector<Bucket> buckets_;
  size_t mask_;
  int32_t size_ = 0;
};

}  // namespace kvblock

#endif  // KVBLOCK_LIB_CACHE_PREFIX_INDEX_H_
