// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "kvblock/vllm_block_hash.h"

// One-shot SHA-256 with OpenSSL's low-level call, which allocates nothing
// (block_hash.cc does the same).
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/sha.h>
#include <xxhash.h>

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace kvblock {

int32_t VllmDigestSize(VllmHashFunction function) {
  return function == VllmHashFunction::kSha256Cbor ? 32 : 16;
}

void CborWriter::Head(uint8_t major, uint64_t value) {
  const char type = static_cast<char>(major << 5);
  int bytes;
  if (value < 24) {
    out_.push_back(static_cast<char>(type | value));
    return;
  } else if (value <= 0xff) {
    out_.push_back(type | 24);
    bytes = 1;
  } else if (value <= 0xffff) {
    out_.push_back(type | 25);
    bytes = 2;
  } else if (value <= 0xffffffff) {
    out_.push_back(type | 26);
    bytes = 4;
  } else {
    out_.push_back(type | 27);
    bytes = 8;
  }
  for (int i = bytes - 1; i >= 0; --i) {
    out_.push_back(static_cast<char>(value >> (8 * i)));
  }
}

std::string VllmDigest(VllmHashFunction function, absl::string_view cbor) {
  if (function == VllmHashFunction::kSha256Cbor) {
    std::string digest(SHA256_DIGEST_LENGTH, '\0');
    SHA256(reinterpret_cast<const unsigned char*>(cbor.data()), cbor.size(),
           reinterpret_cast<unsigned char*>(digest.data()));
    return digest;
  }
  // python-xxhash's xxh3_128_digest: the canonical (big-endian) form.
  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical, XXH3_128bits(cbor.data(), cbor.size()));
  return std::string(reinterpret_cast<const char*>(canonical.digest),
                     sizeof(canonical.digest));
}

absl::Status VllmHashBlocks(VllmHashFunction function, absl::string_view parent,
                            absl::Span<const int64_t> tokens,
                            int32_t block_size,
                            absl::Span<const std::string> extra_keys,
                            std::string& out) {
  if (block_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vllm block hash: block_size must be positive, got ", block_size));
  }
  const size_t blocks = tokens.size() / block_size;
  if (extra_keys.size() > 1 && extra_keys.size() != blocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vllm block hash: ", extra_keys.size(), " extra keys for ", blocks,
        " blocks (give one for every block, or one for all)"));
  }
  CborWriter cbor;
  std::string previous(parent);
  for (size_t b = 0; b < blocks; ++b) {
    cbor.Clear();
    cbor.Array(3);
    cbor.Bytes(previous);
    cbor.Array(block_size);
    for (int64_t token : tokens.subspan(b * block_size, block_size)) {
      cbor.Int(token);
    }
    const std::string* keys = extra_keys.empty()
                                  ? nullptr
                                  : &extra_keys[extra_keys.size() == 1 ? 0 : b];
    if (keys == nullptr || keys->empty()) {
      cbor.Null();
    } else {
      cbor.Encoded(*keys);
    }
    previous = VllmDigest(function, cbor.data());
    out.append(previous);
  }
  return absl::OkStatus();
}

}  // namespace kvblock
