// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "kvblock/block_hash.h"

// Root hashes use OpenSSL's low-level SHA256_* calls, which allocate
// nothing, for the reason sha256_page_step.cc gives.
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/sha.h>
#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cassert>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/optimization.h"
#include "absl/strings/str_cat.h"
#include "cache/sha256_page_step.h"

namespace kvblock {
namespace {

constexpr absl::string_view kDomainTag = "kvblock-block-v3";
static_assert(kDomainTag.size() == 16);
static_assert(sizeof(BlockHash::bytes) == 32);

// Root message bytes besides the salt: tag, algorithm id, page size, salt
// length, adapter id.
constexpr size_t kFixedRootBytes = 16 + 1 + 4 + 8 + 8;

// Room for a 256-token page (or a root with a salt of up to 1023 bytes)
// before the buffer grows.
constexpr size_t kInitialMessageBytes = 32 + 4 * 256;

// Little-endian stores, independent of the host's byte order.
uint8_t* StoreLe32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
  return p + 4;
}
uint8_t* StoreLe64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
  return p + 8;
}
uint8_t* StoreBytes(uint8_t* p, const void* src, size_t n) {
  if (n > 0) std::memcpy(p, src, n);
  return p + n;
}
// The little-endian bytes of `tokens`.
uint8_t* StoreTokens(uint8_t* p, absl::Span<const TokenId> tokens) {
  if constexpr (std::endian::native == std::endian::little) {
    return StoreBytes(p, tokens.data(), sizeof(TokenId) * tokens.size());
  }
  for (const TokenId token : tokens) {
    p = StoreLe32(p, static_cast<uint32_t>(token));
  }
  return p;
}

}  // namespace

absl::string_view HashAlgorithmName(HashAlgorithm algorithm) {
  if (algorithm == HashAlgorithm::kSha256) return "sha256";
  if (algorithm == HashAlgorithm::kXxh3_128) return "xxh3_128";
  return "unknown";
}

// Scratch state reused by every HashPage call.
struct BlockHasher::State {
  // The message of the last page; grows to the largest message seen and is
  // then reused, so hashing does not allocate in steady state.
  std::vector<uint8_t> message;
  // The last root and its keys: most requests share one (no salt, no
  // adapter), and a root costs a digest per admitted prompt.
  bool has_root = false;
  std::string root_salt;
  int64_t root_adapter = 0;
  BlockHash root;
};

absl::StatusOr<BlockHasher> BlockHasher::Create(HashAlgorithm algorithm,
                                                int32_t page_size) {
  return Create(algorithm, page_size, page_size);
}

absl::StatusOr<BlockHasher> BlockHasher::Create(HashAlgorithm algorithm,
                                                int32_t page_size,
                                                int32_t hash_block_size) {
  if (algorithm != HashAlgorithm::kSha256 &&
      algorithm != HashAlgorithm::kXxh3_128) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block hash: unknown algorithm ", static_cast<int>(algorithm)));
  }
  if (page_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block hash: page_size must be positive, got ", page_size));
  }
  if (hash_block_size <= 0 || page_size % hash_block_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block hash: hash_block_size must be a positive divisor of page_size ",
        page_size, ", got ", hash_block_size));
  }
  auto state = std::make_unique<State>();
  state->message.resize(kInitialMessageBytes);
  return BlockHasher(algorithm, page_size, hash_block_size, std::move(state));
}

BlockHasher::BlockHasher(HashAlgorithm algorithm, int32_t page_size,
                         int32_t hash_block_size, std::unique_ptr<State> state)
    : algorithm_(algorithm),
      page_size_(page_size),
      hash_block_size_(hash_block_size),
      state_(std::move(state)) {}
BlockHasher::BlockHasher(BlockHasher&& other) noexcept = default;
BlockHasher& BlockHasher::operator=(BlockHasher&& other) noexcept = default;
BlockHasher::~BlockHasher() = default;

BlockHash BlockHasher::Digest(absl::Span<const uint8_t> message) const {
  BlockHash hash;
  if (algorithm_ == HashAlgorithm::kXxh3_128) {
    XXH128_canonical_t canonical;
    XXH128_canonicalFromHash(&canonical,
                             XXH3_128bits(message.data(), message.size()));
    static_assert(sizeof(canonical.digest) == 16);
    std::memcpy(hash.bytes.data(), canonical.digest, sizeof(canonical.digest));
    return hash;
  }
  // These calls cannot fail on a valid stack context.
  SHA256_CTX ctx;
  SHA256_Init(&ctx);
  SHA256_Update(&ctx, message.data(), message.size());
  SHA256_Final(hash.bytes.data(), &ctx);
  return hash;
}

uint8_t* BlockHasher::Message(size_t size) {
  std::vector<uint8_t>& message = state_->message;
  if (message.size() < size) message.resize(size);
  return message.data();
}

BlockHash BlockHasher::RootHash(const HashExtraKeys& extra) {
  State& state = *state_;
  if (state.has_root && state.root_adapter == extra.adapter_id &&
      state.root_salt == extra.cache_salt) {
    return state.root;
  }
  const size_t size = kFixedRootBytes + extra.cache_salt.size();
  uint8_t* const message = Message(size);
  uint8_t* p = StoreBytes(message, kDomainTag.data(), kDomainTag.size());
  *p++ = static_cast<uint8_t>(algorithm_);
  p = StoreLe32(p, static_cast<uint32_t>(hash_block_size_));
  p = StoreLe64(p, extra.cache_salt.size());
  p = StoreBytes(p, extra.cache_salt.data(), extra.cache_salt.size());
  StoreLe64(p, static_cast<uint64_t>(extra.adapter_id));
  state.root = Digest(absl::MakeConstSpan(message, size));
  state.root_salt.assign(extra.cache_salt.data(), extra.cache_salt.size());
  state.root_adapter = extra.adapter_id;
  state.has_root = true;
  return state.root;
}

BlockHash BlockHasher::HashPage(const BlockHash& parent,
                                absl::Span<const TokenId> tokens) {
  assert(tokens.size() == static_cast<size_t>(page_size_));
  if (ABSL_PREDICT_TRUE(hash_block_size_ == page_size_)) {
    return HashBlock(parent, tokens);
  }
  const auto block = static_cast<size_t>(hash_block_size_);
  BlockHash hash = parent;
  for (size_t i = 0; i < tokens.size(); i += block) {
    hash = HashBlock(hash, tokens.subspan(i, block));
  }
  return hash;
}

BlockHash BlockHasher::HashBlock(const BlockHash& parent,
                                 absl::Span<const TokenId> tokens) {
  if (algorithm_ == HashAlgorithm::kSha256) {
    return internal::Sha256PageStep(parent, tokens);
  }
  const size_t size = sizeof(parent.bytes) + sizeof(TokenId) * tokens.size();
  uint8_t* const message = Message(size);
  StoreTokens(StoreBytes(message, parent.bytes.data(), parent.bytes.size()),
              tokens);
  return Digest(absl::MakeConstSpan(message, size));
}

absl::StatusOr<int64_t> HashChain(BlockHasher& hasher,
                                  absl::Span<const TokenId> tokens,
                                  const HashExtraKeys& extra,
                                  absl::Span<BlockHash> out) {
  const int32_t page_size = hasher.page_size();
  const size_t pages = tokens.size() / static_cast<size_t>(page_size);
  if (out.size() < pages) {
    return absl::InvalidArgumentError(
        absl::StrCat("block hash: out has ", out.size(),
                     " entries, fewer than the ", pages, " full pages of ",
                     tokens.size(), " tokens (page_size ", page_size, ")"));
  }
  if (pages == 0) return 0;
  BlockHash parent = hasher.RootHash(extra);
  for (size_t i = 0; i < pages; ++i) {
    parent = hasher.HashPage(parent,
                             tokens.subspan(i * static_cast<size_t>(page_size),
                                            static_cast<size_t>(page_size)));
    out[i] = parent;
  }
  return static_cast<int64_t>(pages);
}

}  // namespace kvblock
