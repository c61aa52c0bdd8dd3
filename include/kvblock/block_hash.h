// Copyright 2026 The kvblock Authors.
//
// Block hashes of the prefix cache.
//
// Thread safety: plain values.
#ifndef KVBLOCK_BLOCK_HASH_H_
#define KVBLOCK_BLOCK_HASH_H_

#include <array>
#include <cstdint>
#include <utility>

namespace kvblock {

// The 32-byte hash of one full page and, through its parent, of every page
// before it. XXH3-128 hashes fill the first 16 bytes and leave the rest zero.
struct BlockHash {
  std::array<uint8_t, 32> bytes{};

  friend bool operator==(const BlockHash&, const BlockHash&) = default;

  // Every byte feeds Abseil's per-process seeded hash, so crafted keys cannot
  // flood one bucket of the prefix index.
  template <typename H>
  friend H AbslHashValue(H state, const BlockHash& hash) {
    return H::combine_contiguous(std::move(state), hash.bytes.data(),
                                 hash.bytes.size());
  }
};

}  // namespace kvblock

#endif  // KVBLOCK_BLOCK_HASH_H_
