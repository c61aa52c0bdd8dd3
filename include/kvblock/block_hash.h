// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Block hashes of the prefix cache: the hash of a full page of tokens chains
// the hash of the page before it, so one 32-byte value names a whole prefix.
//
//   root         = D(root message(algorithm, page size, extra keys))
//   hash(page 0) = P(hash of root, tokens of page 0)
//   hash(page i) = P(hash(page i - 1), tokens of page i)
//
// The extra keys (cache salt, adapter id) and the page size enter once,
// through the root, and every page's hash commits to them through its chain.
// Only full pages have a hash: a partial last page can still grow, so it is
// never shared through the cache.
//
// Format (version 3). Any process or language that writes these bytes and
// runs these functions gets the same `BlockHash`:
//
//   root message (45 + s bytes):
//   offset  size  field
//   0       16    ASCII "kvblock-block-v3" (domain tag, no terminator)
//   16      1     algorithm id: 0x01 SHA-256, 0x02 XXH3-128
//   17      4     page size n (tokens; the hash block size b with hash
//                 blocks, below), unsigned 32-bit little-endian
//   21      8     s = cache salt length, unsigned 64-bit little-endian
//   29      s     the cache salt bytes, verbatim
//   29+s    8     adapter id, int64 little-endian (0 = no adapter)
//
//   page bytes (4n bytes): the page's n tokens, each int32 little-endian
//   (negative numbers are two's complement).
//
// D (root) and P (page), per algorithm:
//   kSha256 (the default; collision resistant, so a tenant cannot craft a
//   prompt whose pages collide with another tenant's cached pages):
//     D = SHA-256 of the root message (FIPS 180-4), all 32 bytes.
//     P = the SHA-256 compression function (FIPS 180-4, 6.2.2 steps 1-4)
//         run from the parent, read as eight big-endian 32-bit words, over
//         the page bytes in 64-byte blocks (the last block zero-filled when
//         4n is not a multiple of 64); the resulting eight words,
//         big-endian. No length padding block: the page size is fixed by the
//         root, so every page of a chain is the same number of blocks.
//   kXxh3_128 (fast, not cryptographic: only for deployments whose prompts
//   are trusted): XXH3-128 with seed 0 (XXH3_128bits, the value `xxhsum -H2`
//   prints), in xxHash's canonical big-endian form (high 64 bits first),
//   then 16 zero bytes; D of the root message, P of the 32 parent bytes
//   followed by the page bytes.
//
// Hash blocks: a hasher may hash a page of n = k * b tokens as k blocks of
// b tokens (BlockHasher::Create's hash_block_size b): the root message
// names b, each block is a page of b tokens above, and the page's hash is
// its last block's. One chain of b-token blocks then names the pages of
// every multiple of b, as vLLM's groups of different block sizes share the
// hashes of its hash block size (vLLM names a larger block by its blocks'
// hashes joined; the last alone names the same prefix, as it chains the
// others, and keeps a page's hash 32 bytes). With b = n (the default) this
// is the format above.
//
// Design choices:
//   - The root is a pure function of the algorithm, the page size and the
//     extra keys, not random per process, so hashes are stable across
//     processes and machines (a shared or offloaded cache can be keyed by
//     them). Isolation between tenants comes from the salt, not from a
//     secret.
//   - A SHA-256 page step is one compression per 64 bytes of tokens: one
//     for 16-token pages, half the work of hashing parent || tokens as a
//     message (version 2), which needs a second block for the parent and the
//     length padding. The chain is SHA-256's own Merkle-Damgard iteration
//     started from the root digest, so two chains of the same length collide
//     only where the compression function does, and chains of different
//     lengths only through a preimage of a root.
//   - Every root field is length-prefixed or fixed-size, so no two different
//     (page size, salt, adapter) triples give the same root message. The
//     page size in the root keeps caches with different page sizes apart
//     (zero-filled blocks do not encode a page's length).
//   - The tag and the algorithm id separate root messages from any other use
//     of the same hash functions and from each other's format versions.
//
// Complexity: RootHash is O(s); HashPage is O(n); HashChain is
// O(s + tokens). A BlockHasher runs OpenSSL's SHA-256 on stack state (or
// XXH3) and reuses its message buffer, so steady-state hashing allocates
// nothing.
//
// Thread safety: `BlockHash` and `HashExtraKeys` are plain values. A
// `BlockHasher` is thread-compatible: RootHash and HashPage mutate its
// scratch state, so each thread uses its own hasher.
#ifndef KVBLOCK_BLOCK_HASH_H_
#define KVBLOCK_BLOCK_HASH_H_

#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kvblock/types.h"

namespace kvblock {

// The 32-byte hash of one full page and, through its parent, of every page
// before it. XXH3-128 hashes fill the first 16 bytes and leave the rest zero.
struct BlockHash {
  std::array<uint8_t, 32> bytes{};

  // Word-wise, inline: the prefix index compares and hashes these on every
  // allocation that evicts and every page that fills.
  friend bool operator==(const BlockHash& a, const BlockHash& b) {
    const Words x = a.words();
    const Words y = b.words();
    return ((x[0] ^ y[0]) | (x[1] ^ y[1]) | (x[2] ^ y[2]) | (x[3] ^ y[3])) == 0;
  }

  // Every byte feeds Abseil's per-process seeded hash, so crafted keys cannot
  // flood one bucket of the prefix index. The key is a digest already: its
  // words are folded into one before the mixing round.
  template <typename H>
  friend H AbslHashValue(H state, const BlockHash& hash) {
    const Words w = hash.words();
    return H::combine(std::move(state), w[0] ^ w[1] ^ w[2] ^ w[3]);
  }

 private:
  using Words = std::array<uint64_t, 4>;
  Words words() const {
    Words w;
    std::memcpy(w.data(), bytes.data(), sizeof(w));
    return w;
  }
};

// The digest behind a BlockHash. The enumerator values are the algorithm ids
// written into the message.
enum class HashAlgorithm : uint8_t {
  kSha256 = 1,    // the default; collision resistant.
  kXxh3_128 = 2,  // fast, non-cryptographic; trusted prompts only.
};

// "sha256" or "xxh3_128" ("unknown" for any other value).
absl::string_view HashAlgorithmName(HashAlgorithm algorithm);

// The digest's bytes, the first ones of a BlockHash: 32 for SHA-256, 16 for
// XXH3-128 (its other 16 are zero); 0 for an unknown value.
constexpr int32_t DigestSize(HashAlgorithm algorithm) {
  switch (algorithm) {
    case HashAlgorithm::kSha256:
      return 32;
    case HashAlgorithm::kXxh3_128:
      return 16;
  }
  return 0;
}

// Keys besides the tokens that decide whether two pages hold the same KV
// values: pages are shared only when these are equal too.
struct HashExtraKeys {
  // Per-request (per-tenant) cache salt; any bytes, empty for none. The view
  // must stay valid for the duration of the call it is passed to.
  absl::string_view cache_salt = {};
  // LoRA (or other) adapter the KV values were computed with; 0 for none.
  int64_t adapter_id = 0;
};

// Computes the block hashes of one algorithm and page size. Move-only.
class BlockHasher {
 public:
  // A hasher for pages of `page_size` tokens hashed with `algorithm`.
  // Errors: InvalidArgument (naming the value) if `algorithm` is not a
  // HashAlgorithm enumerator or `page_size` is not positive.
  static absl::StatusOr<BlockHasher> Create(HashAlgorithm algorithm,
                                            int32_t page_size);
  // A hasher for pages of `page_size` tokens that hashes each as
  // page_size / hash_block_size chained blocks of `hash_block_size` tokens,
  // a page named by its last block's hash (see "Hash blocks" above): the
  // KV cache groups of a model, whose pages are multiples of one hash
  // block, share one chain, as vLLM's groups share its. Create(a, n) is
  // Create(a, n, n). Errors: as Create, and InvalidArgument (naming both)
  // unless `hash_block_size` is a positive divisor of `page_size`.
  static absl::StatusOr<BlockHasher> Create(HashAlgorithm algorithm,
                                            int32_t page_size,
                                            int32_t hash_block_size);

  BlockHasher(BlockHasher&& other) noexcept;
  BlockHasher& operator=(BlockHasher&& other) noexcept;
  ~BlockHasher();

  HashAlgorithm algorithm() const { return algorithm_; }
  int32_t page_size() const { return page_size_; }
  int32_t hash_block_size() const { return hash_block_size_; }

  // The parent of the first page of every sequence with these extra keys,
  // per the format above (with this hasher's page size). Cannot fail.
  // REQUIRES: this hasher was not moved from.
  BlockHash RootHash(const HashExtraKeys& extra);

  // The hash of a page holding `tokens` whose previous page hashed to
  // `parent` (RootHash(extra keys) for the first page), per the format
  // above. Cannot fail.
  // REQUIRES: this hasher was not moved from; `tokens.size() == page_size()`
  // (asserted unless NDEBUG: another length would hash a page of the wrong
  // size, which the format does not separate from a right-sized one).
  BlockHash HashPage(const BlockHash& parent, absl::Span<const TokenId> tokens);

 private:
  struct State;

  BlockHasher(HashAlgorithm algorithm, int32_t page_size,
              int32_t hash_block_size, std::unique_ptr<State> state);
  // P (see the format) of one hash block.
  BlockHash HashBlock(const BlockHash& parent,
                      absl::Span<const TokenId> tokens);
  // The scratch message buffer, at least `size` bytes.
  uint8_t* Message(size_t size);
  BlockHash Digest(absl::Span<const uint8_t> message) const;

  HashAlgorithm algorithm_;
  int32_t page_size_;
  int32_t hash_block_size_;
  std::unique_ptr<State> state_;  // null only after a move.
};

// Hashes every full page of `tokens`, pages of the hasher's page_size
// tokens starting at RootHash(extra): `out[i]` = the hash of tokens
// [i * page_size, (i + 1) * page_size). A partial last page gets no hash.
// Returns the number of pages hashed, `tokens.size() / page_size`; entries of
// `out` past it are left as they were.
// Errors: InvalidArgument if `out` has fewer entries than the full pages of
// `tokens` (the message names both counts). On error, nothing is written to
// `out`.
// REQUIRES: `hasher` was not moved from.
absl::StatusOr<int64_t> HashChain(BlockHasher& hasher,
                                  absl::Span<const TokenId> tokens,
                                  const HashExtraKeys& extra,
                                  absl::Span<BlockHash> out);

}  // namespace kvblock

#endif  // KVBLOCK_BLOCK_HASH_H_
