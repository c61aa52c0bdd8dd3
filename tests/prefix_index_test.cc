// Copyright 2026 The kvblock Authors.
#include "kvblock/prefix_index.h"

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

  index.Erase(PrefixIndex::Tag(TestHash(10)), 0);
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

TEST_CASE("prefix index invariants catch a key changed under the index") {
  Keys keys{{TestHash(1), TestHash(2)}};
  PrefixIndex index(2);
  index.Insert(PrefixIndex::Tag(TestHash(1)), TestHash(1), 0, keys);
  // Page 0's key changes under the index: its tag no longer matches.
  keys.by_page[0] = TestHash(3);
  REQUIRE_STATUS_IS(index.CheckInvariants(keys), kInternal);
}

// Random inserts and erases against a std::map in the smallest table (16
// slots, up to 8 entries: half full), so probe runs form, wrap around its end
// and are cut by backward-shift deletion. Every key is looked up after every
// step.
TEST_CASE("prefix index agrees with a map through random churn") {
  const uint32_t seed = GENERATE(1u, 2u, 3u, 4u);
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  constexpr int32_t kPages = 8;   // the most entries at once.
  constexpr uint32_t kKeys = 24;  // keys drawn; pages are re-keyed.
  Keys keys{std::vector<BlockHash>(kPages)};
  std::map<uint32_t, PageId> model;         // key number -> page.
  std::vector<int64_t> key_of(kPages, -1);  // page -> key number, or -1.
  PrefixIndex index(kPages);
  for (int step = 0; step < 20000; ++step) {
    INFO("step " << step);
    const PageId page = static_cast<PageId>(rng() % kPages);
    if (key_of[page] >= 0) {
      const BlockHash hash = keys(page);
      index.Erase(PrefixIndex::Tag(hash), page);
      model.erase(static_cast<uint32_t>(key_of[page]));
      key_of[page] = -1;
    } else {
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
