// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Internal: the prefix-cache keys of a KV cache group. One pool caches every
// group's pages, and groups holding the same tokens hash them alike (vLLM
// keys its index by BlockHashWithGroupId): group 0's key is the chain hash,
// a later group's the hash XOR a salt of its own (splitmix64 of the index,
// word by word). XOR undoes itself, so the event log turns a key back into
// the hash a router knows.
//
// Thread safety: pure functions.
#ifndef KVBLOCK_LIB_CACHE_GROUP_KEY_H_
#define KVBLOCK_LIB_CACHE_GROUP_KEY_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kvblock/block_hash.h"

namespace kvblock::internal {

// Group `group`'s salt: all zero for group 0.
inline BlockHash GroupKeySalt(int32_t group) {
  BlockHash salt;
  if (group == 0) return salt;
  uint64_t state = 0x6b76626c6f636b00ULL + static_cast<uint64_t>(group);
  for (size_t word = 0; word < salt.bytes.size() / 8; ++word) {
    state += 0x9e3779b97f4a7c15ULL;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    std::memcpy(salt.bytes.data() + 8 * word, &z, sizeof(z));
  }
  return salt;
}

// `hash` XOR `salt`: a hash's key in the group of `salt`, and back.
inline BlockHash SaltKey(const BlockHash& hash, const BlockHash& salt) {
  BlockHash key;
  for (size_t i = 0; i < key.bytes.size(); ++i) {
    key.bytes[i] = hash.bytes[i] ^ salt.bytes[i];
  }
  return key;
}

}  // namespace kvblock::internal

#endif  // KVBLOCK_LIB_CACHE_GROUP_KEY_H_
