// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// Internal: PageHashMemo, the page hashes of the KV cache groups of one page
// size. The same tokens after the same chain hash to the same page hash in
// every group, so the groups of a hybrid model share one memo and a page
// that fills in all of them is hashed once: the first group hashes it, the
// others find it. Direct-mapped by the parent hash and the page's first and
// last tokens; a miss (another page took the slot) hashes again, so the
// memo changes what is computed, never what comes out.
//
// Complexity: O(page_size) a lookup (the tokens compared). Memory: reserved
// at construction. Thread safety: thread-compatible, owned by the
// coordinator of one manager.
#ifndef KVBLOCK_LIB_MANAGER_PAGE_HASH_MEMO_H_
#define KVBLOCK_LIB_MANAGER_PAGE_HASH_MEMO_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/types/span.h"
#include "kvblock/block_hash.h"
#include "kvblock/types.h"

namespace kvblock::internal {

class PageHashMemo {
 public:
  // At least `slots` slots (a power of two) of pages of `page_size` tokens.
  PageHashMemo(size_t slots, int32_t page_size)
      : page_size_(static_cast<size_t>(page_size)) {
    size_t n = 1;
    while (n < slots) n *= 2;
    mask_ = n - 1;
    slots_.resize(n);
    tokens_.resize(n * page_size_);
  }

  // The hash of the page holding `tokens` after `parent`, from `hasher` (of
  // this memo's page size) unless the memo has it.
  BlockHash Hash(BlockHasher& hasher, const BlockHash& parent,
                 absl::Span<const TokenId> tokens) {
    uint64_t word;
    std::memcpy(&word, parent.bytes.data(), sizeof(word));
    const size_t index =
        static_cast<size_t>(word ^
                            (uint64_t{static_cast<uint32_t>(tokens[0])} *
                             0x9e3779b97f4a7c15ULL) ^
                            static_cast<uint32_t>(tokens.back())) &
        mask_;
    Slot& slot = slots_[index];
    TokenId* const held = tokens_.data() + index * page_size_;
    if (slot.used && slot.parent == parent &&
        std::equal(tokens.begin(), tokens.end(), held)) {
      return slot.hash;
    }
    slot.parent = parent;
    slot.hash = hasher.HashPage(parent, tokens);
    slot.used = true;
    std::copy(tokens.begin(), tokens.end(), held);
    return slot.hash;
  }

 private:
  struct Slot {
    BlockHash parent;
    BlockHash hash;
    bool used = false;
  };

  const size_t page_size_;
  size_t mask_ = 0;
  std::vector<Slot> slots_;
  std::vector<TokenId> tokens_;  // page_size_ a slot.
};

}  // namespace kvblock::internal

#endif  // KVBLOCK_LIB_MANAGER_PAGE_HASH_MEMO_H_
