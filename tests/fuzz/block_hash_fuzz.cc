// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Fuzzes the block hash format: the input chooses an algorithm, a page size,
// a cache salt (any bytes), an adapter id and tokens; BlockHasher's root,
// page and chain hashes must equal those of the second implementation in
// tests/block_hash_reference.h (FIPS 180-4 transcribed, one-shot OpenSSL and
// xxHash), and equal inputs must give equal chains.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "cache/block_hash_reference.h"
#include "fuzz_input.h"
#include "kvblock/block_hash.h"

namespace kvblock::fuzz {
namespace {

std::string Hex(const BlockHash& hash) {
  return absl::BytesToHexString(absl::string_view(
      reinterpret_cast<const char*>(hash.bytes.data()), hash.bytes.size()));
}

void Run(FuzzInput& in) {
  const HashAlgorithm algorithm =
      in.Bool() ? HashAlgorithm::kSha256 : HashAlgorithm::kXxh3_128;
  const int32_t page_size = static_cast<int32_t>(in.Int(1, 40));
  const std::string salt = in.Bytes(80);
  const int64_t adapter = in.Int(INT64_MIN, INT64_MAX);
  const HashExtraKeys extra{.cache_salt = salt, .adapter_id = adapter};
  std::vector<TokenId> tokens(static_cast<size_t>(in.Int(0, 4 * page_size)));
  for (TokenId& token : tokens) {
    token = static_cast<TokenId>(in.Int(INT32_MIN, INT32_MAX));
  }

  absl::StatusOr<BlockHasher> hasher =
      BlockHasher::Create(algorithm, page_size);
  FUZZ_CHECK(hasher.ok(), hasher.status().ToString());
  const BlockHash root = hasher->RootHash(extra);
  FUZZ_CHECK(Hex(root) == testing::RootHex(algorithm, page_size, extra),
             "root hash differs from the reference");

  std::vector<BlockHash> chain(tokens.size() / page_size + 1);
  absl::StatusOr<int64_t> pages =
      HashChain(*hasher, tokens, extra, absl::MakeSpan(chain));
  FUZZ_CHECK(
      pages.ok() && *pages == static_cast<int64_t>(tokens.size()) / page_size,
      pages.status().ToString());
  BlockHash parent = root;
  for (int64_t p = 0; p < *pages; ++p) {
    const std::vector<TokenId> page(tokens.begin() + p * page_size,
                                    tokens.begin() + (p + 1) * page_size);
    FUZZ_CHECK(Hex(chain[p]) == testing::PageHex(algorithm, parent, page),
               "page hash differs from the reference");
    FUZZ_CHECK(hasher->HashPage(parent, page) == chain[p],
               "HashPage differs from HashChain");
    parent = chain[p];
  }
  // A chain into too short an output is refused and writes nothing.
  if (*pages > 0) {
    std::vector<BlockHash> short_out(*pages - 1);
    const absl::StatusOr<int64_t> refused =
        HashChain(*hasher, tokens, extra, absl::MakeSpan(short_out));
    FUZZ_CHECK(!refused.ok(), "a short output was accepted");
    for (const BlockHash& hash : short_out) {
      FUZZ_CHECK(hash == BlockHash{}, "a refused chain wrote its output");
    }
  }
}

}  // namespace
}  // namespace kvblock::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvblock::fuzz::FuzzInput in(data, size);
  kvblock::fuzz::Run(in);
  return 0;
}
