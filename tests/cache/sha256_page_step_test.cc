// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// The two SHA-256 page steps: FIPS 180-4's examples (a page step from the
// initial hash value over a padded message's blocks is that message's
// digest), then the SHA extensions' step against OpenSSL's on random pages.
// Runs only on a CPU with the SHA extensions (sha256_ni_main.cc exits 77,
// Meson's "skipped", elsewhere); block_hash_test checks whichever step the
// CPU dispatches to against independent vectors everywhere.
#include "cache/sha256_page_step.h"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/string_view.h"
#include "catch.h"

namespace kvblock::internal {
namespace {

#if KVBLOCK_SHA256_NI_ARCH

BlockHash FromHex(absl::string_view hex) {
  const std::string bytes = absl::HexStringToBytes(hex);
  REQUIRE(bytes.size() == 32);
  BlockHash hash;
  std::memcpy(hash.bytes.data(), bytes.data(), bytes.size());
  return hash;
}

// FIPS 180-4, 5.3.3: SHA-256's initial hash value, as a parent hash.
BlockHash InitialHashValue() {
  return FromHex(
      "6a09e667bb67ae853c6ef372a54ff53a510e527f9b05688c1f83d9ab5be0cd19");
}

// `message` padded as SHA-256 pads it (0x80, zeros, the 64-bit big-endian
// bit length), read as the little-endian tokens of a page.
std::vector<TokenId> PaddedAsTokens(absl::string_view message) {
  std::string padded(message);
  padded.push_back('\x80');
  while (padded.size() % 64 != 56) padded.push_back('\0');
  const uint64_t bits = uint64_t{message.size()} * 8;
  for (int i = 7; i >= 0; --i) {
    padded.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
  }
  std::vector<TokenId> tokens(padded.size() / sizeof(TokenId));
  for (size_t i = 0; i < tokens.size(); ++i) {
    uint32_t token = 0;
    for (size_t byte = 0; byte < sizeof(token); ++byte) {
      token |= uint32_t{static_cast<uint8_t>(padded[4 * i + byte])}
               << (8 * byte);
    }
    tokens[i] = static_cast<TokenId>(token);
  }
  return tokens;
}

struct Example {
  absl::string_view message;
  absl::string_view digest;
};
// FIPS 180-2, appendix B.1 and B.2: one block, then two.
constexpr Example kExamples[] = {
    {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
    {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
     "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
};

TEST_CASE("both page steps compute FIPS 180-4's example digests") {
  for (const Example& example : kExamples) {
    INFO("message: " << example.message);
    const std::vector<TokenId> page = PaddedAsTokens(example.message);
    const BlockHash digest = FromHex(example.digest);
    CHECK(Sha256PageStepOpenSsl(InitialHashValue(), page) == digest);
    CHECK(Sha256PageStepNi(InitialHashValue(), page) == digest);
    CHECK(Sha256PageStep(InitialHashValue(), page) == digest);
  }
}

TEST_CASE("the SHA extensions' page step equals OpenSSL's on random pages") {
  // Every page size from 1 to 40 tokens: whole blocks, a zero-filled last
  // block, and both.
  constexpr uint32_t kSeed = 20261129;
  std::mt19937 rng(kSeed);
  INFO("seed " << kSeed);
  for (int round = 0; round < 250; ++round) {
    for (size_t page_size = 1; page_size <= 40; ++page_size) {
      BlockHash parent;
      for (uint8_t& byte : parent.bytes) byte = static_cast<uint8_t>(rng());
      std::vector<TokenId> page(page_size);
      for (TokenId& token : page) token = static_cast<TokenId>(rng());
      INFO("round " << round << ", page_size " << page_size);
      REQUIRE(Sha256PageStepNi(parent, page) ==
              Sha256PageStepOpenSsl(parent, page));
    }
  }
}

#endif  // KVBLOCK_SHA256_NI_ARCH

}  // namespace
}  // namespace kvblock::internal
