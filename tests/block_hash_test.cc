// Copyright 2026 The kvblock Authors.
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
#include "test_util.h"

namespace kvblock {
namespace {

// Test vectors. Each message was written by a small Python script
// (struct.pack of the documented fields: "<Q" salt length, "<q" adapter id,
// "<i" tokens) and hashed with `sha256sum` and `xxhsum -H2` (xxHash 0.8.1),
// so they pin the format independently of lib/block_hash.cc.
//   root0: salt "", adapter 0
//   v1:    parent root0, tokens {1, 2, 3, 4}
//   v2:    parent v1, tokens {5, 6, 7, 8}
//   root3: salt "tenant-a", adapter -2
//   v3:    parent root3, tokens {-1, INT32_MAX, INT32_MIN, 0x01020304}
struct Vectors {
  HashAlgorithm algorithm;
  absl::string_view root0, v1, v2, root3, v3;
};
constexpr Vectors kSha256Vectors = {
    HashAlgorithm::kSha256,
    "d56b502d0e5d483e24db4606fd5cdb93bda488b4e9845780e2c2903c99f9bf6f",
    "b8c424e04a6f4546583c8d62e568b4cf07fd56065af22b4ed62eb632dad45b84",
    "eb80828edbee042c8ed72c128ced544a10ddc43b903a3b92536965aeefd41b83",
    "9ee9bdd5ceeda9a9e79cfc6cf808629a84e85d09a532f45c496ce8ab2f275858",
    "71cd7c234e1f4b117eb513ef6c59c93feb9c4756c33e6da3f668e9f1a9244fe3",
};
// XXH3-128 hashes: the 16 canonical bytes, then 16 zero bytes.
constexpr Vectors kXxh3Vectors = {
    HashAlgorithm::kXxh3_128,
    "28d92e04b74210f65557fafc36ce3d4400000000000000000000000000000000",
    "755c8b6248286cfbbb48385c617d169100000000000000000000000000000000",
    "d88c77228be03c07905ec3814d5686ff00000000000000000000000000000000",
    "05cd45bdbbdb77a5100f23f71af9f79f00000000000000000000000000000000",
    "3c6df0b340ab8fdd5adfdf645d859ff300000000000000000000000000000000",
};
const Vectors& VectorsOf(HashAlgorithm algorithm) {
  return algorithm == HashAlgorithm::kSha256 ? kSha256Vectors : kXxh3Vectors;
}

const std::vector<TokenId> kV1Tokens = {1, 2, 3, 4};
const std::vector<TokenId> kV2Tokens = {5, 6, 7, 8};
const std::vector<TokenId> kV3Tokens = {-1, 2147483647, -2147483647 - 1,
                                        0x01020304};
constexpr HashExtraKeys kV3Extra = {"tenant-a", -2};

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

// The documented messages, written field by field from the header's tables.
std::string AppendLe(std::string out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) {
    out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
  }
  return out;
}
std::string RootMessage(HashAlgorithm algorithm, const HashExtraKeys& extra) {
  std::string m = "kvblock-block-v2";
  m.push_back(static_cast<char>(algorithm));
  m = AppendLe(std::move(m), extra.cache_salt.size(), 8);
  m.append(extra.cache_salt.data(), extra.cache_salt.size());
  return AppendLe(std::move(m), static_cast<uint64_t>(extra.adapter_id), 8);
}
std::string PageMessage(const BlockHash& parent,
                        const std::vector<TokenId>& tokens) {
  std::string m(reinterpret_cast<const char*>(parent.bytes.data()), 32);
  for (TokenId t : tokens) {
    m = AppendLe(std::move(m), static_cast<uint32_t>(t), 4);
  }
  return m;
}

// The digests of the documented formats, straight from OpenSSL and xxHash.
std::string Sha256Hex(const std::string& message) {
  unsigned char digest[32];
  REQUIRE(EVP_Digest(message.data(), message.size(), digest, nullptr,
                     EVP_sha256(), nullptr) == 1);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), 32));
}
std::string Xxh3Hex(const std::string& message) {
  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical,
                           XXH3_128bits(message.data(), message.size()));
  return absl::BytesToHexString(absl::string_view(
             reinterpret_cast<const char*>(canonical.digest), 16)) +
         std::string(32, '0');
}
std::string DigestHex(HashAlgorithm algorithm, const std::string& message) {
  return algorithm == HashAlgorithm::kSha256 ? Sha256Hex(message)
                                             : Xxh3Hex(message);
}

BlockHasher MakeHasher(HashAlgorithm algorithm) {
  absl::StatusOr<BlockHasher> hasher = BlockHasher::Create(algorithm);
  REQUIRE_OK(hasher);
  return *std::move(hasher);
}

TEST_CASE("test vectors pin the message format of both algorithms") {
  const Vectors vectors = GENERATE(kSha256Vectors, kXxh3Vectors);
  INFO(HashAlgorithmName(vectors.algorithm));
  BlockHasher hasher = MakeHasher(vectors.algorithm);
  REQUIRE(hasher.algorithm() == vectors.algorithm);
  const BlockHash root0 = hasher.RootHash({});
  REQUIRE(Hex(root0) == vectors.root0);
  const BlockHash v1 = hasher.HashPage(root0, kV1Tokens);
  REQUIRE(Hex(v1) == vectors.v1);
  REQUIRE(Hex(hasher.HashPage(v1, kV2Tokens)) == vectors.v2);
  const BlockHash root3 = hasher.RootHash(kV3Extra);
  REQUIRE(Hex(root3) == vectors.root3);
  REQUIRE(Hex(hasher.HashPage(root3, kV3Tokens)) == vectors.v3);

  // The header's byte tables, written independently here, hash to the same
  // vectors: the documentation is the format.
  const HashAlgorithm algorithm = vectors.algorithm;
  REQUIRE(DigestHex(algorithm, RootMessage(algorithm, {})) == vectors.root0);
  REQUIRE(DigestHex(algorithm, PageMessage(FromHex(vectors.root0),
                                           kV1Tokens)) == vectors.v1);
  REQUIRE(DigestHex(algorithm, PageMessage(FromHex(vectors.v1), kV2Tokens)) ==
          vectors.v2);
  REQUIRE(DigestHex(algorithm, RootMessage(algorithm, kV3Extra)) ==
          vectors.root3);
  REQUIRE(DigestHex(algorithm, PageMessage(FromHex(vectors.root3),
                                           kV3Tokens)) == vectors.v3);
}

TEST_CASE("the default algorithm is sha256") {
  absl::StatusOr<BlockHasher> hasher = BlockHasher::Create();
  REQUIRE_OK(hasher);
  REQUIRE(hasher->algorithm() == HashAlgorithm::kSha256);
  REQUIRE(HashAlgorithmName(HashAlgorithm::kSha256) == "sha256");
  REQUIRE(HashAlgorithmName(HashAlgorithm::kXxh3_128) == "xxh3_128");
  REQUIRE(HashAlgorithmName(static_cast<HashAlgorithm>(9)) == "unknown");
}

TEST_CASE("an unknown algorithm is rejected") {
  const absl::StatusOr<BlockHasher> hasher =
      BlockHasher::Create(static_cast<HashAlgorithm>(9));
  REQUIRE_STATUS_IS(hasher, kInvalidArgument);
  REQUIRE(hasher.status().message().find("9") != absl::string_view::npos);
}

TEST_CASE("a chain hashes every full page and skips the partial tail") {
  const HashAlgorithm algorithm =
      GENERATE(HashAlgorithm::kSha256, HashAlgorithm::kXxh3_128);
  BlockHasher hasher = MakeHasher(algorithm);
  const std::vector<TokenId> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  const BlockHash sentinel = FromHex(std::string(64, 'a'));
  std::vector<BlockHash> out(4, sentinel);

  absl::StatusOr<int64_t> pages =
      HashChain(hasher, tokens, 4, {}, absl::MakeSpan(out));
  REQUIRE_OK(pages);
  REQUIRE(*pages == 2);
  REQUIRE(Hex(out[0]) == VectorsOf(algorithm).v1);
  REQUIRE(Hex(out[1]) == VectorsOf(algorithm).v2);
  REQUIRE(out[2] == sentinel);
  REQUIRE(out[3] == sentinel);

  SECTION("exactly as many outputs as full pages is enough") {
    pages = HashChain(hasher, tokens, 4, {}, absl::MakeSpan(out).subspan(0, 2));
    REQUIRE_OK(pages);
    REQUIRE(*pages == 2);
  }
  SECTION("the chain equals page-by-page hashing with the extra keys") {
    const HashExtraKeys extra = {"salt", 7};
    pages = HashChain(hasher, tokens, 3, extra, absl::MakeSpan(out));
    REQUIRE_OK(pages);
    REQUIRE(*pages == 3);
    const std::vector<TokenId> page0 = {1, 2, 3}, page1 = {4, 5, 6},
                               page2 = {7, 8, 9};
    const BlockHash h0 = hasher.HashPage(hasher.RootHash(extra), page0);
    const BlockHash h1 = hasher.HashPage(h0, page1);
    REQUIRE(out[0] == h0);
    REQUIRE(out[1] == h1);
    REQUIRE(out[2] == hasher.HashPage(h1, page2));
  }
  SECTION("fewer tokens than a page hash nothing") {
    pages = HashChain(hasher, absl::MakeSpan(tokens).subspan(0, 3), 4, {},
                      absl::Span<BlockHash>());
    REQUIRE_OK(pages);
    REQUIRE(*pages == 0);
    pages = HashChain(hasher, {}, 4, {}, absl::Span<BlockHash>());
    REQUIRE_OK(pages);
    REQUIRE(*pages == 0);
  }
}

TEST_CASE("a non-positive page_size is rejected with its value") {
  BlockHasher hasher = MakeHasher(HashAlgorithm::kSha256);
  const std::vector<TokenId> tokens = {1, 2, 3, 4};
  std::vector<BlockHash> out(4);
  const int32_t page_size = GENERATE(0, -1, -2147483647 - 1);
  const absl::StatusOr<int64_t> pages =
      HashChain(hasher, tokens, page_size, {}, absl::MakeSpan(out));
  REQUIRE_STATUS_IS(pages, kInvalidArgument);
  REQUIRE(pages.status().message().find(
              absl::StrCat("page_size must be positive, got ", page_size)) !=
          absl::string_view::npos);
  REQUIRE(out == std::vector<BlockHash>(4));
}

TEST_CASE("an output span shorter than the full pages is rejected, untouched") {
  BlockHasher hasher = MakeHasher(HashAlgorithm::kXxh3_128);
  const std::vector<TokenId> tokens(10, 5);
  std::vector<BlockHash> out(2);
  const absl::StatusOr<int64_t> pages =
      HashChain(hasher, tokens, 3, {}, absl::MakeSpan(out));
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
  BlockHasher hasher = MakeHasher(algorithm);
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
    BlockHasher other = MakeHasher(algorithm);
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
    BlockHasher other = MakeHasher(other_algorithm);
    REQUIRE(other.HashPage(other.RootHash(extra), tokens) != base);
    // Even from the same parent bytes: the digests differ.
    REQUIRE(other.HashPage(hasher.RootHash(extra), tokens) != base);
  }
}

TEST_CASE("page boundaries are part of the hash") {
  const HashAlgorithm algorithm =
      GENERATE(HashAlgorithm::kSha256, HashAlgorithm::kXxh3_128);
  BlockHasher hasher = MakeHasher(algorithm);
  const std::vector<TokenId> tokens = {1, 2, 3, 4, 5, 6};
  std::vector<BlockHash> by_two(3), by_three(2);
  REQUIRE_OK(HashChain(hasher, tokens, 2, {}, absl::MakeSpan(by_two)));
  REQUIRE_OK(HashChain(hasher, tokens, 3, {}, absl::MakeSpan(by_three)));
  // Both chains cover the same six tokens, split differently.
  REQUIRE(by_two[2] != by_three[1]);

  // Moving a token from one page to the next changes both pages' hashes.
  const std::vector<TokenId> a1 = {1, 2, 3}, a2 = {4};
  const std::vector<TokenId> b1 = {1, 2}, b2 = {3, 4};
  const BlockHash root = hasher.RootHash({});
  const BlockHash a_first = hasher.HashPage(root, a1);
  const BlockHash b_first = hasher.HashPage(root, b1);
  REQUIRE(a_first != b_first);
  REQUIRE(hasher.HashPage(a_first, a2) != hasher.HashPage(b_first, b2));
}

TEST_CASE("salts that differ only in trailing zero bytes give other roots") {
  const HashAlgorithm algorithm =
      GENERATE(HashAlgorithm::kSha256, HashAlgorithm::kXxh3_128);
  BlockHasher hasher = MakeHasher(algorithm);
  const std::string zeros(8, '\0');
  REQUIRE(hasher.RootHash({"a", 0}) !=
          hasher.RootHash({absl::StrCat("a", zeros), 0}));
  REQUIRE(hasher.RootHash({"", 0}) != hasher.RootHash({zeros, 0}));
}

TEST_CASE("a hasher carries nothing from one message to the next") {
  const HashAlgorithm algorithm =
      GENERATE(HashAlgorithm::kSha256, HashAlgorithm::kXxh3_128);
  BlockHasher hasher = MakeHasher(algorithm);
  // A salt and a page larger than the initial message buffer make it grow.
  const std::string salt(5000, 's');
  const std::vector<TokenId> big_page(1000, 9);
  const BlockHash big_root = hasher.RootHash({salt, 1});
  REQUIRE(Hex(big_root) == DigestHex(algorithm, RootMessage(algorithm,
                                                            {salt, 1})));
  const BlockHash big = hasher.HashPage(big_root, big_page);
  REQUIRE(Hex(big) == DigestHex(algorithm, PageMessage(big_root, big_page)));
  // Short messages after them do not see the longer ones' leftovers.
  const Vectors& vectors = VectorsOf(algorithm);
  REQUIRE(Hex(hasher.RootHash({})) == vectors.root0);
  REQUIRE(Hex(hasher.HashPage(FromHex(vectors.root0), kV1Tokens)) ==
          vectors.v1);
  BlockHasher fresh = MakeHasher(algorithm);
  REQUIRE(fresh.HashPage(fresh.RootHash({salt, 1}), big_page) == big);
}

TEST_CASE("an xxh3 hash leaves its last 16 bytes zero") {
  BlockHasher hasher = MakeHasher(HashAlgorithm::kXxh3_128);
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
  BlockHasher source = MakeHasher(algorithm);
  BlockHasher moved(std::move(source));
  REQUIRE(moved.algorithm() == algorithm);
  const Vectors& vectors = VectorsOf(algorithm);
  REQUIRE(Hex(moved.HashPage(FromHex(vectors.root0), kV1Tokens)) ==
          vectors.v1);
  BlockHasher assigned = MakeHasher(HashAlgorithm::kSha256);
  assigned = std::move(moved);
  REQUIRE(assigned.algorithm() == algorithm);
  REQUIRE(Hex(assigned.HashPage(FromHex(vectors.root0), kV1Tokens)) ==
          vectors.v1);
}

}  // namespace
}  // namespace kvblock
