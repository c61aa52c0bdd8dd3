// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "cache/prefix_index.h"

#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "pool_test_util.h"
#include "test_util.h"

namespace kvblock {
namespace {

using ::kvblock::testing::TestHash;

// The keys, by page, as BlockPool keeps them.
struct Keys {
  std::vector<BlockHash> by_page;
  const BlockHash& operator()(PageId page) const { return by_page[page]; }
};

TEST_CASE("prefix index finds, refuses duplicates and erases") {
  Keys keys{{TestHash(10), TestHash(11), TestHash(10)}};
  PrefixIndex index(3);
  REQUIRE(index.Find(TestHash(10), keys) == kNoPage);
  REQUIRE(index.Insert(PrefixIndex::Tag(TestHash(10)), TestHash(10), 0, keys) ==
          0);
  REQUIRE(index.Insert(PrefixIndex::Tag(TestHash(11)), TestHash(11), 1, keys) ==
          1);
  // Page 2 holds the same content as page 0: the index keeps page 0.
  REQUIRE(index.Insert(PrefixIndex::Tag(TestHash(10)), TestHash(10), 2, keys) ==
          0);
  REQUIRE(index.size() == 2);
  REQUIRE(index.Find(TestHash(10), keys) == 0);
  REQUIRE(index.Find(TestHash(11), keys) == 1);
  REQUIRE(index.Find(TestHash(12), keys) == kNoPage);
  REQUIRE_OK(index.CheckInvariants(keys));

  REQUIRE(index.Erase(PrefixIndex::Tag(TestHash(10)), 0));
  REQUIRE(index.Find(TestHash(10), keys) == kNoPage);
  REQUIRE(index.Find(TestHash(11), keys) == 1);
  REQUIRE(index.size() == 1);
  REQUIRE_OK(index.CheckInvariants(keys));

  std::vector<PageId> pages;
  index.ForEach([&](PageId page) { pages.push_back(page); });
  REQUIRE(pages == std::vector<PageId>{1});
  index.Clear();
  REQUIRE(index.size() == 0);
  REQUIRE(index.Find(TestHash(11), keys) == kNoPage);
}

TEST_CASE("a broken contract is refused after one pass, never probed forever") {
  // An index for 1 entry has 2 buckets of 7: fill all 14, past the contract.
  constexpr int kCapacity = 2 * PrefixIndex::kEntriesPerBucket;
  Keys keys;
  for (int i = 0; i <= kCapacity; ++i) keys.by_page.push_back(TestHash(i));
  PrefixIndex index(1);
  REQUIRE(index.num_buckets() == 2);
  for (PageId page = 0; page < kCapacity; ++page) {
    REQUIRE(index.Insert(PrefixIndex::Tag(keys(page)), keys(page), page,
                         keys) == page);
  }
  // Full: the next insert returns kNoPage and changes nothing.
  REQUIRE(index.Insert(PrefixIndex::Tag(keys(kCapacity)), keys(kCapacity),
                       kCapacity, keys) == kNoPage);
  REQUIRE(index.size() == kCapacity);
  REQUIRE(index.Find(keys(kCapacity), keys) == kNoPage);
  REQUIRE_OK(index.CheckInvariants(keys));
  // Erasing a page it does not hold returns false, also when full.
  REQUIRE_FALSE(index.Erase(PrefixIndex::Tag(keys(kCapacity)), kCapacity));
  REQUIRE(index.size() == kCapacity);
  REQUIRE(index.Erase(PrefixIndex::Tag(keys(3)), 3));
  REQUIRE_FALSE(index.Erase(PrefixIndex::Tag(keys(3)), 3));
  REQUIRE_OK(index.CheckInvariants(keys));
}

TEST_CASE("prefix index invariants catch a key changed under the index") {
  Keys keys{{TestHash(1), TestHash(2)}};
  PrefixIndex index(2);
  index.Insert(PrefixIndex::Tag(TestHash(1)), TestHash(1), 0, keys);
  // Page 0's key changes under the index: its tag no longer matches.
  keys.by_page[0] = TestHash(3);
  REQUIRE_STATUS_IS(index.CheckInvariants(keys), kInternal);
}

// Keys (TestHash numbers) whose home is `bucket` in `index`, `count` of them.
std::vector<uint32_t> KeysHomedAt(const PrefixIndex& index, size_t bucket,
                                  int count) {
  std::vector<uint32_t> found;
  for (uint32_t key = 0; static_cast<int>(found.size()) < count; ++key) {
    if (index.Home(PrefixIndex::Tag(TestHash(key))) == bucket) {
      found.push_back(key);
    }
  }
  return found;
}

// Nine keys of one home in a 2-bucket index: 7 fill it, 2 overflow into the
// other bucket, and the home's overflow count leads searches past it.
TEST_CASE("prefix index places keys past a full home bucket") {
  constexpr int32_t kPages = 9;
  PrefixIndex index(kPages);
  REQUIRE(index.num_buckets() == 2);
  const size_t home = GENERATE(size_t{0}, size_t{1});  // 1: wraps around.
  INFO("home bucket " << home);
  const std::vector<uint32_t> key = KeysHomedAt(index, home, kPages);
  Keys keys{std::vector<BlockHash>(kPages)};
  for (PageId page = 0; page < kPages; ++page) {
    keys.by_page[page] = TestHash(key[page]);
    REQUIRE(index.Insert(PrefixIndex::Tag(keys(page)), keys(page), page,
                         keys) == page);
    REQUIRE_OK(index.CheckInvariants(keys));
  }
  for (PageId page = 0; page < kPages; ++page) {
    REQUIRE(index.Find(keys(page), keys) == page);
  }
  // A second page with an overflowed key is refused for the first.
  Keys with_copy = keys;
  with_copy.by_page.push_back(keys(8));
  REQUIRE(index.Insert(PrefixIndex::Tag(keys(8)), keys(8), 9, with_copy) == 8);
  REQUIRE(index.size() == kPages);

  // Erasing from the home keeps the overflowed keys found; a new key of the
  // same home then fills the freed entry, not the other bucket.
  index.Erase(PrefixIndex::Tag(keys(3)), 3);
  REQUIRE_OK(index.CheckInvariants(keys));
  REQUIRE(index.Find(keys(8), keys) == 8);
  REQUIRE(index.Find(keys(3), keys) == kNoPage);
  keys.by_page[3] = TestHash(KeysHomedAt(index, home, kPages + 1).back());
  REQUIRE(index.Insert(PrefixIndex::Tag(keys(3)), keys(3), 3, keys) == 3);
  REQUIRE_OK(index.CheckInvariants(keys));

  // Erasing the overflowed keys brings the overflow count back to 0, and a
  // search for an absent key of that home stops at it again.
  index.Erase(PrefixIndex::Tag(keys(7)), 7);
  index.Erase(PrefixIndex::Tag(keys(8)), 8);
  REQUIRE_OK(index.CheckInvariants(keys));
  for (PageId page = 0; page < 7; ++page) {
    REQUIRE(index.Find(keys(page), keys) == page);
  }
  REQUIRE(index.Find(keys(8), keys) == kNoPage);
  REQUIRE(index.size() == 7);
}

// Locate names a found key or a free entry; InsertAt fills that entry even
// after an erase on the key's search path, as the host tier does when a
// store drops the LRU head between the two.
TEST_CASE("prefix index inserts where Locate found room, across an erase") {
  constexpr int32_t kPages = 9;
  PrefixIndex index(kPages);
  const std::vector<uint32_t> key = KeysHomedAt(index, 0, kPages);
  Keys keys{std::vector<BlockHash>(kPages)};
  for (PageId page = 0; page < 7; ++page) {  // bucket 0 full.
    keys.by_page[page] = TestHash(key[page]);
    REQUIRE(index.Insert(PrefixIndex::Tag(keys(page)), keys(page), page,
                         keys) == page);
  }
  const PrefixIndex::Place found =
      index.Locate(PrefixIndex::Tag(keys(4)), keys(4), keys);
  REQUIRE(found.found == 4);
  keys.by_page[7] = TestHash(key[7]);
  const uint32_t tag = PrefixIndex::Tag(keys(7));
  const PrefixIndex::Place place = index.Locate(tag, keys(7), keys);
  REQUIRE(place.found == kNoPage);
  REQUIRE(place.bucket == 1);  // past the full home.
  REQUIRE(index.Erase(PrefixIndex::Tag(keys(2)), 2));
  index.InsertAt(place, tag, 7);
  REQUIRE_OK(index.CheckInvariants(keys));  // bucket 0 counts key 7.
  REQUIRE(index.Find(keys(7), keys) == 7);
  REQUIRE(index.Find(keys(2), keys) == kNoPage);
  REQUIRE(index.size() == 7);
}

// Random inserts and erases against a std::map in the smallest table (2
// buckets, up to 9 entries of 14), kept nearly full, so that keys overflow
// past full buckets (both ways around) and erases free entries in overflowed
// buckets. Every key is looked up after every step.
TEST_CASE("prefix index agrees with a map through random churn") {
  const uint32_t seed = GENERATE(1u, 2u, 3u, 4u);
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  constexpr int32_t kPages = 9;   // the most entries at once.
  constexpr uint32_t kKeys = 40;  // keys drawn; pages are re-keyed.
  Keys keys{std::vector<BlockHash>(kPages)};
  std::map<uint32_t, PageId> model;         // key number -> page.
  std::vector<int64_t> key_of(kPages, -1);  // page -> key number, or -1.
  PrefixIndex index(kPages);
  REQUIRE(index.num_buckets() == 2);
  for (int step = 0; step < 20000; ++step) {
    INFO("step " << step);
    const PageId page = static_cast<PageId>(rng() % kPages);
    // Erase one time in four: the index stays near its 9 entries.
    if (key_of[page] >= 0 && rng() % 4 == 0) {
      const BlockHash hash = keys(page);
      index.Erase(PrefixIndex::Tag(hash), page);
      model.erase(static_cast<uint32_t>(key_of[page]));
      key_of[page] = -1;
    } else if (key_of[page] < 0) {
      const uint32_t key = rng() % kKeys;
      keys.by_page[page] = TestHash(key);
      const auto it = model.find(key);
      const PageId expected = it == model.end() ? page : it->second;
      REQUIRE(index.Insert(PrefixIndex::Tag(TestHash(key)), TestHash(key), page,
                           keys) == expected);
      if (expected == page) {
        model[key] = page;
        key_of[page] = key;
      }
    }
    REQUIRE(index.size() == static_cast<int32_t>(model.size()));
    for (uint32_t key = 0; key < kKeys; ++key) {
      const auto it = model.find(key);
      REQUIRE(index.Find(TestHash(key), keys) ==
              (it == model.end() ? kNoPage : it->second));
    }
    REQUIRE_OK(index.CheckInvariants(keys));
  }
}

}  // namespace
}  // namespace kvblock
