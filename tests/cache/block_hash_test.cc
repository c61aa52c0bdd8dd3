// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "kvblock/block_hash.h"

#include <openssl/evp.h>
#include <xxhash.h>

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "cache/block_hash_reference.h"
#include "kvblock/block_manager.h"
#include "test_util.h"

namespace kvblock {
namespace {

using testing::Compress;
using testing::PageHex;
using testing::RootHex;
using testing::RootMessage;
using testing::Sha256Hex;
using testing::Sha256State;
using testing::StateHex;
using testing::Xxh3Hex;

// Test vectors. Each was computed by a small Python script, independently
// of lib/cache/block_hash.cc: the root messages written with struct.pack of the
// documented fields ("<I" page size, "<Q" salt length, "<q" adapter id) and
// hashed with hashlib.sha256 and `xxhsum -H2` (xxHash 0.8.1); the SHA-256
// page steps run by a plain Python transcription of FIPS 180-4's
// compression function (checked against hashlib on whole messages), the
// XXH3 page messages (parent || "<i" tokens) hashed by xxhsum.
//   root0: page size 4, salt "", adapter 0
//   v1:    parent root0, tokens {1, 2, 3, 4}
//   v2:    parent v1, tokens {5, 6, 7, 8}
//   root3: page size 4, salt "tenant-a", adapter -2
//   v3:    parent root3, tokens {-1, INT32_MAX, INT32_MIN, 0x01020304}
//   root16: page size 16, salt "", adapter 0
//   v16:   parent root16, tokens 100..115 (one whole SHA-256 block)
//   root20: page size 20, salt "s", adapter 5
//   v20:   parent root20, tokens -10..9 (a block, then a zero-filled one)
struct Vectors {
  HashAlgorithm algorithm;
  absl::string_view root0, v1, v2, root3, v3, root16, v16, root20, v20;
};
constexpr Vectors kSha256Vectors = {
    HashAlgorithm::kSha256,
    "d0b765e734101faf10bddfeafdc2ddd248b428ec3521677184371a94161571c2",
    "ee81d733ede1f2106d63efbe3dc524aa7e421ca2503bf7e6bb08095813847de8",
    "d506f012e05d194625dd37a30b97c0398b9f7e751e294c93b8f114d22d04fb44",
    "89e3acee8098af3b5ded5dc24825f50e90bd420a1e75d8ed125fdae49006e306",
    "ef63a99cecc11531378a11d38c87ac760edc0f298da46d25f9badb5d90b7c212",
    "bc50bcd4f489b90235ed1cda39f1472a05ba8948b58e332ca869bb6ec0cfe0f6",
    "f441d1939c5b9f2188e40a28efe6ce862215bb8bbfb86f1081b07123804360d5",
    "2f09708e202db936bb06e820fee8724c0c2bac385bae6e56af21b47f5f08d1cd",
    "f8548b11d2dbd9c1181a2a45f3c5c96b206923c9617243db441beb6d4689a7f2",
};
// XXH3-128 hashes: the 16 canonical bytes, then 16 zero bytes.
constexpr Vectors kXxh3Vectors = {
    HashAlgorithm::kXxh3_128,
    "797a1e7abc5810cdacd9a56f0509be5b00000000000000000000000000000000",
    "f20f2f979b5217bf17d97fa5a9756eb200000000000000000000000000000000",
    "c0474a0fc3c03ce8de2d14c9bafa60bf00000000000000000000000000000000",
    "a4fc22c7734aaaa99c44d5652ec4550100000000000000000000000000000000",
    "d6ac28eb6a7d43bf3ef2b33f1c0acf3e00000000000000000000000000000000",
    "32fd01765ed801776569e8d66faf8a9800000000000000000000000000000000",
    "806be83d1a47ad1be3783437edafdcf600000000000000000000000000000000",
    "4c15f82bf04275063fb3861bbd6696ce00000000000000000000000000000000",
    "0f9d93f3d49bba12b304767a2619f64700000000000000000000000000000000",
};
const Vectors& VectorsOf(HashAlgorithm algorithm) {
  return algorithm == HashAlgorithm::kSha256 ? kSha256Vectors : kXxh3Vectors;
}

const std::vector<TokenId> kV1Tokens = {1, 2, 3, 4};
const std::vector<TokenId> kV2Tokens = {5, 6, 7, 8};
const std::vector<TokenId> kV3Tokens = {-1, 2147483647, -2147483647 - 1,
                                        0x01020304};
constexpr HashExtraKeys kV3Extra = {"tenant-a", -2};
constexpr HashExtraKeys kV20Extra = {"s", 5};

// `count` consecutive tokens from `first`.
std::vector<TokenId> Iota(TokenId first, int count) {
  std::vector<TokenId> tokens(static_cast<size_t>(count));
  for (TokenId& token : tokens) token = first++;
  return tokens;
}

std::string Hex(const BlockHash& hash) {
  return absl::BytesToHexString(absl::string_view(
      reinterpret_cast<const char*>(hash.bytes.data()), hash.bytes.size()));
}

BlockHash FromHex(absl::string_view hex) {
  const std::string bytes = absl::HexStringToBytes(hex);
  REQUIRE(bytes.size() == 32);
  BlockHash hash;
  for (size_t i = 0; i < 32; ++i)
    hash.bytes[i] = static_cast<uint8_t>(bytes[i]);
  return hash;
}

BlockHasher MakeHasher(HashAlgorithm algorithm, int32_t page_size) {
  absl::StatusOr<BlockHasher> hasher =
      BlockHasher::Create(algorithm, page_size);
  REQUIRE_OK(hasher);
  return *std::move(hasher);
}

TEST_CASE("the reference compression function is SHA-256's") {
  // SHA-256 of a message that fits one block: the compression of the padded
  // block from the initial hash value (FIPS 180-4, 5.3.3).
  const Sha256State iv = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                          0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  for (const std::string& message :
       {std::string("abc"), std::string(55, 'x')}) {
    uint8_t block[64] = {};
    message.copy(reinterpret_cast<char*>(block), message.size());
    block[message.size()] = 0x80;
    block[62] = static_cast<uint8_t>((8 * message.size()) >> 8);
    block[63] = static_cast<uint8_t>(8 * message.size());
    REQUIRE(StateHex(Compress(iv, block)) == Sha256Hex(message));
  }
}

TEST_CASE("test vectors pin the format of both algorithms") {
  const Vectors vectors = GENERATE(kSha256Vectors, kXxh3Vectors);
  const HashAlgorithm algorithm = vectors.algorithm;
  INFO(HashAlgorithmName(algorithm));
  BlockHasher hasher = MakeHasher(algorithm, 4);
  REQUIRE(hasher.algorithm() == algorithm);
  REQUIRE(hasher.page_size() == 4);
  const BlockHash root0 = hasher.RootHash({});
  REQUIRE(Hex(root0) == vectors.root0);
  const BlockHash v1 = hasher.HashPage(root0, kV1Tokens);
  REQUIRE(Hex(v1) == vectors.v1);
  REQUIRE(Hex(hasher.HashPage(v1, kV2Tokens)) == vectors.v2);
  const BlockHash root3 = hasher.RootHash(kV3Extra);
  REQUIRE(Hex(root3) == vectors.root3);
  REQUIRE(Hex(hasher.HashPage(root3, kV3Tokens)) == vectors.v3);
  BlockHasher hasher16 = MakeHasher(algorithm, 16);
  const BlockHash root16 = hasher16.RootHash({});
  REQUIRE(Hex(root16) == vectors.root16);
  REQUIRE(Hex(hasher16.HashPage(root16, Iota(100, 16))) == vectors.v16);
  BlockHasher hasher20 = MakeHasher(algorithm, 20);
  const BlockHash root20 = hasher20.RootHash(kV20Extra);
  REQUIRE(Hex(root20) == vectors.root20);
  REQUIRE(Hex(hasher20.HashPage(root20, Iota(-10, 20))) == vectors.v20);

  // The header's byte tables and page steps, written independently here,
  // give the same vectors: the documentation is the format.
  REQUIRE(RootHex(algorithm, 4, {}) == vectors.root0);
  REQUIRE(PageHex(algorithm, FromHex(vectors.root0), kV1Tokens) == vectors.v1);
  REQUIRE(PageHex(algorithm, FromHex(vectors.v1), kV2Tokens) == vectors.v2);
  REQUIRE(RootHex(algorithm, 4, kV3Extra) == vectors.root3);
  REQUIRE(PageHex(algorithm, FromHex(vectors.root3), kV3Tokens) == vectors.v3);
  REQUIRE(RootHex(algorithm, 16, {}) == vectors.root16);
  REQUIRE(PageHex(algorithm, FromHex(vectors.root16), Iota(100, 16)) ==
          vectors.v16);
  REQUIRE(RootHex(algorithm, 20, kV20Extra) == vectors.root20);
  REQUIRE(PageHex(algorithm, FromHex(vectors.root20), Iota(-10, 20)) ==
          vectors.v20);
}

TEST_CASE("the default algorithm is sha256") {
  REQUIRE(BlockManagerOptions{}.hash_algorithm == HashAlgorithm::kSha256);
  REQUIRE(HashAlgorithmName(HashAlgorithm::kSha256) == "sha256");
  REQUIRE(HashAlgorithmName(HashAlgorithm::kXxh3_128) == "xxh3_128");
  REQUIRE(HashAlgorithmName(static_cast<HashAlgorithm>(9)) == "unknown");
}

TEST_CASE("an unknown algorithm is rejected") {
  const absl::StatusOr<BlockHasher> hasher =
      BlockHasher::Create(static_cast<HashAlgorithm>(9), 16);
  REQUIRE_STATUS_IS(hasher, kInvalidArgument);
  REQUIRE(hasher.status().message().find("9") != absl::string_view::npos);
}

TEST_CASE("a non-positive page_size is rejected with its value") {
  const int32_t page_size = GENERATE(0, -1, -2147483647 - 1);
  const absl::StatusOr<BlockHasher> hasher =
      BlockHasher::Create(HashAlgorithm::kSha256, page_size);
  REQUIRE_STATUS_IS(hasher, kInvalidArgument);
  REQUIRE(hasher.status().message().find(
              absl::StrCat("page_size must be positive, got ", page_size)) !=
          absl::string_view::npos);
}

TEST_CASE("a hash block size that does not divide the page is rejected") {
  const int32_t hash_block_size = GENERATE(0, -4, 3, 32, 2147483647);
  const absl::StatusOr<BlockHasher> hasher =
      BlockHasher::Create(HashAlgorithm::kSha256, 16, hash_block_size);
  REQUIRE_STATUS_IS(hasher, kInvalidArgument);
  INFO(hasher.status().message());
  REQUIRE(hasher.status().message().find(absl::StrCat(
              "positive divisor of page_size 16, got ", hash_block_size)) !=
          absl::string_view::npos);
}

TEST_CASE("a page of hash blocks is named by its last block's hash") {
  const HashAlgorithm algorithm =
      GENERATE(HashAlgorithm::kSha256, HashAlgorithm::kXxh3_128);
  const HashExtraKeys extra = {"salt", 3};
  BlockHasher blocks = MakeHasher(algorithm, 4);
  absl::StatusOr<BlockHasher> created = BlockHasher::Create(algorithm, 8, 4);
  REQUIRE_OK(created);
  BlockHasher pages = *std::move(created);
  REQUIRE(pages.page_size() == 8);
  REQUIRE(pages.hash_block_size() == 4);
  REQUIRE(MakeHasher(algorithm, 8).hash_block_size() == 8);

  const std::vector<TokenId> tokens = Iota(1, 19);
  std::vector<BlockHash> by_block(4), by_page(2);
  REQUIRE(*HashChain(blocks, tokens, extra, absl::MakeSpan(by_block)) == 4);
  REQUIRE(*HashChain(pages, tokens, extra, absl::MakeSpan(by_page)) == 2);
  // One root for every multiple of the block: it names the block's size.
  REQUIRE(pages.RootHash(extra) == blocks.RootHash(extra));
  REQUIRE(by_page[0] == by_block[1]);
  REQUIRE(by_page[1] == by_block[3]);
  // The 4-token vectors (root0, v1, v2) name the first 8-token page.
  REQUIRE(Hex(pages.HashPage(pages.RootHash({}), Iota(1, 8))) ==
          VectorsOf(algorithm).v2);
  // Without hash blocks an 8-token page is hashed whole, otherwise.
  BlockHasher whole = MakeHasher(algorithm, 8);
  REQUIRE(whole.HashPage(whole.RootHash(extra), Iota(1, 8)) != by_page[0]);
}

TEST_CASE("a chain hashes every full page and skips the partial tail") {
  const HashAlgorithm algorithm =
      GENERATE(HashAlgorithm::kSha256, HashAlgorithm::kXxh3_128);
  BlockHasher hasher = MakeHasher(algorithm, 4);
  const std::vector<TokenId> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  const BlockHash sentinel = FromHex(std::string(64, 'a'));
  std::vector<BlockHash> out(4, sentinel);

  absl::StatusOr<int64_t> pages =
      HashChain(hasher, tokens, {}, absl::MakeSpan(out));
  REQUIRE_OK(pages);
  REQUIRE(*pages == 2);
  REQUIRE(Hex(out[0]) == VectorsOf(algorithm).v1);
  REQUIRE(Hex(out[1]) == VectorsOf(algorithm).v2);
  REQUIRE(out[2] == sentinel);
  REQUIRE(out[3] == sentinel);

  SECTION("exactly as many outputs as full pages is enough") {
    pages = HashChain(hasher, tokens, {}, absl::MakeSpan(out).subspan(0, 2));
    REQUIRE_OK(pages);
    REQUIRE(*pages == 2);
  }
  SECTION("the chain equals page-by-page hashing with the extra keys") {
    BlockHasher by_three = MakeHasher(algorithm, 3);
    const HashExtraKeys extra = {"salt", 7};
    pages = HashChain(by_three, tokens, extra, absl::MakeSpan(out));
    REQUIRE_OK(pages);
    REQUIRE(*pages == 3);
    const std::vector<TokenId> page0 = {1, 2, 3}, page1 = {4, 5, 6},
                               page2 = {7, 8, 9};
    const BlockHash h0 = by_three.HashPage(by_three.RootHash(extra), page0);
    const BlockHash h1 = by_three.HashPage(h0, page1);
    REQUIRE(out[0] == h0);
    REQUIRE(out[1] == h1);
    REQUIRE(out[2] == by_three.HashPage(h1, page2));
  }
  SECTION("fewer tokens than a page hash nothing") {
    pages = HashChain(hasher, absl::MakeSpan(tokens).subspan(0, 3), {},
                      absl::Span<BlockHash>());
    REQUIRE_OK(pages);
    REQUIRE(*pages == 0);
    pages = HashChain(hasher, {}, {}, absl::Span<BlockHash>());
    REQUIRE_OK(pages);
    REQUIRE(*pages == 0);
  }
}

TEST_CASE("an output span shorter than the full pages is rejected, untouched") {
  BlockHasher hasher = MakeHasher(HashAlgorithm::kXxh3_128, 3);
  const std::vector<TokenId> tokens(10, 5);
  std::vector<BlockHash> out(2);
  const absl::StatusOr<int64_t> pages =
      HashChain(hasher, tokens, {}, absl::MakeSpan(out));
  REQUIRE_STATUS_IS(pages, kInvalidArgument);
  INFO(pages.status().message());
  REQUIRE(pages.status().message().find("out has 2 entries") !=
          absl::string_view::npos);
  REQUIRE(pages.status().message().find("3 full pages of 10 tokens") !=
          absl::string_view::npos);
  REQUIRE(out == std::vector<BlockHash>(2));
}

TEST_CASE("every input of a page changes its hash") {
  const HashAlgorithm algorithm =
      GENERATE(HashAlgorithm::kSha256, HashAlgorithm::kXxh3_128);
  INFO(HashAlgorithmName(algorithm));
  BlockHasher hasher = MakeHasher(algorithm, 4);
  const std::vector<TokenId> tokens = {11, 22, 33, 44};
  // The first page of a sequence with extra keys `extra`.
  const auto first_page = [&](const HashExtraKeys& extra,
                              const std::vector<TokenId>& page) {
    return hasher.HashPage(hasher.RootHash(extra), page);
  };
  const HashExtraKeys extra = {"tenant-a", 3};
  const BlockHash base = first_page(extra, tokens);

  SECTION("equal inputs give equal hashes, from any hasher") {
    REQUIRE(first_page(extra, tokens) == base);
    BlockHasher other = MakeHasher(algorithm, 4);
    REQUIRE(other.HashPage(other.RootHash({"tenant-a", 3}), tokens) == base);
  }
  SECTION("salt") {
    REQUIRE(first_page({"tenant-b", 3}, tokens) != base);
    REQUIRE(first_page({"", 3}, tokens) != base);
    REQUIRE(first_page({absl::string_view("tenant-a\0", 9), 3}, tokens) !=
            base);
  }
  SECTION("adapter") {
    REQUIRE(first_page({"tenant-a", 0}, tokens) != base);
    REQUIRE(first_page({"tenant-a", -3}, tokens) != base);
  }
  SECTION("parent") {
    REQUIRE(hasher.HashPage(base, tokens) != base);
    BlockHash parent = hasher.RootHash(extra);
    parent.bytes[31] ^= 1;
    REQUIRE(hasher.HashPage(parent, tokens) != base);
  }
  SECTION("token order and values") {
    REQUIRE(first_page(extra, {22, 11, 33, 44}) != base);
    REQUIRE(first_page(extra, {11, 22, 33, 45}) != base);
  }
  SECTION("algorithm") {
    const HashAlgorithm other_algorithm = algorithm == HashAlgorithm::kSha256
                                              ? HashAlgorithm::kXxh3_128
                                              : HashAlgorithm::kSha256;
    BlockHasher other = MakeHasher(other_algorithm, 4);
    REQUIRE(other.HashPage(other.RootHash(extra), tokens) != base);
    // Even from the same parent bytes: the digests differ.
    REQUIRE(other.HashPage(hasher.RootHash(extra), tokens) != base);
  }
  SECTION("page size") {
    // A 4-token page and an 8-token page whose last tokens are zero fill the
    // same zero-filled SHA-256 block: only the root keeps them apart.
    BlockHasher eight = MakeHasher(algorithm, 8);
    REQUIRE(eight.RootHash(extra) != hasher.RootHash(extra));
    const std::vector<TokenId> padded = {11, 22, 33, 44, 0, 0, 0, 0};
    REQUIRE(eight.HashPage(eight.RootHash(extra), padded) != base);
  }
}

TEST_CASE("page boundaries are part of the hash") {
  const HashAlgorithm algorithm =
      GENERATE(HashAlgorithm::kSha256, HashAlgorithm::kXxh3_128);
  BlockHasher two = MakeHasher(algorithm, 2);
  BlockHasher three = MakeHasher(algorithm, 3);
  const std::vector<TokenId> tokens = {1, 2, 3, 4, 5, 6};
  std::vector<BlockHash> by_two(3), by_three(2);
  REQUIRE_OK(HashChain(two, tokens, {}, absl::MakeSpan(by_two)));
  REQUIRE_OK(HashChain(three, tokens, {}, absl::MakeSpan(by_three)));
  // Both chains cover the same six tokens, split differently.
  REQUIRE(by_two[2] != by_three[1]);

  // Moving a token from one page to the next changes both pages' hashes.
  const std::vector<TokenId> a1 = {1, 2}, a2 = {3, 4};
  const std::vector<TokenId> b1 = {1, 3}, b2 = {2, 4};
  const BlockHash root = two.RootHash({});
  const BlockHash a_first = two.HashPage(root, a1);
  const BlockHash b_first = two.HashPage(root, b1);
  REQUIRE(a_first != b_first);
  REQUIRE(two.HashPage(a_first, a2) != two.HashPage(b_first, b2));
}

TEST_CASE("salts that differ only in trailing zero bytes give other roots") {
  const HashAlgorithm algorithm =
      GENERATE(HashAlgorithm::kSha256, HashAlgorithm::kXxh3_128);
  BlockHasher hasher = MakeHasher(algorithm, 16);
  const std::string zeros(8, '\0');
  REQUIRE(hasher.RootHash({"a", 0}) !=
          hasher.RootHash({absl::StrCat("a", zeros), 0}));
  REQUIRE(hasher.RootHash({"", 0}) != hasher.RootHash({zeros, 0}));
}

TEST_CASE("a hasher carries nothing from one message to the next") {
  const HashAlgorithm algorithm =
      GENERATE(HashAlgorithm::kSha256, HashAlgorithm::kXxh3_128);
  // A salt and a page larger than the initial message buffer make it grow.
  BlockHasher hasher = MakeHasher(algorithm, 1000);
  const std::string salt(5000, 's');
  const std::vector<TokenId> big_page = Iota(9, 1000);
  const BlockHash big_root = hasher.RootHash({salt, 1});
  REQUIRE(Hex(big_root) == RootHex(algorithm, 1000, {salt, 1}));
  const BlockHash big = hasher.HashPage(big_root, big_page);
  REQUIRE(Hex(big) == PageHex(algorithm, big_root, big_page));
  // A short root after them does not see the longer ones' leftovers.
  REQUIRE(Hex(hasher.RootHash({})) == RootHex(algorithm, 1000, {}));
  BlockHasher fresh = MakeHasher(algorithm, 1000);
  REQUIRE(fresh.HashPage(fresh.RootHash({salt, 1}), big_page) == big);
}

TEST_CASE("an xxh3 hash leaves its last 16 bytes zero") {
  BlockHasher hasher = MakeHasher(HashAlgorithm::kXxh3_128, 3);
  const BlockHash root = hasher.RootHash({"x", 1});
  const BlockHash hash = hasher.HashPage(root, {7, 7, 7});
  for (size_t i = 16; i < 32; ++i) {
    REQUIRE(root.bytes[i] == 0);
    REQUIRE(hash.bytes[i] == 0);
  }
}

TEST_CASE("a moved hasher keeps hashing") {
  const HashAlgorithm algorithm =
      GENERATE(HashAlgorithm::kSha256, HashAlgorithm::kXxh3_128);
  BlockHasher source = MakeHasher(algorithm, 4);
  BlockHasher moved(std::move(source));
  REQUIRE(moved.algorithm() == algorithm);
  REQUIRE(moved.page_size() == 4);
  const Vectors& vectors = VectorsOf(algorithm);
  REQUIRE(Hex(moved.HashPage(FromHex(vectors.root0), kV1Tokens)) == vectors.v1);
  BlockHasher assigned = MakeHasher(HashAlgorithm::kSha256, 7);
  assigned = std::move(moved);
  REQUIRE(assigned.algorithm() == algorithm);
  REQUIRE(assigned.page_size() == 4);
  REQUIRE(Hex(assigned.RootHash({})) == vectors.root0);
  REQUIRE(Hex(assigned.HashPage(FromHex(vectors.root0), kV1Tokens)) ==
          vectors.v1);
}

}  // namespace
}  // namespace kvblock
