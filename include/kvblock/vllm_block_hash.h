// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// vLLM's prefix-cache block hashes with its CBOR hash functions
// (`vllm/v1/core/kv_cache_utils.py` hash_block_tokens and
// `vllm/utils/hashing.py` sha256_cbor / xxhash_cbor, followed at
// vllm-project/vllm commit 28be48fa944d8c58aeffd1ab1b56e27828c6b268): a full
// block's hash is
//   H(cbor2.dumps((parent_hash, tuple(token_ids), extra_keys), canonical=True))
// with H SHA-256 (32-byte digest) or XXH3-128 (16 bytes, big-endian), the
// parent of a request's first block being vLLM's NONE_HASH, and extra_keys
// None or a tuple (LoRA name, multimodal (identifier, offset) pairs, cache
// salt, prompt-embedding digests). The same bytes as vLLM's, so a kvblock
// replica and a vLLM one index the same prefixes alike.
//
// Thread safety: CborWriter is thread-compatible; VllmHashBlocks is
// thread-safe.
#ifndef KVBLOCK_VLLM_BLOCK_HASH_H_
#define KVBLOCK_VLLM_BLOCK_HASH_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace kvblock {

enum class VllmHashFunction : int32_t {
  kSha256Cbor = 0,
  kXxhashCbor = 1,
};

// The digest's size in bytes: 32 (SHA-256) or 16 (XXH3-128).
int32_t VllmDigestSize(VllmHashFunction function);

// Canonical CBOR (RFC 8949 section 4.2.1: every head as short as it can be)
// of the values vLLM hashes, as cbor2 writes them with canonical=True.
class CborWriter {
 public:
  void Array(uint64_t size) { Head(4, size); }
  void Int(int64_t value) {
    // A negative n is major type 1 with -1 - n.
    if (value >= 0) {
      Head(0, static_cast<uint64_t>(value));
    } else {
      Head(1, static_cast<uint64_t>(-(value + 1)));
    }
  }
  void Bytes(absl::string_view bytes) {
    Head(2, bytes.size());
    out_.append(bytes.data(), bytes.size());
  }
  void Text(absl::string_view utf8) {
    Head(3, utf8.size());
    out_.append(utf8.data(), utf8.size());
  }
  void Bool(bool value) { out_.push_back(value ? '\xf5' : '\xf4'); }
  void Null() { out_.push_back('\xf6'); }
  // Bytes encoded already (a whole value).
  void Encoded(absl::string_view cbor) {
    out_.append(cbor.data(), cbor.size());
  }

  const std::string& data() const { return out_; }
  void Clear() { out_.clear(); }

 private:
  void Head(uint8_t major, uint64_t value);
  std::string out_;
};

// The hashes of the full blocks of `tokens` (`tokens.size() / block_size` of
// them; a partial tail is not hashed), chained from `parent` (the hash of the
// block before the first, or NONE_HASH): block i is hashed with the extra
// keys whose canonical CBOR is `extra_keys[i]` (empty: None), or
// `extra_keys[0]` for every block when it holds one entry. Appends the
// digests to `out`, VllmDigestSize bytes each. InvalidArgument when
// block_size is not positive or `extra_keys` has neither 1 nor one entry a
// block (none is fine: None for all). On error, nothing changes.
absl::Status VllmHashBlocks(VllmHashFunction function, absl::string_view parent,
                            absl::Span<const int64_t> tokens,
                            int32_t block_size,
                            absl::Span<const std::string> extra_keys,
                            std::string& out);

// H of `cbor` (the seed of NONE_HASH is H(cbor of the seed's text)).
std::string VllmDigest(VllmHashFunction function, absl::string_view cbor);

}  // namespace kvblock

#endif  // KVBLOCK_VLLM_BLOCK_HASH_H_
