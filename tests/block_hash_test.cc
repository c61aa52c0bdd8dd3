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
// (struct.pack of the documented fields: "<Q" counts, "<i" tokens, "<q"
// adapter id) and hashed with `sha256sum` and `xxhsum -H2` (xxHash 0.8.1), so
// they pin the format independently of lib/block_hash.cc.
//   v1: parent root, tokens {1, 2, 3, 4}, salt "", adapter 0
//   v2: parent v1, tokens {5, 6, 7, 8}, salt "", adapter 0
//   v3: parent root, tokens {-1, INT32_MAX, INT32_MIN, 0x01020304},
//       salt "tenant-a", adapter -2
constexpr absl::string_view kSha256V1 =
    "cf276521c6ef94a47fa974646377613e098a672c14c038500a85ef996b680def";
constexpr absl::string_view kSha256V2 =
    "cfe44c075c5a76efe2d29bc201599dcba27e87289bbc97bb83db9d08e1e2683a";
constexpr absl::string_view kSha256V3 =
    "4093dabc980f0f977ed937f8aa3b04aabd6343190592aeabc1783e4216300806";
// XXH3-128 hashes: the 16 canonical bytes, then 16 zero bytes.
constexpr absl::string_view kXxh3V1 =
    "b8e03f43e8dce7e6672c47ba80497e00"
    "00000000000000000000000000000000";
constexpr absl::string_view kXxh3V2 =
    "ab05695c3c76e6d3e5cb7c5fd0278566"
    "00000000000000000000000000000000";
constexpr absl::string_view kXxh3V3 =
    "0c5198dc1e0b939a41833f984258810c"
    "00000000000000000000000000000000";

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

// The documented message, written field by field from the header's table.
std::string AppendLe(std::string out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) {
    out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
  }
  return out;
}
std::string Message(HashAlgorithm algorithm, const BlockHash& parent,
                    const std::vector<TokenId>& tokens,
                    const HashExtraKeys& extra) {
  std::string m = "kvblock-block-v1";
  m.push_back(static_cast<char>(algorithm));
  m.append(reinterpret_cast<const char*>(parent.bytes.data()), 32);
  m = AppendLe(std::move(m), tokens.size(), 8);
  for (TokenId t : tokens)
    m = AppendLe(std::move(m), static_cast<uint32_t>(t), 4);
  m = AppendLe(std::move(m), extra.cache_salt.size(), 8);
  m.append(extra.cache_salt.data(), extra.cache_salt.size());
  return AppendLe(std::move(m), static_cast<uint64_t>(extra.adapter_id), 8);
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
  struct Vectors {
    HashAlgorithm algorithm;
    absl::string_view v1, v2, v3;
  };
  const Vectors vectors =
      GENERATE(Vectors{HashAlgorithm::kSha256, kSha256V1, kSha256V2, kSha256V3},
               Vectors{HashAlgorithm::kXxh3_128, kXxh3V1, kXxh3V2, kXxh3V3});
  INFO(HashAlgorithmName(vectors.algorithm));
  BlockHasher hasher = MakeHasher(vectors.algorithm);
  REQUIRE(hasher.algorithm() == vectors.algorithm);

  const BlockHash v1 = hasher.HashPage(kRootBlockHash, kV1Tokens, {});
  REQUIRE(Hex(v1) == vectors.v1);
  const BlockHash v2 = hasher.HashPage(v1, kV2Tokens, {});
  REQUIRE(Hex(v2) == vectors.v2);
  REQUIRE(Hex(hasher.HashPage(kRootBlockHash, kV3Tokens, kV3Extra)) ==
          vectors.v3);

  // The header's byte table, written independently here, hashes to the same
  // vectors: the documentation is the format.
  REQUIRE(
      DigestHex(vectors.algorithm, Message(vectors.algorithm, kRootBlockHash,
                                           kV1Tokens, {})) == vectors.v1);
  REQUIRE(DigestHex(vectors.algorithm,
                    Message(vectors.algorithm, FromHex(vectors.v1), kV2Tokens,
                            {})) == vectors.v2);
  REQUIRE(
      DigestHex(vectors.algorithm, Message(vectors.algorithm, kRootBlockHash,
                                           kV3Tokens, kV3Extra)) == vectors.v3);
}

TEST_CASE("the root is 32 zero bytes and the default algorithm is sha256") {
  REQUIRE(kRootBlockHash.bytes == std::array<uint8_t, 32>{});
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
  REQUIRE(Hex(out[0]) ==
          (algorithm == HashAlgorithm::kSha256 ? kSha256V1 : kXxh3V1));
  REQUIRE(Hex(out[1]) ==
          (algorithm == HashAlgorithm::kSha256 ? kSha256V2 : kXxh3V2));
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
    const BlockHash h0 = hasher.HashPage(kRootBlockHash, page0, extra);
    const BlockHash h1 = hasher.HashPage(h0, page1, extra);
    REQUIRE(out[0] == h0);
    REQUIRE(out[1] == h1);
    REQUIRE(out[2] == hasher.HashPage(h1, page2, extra));
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
  const HashExtraKeys extra = {"tenant-a", 3};
  const BlockHash base = hasher.HashPage(kRootBlockHash, tokens, extra);

  SECTION("equal inputs give equal hashes, from any hasher") {
    REQUIRE(hasher.HashPage(kRootBlockHash, tokens, extra) == base);
    BlockHasher other = MakeHasher(algorithm);
    REQUIRE(other.HashPage(kRootBlockHash, tokens, {"tenant-a", 3}) == base);
  }
  SECTION("salt") {
    REQUIRE(hasher.HashPage(kRootBlockHash, tokens, {"tenant-b", 3}) != base);
    REQUIRE(hasher.HashPage(kRootBlockHash, tokens, {"", 3}) != base);
    REQUIRE(hasher.HashPage(kRootBlockHash, tokens,
                            {absl::string_view("tenant-a\0", 9), 3}) != base);
  }
  SECTION("adapter") {
    REQUIRE(hasher.HashPage(kRootBlockHash, tokens, {"tenant-a", 0}) != base);
    REQUIRE(hasher.HashPage(kRootBlockHash, tokens, {"tenant-a", -3}) != base);
  }
  SECTION("parent") {
    REQUIRE(hasher.HashPage(base, tokens, extra) != base);
    BlockHash parent = kRootBlockHash;
    parent.bytes[31] = 1;
    REQUIRE(hasher.HashPage(parent, tokens, extra) != base);
  }
  SECTION("token order and values") {
    const std::vector<TokenId> swapped = {22, 11, 33, 44};
    REQUIRE(hasher.HashPage(kRootBlockHash, swapped, extra) != base);
    const std::vector<TokenId> changed = {11, 22, 33, 45};
    REQUIRE(hasher.HashPage(kRootBlockHash, changed, extra) != base);
  }
  SECTION("algorithm") {
    const HashAlgorithm other_algorithm = algorithm == HashAlgorithm::kSha256
                                              ? HashAlgorithm::kXxh3_128
                                              : HashAlgorithm::kSha256;
    BlockHasher other = MakeHasher(other_algorithm);
    REQUIRE(other.HashPage(kRootBlockHash, tokens, extra) != base);
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
  const BlockHash a_first = hasher.HashPage(kRootBlockHash, a1, {});
  const BlockHash b_first = hasher.HashPage(kRootBlockHash, b1, {});
  REQUIRE(a_first != b_first);
  REQUIRE(hasher.HashPage(a_first, a2, {}) != hasher.HashPage(b_first, b2, {}));
}

TEST_CASE("the salt's length prefix keeps salt and tokens apart") {
  const HashAlgorithm algorithm =
      GENERATE(HashAlgorithm::kSha256, HashAlgorithm::kXxh3_128);
  BlockHasher hasher = MakeHasher(algorithm);
  // Without length prefixes both would be the bytes 01000000 02000000.
  const std::vector<TokenId> two_tokens = {1, 2};
  const std::vector<TokenId> one_token = {1};
  const absl::string_view token_bytes("\x02\0\0\0", 4);
  REQUIRE(hasher.HashPage(kRootBlockHash, two_tokens, {}) !=
          hasher.HashPage(kRootBlockHash, one_token, {token_bytes, 0}));
}

TEST_CASE("a hasher carries nothing from one page to the next") {
  const HashAlgorithm algorithm =
      GENERATE(HashAlgorithm::kSha256, HashAlgorithm::kXxh3_128);
  BlockHasher hasher = MakeHasher(algorithm);
  // A salt and a page larger than the initial message buffer make it grow.
  const std::string salt(5000, 's');
  const std::vector<TokenId> big_page(1000, 9);
  const BlockHash big = hasher.HashPage(kRootBlockHash, big_page, {salt, 1});
  REQUIRE(Hex(big) == DigestHex(algorithm, Message(algorithm, kRootBlockHash,
                                                   big_page, {salt, 1})));
  // A short page after it does not see the longer message's leftovers.
  REQUIRE(Hex(hasher.HashPage(kRootBlockHash, kV1Tokens, {})) ==
          (algorithm == HashAlgorithm::kSha256 ? kSha256V1 : kXxh3V1));
  BlockHasher fresh = MakeHasher(algorithm);
  REQUIRE(fresh.HashPage(kRootBlockHash, big_page, {salt, 1}) == big);
}

TEST_CASE("an xxh3 hash leaves its last 16 bytes zero") {
  BlockHasher hasher = MakeHasher(HashAlgorithm::kXxh3_128);
  const std::vector<TokenId> tokens = {7, 7, 7};
  const BlockHash hash = hasher.HashPage(kRootBlockHash, tokens, {"x", 1});
  for (size_t i = 16; i < 32; ++i) REQUIRE(hash.bytes[i] == 0);
}

TEST_CASE("a moved hasher keeps hashing") {
  const HashAlgorithm algorithm =
      GENERATE(HashAlgorithm::kSha256, HashAlgorithm::kXxh3_128);
  BlockHasher source = MakeHasher(algorithm);
  BlockHasher moved(std::move(source));
  REQUIRE(moved.algorithm() == algorithm);
  REQUIRE(Hex(moved.HashPage(kRootBlockHash, kV1Tokens, {})) ==
          (algorithm == HashAlgorithm::kSha256 ? kSha256V1 : kXxh3V1));
  BlockHasher assigned = MakeHasher(HashAlgorithm::kSha256);
  assigned = std::move(moved);
  REQUIRE(assigned.algorithm() == algorithm);
  REQUIRE(Hex(assigned.HashPage(kRootBlockHash, kV1Tokens, {})) ==
          (algorithm == HashAlgorithm::kSha256 ? kSha256V1 : kXxh3V1));
}

}  // namespace
}  // namespace kvblock
